"""A fault-tolerant pool of environment workers: N active plus warm spares.

GUI-Shepherd (App. B.1) ran 16 emulators and kept 8 as backups, because GUI environments die:
browsers crash, devices drop off the network, pages hang. This pool does the same for any
``envs.protocol`` environment:

* every worker is its own process (its own session, so the worker and the browser or adb
  processes it starts can be killed as one group), driven over a pipe by a thread of the parent;
* ``workers`` workers run episodes at once; ``spares`` more are started and kept ready, so a dead
  worker is replaced at once while another spare starts in the background;
* a worker is health-checked (a cheap probe) before every episode it takes;
* every call has a timeout (``step_timeout_s`` per step, ``reset_timeout_s`` per reset): a step
  that hangs past it gets its worker killed;
* an episode whose worker dies or hangs is recorded as an *aborted attempt* (with the reason and
  how far it got) and retried from the start, same task and seed, on a fresh worker, up to
  ``max_attempts`` times. An episode is returned whole or not at all: never half.

Policies run in the parent (``envs.policies``; learned policies keep their model in one process);
environments run in the workers (on the Ray backend a portable policy runs whole episodes next to
them instead: ``envs.ray_pool``). ``run`` returns a ``BatchResult``: completed episodes (one per
job at most), every attempt, and the jobs that could not be completed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from envs.pool_jobs import (
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    AttemptRecord,
    BatchResult,
    EnvConfig,
    EpisodeError,
    EpisodeJob,
    PoolConfig,
    PoolError,
    WorkerFailure,
    first_line,
    run_job,
)
from envs.pool_worker import PoolWorker, ProcessWorker, RemoteEnv, worker_context
from envs.protocol import (
    EpisodeRecord,
    Policy,
)

HEALTH_FRESH_S = 2.0  # a worker that answered this recently is not probed again before an episode


# -- the pool --------------------------------------------------------------------------------

BeforeStep = Callable[["StepContext"], None]


@dataclass(frozen=True)
class StepContext:
    """Handed to ``before_step`` hooks: which worker is about to run which step of which episode."""

    worker_id: str
    worker_pid: int | None
    job: EpisodeJob
    attempt: int
    step_idx: int
    pool: EnvPool


class EnvPool:
    """Workers plus spares running episodes; see the module docstring.

    ``env_configs``: one config (every worker builds the same environment, e.g. a Chromium), or a
    sequence of configs each used by at most one live worker at a time (e.g. one per Android
    device; ``workers + spares`` should not exceed their number). ``start_method``: how worker
    processes start (:func:`envs.pool_worker.worker_context`: a fork server with the workers'
    imports preloaded, or ``spawn``).
    """

    def __init__(
        self,
        env_configs: EnvConfig | Sequence[EnvConfig],
        config: PoolConfig | None = None,
        *,
        log: Callable[[str], None] | None = None,
        start_method: str = "forkserver",
    ) -> None:
        self.config = config or PoolConfig()
        if isinstance(env_configs, Sequence):
            if not env_configs:
                raise PoolError("no environment configs (e.g. no Android devices) given to the pool")
            self._configs: list[EnvConfig] = list(env_configs)
            self._exclusive = True
        else:
            self._configs = [env_configs]
            self._exclusive = False
        self._log = log or (lambda message: None)
        self._ctx = worker_context(start_method)
        self._lock = threading.Lock()
        self._ready: deque[PoolWorker] = deque()
        self._ready_cv = threading.Condition(self._lock)
        self._starting = 0
        self._held = 0  # workers taken by slots (running episodes or about to)
        self._in_use: set[int] = set()
        self._all: dict[str, PoolWorker] = {}
        self._ids = itertools.count()
        self._config_cursor = itertools.count()
        self._start_failures = 0
        self._last_start_error = ""
        self.workers_started = 0
        self.workers_replaced = 0
        self._closed = False
        self._cluster_lost: str | None = None  # why a cluster backend cannot go on (envs.ray_pool: the head)
        if self.config.backend != "local" and type(self) is EnvPool:
            raise ValueError(f"the {self.config.backend!r} backend is envs.ray_pool.RayEnvPool, not EnvPool")

    # -- workers ---------------------------------------------------------------------------
    def start(self) -> EnvPool:
        """Start ``workers + spares`` workers; returns once ``workers`` of them are ready."""
        self._connect()
        self._top_up()
        need = min(self.config.workers, self._target())
        deadline = time.monotonic() + self.config.start_timeout_s + 5
        with self._ready_cv:
            while (
                len(self._ready) < need
                and not self._give_up_starting()
                and not self._cluster_lost
                and time.monotonic() < deadline
            ):
                self._ready_cv.wait(0.2)
            if not self._ready:
                why = f"the cluster is gone ({self._cluster_lost})" if self._cluster_lost else None
                raise PoolError(f"no worker could be started: {why or self._last_start_error or 'timed out'}")
        return self

    def _target(self) -> int:
        """How many workers should be alive: the active ones plus the spares (devices permitting)."""
        wanted = self.config.workers + self.config.spares
        return min(wanted, len(self._configs)) if self._exclusive else wanted

    def _top_up(self) -> None:
        """Start workers until held + ready + starting reaches the target."""
        with self._lock:
            deficit = self._target() - (self._held + len(self._ready) + self._starting)
        for _ in range(max(0, deficit)):
            self._provision()

    def _give_up_starting(self) -> bool:
        return self._start_failures >= self.config.start_retries and self._starting == 0

    def _provision(self) -> None:
        """Start one more worker in the background; it joins the ready queue when it is up."""
        with self._lock:
            if self._closed or self._cluster_lost:
                return  # a lost cluster cannot start workers: a start would wait out its whole timeout
            index = self._free_config_index()
            if index is None:
                return
            self._starting += 1
            if self._exclusive:
                self._in_use.add(index)
            worker_id = f"w{next(self._ids)}"
        threading.Thread(
            target=self._start_worker, args=(worker_id, index), name=f"start-{worker_id}", daemon=True
        ).start()

    def _free_config_index(self) -> int | None:
        if not self._exclusive:
            return 0
        for _ in range(len(self._configs)):
            index = next(self._config_cursor) % len(self._configs)
            if index not in self._in_use:
                return index
        return None

    def _start_worker(self, worker_id: str, index: int) -> None:
        worker: PoolWorker | None = None
        try:
            worker = self._new_worker(worker_id, index)
            with self._lock:
                self._all[worker_id] = worker
            worker.wait_ready(self.config.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any start failure counts the same
            if worker is not None:
                worker.kill()
            with self._ready_cv:
                self._starting -= 1
                self._in_use.discard(index)
                self._start_failures += 1
                self._last_start_error = str(exc)
                self._all.pop(worker_id, None)
                self._ready_cv.notify_all()
            self._log(f"worker {worker_id} failed to start: {exc}")
            if not self._lost_cluster() and not self._give_up_starting():
                # back off before the next try (0.5, 1, 2 s ...): a browser that cannot start often
                # cannot for a moment (seen in CI: three Chromium starts failed within 3 s)
                time.sleep(min(4.0, 0.5 * 2 ** (self._start_failures - 1)))
                self._top_up()
            return
        with self._ready_cv:
            self._starting -= 1
            self._start_failures = 0
            self.workers_started += 1
            if self._closed:
                worker.kill()
                return
            self._ready.append(worker)
            self._ready_cv.notify_all()

    # Where workers live: the hooks a cluster backend overrides (envs.ray_pool.RayEnvPool).
    def _connect(self) -> None:
        """Reach the workers' hosts before any worker starts (nothing to reach on this machine)."""

    def _new_worker(self, worker_id: str, index: int) -> PoolWorker:
        return ProcessWorker(worker_id, self._configs[index], index, self._ctx)

    def _lost_cluster(self) -> bool:
        """After a lost worker: is the whole backend gone, so that no worker can be replaced?"""
        return False

    def _fail_if_cluster_lost(self, not_run: int, total: int) -> None:
        """After a batch that lost episodes: raise if the backend is gone (nothing returned)."""

    def _acquire(self) -> PoolWorker | None:
        """A ready, healthy worker (a spare), provisioning its own replacement; None if none can be had."""
        deadline = time.monotonic() + self.config.start_timeout_s + 5
        while True:
            worker = None
            with self._ready_cv:
                if self._closed or self._cluster_lost:
                    return None  # a spare on a surviving node must not carry the batch on past a lost cluster
                if self._ready:
                    worker = self._ready.popleft()
                elif time.monotonic() > deadline or self._give_up_starting():
                    return None
                else:
                    idle = self._starting == 0
                    if not idle:
                        self._ready_cv.wait(0.2)
            if worker is None:
                if idle:  # nothing on its way (every spare used up): start one
                    self._top_up()
                continue
            with self._lock:
                self._held += 1
            self._top_up()  # a spare was taken: start another
            if self._probe(worker):
                return worker
            if self._lost_cluster():
                return None  # nothing can replace it: left to close(), as a worker lost mid-episode is
            self._retire(worker, "failed its health check")

    def _probe(self, worker: PoolWorker) -> bool:
        if not worker.is_alive():
            return False
        try:
            return bool(worker.call("healthy", timeout=self.config.health_timeout_s))
        except (WorkerFailure, EpisodeError):
            return False

    def _retire(self, worker: PoolWorker, reason: str) -> None:
        self._log(f"replacing worker {worker.id} (pid {worker.pid}): {reason}")
        worker.kill()
        with self._lock:
            self._in_use.discard(worker.config_index)
            self.workers_replaced += 1
            self._held -= 1
            self._all.pop(worker.id, None)
        self._top_up()

    def _release(self, worker: PoolWorker) -> None:
        with self._ready_cv:
            self._held -= 1
            if self._closed:
                worker.close()
                return
            self._ready.append(worker)
            self._ready_cv.notify_all()

    def worker_processes(self, worker_id: str) -> list[Any]:
        """The psutil processes a worker started (chromedriver, Chromium, adb): for fault injection."""
        worker = self._all.get(worker_id)
        return worker.descendants() if worker is not None else []

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "worker_id": w.id,
                    "pid": w.pid,
                    "alive": w.is_alive(),
                    "node": w.node,
                    "episodes": w.episodes,
                    "ready": w in self._ready,
                }
                for w in self._all.values()
            ]

    # -- episodes --------------------------------------------------------------------------
    def run(
        self,
        jobs: Sequence[EpisodeJob],
        policy: Policy,
        *,
        on_episode: Callable[[EpisodeRecord | None, int, int], None] | None = None,
        before_step: BeforeStep | None = None,
    ) -> BatchResult:
        """Run every job once to completion (retrying on fresh workers), ``workers`` at a time.

        ``on_episode(record, resolved, total)`` is called as each job is resolved (record None for a
        job given up on); ``before_step`` before every step (progress, fault injection).
        """
        if self._closed:
            raise PoolError("the pool is closed")
        ids = [job.episode_id for job in jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("episode ids of a batch must be unique")
        if not self._ready and self._starting == 0:
            self.start()
        started = time.perf_counter()
        replaced_before = self.workers_replaced
        state = _BatchState(jobs)
        slots = [
            threading.Thread(
                target=self._slot, args=(state, policy, on_episode, before_step), name=f"slot-{i}", daemon=True
            )
            for i in range(min(self.config.workers, max(1, len(jobs))))
        ]
        for slot in slots:
            slot.start()
        try:
            for slot in slots:
                while slot.is_alive():
                    slot.join(0.2)  # short joins keep the main thread responsive to Ctrl-C / run termination
        except BaseException:
            state.stop()
            self.close()
            raise
        if state.lost or self._cluster_lost:
            self._fail_if_cluster_lost(len(state.lost) + state.unresolved, len(jobs))
        order = {job.episode_id: i for i, job in enumerate(jobs)}
        state.episodes.sort(key=lambda e: order[e.episode_id])
        state.attempts.sort(key=lambda a: (order[a.episode_id], a.attempt))
        return BatchResult(
            episodes=state.episodes,
            attempts=state.attempts,
            lost=sorted(state.lost, key=lambda item: order[item[0].episode_id]),
            seconds=time.perf_counter() - started,
            workers_started=self.workers_started,
            workers_replaced=self.workers_replaced - replaced_before,
        )

    def _why_no_worker(self) -> str:
        """Why a job found no worker: the cluster gone, the last start's error, the pool closed, or
        no worker ready in time (in that order: the first is the cause of the others)."""
        if self._cluster_lost:
            return f"the cluster is gone ({self._cluster_lost})"
        if self._last_start_error:
            return self._last_start_error
        if self._closed:
            return "the pool is closed"
        return f"none became ready within {self.config.start_timeout_s + 5:g} s"

    def _slot(
        self,
        state: _BatchState,
        policy: Policy,
        on_episode: Callable[[EpisodeRecord | None, int, int], None] | None,
        before_step: BeforeStep | None,
    ) -> None:
        worker: PoolWorker | None = None
        try:
            while (item := state.next_job(worker.task_id if worker is not None else None)) is not None:
                job, attempt = item
                recently_fine = worker is not None and time.monotonic() - worker.last_ok < HEALTH_FRESH_S
                if worker is not None and not recently_fine and not self._probe(worker):
                    # a worker lost between episodes: is the whole cluster gone? Then nothing can
                    # replace it (the batch fails as a whole, below) and close() ends it
                    if not self._lost_cluster():
                        self._retire(worker, "failed its health check between episodes")
                    worker = None
                if worker is None:
                    try:
                        worker = self._acquire()
                    except Exception as exc:  # noqa: BLE001 - the job was taken: it must be resolved (below)
                        self._last_start_error = first_line(exc)
                if worker is None:
                    reason = f"no worker available: {self._why_no_worker()}"
                    state.abort(job, attempt, None, reason, 0, datetime.now(UTC), 0, final=True)
                    if self._cluster_lost:
                        state.stop()  # no worker can be had: the batch fails as a whole (run() raises)
                    if on_episode is not None:
                        on_episode(None, *state.progress())
                    continue
                outcome = self._attempt(state, worker, job, attempt, policy, before_step)
                if outcome == "worker_failed":
                    worker = None
                if on_episode is not None and state.is_resolved(job):
                    on_episode(outcome if isinstance(outcome, EpisodeRecord) else None, *state.progress())
        finally:
            if worker is not None:
                self._release(worker)

    def _attempt(
        self,
        state: _BatchState,
        worker: PoolWorker,
        job: EpisodeJob,
        attempt: int,
        policy: Policy,
        before_step: BeforeStep | None,
    ) -> EpisodeRecord | str:
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        progress = {"steps": 0}

        def hook(step_idx: int) -> None:
            progress["steps"] = step_idx
            if before_step is not None:
                before_step(StepContext(worker.id, worker.pid, job, attempt, step_idx, self))

        def elapsed() -> int:
            return int((time.perf_counter() - t0) * 1000)

        try:
            record = self._run_attempt(worker, job, attempt, policy, hook)
        except WorkerFailure as exc:
            final = attempt + 1 >= self.config.max_attempts
            state.abort(job, attempt, worker.id, str(exc), progress["steps"], started_at, elapsed(), final=final)
            if self._lost_cluster():
                state.stop()  # no worker can be replaced: the batch fails as a whole (run() raises)
                return "worker_failed"
            self._retire(worker, str(exc))
            if not final:
                state.retry(job, attempt + 1)
            return "worker_failed"
        except EpisodeError as exc:
            state.abort(job, attempt, worker.id, str(exc), progress["steps"], started_at, elapsed(), final=True)
            return "episode_failed"
        except Exception as exc:  # noqa: BLE001 - a policy bug must not take the batch down
            state.abort(
                job,
                attempt,
                worker.id,
                f"policy error: {first_line(exc)}",
                progress["steps"],
                started_at,
                elapsed(),
                final=True,
            )
            return "episode_failed"
        worker.episodes += 1
        worker.task_id = job.task.task_id
        state.complete(record, started_at, elapsed())
        return record

    def _run_attempt(
        self, worker: PoolWorker, job: EpisodeJob, attempt: int, policy: Policy, on_step: Callable[[int], None]
    ) -> EpisodeRecord:
        """One attempt at ``job`` on ``worker``: the policy here, each step a call to the worker.
        ``on_step(i)`` runs before step ``i`` (the attempt's progress, the caller's ``before_step``).
        A cluster backend may run the episode elsewhere (``envs.ray_pool``)."""
        return run_job(RemoteEnv(worker, self.config), policy, job, attempt, worker.id, on_step)

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Close every worker (their browsers or device sessions with them)."""
        with self._ready_cv:
            self._closed = True
            workers = list(self._all.values())
            self._ready.clear()
            self._all.clear()
            self._ready_cv.notify_all()
        closers = [threading.Thread(target=w.close, args=(5.0,), daemon=True) for w in workers]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(15)

    def __enter__(self) -> EnvPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _BatchState:
    """Jobs to run, attempts made, episodes completed: shared by the slot threads under one lock."""

    jobs: Sequence[EpisodeJob]
    episodes: list[EpisodeRecord] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    lost: list[tuple[EpisodeJob, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queue: deque[tuple[EpisodeJob, int]] = deque((job, 0) for job in self.jobs)
        self.unresolved = len(self.jobs)
        self.cv = threading.Condition()
        self.stopped = False
        self.resolved_ids: set[str] = set()

    def next_job(self, current_task: str | None = None) -> tuple[EpisodeJob, int] | None:
        """The next job for a slot: a retry first, else one of the task its worker has open,
        else the start of the task most jobs wait for (so two workers split tasks, not pages)."""
        with self.cv:
            while not self.queue:
                if self.unresolved == 0 or self.stopped:
                    return None
                self.cv.wait(0.2)  # a retry may still be queued by another slot
            if self.stopped:
                return None
            if self.queue[0][1] > 0 or current_task is None:
                return self.queue.popleft()
            for index, (job, _) in enumerate(self.queue):
                if job.task.task_id == current_task:
                    del self.queue[index]
                    return job, 0
            waiting = Counter(job.task.task_id for job, _ in self.queue)
            busiest = max(waiting, key=lambda task: waiting[task])
            for index, (job, attempt) in enumerate(self.queue):
                if job.task.task_id == busiest:
                    del self.queue[index]
                    return job, attempt
            return self.queue.popleft()

    def retry(self, job: EpisodeJob, attempt: int) -> None:
        with self.cv:
            self.queue.appendleft((job, attempt))  # retried next, on whichever fresh worker asks first
            self.cv.notify_all()

    def complete(self, record: EpisodeRecord, started_at: datetime, duration_ms: int) -> None:
        with self.cv:
            self.episodes.append(record)
            self.attempts.append(
                AttemptRecord(
                    record.episode_id,
                    record.task_id,
                    record.seed,
                    record.attempt,
                    record.worker_id,
                    ATTEMPT_COMPLETED,
                    None,
                    True,
                    record.n_steps,
                    started_at,
                    duration_ms,
                )
            )
            self.unresolved -= 1
            self.resolved_ids.add(record.episode_id)
            self.cv.notify_all()

    def abort(
        self,
        job: EpisodeJob,
        attempt: int,
        worker_id: str | None,
        reason: str,
        steps_done: int,
        started_at: datetime,
        duration_ms: int,
        *,
        final: bool,
    ) -> None:
        with self.cv:
            self.attempts.append(
                AttemptRecord(
                    job.episode_id,
                    job.task.task_id,
                    job.seed,
                    attempt,
                    worker_id,
                    ATTEMPT_ABORTED,
                    reason,
                    final,
                    steps_done,
                    started_at,
                    duration_ms,
                )
            )
            if final:
                self.lost.append((job, reason))
                self.unresolved -= 1
                self.resolved_ids.add(job.episode_id)
            self.cv.notify_all()

    def is_resolved(self, job: EpisodeJob) -> bool:
        with self.cv:
            return job.episode_id in self.resolved_ids

    def progress(self) -> tuple[int, int]:
        with self.cv:
            return len(self.jobs) - self.unresolved, len(self.jobs)

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
