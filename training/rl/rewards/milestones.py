"""The task spec's own milestones as a reward: ProgRM-Env's labels, paid exactly.

ProgRM-Env (ProgRM §2.2, last paragraph) is a model trained on environment-milestone progress: after
action ``a_t``, the share of the task spec's milestones reached so far, each reached in the spec's
order (``annotation.progress.key_steps.milestone_progress``). The environment checks the same
milestones online during every rollout (``StepRecord.milestones_hit``, the in-order tracker of
``envs.protocol``), so RL can be paid the labels themselves: what a ProgRM-Env model that ranked
perfectly would pay. The source ``milestones`` pays the progress gains ``p_t - p_{t-1}`` (ProgRM
Eq. 2, k = 1, ``p_{-1} = 0``); composed with the outcome (``outcome+milestones:shaped`` / ``:decay``)
the progress ``p_t`` is the shaping potential of the state after ``a_t``.

A milestone once reached stays reached (the labels' definition): on use-spinner a policy that clicks
past the target has still "set the number", and a later submit reaches the next milestone whatever
the field then holds. A task without milestones pays nothing. Needs a task spec with milestones; no
reward model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envs.protocol import EpisodeRecord
from training.policy.rollouts import Rollout
from training.rl.rewards.base import RewardBatch
from warehouse.catalog import LineageInput


def episode_milestone_progress(record: EpisodeRecord) -> np.ndarray:
    """``p_t`` for each step of an episode: milestones reached after action ``a_t`` over the spec's
    count (``record.n_milestones``; zeros where the task has none). The online tracker reports a
    milestone only once every earlier one is reached, so the running count is the labels' in-order
    progress."""
    if record.n_milestones <= 0:
        return np.zeros(record.n_steps)
    reached = np.cumsum([len(step.milestones_hit) for step in record.steps], dtype=np.float64)
    if reached.size and reached[-1] > record.n_milestones:
        raise ValueError(
            f"episode {record.episode_id} ({record.task_id}) reports {int(reached[-1])} milestones reached "
            f"of {record.n_milestones}"
        )
    return reached / record.n_milestones


class MilestoneReward:
    """Progress gains of the spec's milestones (module docstring)."""

    name = "milestones"

    def step_scores(self, rollouts: Sequence[Rollout]) -> list[np.ndarray]:
        """Each episode's progress after every action: the potentials ``outcome+milestones:shaped`` uses."""
        return [episode_milestone_progress(r.record) for r in rollouts]

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        progress = self.step_scores(rollouts)
        gains = [np.diff(p, prepend=0.0) for p in progress]
        finals = [float(p[-1]) for p in progress if p.size]
        return RewardBatch(gains, {"mean_final_progress": float(np.mean(finals)) if finals else 0.0})

    def lineage(self) -> list[LineageInput]:
        return []  # the environment's own checks: no model to trace
