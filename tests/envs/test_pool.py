"""The worker pool under real faults: a Chromium killed mid-batch, a step that hangs, a worker that
dies between episodes, an episode that cannot run. Real browsers, real processes, real signals."""

import tempfile
from pathlib import Path

import psutil
import pytest

from envs.miniwob.live import MiniWoBConfig
from envs.policies import make_policy
from envs.pool import EnvPool
from envs.pool_jobs import EpisodeJob, PoolConfig, plan_jobs
from envs.rollouts import ATTEMPTS_TABLE, publish_rollouts
from envs.task_catalog import load_catalog
from envs.tasks import task_spec_from_mapping
from warehouse.catalog import Warehouse

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def jobs():
    catalog = load_catalog(fresh=True)
    return plan_jobs([catalog["login-user-popup"], catalog["click-option"]], batch="t", episodes_per_task=2)


def browsers_of(pool, worker_id):
    """Chromium's main process of a worker (the one chromedriver started)."""
    return [
        p
        for p in pool.worker_processes(worker_id)
        if p.name() == "chromium" and p.parent() and p.parent().name() == "chromedriver"
    ]


class Injector:
    """Acts once, before step ``step_idx`` of the job ``episode_id``'s first attempt."""

    def __init__(self, episode_id, step_idx, act):
        self.episode_id, self.step_idx, self.act = episode_id, step_idx, act
        self.fired: list[tuple[str, list[int]]] = []

    def __call__(self, ctx):
        if (
            not self.fired
            and ctx.job.episode_id == self.episode_id
            and ctx.attempt == 0
            and ctx.step_idx == self.step_idx
        ):
            processes = self.act(ctx)
            self.fired.append((ctx.worker_id, [p.pid for p in processes]))


def assert_nothing_lost_or_duplicated(result, jobs):
    assert not result.lost
    assert sorted(e.episode_id for e in result.episodes) == sorted(j.episode_id for j in jobs)
    for record in result.episodes:
        assert [s.step_idx for s in record.steps] == list(range(record.n_steps)) and record.steps[-1].done
    completed = [a for a in result.attempts if a.status == "completed"]
    assert len(completed) == len(jobs) and len({a.episode_id for a in completed}) == len(jobs)


def gone(pids):
    def dead(pid):
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(pid) for pid in pids)


def test_chromium_killed_mid_batch_episode_retried_on_a_fresh_worker(jobs, tmp_path):
    target = jobs[1].episode_id  # login-user-popup: long enough to be hit mid-episode

    def kill_browser(ctx):
        victims = browsers_of(ctx.pool, ctx.worker_id)
        for process in victims:
            process.kill()
        return victims

    injector = Injector(target, 2, kill_browser)
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=1, step_timeout_s=10)) as pool:
        result = pool.run(jobs, make_policy("noisy_expert"), before_step=injector)
        worker_pids = [w["pid"] for w in pool.status()]
    assert injector.fired, "the fault was injected"
    killed_worker, killed_pids = injector.fired[0]
    assert_nothing_lost_or_duplicated(result, jobs)
    attempts = [a for a in result.attempts if a.episode_id == target]
    assert [(a.attempt, a.status) for a in attempts] == [(0, "aborted"), (1, "completed")]
    aborted, retried = attempts
    assert aborted.worker_id == killed_worker and retried.worker_id != killed_worker
    assert aborted.steps_done == 2 and not aborted.final and aborted.reason
    assert "Stacktrace" not in aborted.reason and len(aborted.reason) < 400
    assert result.workers_replaced == 1 and gone(killed_pids)
    assert all(psutil.pid_exists(pid) is False or gone([pid]) for pid in worker_pids)  # pool closed: all gone

    # Written to the warehouse: each episode once, the aborted attempt recorded with its reason.
    store = Warehouse(tmp_path / "home")
    publish_rollouts(
        store, result, asset="test", dataset="fault", run_id="r", partition_key=None, parameters={}, spec_paths=[]
    )
    assert store.query("SELECT count(*) AS n, count(DISTINCT episode_id) AS d FROM episodes").to_pylist() == [
        {"n": len(jobs), "d": len(jobs)}
    ]
    rows = store.query(
        f"SELECT attempt, status, reason FROM {ATTEMPTS_TABLE} WHERE episode_id = ? ORDER BY attempt", [target]
    ).to_pylist()
    assert [(r["attempt"], r["status"]) for r in rows] == [(0, "aborted"), (1, "completed")] and rows[0]["reason"]
    n_steps = store.query("SELECT n_steps FROM episodes WHERE episode_id = ?", [target]).to_pylist()[0]["n_steps"]
    assert store.query("SELECT count(*) AS n FROM steps WHERE episode_id = ?", [target]).to_pylist()[0]["n"] == n_steps


def test_a_step_hanging_past_its_timeout_gets_its_worker_replaced(jobs, monkeypatch):
    target = jobs[0].episode_id
    # a temporary folder of this test's own: under pytest-xdist another worker's browsers put
    # their profiles in the shared /tmp at the same time (short: Chromium's socket path limit)
    monkeypatch.setenv("TMPDIR", tempfile.mkdtemp(prefix="pool-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)

    def freeze_browser(ctx):
        frozen = [p for p in ctx.pool.worker_processes(ctx.worker_id) if p.name() == "chromium"]
        for process in frozen:
            process.suspend()  # SIGSTOP: the next WebDriver command waits forever
        return frozen

    folders_before = set(Path(tempfile.gettempdir()).glob("stepwise-env-*"))
    injector = Injector(target, 1, freeze_browser)
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=1, step_timeout_s=2)) as pool:
        result = pool.run(jobs, make_policy("noisy_expert"), before_step=injector)
    assert injector.fired
    # the killed worker could not remove its folder (browser profile and TMPDIR); the pool did
    assert set(Path(tempfile.gettempdir()).glob("stepwise-env-*")) <= folders_before
    assert_nothing_lost_or_duplicated(result, jobs)
    aborted = [a for a in result.attempts if a.status == "aborted"]
    assert len(aborted) == 1 and aborted[0].episode_id == target
    assert aborted[0].reason.startswith("step timed out after 2 s") and 2000 <= aborted[0].duration_ms < 6000
    assert gone(injector.fired[0][1])


def test_a_worker_dying_between_episodes_is_caught_by_the_health_check(jobs):
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=0)) as pool:  # no spare: it must be reused
        first = pool.run(jobs[:2], make_policy("expert"))
        idle = [w for w in pool.status() if w["episodes"] > 0]
        for process in browsers_of(pool, idle[0]["worker_id"]):
            process.kill()
        second = pool.run(jobs[2:4], make_policy("expert"))
    assert not first.lost and not second.lost
    assert second.aborted_attempts == 0 and second.workers_replaced == 1
    assert all(e.worker_id != idle[0]["worker_id"] for e in second.episodes)


def test_an_episode_that_cannot_run_is_recorded_once_not_retried(jobs):
    misfit = task_spec_from_mapping(
        {
            "task_id": "click-button-sequence",
            "instruction": "Never (?P<x>.*)",
            "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}],
        }
    )
    bad = EpisodeJob("rollout:misfit:t:0", misfit, 0, 5)
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=0)) as pool:
        result = pool.run([bad, *jobs[:2]], make_policy("random_walk"))
    assert [job.episode_id for job, _ in result.lost] == [bad.episode_id]
    assert "does not fit" in result.lost[0][1]
    attempts = [a for a in result.attempts if a.episode_id == bad.episode_id]
    assert len(attempts) == 1 and attempts[0].final and attempts[0].status == "aborted"
    assert len(result.episodes) == 2 and result.workers_replaced == 0


def test_killing_the_parent_leaves_no_worker_or_browser(tmp_path):
    """A process holding a pool is killed with SIGKILL (as an OOM kill or a terminated run would):
    its workers and the Chromium processes they started are gone within seconds."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    pids_file = tmp_path / "pids.json"
    script = tmp_path / "hold_pool.py"
    script.write_text(
        "import json, os, sys, time, psutil\n"
        "from envs.miniwob.live import MiniWoBConfig\n"
        "from envs.pool import EnvPool\nfrom envs.pool_jobs import PoolConfig\n"
        "if __name__ == '__main__':\n"
        "    with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=1)) as pool:\n"
        "        pids = []\n"
        "        for w in pool.status():\n"
        "            root = psutil.Process(w['pid'])\n"
        "            pids += [root.pid] + [c.pid for c in root.children(recursive=True)]\n"
        # written whole, then renamed: the test polls for the file and must never read it half-written
        "        open(sys.argv[1] + '.tmp', 'w').write(json.dumps(pids))\n"
        "        os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "        time.sleep(600)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(script), str(pids_file)], cwd=repo, env=os.environ | {"PYTHONPATH": str(repo)}
    )
    try:
        deadline = time.time() + 120
        while not pids_file.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        pids = [p for p in json.loads(pids_file.read_text()) if _alive(p)]  # (some helpers come and go)
        assert len(pids) >= 4  # two workers (one a spare), each with chromedriver and Chromium
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.5)
        assert not [p for p in pids if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_killed_from_two_threads_at_once_is_killed_once():
    """The pool's close and a start thread that finds the pool closed may kill one worker at the
    same moment: its pipe is closed once (a second close would hit a descriptor number another
    thread reused), and both calls return with the worker and its browser gone."""
    import multiprocessing
    import threading

    from envs.pool_worker import ProcessWorker

    worker = ProcessWorker("w-kill", MiniWoBConfig(), 0, multiprocessing.get_context("spawn"))
    worker.wait_ready(120)
    closes = []
    real_close = worker.conn.close
    worker.conn.close = lambda: (closes.append(1), real_close())  # type: ignore[method-assign]
    barrier = threading.Barrier(2)

    def kill():
        barrier.wait()
        worker.kill()

    threads = [threading.Thread(target=kill) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert closes == [1] and not worker.alive and not worker.process.is_alive()


def _browser_environs(worker: psutil.Process) -> list[dict[str, str]]:
    """The environments of a worker's Chromium processes. Chromium starts and ends helper
    processes of its own at any time: one that ends between the listing and the read is skipped."""
    environs = []
    for child in worker.children(recursive=True):
        try:
            if child.name() in ("chromium", "chrome"):
                environs.append(child.environ())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return environs


def test_workers_come_from_the_fork_server_with_the_pools_environment_as_it_is_now(monkeypatch):
    """Pool workers are forked by a fork server that preloaded their imports, not spawned, and they
    take the pool process's environment as it is when they start (a TMPDIR or variable set after
    the server started reaches the browser); ``spawn`` is still there on request."""
    import os

    from envs.pool_worker import worker_context

    with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=0)):
        pass  # the fork server runs from here on, with the environment it started with
    monkeypatch.setenv("STEPWISE_POOL_TEST_MARK", "set-after-the-server-started")
    monkeypatch.setenv("TMPDIR", tempfile.mkdtemp(prefix="pool-env-", dir="/tmp"))
    for method, forked in (("forkserver", True), ("spawn", False)):
        with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=0), start_method=method) as pool:
            (worker,) = pool.status()
            process = psutil.Process(worker["pid"])
            assert (process.ppid() != os.getpid()) == forked, method  # a fork server's child, or ours
            browser_environs = _browser_environs(process)
            assert browser_environs, method
            environ = browser_environs[0]
            assert environ.get("STEPWISE_POOL_TEST_MARK") == "set-after-the-server-started", method
            # the browser's TMPDIR is a folder of its environment's own, made under the pool's TMPDIR
            assert environ.get("TMPDIR", "").startswith(f"{os.environ['TMPDIR']}/stepwise-env-"), method
    assert worker_context().get_start_method() == "forkserver"
    with pytest.raises(ValueError, match="forkserver or spawn"):
        worker_context("fork")
