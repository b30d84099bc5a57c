"""Reward models on held-out agent episodes: episode scores, AUC with bootstrap intervals, rows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest

from training.reward_models.agent_episodes import (
    ALL_FAMILIES,
    UNSEEN_CHECKPOINTS,
    WITHIN_TASK,
    AgentEpisode,
    auc_markdown,
    auc_plot,
    auc_rows,
    episode_score,
    milestone_labels,
    per_task_auc_plot,
)
from warehouse.statistics import bootstrap_auc, within_group_auc
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


def test_within_task_auc_ranks_only_episodes_of_the_same_task():
    # A reward that pays the easy task (mostly successes) more than the hard one ranks well
    # pooled, and within each task it has the order backwards.
    tasks = ["easy"] * 7 + ["hard"] * 7
    success = [True] * 6 + [False] + [True] + [False] * 6
    scores = [0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.90, 0.10, 0.20, 0.21, 0.22, 0.23, 0.24, 0.25]
    assert bootstrap_auc(scores, success)[0] == pytest.approx(36 / 49)  # pooled: looks useful
    # within: easy 0/6 pairs ordered right, hard 0/6: every same-task pair is inverted
    assert within_group_auc(scores, success, tasks) == 0.0
    # pair-weighted: a task with more pairs counts more (2x2 pairs at 1.0, 1x3 pairs at 0.0)
    weighted = within_group_auc(
        [0.9, 0.8, 0.1, 0.2, 0.05, 0.1, 0.2, 0.3],
        [True] * 2 + [False] * 2 + [True] + [False] * 3,
        ["a"] * 4 + ["b"] * 4,
    )
    assert weighted == pytest.approx(4 / 7)
    assert math.isnan(within_group_auc([0.1, 0.9], [True, False], ["a", "b"]))  # no task has both classes
    auc, low, high = bootstrap_auc(scores, success, groups=tasks)
    assert (auc, low, high) == (0.0, 0.0, 0.0)
    rng = np.random.default_rng(5)
    noisy_success = rng.random(60) < 0.5
    noisy = noisy_success * 0.3 + rng.random(60)
    noisy_tasks = [f"t{i % 3}" for i in range(60)]
    first = bootstrap_auc(noisy, noisy_success, groups=noisy_tasks)
    assert first[1] < first[0] < first[2]
    order = rng.permutation(60)
    again = bootstrap_auc(noisy[order], noisy_success[order], groups=[noisy_tasks[i] for i in order])
    assert again == first  # the order of the episodes does not move the interval
    # the report's row: every held-out agent episode, ranked against its own task only
    episodes = [
        AgentEpisode(f"eval:p:{i}", task, "fam", "p", ok)
        for i, (task, ok) in enumerate(zip(tasks, success, strict=True))
    ]
    rows = {
        r["family"]: r
        for r in auc_rows(
            "m", "orm", episodes, {e.episode_id: np.array([x]) for e, x in zip(episodes, scores, strict=True)}, None
        )
    }
    assert list(rows) == ["fam", "task:easy", "task:hard", ALL_FAMILIES, WITHIN_TASK]
    assert rows[ALL_FAMILIES]["auc"] == pytest.approx(36 / 49) and rows[WITHIN_TASK]["auc"] == 0.0
    assert rows[WITHIN_TASK]["episodes"] == 14 and rows[WITHIN_TASK]["key_step_error"] is None
    # per task: each inverted, counted on its own episodes (the figures behind the within-task row)
    assert rows["task:easy"]["auc"] == 0.0 and rows["task:easy"]["episodes"] == 7
    assert rows["task:hard"]["auc"] == 0.0 and rows["task:hard"]["successes"] == 1
    markdown = auc_markdown(list(rows.values()))
    assert "all:within_task" in markdown.splitlines()[0] and "task:" not in markdown.splitlines()[0]
    assert "| easy | 7 (6 ok) | 0.00 [0.00, 0.00] |" in markdown and "| hard | 7 (1 ok) |" in markdown
    # a task of one outcome has no row of its own
    one_outcome = [*episodes, AgentEpisode("eval:p:99", "solved", "fam", "p", True)]
    flat = {e.episode_id: np.array([0.5]) for e in one_outcome}
    families = {r["family"] for r in auc_rows("m", "orm", one_outcome, flat, None)}
    assert "task:solved" not in families and "task:easy" in families


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
    assert "| ORM | last step | 1.00 [1.00, 1.00] | 0.00 [0.00, 0.00] |" in markdown
    assert auc_plot(rows, tmp_path / "auc.png").startswith("![") and (tmp_path / "auc.png").stat().st_size > 0
    assert not any(r["family"].startswith("task:") for r in rows)  # one task: its row would be "all" again
    two_tasks = [
        AgentEpisode(e.episode_id, f"t{i % 2}", e.family, e.policy_id, e.success) for i, e in enumerate(episodes)
    ]
    per_task = [r for r in auc_rows("m1", "orm", two_tasks, scores, run_id="r") if r["family"].startswith("task:")]
    assert [r["family"] for r in per_task] == ["task:t0", "task:t1"]
    plot = per_task_auc_plot(per_task, tmp_path / "per_task.png")
    assert plot.startswith("![") and (tmp_path / "per_task.png").stat().st_size > 0
    assert "No held-out agent episodes" in auc_markdown([])
    # a second model of the kind is named as the report's metrics name it: the latest by its kind, the other with its id
    second = [r | {"model_id": "m2"} for r in rows]
    both = auc_markdown(rows + second)
    assert "| ORM | last step |" in both and "| ORM (m2) | last step |" in both and "orm@" not in both


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


def test_agent_episodes_recorded_under_another_spec_version_get_replayed_milestone_labels(home):
    """Three held-out login-user episodes that typed both fields and clicked login, each with an
    online record that knew only the username: recorded under another version of the spec, the
    labels come from the catalog's spec replayed on the stored screens (three key steps); under
    this version, or with no version stored, from the record (one)."""
    from datetime import UTC, datetime

    from envs.task_catalog import load_catalog
    from tests.annotation.progress.test_labeling import login_trajectory
    from training.reward_models.agent_episodes import read_agent_episodes
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.purposes import EpisodePurpose
    from warehouse.trajectories import trajectories_to_tables

    current = load_catalog("miniwob")["login-user"].spec.milestone_digest
    base = login_trajectory("x", "vanda", "x1")
    base = dataclasses.replace(base, instruction=base.instruction.rstrip("."), source="rollout")
    record = ((), ("username typed",), (), ())
    episodes = [
        dataclasses.replace(base, episode_id=f"eval:p:{name}", milestones_hit=record, spec_digest=digest)
        for name, digest in (("older", "0" * 16), ("current", current), ("unversioned", None))
    ]
    warehouse = Warehouse(home)
    tables = trajectories_to_tables(
        episodes, created_at=datetime.now(UTC), run_id=None, purpose=EpisodePurpose.EVALUATION
    )
    m = Materialization(asset="policy_evaluation")
    warehouse.publish(
        m, [warehouse.stage_table(n, "eval", t, m) for n, t in zip(("episodes", "steps"), tables, strict=True)]
    )
    labels = {e.episode_id: e.milestones for e in read_agent_episodes(warehouse)}
    assert labels["eval:p:older"].is_key_step == (False, True, True, True)
    assert labels["eval:p:older"].progress == pytest.approx((0.0, 1 / 3, 2 / 3, 1.0))
    assert labels["eval:p:older"].label_version == "env-replayed"
    for kept in ("eval:p:current", "eval:p:unversioned"):
        assert labels[kept].is_key_step == (False, True, False, False) and labels[kept].label_version == "env-online"
