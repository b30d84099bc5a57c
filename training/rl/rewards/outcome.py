"""The environment's outcome: 1 at the last step of a successful episode, 0 everywhere else
(the sparse signal the dense sources are compared against)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.policy.rollouts import Rollout
from training.rl.rewards.base import RewardBatch, outcome
from warehouse.catalog import LineageInput


class OutcomeReward:
    """r_T = 1[success], r_t = 0 for t < T."""

    name = "outcome"

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        out = []
        for r in rollouts:
            rewards = np.zeros(r.n_steps)
            if r.n_steps:
                rewards[-1] = outcome(r.record)
            out.append(rewards)
        return RewardBatch(out, {"success_rate": float(np.mean([outcome(r.record) for r in rollouts] or [0.0]))})

    def lineage(self) -> list[LineageInput]:
        return []
