"""The environment pool on a real Ray cluster: two nodes on loopback (each its own ``ray start``,
raylet and worker processes), Chromium workers as actors, and a node killed mid-batch.

Faults are injected two ways. A ``before_step`` hook runs in the driver, so a batch with one drives
every step from the driver (the per-step path). Episodes that run whole on the actors (a portable
policy, no hook) get their fault from inside: :class:`KillsItsNode`, a portable expert whose
rebuilt copy on the victim node kills that node's Ray processes (or the head) before a given step
of the episode it is running there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray

from envs.miniwob.live import MiniWoBConfig
from envs.policies import NoisyExpertPolicy, make_policy
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig, PoolError, plan_jobs
from envs.protocol import EpisodeContext, PortablePolicy, StatelessSnapshot
from envs.ray_local import LocalRayCluster
from envs.ray_pool import RayEnvPool
from envs.task_catalog import load_catalog
from tests.envs.test_pool import assert_nothing_lost_or_duplicated

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    """Head 127.0.0.2 (2 CPUs: room for a replacement worker) and a second node 127.0.0.3 (1 CPU)."""
    with LocalRayCluster(cpus=(2, 1)) as running:
        yield running
        ray.shutdown()
    assert running.processes() == []  # nothing of the cluster outlives it (Ray's detached client server too)


@pytest.fixture(scope="module")
def jobs():
    catalog = load_catalog(fresh=True)
    return plan_jobs([catalog["login-user-popup"], catalog["click-option"]], batch="ray", episodes_per_task=2)


def _head_node_id(cluster) -> str:
    """The Ray node id of the cluster's head (127.0.0.2), read from the GCS's node table."""
    (head,) = [node["NodeID"] for node in ray.nodes() if node["NodeManagerAddress"] == cluster.node_ips[0]]
    return str(head)


def wait_for_free_cpus(cluster, timeout_s: float = 60.0) -> None:
    """Until the previous test's actors have given their CPUs back."""
    from envs.ray_pool import connect

    connect(cluster.address)
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        assert time.monotonic() < deadline, "the cluster's CPUs were not released"
        time.sleep(0.5)


def ray_config(cluster, **kw) -> PoolConfig:
    return PoolConfig(**({"backend": "ray", "ray_address": cluster.address, "spares": 0, "start_timeout_s": 120} | kw))


def trace(result) -> dict[str, Any]:
    """Every episode as the warehouse would store it, less what differs between two runs of the
    same episode by nature: clocks (MiniWoB++'s decayed reward is one) and the worker that ran it."""

    def steps(episode):
        return [
            (s.step_idx, s.screen, s.action, s.env_reward, s.milestones_hit, s.done, s.problem) for s in episode.steps
        ]

    return {
        e.episode_id: (
            e.task_id,
            e.family,
            e.instruction,
            e.seed,
            e.policy_id,
            e.backend,
            steps(e),
            e.final_screen,
            dict(e.fields),
            dict(e.slots),
            e.success,
            e.outcome_reward,
            e.end_reason,
            e.milestones_reached,
            e.attempt,
            e.spec_digest,
        )
        for e in result.episodes
    }


@dataclass(frozen=True)
class PerStepOnly:
    """A policy without ``envs.protocol.PortablePolicy``: the driver keeps it, each step a round trip."""

    inner: Any

    @property
    def policy_id(self) -> str:
        return self.inner.policy_id

    def start(self, context: EpisodeContext):
        return self.inner.start(context)


@contextlib.contextmanager
def counting_puts():
    """Count ``ray.put`` calls of this process (the pool puts a policy's snapshot with it)."""
    real, puts = ray.put, []

    def put(value, **kw):
        puts.append(type(value).__name__)
        return real(value, **kw)

    ray.put = put
    try:
        yield puts
    finally:
        ray.put = real


@dataclass(frozen=True)
class KillsItsNode:
    """A portable expert (its own snapshot) whose copy rebuilt on the node ``victim`` kills that
    node before step ``step`` of the first episode it runs there, from inside the episode: the
    node's raylet and Ray's worker processes, the actor running the episode last
    (``ray_processes_only``: the environment process and its Chromium are left to end by
    themselves), or the whole node and the cluster's GCS (``head``). The first copy to fire creates
    ``marker`` (so only one fires) and writes what it killed and what it left there."""

    cluster: LocalRayCluster
    victim: str
    marker: str
    step: int = 2
    head: bool = False
    inner: NoisyExpertPolicy = field(default_factory=NoisyExpertPolicy)

    @property
    def policy_id(self) -> str:
        return self.inner.policy_id

    def start(self, context: EpisodeContext):
        return self.inner.start(context)  # in the driver nothing is killed

    def portable(self) -> KillsItsNode:
        return self

    def rebuild(self) -> _KillsItsNodeThere:
        return _KillsItsNodeThere(self)

    def absorb(self, episode_id: str, output: Any) -> None:
        pass

    def fire(self, episode_id: str) -> None:
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        me = psutil.Process()
        left = [p.pid for p in me.children(recursive=True)]  # the environment process and its browser
        raylet = self.cluster.raylet(self.victim)
        victims = [raylet, *raylet.children(recursive=self.head)]
        if self.head:
            victims += [p for p in self.cluster.processes() if p.name() == "gcs_server"]
        with os.fdopen(fd, "w") as out:
            json.dump({"episode_id": episode_id, "left": left, "killed": [p.pid for p in victims]}, out)
        for process in sorted(victims, key=lambda process: process.pid == me.pid):  # this process last
            with contextlib.suppress(psutil.Error):
                process.kill()


@dataclass(frozen=True)
class _KillsItsNodeThere:
    plan: KillsItsNode

    @property
    def policy_id(self) -> str:
        return self.plan.policy_id

    def start(self, context: EpisodeContext):
        return _KillingActor(self.plan, self.plan.inner.start(context), context.episode_id)

    def episode_output(self, episode_id: str) -> None:
        return None


class _KillingActor:
    def __init__(self, plan: KillsItsNode, inner: Any, episode_id: str) -> None:
        self.plan, self.inner, self.episode_id, self.steps = plan, inner, episode_id, 0

    def act(self, screen):
        if self.steps == self.plan.step and ray.util.get_node_ip_address() == self.plan.victim:
            self.plan.fire(self.episode_id)
        self.steps += 1
        return self.inner.act(screen)

    def observe(self, action, result) -> None:
        self.inner.observe(action, result)


def rebuilds(pool) -> dict[str, int]:
    """Policies rebuilt from a snapshot so far, per live worker actor."""
    return {worker_id: worker.policy_rebuilds() for worker_id, worker in pool._all.items()}


def test_episodes_run_on_both_nodes_and_match_the_local_pool(cluster, jobs):
    """The same jobs and policy on the local pool and on the cluster, whole episodes on the actors
    (the expert is portable: its snapshot put once per batch, rebuilt once per actor and batch)
    and step by step from the driver (a policy without the protocol): the same episodes, and the
    cluster's workers sit on both nodes."""
    expert = make_policy("expert")
    assert isinstance(expert, PortablePolicy) and not isinstance(PerStepOnly(expert), PortablePolicy)
    with RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2)) as pool:
        with counting_puts() as puts:
            on_actors = pool.run(jobs, expert)
            after_first = rebuilds(pool)
            again = pool.run(jobs, expert)
            after_second = rebuilds(pool)
            per_step = pool.run(jobs, PerStepOnly(expert))
            after_per_step = rebuilds(pool)
        nodes = {w["node"] for w in pool.status()}
        ran = {e.worker_id for e in on_actors.episodes}
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        local = pool.run(jobs, expert)
    assert nodes == {"127.0.0.2", "127.0.0.3"}
    digests = {job.episode_id: job.task.milestone_digest for job in jobs}
    assert {e.episode_id: e.spec_digest for e in on_actors.episodes} == digests  # it travels back from the actors
    for result in (on_actors, again, per_step):
        assert_nothing_lost_or_duplicated(result, jobs)
        assert trace(result) == trace(local)
    assert puts == ["StatelessSnapshot", "StatelessSnapshot"]  # one per batch on the actors, none step by step
    assert after_first == {w: int(w in ran) for w in after_first} and ran == set(after_first)
    ran_again = {e.worker_id for e in again.episodes}
    assert after_second == {w: n + int(w in ran_again) for w, n in after_first.items()}  # a new batch: a new snapshot
    assert after_per_step == after_second


def test_the_learned_policy_samples_the_same_episodes_and_decisions_on_the_actors(cluster, jobs):
    """RL sampling (temperature 1, decisions recorded) on the local pool and on the actors, the
    same weights in two models with caches of their own: identical episodes, and decisions that
    agree bit for bit (chosen candidates, log-probabilities, features, and the encodings and texts
    behind their rows), the actors' encodings filed into the driver's cache without encoding
    anything there."""
    from training.policy.learned import LearnedPolicy, PolicyModel

    here = PolicyModel(seed=3)
    there = PolicyModel(seed=3, encoder=here.encoder)  # the same weights; a cache of its own
    sampled_here = LearnedPolicy(here, policy_id="sampler", record=True)
    sampled_there = LearnedPolicy(there, policy_id="sampler", record=True)
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        local = pool.run(jobs, sampled_here)
    wait_for_free_cpus(cluster)
    with RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2)) as pool:
        with counting_puts() as puts:
            on_actors = pool.run(jobs, sampled_there)
        assert sum(rebuilds(pool).values()) == len({e.worker_id for e in on_actors.episodes})
    assert puts == ["LearnedPolicySnapshot"]
    assert_nothing_lost_or_duplicated(on_actors, jobs)
    assert trace(on_actors) == trace(local)
    assert there.cache.misses == 0 and len(there.cache) > 0  # every encoding came from the nodes
    text_here = {row: text for text, row in here.cache._index.items()}
    text_there = {row: text for text, row in there.cache._index.items()}
    assert set(sampled_there.decisions) == set(sampled_here.decisions) == {j.episode_id for j in jobs}
    for episode_id, decisions in sampled_here.decisions.items():
        theirs = sampled_there.decisions[episode_id]
        assert decisions, episode_id
        for mine, other in zip(decisions, theirs, strict=True):
            assert (mine.chosen, mine.logp, mine.action_texts, mine.actions) == (
                other.chosen,
                other.logp,
                other.action_texts,
                other.actions,
            )
            assert mine.features.tobytes() == other.features.tobytes()
            rows_here = [mine.instruction, mine.history, *mine.candidates.tolist()]
            rows_there = [other.instruction, other.history, *other.candidates.tolist()]
            assert [text_here[r] for r in rows_here] == [text_there[r] for r in rows_there]
            assert here.cache.matrix[rows_here].tobytes() == there.cache.matrix[rows_there].tobytes()


@dataclass(frozen=True)
class FailsAtStep:
    """A portable expert whose actor raises before step ``step`` of the episode ``episode_id``."""

    episode_id: str
    step: int = 1
    inner: NoisyExpertPolicy = field(default_factory=lambda: NoisyExpertPolicy(noise=0.0, skip=0.0, typo=0.0))

    @property
    def policy_id(self) -> str:
        return self.inner.policy_id

    def start(self, context: EpisodeContext):
        return _FailingActor(self, self.inner.start(context), context.episode_id)

    def portable(self) -> StatelessSnapshot:
        return StatelessSnapshot(self)

    def absorb(self, episode_id: str, output: Any) -> None:
        pass


class _FailingActor:
    def __init__(self, plan: FailsAtStep, inner: Any, episode_id: str) -> None:
        self.plan, self.inner, self.episode_id, self.steps = plan, inner, episode_id, 0

    def act(self, screen):
        if self.episode_id == self.plan.episode_id and self.steps == self.plan.step:
            raise ValueError(f"a policy bug at step {self.steps}")
        self.steps += 1
        return self.inner.act(screen)

    def observe(self, action, result) -> None:
        self.inner.observe(action, result)


def test_a_policy_failing_on_the_actors_is_recorded_as_in_the_driver(cluster, jobs):
    """A portable policy that raises mid-episode: on the actors as on the local pool, that episode's
    only attempt is aborted, final, with the same one-line reason and steps done; the batch goes on."""
    wait_for_free_cpus(cluster)
    policy = FailsAtStep(jobs[0].episode_id)
    with RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2)) as pool:
        on_actors = pool.run(jobs, policy)
        assert sum(rebuilds(pool).values()) >= 1  # it did run on the actors
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        local = pool.run(jobs, policy)

    def failed(result):
        return [(a.attempt, a.final, a.reason, a.steps_done) for a in result.attempts if a.status == "aborted"]

    reason = "policy error: ValueError: a policy bug at step 1"
    assert failed(on_actors) == failed(local) == [(0, True, reason, 1)]
    assert [job.episode_id for job, _ in on_actors.lost] == [jobs[0].episode_id]
    assert trace(on_actors) == trace(local) and len(on_actors.episodes) == len(jobs) - 1


def test_the_rollouts_asset_runs_on_the_cluster_when_the_resource_says_so(cluster, tmp_path):
    """``resources.env_pool.config.backend: ray``: the rollouts asset materializes as it does locally,
    its checks pass, and the lineage row records where the episodes ran."""
    from dagster import DagsterInstance, MultiPartitionKey, materialize

    from assets.resources import EnvPoolResource, WarehouseResource
    from assets.rollouts import rollouts
    from tests.assets.test_rollouts import NOISY_FORMS_BATCH, _checks_for
    from warehouse.catalog import Warehouse

    result = materialize(
        [rollouts, *_checks_for("rollouts")],
        resources={
            "warehouse": WarehouseResource(home=str(tmp_path / "home")),
            "env_pool": EnvPoolResource(backend="ray", ray_address=cluster.address, spares=0),
        },
        partition_key=MultiPartitionKey({"family": "miniwob-forms", "batch": "b01"}),
        run_config=NOISY_FORMS_BATCH,  # the local pool's asset test's batch: successes and failures
        instance=DagsterInstance.ephemeral(),
    )
    failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
    assert result.success and failed == [], failed
    store = Warehouse(tmp_path / "home")
    assert store.query("SELECT count(*) AS n FROM episodes").to_pylist()[0]["n"] == 9
    parameters = json.loads(
        store.query("SELECT parameters FROM lineage_materializations WHERE asset = 'rollouts'").to_pylist()[0][
            "parameters"
        ]
    )
    assert parameters["pool_backend"] == "ray" and parameters["ray_address"] == cluster.address


def test_a_node_lost_mid_batch_loses_no_episode(cluster, jobs):
    """Step by step from the driver (a ``before_step`` hook injects the fault): the second node's
    raylet and Ray's worker processes there (the actors) are killed before step 2 of an episode
    running there: that attempt is recorded as aborted, the episode runs again whole on a worker of
    the head, and the lost worker's environment process and Chromium, which nobody killed, end by
    themselves (their watchdog sees the actor gone)."""
    lost = {}
    wait_for_free_cpus(cluster)  # placement spreads the workers over both nodes only if both are free
    fired: list[tuple[str, str]] = []  # (worker, episode) where the node was killed
    lock = threading.Lock()  # slots call the hook from their own threads, possibly at once

    def kill_second_node(ctx):
        if ctx.attempt != 0 or ctx.step_idx != 2:
            return
        with lock:
            worker = ctx.pool._all[ctx.worker_id]
            if fired or worker.node != "127.0.0.3":
                return
            lost["browser"] = [p.pid for p in worker.descendants()]
            lost["node"] = cluster.kill_node("127.0.0.3", ray_processes_only=True)
            fired.append((ctx.worker_id, ctx.job.episode_id))

    with RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2, step_timeout_s=20)) as pool:
        result = pool.run(jobs, make_policy("noisy_expert"), before_step=kill_second_node)
    assert fired, "an episode ran on the second node and the node was killed"
    killed_worker, target = fired[0]
    assert_nothing_lost_or_duplicated(result, jobs)
    attempts = [a for a in result.attempts if a.episode_id == target]
    assert [(a.attempt, a.status) for a in attempts] == [(0, "aborted"), (1, "completed")]
    aborted, retried = attempts
    assert aborted.worker_id == killed_worker and retried.worker_id != aborted.worker_id
    assert aborted.steps_done == 2 and "127.0.0.3" in aborted.reason and "\n" not in aborted.reason
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(pid) for pid in lost["browser"]) and time.monotonic() < deadline:
        time.sleep(0.5)  # the worker's watchdog sees its actor gone and ends its process group
    alive = [pid for pid in lost["browser"] if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert lost["browser"] and not set(lost["browser"]) & set(lost["node"]) and not alive


def test_a_node_lost_mid_episode_on_the_actors_loses_no_episode(jobs, tmp_path):
    """Whole episodes on the actors: the second node's raylet and Ray's worker processes there are
    killed from inside an episode running there, before its step 2. The attempt is recorded as
    aborted (steps done unknown to the driver: 0, and its reason says so), the episode runs again
    whole on a worker of the head, and the environment process and Chromium the lost actor left
    end by themselves. A cluster of its own: the module's lost its second node in the test above."""
    marker = tmp_path / "fired.json"
    ray.shutdown()  # one cluster per process: leave the module's
    with LocalRayCluster(cpus=(2, 1)) as own:
        policy = KillsItsNode(own, victim="127.0.0.3", marker=str(marker))
        with RayEnvPool(MiniWoBConfig(), ray_config(own, workers=2, step_timeout_s=20)) as pool:
            result = pool.run(jobs, policy)
            on_head = {w["worker_id"] for w in pool.status() if w["node"] == "127.0.0.2"}
        ray.shutdown()
    assert marker.exists(), "an episode ran on the second node and the node was killed"
    fired = json.loads(marker.read_text())
    assert_nothing_lost_or_duplicated(result, jobs)
    attempts = [a for a in result.attempts if a.episode_id == fired["episode_id"]]
    assert [(a.attempt, a.status) for a in attempts] == [(0, "aborted"), (1, "completed")]
    aborted, retried = attempts
    assert retried.worker_id in on_head and retried.worker_id != aborted.worker_id
    assert aborted.steps_done == 0 and "steps done unknown" in aborted.reason
    assert "127.0.0.3" in aborted.reason and "\n" not in aborted.reason
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(pid) for pid in fired["left"]) and time.monotonic() < deadline:
        time.sleep(0.5)  # the worker's watchdog sees its actor gone and ends its process group
    alive = [pid for pid in fired["left"] if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert fired["left"] and not set(fired["left"]) & set(fired["killed"]) and not alive


def test_an_unreachable_cluster_is_one_line_naming_the_address_before_any_worker():
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    pool = RayEnvPool(MiniWoBConfig(), PoolConfig(backend="ray", ray_address=f"127.0.0.2:{port}", spares=0))
    with pytest.raises(PoolError) as refused:
        pool.start()
    message = str(refused.value)
    assert message.startswith(f"no Ray cluster at 127.0.0.2:{port}") and "\n" not in message
    assert pool.status() == [] and pool.workers_started == 0


def test_the_ray_backend_needs_an_address():
    with pytest.raises(ValueError, match="needs ray_address"):
        PoolConfig(backend="ray")
    with pytest.raises(ValueError, match="unknown pool backend 'kubernetes'"):
        PoolConfig(backend="kubernetes")


def _lose_the_head(cluster: LocalRayCluster, path: str, marker: str) -> dict[str, Any]:
    """Run in a child process (``python -c``): join ``cluster`` through its second node, as docs/ray.md
    deploys a driver, start a pool of two workers, lose the head (its GCS and raylet) on ``path``,
    and report what the caller saw. Ray ends a process whose cluster is gone, so this never runs in
    the pytest worker: a regression here fails the test, not the worker with all its other tests."""
    from envs.ray_pool import connect

    connect(cluster.address, node_ip=cluster.node_ips[1])
    own_node = ray.get_runtime_context().get_node_id()
    seen: dict[str, Any] = {"joined_through_the_head": own_node == _head_node_id(cluster)}
    killed: list[int] = []

    def kill_head(ctx=None) -> None:
        if not killed and (ctx is None or ctx.step_idx == 2):
            killed.extend(cluster.kill_node("127.0.0.2"))
            for process in cluster.processes():
                if process.name() == "gcs_server":
                    process.kill()

    catalog = load_catalog(fresh=True)
    jobs = plan_jobs([catalog["login-user-popup"], catalog["click-option"]], batch="ray", episodes_per_task=2)
    returned = None
    # between batches with a spare (the env_pool resource's default): a spare on the surviving node
    # must not carry the batch on once the head is known to be gone
    spares = 1 if path == "between batches" else 0
    pool = RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2, spares=spares, step_timeout_s=10))
    try:
        with pool:
            if path == "per step":
                returned = pool.run(jobs, make_policy("expert"), before_step=kill_head)
            elif path == "on the actors":
                returned = pool.run(jobs, KillsItsNode(cluster, victim="127.0.0.2", marker=marker, head=True))
            else:  # between batches: a long-lived pool (an RL run's) whose head goes while it is idle
                seen["first_batch"] = len(pool.run(jobs[:2], make_policy("expert")).episodes)
                kill_head()
                returned = pool.run(jobs, make_policy("expert"))
    except PoolError as exc:
        seen["error"] = str(exc)
    seen |= {"killed": bool(killed) or os.path.exists(marker), "returned": returned is not None}
    return seen | {"still_joined": ray.is_initialized()}


@pytest.mark.parametrize("path", ["per step", "on the actors", "between batches"])
def test_losing_the_head_fails_the_batch_in_one_line_and_returns_nothing(cluster, tmp_path, path):
    """The head (its GCS and raylet) killed mid-batch: the second node's worker may finish its
    episode, but none can be replaced without a head, so the batch stops at the first lost worker
    and fails as a whole with a one-line error naming the address; nothing of it reaches the caller
    to be published, and the driver has left the dead cluster (Ray would end the process about a
    minute after losing the head). Per step the driver's hook kills the head; on the actors an
    episode on the head kills it, and the driver, waiting for whole episodes, notices by watching
    the head's port; between batches the pool finds the head's worker dead at its health check and
    must not wait for a replacement that cannot start (it once did, past Ray's minute, and Ray
    ended the process: it took this test's xdist worker with it).

    The driver runs in a child process joined through the second node's raylet (a driver whose
    raylet is the head's is ended by Ray at its next call to that raylet)."""
    from envs.ray_pool import connect

    connect(cluster.address)  # this process is joined to the module's cluster
    with LocalRayCluster(cpus=(2, 1)) as other:
        with pytest.raises(PoolError, match=f"joined to the Ray cluster at {cluster.address}, not {other.address}"):
            connect(other.address)  # one cluster per process: refused, not silently sent to the first
        marker, report = tmp_path / "fired.json", tmp_path / "seen.json"
        child = (
            "import json, sys; from tests.envs import test_ray_pool as t; "
            "cluster, path, marker, report = t.LocalRayCluster(**json.loads(sys.argv[1])), *sys.argv[2:]; "
            "open(report, 'w').write(json.dumps(t._lose_the_head(cluster, path, marker)))"
        )
        spec = {"cpus": list(other.cpus), "address": other.address, "node_ips": other.node_ips}
        spec["temp_dir"] = str(other.temp_dir)
        done = subprocess.run(
            [sys.executable, "-c", child, json.dumps(spec), path, str(marker), str(report)],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=300,
        )
    tail = " / ".join((done.stderr or "").strip().splitlines()[-3:])
    assert done.returncode == 0 and report.exists(), f"the driver process ended with {done.returncode}: {tail}"
    seen = json.loads(report.read_text())
    assert not seen["joined_through_the_head"] and seen["killed"] and not seen["returned"]
    assert seen.get("first_batch", 2) == 2 and not seen["still_joined"]
    message = seen.get("error", "")
    assert message.startswith(f"the Ray cluster's head at {other.address} is gone") and "\n" not in message
