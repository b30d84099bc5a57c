"""The rollout stage: a policy acting in live environments through the worker pool, one batch of
a task family at a time, published to the warehouse as episodes, steps and attempts.

A batch fixes the seeds, so running the same (family, batch) again reproduces and replaces its
episodes, and new batches add new episodes. Episodes, steps (with ``env_reward`` and
``milestones_hit``) and every attempt (``rollout_attempts``: completed or aborted, with the
reason) are published atomically, with lineage back to the task spec files and the run's
parameters. The checks read only the rows one run wrote.

``assets/rollouts.py`` declares the Dagster assets around :func:`run_rollout_batch`; the RL stage
calls the same function with its own policies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.miniwob.live import MiniWoBConfig
from envs.policies import make_policy
from envs.policies import policy_names as policy_names
from envs.pool import EnvPool
from envs.pool_jobs import ROLLOUT_ATTEMPTS as ROLLOUT_ATTEMPTS
from envs.pool_jobs import BatchResult, plan_jobs
from envs.protocol import EpisodeRecord, Policy, episode_tables
from envs.task_catalog import CatalogTask, load_catalog, tasks_of_family
from envs.task_catalog import families as families
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown
from warehouse.purposes import EpisodePurpose
from warehouse.schema import same_type
from warehouse.storage import git_revision

ROLLOUT_VERSION = "rollouts-1"
ASSET_NAME = "rollouts"
ANDROID_ASSET_NAME = "android_rollouts"
ATTEMPTS_TABLE = "rollout_attempts"
N_BATCHES = int(os.environ.get("STEPWISE_ROLLOUT_BATCHES", "16"))
BATCH_KEYS = [f"b{i:02d}" for i in range(N_BATCHES)]

Log = Callable[[str], None]
PoolFactory = Callable[[int], AbstractContextManager[EnvPool]]


class RolloutError(RuntimeError):
    """A batch that cannot run (no task of the family fits the policy) or produced no episode."""


@dataclass(frozen=True)
class RolloutRequest:
    """One batch: which tasks of a family, how many episodes with which seeds, which policy."""

    backend: str  # miniwob | android
    family: str
    batch: str  # b00, b01, ...: fixes the seeds
    tasks: tuple[str, ...] = ()  # empty: every task of the family
    episodes_per_task: int = 4
    exploration_policy: str = "noisy_expert"
    noise: float = 0.2
    workers: int = 2
    base_seed: int = 0
    seeds: tuple[int, ...] = ()
    max_steps: int = 0  # 0: the task's own budget


@dataclass
class RolloutSummary:
    """What a published batch holds, for the asset's metadata."""

    materialization_id: str
    result: BatchResult
    outputs: list[TableOutput] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        result = self.result
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
            "success_rate": result.successes / max(1, n),
            "steps": result.steps,
            "steps_per_s": result.steps / max(1e-9, result.seconds),
            "episodes_per_s": n / max(1e-9, result.seconds),
            "milestone_hits": sum(len(s.milestones_hit) for r in result.episodes for s in r.steps),
            "failed_steps": sum(r.failed_steps for r in result.episodes),
            "aborted_attempts": result.aborted_attempts,
            "lost_episodes": len(result.lost),
            "workers_replaced": result.workers_replaced,
            "seconds": float(result.seconds),
            "materialization_id": self.materialization_id,
            "steps_path": next(o.path for o in self.outputs if o.table_name == "steps"),
            "by_task": Markdown("\n".join(lines)),
        }


def exploration_policy(name: str, noise: float) -> Policy:
    """An exploration policy of ``envs.policies`` by name (``noise`` for the noisy expert)."""
    if name == "noisy_expert":
        return make_policy("noisy_expert", noise=noise)
    return make_policy(name)


def _sha256(path: str | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def environment_versions(backend: str) -> dict[str, str]:
    """Versions of what ran the episodes (packages, the browser), recorded with the batch."""
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


class ProgressLog:
    """A progress bar in a run log: a line per tenth of the batch, or every 10 s at least."""

    def __init__(self, log: Log, label: str) -> None:
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
        self.log(
            f"{self.label} [{bar}] {resolved}/{total} episodes ({100 * resolved // max(1, total)}%) | "
            f"{self.successes} successes | {self.steps} steps | {self.steps / elapsed:.1f} steps/s"
            + (f" | {self.lost} lost" if self.lost else "")
        )


def run_rollout_batch(
    warehouse: Warehouse,
    request: RolloutRequest,
    pool_factory: PoolFactory,
    *,
    asset: str,
    run_id: str | None,
    partition_key: str | None,
    spares: int = 0,
    pool_settings: dict[str, Any] | None = None,
    policy: Policy | None = None,
    log: Log = print,
    warn: Log = print,
) -> RolloutSummary:
    """Run one batch of ``request`` through a pool from ``pool_factory(workers)`` and publish it
    as dataset ``<asset>/<family>/<batch>``. ``policy`` overrides the request's exploration policy."""
    catalog = load_catalog(request.backend)
    try:
        tasks: list[CatalogTask] = tasks_of_family(request.family, catalog, request.tasks)
    except KeyError as exc:
        raise RolloutError(str(exc)) from None
    policy = policy or exploration_policy(request.exploration_policy, request.noise)
    supports = getattr(policy, "supports", None)
    skipped = [t.task_id for t in tasks if supports is not None and not supports(t.spec)]
    tasks = [t for t in tasks if t.task_id not in skipped]
    if skipped:
        warn(f"policy {policy.policy_id} cannot run {skipped} (their specs have no solution): skipped")
    if not tasks:
        raise RolloutError(f"no task of family {request.family} can run with policy {policy.policy_id}")
    jobs = plan_jobs(
        tasks,
        batch=request.batch,
        batch_index=BATCH_KEYS.index(request.batch) if request.batch in BATCH_KEYS else 0,
        episodes_per_task=request.episodes_per_task,
        base_seed=request.base_seed,
        seeds=list(request.seeds),
        max_steps=request.max_steps or None,
    )
    log(
        f"{len(jobs)} episodes of {len(tasks)} tasks ({', '.join(t.task_id for t in tasks)}) with "
        f"{policy.policy_id}, {request.workers} workers + {spares} spares"
    )
    with pool_factory(request.workers) as pool:
        log(f"worker pool ready: {len(pool.status())} workers started")
        progress = ProgressLog(log, f"{asset} {request.family}|{request.batch}")
        result = pool.run(jobs, policy, on_episode=progress)
    if not result.episodes:
        reasons = Counter(reason for _, reason in result.lost)
        raise RolloutError(f"no episode completed: {dict(reasons)}")
    parameters = {
        "family": request.family,
        "batch": request.batch,
        "tasks": [t.task_id for t in tasks],
        "skipped_tasks": skipped,
        "policy": policy.policy_id,
        "episodes_per_task": request.episodes_per_task,
        "seeds": sorted({j.seed for j in jobs}),
        "workers": request.workers,
        "spares": spares,
        **(pool_settings or {}),
        "backend": request.backend,
        **environment_versions(request.backend),
    }
    materialization, outputs = publish_rollouts(
        warehouse,
        result,
        asset=asset,
        dataset=f"{asset}/{request.family}/{request.batch}",
        run_id=run_id,
        partition_key=partition_key,
        parameters=parameters,
        spec_paths=[t.spec.path for t in tasks],
    )
    return RolloutSummary(materialization.materialization_id, result, outputs)


def publish_rollouts(
    warehouse: Warehouse,
    result: BatchResult,
    *,
    asset: str,
    dataset: str,
    run_id: str | None,
    partition_key: str | None,
    parameters: dict,
    spec_paths: Iterable[str | None],
    extra_inputs: Iterable[LineageInput] = (),
    purpose: EpisodePurpose = EpisodePurpose.EXPLORATION,
) -> tuple[Materialization, list[TableOutput]]:
    """Write a batch's episodes, steps and attempts as one new version of ``dataset``, atomically."""
    materialization = Materialization(
        asset=asset,
        run_id=run_id,
        partition_key=partition_key,
        code_version=f"{ROLLOUT_VERSION}+{git_revision()}",
        parameters=parameters,
        inputs=[LineageInput(kind="file", path=p, version=_sha256(p)) for p in dict.fromkeys(spec_paths) if p]
        + list(extra_inputs),
    )
    episodes, steps = episode_tables(result.episodes, run_id=run_id, purpose=purpose)
    outputs = [
        warehouse.stage_table("episodes", dataset, episodes, materialization),
        warehouse.stage_table("steps", dataset, steps, materialization),
        warehouse.stage_table(ATTEMPTS_TABLE, dataset, result.attempts_table(run_id), materialization),
    ]
    warehouse.publish(materialization, outputs)
    return materialization, outputs


# -- checks of one run's rows -------------------------------------------------------------------

#: The checks of one rollout run, by name (each becomes the asset check `<asset>_<name>`).
CHECK_DESCRIPTIONS = {
    "whole_episodes": "every episode is whole: steps 0..n-1, n_steps matches, done only at the end; ids unique",
    "attempts_accounted": "each episode has exactly one completed attempt, or a final abort and no episode row",
    "rewards_and_milestones": "env_reward sums to outcome_reward; milestones_hit filled on every step; "
    "some milestones hit",
    "success_and_failure": "the batch holds both successes and failures (reward models need both)",
    "attempts_schema": "the rollout_attempts table has the documented columns and types",
}


def _run_rows(warehouse: Warehouse, sql: str, run_id: str) -> list[dict]:
    return warehouse.query(sql, [run_id]).to_pylist()


def _check_whole_episodes(warehouse: Warehouse, run_id: str) -> tuple[bool, dict]:
    row = _run_rows(
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


def _check_attempts_accounted(warehouse: Warehouse, run_id: str) -> tuple[bool, dict]:
    rows = _run_rows(
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
        "inconsistent": bad[:20],
    }


def _check_rewards_and_milestones(warehouse: Warehouse, run_id: str) -> tuple[bool, dict]:
    row = _run_rows(
        warehouse,
        """
        SELECT count(*) FILTER (WHERE abs(coalesce(r.total, 0) - coalesce(e.outcome_reward, 0)) > 1e-6)
                   AS reward_mismatch,
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


def _check_success_and_failure(warehouse: Warehouse, run_id: str) -> tuple[bool, dict]:
    row = _run_rows(
        warehouse,
        "SELECT count(*) FILTER (WHERE success) AS successes, count(*) FILTER (WHERE NOT success) AS failures "
        "FROM episodes WHERE source = 'rollout' AND run_id = ?",
        run_id,
    )[0]
    return row["successes"] > 0 and row["failures"] > 0, row


def _check_attempts_schema(warehouse: Warehouse, run_id: str) -> tuple[bool, dict]:
    with warehouse.connect(read_only=True) as con:
        actual = con.sql(f"SELECT * FROM {ATTEMPTS_TABLE} LIMIT 0").to_arrow_table().schema
    problems = [
        f"{f.name}: {'missing' if f.name not in actual.names else actual.field(f.name).type}"
        for f in ROLLOUT_ATTEMPTS
        if f.name not in actual.names or not same_type(actual.field(f.name).type, f.type)
    ]
    return not problems, {"problems": problems}


_CHECKS = {
    "whole_episodes": _check_whole_episodes,
    "attempts_accounted": _check_attempts_accounted,
    "rewards_and_milestones": _check_rewards_and_milestones,
    "success_and_failure": _check_success_and_failure,
    "attempts_schema": _check_attempts_schema,
}
WARN_ONLY_CHECKS = frozenset({"success_and_failure"})


def check_rollout_run(warehouse: Warehouse, run_id: str) -> dict[str, CheckOutcome]:
    """Every check of :data:`CHECK_DESCRIPTIONS` over the rows run ``run_id`` wrote."""
    outcomes = {}
    for name, check in _CHECKS.items():
        passed, metadata = check(warehouse, run_id)
        outcomes[name] = CheckOutcome(bool(passed), metadata, CHECK_DESCRIPTIONS[name])
    return outcomes
