"""Labelling task batch by task batch gives the all-at-once rows; new episodes are labelled
against the stored recipe library; a family's labels are brought up to date incrementally."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from annotation.progress.label_increments import _ledger_spec_digests, family_paths, run_family_labels
from annotation.progress.label_partitions import merge_summaries, unlabelled_episodes
from annotation.progress.label_runs import run_labeling
from annotation.progress.label_state import LibraryState, label_against_library, library_states, needs_rebuild
from annotation.progress.label_stream import stream_labels
from annotation.progress.labeling import LCS_METHODS, env_labels, lcs_labels, prepare_lcs
from annotation.progress.labels import check_progress_labels, default_specs_dir
from annotation.progress.text_similarity import HashingTextEmbedder
from envs.tasks import load_task_specs
from tests.annotation.helpers import publish_tiny_episodes
from tests.annotation.progress.test_labeling import LOGIN_SPEC, login_trajectory
from warehouse.catalog import Warehouse
from warehouse.checks import check_unique_key
from warehouse.trajectories import load_trajectories, task_batches


def _corpus():
    """Three tasks (copies of the login task), with detours, failures and an empty trajectory."""
    out = []
    names = ["vanda", "rex", "lyda", "annis", "moe", "kit", "ulla", "bo"]
    for t, task in enumerate(["login-user", "login-user-2", "login-user-3"]):
        for k, name in enumerate(names[: 5 + t]):
            trajectory = login_trajectory(
                f"{task}-{k}", name, f"pw{k}", detour=k % 3 == 1, success=k % 4 != 3, finish=k % 4 != 3
            )
            out.append(replace(trajectory, task_id=task))
    out.append(replace(login_trajectory("empty", "x", "y"), actions=(), screens=()))
    return out


def _sorted_rows(rows):
    return sorted(rows, key=lambda r: (r["source"], r["method"] or "", r["episode_id"], r["step_idx"]))


@pytest.mark.parametrize("scope", ["corpus", "batch"])
def test_streamed_batches_give_the_all_at_once_rows(scope):
    trajectories = _corpus()
    specs = {task: replace(LOGIN_SPEC, task_id=task) for task in {t.task_id for t in trajectories}}
    expected = {method: lcs_labels(trajectories, HashingTextEmbedder(), method) for method in LCS_METHODS}
    expected_env = env_labels(trajectories, specs)
    results = list(
        stream_labels(task_batches(trajectories, max_episodes=4), HashingTextEmbedder(), specs, embed_scope=scope)
    )
    assert len({r.index for r in results}) == 3  # one batch per task
    for method in LCS_METHODS:
        runs = [r.lcs[method] for r in results if method in r.lcs]
        assert _sorted_rows([row for run in runs for row in run.label_rows]) == _sorted_rows(
            expected[method].label_rows
        )
        assert sorted(row["recipe_id"] for run in runs for row in run.recipe_rows) == sorted(
            row["recipe_id"] for row in expected[method].recipe_rows
        )
        assert {k: v for run in runs for k, v in run.unlabelled.items()} == expected[method].unlabelled
        assert {k: v for run in runs for k, v in run.step_notes.items()} == expected[method].step_notes
    env_rows = [row for r in results if r.env is not None for row in r.env.label_rows]
    assert _sorted_rows(env_rows) == _sorted_rows(expected_env.label_rows)


@pytest.mark.parametrize("method", LCS_METHODS)
def test_labels_against_the_stored_library_equal_the_full_runs(method):
    trajectories = [t for t in _corpus() if t.task_id == "login-user"]
    embed = HashingTextEmbedder()
    full = lcs_labels(trajectories, embed, method)
    assert full.recipe_rows
    prepared = prepare_lcs(trajectories, method)
    states = {s.task_id: s for s in library_states(full, prepared)}
    stored = {task: LibraryState.from_row(state.row()) for task, state in states.items()}  # through its row
    again = label_against_library(trajectories, stored, embed, method)
    assert _sorted_rows(again.label_rows) == _sorted_rows(full.label_rows)
    assert again.unlabelled == full.unlabelled


def test_rebuild_rule():
    state = LibraryState("t", "improved", 1, n_successes=40, n_episodes=80, recipe_ids=["r"], recipes=[()])
    assert needs_rebuild(None, 0)
    assert not needs_rebuild(state, 3) and needs_rebuild(state, 4)
    lonely = replace(state, n_successes=1, recipes=[])
    assert not needs_rebuild(lonely, 0) and needs_rebuild(lonely, 1)


def _labels(warehouse: Warehouse) -> list[dict]:
    return _sorted_rows(
        warehouse.query(
            "SELECT episode_id, step_idx, source, method, progress, is_key_step, recipe_id, completion_ratio "
            "FROM progress_labels"
        ).to_pylist()
    )


def test_full_run_then_incremental_runs_of_one_family(tmp_path):
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    quiet = lambda _message: None  # noqa: E731

    # A full run writes one dataset per label family, with the rows of the all-at-once path.
    run_labeling(warehouse, embedder="hashing", log=quiet, batch_episodes=5)
    trajectories = list(load_trajectories(warehouse))
    expected = [
        row for method in LCS_METHODS for row in lcs_labels(trajectories, HashingTextEmbedder(), method).label_rows
    ]
    expected += env_labels(trajectories, load_task_specs(default_specs_dir())).label_rows
    columns = ["episode_id", "step_idx", "source", "method", "progress", "is_key_step", "recipe_id", "completion_ratio"]
    assert _labels(warehouse) == _sorted_rows([{c: r[c] for c in columns} for r in expected])
    datasets = {d for d, _, _ in warehouse.current_versions("progress_labels")}
    assert {"labels/miniwob-forms", "labels/other"} <= datasets
    before = {(r["episode_id"], r["step_idx"], r["source"], r["method"]): r for r in _labels(warehouse)}

    # New episodes, too few to rebuild anything: labelled against the stored libraries, in a delta.
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)
    summary = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=quiet, rebuild_at_least=100)
    assert summary.incremental["labelled_against_library"] == 4 and not summary.incremental["rebuilt_tasks"]
    assert "labels/miniwob-forms/+0" in {d for d, _, _ in warehouse.current_versions("progress_labels")}
    after = _labels(warehouse)
    old = [r for r in after if not r["episode_id"].startswith("new-")]
    assert {(r["episode_id"], r["step_idx"], r["source"], r["method"]): r for r in old} == before
    new_lcs = {(r["episode_id"], r["method"]) for r in after if r["episode_id"].startswith("new-ep0")}
    notes = warehouse.query("SELECT key, method FROM label_notes WHERE starts_with(key, 'new-')").to_pylist()
    forms_new = [f"new-ep{k:03d}" for k in range(4)]  # the login episodes come first
    for episode in forms_new:
        for method in LCS_METHODS:
            assert (episode, method) in new_lcs or {"key": episode, "method": method} in notes
    assert all(outcome.passed for outcome in check_progress_labels(warehouse).values())

    # Enough new successes: the task's library is rebuilt (version 2), the family compacted.
    publish_tiny_episodes(home, "third", "newer-", seed=9, n_login=8, n_button=2)
    summary = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=quiet)
    assert summary.incremental["rebuilt_tasks"] == {"login-user": 2} and summary.incremental["compacted"]
    lcs = warehouse.query(
        "SELECT DISTINCT recipe_id FROM progress_labels l JOIN episodes e USING (episode_id) "
        "WHERE l.source = 'lcs' AND e.task_id = 'login-user' AND recipe_id IS NOT NULL"
    ).column("recipe_id")
    assert lcs.to_pylist() and all(r.endswith("@v2") for r in lcs.to_pylist())
    assert unlabelled_episodes(warehouse, "miniwob-forms") == 0
    for table in ("progress_labels", "recipes", "label_notes"):
        assert check_unique_key(warehouse, table).passed, table
    assert all(outcome.passed for outcome in check_progress_labels(warehouse).values())


def test_the_labelled_check_counts_the_families_a_run_labelled(tmp_path):
    """A loop that labels one family per run (the flywheel round) sees no failure for the families
    still to come; the episodes of the family it labelled are all labelled or explained."""
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    run_labeling(warehouse, embedder="hashing", log=lambda _m: None, families=["other"])
    labelled = "every_episode_labelled_or_explained"
    assert check_progress_labels(warehouse, ["other"])[labelled].passed
    assert check_progress_labels(warehouse, ["other"])[labelled].metadata == {"unexplained": 0, "families": ["other"]}
    # the login episodes (miniwob-forms) are not labelled yet: a check over them, or over all, fails
    forms = check_progress_labels(warehouse, ["miniwob-forms"])[labelled]
    assert not forms.passed and forms.metadata["unexplained"] == 12
    assert not check_progress_labels(warehouse)[labelled].passed
    run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=lambda _m: None)
    assert check_progress_labels(warehouse, ["miniwob-forms"])[labelled].passed
    assert check_progress_labels(warehouse)[labelled].passed


def test_replay_milestones_reaches_every_path_that_labels(tmp_path, monkeypatch):
    """``replay_milestones`` reaches the milestone labels of a full run, of new episodes labelled
    against stored libraries and of a rebuilt task's episodes: an incremental run without it would
    label them from the recorded milestones again."""
    import annotation.progress.label_increments as label_increments
    import annotation.progress.label_stream as label_stream

    seen: list[bool] = []

    def spy(trajectories, specs, *, replay_milestones=False):
        seen.append(replay_milestones)
        return env_labels(trajectories, specs, replay_milestones=replay_milestones)

    monkeypatch.setattr(label_increments, "env_labels", spy)
    monkeypatch.setattr(label_stream, "env_labels", spy)
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    quiet = lambda _message: None  # noqa: E731
    full = run_labeling(warehouse, embedder="hashing", log=quiet, replay_milestones=True)
    assert seen and all(seen)
    # every episode the env labels cover is counted once, by where its milestones came from
    env_episodes = (
        warehouse.query("SELECT count(DISTINCT episode_id) FROM progress_labels WHERE source = 'env'")
        .column(0)[0]
        .as_py()
    )
    assert set(full.milestone_origins) == {"replayed"} and full.milestone_origins["replayed"] == env_episodes > 0
    twice = merge_summaries([full, full])
    assert twice.milestone_origins == {"replayed": 2 * env_episodes}
    seen.clear()
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)  # against the libraries
    run_family_labels(
        warehouse, "miniwob-forms", embedder="hashing", log=quiet, rebuild_at_least=100, replay_milestones=True
    )
    publish_tiny_episodes(home, "third", "newer-", seed=9, n_login=8, n_button=2)  # a rebuilt task
    summary = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=quiet, replay_milestones=True)
    assert summary.incremental["rebuilt_tasks"] and len(seen) >= 2 and all(seen)
    params = warehouse.query(
        "SELECT parameters->>'milestones' AS m FROM lineage_materializations WHERE asset LIKE '%progress_labels%'"
    ).column("m")
    assert set(params.to_pylist()) == {"replayed from the specs"}


def test_an_incremental_run_relabels_a_task_whose_spec_changed_and_only_that_task(tmp_path):
    """Every episode's milestone labels come from its task's spec, recorded or not: after the spec
    changes, an incremental run with no new episode rebuilds that task (and no other), and the
    next run, with the ledger up to date, has nothing to do."""
    specs_dir = tmp_path / "specs"
    shutil.copytree(default_specs_dir(), specs_dir)
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    quiet = lambda _message: None  # noqa: E731
    run_labeling(warehouse, embedder="hashing", log=quiet, specs_dir=specs_dir)
    unchanged = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=quiet, specs_dir=specs_dir)
    assert not unchanged.incremental["rebuilt_tasks"] and unchanged.incremental["spec_changed_tasks"] == []

    login = specs_dir / "miniwob" / "login-user.yaml"
    mapping = yaml.safe_load(login.read_text())
    mapping["milestones"] = mapping["milestones"][:2]  # "login clicked" is no milestone any more
    login.write_text(yaml.safe_dump(mapping))
    messages: list[str] = []
    summary = run_family_labels(
        warehouse, "miniwob-forms", embedder="hashing", log=messages.append, specs_dir=specs_dir
    )
    assert summary.incremental["spec_changed_tasks"] == ["login-user"]
    assert summary.incremental["rebuilt_tasks"] == {"login-user": 2} and summary.incremental["new_episodes"] == 0
    assert any("1 for a changed spec" in m for m in messages)
    trajectories = list(load_trajectories(warehouse, "e.task_id = 'login-user'"))
    expected = env_labels(trajectories, load_task_specs(specs_dir)).label_rows
    stored = warehouse.query(
        "SELECT l.episode_id, step_idx, progress FROM progress_labels l JOIN episodes e USING (episode_id) "
        "WHERE l.source = 'env' AND e.task_id = 'login-user' ORDER BY l.episode_id, step_idx"
    ).to_pylist()
    assert stored == sorted(
        ({k: r[k] for k in ("episode_id", "step_idx", "progress")} for r in expected),
        key=lambda r: (r["episode_id"], r["step_idx"]),
    )
    assert any(r["progress"] == 0.5 for r in stored)  # two milestones now: halves, where there were thirds
    for table in ("progress_labels", "recipes", "label_notes", "label_ledger"):
        assert check_unique_key(warehouse, table).passed, table
    again = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=quiet, specs_dir=specs_dir)
    assert not again.incremental["rebuilt_tasks"]


def test_ledgers_written_before_spec_versions_read_as_unknown(tmp_path):
    """A ledger file without the column, beside one with it: its episodes' versions are unknown
    (None), not a change."""
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    pq.write_table(pa.table({"episode_id": ["a"], "task_id": ["t"]}), old)
    pq.write_table(pa.table({"episode_id": ["b", "c"], "task_id": ["t", "t"], "spec_digest": ["d1", ""]}), new)
    assert _ledger_spec_digests([old]) == {"a": None}
    assert _ledger_spec_digests([old, new]) == {"a": None, "b": "d1", "c": ""}
    assert _ledger_spec_digests([]) == {}


def test_a_home_whose_ledger_predates_spec_versions_labels_incrementally_and_says_what_it_cannot_check(tmp_path):
    """Ledger files written before the column existed: an incremental run reads their versions as
    unknown (no rebuild for them; the run counts them and names the full run that settles them),
    and a run that compacts the family over those files works (the column reads as null)."""
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    run_labeling(warehouse, embedder="hashing", log=lambda _m: None)
    for path in family_paths(warehouse, "label_ledger", "miniwob-forms").values():
        pq.write_table(pq.read_table(path).drop(["spec_digest"]), path)  # as an older home wrote it
    forms = warehouse.query("SELECT count(*) FROM label_ledger WHERE label_family = 'miniwob-forms'").column(0)[0]
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)
    messages: list[str] = []
    summary = run_family_labels(
        warehouse, "miniwob-forms", embedder="hashing", log=messages.append, rebuild_at_least=100
    )
    assert not summary.incremental["rebuilt_tasks"] and not summary.incremental["compacted"]
    assert any(f"{forms.as_py()} episodes were labelled before" in m and "full run" in m for m in messages)
    # enough new successes to rebuild login-user: the family is compacted over the old files
    publish_tiny_episodes(home, "third", "newer-", seed=9, n_login=8, n_button=2)
    messages.clear()
    summary = run_family_labels(warehouse, "miniwob-forms", embedder="hashing", log=messages.append)
    assert summary.incremental["rebuilt_tasks"] == {"login-user": 2} and summary.incremental["compacted"]
    assert not any("labelled before" in m for m in messages)  # the rebuilt task's episodes are versioned now
    ledger = warehouse.query("SELECT spec_digest FROM label_ledger WHERE label_family = 'miniwob-forms'")
    assert None not in ledger.column("spec_digest").to_pylist()
    for table in ("progress_labels", "label_ledger"):
        assert check_unique_key(warehouse, table).passed, table
