"""Fuzz (a): generated files and file names mixed with real recordings never abort an import.

Whatever is generated, the import returns; every real recording is imported (by its own file or a
byte-identical one); every file the folder holds is accounted for in ``source_files``, and every
quarantined one has a reason.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envs.miniwob.demo_files import DEMO_SUFFIXES, stored_path
from envs.miniwob.demonstrations import import_demonstrations
from tests.envs.fuzzing import fuzz_settings
from warehouse.catalog import Warehouse

REAL_DIR = "real/2017-10-16_second-turk/login-user"


@pytest.fixture(scope="module")
def real_recordings(demos_dir) -> list[Path]:
    """Three small real recordings with actions."""
    picked = []
    for path in sorted((demos_dir / "2017-10-16_second-turk" / "login-user").glob("*.json.gz")):
        states = json.loads(gzip.decompress(path.read_bytes()))["states"]
        if 4 < len(states) < 60:
            picked.append(path)
        if len(picked) == 3:
            return picked
    raise AssertionError("no small login-user recordings")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_NAME = st.binary(min_size=1, max_size=24).filter(
    lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b"..")
)
_KEYS = ["utterance", "states", "rawReward", "reward", "taskName", "fields", "time", "action", "dom", "children"]


@st.composite
def _mutated_recording(draw, real: bytes) -> bytes:
    recording = json.loads(real)
    kind = draw(st.sampled_from(["drop-key", "replace-value", "replace-state", "replace-node", "truncate"]))
    if kind == "truncate":
        return real[: draw(st.integers(0, len(real)))]
    if kind == "drop-key":
        recording.pop(draw(st.sampled_from(sorted(recording))), None)
    elif kind == "replace-value":
        recording[draw(st.sampled_from(_KEYS))] = draw(_JSON)
    elif kind == "replace-state":
        states = recording["states"]
        index = draw(st.integers(0, len(states) - 1))
        states[index][draw(st.sampled_from(["time", "action", "dom"]))] = draw(
            _JSON | st.sampled_from(["{'type': 'keydown', 'keyCode': []}", "{'type': 'click', 'x': 1e999}", "(" * 200])
        )
    else:
        node = recording["states"][0]["dom"]
        while node.get("children") and draw(st.booleans()):
            node = node["children"][draw(st.integers(0, len(node["children"]) - 1))]
        node[draw(st.sampled_from(["tag", "ref", "left", "width", "children", "value", "text"]))] = draw(_JSON)
    return json.dumps(recording).encode()


@st.composite
def _generated_file(draw, real: list[bytes]) -> tuple[bytes, bytes]:
    """(path relative to gen/, as bytes; content)."""
    folder = draw(
        st.sampled_from([b"", b"login-user/", b"c/", b"email-inbox-nl-turk/"]) | _NAME.map(lambda b: b + b"/")
    )
    name = draw(_NAME) + draw(st.sampled_from([s.encode() for s in DEMO_SUFFIXES]))
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "real-copy", "link", "deep"]))
    if kind == "bytes":
        content = draw(st.binary(max_size=200))
    elif kind == "json":
        content = json.dumps(draw(_JSON)).encode()
    elif kind == "mutated":
        content = draw(_mutated_recording(draw(st.sampled_from(real))))
    elif kind == "real-copy":
        content = draw(st.sampled_from(real))
    elif kind == "link":
        content = draw(st.sampled_from([b"../", b"../../", b""])) + draw(_NAME) + b".json.gz"
    else:
        depth = draw(st.integers(200, 5_000))
        content = b"[" * depth + b"]" * depth
    if name.endswith(b".gz") and draw(st.booleans()):
        content = gzip.compress(content)
    return folder + name, content


@pytest.mark.fuzz
@fuzz_settings(12)
@given(data=st.data())
def test_fuzz_import_never_raises_and_accounts_for_every_file(real_recordings, tmp_path_factory, data):
    real = [gzip.decompress(p.read_bytes()) for p in real_recordings]
    generated = data.draw(st.lists(_generated_file(real), min_size=1, max_size=6), label="generated")
    root = tmp_path_factory.mktemp("fuzz-demos")
    (root / REAL_DIR).mkdir(parents=True)
    for path in real_recordings:
        shutil.copyfile(path, root / REAL_DIR / path.name)
    for rel, content in generated:
        target = os.path.join(os.fsencode(root / "gen"), rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(target):
            continue  # a generated folder took this name
        with open(target, "wb") as handle:
            handle.write(content)

    warehouse = Warehouse(tmp_path_factory.mktemp("fuzz-home"))
    report = import_demonstrations(root, warehouse, workers=1)  # must not raise

    on_disk = {
        stored_path(os.path.relpath(os.path.join(d, f), root))
        for d, _, names in os.walk(root)
        for f in names
        if f.endswith(DEMO_SUFFIXES) and os.path.isfile(os.path.join(d, f))
    }
    rows = warehouse.query("SELECT source_file, status, recording_sha256 FROM source_files").to_pylist()
    assert {r["source_file"] for r in rows} == on_disk and len(rows) == report.files == len(on_disk)
    assert {r["status"] for r in rows} <= {"imported", "duplicate", "quarantined"}
    imported = {e["source_sha256"] for e in warehouse.query("SELECT source_sha256 FROM episodes").to_pylist()}
    import hashlib

    assert {hashlib.sha256(r).hexdigest() for r in real} <= imported  # every real recording is in
    explained = {q["source_file"] for q in warehouse.query("SELECT source_file FROM quarantine").to_pylist()}
    assert {r["source_file"] for r in rows if r["status"] == "quarantined"} <= explained
