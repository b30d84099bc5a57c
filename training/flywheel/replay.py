"""Deterministic replay: a recorded state reached again live, a candidate carried out there, and the
policy continuing from it (GuidNav §4's self-play candidates; Math-Shepherd's completions).

A MiniWoB++ instance is fixed by its seed (``Math.seedrandom``) and its pages are deterministic,
apart from the few timing-dependent tasks docs/reproducibility.md lists: resetting with an episode's
seed and carrying out its first t actions gives back the state before action t. The environment
reaches it (``envs.protocol.restore``: MiniWoB++ in a few WebDriver commands in the worker, other
environments step by step) and *checks* that it did: the screen reached must be the recorded one
(``envs.protocol.screen_signature``: every element's ref and text line), else
``StateNotReproduced``, which the worker pool records as an aborted attempt and does not retry; the
caller counts and drops it. A state that was not reproduced is never labelled.

A replay is an ordinary episode of the pool (its workers, timeouts and retries for broken
browsers) that starts at the recorded state (``EpisodeJob.start``): :class:`ReplayPolicy` carries
the candidate out, then hands over to the learned policy for the continuation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from envs.pool_jobs import EpisodeError, EpisodeJob
from envs.protocol import (
    END_MAX_STEPS,
    NOT_REPRODUCED,
    Actor,
    EpisodeContext,
    EpisodeRecord,
    StartState,
    StepResult,
    screen_signature,
)
from envs.tasks import TaskSpec
from training.policy.learned import LearnedPolicy
from warehouse.model import Action, ActionType, Screen

#: How every divergence message starts (the pool keeps an aborted attempt's message as its reason).
DIVERGED = NOT_REPRODUCED


class ReplayDiverged(EpisodeError):
    """The replayed episode is not the recorded one: another instruction or another state."""


@dataclass(frozen=True)
class ReplayPlan:
    """One replay: the recorded actions a_0..a_{t-1}, the screens o_0..o_t they were taken on, the
    candidate carried out at step t, how many steps the policy may continue after it (0: the replay
    ends with the candidate), the recorded instruction and how many milestones the prefix reached."""

    prefix: tuple[Action, ...]
    screens: tuple[Screen, ...]
    candidate: Action
    continuation_steps: int = 0
    instruction: str | None = None  # the recorded instruction (checked when given)
    milestones_reached: int = 0

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
        """The replay's own steps: the candidate and the continuation."""
        return 1 + self.continuation_steps

    def start(self) -> StartState:
        return StartState(self.prefix, self.screens, self.milestones_reached)

    def job(self, episode_id: str, task: TaskSpec, seed: int, family: str | None = None) -> EpisodeJob:
        """The pool's job: an episode of ``task`` with ``seed`` that begins at the recorded state."""
        return EpisodeJob(episode_id, task, seed, self.max_steps, family, start=self.start())


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
        first = self.index == 0
        self.index += 1
        if first:  # the environment reached the state and checked it; so does the replay
            if screen_signature(screen) != screen_signature(self.plan.screens[-1]):
                raise ReplayDiverged(f"{DIVERGED}: the replay does not start at the recorded state")
            return self.plan.candidate
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
    replay_ms: float  # reaching the state (reset + prefix) + the candidate
    live_step_ms: tuple[float, ...]  # each continuation step: the policy's choice plus the environment


def replay_outcome(record: EpisodeRecord) -> ReplayOutcome:
    """Read a completed replay (its first step is the candidate's)."""
    if not record.n_steps:
        raise ReplayDiverged(f"{DIVERGED}: the replay took no step")
    step = record.steps[0]
    ended = record.n_steps == 1 and record.end_reason != END_MAX_STEPS
    issued = [s.time_ms for s in record.steps]
    live = tuple(float(issued[i + 1] - issued[i]) for i in range(1, record.n_steps - 1))
    return ReplayOutcome(
        milestones_hit=tuple(step.milestones_hit),
        ended=ended,
        ended_success=ended and record.success,
        problem=step.problem,
        success=record.success,
        continued=record.n_steps > 1,
        replay_ms=float(record.reset_ms + step.time_ms + step.latency_ms),
        live_step_ms=live,
    )
