"""The environment pool's workers as Ray actors: the same pool, its environments on a Ray cluster.

``RayEnvPool`` with ``PoolConfig(backend="ray", ray_address=...)`` keeps ``EnvPool``'s whole
contract (spares, health checks, timeouts, retries on fresh workers, whole episodes or none, every
attempt recorded); only where a worker lives changes. Each worker is an ``EnvHost`` actor that Ray
places on some node of the cluster; the actor starts the pool's ordinary worker process on that node
(``envs.pool_worker.ProcessWorker``: its own process group, a watchdog that kills it and its browser when the
actor dies) and relays the pool's calls to it. So a worker lost with its node (a raylet killed, a
machine gone) ends the same way as a local worker that crashed: its attempt is recorded as
aborted and the episode is run again from the start on another worker.

Where the policy acts depends on the policy. One that can act away from the driver
(``envs.protocol.PortablePolicy``: the scripted policies, the learned CPU policy) runs whole
episodes on the actors: ``run`` puts its snapshot (weights and settings) into Ray's object store
once per call, each attempt at an episode is one actor call that rebuilds the policy from the
snapshot (once per actor and snapshot), runs the episode with ``envs.protocol.run_episode`` against
the actor's own environment worker (the worker still enforces the step and reset timeouts) and
returns the record with the policy's side data for the episode, which the driver absorbs
(``PortablePolicy.absorb``: a learned policy's decisions). Any other policy, a batch run with a
``before_step`` hook (a hook runs in the driver before every step, so those steps must be driven
from here) or ``PoolConfig.ray_episodes_on_actors=False`` keep the policy in the calling process:
one Ray round trip per step. Retries, recorded attempts, whole episodes or none, lost nodes and a
lost head behave the same on both paths. An episode call's Ray timeout is the episode's budget (a
reset, a step timeout per allowed step, a worker start's time for the first rebuild); while it
waits the driver checks the head's port every ``_HEAD_CHECK_S`` seconds. An attempt lost with its
node mid-episode on the actors records the steps it had done as 0 (the driver learns an episode's
progress only when it ends) and says so in its reason. Faults mid-episode are injected per step by
a ``before_step`` hook, and on the actors from inside the episode, by a portable policy whose copy
on the victim node kills that node (``tests/envs/test_ray_pool.py``, ``KillsItsNode``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from envs.pool import BeforeStep, EnvPool
from envs.pool_jobs import (
    BatchResult,
    EnvConfig,
    EpisodeError,
    EpisodeJob,
    PoolConfig,
    PoolError,
    WorkerFailure,
    WorkerTimeout,
    first_line,
    run_job,
)
from envs.pool_worker import PoolWorker, ProcessWorker, RemoteEnv
from envs.protocol import EpisodeContext, EpisodeRecord, NodePolicy, Policy, PortablePolicy
from warehouse.model import ActionType

RAY_NAMESPACE = "stepwise"
_CALL_GRACE_S = 5.0  # a relayed call's own timeout runs in the actor; the round trip gets this much more
# While a whole episode runs on an actor the driver looks at the head this often: a lost head must
# fail the batch before Ray's client gives up on it and ends the process (about a minute).
_HEAD_CHECK_S = 2.0


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise PoolError(f"Ray address {address!r} is not host:port (e.g. 127.0.0.2:6379, the head's --port)")
    return host, int(port)


def connect(address: str, *, node_ip: str | None = None, timeout_s: float = 5.0) -> None:
    """Join the Ray cluster at ``address`` (the head's ``host:port``) as a driver, once per process.

    A head that does not answer is a one-line ``PoolError`` naming the address, raised before any
    worker or episode. The machine the driver runs on must itself be a node of the cluster (Ray
    connects a driver through a local raylet: ``ray start --address <head> --num-cpus 0`` there).
    A process joined to another cluster is refused rather than silently sent there. Ray's habit of
    starting a cluster of its own on the first API call without one is switched off: a worker
    handle outliving ``ray.shutdown`` must fail, not start a stray local cluster.

    ``node_ip`` picks the local raylet where one machine runs several nodes (Ray otherwise takes the
    head's); a process already joined to ``address`` keeps the raylet it joined through. It matters
    when the head is lost: a driver whose own raylet dies with the head is ended by Ray at its next
    call to it (measured: "The connection to the plasma store is failed. Terminate the process."),
    before the pool can fail the batch in one line; a driver on another node lasts until that
    node's raylet gives up on the head (about a minute), long after the pool's check.
    """
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    with contextlib.suppress(ImportError, AttributeError):
        import ray._private.auto_init_hook as auto_init

        auto_init.enable_auto_connect = False
    unreachable = head_unreachable(address, timeout_s=timeout_s)
    if unreachable:
        raise PoolError(f"no Ray cluster at {address}: {unreachable}")
    if ray.is_initialized():
        joined = ray.get_runtime_context().gcs_address
        if joined != address:
            raise PoolError(
                f"this process is joined to the Ray cluster at {joined}, not {address}: one cluster per run"
            )
        return
    try:
        ray.init(
            address=address,
            namespace=RAY_NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
            _node_ip_address=node_ip,
        )
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user needs the address and the reason
        cause = f" ({first_line(exc.__cause__)})" if exc.__cause__ is not None else ""
        raise PoolError(f"could not join the Ray cluster at {address}: {first_line(exc)}{cause}") from None


def disconnect() -> None:
    """Leave the cluster (after a lost head: Ray's client would end the process once it gives up
    reconnecting, about a minute later)."""
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()


def head_unreachable(address: str, *, timeout_s: float = 5.0) -> str | None:
    """Why the head's GCS port does not answer (None when it does): a cheap TCP connect."""
    host, port = _split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return first_line(exc, bare=True)


#: How many times, and how far apart, :func:`head_lost` asks the head before calling it gone.
HEAD_LOST_ATTEMPTS, HEAD_LOST_PAUSE_S = 3, 1.0


def head_lost(
    address: str,
    *,
    attempts: int = HEAD_LOST_ATTEMPTS,
    pause_s: float = HEAD_LOST_PAUSE_S,
    timeout_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Why the head is gone, or None: :func:`head_unreachable` asked ``attempts`` times ``pause_s``
    apart, gone only if no attempt was answered. A pool that calls its cluster lost fails the batch
    and starts nothing more, so one connect that timed out on a loaded head must not decide it."""
    why = None
    for attempt in range(attempts):
        if attempt:
            sleep(pause_s)
        why = head_unreachable(address, timeout_s=timeout_s)
        if why is None:
            return None
    return why


#: Rebuilt policies an actor keeps (the newest snapshots): a batch uses one, and the one before may
#: still be finishing in a batch that overlaps.
_POLICIES_KEPT = 2


class EnvHost:
    """A Ray actor owning one environment worker process on its node (see the module docstring)."""

    def __init__(self, env_config: EnvConfig, worker_id: str, config: PoolConfig) -> None:
        self.worker_id = worker_id
        self.config = config
        self.worker = ProcessWorker(worker_id, env_config, 0, multiprocessing.get_context("spawn"))
        self.policies: OrderedDict[str, NodePolicy] = OrderedDict()  # snapshot's object id -> rebuilt policy
        self.rebuilds = 0
        try:
            self.worker.wait_ready(config.start_timeout_s)
        except BaseException:
            self.worker.kill()
            raise

    def ready(self) -> dict[str, Any]:
        import ray

        return {
            "pid": self.worker.pid,
            "backend": self.worker.backend,
            "supported": sorted(a.value for a in self.worker.supported),
            "scratch": list(self.worker.scratch),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "host_pid": os.getpid(),
        }

    def call(self, op: str, args: tuple[Any, ...], timeout: float) -> tuple[Any, ...]:
        """The worker's answer as data, not as an exception: Ray would wrap an exception in its own."""
        try:
            return ("ok", self.worker.call(op, *args, timeout=timeout))
        except EpisodeError as exc:
            return ("error", "task", str(exc))
        except WorkerTimeout as exc:
            return ("error", "timeout", str(exc))
        except WorkerFailure as exc:
            return ("error", "env", str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. an argument that does not pickle: the worker is suspect
            return ("error", "env", first_line(exc))

    def run_episode(self, snapshot: list[Any], job: EpisodeJob, attempt: int) -> tuple[Any, ...]:
        """A whole episode on this node: the policy rebuilt from ``snapshot[0]`` (an ObjectRef in a
        list, so that Ray hands the reference over instead of resolving it on every call; fetched
        and rebuilt once per snapshot) acting on this actor's environment worker, whose calls keep
        the pool's step and reset timeouts. ``("ok", record, side data)``, or ``("error", kind,
        what, steps done)``: data, not an exception (Ray would wrap an exception in its own)."""
        progress = {"steps": 0}

        def note(step_idx: int) -> None:
            progress["steps"] = step_idx

        try:
            policy = self._policy(snapshot[0])
        except PolicyRebuildError as exc:
            return ("error", "policy", exc, 0)
        except Exception as exc:  # noqa: BLE001 - the snapshot did not arrive: a cluster fault, retry elsewhere
            return ("error", "env", f"the policy's snapshot could not be fetched: {first_line(exc)}", 0)
        try:
            record = run_job(RemoteEnv(self.worker, self.config), policy, job, attempt, self.worker_id, note)
        except Exception as exc:  # noqa: BLE001 - every failure goes back as data (below)
            with contextlib.suppress(Exception):
                policy.episode_output(job.episode_id)  # forget what the failed attempt left on the node
            return _failure(exc, progress["steps"])
        try:
            output = policy.episode_output(job.episode_id)
        except Exception as exc:  # noqa: BLE001 - the policy failed (as it would have in the driver)
            return ("error", "policy", _picklable(exc), progress["steps"])
        return ("ok", record, output)

    def _policy(self, snapshot_ref: Any) -> NodePolicy:
        """The policy of a snapshot, rebuilt on the first episode that uses it."""
        import ray

        key = snapshot_ref.hex()
        policy = self.policies.get(key)
        if policy is None:
            snapshot = ray.get(snapshot_ref, timeout=self.config.start_timeout_s)
            try:
                policy = snapshot.rebuild()
            except Exception as exc:  # noqa: BLE001 - a node that cannot rebuild it: every episode here fails
                raise PolicyRebuildError(f"could not rebuild the policy on this node: {first_line(exc)}") from None
            self.rebuilds += 1
            self.policies[key] = policy
            while len(self.policies) > _POLICIES_KEPT:
                self.policies.popitem(last=False)
        self.policies.move_to_end(key)
        return policy

    def policy_rebuilds(self) -> int:
        """How many snapshots this actor has rebuilt a policy from (tests count them)."""
        return self.rebuilds

    def kill(self) -> None:
        self.worker.kill()  # its process group (the browser) and its scratch folders, on this node

    def close(self, timeout: float) -> None:
        self.worker.close(timeout)


class PolicyRebuildError(RuntimeError):
    """A node could not rebuild a policy from its snapshot (e.g. a package missing there)."""


def _failure(exc: Exception, steps_done: int) -> tuple[Any, ...]:
    """A failed remote episode as ``EnvHost.run_episode`` reports it: the worker's errors by kind
    (the pool's exceptions in the driver), anything else the policy's."""
    if isinstance(exc, EpisodeError):
        return ("error", "task", str(exc), steps_done)
    if isinstance(exc, WorkerTimeout):
        return ("error", "timeout", str(exc), steps_done)
    if isinstance(exc, WorkerFailure):
        return ("error", "env", str(exc), steps_done)
    return ("error", "policy", _picklable(exc), steps_done)


def _picklable(exc: Exception) -> Exception:
    """``exc`` if it survives the trip back to the driver, else a RuntimeError with its first line."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to round-trip counts
        return RuntimeError(first_line(exc))
    return exc


_REMOTE_HOST: Any = None


def _remote_host() -> Any:
    """``EnvHost`` as a Ray actor class (made once; importing this module does not need Ray)."""
    global _REMOTE_HOST
    if _REMOTE_HOST is None:
        import ray

        # max_restarts=0: a lost worker is replaced by the pool (it knows which episode to retry);
        # a restarted actor would come back with a fresh environment the pool knows nothing about.
        _REMOTE_HOST = ray.remote(max_restarts=0, max_task_retries=0)(EnvHost)
    return _REMOTE_HOST


class RayWorker:
    """The pool's handle on one ``EnvHost`` actor: ``envs.pool_worker.ProcessWorker``'s interface over Ray."""

    def __init__(self, worker_id: str, env_config: EnvConfig, config_index: int, config: PoolConfig) -> None:
        self.id = worker_id
        self.config_index = config_index
        self.actor = (
            _remote_host()
            .options(num_cpus=config.ray_cpus_per_worker, scheduling_strategy="SPREAD")
            .remote(env_config, worker_id, config)
        )
        self.config = config
        self.backend = ""
        self.supported: frozenset[ActionType] = frozenset()
        self.scratch: tuple[str, ...] = ()
        self.episodes = 0
        self.alive = True
        self.last_ok = 0.0
        self.task_id: str | None = None
        self.env_pid: int | None = None
        self.node_ip: str | None = None
        self.node_id: str | None = None

    @property
    def pid(self) -> int | None:
        """The environment worker's process id on its node (not unique across machines)."""
        return self.env_pid

    @property
    def node(self) -> str:
        return self.node_ip or "?"

    def is_alive(self) -> bool:
        return self.alive

    def wait_ready(self, timeout: float) -> None:
        # An actor waits for a free CPU on some node, then starts its environment: both count.
        # Watching the head: without it no actor can start, and Ray's client ends this process
        # about a minute after losing it, before a start's timeout would.
        info = self._get(self.actor.ready.remote(), timeout + _CALL_GRACE_S, "start", watch_head=True)
        self.backend = info["backend"]
        self.supported = frozenset(ActionType(a) for a in info["supported"])
        self.scratch = tuple(info["scratch"])
        self.env_pid, self.node_ip, self.node_id = info["pid"], info["node_ip"], info["node_id"]

    def call(self, op: str, *args: Any, timeout: float) -> Any:
        reply = self._get(self.actor.call.remote(op, args, timeout), timeout + _CALL_GRACE_S, op)
        if reply[0] == "ok":
            self.last_ok = time.monotonic()
            return reply[1]
        kind, message = reply[1], reply[2]
        if kind == "task":
            raise EpisodeError(message)
        if kind == "timeout":
            raise WorkerTimeout(f"{message} (node {self.node})")
        raise WorkerFailure(f"{message} (node {self.node})")

    def run_episode(
        self, snapshot_ref: Any, job: EpisodeJob, attempt: int, on_step: Callable[[int], None]
    ) -> tuple[EpisodeRecord, Any]:
        """A whole episode on the actor (``EnvHost.run_episode``): (its record, the policy's side
        data). The call may take the episode's whole budget: a reset (or the replay of a recorded
        prefix), a step per allowed action, and a worker start's time for fetching the snapshot and
        rebuilding the policy on the first episode that uses it. ``on_step`` learns how far a
        failed attempt got (a lost actor cannot say: 0)."""
        replayed = job.start.step if job.start is not None else 0
        budget = (
            self.config.reset_timeout_s
            + self.config.step_timeout_s * (replayed + job.max_steps)
            + self.config.start_timeout_s
        )
        call = self.actor.run_episode.remote([snapshot_ref], job, attempt)
        # A lost actor cannot say how far it got: the attempt's reason says the steps are unknown.
        reply = self._get(call, budget + _CALL_GRACE_S, "episode, steps done unknown", watch_head=True)
        if reply[0] == "ok":
            self.last_ok = time.monotonic()
            return reply[1], reply[2]
        kind, what, steps_done = reply[1], reply[2], reply[3]
        on_step(steps_done)
        if kind == "policy":
            self.last_ok = time.monotonic()  # the worker answered; the policy failed, as it would have here
            raise what
        if kind == "task":
            self.last_ok = time.monotonic()
            raise EpisodeError(what)
        if kind == "timeout":
            raise WorkerTimeout(f"{what} (node {self.node})")
        raise WorkerFailure(f"{what} (node {self.node})")

    def policy_rebuilds(self) -> int:
        """How many policy snapshots the actor has rebuilt a policy from."""
        return int(self._get(self.actor.policy_rebuilds.remote(), self.config.health_timeout_s, "policy_rebuilds"))

    def _get(self, ref: Any, timeout: float, op: str, *, watch_head: bool = False) -> Any:
        """The call's reply, or the pool's exception. ``watch_head``: a long call (a whole episode)
        is waited for in slices, the head's port checked between them."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    return ray.get(ref, timeout=max(0.0, min(left, _HEAD_CHECK_S) if watch_head else left))
                except GetTimeoutError:
                    if not watch_head or time.monotonic() >= deadline:
                        raise
                gone = head_lost(self.config.ray_address or "", timeout_s=1.0)
                if gone:
                    raise WorkerFailure(
                        f"worker {self.id} ({op}, node {self.node}): the Ray cluster's head at "
                        f"{self.config.ray_address} is gone ({gone})"
                    )
        except GetTimeoutError:
            raise WorkerTimeout(f"{op} timed out after {timeout:g} s on worker {self.id} (node {self.node})") from None
        except RayActorError as exc:
            raise WorkerFailure(f"worker {self.id} is gone ({op}, node {self.node}): {_actor_death(exc)}") from None
        except RayError as exc:  # the object store, the local raylet, a system error: the worker is lost to us
            raise WorkerFailure(f"worker {self.id} ({op}, node {self.node}): {first_line(exc)}") from None

    def descendants(self) -> list[Any]:
        """The environment worker process itself and what it started (unlike a local worker's list,
        which starts below the worker), where this machine can see them (a loopback cluster:
        fault injection in tests); none on another machine."""
        import psutil

        if self.env_pid is None or not (self.node_ip or "").startswith("127."):
            return []
        try:
            root = psutil.Process(self.env_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def kill(self) -> None:
        """End the worker now: its environment's process group first (on its node), then the actor."""
        import ray

        self.alive = False
        if not ray.is_initialized():
            return  # the driver left the cluster (its actors went with the job)
        with contextlib.suppress(Exception):
            ray.get(self.actor.kill.remote(), timeout=10)
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def close(self, timeout: float = 10.0) -> None:
        import ray

        if not ray.is_initialized():
            self.alive = False
            return
        if self.alive:
            with contextlib.suppress(Exception):
                ray.get(self.actor.close.remote(timeout), timeout=timeout + _CALL_GRACE_S)
        self.alive = False
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class _OnTheActors:
    """A portable policy during one ``RayEnvPool.run``: its snapshot goes into Ray's object store
    once, when the first episode needs it, and every episode of the batch refers to that copy."""

    def __init__(self, policy: PortablePolicy) -> None:
        self.policy = policy
        self._ref: Any = None
        self._lock = threading.Lock()  # the pool's slot threads ask at once

    @property
    def policy_id(self) -> str:
        return self.policy.policy_id

    def start(self, context: EpisodeContext) -> Any:
        return self.policy.start(context)

    def snapshot_ref(self) -> Any:
        """The snapshot's ObjectRef (put on the first call). A policy that cannot make its snapshot
        raises as a policy would; an object store that does not take it is a cluster fault."""
        import ray
        from ray.exceptions import RayError

        with self._lock:
            if self._ref is None:
                snapshot = self.policy.portable()
                try:
                    self._ref = ray.put(snapshot)
                except RayError as exc:
                    raise WorkerFailure(f"the policy's snapshot could not be stored: {first_line(exc)}") from None
            return self._ref


class RayEnvPool(EnvPool):
    """``EnvPool`` whose workers are ``EnvHost`` actors on the Ray cluster at ``config.ray_address``;
    a portable policy's episodes run on the actors (the module docstring)."""

    def run(
        self,
        jobs: Sequence[EpisodeJob],
        policy: Policy,
        *,
        on_episode: Callable[[EpisodeRecord | None, int, int], None] | None = None,
        before_step: BeforeStep | None = None,
    ) -> BatchResult:
        """``EnvPool.run``; a portable policy without a ``before_step`` hook runs its episodes on
        the actors, its snapshot put into the object store once for the whole batch."""
        if self.config.ray_episodes_on_actors and before_step is None and isinstance(policy, PortablePolicy):
            policy = _OnTheActors(policy)
        return super().run(jobs, policy, on_episode=on_episode, before_step=before_step)

    def _run_attempt(
        self, worker: PoolWorker, job: EpisodeJob, attempt: int, policy: Policy, on_step: Callable[[int], None]
    ) -> EpisodeRecord:
        if not isinstance(policy, _OnTheActors):
            return super()._run_attempt(worker, job, attempt, policy, on_step)
        assert isinstance(worker, RayWorker)
        record, output = worker.run_episode(policy.snapshot_ref(), job, attempt, on_step)
        policy.policy.absorb(job.episode_id, output)
        return record

    def _connect(self) -> None:
        connect(self.config.ray_address or "")  # an unreachable head: one line, before any worker

    def _new_worker(self, worker_id: str, index: int) -> PoolWorker:
        return RayWorker(worker_id, self._configs[index], index, self.config)

    def _lost_cluster(self) -> bool:
        """Was the lost worker the head? Ray's client ends this process about a minute after
        losing the head, so the batch must not wait for replacements that cannot come."""
        unreachable = head_lost(self.config.ray_address or "")
        if unreachable:
            self._cluster_lost = unreachable
        return unreachable is not None

    def _fail_if_cluster_lost(self, not_run: int, total: int) -> None:
        """A batch that lost episodes on a cluster whose head is gone fails as a whole: nothing of it
        is returned to be published (workers on other nodes may have finished theirs, but the
        cluster cannot replace a worker without its head, so a rerun is the only way to finish)."""
        address = self.config.ray_address or ""
        unreachable = self._cluster_lost or head_lost(address)
        if unreachable:
            self.close()
            disconnect()
            raise PoolError(
                f"the Ray cluster's head at {address} is gone ({unreachable}): {not_run} of {total} episodes "
                "could not run and none of the batch is returned; run it again when the cluster is back"
            )


def make_pool(env_configs: Any, config: PoolConfig, **kwargs: Any) -> EnvPool:
    """The pool ``config.backend`` names: ``EnvPool`` (local) or ``RayEnvPool``."""
    return (RayEnvPool if config.backend == "ray" else EnvPool)(env_configs, config, **kwargs)


def _actor_death(exc: BaseException) -> str:
    """Ray's reason an actor died, in one line (its message spans the actor's id, namespace, node)."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("The actor died because") or "node has died" in line or "start failed" in line:
            return line[:300]
    for line in text.splitlines():
        if "could not start the environment" in line or "did not start within" in line:
            return line.strip()[:300]
    return first_line(exc)


def _call(function: Callable[[Any], Any], item: Any) -> Any:
    return function(item)


def map_on_cluster(address: str, function: Callable[[Any], Any], items: Sequence[Any], *, cpus: float = 1.0) -> list:
    """``[function(item) for item in items]``, each call a Ray task on the cluster at ``address``
    (``function`` must pickle: a module-level function or a ``functools.partial`` of one). Every
    task runs to its end; the first failure, in the order of ``items``, is raised as one line
    naming its item (the others' results are lost to the caller, their side effects are not)."""
    import ray
    from ray.exceptions import RayError, RayTaskError

    connect(address)
    available = ray.cluster_resources().get("CPU", 0.0)
    if available < cpus:
        raise PoolError(f"the Ray cluster at {address} has {available:g} CPUs; a task needs {cpus:g}")
    remote = ray.remote(num_cpus=cpus, max_retries=0)(_call)
    refs = [remote.remote(function, item) for item in items]
    results, failures = [], []
    for item, ref in zip(items, refs, strict=True):
        try:
            results.append(ray.get(ref))
        except RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            failures.append(f"{item}: {first_line(cause)}")
        except RayError as exc:
            failures.append(f"{item}: {first_line(exc)}")
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(items)} tasks failed; first {failures[0]}")
    return results
