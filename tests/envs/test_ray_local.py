"""A local Ray cluster whose owner died is stopped by the next one started (envs.ray_local): Ray's
processes detach from the process that started them, so a killed test process used to leave its
whole cluster running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from envs.ray_local import LocalRayCluster, reap_orphaned_clusters
from envs.scratch import OWNER_FILE


def _cluster_folder(root: Path, name: str, owner: dict | str | None) -> Path:
    folder = root / f"ray-{name}"
    folder.mkdir()
    if owner is not None:
        (folder / OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    return folder


def test_only_clusters_whose_owner_is_gone_are_reaped(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    # no address: a folder without processes is never stopped by its address (a live cluster may hold it now)
    me = {"pid": os.getpid(), "started": psutil.Process().create_time(), "address": ""}
    dead = _cluster_folder(tmp_path, "dead", {"pid": gone.pid, "started": 1.0, "address": ""})
    reused = _cluster_folder(tmp_path, "reused", me | {"started": me["started"] - 3600})  # another process's pid now
    alive = _cluster_folder(tmp_path, "alive", me)
    unowned = _cluster_folder(tmp_path, "unowned", None)  # being started: no owner written yet
    garbled = _cluster_folder(tmp_path, "garbled", "{not json")
    assert sorted(reap_orphaned_clusters(tmp_path)) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert alive.exists() and unowned.exists() and garbled.exists()


@pytest.mark.e2e
def test_a_cluster_left_by_a_killed_owner_is_stopped_by_the_next_start():
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from envs.ray_local import LocalRayCluster; "
         "c = LocalRayCluster(cpus=(1,)).start(); print(c.temp_dir, c.address, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        temp_dir, address = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)  # no stop(), no atexit: as a crashed pytest worker goes
        owner.wait()
    orphan = LocalRayCluster(temp_dir=Path(temp_dir), address=address)
    assert orphan.processes(), "Ray's processes outlive the process that started them"
    with LocalRayCluster(cpus=(1,)) as fresh:
        assert not Path(temp_dir).exists()
        deadline = time.monotonic() + 10
        while orphan.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert orphan.processes() == []
        assert fresh.processes() and (fresh.temp_dir / OWNER_FILE).exists()


def test_a_dead_clusters_address_does_not_mark_a_live_process_once_its_own_processes_are_gone(tmp_path):
    """Its port may belong to a live cluster now: only the folder marks what to stop then."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    address = "127.0.0.2:59999"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--address={address}"])
    try:
        dead = _cluster_folder(tmp_path, "dead", {"pid": gone.pid, "started": 1.0, "address": address})
        assert reap_orphaned_clusters(tmp_path) == [dead]
        assert bystander.poll() is None, "a process naming the dead cluster's address was killed"
    finally:
        bystander.kill()
        bystander.wait()
