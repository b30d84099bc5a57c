"""Step judges as rewards.

* PRM (GUI-Shepherd Eq. 3): r_t = w_p * R_PRM(I, s_t, a_t) + w_f * R_format(a_t), where R_format
  is -1 for an output that does not parse as an action, 0 otherwise. The PRM judges a step
  positive or negative; the paper gives no numbers for the two, nor for w_p and w_f (both 1 here).
  We pay the judgement's expected value with positive = +1 and negative = -1, i.e. 2 P(correct) - 1:
  a reward that is never negative (P itself) pays every extra step, and in our first runs the
  policy learned to make episodes long (success fell to 5%, reward per episode rose to 9.6).
* GuidNav (§3.1): the step reward model's score r_t = R(x, h_t, s_t, a_t) in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.policy.rollouts import Rollout
from training.reward_models.scoring import RewardModelError, TrajectoryScorer
from training.rl.rewards.base import RewardBatch, text_trajectory
from warehouse.catalog import LineageInput

FORMAT_PENALTY = -1.0


def format_rewards(rollout: Rollout) -> np.ndarray:
    """R_format per step: -1 where the policy's output was not a well-formed action, else 0."""
    return np.array([0.0 if rollout.well_formed(t) else FORMAT_PENALTY for t in range(rollout.n_steps)])


class StepJudgeReward:
    """A step judge's scores (``prm``: 2 P(correct) - 1; ``guidnav``: its score) plus, weighted, the
    format reward."""

    def __init__(
        self, scorer: TrajectoryScorer, *, kind: str, step_weight: float = 1.0, format_weight: float = 1.0
    ) -> None:
        if scorer.kind != kind:
            raise RewardModelError(f"the {kind} reward needs a {kind} model, not a {scorer.kind} model")
        self.scorer, self.name = scorer, kind
        self.step_weight, self.format_weight = step_weight, format_weight

    def step_value(self, scores: np.ndarray) -> np.ndarray:
        """The reward a judgement pays: +1 / -1 for a binary PRM (in expectation), the score for GuidNav."""
        return 2.0 * scores - 1.0 if self.name == "prm" else scores

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        scored = self.scorer.score([text_trajectory(r.record) for r in rollouts])
        out = [
            self.step_weight * self.step_value(np.asarray(s.scores, dtype=np.float64))
            + self.format_weight * format_rewards(r)
            for r, s in zip(rollouts, scored, strict=True)
        ]
        flat = np.concatenate([np.asarray(s.scores) for s in scored]) if scored else np.zeros(0)
        bad = sum(int((format_rewards(r) < 0).sum()) for r in rollouts)
        return RewardBatch(out, {"mean_step_score": float(flat.mean()) if flat.size else 0.0, "format_errors": bad})

    def lineage(self) -> list[LineageInput]:
        return self.scorer.lineage()
