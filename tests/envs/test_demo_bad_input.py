"""Bad input never aborts an import: each bad file is quarantined with its reason, the rest imported.

Regression tests for the issue "Bad input never aborts a batch": a deeply nested JSON file, a file
name that is not UTF-8, and (with its task-spec twin in test_task_spec_bounds.py) a YAML alias bomb.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.miniwob.demo_files import fs_path, stored_path
from envs.miniwob.demonstrations import import_demonstrations
from envs.miniwob.recordings import MAX_JSON_DEPTH, MAX_RECORDING_BYTES, json_nesting_depth
from warehouse.catalog import Warehouse

DEEP_JSON = b"[" * 100_000 + b"]" * 100_000  # valid nesting, 200 KB: a RecursionError in json.loads
BAD_NAME = b"bad\xff\xfename.json"  # not UTF-8
ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["instruction: *i"]
)


def _statuses(warehouse: Warehouse) -> dict[str, str]:
    return {r["source_file"]: r["status"] for r in warehouse.query("SELECT * FROM source_files").to_pylist()}


def _reasons(warehouse: Warehouse) -> dict[str, str]:
    rows = warehouse.query("SELECT source_file, reason FROM quarantine WHERE severity = 'file'").to_pylist()
    return {r["source_file"]: r["reason"] for r in rows}


def _unique_recording(demos_dir: Path, exclude: Path) -> bytes:
    """A real recording (decompressed) that is not among the small fixture's files."""
    names = {p.name for p in exclude.rglob("*.json.gz")}
    for path in reversed(sorted((demos_dir / "2017-10-16_second-turk" / "login-user").glob("*.json.gz"))):
        data = gzip.decompress(path.read_bytes())
        if path.name not in names and len(json.loads(data)["states"]) > 4:
            return data
    raise AssertionError("no spare login-user recording")


@pytest.fixture
def baseline(small_demos, tmp_path_factory):
    """What importing the small folder alone gives: (files, episodes)."""
    warehouse = Warehouse(tmp_path_factory.mktemp("baseline-home"))
    report = import_demonstrations(small_demos, warehouse, workers=1)
    return report.files, {r["episode_id"] for r in warehouse.query("SELECT episode_id FROM episodes").to_pylist()}


def test_deeply_nested_json_is_quarantined_and_the_batch_goes_on(small_demos, baseline, home, tmp_path):
    folder = tmp_path / "demos"
    shutil.copytree(small_demos, folder)
    (folder / "login-user").mkdir()
    (folder / "login-user" / "deep.json").write_bytes(DEEP_JSON)
    (folder / "login-user" / "deep.json.gz").write_bytes(gzip.compress(DEEP_JSON))
    warehouse = Warehouse(home)
    report = import_demonstrations(folder, warehouse, workers=2)  # the RecursionError came from a worker
    episodes = {r["episode_id"] for r in warehouse.query("SELECT episode_id FROM episodes").to_pylist()}
    assert episodes == baseline[1]
    reasons = _reasons(warehouse)
    for name in ("login-user/deep.json", "login-user/deep.json.gz"):
        assert "nested" in reasons[name] and str(MAX_JSON_DEPTH) in reasons[name]
    assert report.files == baseline[0] + 2 and report.quarantined == 2


def test_a_file_name_that_is_not_utf8_is_stored_escaped_and_imported(small_demos, baseline, demos_dir, home, tmp_path):
    folder = tmp_path / "demos"
    shutil.copytree(small_demos, folder)
    task_dir = os.fsencode(folder / "2017-10-16_second-turk" / "login-user")
    with open(os.path.join(task_dir, BAD_NAME), "wb") as handle:
        handle.write(_unique_recording(demos_dir, small_demos))
    warehouse = Warehouse(home)
    report = import_demonstrations(folder, warehouse, workers=2)
    stored = "2017-10-16_second-turk/login-user/bad\\xff\\xfename.json"
    assert _statuses(warehouse)[stored] == "imported"
    episode = warehouse.query("SELECT * FROM episodes WHERE source_file = ?", [stored]).to_pylist()
    assert len(episode) == 1 and episode[0]["task_id"] == "login-user"
    assert report.episodes == len(baseline[1]) + 1
    # Lossless: the stored form leads back to the file on disk.
    assert os.path.exists(os.path.join(str(folder), fs_path(stored)))
    lineage = warehouse.query("SELECT path FROM lineage_inputs WHERE path LIKE '%bad%'").to_pylist()
    assert [r["path"] for r in lineage] == [f"{folder}/{stored}"]


@pytest.mark.parametrize(
    "raw",
    [
        b"plain.json",
        b"bad\xff\xfename.json",
        b"back\\slash\\xff.json",  # a real backslash followed by "xff": must not read as an escape
        "caf\u00e9 \u2603.json".encode(),
        b"\xed\xa0\x80surrogate-bytes.json",  # UTF-8 of a surrogate: not valid UTF-8
        b"new\nline.json",
    ],
)
def test_stored_paths_round_trip(raw):
    name = os.fsdecode(raw)
    stored = stored_path(name)
    stored.encode("utf-8")  # storable: no surrogates left
    assert fs_path(stored) == name
    assert os.fsencode(fs_path(stored)) == raw


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(min_size=1, max_size=40))
def test_any_file_name_round_trips_through_its_stored_form(raw):
    stored = stored_path(os.fsdecode(raw))
    stored.encode("utf-8")
    assert os.fsencode(fs_path(stored)) == raw


def test_a_folder_of_real_recordings_with_bad_inputs_mixed_in(small_demos, baseline, demos_dir, home, tmp_path):
    """Every real recording is imported; every other file is accounted for; the call never raises."""
    folder = tmp_path / "demos"
    shutil.copytree(small_demos, folder)
    bad = folder / "2017-10-16_second-turk" / "login-user"
    extra = os.fsencode(bad)
    spare = _unique_recording(demos_dir, small_demos)
    bad_files = {
        # deeply nested JSON, of several shapes
        "deep-arrays.json": DEEP_JSON,
        "deep-objects.json": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "deep-in-a-dom.json": json.dumps(
            {"utterance": "x", "rawReward": 1, "states": [{"time": 0, "action": None, "dom": "DOM"}]}
        )
        .encode()
        .replace(b'"DOM"', b'{"children": [' * 2_000 + b"{}" + b"]}" * 2_000),
        "deep-gzip.json.gz": gzip.compress(DEEP_JSON),
        # YAML alias bombs where JSON is expected
        "alias-bomb.json": ALIAS_BOMB.encode(),
        "alias-bomb.json.gz": gzip.compress(ALIAS_BOMB.encode()),
        # a gzip bomb: small on disk, over MAX_RECORDING_BYTES inflated
        "gzip-bomb.json.gz": gzip.compress(b" " * (MAX_RECORDING_BYTES + 1), compresslevel=9),
        # structurally wrong recordings
        "dom-not-an-object.json": json.dumps(
            {"utterance": "x", "rawReward": 1, "states": [{"time": 0, "action": "{'type': 'click'}", "dom": [1]}]}
        ).encode(),
        "lone-surrogate.json": b'{"utterance": "\\ud800", "rawReward": 1, "states": [{"dom": {}}]}',
        "huge-int.json": b'{"utterance": "x", "rawReward": ' + b"9" * 5000 + b', "states": [{}]}',
    }
    for name, data in bad_files.items():
        (bad / name).write_bytes(data)
    bad_names = [b"bad\xff\xfename.json", b"\xed\xa0\x80.json", b"back\\slash.json", b"nl\nname.json"]
    for i, raw in enumerate(bad_names):
        with open(os.path.join(extra, raw), "wb") as handle:
            # the first is a real recording not imported otherwise; the others copies of it or garbage
            handle.write(spare if i < 2 else b"\x1f\x8bgarbage")
    warehouse = Warehouse(home)
    report = import_demonstrations(folder, warehouse, workers=2)

    statuses = _statuses(warehouse)
    prefix = "2017-10-16_second-turk/login-user/"
    expected_files = baseline[0] + len(bad_files) + len(bad_names)
    assert report.files == len(statuses) == expected_files
    episodes = {r["episode_id"] for r in warehouse.query("SELECT episode_id FROM episodes").to_pylist()}
    assert baseline[1] < episodes and len(episodes) == len(baseline[1]) + 1  # the spare recording, once
    reasons = _reasons(warehouse)
    for name in bad_files:
        assert statuses[prefix + name] == "quarantined" and reasons[prefix + name], name
    stored_names = [prefix + stored_path(os.fsdecode(raw)) for raw in bad_names]
    assert [statuses[s] for s in stored_names] == ["imported", "duplicate", "quarantined", "quarantined"]
    assert "gzip" in reasons[stored_names[2]]
    assert "MAX_RECORDING_BYTES" in reasons[prefix + "gzip-bomb.json.gz"]
    # every quarantined file says why
    quarantined = {f for f, s in statuses.items() if s == "quarantined"}
    assert quarantined == set(reasons)


def test_nesting_depth_counts_brackets_outside_strings_only():
    assert json_nesting_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_nesting_depth(b"[" * 300 + b"]" * 300, limit=256) == 300
    # brackets in strings do not count once the quick count is over the limit
    text = b'["' + b"[" * 400 + b'", "\\"[[[", 1]'
    assert json_nesting_depth(text, limit=256) == 1
    assert json_nesting_depth(b"") == 0 and json_nesting_depth(b"]]]") == 0
