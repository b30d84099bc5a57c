"""An episode is its recording's content: the same recording imported through two folders is one
episode, a flat folder does not name the task, and a variant folder is recorded, not merged.

Regression tests for the issue "Hardening", items 1 and 13.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from envs.miniwob.demo_files import known_task_ids
from envs.miniwob.demonstrations import import_demonstrations
from envs.tasks import TASK_VARIANT_FIELD, load_task_specs, spec_for
from warehouse.catalog import Warehouse


def _task_name(path: Path) -> str | None:
    return json.loads(gzip.decompress(path.read_bytes())).get("taskName")


def _pick(folder: Path, count: int, *, named: str | None = "any", skip: int = 0) -> list[Path]:
    """Real recordings with at least one action (no empty ones), optionally by the task they name."""
    found = []
    for path in sorted(folder.glob("*.json.gz"))[skip:]:
        recording = json.loads(gzip.decompress(path.read_bytes()))
        if len(recording["states"]) < 4 or (named != "any" and recording.get("taskName") != named):
            continue
        found.append(path)
        if len(found) == count:
            return found
    raise AssertionError(f"not enough recordings in {folder}")


@pytest.fixture(scope="module")
def sources(demos_dir) -> dict[str, list[Path]]:
    second = demos_dir / "2017-10-16_second-turk"
    return {
        # the first batch does not record its task: only its folder names it
        "choose-date-easy": _pick(demos_dir / "2017-09-29_first-turk" / "choose-date-easy", 6, named=None),
        "login-user": _pick(second / "login-user", 4),
        # recordings of the NL variant that call themselves email-inbox
        "nl-as-email-inbox": _pick(
            demos_dir / "2017-10-16_second-turk" / "email-inbox-nl-turk", 2, named="email-inbox"
        ),
        "nl": _pick(demos_dir / "2017-10-26_third-turk" / "email-inbox-nl-turk", 2, named="email-inbox-nl-turk"),
    }


def _tree(root: Path, layout: dict[str, list[Path]]) -> Path:
    for folder, files in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, root / folder / f.name)
    return root


def _episodes(warehouse: Warehouse) -> list[dict]:
    return warehouse.query("SELECT * FROM episodes ORDER BY episode_id").to_pylist()


def test_the_same_recordings_through_a_flat_folder_are_duplicates_not_new_episodes(sources, home, tmp_path):
    shared = _tree(
        tmp_path / "shared",
        {
            "first-turk/choose-date-easy": sources["choose-date-easy"][:5],
            "second-turk/login-user": sources["login-user"],
        },
    )
    flat = _tree(tmp_path / "c", {".": sources["choose-date-easy"][:5] + sources["login-user"]})
    warehouse = Warehouse(home)
    first = import_demonstrations(shared, warehouse, workers=1)
    before = _episodes(warehouse)
    assert first.episodes == 9 and {e["task_id"] for e in before} == {"choose-date-easy", "login-user"}

    report = import_demonstrations(flat, warehouse, workers=2)
    assert report.files == 9 and report.duplicates == report.duplicates_of_other_imports == 9
    assert report.episodes == 0 and report.quarantined == 0
    after = _episodes(warehouse)
    assert [e["episode_id"] for e in after] == [e["episode_id"] for e in before]  # no demo:c:... episode
    assert not any(e["task_id"] == "c" for e in after)
    counts = warehouse.query("SELECT count(*) n, count(DISTINCT source_sha256) d FROM episodes").to_pylist()[0]
    assert counts["n"] == counts["d"] == 9
    # source_files of the flat folder say which earlier file (and episode) each duplicates
    rows = warehouse.query(
        "SELECT f.*, e.source_file AS original FROM source_files f JOIN episodes e USING (episode_id) "
        "WHERE f.import_root = ?",
        [str(flat.resolve())],
    ).to_pylist()
    assert len(rows) == 9 and all(r["status"] == "duplicate" for r in rows)
    assert all(r["link_target"] == f"{shared.resolve()}/{r['original']}" for r in rows)

    # re-importing either folder replaces its own version; nothing is added, nothing changes owner
    import_demonstrations(shared, warehouse, workers=1)
    again = import_demonstrations(flat, warehouse, workers=1)
    assert again.duplicates_of_other_imports == 9
    assert [e["episode_id"] for e in _episodes(warehouse)] == [e["episode_id"] for e in before]


def test_a_recording_that_names_no_task_takes_a_known_folder_or_the_override(sources, home, tmp_path):
    new = sources["choose-date-easy"][5:]  # in no other import
    flat = _tree(tmp_path / "c", {".": new})
    warehouse = Warehouse(home)
    report = import_demonstrations(flat, warehouse, workers=1)
    assert report.quarantined == 1 and report.episodes == 0
    reason = warehouse.query("SELECT reason FROM quarantine").to_pylist()[0]["reason"]
    assert "no task" in reason and "taskName" in reason

    report = import_demonstrations(flat, warehouse, workers=1, task="choose-date-easy")
    assert report.episodes == 1 and _episodes(warehouse)[0]["task_id"] == "choose-date-easy"
    with pytest.raises(ValueError, match="not a known MiniWoB"):
        import_demonstrations(flat, warehouse, workers=1, task="c")
    # the folder being imported may itself be named after the task
    named = _tree(tmp_path / "choose-date-easy", {".": new})
    assert import_demonstrations(named, Warehouse(tmp_path / "other-home"), workers=1).episodes == 1
    assert "choose-date-easy" in known_task_ids() and "c" not in known_task_ids()


def test_the_first_import_keeps_a_shared_recording_through_re_imports(sources, home, tmp_path):
    a = _tree(tmp_path / "a", {"login-user": sources["login-user"][:2]})
    b = _tree(tmp_path / "b", {"login-user": sources["login-user"]})
    warehouse = Warehouse(home)
    import_demonstrations(a, warehouse, workers=1)
    owned_by_a = {e["episode_id"]: e["created_at"] for e in _episodes(warehouse)}
    report_b = import_demonstrations(b, warehouse, workers=1)
    assert report_b.duplicates_of_other_imports == 2 and report_b.episodes == 2
    for _ in range(2):  # re-import a, then b: ownership stays put
        import_demonstrations(a, warehouse, workers=1)
        report_b = import_demonstrations(b, warehouse, workers=1)
        episodes = _episodes(warehouse)
        assert len(episodes) == 4 and report_b.duplicates_of_other_imports == 2
        by_root = {e["episode_id"]: e for e in episodes if e["import_root"] == str(a.resolve())}
        assert {k: v["created_at"] for k, v in by_root.items()} == owned_by_a  # first import time kept


def test_a_variant_folder_is_recorded_not_merged(sources, home, tmp_path):
    root = _tree(
        tmp_path / "demos",
        {
            "batch/email-inbox-nl-turk": sources["nl-as-email-inbox"] + sources["nl"],
            "batch/later-copies": sources["nl-as-email-inbox"][:1],  # the same bytes again, later in path order
        },
    )
    warehouse = Warehouse(home)
    report = import_demonstrations(root, warehouse, workers=1)
    episodes = _episodes(warehouse)
    assert report.episodes == 4 and report.duplicates == 1 and report.variants == 2
    by_task: dict[str, list[dict]] = {}
    for e in episodes:
        by_task.setdefault(e["task_id"], []).append(e)
    # the recording's own task is kept; the folder's known task is its variant
    assert sorted(by_task) == ["email-inbox", "email-inbox-nl-turk"]
    for e in by_task["email-inbox"]:
        fields = json.loads(e["task_fields"])
        assert fields[TASK_VARIANT_FIELD] == "email-inbox-nl-turk" and "by" in fields  # recorded fields kept
    for e in by_task["email-inbox-nl-turk"]:
        assert TASK_VARIANT_FIELD not in json.loads(e["task_fields"] or "{}")
    # a spec can target the variant: the variant's spec applies, and the variant is no instruction slot
    specs = load_task_specs(Path(__file__).resolve().parents[2] / "envs" / "task_specs" / "miniwob")
    variant_fields = json.loads(by_task["email-inbox"][0]["task_fields"])
    spec = spec_for(specs, "email-inbox", variant_fields)
    assert spec is not None and spec.task_id == "email-inbox-nl-turk"
    slots = spec.slots(by_task["email-inbox"][0]["instruction"], variant_fields)
    assert slots is not None and TASK_VARIANT_FIELD not in slots and "by" in slots
    assert spec_for(specs, "email-inbox-nl-turk", {}) is specs["email-inbox-nl-turk"]
    # ... and so can a query
    variant = warehouse.query(
        "SELECT count(*) n FROM episodes WHERE json_extract_string(task_fields, '$.task_variant') = ?",
        ["email-inbox-nl-turk"],
    ).to_pylist()[0]["n"]
    assert variant == 2
    # the later copy is the same recording: a duplicate of the first, not a new episode
    duplicate = warehouse.query("SELECT * FROM source_files WHERE status = 'duplicate'").to_pylist()[0]
    assert duplicate["source_file"].startswith("batch/later-copies/")
    assert duplicate["link_target"].startswith("batch/email-inbox-nl-turk/")
    assert duplicate["episode_id"] in {e["episode_id"] for e in by_task["email-inbox"]}
