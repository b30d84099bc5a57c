"""The warehouse shared through an object store: a real S3 API (moto's server on 127.0.0.1) and a
plain folder. Two homes push and pull; what one labels the other queries; a dataset changed on
both sides is refused by name and nothing changes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from annotation.progress.label_increments import run_family_labels
from annotation.progress.label_runs import run_labeling
from tests.annotation.helpers import publish_tiny_episodes
from warehouse.catalog import ConcurrentPublishError, Warehouse
from warehouse.object_store import MANIFEST, connect, open_store, pull, push

STEPWISE = Path(sys.executable).with_name("stepwise")
quiet = lambda _message: None  # noqa: E731


@pytest.fixture
def s3_url(monkeypatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    try:
        # moto keeps buckets in process memory, across server instances: a bucket per test.
        yield f"s3://stepwise-test-{uuid.uuid4().hex[:8]}/warehouse"
    finally:
        server.stop()


def _counts(query) -> dict[str, int]:
    return {
        table: query(f"SELECT count(*) AS n FROM {table}")
        for table in ("episodes", "steps", "progress_labels", "recipes", "label_ledger")
    }


def _labelled_home(tmp_path: Path, name: str) -> Warehouse:
    home = tmp_path / name
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    run_labeling(warehouse, embedder="hashing", log=quiet)
    return warehouse


def test_a_home_pushed_to_s3_is_pulled_and_queried_elsewhere(tmp_path, s3_url):
    a = _labelled_home(tmp_path, "a")
    sent = push(a, s3_url, log=quiet)
    assert sent.files == len(sent.sent) > 0 and sent.generation
    assert push(a, s3_url, log=quiet).files == 0  # nothing new: no file sent twice

    # A second machine: a fresh home pulls the store and sees the same warehouse, lineage included.
    b = Warehouse(tmp_path / "b")
    got = pull(b, s3_url, log=quiet)
    assert got.files == sent.files

    def on(w: Warehouse):
        return lambda sql: w.query(sql).to_pylist()[0]["n"]

    assert _counts(on(b)) == _counts(on(a))
    assert (
        b.query("SELECT count(*) AS n FROM lineage").to_pylist()
        == a.query("SELECT count(*) AS n FROM lineage").to_pylist()
    )
    labels = b.query("SELECT DISTINCT path FROM table_versions WHERE is_current AND table_name = 'progress_labels'")
    assert b.walk_back(labels.column("path")[0].as_py()).num_rows > 0  # walks back to the episodes' version

    # Queried in place, without a home: views over the objects (pyarrow datasets, no extension).
    con = connect(s3_url)
    assert _counts(lambda sql: con.execute(sql).fetchone()[0]) == _counts(on(a))
    store = open_store(s3_url)
    generation = json.loads(store.read_bytes(MANIFEST))["generation"]
    views = store.read_bytes(f"catalog/{generation}/views.sql").decode()
    assert "CREATE OR REPLACE VIEW progress_labels" in views and f"{s3_url}/data/" in views
    assert "testing" not in views  # credentials come from the environment, never the store


def test_pushes_merge_per_dataset_and_a_conflict_changes_nothing(tmp_path, s3_url):
    a = _labelled_home(tmp_path, "a")
    push(a, s3_url, log=quiet)
    b = Warehouse(tmp_path / "b")
    pull(b, s3_url, log=quiet)

    # A labels new login episodes (family miniwob-forms) and pushes; B, not having pulled, relabels
    # family other: B's push keeps A's forms labels and adds its own.
    publish_tiny_episodes(a.home, "second", "new-", seed=8, n_login=4, n_button=0)
    run_family_labels(a, "miniwob-forms", embedder="hashing", log=quiet, rebuild_at_least=100)
    push(a, s3_url, log=quiet)
    run_labeling(b, embedder="hashing", log=quiet, families=["other"])
    merged = push(b, s3_url, log=quiet)
    assert merged.sent and all(dataset.startswith("labels/other") for _, dataset in merged.sent)
    assert any(dataset.startswith("labels/miniwob-forms") for _, dataset in merged.kept)
    con = connect(s3_url)
    new = con.execute("SELECT count(DISTINCT episode_id) FROM progress_labels WHERE starts_with(episode_id, 'new-')")
    assert new.fetchone()[0] == 4  # A's incremental labels survived B's push

    # B pulls A's work; then both relabel family other: the second push is refused, naming it.
    pull(b, s3_url, log=quiet)
    assert b.query("SELECT count(*) AS n FROM episodes WHERE starts_with(episode_id, 'new-')").to_pylist()[0]["n"] == 4
    run_labeling(a, embedder="hashing", log=quiet, families=["other"])
    run_labeling(b, embedder="hashing", log=quiet, families=["other"])
    push(b, s3_url, log=quiet)
    manifest = open_store(s3_url).read_bytes(MANIFEST)
    with pytest.raises(ConcurrentPublishError, match=r"labels/other changed both here and in s3://"):
        push(a, s3_url, log=quiet)
    assert open_store(s3_url).read_bytes(MANIFEST) == manifest
    with pytest.raises(ConcurrentPublishError, match="changed both here and in this home"):
        pull(a, s3_url, log=quiet)


def test_a_shared_folder_through_the_cli(tmp_path):
    a = _labelled_home(tmp_path, "a")
    shared = tmp_path / "shared"
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}

    def stepwise(home: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [STEPWISE, *args], capture_output=True, text=True, env=env | {"STEPWISE_HOME": str(home)}, timeout=300
        )

    out = stepwise(a.home, "warehouse", "push", str(shared))
    assert out.returncode == 0, out.stderr
    assert "pushed" in out.stdout and not list(shared.rglob("*.tmp"))
    out = stepwise(tmp_path / "b", "warehouse", "pull", f"file://{shared}")
    assert out.returncode == 0 and "pulled" in out.stdout, out.stderr
    out = stepwise(tmp_path / "c", "sql", "--store", str(shared), "SELECT count(*) AS n FROM progress_labels")
    assert out.returncode == 0, out.stderr
    assert str(a.query("SELECT count(*) AS n FROM progress_labels").to_pylist()[0]["n"]) in out.stdout
    bad = stepwise(tmp_path / "c", "warehouse", "pull", "ftp://example/x")
    assert bad.returncode == 2 and "not an object-store location" in bad.stderr
    empty = stepwise(tmp_path / "c", "warehouse", "pull", str(tmp_path / "nothing-here"))
    assert empty.returncode == 2 and "nothing was pushed to this store yet" in empty.stderr


def test_a_dataset_newer_in_the_store_is_pulled_later_and_never_pushed_back(tmp_path):
    """B keeps the store's newer version of a dataset B also holds when it pushes something else;
    its next pull takes that version, and no push of B's rolls the store back."""
    store = str(tmp_path / "shared")
    a = _labelled_home(tmp_path, "a")
    push(a, store, log=quiet)
    b = Warehouse(tmp_path / "b")
    pull(b, store, log=quiet)
    run_labeling(a, embedder="hashing", log=quiet, families=["miniwob-forms"])  # replaces a dataset B holds
    push(a, store, log=quiet)
    run_labeling(b, embedder="hashing", log=quiet, families=["other"])
    forms = ("progress_labels", "labels/miniwob-forms")
    assert forms in push(b, store, log=quiet).kept

    def current(w: Warehouse) -> str:
        return {d: mid for d, mid, _ in w.current_versions("progress_labels")}["labels/miniwob-forms"]

    assert forms not in push(b, store, log=quiet).sent  # pushing again does not send B's older copy
    assert forms in pull(b, store, log=quiet).sent
    assert current(b) == current(a)
    assert forms not in push(b, store, log=quiet).sent
    fresh = Warehouse(tmp_path / "c")
    pull(fresh, store, log=quiet)
    assert current(fresh) == current(a)


def test_credentials_never_go_in_a_url():
    with pytest.raises(ValueError, match="must not hold credentials"):
        open_store("s3://AKIA123:secret@bucket/prefix")
