"""An outcome reward model's final judgement: the ORM scores the state after the last action, and
the episode is judged a success when the score reaches the threshold the evaluation report chose
on the validation split (0.5 without one). r_T = 1[judged success], r_t = 0 before: the outcome
reward with the environment's verdict replaced by the model's (ProgRM's ORM baseline, Table 1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.policy.rollouts import Rollout
from training.reward_models.scoring import RewardModelError, TrajectoryScorer
from training.rl.rewards.base import RewardBatch, outcome, text_trajectory
from warehouse.catalog import LineageInput


class ORMReward:
    """The ORM's success judgement at the last step."""

    name = "orm"

    def __init__(self, scorer: TrajectoryScorer, *, threshold: float = 0.5) -> None:
        if scorer.kind != "orm":
            raise RewardModelError(f"the ORM reward needs an orm model, not a {scorer.kind} model")
        self.scorer, self.threshold = scorer, threshold

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        scored = self.scorer.score([text_trajectory(r.record) for r in rollouts])
        out, agree = [], []
        for rollout, s in zip(rollouts, scored, strict=True):
            rewards = np.zeros(rollout.n_steps)
            if rollout.n_steps:
                judged = 1.0 if s.scores[-1] >= self.threshold else 0.0
                rewards[-1] = judged
                agree.append(judged == outcome(rollout.record))
            out.append(rewards)
        return RewardBatch(out, {"judgement_accuracy": _mean(agree), "threshold": self.threshold})

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()


def _mean(values: list[bool]) -> float:
    return float(np.mean(values)) if values else 0.0
