"""Workers die with their parent: kill -9 a parent holding a process pool, and no worker survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from envs.process import parent_alive, set_parent_death_signal
from warehouse.storage import REPO_ROOT

# A parent that starts a pool of two workers (initializer: die_with_parent) busy with long tasks,
# prints the workers' pids, then waits for their results: what an import looks like when killed.
PARENT = textwrap.dedent(
    """
    import os, sys, time
    from concurrent.futures import ProcessPoolExecutor

    import psutil

    from envs.process import die_with_parent


    def init(parent_pid, use_prctl):
        die_with_parent(parent_pid, poll_s=0.2, use_prctl=use_prctl)


    def work(seconds):
        time.sleep(seconds)
        return os.getpid()


    if __name__ == "__main__":
        with ProcessPoolExecutor(2, initializer=init, initargs=(os.getpid(), sys.argv[1] == "prctl")) as pool:
            futures = [pool.submit(work, 120) for _ in range(4)]
            time.sleep(1.0)
            print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)
            for f in futures:
                f.result()
    """
)


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run_and_kill_parent(mode: str, tmp_path) -> tuple[list[int], float]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), mode],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) >= 2, line
        assert all(_running(p) for p in workers)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        started = time.monotonic()
        survivors = _wait_gone(workers, timeout_s=10)
        return survivors, time.monotonic() - started
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_pool_workers_die_with_a_killed_parent(tmp_path):
    survivors, seconds = _run_and_kill_parent("prctl", tmp_path)
    for pid in survivors:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == [] and seconds < 5


def test_the_liveness_fallback_alone_also_ends_them(tmp_path):
    survivors, seconds = _run_and_kill_parent("poll", tmp_path)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == [] and seconds < 5


def test_helpers_in_a_live_process():
    assert parent_alive(os.getppid()) and not parent_alive(-1)
    if sys.platform.startswith("linux"):
        # Setting the death signal on the test process itself is harmless: pytest's parent outlives it.
        assert set_parent_death_signal(0) is True  # 0 clears it again


IMPORTER = textwrap.dedent(
    """
    import sys

    from envs.miniwob.demonstrations import import_demonstrations
    from warehouse.catalog import Warehouse

    if __name__ == "__main__":
        import_demonstrations(sys.argv[1], Warehouse(sys.argv[2]), workers=2, chunk_size=256)
    """
)


def test_killing_an_import_leaves_no_worker_behind(demos_dir, tmp_path):
    """kill -9 of a running import: its workers end at once instead of finishing their chunk and
    blocking forever on a pipe nobody reads; the warehouse keeps no half-written version."""
    script = tmp_path / "importer.py"
    script.write_text(IMPORTER)
    home = tmp_path / "home"
    parent = subprocess.Popen(
        [sys.executable, str(script), str(demos_dir), str(home)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and parent.poll() is None:
            children = psutil.Process(parent.pid).children()
            busy = [c for c in children if c.cpu_times().user > 0.5]  # converting files, not just started
            if len(busy) >= 2:
                workers = [c.pid for c in children]
                break
            time.sleep(0.1)
        assert len(workers) >= 2, "the import's workers never got busy"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        survivors = _wait_gone(workers, timeout_s=5)
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert survivors == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    from warehouse.catalog import Warehouse

    assert Warehouse(home).query("SELECT count(*) n FROM episodes").to_pylist()[0]["n"] == 0
