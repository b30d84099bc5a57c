"""Verifiers: what scores a step's N candidates so that the best is executed.

* :class:`StepJudgeVerifier` (``prm``, ``guidnav``): the step reward model scores
  ``action_state(s_t, a)`` = (instruction, history a_0..a_{t-1}, screen o_t, candidate a) for every
  candidate, all N in **one** batch (GUI-Shepherd Eq. 6, a* = argmax_a L_pos(I, s_t, a); the
  sigmoid of our head is monotone in the positive logit, so the argmax is the same; GuidNav Eqs. 5-6,
  r_t^k = R(x, h_t, a_t^k, s_t), a* = argmax_k r_t^k).
* :class:`ProgressGainVerifier` (``progrm_lcs``, ``progrm_env``): ProgRM's progress gain (Eq. 2,
  k = 1) of each candidate, Prog(g, [a_0..a_{t-1}, a], o) - Prog(g, [a_0..a_{t-1}], o_t). The next
  screen o_{t+1} is not known before acting, so the current screen o_t stands in for it in the
  candidate's state; the current progress is the same for all candidates (it only makes the score
  a gain: the argmax is that of the candidates' progress). One batch of N + 1 states.
* :class:`OracleVerifier` (``oracle``): the upper bound GuidNav reports as "top-k with oracle":
  a candidate that does the task spec's next planned step (``envs.policies``' expansion of the
  spec's ``solution``, the scripted expert's plan) scores 1, others 0; with none matching, the
  policy's first candidate is kept.
* :class:`EnsembleVerifier` (``ensemble``, not in the papers): the step PRM and ProgRM-Env's gain
  together, each candidate's two scores turned into ranks within the step (their scales differ: a
  probability and a difference of progress) and averaged.
* ``judge``: the GUI-PRA judge (:mod:`training.guidance.judge`).

:func:`make_verifier` chooses one by name and refuses, before any rollout, an unknown name, the
ORM (it judges whole trajectories, not candidate steps) or a checkpoint of another kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envs.policies import PlanTracker, SolutionError, expand_solution, same_action
from envs.protocol import EpisodeContext, StepResult
from training.base.states import StepState
from training.guidance.proposals import GuidanceError, Proposal
from training.reward_models.kinds import PROGRESS_KINDS, STEP_JUDGE_KINDS
from training.reward_models.scoring import LocalScorer, RewardModelError, load_scorer
from warehouse.catalog import LineageInput, Warehouse
from warehouse.model import Action, ActionType, Screen

#: Verifiers by name: step judges, progress models, the oracle, the GUI-PRA judge.
VERIFIERS: tuple[str, ...] = (*STEP_JUDGE_KINDS, *PROGRESS_KINDS, "ensemble", "oracle", "judge")
#: The ensemble's members: a step judge and a progress model (see :class:`EnsembleVerifier`).
ENSEMBLE_KINDS: tuple[str, str] = ("prm", "progrm_env")


@dataclass(frozen=True)
class StepView:
    """What a verifier sees at step t: the instruction (the original one, never a reflection),
    the executed history as reward models read it, and the screens."""

    instruction: str
    step_index: int
    screen: Screen
    screen_lines: tuple[str, ...]
    history: tuple[str, ...]  # a_0..a_{t-1} as reward models read them
    actions: tuple[Action, ...] = ()  # the same actions
    problems: tuple[str | None, ...] = ()  # why each could not be carried out (None: it was)
    previous_screen: Screen | None = None  # o_{t-1}


@dataclass(frozen=True)
class Verdict:
    """Scores of a step's candidates (None: unjudged) and what judging cost.

    ``mode``: ``local`` (a model in this process), ``endpoint`` (every score from the LLM
    endpoint), ``fallback`` (the endpoint failed for some candidates; the local model scored
    them), ``unjudged`` (no score at all: the policy's first candidate is taken), ``oracle``."""

    scores: tuple[float | None, ...]
    calls: int = 0
    mode: str = "local"
    note: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


class EpisodeVerifier(Protocol):
    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict: ...

    def observe(self, chosen: Proposal, score: float | None, result: StepResult) -> None: ...


class Verifier(Protocol):
    name: str

    def start(self, context: EpisodeContext) -> EpisodeVerifier: ...

    def lineage(self) -> list[LineageInput]: ...


class _Stateless:
    """An episode view of a verifier whose scores depend on the step alone."""

    def __init__(self, owner: StepJudgeVerifier | ProgressGainVerifier | EnsembleVerifier) -> None:
        self.owner = owner

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        return self.owner.score(view, proposals)

    def observe(self, chosen: Proposal, score: float | None, result: StepResult) -> None:
        pass


def candidate_states(view: StepView, proposals: Sequence[Proposal]) -> list[StepState]:
    """``action_state(s_t, a)`` for every candidate a (GUI-Shepherd Eq. 1's input)."""
    return [StepState(view.instruction, view.history, view.screen_lines, p.description) for p in proposals]


def progress_states(view: StepView, proposals: Sequence[Proposal]) -> list[StepState]:
    """The current state [g, a_0..a_{t-1}, o_t], then each candidate appended to the history (with
    o_t standing in for the unknown next screen): ProgRM Eq. 6 states."""
    current = StepState(view.instruction, view.history, view.screen_lines)
    return [current] + [
        StepState(view.instruction, (*view.history, p.description), view.screen_lines) for p in proposals
    ]


@dataclass
class StepJudgeVerifier:
    """A step PRM (``prm``) or GuidNav reward model (``guidnav``) scoring all candidates in one batch."""

    scorer: LocalScorer
    name: str = "prm"

    def start(self, context: EpisodeContext) -> EpisodeVerifier:
        return _Stateless(self)

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        """GUI-Shepherd Eq. 6 / GuidNav Eq. 5: one score per candidate, one model call."""
        scores = self.scorer.scorer.score_states(candidate_states(view, proposals))
        return Verdict(tuple(float(s) for s in scores), calls=1, mode="local")

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()


@dataclass
class ProgressGainVerifier:
    """ProgRM's progress gain of each candidate (Eq. 2, k = 1), N + 1 states in one batch."""

    scorer: LocalScorer
    name: str = "progrm_env"

    def start(self, context: EpisodeContext) -> EpisodeVerifier:
        return _Stateless(self)

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        """r = Prog(g, [a_<t, a], o_t) - Prog(g, [a_<t], o_t) per candidate (see the module docstring)."""
        progress = self.scorer.scorer.score_states(progress_states(view, proposals))
        gains = tuple(float(p - progress[0]) for p in progress[1:])
        return Verdict(gains, calls=1, mode="local", details={"progress": float(progress[0])})

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()


def step_ranks(scores: Sequence[float | None]) -> list[float | None]:
    """Each judged candidate's rank among the step's judged candidates, scaled to [0, 1] (1: the
    highest; equal scores share their mean rank; a lone judged candidate gets 1); None stays None."""
    judged = sorted((s, i) for i, s in enumerate(scores) if s is not None)
    out: list[float | None] = [None] * len(scores)
    if not judged:
        return out
    span = max(1, len(judged) - 1)
    position = 0
    while position < len(judged):
        end = position
        while end + 1 < len(judged) and judged[end + 1][0] == judged[position][0]:
            end += 1
        rank = (position + end) / 2 / span if len(judged) > 1 else 1.0
        for k in range(position, end + 1):
            out[judged[k][1]] = rank
        position = end + 1
    return out


def mean_rank(verdicts: Sequence[Verdict]) -> tuple[float | None, ...]:
    """Per candidate, the mean of its :func:`step_ranks` over the verdicts that judged it (None
    where none did)."""
    ranks = [step_ranks(v.scores) for v in verdicts]
    out = []
    for i in range(len(verdicts[0].scores)):
        mine = [rank for r in ranks if (rank := r[i]) is not None]
        out.append(sum(mine) / len(mine) if mine else None)
    return tuple(out)


@dataclass
class EnsembleVerifier:
    """The step PRM and a progress model's gain, each candidate scored by its mean within-step rank
    (:func:`mean_rank`): a candidate both rank first wins; where they disagree, the tie goes to the
    policy's order (:func:`training.guidance.agent.select`)."""

    members: tuple[StepJudgeVerifier | ProgressGainVerifier, ...]
    name: str = "ensemble"

    def start(self, context: EpisodeContext) -> EpisodeVerifier:
        return _Stateless(self)  # stateless like its members

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        verdicts = [m.score(view, proposals) for m in self.members]
        return Verdict(
            mean_rank(verdicts),
            calls=sum(v.calls for v in verdicts),
            mode="local",
            details={m.name: list(v.scores) for m, v in zip(self.members, verdicts, strict=True)},
        )

    def lineage(self) -> list[LineageInput]:
        return [i for m in self.members for i in m.lineage()]


# ---------------------------------------------------------------------------------------------
# The oracle (the plan's pointer, PlanTracker, lives with the scripted expert in envs.policies)
# ---------------------------------------------------------------------------------------------


class _OracleEpisode:
    def __init__(self, tracker: PlanTracker) -> None:
        self.tracker = tracker
        self.screen: Screen | None = None

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        self.screen = view.screen
        wanted, index = self.tracker.expected(view.screen)
        scores = tuple(1.0 if wanted is not None and same_action(p.action, wanted) else 0.0 for p in proposals)
        if not self.tracker.plan:
            note = "no plan (the task's spec has no solution): the policy's first"
        elif not any(scores):
            done = wanted is None and index >= len(self.tracker.plan)
            note = "plan done" if done else "no candidate does the plan's step"
        else:
            note = ""
        return Verdict(scores, calls=0, mode="oracle", note=note, details={"plan_step": index})

    def observe(self, chosen: Proposal, score: float | None, result: StepResult) -> None:
        if self.screen is not None:
            self.tracker.advance(chosen.action, self.screen, result.problem is None)


@dataclass
class OracleVerifier:
    """GuidNav's "top-k with oracle": the candidate the spec's plan wants, when one is (a task whose
    spec has no solution has no plan: the policy's first candidate, said in the step's note)."""

    name: str = "oracle"

    def start(self, context: EpisodeContext) -> EpisodeVerifier:
        try:
            plan = expand_solution(context.task, context.slots) if context.task.solution else []
        except SolutionError as exc:
            raise GuidanceError(f"the oracle needs the task's solution: {exc}") from None
        return _OracleEpisode(PlanTracker(plan))

    def lineage(self) -> list[LineageInput]:
        return []


# ---------------------------------------------------------------------------------------------
# Choosing a verifier
# ---------------------------------------------------------------------------------------------


def load_local_scorer(warehouse: Warehouse | None, kind: str, checkpoint: Path | str | None = None) -> LocalScorer:
    """The newest trained model of ``kind`` in the warehouse (or the checkpoint given), checked to
    be of that kind."""
    try:
        if checkpoint is not None:
            scorer = LocalScorer(checkpoint)
        else:
            if warehouse is None:
                raise GuidanceError(f"a {kind} verifier needs a warehouse or a checkpoint")
            loaded = load_scorer(warehouse, kind)
            if not isinstance(loaded, LocalScorer):  # pragma: no cover - load_scorer without endpoint is local
                raise GuidanceError(f"the {kind} verifier needs a local checkpoint")
            scorer = loaded
    except RewardModelError as exc:
        raise GuidanceError(str(exc)) from None
    if scorer.kind != kind:
        raise GuidanceError(
            f"the {kind} verifier needs a {kind} reward model, but {scorer.checkpoint} is a {scorer.kind} model"
        )
    return scorer


def context_of(task: Any, instruction: str, slots: Mapping[str, str], max_steps: int = 12) -> EpisodeContext:
    """An episode context outside an environment (tests, benchmarks over recorded screens)."""
    return EpisodeContext(
        task=task,
        instruction=instruction,
        slots=dict(slots),
        seed=0,
        backend="miniwob",
        supported_actions=frozenset(ActionType),
        max_steps=max_steps,
    )
