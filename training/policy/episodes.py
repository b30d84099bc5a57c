"""Episodes of a learned policy on the worker pool, and the warehouse tables they land in: the
pieces the SFT stage, the RL stage and the LLM agent's runs share (jobs of catalog tasks on seeds,
one pass over the pool with progress, episodes and evaluation rows staged for one publish)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import pyarrow as pa

from envs.pool import EnvPool
from envs.pool_jobs import BatchResult, EpisodeJob
from envs.protocol import Policy, episode_tables
from envs.rollouts import ATTEMPTS_TABLE, ProgressLog
from envs.task_catalog import CatalogTask, load_catalog
from training.policy.evaluation import EvalEpisode, eval_episode, per_task_rows
from training.policy.learned import LearnedPolicy, PolicyModel
from warehouse.catalog import Materialization, TableOutput, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.tables_rl import AGENT_EVAL, AGENT_EVAL_EPISODES


class PolicyStageError(RuntimeError):
    """A policy stage (SFT, RL, the LLM agent's) cannot start or go on: no demonstrations, no task
    to train on, no usable episodes."""


#: Where a stage's progress lines go (the Dagster context's logger, or print).
Log = Callable[[str], None]
#: Opens a worker pool of N workers (live MiniWoB++ locally, or on a Ray cluster).
PoolFactory = Callable[[int], AbstractContextManager[EnvPool]]


def episode_jobs(
    tasks: Sequence[CatalogTask], seeds: Sequence[int], prefix: str, group_size: int = 1
) -> list[EpisodeJob]:
    """One job per (task, seed, group member): episode ids ``<prefix>:<task>:<seed>[:g<k>]``."""
    return [
        EpisodeJob(
            episode_id=f"{prefix}:{task.task_id}:{seed}" + (f":g{g}" if group_size > 1 else ""),
            task=task.spec,
            seed=seed,
            max_steps=task.max_steps,
            family=task.family,
        )
        for task in tasks
        for seed in seeds
        for g in range(group_size)
    ]


def catalog_tasks(names: Sequence[str]) -> list[CatalogTask]:
    """The MiniWoB++ catalog's tasks of these names; a :class:`PolicyStageError` names any unknown."""
    catalog = load_catalog("miniwob")
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise PolicyStageError(f"not in the MiniWoB++ catalog: {unknown} (catalog: {', '.join(catalog)})")
    return [catalog[n] for n in names]


def run_episodes(
    pool: EnvPool, jobs: list[EpisodeJob], policy: Policy, label: str, log: Log
) -> tuple[BatchResult, float]:
    """The jobs on the pool with progress under ``label`` (lost episodes logged by reason), and the
    seconds it took."""
    started = time.perf_counter()
    result = pool.run(jobs, policy, on_episode=ProgressLog(log, label))
    if result.lost:
        log(f"{label}: {len(result.lost)} episodes lost: {Counter(r for _, r in result.lost)}")
    return result, time.perf_counter() - started


def episode_outputs(
    warehouse: Warehouse,
    result: BatchResult,
    dataset: str,
    m: Materialization,
    run_id: str | None,
    purpose: EpisodePurpose,
) -> list[TableOutput]:
    """A batch's episodes, steps and attempts staged as ``dataset`` (published with ``m``)."""
    episodes, steps = episode_tables(result.episodes, run_id=run_id, purpose=purpose)
    return [
        warehouse.stage_table("episodes", dataset, episodes, m),
        warehouse.stage_table("steps", dataset, steps, m),
        warehouse.stage_table(ATTEMPTS_TABLE, dataset, result.attempts_table(run_id), m),
    ]


def evaluation_outputs(
    warehouse: Warehouse,
    episodes: Sequence[EvalEpisode],
    evaluation: str,
    *,
    policy_label: str,
    rl_seed: int | None,
    dataset: str,
    m: Materialization,
) -> list[TableOutput]:
    """Greedy evaluation episodes as ``agent_eval`` (per task: success, return, failure modes) and
    ``agent_eval_episodes`` rows under ``evaluation`` (selection or held_out) and ``policy_label`` (``sft``,
    an RL run's reward source, ``llm_base``, ...)."""
    created = datetime.now(UTC)
    task_rows = [
        r
        | {"evaluation": evaluation, "policy_label": policy_label, "rl_seed": rl_seed, "created_at": created}
        | {"failure_modes": json.dumps(r["failure_modes"], sort_keys=True)}
        for r in per_task_rows(episodes)
    ]
    episode_rows = [
        {
            "policy_id": e.policy_id,
            "evaluation": evaluation,
            "task_id": e.task_id,
            "seed": e.seed,
            "episode_id": e.episode_id,
            "success": e.success,
            "env_return": e.env_return,
            "n_steps": e.n_steps,
            "failure_mode": e.failure_mode,
        }
        for e in episodes
    ]
    return [
        warehouse.stage_table("agent_eval", dataset, pa.Table.from_pylist(task_rows, schema=AGENT_EVAL), m),
        warehouse.stage_table(
            "agent_eval_episodes", dataset, pa.Table.from_pylist(episode_rows, schema=AGENT_EVAL_EPISODES), m
        ),
    ]


def evaluate_policy(
    model: PolicyModel,
    policy_id: str,
    tasks: Sequence[CatalogTask],
    seeds: Sequence[int],
    pool: EnvPool,
    *,
    evaluation: str,
    log: Log,
    extra_seeds: Mapping[str, Sequence[int]] | None = None,
    sampling_stream: str | None = None,
) -> tuple[BatchResult, list[EvalEpisode]]:
    """Greedy episodes of ``model`` on ``seeds`` of every task, and on ``extra_seeds[task]`` of
    the tasks named there (in the same pass over the pool). With a ``sampling_stream`` the policy
    samples at temperature 1 instead, as RL does, its draws keyed by the stream and the episode's
    instance (:func:`~training.policy.learned.sampling_key`), so not by the policy id: the same
    model draws the same actions whatever id its materialization gave it."""
    greedy = sampling_stream is None
    policy = LearnedPolicy(
        model, policy_id=f"eval:{policy_id}", greedy=greedy, temperature=1.0, sampling_stream=sampling_stream or ""
    )
    prefix = f"eval:{policy_id}:{evaluation}"
    jobs = episode_jobs(tasks, seeds, prefix)
    for task in tasks:
        jobs += episode_jobs([task], (extra_seeds or {}).get(task.task_id, ()), prefix)
    result, _ = run_episodes(pool, jobs, policy, f"evaluation {policy_id} ({evaluation})", log)
    return result, [eval_episode(policy_id, r) for r in result.episodes]
