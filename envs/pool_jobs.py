"""What the worker pool (:mod:`envs.pool`) runs and returns: its configuration, the jobs (one
episode each: task, seed, budget, start state), every attempt at one, a batch's result, the errors
that say which part failed, and :func:`run_job`, the one place a job becomes an episode (on the
local pool and on a Ray actor alike)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import pyarrow as pa

from envs.protocol import (
    Environment,
    EpisodeRecord,
    Policy,
    StartState,
    run_episode,
)
from envs.task_catalog import CatalogTask
from envs.tasks import TaskSpec
from warehouse.keys import with_key

ATTEMPT_COMPLETED = "completed"


ATTEMPT_ABORTED = "aborted"


# The attempts table: every try at an episode, completed or aborted, with the reason.
ROLLOUT_ATTEMPTS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("attempt", pa.int32(), nullable=False),  # 0 for the first try
            ("task_id", pa.string()),
            ("seed", pa.int64()),
            ("worker_id", pa.string()),
            pa.field("status", pa.string(), nullable=False),  # completed | aborted
            ("reason", pa.string()),  # why an attempt was aborted
            ("final", pa.bool_()),  # no further attempt follows this one
            ("steps_done", pa.int32()),  # steps carried out before the end (or the failure)
            ("started_at", pa.timestamp("us", tz="UTC")),
            ("duration_ms", pa.int64()),
            ("run_id", pa.string()),
        ]
    ),
    "episode_id",
    "attempt",
)


class EnvConfig(Protocol):
    """A picklable recipe for an environment; ``create`` runs in the worker process."""

    def create(self) -> Environment: ...


@dataclass(frozen=True)
class PoolConfig:
    workers: int = 2  # episodes run at once
    spares: int = 1  # ready workers kept in reserve
    step_timeout_s: float = 10.0
    reset_timeout_s: float = 30.0
    start_timeout_s: float = 60.0
    health_timeout_s: float = 5.0
    max_attempts: int = 3  # tries per episode, the first included
    start_retries: int = 3  # consecutive worker start failures tolerated before giving up
    backend: str = "local"  # local: worker processes here | ray: worker actors on a Ray cluster (envs.ray_pool)
    ray_address: str | None = None  # the Ray head's host:port, with backend "ray"
    ray_cpus_per_worker: float = 1.0  # CPUs a worker actor reserves on its node (its browser's share)
    # with backend "ray": a policy that can act away from the driver (envs.protocol.PortablePolicy)
    # runs whole episodes on the worker actors, its snapshot sent once per batch; False: every step
    # is a round trip from the driver, whatever the policy
    ray_episodes_on_actors: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"unknown pool backend {self.backend!r} (local | ray)")
        if self.backend == "ray" and not self.ray_address:
            raise ValueError("the ray backend needs ray_address: the head's host:port (ray start --head --port)")
        if self.spares < 0 or self.max_attempts < 1:
            raise ValueError("spares must be >= 0 and max_attempts >= 1")


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: which task, which seed, which id it will have in the warehouse."""

    episode_id: str
    task: TaskSpec
    seed: int
    max_steps: int
    family: str | None = None
    start: StartState | None = None  # begin at this recorded state (a replay) instead of the reset one


@dataclass(frozen=True)
class AttemptRecord:
    episode_id: str
    task_id: str
    seed: int
    attempt: int
    worker_id: str | None
    status: str  # completed | aborted
    reason: str | None
    final: bool
    steps_done: int
    started_at: datetime
    duration_ms: int


@dataclass
class BatchResult:
    episodes: list[EpisodeRecord]
    attempts: list[AttemptRecord]
    lost: list[tuple[EpisodeJob, str]]  # jobs with no completed attempt, and why
    seconds: float
    workers_started: int
    workers_replaced: int

    @property
    def steps(self) -> int:
        return sum(e.n_steps for e in self.episodes)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def aborted_attempts(self) -> int:
        return sum(a.status == ATTEMPT_ABORTED for a in self.attempts)

    def attempts_table(self, run_id: str | None = None) -> pa.Table:
        rows = [
            {
                "episode_id": a.episode_id,
                "attempt": a.attempt,
                "task_id": a.task_id,
                "seed": a.seed,
                "worker_id": a.worker_id,
                "status": a.status,
                "reason": a.reason,
                "final": a.final,
                "steps_done": a.steps_done,
                "started_at": a.started_at,
                "duration_ms": a.duration_ms,
                "run_id": run_id,
            }
            for a in self.attempts
        ]
        return pa.Table.from_pylist(rows, schema=ROLLOUT_ATTEMPTS)


class WorkerFailure(RuntimeError):
    """The worker is unusable (crashed, hung, or its environment broke): kill it, retry elsewhere."""


class WorkerTimeout(WorkerFailure):
    pass


class EpisodeError(RuntimeError):
    """The episode cannot run (its task spec does not fit, the policy failed): retrying will not help."""


class PoolError(RuntimeError):
    pass


SEEDS_PER_BATCH = 10_000


def plan_jobs(
    tasks: Sequence[CatalogTask],
    *,
    batch: str,
    batch_index: int = 0,
    episodes_per_task: int = 4,
    base_seed: int = 0,
    seeds: Sequence[int] = (),
    max_steps: int | None = None,
) -> list[EpisodeJob]:
    """The episodes of one rollout batch: every task with the same seeds, task after task (a
    worker then stays on one task page instead of loading another for every episode).

    Seeds are ``base_seed + SEEDS_PER_BATCH * batch_index + i`` (or ``seeds`` when given), so a
    batch is reproducible and batches do not overlap. Episode ids name task, batch and seed:
    re-running a batch yields the same ids (the new version replaces the old).
    """
    if seeds:
        chosen = list(dict.fromkeys(int(s) for s in seeds))
    else:
        if not 0 < episodes_per_task <= SEEDS_PER_BATCH:
            raise ValueError(f"episodes_per_task must be in 1..{SEEDS_PER_BATCH}")
        start = base_seed + SEEDS_PER_BATCH * batch_index
        chosen = list(range(start, start + episodes_per_task))
    return [
        EpisodeJob(
            episode_id=f"rollout:{task.task_id}:{batch}:{seed}",
            task=task.spec,
            seed=seed,
            max_steps=max_steps or task.max_steps,
            family=task.family,
        )
        for task in tasks
        for seed in chosen
    ]


def first_line(exc: BaseException, limit: int = 300, *, bare: bool = False) -> str:
    """A short, one-line reason: WebDriver errors carry stack traces and help links; drop them.
    ``bare``: the message alone, without the exception's type (messages that say what they are)."""
    text = str(getattr(exc, "msg", None) or exc)
    for cut in ("\nStacktrace", "Stacktrace:", "; For documentation", "\n  (Session info"):
        text = text.split(cut, 1)[0]
    text = " ".join(text.split()) or type(exc).__name__
    return text[:limit] if bare else f"{type(exc).__name__}: {text[:limit]}"


def run_job(
    env: Environment,
    policy: Policy,
    job: EpisodeJob,
    attempt: int,
    worker_id: str,
    before_step: Callable[[int], None] | None = None,
) -> EpisodeRecord:
    """``run_episode`` of one job's task, seed, id, budget and start state on ``env``: the one
    place a job becomes an episode, on the local pool and on a Ray actor alike."""
    return run_episode(
        env,
        policy,
        job.task,
        job.seed,
        episode_id=job.episode_id,
        max_steps=job.max_steps,
        family=job.family,
        before_step=before_step,
        attempt=attempt,
        worker_id=worker_id,
        start=job.start,
    )
