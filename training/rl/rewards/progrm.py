"""ProgRM's progress reward (Eq. 2): r_t = p_t - p_{t-k}, the progress a trained progress model
estimates after action ``a_t`` minus its estimate k steps earlier (p_{-1} = 0, k = 1 in the paper's
main runs; Table 4 finds k = 3 worse). Gains can be negative: a step that undoes progress pays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.policy.rollouts import Rollout
from training.reward_models.scoring import RewardModelError, TrajectoryScorer
from training.rl.rewards.base import RewardBatch, text_trajectory
from warehouse.catalog import LineageInput


class ProgressReward:
    """Progress gains of a ProgRM model (``progrm_lcs`` or ``progrm_env``)."""

    def __init__(self, scorer: TrajectoryScorer, *, k: int = 1, name: str | None = None) -> None:
        if not scorer.kind.startswith("progrm"):
            raise RewardModelError(f"the progress reward needs a ProgRM model, not a {scorer.kind} model")
        if k < 1:
            raise ValueError(f"the progress history k must be at least 1, got {k}")
        self.scorer, self.k = scorer, k
        self.name = name or scorer.kind

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        scored = self.scorer.score([text_trajectory(r.record) for r in rollouts], k=self.k)
        rewards = [np.asarray(s.progress_gains if s.progress_gains is not None else s.rewards) for s in scored]
        finals = [s.scores[-1] for s in scored if s.scores]
        return RewardBatch(rewards, {"mean_final_progress": float(np.mean(finals)) if finals else 0.0})

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()
