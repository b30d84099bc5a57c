"""The guided agent: best-of-N at every step (GUI-Shepherd Alg. 2; GuidNav Eqs. 4-6; GUI-PRA Eq. 7),
as an ``envs.protocol.Policy`` so that the worker pool runs it like any policy.

Per step: the policy proposes N candidates (:mod:`training.guidance.proposals`), the verifier
scores them (:mod:`training.guidance.verifiers`, :mod:`training.guidance.judge`), and
:func:`select` executes the best. Without a verifier the policy's first candidate is executed: with
the learned policy's top-N proposals that is exactly the greedy base policy. Every step is logged
(:class:`StepLog`): how many candidates, which rank won, the scores, the seconds spent proposing
and verifying, the model calls, the verifier's mode (local / endpoint / fallback / unjudged) and
its note. Retries (:mod:`training.guidance.reflection`) hand each attempt its reflection and bans.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from envs.protocol import Actor, EpisodeContext, StepResult
from training.base.states import screen_lines
from training.guidance.proposals import GuidanceError, Proposal, Proposer
from training.guidance.reflection import AttemptGuidance
from training.guidance.verifiers import EpisodeVerifier, StepView, Verdict, Verifier
from warehouse.model import Action, Screen


def with_prior(scores: Sequence[float | None], priors: Sequence[float]) -> list[float | None]:
    """log s + log pi(a|s) per candidate: a verifier's probability-like score (in (0, 1]) times the
    policy's own probability, i.e. the policy's distribution re-weighted by the verifier (not in
    the papers, which take the verifier's argmax alone; offered as the ``+prior`` variant). A
    candidate without a finite prior keeps log s."""
    out: list[float | None] = []
    for s, p in zip(scores, priors, strict=True):
        if s is None:
            out.append(None)
        else:
            out.append(math.log(max(s, 1e-6)) + (p if math.isfinite(p) else 0.0))
    return out


def select(scores: Sequence[float | None]) -> int:
    """Alg. 2 line 4, i* = argmax_i l_i: the best-scored candidate; ties go to the policy's order and
    unjudged candidates (None) never beat a judged one; with none judged, the policy's first."""
    best, best_score = 0, None
    for i, s in enumerate(scores):
        if s is not None and (best_score is None or s > best_score):
            best, best_score = i, s
    return best


def select_with_margin(scores: Sequence[float | None], margin: float | None) -> int:
    """:func:`select`, abstaining: the verifier's best candidate only where it beats the policy's own
    (candidate 0) by more than ``margin``, else the policy's (``training.guidance.abstention``
    fits the margin). ``None`` (no margin) is :func:`select`; an unjudged policy candidate defers."""
    best = select(scores)
    if margin is None or best == 0 or not scores or scores[0] is None:
        return best
    chosen = scores[best]
    return best if chosen is not None and chosen - scores[0] > margin else 0


@dataclass(frozen=True)
class StepLog:
    """One guided step, as ``guidance_steps`` stores it."""

    step_idx: int
    n_candidates: int
    chosen_rank: int  # the chosen candidate's rank in the policy's order (0: what the policy would do)
    chosen_score: float | None
    first_score: float | None  # the score of the policy's own choice
    scores: tuple[float | None, ...]
    propose_s: float
    verify_s: float
    policy_calls: int
    verifier_calls: int
    mode: str  # none (no verifier) | local | endpoint | fallback | unjudged | oracle
    note: str = ""
    banned: int = 0  # candidates removed by a retry's bans at this state
    details: str = ""  # JSON: the verifier's own figures


@dataclass
class GuidedPolicy:
    """Best-of-N with ``verifier`` over ``proposer``'s candidates (N = ``n``)."""

    proposer: Proposer
    verifier: Verifier | None = None
    n: int = 1
    policy_id: str = "guided"
    prior: bool = False  # select on log score + log pi(a|s) (:func:`with_prior`) instead of the score alone
    margin: float | None = None  # abstain (:func:`select_with_margin`) unless the verifier wins by more
    attempts: dict[tuple[str, int], AttemptGuidance] = field(default_factory=dict)  # (task, seed) -> guidance
    logs: dict[str, list[StepLog]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise GuidanceError(f"N must be at least 1, got {self.n}")

    def start(self, context: EpisodeContext) -> Actor:
        key = context.episode_id or f"{context.task.task_id}:{context.seed}"
        guidance = self.attempts.get((context.task.task_id, context.seed), AttemptGuidance())
        steps: list[StepLog] = []
        with self.lock:
            self.logs[key] = steps  # a retried attempt (a worker died) starts its log again
        episode_verifier = self.verifier.start(context) if self.verifier is not None else None
        return _GuidedActor(self, context, guidance, episode_verifier, steps)


class _GuidedActor:
    def __init__(
        self,
        policy: GuidedPolicy,
        context: EpisodeContext,
        guidance: AttemptGuidance,
        verifier: EpisodeVerifier | None,
        steps: list[StepLog],
    ) -> None:
        self.policy, self.context, self.guidance, self.verifier, self.steps = policy, context, guidance, verifier, steps
        self.proposer = policy.proposer.start(context, guidance.reflection)
        self.history: list[str] = []
        self.actions: list[Action] = []
        self.problems: list[str | None] = []
        self.previous_screen: Screen | None = None
        self.screen: Screen | None = None
        self.chosen: tuple[Proposal, float | None] | None = None

    def act(self, screen: Screen) -> Action:
        banned = self.guidance.banned_at(tuple(a.canonical_text() for a in self.actions))
        proposed = self.proposer.propose(screen, self.policy.n, banned)
        proposals = proposed.proposals
        verdict = Verdict(tuple(None for _ in proposals), mode="none")
        verify_s = 0.0
        if self.verifier is not None:
            view = StepView(
                instruction=self.context.instruction,
                step_index=len(self.actions),
                screen=screen,
                screen_lines=screen_lines(screen),
                history=tuple(self.history),
                actions=tuple(self.actions),
                problems=tuple(self.problems),
                previous_screen=self.previous_screen,
            )
            started = time.perf_counter()
            verdict = self.verifier.score(view, proposals)
            verify_s = time.perf_counter() - started
        ranking = with_prior(verdict.scores, [p.prior for p in proposals]) if self.policy.prior else verdict.scores
        index = select_with_margin(ranking, self.policy.margin)
        chosen = proposals[index]
        self.steps.append(
            StepLog(
                step_idx=len(self.actions),
                n_candidates=len(proposals),
                chosen_rank=chosen.rank,
                chosen_score=verdict.scores[index],
                first_score=verdict.scores[0] if verdict.scores else None,
                scores=verdict.scores,
                propose_s=proposed.seconds,
                verify_s=verify_s,
                policy_calls=proposed.calls,
                verifier_calls=verdict.calls,
                mode=verdict.mode,
                note=verdict.note,
                banned=len(banned),
                details=json.dumps(dict(verdict.details), default=str) if verdict.details else "",
            )
        )
        self.proposer.commit(chosen)
        self.chosen = (chosen, verdict.scores[index])
        self.history.append(chosen.description)
        self.actions.append(chosen.action)
        self.screen = screen
        return chosen.action

    def observe(self, action: Action, result: StepResult) -> None:
        self.problems.append(result.problem)
        self.previous_screen = self.screen
        self.proposer.observe(action, result)
        if self.verifier is not None and self.chosen is not None:
            self.verifier.observe(self.chosen[0], self.chosen[1], result)


def step_summary(logs: Mapping[str, Sequence[StepLog]]) -> dict[str, float]:
    """Per-step means over episodes: seconds proposing and verifying, calls, and the share of steps
    where the verifier changed the policy's choice, fell back, or judged nothing."""
    steps = [s for items in logs.values() for s in items]
    if not steps:
        return {"steps": 0}
    n = len(steps)
    return {
        "steps": n,
        "propose_ms": 1000 * sum(s.propose_s for s in steps) / n,
        "verify_ms": 1000 * sum(s.verify_s for s in steps) / n,
        "verifier_calls": sum(s.verifier_calls for s in steps) / n,
        "policy_calls": sum(s.policy_calls for s in steps) / n,
        "changed_choice": sum(s.chosen_rank != 0 for s in steps) / n,
        "fallback": sum(s.mode == "fallback" for s in steps) / n,
        "unjudged": sum(s.mode == "unjudged" for s in steps) / n,
    }
