"""The kinds of reward model, one registry: what each kind reads and how it is labelled.

Labels per kind (:data:`KINDS`):

* ``progrm_lcs`` / ``progrm_env``: soft progress labels in [0, 1] (LCS recipes or environment
  milestones, ProgRM §2.2); only the steps ``progress_split.sampled_steps`` keeps (App. C: failed
  trajectories' steps sampled to balance success:failure steps ~1:1).
* ``orm``: one example per trajectory, the final state, labelled with the outcome (success).
* ``prm``: one example per (state, action), positive / negative; human labels where present,
  otherwise derived from progress labels; ``unsure`` dropped (GUI-Shepherd App. A.2).
* ``guidnav``: a scalar step reward in [0, 1] regressed with MSE (GuidNav §3.1, Eq. 3).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from training.base.registry import keys_by_model
from training.base.states import StepState, TextTrajectory, action_state, progress_state

log = logging.getLogger(__name__)


Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = ("train", "validation", "test")
Verdict = Literal["positive", "negative", "unsure"]


class RewardModelKind(StrEnum):
    """The kinds of reward model. Members are strings, so ``RewardModelKind.ORM == "orm"`` and a
    kind read from a table, a config or the command line looks up :data:`KINDS` as it is."""

    ORM = "orm"
    PROGRM_LCS = "progrm_lcs"
    PROGRM_ENV = "progrm_env"
    PRM = "prm"
    GUIDNAV = "guidnav"


@dataclass(frozen=True)
class KindSpec:
    """What one kind of reward model learns, from which labels, with which loss and prompt."""

    name: RewardModelKind
    target: Literal["progress", "outcome", "step_correctness", "step_reward"]
    loss: Literal["bce", "mse"]
    state: Literal["after_action", "before_action"]  # progress_state | action_state
    question: str  # the last line of the system/user instruction of the prompt
    description: str
    label_source: str | None = None  # progress_labels.source the labels come from, if any

    @property
    def scores_progress(self) -> bool:
        """Whether the score is a progress p_t, so that Eq. 2 gains p_t - p_{t-k} are rewards."""
        return self.state == "after_action"


KINDS: dict[RewardModelKind, KindSpec] = {
    RewardModelKind.ORM: KindSpec(
        RewardModelKind.ORM,
        "outcome",
        "bce",
        "after_action",
        "You should give a judgment about the success or failure of this task.",
        "Outcome reward model: final state of each trajectory, success label (ProgRM Table 8 prompt).",
    ),
    RewardModelKind.PROGRM_LCS: KindSpec(
        RewardModelKind.PROGRM_LCS,
        "progress",
        "bce",
        "after_action",
        "You should give a percentage which is an estimation of his progress on this task.",
        "ProgRM with LCS progress labels (§2.2), BCE on soft labels (Eq. 5), Table 7 prompt.",
        label_source="lcs",
    ),
    RewardModelKind.PROGRM_ENV: KindSpec(
        RewardModelKind.PROGRM_ENV,
        "progress",
        "bce",
        "after_action",
        "You should give a percentage which is an estimation of his progress on this task.",
        "ProgRM with environment-milestone progress labels (§2.2 last paragraph), BCE (Eq. 5).",
        label_source="env",
    ),
    RewardModelKind.PRM: KindSpec(
        RewardModelKind.PRM,
        "step_correctness",
        "bce",
        "before_action",
        "You should judge whether the candidate action is a correct step towards completing this task.",
        "Binary step-correctness PRM (GUI-Shepherd §3): human labels, else derived; unsure filtered.",
    ),
    RewardModelKind.GUIDNAV: KindSpec(
        RewardModelKind.GUIDNAV,
        "step_reward",
        "mse",
        "before_action",
        "You should give a score between 0 and 1 for how much the candidate action helps to complete this task.",
        "GuidNav process reward model (§3.1): scalar step reward regressed with MSE (Eq. 3).",
    ),
}
# The groups below are plain strings: they become Dagster partition keys, config values and JSON,
# which take no enum (Dagster refuses to serialize one).
REWARD_MODEL_KINDS: tuple[str, ...] = tuple(k.value for k in KINDS)
#: The kinds whose score is the progress p_t (ProgRM), so that gains p_t - p_{t-k} are rewards.
PROGRESS_KINDS: tuple[str, ...] = tuple(k.value for k, s in KINDS.items() if s.target == "progress")
#: The kinds that judge a candidate step (the state before the action plus the action).
STEP_JUDGE_KINDS: tuple[str, ...] = tuple(k.value for k, s in KINDS.items() if s.state == "before_action")
#: The kinds that judge a trajectory's success from its final state: the ORM and ProgRM (Table 2).
SUCCESS_JUDGE_KINDS: tuple[str, ...] = tuple(k.value for k, s in KINDS.items() if s.state == "after_action")
#: How reports and plots name each kind.
DISPLAY_NAMES: dict[str, str] = {
    RewardModelKind.ORM.value: "ORM",
    RewardModelKind.PROGRM_LCS.value: "ProgRM-LCS",
    RewardModelKind.PROGRM_ENV.value: "ProgRM-Env",
    RewardModelKind.PRM.value: "PRM",
    RewardModelKind.GUIDNAV.value: "GuidNav",
}


def display_name(key: str) -> str:
    """A report key (:func:`training.base.registry.report_keys`) as tables and plots name it: the
    kind's display name, and the model id when the key carries one ("ORM (orm-...)")."""
    kind, _, model_id = key.partition("@")
    name = DISPLAY_NAMES.get(kind, kind)
    return f"{name} ({model_id})" if model_id else name


def model_names(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Model id -> its :func:`display_name`, for rows holding ``model_id`` and ``kind`` in report
    order (the latest model of a kind first): one naming rule for every table of a report."""
    return {m: display_name(key) for m, key in keys_by_model((r["model_id"], r["kind"]) for r in rows).items()}


def kind_spec(kind: str) -> KindSpec:
    """The spec of a kind given as a member or its string; an unknown kind names the known ones."""
    try:
        return KINDS[RewardModelKind(kind)]
    except ValueError:
        raise ValueError(f"unknown reward-model kind {kind!r}; expected one of {', '.join(KINDS)}") from None


def state_for(kind: str, trajectory: TextTrajectory, t: int) -> StepState:
    """The state a model of ``kind`` scores at step ``t``."""
    return progress_state(trajectory, t) if kind_spec(kind).state == "after_action" else action_state(trajectory, t)
