"""Deterministic replay: a recorded state reached again live, a candidate carried out there, and the
policy continuing from it (GuidNav §4's self-play candidates; Math-Shepherd's completions).

A MiniWoB++ instance is fixed by its seed (``Math.seedrandom``) and its pages are deterministic,
apart from the few timing-dependent tasks docs/reproducibility.md lists: resetting with an episode's
seed and carrying out its first t actions gives back the state before action t. A replay *checks*
that it did, screen by screen: every screen it meets up to step t must be the recorded one
(:func:`screen_signature`), else :class:`ReplayDiverged` ends the attempt. The worker pool records
such an attempt as aborted and does not retry it (``EpisodeError``), and the caller counts and
drops it: a state that was not reproduced is never labelled.

A replay is an ordinary episode of the pool (its workers, timeouts and retries for broken
browsers): :class:`ReplayPolicy` is a policy whose actor plays the recorded prefix, then the
candidate, then hands over to the learned policy for the continuation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from envs.pool import EpisodeError
from envs.protocol import END_MAX_STEPS, Actor, EpisodeContext, EpisodeRecord, StepResult
from training.policy.learned import LearnedPolicy
from warehouse.model import Action, ActionType, Screen


def screen_signature(screen: Screen) -> str:
    """A screen's identity for replays: every element's ref with its text line (role, id, text,
    value, flags: ``Screen.to_text``). Refs matter: the recorded actions name their targets by ref."""
    lines = screen.to_text().split("\n") if screen.elements else []
    body = "\n".join(f"{e.ref}\t{line}" for e, line in zip(screen.elements, lines, strict=True))
    return hashlib.sha256(body.encode()).hexdigest()[:20]


#: How every divergence message starts (the pool keeps an aborted attempt's message as its reason).
DIVERGED = "replay diverged"


class ReplayDiverged(EpisodeError):
    """The replayed episode is not the recorded one: another instruction, another screen at some
    step of the prefix, or an end before the state."""


@dataclass(frozen=True)
class ReplayPlan:
    """One replay: the recorded actions a_0..a_{t-1}, the signatures of the screens o_0..o_t they
    pass through as recorded, the candidate carried out at step t, how many steps the policy may
    continue after it (0: the replay ends with the candidate), and the recorded instruction."""

    prefix: tuple[Action, ...]
    screens: tuple[str, ...]
    candidate: Action
    continuation_steps: int = 0
    instruction: str | None = None  # the recorded instruction (checked when given)

    def __post_init__(self) -> None:
        if len(self.screens) != len(self.prefix) + 1:
            raise ValueError(f"a replay of {len(self.prefix)} actions checks {len(self.prefix) + 1} screens")
        if self.continuation_steps < 0:
            raise ValueError("continuation_steps must be 0 or more")

    @property
    def step(self) -> int:
        """t: the step the candidate is carried out at."""
        return len(self.prefix)

    @property
    def max_steps(self) -> int:
        """The episode length of the replay: the prefix, the candidate, the continuation."""
        return self.step + 1 + self.continuation_steps


@dataclass
class ReplayPolicy:
    """The pool's policy for replays: each episode id names its :class:`ReplayPlan`; after the
    candidate, ``continuation`` (the learned policy, at its temperature, seeded by the episode id)
    acts with the prefix and the candidate as its history."""

    plans: Mapping[str, ReplayPlan]
    continuation: LearnedPolicy | None = None
    policy_id: str = "replay"

    def start(self, context: EpisodeContext) -> Actor:
        plan = self.plans.get(context.episode_id)
        if plan is None:
            raise EpisodeError(f"no replay plan for episode {context.episode_id!r}")
        if plan.instruction is not None and context.instruction != plan.instruction:
            raise ReplayDiverged(f"{DIVERGED}: the instance's instruction is not the recorded one")
        take_over: Callable[[], Actor] | None = None
        if plan.continuation_steps and self.continuation is not None:
            policy = self.continuation

            def take_over() -> Actor:
                return policy.start_after(context, (*plan.prefix, plan.candidate))

        return _ReplayActor(plan, take_over)


class _ReplayActor:
    def __init__(self, plan: ReplayPlan, take_over: Callable[[], Actor] | None) -> None:
        self.plan, self.take_over = plan, take_over
        self.index = 0
        self.continuing: Actor | None = None

    def act(self, screen: Screen) -> Action:
        i, plan = self.index, self.plan
        if i <= plan.step and screen_signature(screen) != plan.screens[i]:
            raise ReplayDiverged(f"{DIVERGED}: screen {i} is not the recorded one (state at step {plan.step})")
        self.index += 1
        if i < plan.step:
            return plan.prefix[i]
        if i == plan.step:
            return plan.candidate
        if self.continuing is None:
            if self.take_over is None:  # the episode budget outlasts the plan: wait it out
                return Action(ActionType.NOTHING)
            self.continuing = self.take_over()
        return self.continuing.act(screen)

    def observe(self, action: Action, result: StepResult) -> None:
        if self.continuing is not None:
            self.continuing.observe(action, result)


@dataclass(frozen=True)
class ReplayOutcome:
    """What one replay shows: the candidate's own step (milestones it reached, whether it ended the
    episode and how, a failed step's problem), the episode's success after the continuation, and
    what reaching the state and carrying the candidate out cost (reset, prefix, candidate)."""

    milestones_hit: tuple[str, ...]
    ended: bool  # the environment ended the episode at the candidate's step
    ended_success: bool
    problem: str | None
    success: bool  # the replay's episode succeeded (at the candidate or in the continuation)
    continued: bool  # the policy took at least one step after the candidate
    replay_ms: float  # reset + prefix + candidate
    live_step_ms: tuple[float, ...]  # each continuation step: the policy's choice plus the environment


def replay_outcome(record: EpisodeRecord, plan: ReplayPlan) -> ReplayOutcome:
    """Read a completed replay. Raises :class:`ReplayDiverged` when the episode ended before the
    candidate's step (the recorded episode went on there: not the same episode)."""
    t = plan.step
    if record.n_steps <= t:
        raise ReplayDiverged(f"{DIVERGED}: the episode ended after {record.n_steps} steps, before step {t}")
    step = record.steps[t]
    ended = record.n_steps == t + 1 and record.end_reason != END_MAX_STEPS
    issued = [s.time_ms for s in record.steps]
    live = tuple(float(issued[i + 1] - issued[i]) for i in range(t + 1, record.n_steps - 1))
    return ReplayOutcome(
        milestones_hit=tuple(step.milestones_hit),
        ended=ended,
        ended_success=ended and record.success,
        problem=step.problem,
        success=record.success,
        continued=record.n_steps > t + 1,
        replay_ms=float(record.reset_ms + step.time_ms + step.latency_ms),
        live_step_ms=live,
    )
