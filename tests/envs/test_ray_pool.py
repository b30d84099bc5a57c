"""The environment pool on a real Ray cluster: two nodes on loopback (each its own ``ray start``,
raylet and worker processes), Chromium workers as actors, and a node killed mid-batch."""

from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest
import ray

from envs.miniwob.live import MiniWoBConfig
from envs.policies import make_policy
from envs.pool import EnvPool, PoolConfig, PoolError, plan_jobs
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


def test_episodes_run_on_both_nodes_and_match_the_local_pool(cluster, jobs):
    """The same jobs and policy on the local pool and on the cluster: the same episodes, and the
    cluster's workers sit on both nodes."""
    with RayEnvPool(MiniWoBConfig(), ray_config(cluster, workers=2)) as pool:
        on_ray = pool.run(jobs, make_policy("expert"))
        nodes = {w["node"] for w in pool.status()}
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        local = pool.run(jobs, make_policy("expert"))
    assert nodes == {"127.0.0.2", "127.0.0.3"}
    assert_nothing_lost_or_duplicated(on_ray, jobs)

    def trace(result):
        def actions(episode):
            return [(s.action.type, s.action.target.ref if s.action.target else None) for s in episode.steps]

        return {e.episode_id: (e.success, actions(e)) for e in result.episodes}

    assert trace(on_ray) == trace(local)


def test_the_rollouts_asset_runs_on_the_cluster_when_the_resource_says_so(cluster, tmp_path):
    """``resources.env_pool.config.backend: ray``: the rollouts asset materializes as it does locally,
    its checks pass, and the lineage row records where the episodes ran."""
    import json

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
    """The second node's raylet and Ray's worker processes there (the actors) are killed before
    step 2 of an episode running there: that attempt is recorded as aborted, the episode runs again
    whole on a worker of the head, and the lost worker's environment process and Chromium, which
    nobody killed, end by themselves (their watchdog sees the actor gone)."""
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


def test_losing_the_head_fails_the_batch_in_one_line_and_returns_nothing(cluster, jobs):
    """The head (its GCS and raylet) killed mid-batch: the second node's worker may finish its
    episode, but none can be replaced without a head, so the batch stops at the first lost worker
    and fails as a whole with a one-line error naming the address; nothing of it reaches the caller
    to be published, and the driver has left the dead cluster (Ray would end the process later)."""
    from envs.ray_pool import connect

    connect(cluster.address)  # this process is joined to the module's cluster
    with LocalRayCluster(cpus=(2, 1)) as other:
        with pytest.raises(PoolError, match=f"joined to the Ray cluster at {cluster.address}, not {other.address}"):
            connect(other.address)  # one cluster per process: refused, not silently sent to the first
        ray.shutdown()
        killed = []

        def kill_head(ctx):
            if not killed and ctx.step_idx == 2:
                killed.extend(other.kill_node("127.0.0.2"))
                for process in other.processes():
                    if process.name() == "gcs_server":
                        process.kill()

        returned = None
        pool = RayEnvPool(MiniWoBConfig(), ray_config(other, workers=2, step_timeout_s=10))
        with pytest.raises(PoolError) as failed:
            with pool:
                returned = pool.run(jobs, make_policy("expert"), before_step=kill_head)
        assert not ray.is_initialized()
    message = str(failed.value)
    assert killed and returned is None
    assert message.startswith(f"the Ray cluster's head at {other.address} is gone") and "\n" not in message
