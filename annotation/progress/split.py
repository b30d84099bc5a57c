"""The reward-model training split (ProgRM App. C): by task goal (or by task, for held-out tasks),
with the steps of failed trajectories sampled so that success and failure steps are near 1:1.
Pure and deterministic: a goal's split is a hash of its key, the sampling a seeded ``random.Random``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from warehouse.trajectories import Trajectory

SPLIT_FRACTIONS = (0.7, 0.15, 0.15)  # train / validation / test


def goal_key(trajectory: Trajectory) -> str:
    """What makes two trajectories share a goal: the task and its normalised instruction."""
    return f"{trajectory.task_id}|{' '.join(trajectory.instruction.split()).casefold()}"


def split_of(key: str, fractions: tuple[float, float, float] = SPLIT_FRACTIONS) -> str:
    """Deterministic split of a goal (or task) by hashing: train / validation / test."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    if bucket < fractions[0]:
        return "train"
    return "validation" if bucket < fractions[0] + fractions[1] else "test"


@dataclass(frozen=True)
class SplitRow:
    episode_id: str
    task_id: str
    goal_key: str
    split: str
    success: bool
    n_steps: int
    sampled_steps: tuple[int, ...]


def training_split(
    trajectories: Sequence[Trajectory],
    *,
    by: str = "goal",
    seed: int = 0,
    fractions: tuple[float, float, float] = SPLIT_FRACTIONS,
) -> list[SplitRow]:
    """App. C: trajectories split by task goal (or by task, ``by="task"``, for held-out tasks);
    all steps of successful trajectories kept, steps of failed ones sampled so that success and
    failure steps are near 1:1 within each split."""
    rows = []
    for t in trajectories:
        key = goal_key(t) if by == "goal" else t.task_id
        rows.append((t, key, split_of(key, fractions)))
    rate: dict[str, float] = {}
    for split in ("train", "validation", "test"):
        ok = sum(t.n_steps for t, _, s in rows if s == split and t.success)
        failed = sum(t.n_steps for t, _, s in rows if s == split and not t.success)
        rate[split] = min(1.0, ok / failed) if failed else 1.0
    rng = random.Random(seed)
    out = []
    for t, key, split in rows:
        if t.success:
            sampled = tuple(range(t.n_steps))
        else:
            sampled = tuple(i for i in range(t.n_steps) if rng.random() < rate[split])
        out.append(SplitRow(t.episode_id, t.task_id, key, split, t.success, t.n_steps, sampled))
    return out
