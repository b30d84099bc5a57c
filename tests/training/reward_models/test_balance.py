"""Within-task balancing and the within-task AUC of validation episodes (issue 41 item 2), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from training.reward_models.balance import (
    episode_scores,
    has_within_task_contrast,
    validation_within_task_auc,
    within_task_balance_weights,
)
from training.reward_models.models import reward_loss
from training.reward_models.train_data import SplitEpisodes, resolve_selection, selection_episodes
from warehouse.statistics import roc_auc


def _examples(spec: dict[str, tuple[int, int]], steps: int = 2):
    """``steps`` examples per episode; per task (successful episodes, failed episodes)."""
    tasks, episodes, success = [], [], []
    for task, (wins, losses) in spec.items():
        for k in range(wins + losses):
            for _ in range(steps):
                tasks.append(task)
                episodes.append(f"{task}:{k}")
                success.append(k < wins)
    return tasks, episodes, success


def test_successes_and_failures_weigh_the_same_within_each_balanced_task():
    tasks, episodes, success = _examples({"easy": (18, 6), "hard": (5, 15), "solved": (10, 0)})
    weights = within_task_balance_weights(tasks, episodes, success)
    assert weights.mean() == pytest.approx(1.0)
    for task in ("easy", "hard"):
        mine = np.array(tasks) == task
        won = mine & np.array(success)
        assert weights[won].sum() == pytest.approx(weights[mine & ~won].sum())
    # a task with one outcome has nothing to balance: its examples keep the common weight
    solved = weights[np.array(tasks) == "solved"]
    assert np.all(solved == solved[0])
    # an easy task's rare failures weigh more than its successes, a hard task's the other way
    assert weights[tasks.index("easy") + 2 * 18] > weights[tasks.index("easy")]


def test_a_task_with_too_few_episodes_of_an_outcome_is_left_as_it_is():
    tasks, episodes, success = _examples({"rare": (20, 4), "enough": (20, 5)})
    weights = within_task_balance_weights(tasks, episodes, success, min_class_episodes=5)
    rare = weights[np.array(tasks) == "rare"]
    assert np.all(rare == rare[0])
    enough = np.array(tasks) == "enough"
    assert len(set(weights[enough].tolist())) == 2
    # unknown outcomes (alternatives at a state) keep the common weight
    with_unknown = within_task_balance_weights(
        ["enough"] * 2 + tasks, ["alt", "alt"] + episodes, [None, None] + success
    )
    assert with_unknown[0] == with_unknown[1] == with_unknown[2 + tasks.index("rare")]
    with pytest.raises(ValueError, match="one entry per example"):
        within_task_balance_weights(["a"], ["e1", "e2"], [True])


def test_a_base_rate_model_ranks_well_pooled_and_at_chance_within_tasks():
    """The flywheel's failure mode, by hand: a model that scores each episode with its task's
    success rate (90% on the easy task, 10% on the hard one) has a high pooled AUC and a
    within-task AUC of 0.5; a model that tells successes from failures inside each task has 1."""
    tasks, episodes, success = _examples({"easy": (9, 1), "hard": (1, 9)}, steps=1)
    base_rate = [0.9 if t == "easy" else 0.1 for t in tasks]
    steps = [0] * len(tasks)
    assert roc_auc(base_rate, success) > 0.8
    assert validation_within_task_auc(base_rate, tasks, episodes, steps, success) == pytest.approx(0.5)
    telling = [0.6 if s else 0.4 for s in success]
    assert validation_within_task_auc(telling, tasks, episodes, steps, success) == pytest.approx(1.0)
    # no task with both outcomes: no AUC
    assert np.isnan(validation_within_task_auc([0.5, 0.5], ["a", "b"], ["a:0", "b:0"], [0, 0], [True, False]))


def test_an_episode_is_scored_at_its_latest_step_or_its_weakest():
    scores, episodes, steps = [0.2, 0.9, 0.5, 0.7], ["e", "e", "e", "f"], [3, 1, 5, 0]
    assert episode_scores(scores, episodes, steps, weakest_step=False) == {"e": 0.5, "f": 0.7}
    assert episode_scores(scores, episodes, steps, weakest_step=True) == {"e": 0.2, "f": 0.7}


def test_selection_is_by_within_task_auc_only_where_validation_has_a_contrast():
    contrast = SplitEpisodes(["a", "a"], ["a:0", "a:1"], [0, 0], [True, False])
    none = SplitEpisodes(["a", "b"], ["a:0", "b:0"], [0, 0], [True, False])
    assert has_within_task_contrast(contrast.task_ids, contrast.success)
    assert not has_within_task_contrast(none.task_ids, none.success)
    assert resolve_selection("auto", contrast) == "within_task_auc"
    assert resolve_selection("auto", none) == "loss"
    assert resolve_selection("loss", contrast) == "loss"
    with pytest.raises(ValueError, match="no validation task has both"):
        resolve_selection("within_task_auc", none)


def test_weighted_loss_is_the_mean_of_the_weighted_example_losses():
    import torch

    logits, labels = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 0.0, 0.0])
    plain = reward_loss(logits, labels, "bce")
    assert float(reward_loss(logits, labels, "bce", torch.ones(3))) == pytest.approx(float(plain))
    each = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    weights = torch.tensor([2.0, 0.5, 0.5])
    assert float(reward_loss(logits, labels, "bce", weights)) == pytest.approx(float((each * weights).mean()))


def test_checkpoint_selection_ranks_the_agents_own_validation_episodes_where_it_can():
    """Issue 41 item 2: the within-task AUC that selects checkpoints is taken on the agent's own
    validation episodes when some task has both outcomes among them; else on every episode."""
    tasks = ["t"] * 6
    episodes = [f"e{i}" for i in range(6)]
    success: list[bool | None] = [True, False, True, False, True, None]
    agent = [True, True, False, False, False, True]  # the agent's own: one success, one failure of t
    mixed = SplitEpisodes(tasks, episodes, [0] * 6, success, agent)
    ranked, which = selection_episodes(mixed)
    assert which == "agent"
    assert ranked.success == [True, False, None, None, None, None]  # demonstrations keep their place, unranked
    assert ranked.task_ids == tasks and ranked.agent == agent
    # the AUC then reads the agent's episodes only: a model that inverts the demonstrations is not rewarded
    scores = [0.9, 0.1, 0.0, 1.0, 0.0, 0.5]
    assert validation_within_task_auc(scores, tasks, episodes, [0] * 6, ranked.success) == 1.0
    assert validation_within_task_auc(scores, tasks, episodes, [0] * 6, success) < 0.5
    one_sided = SplitEpisodes(tasks, episodes, [0] * 6, success, [True, False, True, False, False, False])
    assert selection_episodes(one_sided) == (one_sided, "all")  # agent successes only: no contrast
    assert selection_episodes(SplitEpisodes(tasks, episodes, [0] * 6, success)) == (
        SplitEpisodes(tasks, episodes, [0] * 6, success),
        "all",
    )
