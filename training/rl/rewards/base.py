"""What every reward source shares: the episode as the learner has it, and the interface.

A reward source turns a batch of finished episodes into one reward per step (``r_t`` for the
step that took action ``a_t``). Sources are pluggable per RL run (``make_reward_source``): the
environment's outcome, an ORM's final judgement, ProgRM's progress gain, the binary PRM plus a
format reward, the GuidNav step reward, ADMIRE's milestones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from envs.protocol import EpisodeRecord
from training.base.states import TextStep, TextTrajectory, action_in_context, screen_lines, target_context
from training.policy.rollouts import Rollout
from warehouse.catalog import LineageInput


@dataclass
class RewardBatch:
    """Per-step rewards of a batch (one array per rollout) and figures to log."""

    rewards: list[np.ndarray]
    details: dict[str, float] = field(default_factory=dict)


class RewardSource(Protocol):
    """Turns finished episodes into per-step rewards."""

    name: str

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch: ...

    def lineage(self) -> list[LineageInput]:
        """What the rewards came from (a reward model's materialization), for the episodes' lineage."""
        ...


def text_trajectory(record: EpisodeRecord) -> TextTrajectory:
    """An episode as reward models read it (ProgRM Eq. 6 states): screens as lines, actions as their
    canonical text with the target's context, and the screen after the last action."""
    steps = []
    for step in record.steps:
        records = [e.to_dict() for e in step.screen.elements]
        ref = step.action.target.ref if step.action.target is not None else None
        context = target_context(records, ref)
        steps.append(TextStep(screen_lines(step.screen), action_in_context(step.action.canonical_text(), context)))
    return TextTrajectory(
        episode_id=record.episode_id,
        task_id=record.task_id,
        instruction=record.instruction,
        steps=tuple(steps),
        success=record.success,
        final_screen_lines=screen_lines(record.final_screen),
    )


def outcome(record: EpisodeRecord) -> float:
    """The environment's outcome as a number: 1 for success, 0 otherwise."""
    return 1.0 if record.success else 0.0
