"""Synthetic trajectories for reward-model training (ProgRM App. B); the split is :mod:`annotation.progress.split`.

Failed trajectories: (1) an instruction of task a with the execution of task b (mismatched
instruction), (2) a random walk. Successful trajectories: a successful "prototype" with empty or
effectless action tuples added (NOTHING; scroll down then up) or removed (the garbage steps of
:func:`annotation.progress.instruction_relative.garbage_mask`). Every synthetic trajectory records its generator
and its parent. All functions are pure and deterministic given the ``random.Random``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from annotation.progress.instruction_relative import garbage_mask
from warehouse.model import Action, ActionType, Screen
from warehouse.trajectories import Trajectory

SYNTHETIC_KINDS = ("mismatched_instruction", "random_walk", "noop_inserted", "noop_removed")


def _synthetic(parent: Trajectory, generator: str, index: int, **changes) -> Trajectory:
    return replace(
        parent,
        episode_id=f"syn:{generator}:{parent.episode_id}:{index}",
        source=f"synthetic:{generator}",
        parent_episode_id=parent.episode_id,
        milestones_hit=None,
        final_screen=None,  # the parent's last screen is not where these steps end
        spec_digest=None,
        failed_steps=frozenset(),  # the steps moved
        **changes,
    )


def mismatched_instruction(execution: Trajectory, instructed: Trajectory, index: int = 0) -> Trajectory:
    """Task ``instructed``'s instruction over ``execution``'s steps: a failure (App. B, way 1)."""
    return _synthetic(
        execution,
        "mismatched_instruction",
        index,
        task_id=instructed.task_id,
        instruction=instructed.instruction,
        fields=dict(instructed.fields),
        success=False,
    )


def random_walk(parent: Trajectory, rng: random.Random, index: int = 0, max_length: int = 8) -> Trajectory:
    """Random clicks and scrolls over the parent's recorded screens: a failure (App. B, way 2).

    Offline there is no environment to advance, so the walk wanders over the screens the parent saw
    (the screen before step t of the walk is the parent's screen before step min(t, n - 1)); live
    random walks come from the rollout policies."""
    n = rng.randint(1, max(1, min(max_length, 2 * parent.n_steps)))
    screens: list[Screen] = []
    actions: list[Action] = []
    for t in range(n):
        screen = parent.screens[min(t, parent.n_steps - 1)]
        clickable = [e for e in screen.elements if e.clickable] or list(screen.elements)
        if rng.random() < 0.15 or not clickable:
            actions.append(Action(ActionType.SCROLL, direction=rng.choice(("UP", "DOWN"))))
        else:
            actions.append(Action(ActionType.CLICK, target=rng.choice(clickable)))
        screens.append(screen)
    return _synthetic(parent, "random_walk", index, actions=tuple(actions), screens=tuple(screens), success=False)


def insert_noop(parent: Trajectory, rng: random.Random, index: int = 0) -> Trajectory:
    """A successful prototype with an empty action (NOTHING) or an effectless pair (scroll down,
    scroll up) inserted at a random position before its last step (App. B, successful synthesis)."""
    position = rng.randint(0, parent.n_steps - 1)
    screen = parent.screens[position]
    if rng.random() < 0.5:
        inserted = [Action(ActionType.NOTHING)]
    else:
        inserted = [Action(ActionType.SCROLL, direction="DOWN"), Action(ActionType.SCROLL, direction="UP")]
    actions = (*parent.actions[:position], *inserted, *parent.actions[position:])
    screens = (*parent.screens[:position], *([screen] * len(inserted)), *parent.screens[position:])
    return _synthetic(parent, "noop_inserted", index, actions=actions, screens=screens)


def remove_noops(parent: Trajectory, index: int = 0) -> Trajectory | None:
    """A successful prototype without its empty and effectless steps; None if it has none."""
    garbage = garbage_mask(parent.screens, parent.n_steps)
    garbage = [g or a.type is ActionType.NOTHING for g, a in zip(garbage, parent.actions, strict=True)]
    if not any(garbage) or all(garbage):
        return None
    keep = [i for i, g in enumerate(garbage) if not g]
    return _synthetic(
        parent,
        "noop_removed",
        index,
        actions=tuple(parent.actions[i] for i in keep),
        screens=tuple(parent.screens[i] for i in keep),
    )


def synthesize(
    trajectories: Sequence[Trajectory],
    seed: int = 0,
    *,
    failures_per_success: float = 0.5,
    successes_per_success: float = 0.5,
) -> list[Trajectory]:
    """Synthetic trajectories for a corpus: per successful real trajectory, on average
    ``failures_per_success`` failures (mismatched instructions from other tasks and random walks,
    half each) and ``successes_per_success`` successes (noop inserted or removed)."""
    rng = random.Random(seed)
    real = [t for t in trajectories if not t.source.startswith("synthetic") and t.n_steps > 0]
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in real:
        by_task[t.task_id].append(t)
    tasks = sorted(by_task)
    out: list[Trajectory] = []
    for i, parent in enumerate(t for t in real if t.success):
        if rng.random() < failures_per_success:
            if rng.random() < 0.5 and len(tasks) > 1:
                other_task = rng.choice([t for t in tasks if t != parent.task_id])
                out.append(mismatched_instruction(parent, rng.choice(by_task[other_task]), i))
            else:
                out.append(random_walk(parent, rng, i))
        if rng.random() < successes_per_success:
            removed = remove_noops(parent, i) if rng.random() < 0.5 else None
            out.append(removed or insert_noop(parent, rng, i))
    return out
