"""No reward model wins by a task's base rate (issue 41 item 2): within-task balancing and selection.

After one flywheel round the agent's own episodes were 78% successes on one task, and the ORM
retrained on them learned that task's base rate: it judged 88% of its RL runs' failures
successful, while its *pooled* AUC on held-out agent episodes rose to 0.96. Two remedies, both
pure functions over a split's examples:

* :func:`within_task_balance_weights`: per-example loss weights under which, inside every task,
  the examples of successful and of failed episodes weigh the same (scikit-learn's "balanced"
  class weights, per task). Predicting a task's base rate then earns nothing.
* :func:`validation_within_task_auc`: the model-selection score, the AUC of an episode's score
  against its success among episodes of the same task (:func:`within_group_auc`), on validation
  episodes, so early stopping keeps the checkpoint that best tells a task's successes from its
  failures rather than the one with the lowest loss, which a base rate lowers too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from warehouse.statistics import within_group_auc

#: A task is balanced only where each outcome has at least this many episodes: weighing two failed
#: episodes 25 times each would fit those two, not failure.
MIN_CLASS_EPISODES = 5


def within_task_balance_weights(
    task_ids: Sequence[str],
    episode_ids: Sequence[str],
    episode_success: Sequence[bool | None],
    *,
    min_class_episodes: int = MIN_CLASS_EPISODES,
) -> np.ndarray:
    """Per example, a loss weight that balances successful and failed episodes within each task.

    In a task whose successes and failures each span at least ``min_class_episodes`` episodes, an
    example of outcome ``c`` weighs ``n_t / (2 n_tc)`` (``n_t`` the task's examples, ``n_tc``
    those of outcome ``c``), so both outcomes carry half the task's weight; examples of other
    tasks, and of episodes with no recorded outcome (alternatives), weigh 1. The weights are then
    scaled to a mean of 1, so the loss keeps its scale and the learning rate its meaning."""
    n = len(task_ids)
    if not (len(episode_ids) == len(episode_success) == n):
        raise ValueError("task_ids, episode_ids and episode_success must have one entry per example")
    examples: Counter[tuple[str, bool]] = Counter()
    episodes: dict[tuple[str, bool], set[str]] = {}
    for task, episode, success in zip(task_ids, episode_ids, episode_success, strict=True):
        if success is None:
            continue
        examples[(task, bool(success))] += 1
        episodes.setdefault((task, bool(success)), set()).add(episode)
    weights = np.ones(n, dtype=np.float64)
    for i, (task, success) in enumerate(zip(task_ids, episode_success, strict=True)):
        if success is None:
            continue
        if min(len(episodes.get((task, True), ())), len(episodes.get((task, False), ()))) < min_class_episodes:
            continue
        total = examples[(task, True)] + examples[(task, False)]
        weights[i] = total / (2.0 * examples[(task, bool(success))])
    return (weights / weights.mean()).astype(np.float32) if n else weights.astype(np.float32)


def episode_scores(
    scores: Sequence[float] | np.ndarray,
    episode_ids: Sequence[str],
    step_idx: Sequence[int],
    *,
    weakest_step: bool,
) -> dict[str, float]:
    """One score per episode from its examples' scores: the latest step's (outcome and progress
    models: ProgRM Eq. 1's progress where the episode ends) or the weakest step's (step judges,
    GUI-Shepherd Eq. 5 with Math-Shepherd's minimum), as :func:`agent_episodes.episode_score` does."""
    best: dict[str, tuple[int, float]] = {}
    for score, episode, step in zip(np.asarray(scores, dtype=np.float64), episode_ids, step_idx, strict=True):
        if episode not in best:
            best[episode] = (int(step), float(score))
        elif weakest_step:
            best[episode] = (int(step), min(best[episode][1], float(score)))
        elif int(step) > best[episode][0]:
            best[episode] = (int(step), float(score))
    return {episode: score for episode, (_, score) in best.items()}


def validation_within_task_auc(
    scores: Sequence[float] | np.ndarray,
    task_ids: Sequence[str],
    episode_ids: Sequence[str],
    step_idx: Sequence[int],
    episode_success: Sequence[bool | None],
    *,
    weakest_step: bool = False,
) -> float:
    """The within-task AUC of validation episodes' scores (:func:`episode_scores`) against their
    success: nan where no task has both a successful and a failed episode. Examples without an
    episode outcome (alternatives at a state) take no part."""
    kept = [i for i, s in enumerate(episode_success) if s is not None]
    per_episode = episode_scores(
        np.asarray(scores, dtype=np.float64)[kept],
        [episode_ids[i] for i in kept],
        [step_idx[i] for i in kept],
        weakest_step=weakest_step,
    )
    task_of = {episode_ids[i]: task_ids[i] for i in kept}
    success_of = {episode_ids[i]: bool(episode_success[i]) for i in kept}
    episodes = sorted(per_episode)
    return within_group_auc(
        [per_episode[e] for e in episodes], [success_of[e] for e in episodes], [task_of[e] for e in episodes]
    )


def has_within_task_contrast(task_ids: Sequence[str], episode_success: Sequence[bool | None]) -> bool:
    """Whether some task has both a successful and a failed episode (a within-task AUC exists)."""
    outcomes: dict[str, set[bool]] = {}
    for task, success in zip(task_ids, episode_success, strict=True):
        if success is not None:
            outcomes.setdefault(task, set()).add(bool(success))
    return any(len(v) == 2 for v in outcomes.values())
