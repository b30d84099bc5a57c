"""The labels of the candidates at a recorded state: by replay, or from the recording where no replay
reproduces the state (the ``step_alternatives`` rows of :mod:`training.flywheel.alternatives`).

Replay carries each candidate out live and labels it by its continuations (:func:`alternative_rows`:
Math-Shepherd's estimate; GuidNav's self-play labels, §4). Some pages do not repeat
(choose-date-easy's jQuery UI date picker, docs/reproducibility.md): every replay diverges, no
candidate there is labelled, and a verifier trained on the rest never sees a candidate of that task
while best-of-N asks it to rank them (issue 42: the PRM lost choose-date-easy whole, 11 -> 0 of 25).

What the recording tells without replaying (all pure):

(a) the task plan's next step at the state (the scripted expert's plan followed over the recorded
    prefix, ``alternatives.planned_action``): the candidate that is the planned step is right;
(b) the field a typed value belongs to: an ``INPUT`` of one task field's value into the box of
    another field is wrong whatever happens next (login-user-popup: the password typed into the
    username box, which the issue's PRM scored 0.95);
(c) the recorded action's own continuation: the episode went on after it, so its outcome is a
    one-sample Monte-Carlo estimate of that candidate's value (Math-Shepherd Eq. 2 with N = 1), and
    the milestones its step reached are the recording's.

``training.reward_models.labels.recording_verdict`` turns these into GUI-Shepherd's step
correctness (positive, negative or unsure; unsure is filtered as GUI-Shepherd filters it). Rows
labelled this way are marked ``labelled_by = 'recording'`` in ``step_alternatives``; the held-out
top-1 metric and the abstention margin use replayed rows only, whose values are measured.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import numpy as np

from envs.policies import same_action
from training.flywheel.replay import ReplayOutcome
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.tables_training import LABELLED_BY_RECORDING, LABELLED_BY_REPLAY

# ---------------------------------------------------------------------------------------------
# A state and its candidates
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceEpisode:
    """A recorded episode that can be replayed: live MiniWoB++, its seed known."""

    episode_id: str
    task_id: str
    seed: int
    purpose: str
    policy_id: str
    n_steps: int
    source: str = ""  # the request's source it was drawn for (``alternatives.SOURCES``); empty: its purpose

    @property
    def sample_source(self) -> str:
        return self.source or self.purpose


@dataclass(frozen=True)
class CandidateAction:
    """One alternative: the action, its place in the state's list (0: the policy's argmax), its
    rank and log-probability under the proposer (None for a recorded action it never proposed)."""

    index: int
    action: Action
    policy_rank: int | None
    policy_logp: float | None
    is_recorded: bool


@dataclass(frozen=True)
class StateToLabel:
    """A sampled state with its candidates, ready to be replayed (or labelled from its recording)."""

    state_id: str
    episode: SourceEpisode
    step_idx: int
    family: str
    instruction: str
    prefix: tuple[Action, ...]
    screens: tuple[Screen, ...]  # o_0..o_t as recorded
    milestones_reached: int  # milestones the recorded prefix reached
    candidates: tuple[CandidateAction, ...]
    descriptions: tuple[str, ...]  # each candidate as reward models read it
    planned: Action | None
    max_steps: int  # the task's step budget
    fields: Mapping[str, str] = field(default_factory=dict)  # the task's fields (which value goes where)
    recorded_success: bool = False  # how the recorded episode ended, after the recorded action
    recorded_milestones: tuple[str, ...] = ()  # the milestones the recorded action's own step reached


#: When a stage labels candidates from the recording: at states no replay reproduced (the default),
#: at every state (no browser starts), or never (such states are dropped, as before issue 42 item 2).
RecordingLabels = Literal["diverged", "always", "never"]
RECORDING_LABELS: tuple[str, ...] = get_args(RecordingLabels)

_NOT_ALNUM = re.compile(r"[^0-9a-z]+")


def _normalised(text: str) -> str:
    return _NOT_ALNUM.sub("", text.lower())


def typed_field(action: Action, fields: Mapping[str, str]) -> str | None:
    """The task field whose value an ``INPUT`` types (its text equals exactly one field's value,
    ignoring surrounding spaces); None for other actions, or text that is no single field's value."""
    if action.type is not ActionType.INPUT or action.text is None:
        return None
    typed = action.text.strip()
    owners = [name for name, value in fields.items() if typed and str(value).strip() == typed]
    return owners[0] if len(owners) == 1 else None


def element_field(element: UIElement | None, fields: Mapping[str, str]) -> str | None:
    """The task field an input box is for: the one field whose name the element's own id or
    description carries (``#username`` is the ``username`` field's box); a name inside a longer one
    that also fits gives way to it (``name`` to ``username``); None when no name fits, or two do."""
    if element is None:
        return None
    identity = _normalised(f"{element.element_id} {element.description}")
    if not identity:
        return None
    fitting = [name for name in fields if _normalised(name) and _normalised(name) in identity]
    # A longer name that fits explains a shorter one inside it (``username`` over ``name``).
    longest = [n for n in fitting if not any(n != m and _normalised(n) in _normalised(m) for m in fitting)]
    return longest[0] if len(longest) == 1 else None


def field_match(action: Action, fields: Mapping[str, str]) -> bool | None:
    """Whether an ``INPUT`` of a field's value goes into that field's box (True), into another
    field's box (False), or cannot be told (None: not such an input, or a box of no known field)."""
    typed = typed_field(action, fields)
    if typed is None:
        return None
    box = element_field(action.target, fields)
    if box is None:
        return None
    return box == typed


def recorded_continuation(success: bool, step_idx: int, n_steps: int) -> tuple[bool, bool, float]:
    """What the recording shows of its own action at step ``step_idx``: whether the episode ended
    at that step, whether it ended in success there, and the one-sample Monte-Carlo value of the
    action (1.0 when the episode went on to succeed, else 0.0; Math-Shepherd Eq. 2 with N = 1)."""
    ended = step_idx == n_steps - 1
    return ended, ended and success, 1.0 if success else 0.0


@dataclass
class AlternativesSummary:
    """What a run labelled and what it dropped, and what replays cost."""

    states_sampled: int = 0
    states_labelled: int = 0
    states_dropped: int = 0  # no replay of any candidate reproduced the state (and none labelled from the recording)
    states_from_recording: int = 0  # labelled from the recording: no replay reproduced it, or none was asked for
    candidates_labelled: int = 0
    candidates_dropped: int = 0
    replays: int = 0
    replays_diverged: int = 0  # the state was not reproduced: counted, dropped
    replays_lost: int = 0  # the environment failed past its retries
    not_repeatable: int = 0  # candidates whose step gave different results across replays
    diverged_by_task: Counter = field(default_factory=Counter)
    from_recording_by_task: Counter = field(default_factory=Counter)
    replay_ms: list[float] = field(default_factory=list)
    live_step_ms: list[float] = field(default_factory=list)
    by_purpose: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        def median(values: list[float]) -> float | None:
            return float(np.median(values)) if values else None

        return {
            "states_sampled": self.states_sampled,
            "states_labelled": self.states_labelled,
            "states_dropped": self.states_dropped,
            "states_from_recording": self.states_from_recording,
            "from_recording_by_task": dict(sorted(self.from_recording_by_task.items())),
            "candidates_labelled": self.candidates_labelled,
            "candidates_dropped": self.candidates_dropped,
            "replays": self.replays,
            "replays_diverged": self.replays_diverged,
            "replays_lost": self.replays_lost,
            "not_repeatable": self.not_repeatable,
            "diverged_by_task": dict(sorted(self.diverged_by_task.items())),
            "states_by_purpose": dict(sorted(self.by_purpose.items())),
            "replay_ms_median": median(self.replay_ms),
            "live_step_ms_median": median(self.live_step_ms),
            "replay_cost_in_live_steps": (
                median(self.replay_ms) / median(self.live_step_ms)  # type: ignore[operator]
                if self.replay_ms and self.live_step_ms
                else None
            ),
            "seconds": round(self.seconds, 1),
        }


def monte_carlo_value(outcomes: Sequence[ReplayOutcome], *, last_step: bool = False) -> float | None:
    """A candidate's value (Math-Shepherd's soft estimate): 1 or 0 where its own step ended the
    episode (the outcome is known), 0 where it took the task's last step (``last_step``) without
    ending it (the episode failed there, out of steps), else the share of its continuations that
    succeeded; None when nothing continued after it (m = 0)."""
    if not outcomes:
        return None
    first = outcomes[0]
    if first.ended:
        return 1.0 if first.ended_success else 0.0
    if last_step:
        return 0.0
    continued = [o for o in outcomes if o.continued]
    if not continued:
        return None
    return sum(o.success for o in continued) / len(continued)


def _repeatable(outcomes: Sequence[ReplayOutcome]) -> bool:
    facts = {(o.milestones_hit, o.ended, o.ended_success, o.problem) for o in outcomes}
    return len(facts) <= 1


def _candidate_columns(
    state: StateToLabel, c: CandidateAction, description: str, *, proposer_id: str, round_: int
) -> dict[str, Any]:
    """The columns of a ``step_alternatives`` row that say which candidate at which state it is."""
    return {
        "alternative_id": f"{state.state_id}:{c.index}",
        "state_id": state.state_id,
        "episode_id": state.episode.episode_id,
        "step_idx": state.step_idx,
        "task_id": state.episode.task_id,
        "task_family": state.family,
        "seed": state.episode.seed,
        "purpose": state.episode.purpose,
        "source_policy_id": state.episode.policy_id,
        "proposer_policy_id": proposer_id,
        "round": round_,
        "candidate": c.index,
        "policy_rank": c.policy_rank,
        "policy_logp": c.policy_logp,
        "action_type": c.action.type.value,
        "action_text": c.action.canonical_text(),
        "action_description": description,
        "is_recorded": c.is_recorded,
        "planned_action": state.planned.canonical_text() if state.planned is not None else None,
        "matches_plan": same_action(c.action, state.planned) if state.planned is not None else None,
        "field_match": field_match(c.action, state.fields),
    }


def alternative_rows(
    states: Sequence[StateToLabel],
    outcomes: Mapping[tuple[str, int], Sequence[ReplayOutcome]],
    *,
    proposer_id: str,
    round_: int,
    run_id: str | None,
    summary: AlternativesSummary,
) -> list[dict[str, Any]]:
    """``step_alternatives`` rows of the candidates that at least one replay labelled; states and
    candidates without one are counted in ``summary`` and left out."""
    created = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for state in states:
        kept = 0
        for c, description in zip(state.candidates, state.descriptions, strict=True):
            got = outcomes.get((state.state_id, c.index), ())
            if not got:
                summary.candidates_dropped += 1
                continue
            kept += 1
            first = got[0]
            continued = [o for o in got if o.continued]
            repeatable = _repeatable(got)
            summary.not_repeatable += not repeatable
            rows.append(
                {
                    **_candidate_columns(state, c, description, proposer_id=proposer_id, round_=round_),
                    "milestones_hit": list(first.milestones_hit),
                    "ended": first.ended,
                    "ended_success": first.ended_success,
                    "step_problem": first.problem,
                    "continuations": len(continued),
                    "continuation_successes": sum(o.success for o in continued),
                    "mc_value": monte_carlo_value(got, last_step=state.step_idx + 1 >= state.max_steps),
                    "repeatable": repeatable,
                    "replay_ms": float(np.mean([o.replay_ms for o in got])),
                    "labelled_by": LABELLED_BY_REPLAY,
                    "run_id": run_id,
                    "created_at": created,
                }
            )
        summary.candidates_labelled += kept
        if kept:
            summary.states_labelled += 1
            summary.by_purpose[state.episode.purpose] += 1
        else:
            summary.states_dropped += 1
    return rows


def recording_rows(
    states: Sequence[StateToLabel],
    *,
    proposer_id: str,
    round_: int,
    run_id: str | None,
    summary: AlternativesSummary,
) -> list[dict[str, Any]]:
    """``step_alternatives`` rows of every candidate of ``states`` labelled from the recording alone
    (``labelled_by = 'recording'``): the plan's step and the typed field for each, and for the recorded
    action what its step reached and how the episode ended after it. Nothing here was replayed:
    ``continuations`` is 1 for the recorded action (its recorded continuation) and 0 for the rest,
    whose ``mc_value`` stays unknown. Counted in ``summary`` as labelled from the recording."""
    created = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for state in states:
        ended, ended_success, value = recorded_continuation(
            state.recorded_success, state.step_idx, state.episode.n_steps
        )
        for c, description in zip(state.candidates, state.descriptions, strict=True):
            rows.append(
                {
                    **_candidate_columns(state, c, description, proposer_id=proposer_id, round_=round_),
                    "milestones_hit": list(state.recorded_milestones) if c.is_recorded else [],
                    "ended": ended if c.is_recorded else None,
                    "ended_success": ended_success if c.is_recorded else None,
                    "step_problem": None,
                    "continuations": int(c.is_recorded),
                    "continuation_successes": int(c.is_recorded and state.recorded_success),
                    "mc_value": value if c.is_recorded else None,
                    "repeatable": None,
                    "replay_ms": None,
                    "labelled_by": LABELLED_BY_RECORDING,
                    "run_id": run_id,
                    "created_at": created,
                }
            )
        summary.candidates_labelled += len(state.candidates)
        summary.states_labelled += 1
        summary.states_from_recording += 1
        summary.from_recording_by_task[state.episode.task_id] += 1
        summary.by_purpose[state.episode.purpose] += 1
    return rows
