"""An outcome reward model's final judgement: the ORM scores the state after the last action, and
the episode is judged a success when the score reaches the threshold the evaluation report chose
on the validation split (0.5 without one). r_T = 1[judged success], r_t = 0 before: the outcome
reward with the environment's verdict replaced by the model's (ProgRM's ORM baseline, Table 1).

The rare-positive rule (Table-1 issue, declared before the runs it governs): on a block where the
SFT policy almost never succeeds, the binary judgement can be the same for every episode of a batch
and the run learns nothing from it (a flywheel-round ORM judged all 1,440 sparse training episodes
failed while its P(success) still ranked them; a demonstration-trained ORM later judged 95-98% of
them successful). There the ORM pays r_T = P(success) itself; REINFORCE++ normalises returns over
the batch, so what counts is how the ORM ranks the batch's episodes, not its calibration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.policy.rollouts import Rollout
from training.reward_models.scoring import RewardModelError, TrajectoryScorer
from training.rl.rewards.base import RewardBatch, outcome, text_trajectory
from warehouse.catalog import LineageInput

#: How the ORM turns its score into the last step's reward: ``threshold`` (ProgRM's binary
#: judgement) or ``probability`` (P(success) itself, the rare-positive rule).
ORM_RULES: tuple[str, ...] = ("threshold", "probability")
#: The rule each task block uses, fixed before any run on it: the dense block keeps ProgRM's binary
#: ORM; the sparse block (SFT success <= 15%) pays the probability.
ORM_RULE_BY_BLOCK: dict[str, str] = {"dense": "threshold", "sparse": "probability"}


class ORMReward:
    """The ORM's success judgement (or its probability, ``rule="probability"``) at the last step."""

    name = "orm"

    def __init__(self, scorer: TrajectoryScorer, *, threshold: float = 0.5, rule: str = "threshold") -> None:
        if scorer.kind != "orm":
            raise RewardModelError(f"the ORM reward needs an orm model, not a {scorer.kind} model")
        if rule not in ORM_RULES:
            raise ValueError(f"unknown ORM rule {rule!r}; choose one of {', '.join(ORM_RULES)}")
        self.scorer, self.threshold, self.rule = scorer, threshold, rule

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        scored = self.scorer.score([text_trajectory(r.record) for r in rollouts])
        out, agree, judged_success = [], [], []
        for rollout, s in zip(rollouts, scored, strict=True):
            rewards = np.zeros(rollout.n_steps)
            if rollout.n_steps:
                judged = 1.0 if s.scores[-1] >= self.threshold else 0.0
                rewards[-1] = float(s.scores[-1]) if self.rule == "probability" else judged
                agree.append(judged == outcome(rollout.record))
                judged_success.append(judged == 1.0)
            out.append(rewards)
        metrics = {"judgement_accuracy": _mean(agree), "judged_success": _mean(judged_success)}
        return RewardBatch(
            out, metrics | {"threshold": self.threshold, "probability_rule": float(self.rule != "threshold")}
        )

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()


def _mean(values: list[bool]) -> float:
    return float(np.mean(values)) if values else 0.0
