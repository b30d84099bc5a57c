"""One environment worker of the pool (:mod:`envs.pool`): the process that owns an environment
(its own session, so the worker and the browser or adb processes it starts can be killed as one
group), and the parent's handle on it, which drives it over a pipe with a timeout on every call."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Protocol

from envs.policies import SolutionError
from envs.pool_jobs import EnvConfig, EpisodeError, PoolConfig, WorkerFailure, WorkerTimeout, first_line
from envs.process import die_with_parent
from envs.protocol import (
    Observation,
    StartState,
    StateNotReproduced,
    StepResult,
    restore,
)
from envs.tasks import TaskSpec, TaskSpecError
from warehouse.model import Action, ActionType

#: What a worker imports (selenium, miniwob and gymnasium, PIL, pyarrow): loaded once by the fork
#: server, so a worker forked from it starts with them. Under ``spawn`` every worker imported them
#: again, 1.5-2 s of CPU each, paid by every pool an RL iteration, an evaluation or a test starts.
WORKER_PRELOAD = ("envs.pool_worker", "envs.miniwob.live")


def worker_context(start_method: str = "forkserver") -> Any:
    """The multiprocessing context pool workers start in: by default a fork server that preloaded
    :data:`WORKER_PRELOAD` (started once per process, at the first pool), ``spawn`` where the
    platform has no fork server or where asked (``benchmarks/bench_rollouts.py`` compares the two).
    Workers never fork the pool's process itself: it may hold threads, torch state and DuckDB files."""
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be forkserver or spawn, got {start_method!r}")
    if start_method == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_PRELOAD))
    return context


def _take_parent_state(environ: dict[str, str] | None, cwd: str | None) -> None:
    """A forked worker starts with the fork server's environment and folder, as they were when the
    server started; take the parent's as they are now (what ``spawn`` gave): e.g. a ``TMPDIR`` set
    for this pool's browsers. ``tempfile`` forgets the folder it chose from the old environment."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = None
    if cwd is not None:
        with contextlib.suppress(OSError):
            os.chdir(cwd)


def _worker_main(
    conn: Any,
    env_config: EnvConfig,
    worker_id: str,
    parent_pid: int | None = None,
    *,
    environ: dict[str, str] | None = None,
    cwd: str | None = None,
) -> None:
    """Serve one environment over ``conn`` until told to close or the parent goes away.

    ``parent_pid``: the process whose death ends this worker; ``None``: this process's parent as it
    is now (a fork server's worker: the server, which exits when the pool's
    process dies). ``environ``, ``cwd``: the pool process's, taken over first."""
    os.setsid()  # own process group: the parent kills the worker and its browser/adb children at once
    _take_parent_state(environ, cwd)
    # A parent killed with SIGKILL (an OOM kill, a terminated run) cannot stop us: a watchdog
    # ends this worker's whole group (browser included) when the parent is gone. Workers are
    # started from the pool's threads, so the kernel's parent-death signal (tied to the forking
    # thread) is not used.
    die_with_parent(parent_pid, use_prctl=False, kill_group=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    def _terminate(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        env = env_config.create()
    except BaseException as exc:  # noqa: BLE001 - report any start failure to the parent
        with contextlib.suppress(Exception):
            conn.send(("error", "env", f"could not start the environment: {first_line(exc)}"))
        return
    try:
        conn.send(
            (
                "ready",
                {
                    "pid": os.getpid(),
                    "backend": env.backend,
                    "supported": sorted(a.value for a in env.supported_actions),
                    "scratch": [str(path) for path in getattr(env, "scratch_paths", ())],
                },
            )
        )
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            op, args = message[0], message[1:]
            if op == "close":
                break
            try:
                if op == "reset":
                    reply: Any = env.reset(*args)
                elif op == "restore":  # in the worker: one round trip for the whole prefix
                    reply = restore(env, *args)
                elif op == "step":
                    reply = env.step(*args)
                elif op == "healthy":
                    reply = bool(env.healthy())
                else:
                    raise ValueError(f"unknown operation {op!r}")
                conn.send(("ok", reply))
            except (TaskSpecError, SolutionError, StateNotReproduced) as exc:
                conn.send(("error", "task", first_line(exc, bare=isinstance(exc, StateNotReproduced))))
            except Exception as exc:  # noqa: BLE001 - the environment broke; the parent replaces us
                conn.send(("error", "env", first_line(exc)))
    finally:
        with contextlib.suppress(Exception):
            env.close()


class PoolWorker(Protocol):
    """What the pool needs of a worker: a local process (``ProcessWorker``) or a Ray actor
    (``envs.ray_pool.RayWorker``)."""

    id: str
    config_index: int
    backend: str
    supported: frozenset[ActionType]
    episodes: int
    alive: bool
    last_ok: float  # when the worker last answered a call successfully
    task_id: str | None  # the task page it has open (affinity: fewer page loads)

    @property
    def pid(self) -> int | None: ...

    @property
    def node(self) -> str: ...

    def is_alive(self) -> bool: ...

    def wait_ready(self, timeout: float) -> None: ...

    def call(self, op: str, *args: Any, timeout: float) -> Any: ...

    def descendants(self) -> list[Any]: ...

    def kill(self) -> None: ...

    def close(self, timeout: float = 10.0) -> None: ...


class ProcessWorker:
    """The parent's handle on one worker process."""

    def __init__(self, worker_id: str, env_config: EnvConfig, config_index: int, ctx: Any) -> None:
        self.id = worker_id
        self.config_index = config_index
        self.conn, child = ctx.Pipe()
        forked = ctx.get_start_method() == "forkserver"
        self.process = ctx.Process(
            target=_worker_main,
            # a fork server's worker is the server's child: it watches the server (which ends with
            # this process) and takes this process's environment and folder
            args=(child, env_config, worker_id, None if forked else os.getpid()),
            kwargs={"environ": dict(os.environ), "cwd": os.getcwd()} if forked else {},
            name=f"stepwise-{worker_id}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.backend = ""
        self.supported: frozenset[ActionType] = frozenset()
        self.episodes = 0
        self.alive = True
        self.last_ok = 0.0  # when the worker last answered a call successfully
        self.task_id: str | None = None  # the task page it has open (affinity: fewer page loads)
        self._kill_lock = threading.Lock()
        self._killed = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def node(self) -> str:
        return "local"

    def is_alive(self) -> bool:
        return self.alive and self.process.is_alive()

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise WorkerTimeout(f"worker {self.id} did not start within {timeout:g} s")
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerFailure(f"worker {self.id} exited while starting (exit code {self.process.exitcode})") from None
        if reply[0] != "ready":
            raise WorkerFailure(f"worker {self.id}: {reply[2]}")
        self.backend = reply[1]["backend"]
        self.supported = frozenset(ActionType(a) for a in reply[1]["supported"])
        self.scratch = tuple(reply[1].get("scratch", ()))

    def call(self, op: str, *args: Any, timeout: float) -> Any:
        try:
            self.conn.send((op, *args))
        except (BrokenPipeError, OSError) as exc:
            raise WorkerFailure(f"worker {self.id} is gone ({op}): {first_line(exc)}") from None
        if not self.conn.poll(timeout):
            raise WorkerTimeout(f"{op} timed out after {timeout:g} s on worker {self.id}")
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(0.5)
            raise WorkerFailure(f"worker {self.id} died during {op} (exit code {self.process.exitcode})") from None
        if reply[0] == "ok":
            self.last_ok = time.monotonic()
            return reply[1]
        if reply[1] == "task":
            raise EpisodeError(reply[2])
        raise WorkerFailure(f"{op} failed on worker {self.id}: {reply[2]}")

    def descendants(self) -> list[Any]:
        """The worker's child processes (chromedriver, Chromium, adb), as psutil processes."""
        import psutil

        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill(self) -> None:
        """Kill the worker and everything it started (its process group), now; once. The pool's
        close and a start thread that finds the pool closed can both kill one worker at the same
        moment, and two closes of its pipe would close a descriptor number another thread had
        reused (seen in CI: EBADF inside the other call's rmtree)."""
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
            self._kill_now()

    def _kill_now(self) -> None:
        self.alive = False
        children = self.descendants()
        pid = self.process.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # the group exists once the worker called setsid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for child in children:  # started before setsid took effect, or moved to another group
            with contextlib.suppress(Exception):
                child.kill()
        self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()
        for path in getattr(self, "scratch", ()):  # a killed worker could not remove its browser profile
            shutil.rmtree(path, ignore_errors=True)

    def close(self, timeout: float = 10.0) -> None:
        """Ask the worker to close its environment and exit; kill it if it does not."""
        if self.alive:
            with contextlib.suppress(Exception):
                self.conn.send(("close",))
            self.process.join(timeout)
        self.kill()


class RemoteEnv:
    """The ``Environment`` protocol over a worker's pipe, with the pool's timeouts."""

    def __init__(self, worker: PoolWorker, config: PoolConfig) -> None:
        self.worker, self.config = worker, config
        self.backend = worker.backend
        self.supported_actions = worker.supported

    def reset(self, task: TaskSpec, seed: int) -> Observation:
        return self.worker.call("reset", task, seed, timeout=self.config.reset_timeout_s)

    def restore(self, task: TaskSpec, seed: int, start: StartState) -> Observation:
        """The worker reaches the recorded state itself (``envs.protocol.restore``): one round trip,
        with a reset's timeout plus a step's per replayed action."""
        timeout = self.config.reset_timeout_s + self.config.step_timeout_s * start.step
        return self.worker.call("restore", task, seed, start, timeout=timeout)

    def step(self, action: Action) -> StepResult:
        return self.worker.call("step", action, timeout=self.config.step_timeout_s)

    def healthy(self) -> bool:
        try:
            return bool(self.worker.call("healthy", timeout=self.config.health_timeout_s))
        except (WorkerFailure, EpisodeError):
            return False

    def close(self) -> None:
        self.worker.close()
