"""Reward models on held-out agent episodes: episode scores, AUC with bootstrap intervals, rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from training.reward_models.agent_episodes import (
    ALL_FAMILIES,
    UNSEEN_CHECKPOINTS,
    AgentEpisode,
    auc_markdown,
    auc_plot,
    auc_rows,
    bootstrap_auc,
    episode_score,
    milestone_labels,
)
from warehouse.tables_training import RM_AGENT_AUC


def test_episode_scores_follow_the_kind():
    steps = np.array([0.9, 0.2, 0.6])
    assert episode_score("prm", steps) == pytest.approx(0.2)  # the weakest step
    assert episode_score("guidnav", steps) == pytest.approx(0.2)
    for kind in ("orm", "progrm_lcs", "progrm_env"):
        assert episode_score(kind, steps) == pytest.approx(0.6)  # where the outcome is decided
    with pytest.raises(ValueError, match="without steps"):
        episode_score("orm", [])


def test_bootstrap_auc_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(3)
    success = rng.random(80) < 0.4
    scores = success * 0.3 + rng.random(80)  # informative but noisy
    auc, low, high = bootstrap_auc(scores, success)
    assert low < auc < high and 0.5 < auc < 1.0
    assert bootstrap_auc(scores, success) == (auc, low, high)  # same input, same interval
    order = np.random.default_rng(7).permutation(len(scores))
    shuffled = bootstrap_auc(np.asarray(scores)[order], np.asarray(success)[order])
    assert shuffled == (auc, low, high)  # the same episodes in another order (a query without ORDER BY)
    assert bootstrap_auc(scores, success, seed=1) != (auc, low, high)
    assert bootstrap_auc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == (1.0, 1.0, 1.0)
    assert bootstrap_auc([0.9, 0.8, 0.2, 0.1], [False, False, True, True])[0] == 0.0
    one_class = bootstrap_auc([0.1, 0.2], [True, True])
    assert all(math.isnan(x) for x in one_class)


def test_rows_per_family_and_overall(tmp_path):
    episodes = [
        AgentEpisode(f"eval:p:{i}", "t", "fam-a" if i < 6 else "fam-b", f"p{i % 2}", i % 3 == 0) for i in range(12)
    ]
    # fam-a perfectly ranked by the last step, fam-b inverted
    scores = {
        e.episode_id: np.array(
            [0.5, (0.9 if e.success else 0.1) if e.family == "fam-a" else (0.1 if e.success else 0.9)]
        )
        for e in episodes
    }
    scores.pop("eval:p:11")  # an episode the model did not score is left out, not counted
    rows = auc_rows("m1", "orm", episodes, scores, run_id="r")
    by_family = {r["family"]: r for r in rows}
    assert list(by_family) == ["fam-a", "fam-b", ALL_FAMILIES]
    assert by_family["fam-a"]["auc"] == 1.0 and by_family["fam-b"]["auc"] == 0.0
    assert by_family[ALL_FAMILIES]["episodes"] == 11 and by_family[ALL_FAMILIES]["policies"] == 2
    assert by_family[ALL_FAMILIES]["successes"] == sum(e.success for e in episodes[:11])
    table = pa.Table.from_pylist(rows, schema=RM_AGENT_AUC)  # the rows fit the table
    assert table.num_rows == 3
    markdown = auc_markdown(rows)
    assert "| orm | last step | 1.00 [1.00, 1.00] | 0.00 [0.00, 0.00] |" in markdown
    assert auc_plot(rows, tmp_path / "auc.png").startswith("![") and (tmp_path / "auc.png").stat().st_size > 0
    assert "No held-out agent episodes" in auc_markdown([])


def test_unseen_checkpoints_get_their_own_row():
    episodes = [AgentEpisode(f"eval:p:{i}", "t", "fam", f"eval:p{i % 2}", i % 2 == 0, i % 2 == 1) for i in range(8)]
    scores = {e.episode_id: np.array([0.9 if e.success else 0.1]) for e in episodes}
    rows = {r["family"]: r for r in auc_rows("m", "orm", episodes, scores, run_id=None)}
    assert list(rows) == ["fam", ALL_FAMILIES, UNSEEN_CHECKPOINTS]
    assert rows[UNSEEN_CHECKPOINTS]["episodes"] == 4 and rows[UNSEEN_CHECKPOINTS]["policies"] == 1
    assert math.isnan(rows[UNSEEN_CHECKPOINTS]["auc"])  # only p0's episodes, all successes: one class
    assert "n/a (one class)" in auc_markdown(list(rows.values()))
    no_collection = [AgentEpisode(e.episode_id, "t", "fam", e.policy_id, e.success) for e in episodes]
    assert UNSEEN_CHECKPOINTS not in {r["family"] for r in auc_rows("m", "orm", no_collection, scores, run_id=None)}


def test_key_step_error_on_agent_episodes_from_online_milestones():
    hits = [["username typed"], [], ["password typed"], ["login clicked"]]
    labels = milestone_labels("login-user", hits)
    assert labels is not None
    assert labels.progress == pytest.approx((1 / 3, 1 / 3, 2 / 3, 1.0))
    assert labels.is_key_step == (True, False, True, True)
    assert milestone_labels("login-user", [[], None]) is None  # reached nothing: no key step to score
    assert milestone_labels("not-a-catalog-task", hits) is None
    episode = AgentEpisode("eval:p:1", "login-user", "miniwob-forms", "eval:p", True, milestones=labels)
    scores = {"eval:p:1": np.array([0.5, 0.5, 0.5, 0.9])}
    rows = {
        r["kind"]: r
        for r in auc_rows("m", "progrm_env", [episode], scores, None) + auc_rows("o", "orm", [episode], scores, None)
    }
    # |0.5 - 1/3|, |0.5 - 2/3|, |0.9 - 1| over the three key steps
    assert rows["progrm_env"]["key_step_error"] == pytest.approx((1 / 6 + 1 / 6 + 0.1) / 3)
    assert rows["progrm_env"]["key_steps"] == 3
    assert rows["orm"]["key_step_error"] is None  # not a progress model
