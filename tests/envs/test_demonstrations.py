"""Importing folders of demonstrations into the warehouse: accounting, idempotence, lineage, bad input."""

import gzip
import json
import shutil

import pytest

from envs.miniwob.demo_files import sample_per_task
from envs.miniwob.demonstrations import import_demonstrations
from tests.conftest import write_recording
from warehouse.catalog import Warehouse


def test_import_small_folder(small_demos, home):
    warehouse = Warehouse(home)
    report = import_demonstrations(small_demos, warehouse, workers=2)
    files = warehouse.query("SELECT status, count(*) n FROM source_files GROUP BY 1").to_pylist()
    counts = {r["status"]: r["n"] for r in files}
    assert sum(counts.values()) == report.files == 23
    assert counts["duplicate"] >= 1  # the link file
    episodes = warehouse.query("SELECT * FROM episodes").to_pylist()
    assert len(episodes) == report.episodes == counts["imported"]
    assert {e["task_id"] for e in episodes} == {"login-user", "search-engine", "click-checkboxes-soft", "social-media"}
    assert all(e["source"] == "human_demo" and e["n_steps"] > 0 for e in episodes)
    steps = warehouse.query(
        "SELECT episode_id, count(*) n, min(step_idx) lo, max(step_idx) hi FROM steps GROUP BY 1"
    ).to_pylist()
    by_episode = {e["episode_id"]: e["n_steps"] for e in episodes}
    assert {s["episode_id"]: s["n"] for s in steps} == by_episode
    assert all(s["lo"] == 0 and s["hi"] == s["n"] - 1 for s in steps)
    types = {r["action_type"] for r in warehouse.query("SELECT DISTINCT action_type FROM steps").to_pylist()}
    assert types <= {"CLICK", "INPUT", "SCROLL", "PRESS_KEY"} and "CLICK" in types and "INPUT" in types
    # The link file resolves to the episode of the file it points to.
    link = warehouse.query("SELECT * FROM source_files WHERE source_file LIKE '2017-11-05%'").to_pylist()[0]
    target = warehouse.query(
        "SELECT episode_id FROM source_files WHERE source_file = ?", [link["link_target"]]
    ).to_pylist()[0]
    assert link["status"] == "duplicate" and link["episode_id"] == target["episode_id"]


def test_reimport_is_idempotent_and_replaces_the_previous_version(small_demos, home):
    warehouse = Warehouse(home)
    first = import_demonstrations(small_demos, warehouse, workers=1)
    second = import_demonstrations(small_demos, warehouse, workers=2)
    n = warehouse.query("SELECT count(*) n, count(DISTINCT episode_id) d FROM episodes").to_pylist()[0]
    assert n["n"] == n["d"] == first.episodes == second.episodes
    assert warehouse.query("SELECT count(*) n FROM steps").to_pylist()[0]["n"] == second.steps
    versions = warehouse.query(
        "SELECT count(*) FILTER (WHERE is_current) cur, count(*) total FROM table_versions WHERE table_name = 'steps'"
    ).to_pylist()[0]
    assert versions == {"cur": 1, "total": 2}


def test_bad_files_are_quarantined_and_the_rest_imported(small_demos, home, tmp_path):
    folder = tmp_path / "with-bad"
    shutil.copytree(small_demos, folder)
    task = folder / "bad-task"
    task.mkdir()
    (task / "corrupt.json.gz").write_bytes(b"\x1f\x8bnot really gzip")
    (task / "malformed.json.gz").write_bytes(gzip.compress(b'{"utterance": "x", "states": ['))
    write_recording(task / "empty.json.gz", {"utterance": "x", "states": [], "rawReward": -1})
    write_recording(
        task / "weird-event.json.gz",
        {
            "taskName": "bad-task",  # the folder is no known task: the recording must name its own
            "utterance": "Click the button",
            "rawReward": -1,
            "reward": -1,
            "states": [
                {
                    "time": "0",
                    "action": None,
                    "dom": {"tag": "BODY", "ref": 1, "left": 0, "top": 0, "width": 160, "height": 210, "children": []},
                },
                {
                    "time": "5",
                    "action": "{'type': 'contextmenu', 'x': 3, 'y': 4, 'timing': 1}",
                    "dom": {"tag": "BODY", "ref": 1, "left": 0, "top": 0, "width": 160, "height": 210, "children": []},
                },
                {
                    "time": "9",
                    "action": "{'type': 'mousedown', 'x': 3, 'y': 4, 'timing': 1}",
                    "dom": {"tag": "BODY", "ref": 1, "left": 0, "top": 0, "width": 160, "height": 210, "children": []},
                },
            ],
        },
    )
    warehouse = Warehouse(home)
    report = import_demonstrations(folder, warehouse, workers=2)
    q = warehouse.query(
        "SELECT source_file, event_index, severity, reason FROM quarantine ORDER BY source_file"
    ).to_pylist()
    by_file = {r["source_file"]: r for r in q}
    assert "corrupted gzip" in by_file["bad-task/corrupt.json.gz"]["reason"]
    assert "malformed JSON" in by_file["bad-task/malformed.json.gz"]["reason"]
    assert "no states" in by_file["bad-task/empty.json.gz"]["reason"]
    weird = by_file["bad-task/weird-event.json.gz"]
    assert weird["severity"] == "event" and weird["event_index"] == 1 and "contextmenu" in weird["reason"]
    # The file with an unknown event is still imported: its steps are an UNKNOWN and a CLICK.
    steps = warehouse.query(
        "SELECT action_type FROM steps JOIN episodes USING (episode_id) "
        "WHERE source_file = 'bad-task/weird-event.json.gz' ORDER BY step_idx"
    ).to_pylist()
    assert [s["action_type"] for s in steps] == ["UNKNOWN", "CLICK"]
    assert report.quarantined == 3 and report.duplicates == 1
    assert report.episodes == report.files - 4 == 23


def test_failed_publish_keeps_the_previous_version(small_demos, home, monkeypatch):
    warehouse = Warehouse(home)
    import_demonstrations(small_demos, warehouse, workers=1)
    before = warehouse.query("SELECT count(*) n FROM steps").to_pylist()[0]["n"]
    files_before = sorted(p.name for p in (home / "data").rglob("*.parquet"))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Warehouse, "_rebuild_views", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        import_demonstrations(small_demos, warehouse, workers=1)
    monkeypatch.undo()
    assert warehouse.query("SELECT count(*) n FROM steps").to_pylist()[0]["n"] == before
    assert sorted(p.name for p in (home / "data").rglob("*.parquet")) == files_before  # staged files removed


def test_lineage_walks_from_steps_back_to_raw_files(small_demos, home):
    warehouse = Warehouse(home)
    report = import_demonstrations(small_demos, warehouse, workers=1, run_id="run-123")
    row = warehouse.query("SELECT * FROM lineage_materializations").to_pylist()[0]
    assert row["asset"] == "human_demonstrations" and row["run_id"] == "run-123"
    assert json.loads(row["row_counts"])["steps"] == report.steps
    stored_output = warehouse.relative(report.outputs["steps"])  # the catalog stores paths relative to the home
    assert stored_output in row["output_paths"]
    assert json.loads(row["parameters"])["import_root"] == str(small_demos.resolve())
    inputs = warehouse.walk_back(report.outputs["steps"]).to_pylist()
    raw = {r["path"] for r in inputs if r["kind"] == "file"}
    assert len(raw) == report.files
    assert all(len(r["version"]) == 64 for r in inputs)  # sha256 of each raw file
    via_view = warehouse.query(
        "SELECT count(*) n FROM lineage WHERE list_contains(output_paths, ?) AND input_kind = 'file'",
        [stored_output],
    ).to_pylist()[0]
    assert via_view["n"] == report.files


@pytest.mark.e2e
def test_full_import_of_the_shared_demonstrations(demos_dir, home):
    """All 10,466 files are accounted for; failures are kept; under 2% of steps are untyped."""
    warehouse = Warehouse(home)
    report = import_demonstrations(demos_dir, warehouse, workers=2)
    files = warehouse.query("SELECT status, count(*) n FROM source_files GROUP BY 1").to_pylist()
    assert sum(r["n"] for r in files) == 10_466 == report.files
    assert report.imported + report.duplicates + report.quarantined == 10_466
    assert report.episodes > 8_000 and report.tasks == 51
    assert report.successes > 0 and report.failures > 1_000
    assert report.untyped_share < 0.02
    # Every quarantined file says why.
    unexplained = warehouse.query(
        "SELECT count(*) n FROM source_files f WHERE status = 'quarantined' AND NOT EXISTS "
        "(SELECT 1 FROM quarantine q WHERE q.source_file = f.source_file AND q.severity = 'file')"
    ).to_pylist()[0]["n"]
    assert unexplained == 0


def test_a_sample_per_task_is_fixed_and_spread_over_batches(small_demos, tmp_path):
    """``max_files_per_task`` (the demo's sample): at most N recordings of each task folder, the
    same ones every run whatever order they are listed in, drawn from every batch folder."""
    paths = [f"batch-{b}/task-{t}/{b}-{k}.json.gz" for b in "ab" for t in "xyz" for k in range(20)]
    sample = sample_per_task(paths, 6)
    per_task = {t: [p for p in sample if f"/task-{t}/" in p] for t in "xyz"}
    assert all(len(files) == 6 for files in per_task.values())
    assert sample == [p for p in paths if p in sample]  # input order kept
    assert sample_per_task(paths[::-1], 6) == sample[::-1]  # the same files, whatever the listing order
    assert any(p.startswith("batch-a/") for p in sample) and any(p.startswith("batch-b/") for p in sample)
    assert sample_per_task(paths, 100) == paths
    with pytest.raises(ValueError, match="at least 1"):
        sample_per_task(paths, 0)

    report = import_demonstrations(small_demos, Warehouse(tmp_path / "home"), workers=1, max_files_per_task=2)
    tasks = Warehouse(tmp_path / "home").query("SELECT task_id, count(*) AS n FROM episodes GROUP BY 1").to_pylist()
    assert report.files == sum(r["n"] for r in tasks) and all(r["n"] <= 2 for r in tasks) and len(tasks) == 4
