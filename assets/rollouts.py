"""Rollout stage: policies acting in live environments -> episodes and steps in the warehouse.

``rollouts`` runs the MiniWoB++ catalog (``envs.catalog``) in Chromium through the worker pool
(``envs.pool``); ``android_rollouts`` runs the Android catalog on the devices configured on the
``env_pool`` resource. Both are partitioned by task family x batch: a batch fixes the seeds, so
re-materializing a partition reproduces and replaces it, and new batches add new episodes.
Episodes, steps (with ``env_reward`` and ``milestones_hit``) and every attempt
(``rollout_attempts``: completed or aborted, with the reason) are published atomically, with
lineage back to the task spec files and the run's parameters.

Register in Definitions: ``ROLLOUT_ASSETS``, ``ROLLOUT_CHECKS``, ``ROLLOUT_JOBS`` and the
resources of ``ROLLOUT_RESOURCES`` (plus the ``warehouse`` resource the project already has).
Both assets are partitioned, so keep them out of an unpartitioned job selecting everything.
"""

import hashlib
import importlib.metadata
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
    multi_asset_check,
)
from pydantic import Field

from assets.resources import EnvPoolResource, WarehouseResource
from envs.catalog import CatalogTask, families, load_catalog, tasks_of_family
from envs.miniwob.live import MiniWoBConfig
from envs.policies import make_policy, policy_names
from envs.pool import BatchResult, plan_jobs
from envs.protocol import EpisodeRecord, episode_tables
from warehouse.catalog import LineageInput, Materialization, TableOutput
from warehouse.schema import same_type
from warehouse.storage import git_revision

ROLLOUT_VERSION = "rollouts-1"
ASSET_NAME = "rollouts"
ANDROID_ASSET_NAME = "android_rollouts"
ATTEMPTS_TABLE = "rollout_attempts"
N_BATCHES = int(os.environ.get("STEPWISE_ROLLOUT_BATCHES", "16"))
BATCH_KEYS = [f"b{i:02d}" for i in range(N_BATCHES)]

MINIWOB_PARTITIONS = MultiPartitionsDefinition(
    {"batch": StaticPartitionsDefinition(BATCH_KEYS), "family": StaticPartitionsDefinition(families("miniwob"))}
)
ANDROID_PARTITIONS = MultiPartitionsDefinition(
    {"batch": StaticPartitionsDefinition(BATCH_KEYS), "family": StaticPartitionsDefinition(families("android"))}
)


class RolloutConfig(Config):
    tasks: list[str] = Field(default=[], description="task ids within the partition's family; empty: all of them")
    episodes_per_task: int = Field(default=4, description="episodes per task (ignored when seeds are given)")
    policy: str = Field(default="noisy_expert", description=f"exploration policy, one of {policy_names()}")
    noise: float = Field(default=0.2, description="noisy_expert: probability that a step wanders off the solution")
    workers: int = Field(default=2, description="episodes run at once (2 suits a 2-core machine)")
    base_seed: int = Field(default=0, description="seeds are base_seed + 10000 * batch number + episode index")
    seeds: list[int] = Field(default=[], description="explicit seeds for every task (overrides the derived ones)")
    max_steps: int = Field(default=0, description="step budget per episode; 0: the task's own")


def _policy(config: RolloutConfig):
    if config.policy == "noisy_expert":
        return make_policy("noisy_expert", noise=config.noise)
    return make_policy(config.policy)


def _sha256(path: str | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _environment_versions(backend: str) -> dict[str, str]:
    versions = {
        "miniwob": importlib.metadata.version("miniwob"),
        "uiautomator2": importlib.metadata.version("uiautomator2"),
    }
    if backend == "miniwob":
        try:
            versions["chromium"] = subprocess.run(
                [MiniWoBConfig.chromium_binary, "--version"], capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            versions["chromium"] = "unknown"
    return versions


class _ProgressLog:
    """A progress bar in the run log: a line per tenth of the batch, or every 10 s at least."""

    def __init__(self, log, label: str) -> None:
        self.log, self.label = log, label
        self.started = time.perf_counter()
        self.last_decile, self.last_time = -1, 0.0
        self.successes = self.steps = self.lost = 0

    def __call__(self, record: EpisodeRecord | None, resolved: int, total: int) -> None:
        if record is None:
            self.lost += 1
        else:
            self.successes += record.success
            self.steps += record.n_steps
        decile = resolved * 10 // max(1, total)
        now = time.perf_counter()
        if decile == self.last_decile and now - self.last_time < 10 and resolved != total:
            return
        self.last_decile, self.last_time = decile, now
        elapsed = max(1e-9, now - self.started)
        bar = "#" * decile + "-" * (10 - decile)
        self.log.info(
            f"{self.label} [{bar}] {resolved}/{total} episodes ({100 * resolved // max(1, total)}%) | "
            f"{self.successes} successes | {self.steps} steps | {self.steps / elapsed:.1f} steps/s"
            + (f" | {self.lost} lost" if self.lost else "")
        )


def _run_rollouts(
    context: AssetExecutionContext,
    config: RolloutConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
    backend: str,
    asset_name: str,
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    family, batch = keys["family"], keys["batch"]
    catalog = load_catalog(backend)
    try:
        tasks: list[CatalogTask] = tasks_of_family(family, catalog, config.tasks)
    except KeyError as exc:
        raise Failure(str(exc)) from None
    policy = _policy(config)
    supports = getattr(policy, "supports", None)
    skipped = [t.task_id for t in tasks if supports is not None and not supports(t.spec)]
    tasks = [t for t in tasks if t.task_id not in skipped]
    if skipped:
        context.log.warning(f"policy {policy.policy_id} cannot run {skipped} (their specs have no solution): skipped")
    if not tasks:
        raise Failure(f"no task of family {family} can run with policy {policy.policy_id}")
    jobs = plan_jobs(
        tasks,
        batch=batch,
        batch_index=BATCH_KEYS.index(batch),
        episodes_per_task=config.episodes_per_task,
        base_seed=config.base_seed,
        seeds=config.seeds,
        max_steps=config.max_steps or None,
    )
    context.log.info(
        f"{len(jobs)} episodes of {len(tasks)} tasks ({', '.join(t.task_id for t in tasks)}) with "
        f"{policy.policy_id}, {config.workers} workers + {env_pool.spares} spares"
    )
    pool = (env_pool.miniwob_pool if backend == "miniwob" else env_pool.android_pool)(
        config.workers, log=context.log.warning
    )
    with pool:
        context.log.info(f"worker pool ready: {len(pool.status())} workers started")
        progress = _ProgressLog(context.log, f"{asset_name} {family}|{batch}")
        result = pool.run(jobs, policy, on_episode=progress)
    if not result.episodes:
        reasons = Counter(reason for _, reason in result.lost)
        raise Failure(f"no episode completed: {dict(reasons)}")
    parameters = {
        "family": family,
        "batch": batch,
        "tasks": [t.task_id for t in tasks],
        "skipped_tasks": skipped,
        "policy": policy.policy_id,
        "episodes_per_task": config.episodes_per_task,
        "seeds": sorted({j.seed for j in jobs}),
        "workers": config.workers,
        "spares": env_pool.spares,
        "step_timeout_s": env_pool.step_timeout_s,
        "max_attempts": env_pool.max_attempts,
        "backend": backend,
        **_environment_versions(backend),
    }
    materialization, outputs = publish_rollouts(
        warehouse,
        result,
        asset=asset_name,
        dataset=f"{asset_name}/{family}/{batch}",
        run_id=context.run_id,
        partition_key=context.partition_key,
        parameters=parameters,
        spec_paths=[t.spec.path for t in tasks],
    )
    return MaterializeResult(metadata=_metadata(result, materialization.materialization_id, outputs))


def publish_rollouts(
    warehouse: WarehouseResource,
    result: BatchResult,
    *,
    asset: str,
    dataset: str,
    run_id: str | None,
    partition_key: str | None,
    parameters: dict,
    spec_paths: list[str | None],
) -> tuple[Materialization, list[TableOutput]]:
    """Write a batch's episodes, steps and attempts as one new version of ``dataset``, atomically."""
    store = warehouse.get()
    materialization = Materialization(
        asset=asset,
        run_id=run_id,
        partition_key=partition_key,
        code_version=f"{ROLLOUT_VERSION}+{git_revision()}",
        parameters=parameters,
        inputs=[LineageInput(kind="file", path=p, version=_sha256(p)) for p in dict.fromkeys(spec_paths) if p],
    )
    episodes, steps = episode_tables(result.episodes, run_id=run_id)
    outputs = [
        store.stage_table("episodes", dataset, episodes, materialization),
        store.stage_table("steps", dataset, steps, materialization),
        store.stage_table(ATTEMPTS_TABLE, dataset, result.attempts_table(run_id), materialization),
    ]
    store.publish(materialization, outputs)
    return materialization, outputs


def _metadata(result: BatchResult, materialization_id: str, outputs: list[TableOutput]) -> dict:
    by_task: dict[str, list[EpisodeRecord]] = {}
    for record in result.episodes:
        by_task.setdefault(record.task_id, []).append(record)
    lines = ["| task | episodes | success | milestones reached | failed steps |", "|---|---|---|---|---|"]
    for task_id, records in by_task.items():
        reached = sum(r.milestones_reached for r in records) / max(1, sum(r.n_milestones for r in records))
        lines.append(
            f"| {task_id} | {len(records)} | {sum(r.success for r in records) / len(records):.0%} | "
            f"{reached:.0%} | {sum(r.failed_steps for r in records)} |"
        )
    n = len(result.episodes)
    return {
        "episodes": n,
        "successes": result.successes,
        "failures": n - result.successes,
        "success_rate": MetadataValue.float(result.successes / max(1, n)),
        "steps": result.steps,
        "steps_per_s": MetadataValue.float(result.steps / max(1e-9, result.seconds)),
        "episodes_per_s": MetadataValue.float(n / max(1e-9, result.seconds)),
        "milestone_hits": sum(len(s.milestones_hit) for r in result.episodes for s in r.steps),
        "failed_steps": sum(r.failed_steps for r in result.episodes),
        "aborted_attempts": result.aborted_attempts,
        "lost_episodes": len(result.lost),
        "workers_replaced": result.workers_replaced,
        "seconds": MetadataValue.float(result.seconds),
        "materialization_id": materialization_id,
        "steps_path": MetadataValue.path(str(next(o.path for o in outputs if o.table_name == "steps"))),
        "by_task": MetadataValue.md("\n".join(lines)),
    }


@asset(
    name=ASSET_NAME,
    group_name="rollouts",
    partitions_def=MINIWOB_PARTITIONS,
    code_version=ROLLOUT_VERSION,
    kinds={"chromium", "parquet", "duckdb"},
    description=(
        "Episodes of the MiniWoB++ task catalog run live in Chromium by an exploration policy (scripted "
        "noisy expert or random walk) through a fault-tolerant worker pool; steps carry the benchmark's "
        "reward and the task specs' milestones. Tables `episodes`, `steps`, `rollout_attempts`."
    ),
)
def rollouts(
    context: AssetExecutionContext, config: RolloutConfig, warehouse: WarehouseResource, env_pool: EnvPoolResource
) -> MaterializeResult:
    return _run_rollouts(context, config, warehouse, env_pool, "miniwob", ASSET_NAME)


@asset(
    name=ANDROID_ASSET_NAME,
    group_name="rollouts",
    partitions_def=ANDROID_PARTITIONS,
    code_version=ROLLOUT_VERSION,
    kinds={"android", "parquet", "duckdb"},
    description=(
        "Episodes of the Android task catalog on emulators/devices through uiautomator2 (set "
        "`env_pool.android_devices`); same tables and pool as `rollouts`."
    ),
)
def android_rollouts(
    context: AssetExecutionContext, config: RolloutConfig, warehouse: WarehouseResource, env_pool: EnvPoolResource
) -> MaterializeResult:
    return _run_rollouts(context, config, warehouse, env_pool, "android", ANDROID_ASSET_NAME)


# -- asset checks -----------------------------------------------------------------------------
# One multi-asset check per asset: the five checks share one step (one process under the
# multiprocess executor instead of five) and read only the rows this run wrote.

CHECK_DESCRIPTIONS = {
    "whole_episodes": "every episode is whole: steps 0..n-1, n_steps matches, done only at the end; ids unique",
    "attempts_accounted": "each episode has exactly one completed attempt, or a final abort and no episode row",
    "rewards_and_milestones": "env_reward sums to outcome_reward; milestones_hit filled on every step; some milestones hit",
    "success_and_failure": "the batch holds both successes and failures (reward models need both)",
    "attempts_schema": "the rollout_attempts table has the documented columns and types",
}


def _rows(warehouse: WarehouseResource, sql: str, run_id: str) -> list[dict]:
    return warehouse.get().query(sql, [run_id]).to_pylist()


def _check_whole_episodes(warehouse: WarehouseResource, run_id: str) -> tuple[bool, dict]:
    row = _rows(
        warehouse,
        """
        WITH s AS (SELECT episode_id, count(*) AS n, count(DISTINCT step_idx) AS distinct_idx,
                          min(step_idx) AS lo, max(step_idx) AS hi, count(*) FILTER (WHERE done) AS dones,
                          max(step_idx) FILTER (WHERE done) AS done_idx
                   FROM steps GROUP BY episode_id)
        SELECT count(*) AS episodes,
               count(*) FILTER (WHERE s.n IS NULL OR s.n <> e.n_steps OR s.distinct_idx <> s.n
                                OR s.lo <> 0 OR s.hi <> e.n_steps - 1) AS broken,
               count(*) FILTER (WHERE s.dones IS DISTINCT FROM 1 OR s.done_idx IS DISTINCT FROM s.hi) AS bad_done,
               count(*) - count(DISTINCT e.episode_id) AS duplicates
        FROM episodes e LEFT JOIN s USING (episode_id)
        WHERE e.source = 'rollout' AND e.run_id = ?
        """,
        run_id,
    )[0]
    passed = row["episodes"] > 0 and row["broken"] == 0 and row["bad_done"] == 0 and row["duplicates"] == 0
    return passed, {k: int(v) for k, v in row.items()}


def _check_attempts_accounted(warehouse: WarehouseResource, run_id: str) -> tuple[bool, dict]:
    rows = _rows(
        warehouse,
        f"""
        SELECT a.episode_id,
               count(*) FILTER (WHERE a.status = 'completed') AS completed,
               count(*) FILTER (WHERE a.status = 'aborted') AS aborted,
               count(*) FILTER (WHERE a.status = 'aborted' AND a.final) AS final_aborts,
               bool_or(e.episode_id IS NOT NULL) AS has_episode
        FROM {ATTEMPTS_TABLE} a LEFT JOIN episodes e ON e.episode_id = a.episode_id AND e.run_id = a.run_id
        WHERE a.run_id = ? GROUP BY a.episode_id
        """,
        run_id,
    )
    bad = [
        r["episode_id"]
        for r in rows
        if not (
            (r["completed"] == 1 and r["has_episode"])
            or (r["completed"] == 0 and r["final_aborts"] == 1 and not r["has_episode"])
        )
    ]
    return bool(rows) and not bad, {
        "episodes": len(rows),
        "aborted_attempts": sum(r["aborted"] for r in rows),
        "lost_episodes": sum(r["completed"] == 0 for r in rows),
        "inconsistent": MetadataValue.json(bad[:20]),
    }


def _check_rewards_and_milestones(warehouse: WarehouseResource, run_id: str) -> tuple[bool, dict]:
    row = _rows(
        warehouse,
        """
        SELECT count(*) FILTER (WHERE abs(coalesce(r.total, 0) - coalesce(e.outcome_reward, 0)) > 1e-6) AS reward_mismatch,
               sum(r.null_milestones) AS null_milestones, sum(r.hits) AS milestone_hits,
               count(*) FILTER (WHERE r.hits > 0) AS episodes_with_milestones
        FROM episodes e JOIN (SELECT episode_id, sum(env_reward) AS total,
                                     count(*) FILTER (WHERE milestones_hit IS NULL) AS null_milestones,
                                     sum(len(milestones_hit)) AS hits
                              FROM steps GROUP BY episode_id) r USING (episode_id)
        WHERE e.source = 'rollout' AND e.run_id = ?
        """,
        run_id,
    )[0]
    metadata = {k: int(v or 0) for k, v in row.items()}
    passed = metadata["reward_mismatch"] == 0 and metadata["null_milestones"] == 0 and metadata["milestone_hits"] > 0
    return passed, metadata


def _check_success_and_failure(warehouse: WarehouseResource, run_id: str) -> tuple[bool, dict]:
    row = _rows(
        warehouse,
        "SELECT count(*) FILTER (WHERE success) AS successes, count(*) FILTER (WHERE NOT success) AS failures "
        "FROM episodes WHERE source = 'rollout' AND run_id = ?",
        run_id,
    )[0]
    return row["successes"] > 0 and row["failures"] > 0, row


def _check_attempts_schema(warehouse: WarehouseResource, run_id: str) -> tuple[bool, dict]:
    from envs.pool import ROLLOUT_ATTEMPTS

    with warehouse.get().connect(read_only=True) as con:
        actual = con.sql(f"SELECT * FROM {ATTEMPTS_TABLE} LIMIT 0").to_arrow_table().schema
    problems = [
        f"{f.name}: {'missing' if f.name not in actual.names else actual.field(f.name).type}"
        for f in ROLLOUT_ATTEMPTS
        if f.name not in actual.names or not same_type(actual.field(f.name).type, f.type)
    ]
    return not problems, {"problems": MetadataValue.json(problems)}


_CHECKS = {
    "whole_episodes": _check_whole_episodes,
    "attempts_accounted": _check_attempts_accounted,
    "rewards_and_milestones": _check_rewards_and_milestones,
    "success_and_failure": _check_success_and_failure,
    "attempts_schema": _check_attempts_schema,
}
_WARN_ONLY = {"success_and_failure"}


def _make_checks(asset_name: str):
    specs = [
        AssetCheckSpec(f"{asset_name}_{name}", asset=asset_name, description=description)
        for name, description in CHECK_DESCRIPTIONS.items()
    ]

    @multi_asset_check(specs=specs, name=f"{asset_name}_checks", description=f"data checks of {asset_name}")
    def checks(context: AssetCheckExecutionContext, warehouse: WarehouseResource):
        run_id = context.run.run_id
        for name, check in _CHECKS.items():
            passed, metadata = check(warehouse, run_id)
            yield AssetCheckResult(
                asset_key=asset_name,
                check_name=f"{asset_name}_{name}",
                passed=bool(passed),
                severity=AssetCheckSeverity.WARN if name in _WARN_ONLY else AssetCheckSeverity.ERROR,
                metadata=metadata,
            )

    return checks


ROLLOUT_ASSETS = [rollouts, android_rollouts]
ROLLOUT_CHECKS = [_make_checks(ASSET_NAME), _make_checks(ANDROID_ASSET_NAME)]
ROLLOUT_JOBS = [
    define_asset_job(
        "miniwob_rollouts_job",
        selection=[ASSET_NAME],
        partitions_def=MINIWOB_PARTITIONS,
        description="MiniWoB++ rollouts, one family x batch partition per run",
    ),
    define_asset_job(
        "android_rollouts_job",
        selection=[ANDROID_ASSET_NAME],
        partitions_def=ANDROID_PARTITIONS,
        description="Android rollouts on the configured devices",
    ),
]
