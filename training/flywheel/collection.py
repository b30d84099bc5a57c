"""Policy rollouts as data: episodes a policy checkpoint samples at temperature, kept for training.

ProgRM trains its reward models on 7,725 trajectories that actors rolled out (§3, "Reward model
training data"); GUI-Shepherd on rollouts of many agents. Here the actors are Stepwise's own
checkpoints: the SFT policy and the newest RL checkpoint of each reward source, sampled at
temperature on a seed range of their own (:data:`POLICY_ROLLOUT_SEED_BASE`, disjoint from the
training, selection and held-out ranges), one (policy, task family, round) at a time. The episodes
carry ``purpose = policy_rollout`` and the acting checkpoint's ``policy_id``, so the labels stage
labels them like any training episode and every later table can say which policy made what.

A round fixes the seeds, the same for every policy (common random numbers: two checkpoints are
compared on the same instances); running a (policy, family, round) again replaces its episodes
with identical ones (the sampling is seeded by the episode id).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from envs.pool import EnvPool
from envs.pool_jobs import BatchResult, plan_jobs
from envs.rollouts import ProgressLog, RolloutSummary, publish_rollouts
from envs.task_catalog import CatalogTask, load_catalog, tasks_of_family
from training.policy.learned import LearnedPolicy, PolicyModel
from training.policy.store import POLICY_ROLLOUT_SEED_BASE, PolicyNotFoundError, latest_policy
from warehouse.catalog import LineageInput, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.storage import git_revision

COLLECTION_VERSION = "policy-rollouts-1"
ASSET_NAME = "policy_rollouts"
#: Seeds of policy rollouts: round r uses ``POLICY_ROLLOUT_SEED_BASE + SEEDS_PER_ROUND * r + i``.
SEEDS_PER_ROUND = 10_000
MAX_ROUNDS = 100  # the range ends below 5,000,000: clear of every other range

Log = Callable[[str], None]
PoolFactory = Callable[[int], AbstractContextManager[EnvPool]]


class CollectionError(RuntimeError):
    """A collection that cannot start: no such checkpoint, no task to run, bad settings."""


@dataclass(frozen=True)
class CollectionRequest:
    """One (policy, family, round) of policy rollouts.

    ``policy`` is ``sft`` (the newest SFT policy), ``rl-<reward source>`` (the newest RL checkpoint
    trained with that source) or a ``policies.policy_id``. ``tasks`` empty: the policy's own tasks
    in the family (those its RL runs trained on), or every task of the family with ``all_tasks``."""

    policy: str
    family: str
    round: int = 0
    episodes_per_task: int = 16
    temperature: float = 1.0
    tasks: tuple[str, ...] = ()
    all_tasks: bool = False
    workers: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.round < MAX_ROUNDS:
            raise CollectionError(f"round must be in 0..{MAX_ROUNDS - 1}, got {self.round}")
        if not 0 < self.episodes_per_task <= SEEDS_PER_ROUND:
            raise CollectionError(f"episodes_per_task must be in 1..{SEEDS_PER_ROUND}, got {self.episodes_per_task}")
        if self.temperature <= 0:
            raise CollectionError(f"temperature must be positive (sampling, not greedy), got {self.temperature}")
        if self.workers < 1:
            raise CollectionError(f"workers must be at least 1, got {self.workers}")

    @property
    def seeds(self) -> list[int]:
        start = POLICY_ROLLOUT_SEED_BASE + SEEDS_PER_ROUND * self.round
        return list(range(start, start + self.episodes_per_task))


def resolve_policy(warehouse: Warehouse, policy: str) -> dict[str, Any]:
    """The ``policies`` row a collection's ``policy`` names (see :class:`CollectionRequest`)."""
    try:
        if policy == "sft":
            return latest_policy(warehouse, "sft")
        if policy.startswith("rl-"):
            # the source's own REINFORCE++ run, not a run of another estimator (outcome_kl_apart, admire_grpo)
            return latest_policy(warehouse, "rl", reward_source=policy.removeprefix("rl-"), estimator="reinforce_pp")
        return latest_policy(warehouse, policy_id=policy)
    except PolicyNotFoundError as exc:
        raise CollectionError(f"policy {policy!r}: {exc}") from None


def collection_tasks(request: CollectionRequest, policy_row: dict[str, Any]) -> list[CatalogTask]:
    """The catalog tasks a collection runs (see :class:`CollectionRequest`)."""
    catalog = load_catalog("miniwob")
    try:
        family_tasks = tasks_of_family(request.family, catalog, request.tasks)
    except KeyError as exc:
        raise CollectionError(str(exc)) from None
    if request.tasks or request.all_tasks:
        chosen = family_tasks
    else:
        own = set(policy_row.get("tasks") or ())
        chosen = [t for t in family_tasks if t.task_id in own]
    if not chosen:
        raise CollectionError(
            f"policy {policy_row['policy_id']} has no task in family {request.family} "
            f"(its tasks: {list(policy_row.get('tasks') or [])}); name tasks or set all_tasks"
        )
    return chosen


def load_policy_model(policy_row: dict[str, Any]) -> PolicyModel:
    """The checkpoint of a ``policies`` row, or a one-line :class:`CollectionError` naming the policy
    and the file (missing, truncated, or a file of another kind: another encoder's policy, a reward
    model), before any browser starts."""
    try:
        return PolicyModel.load(policy_row["checkpoint"])
    except Exception as exc:  # noqa: BLE001 - torch's unpickler raises anything (IndexError on a truncated file)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = policy_row["checkpoint"]
        raise CollectionError(
            f"policy {policy_row['policy_id']}: its checkpoint {where} cannot be loaded: {first}"
        ) from None


def episode_id(policy_id: str, task_id: str, round_: int, seed: int) -> str:
    return f"policy:{policy_id}:{task_id}:r{round_:02d}:{seed}"


def run_collection(
    warehouse: Warehouse,
    request: CollectionRequest,
    pool_factory: PoolFactory,
    *,
    run_id: str | None,
    partition_key: str | None,
    log: Log = print,
) -> dict[str, Any]:
    """Sample ``request``'s episodes with its policy and publish them as dataset
    ``policy_rollouts/<policy>/<family>/r<round>`` (episodes, steps, attempts), lineage naming the
    checkpoint. Everything is checked before the first browser starts."""
    policy_row = resolve_policy(warehouse, request.policy)
    tasks = collection_tasks(request, policy_row)
    policy_id = policy_row["policy_id"]
    model = load_policy_model(policy_row)
    acting = LearnedPolicy(model, policy_id=policy_id, temperature=request.temperature)
    jobs = [
        replace(job, episode_id=episode_id(policy_id, job.task.task_id, request.round, job.seed))
        for job in plan_jobs(tasks, batch=f"r{request.round:02d}", seeds=request.seeds)
    ]
    log(
        f"{len(jobs)} episodes of {len(tasks)} tasks ({', '.join(t.task_id for t in tasks)}) sampled from "
        f"{policy_id} at temperature {request.temperature}, round {request.round}"
    )
    with pool_factory(request.workers) as pool:
        result: BatchResult = pool.run(jobs, acting, on_episode=ProgressLog(log, f"{ASSET_NAME} {request.family}"))
    if not result.episodes:
        raise CollectionError(f"no episode completed ({len(result.lost)} lost)")
    kind_asset = "policy_sft" if policy_row["kind"] == "sft" else "rl_run"
    materialization, outputs = publish_rollouts(
        warehouse,
        result,
        asset=ASSET_NAME,
        dataset=f"{ASSET_NAME}/{request.policy}/{request.family}/r{request.round:02d}",
        run_id=run_id,
        partition_key=partition_key,
        parameters={
            "policy": request.policy,
            "policy_id": policy_id,
            "family": request.family,
            "round": request.round,
            "tasks": [t.task_id for t in tasks],
            "seeds": request.seeds,
            "temperature": request.temperature,
            "workers": request.workers,
            "collection_version": COLLECTION_VERSION,
            "git_revision": git_revision(),
        },
        spec_paths=[t.spec.path for t in tasks],
        extra_inputs=[
            LineageInput(kind="asset", input_asset=kind_asset, path=policy_row["checkpoint_path"], version=policy_id)
        ],
        purpose=EpisodePurpose.POLICY_ROLLOUT,
    )
    # The rollout stage's own summary (episodes, success, steps/s, milestones, a table by task).
    summary = RolloutSummary(materialization.materialization_id, result, outputs).metadata()
    return {"policy_id": policy_id, **summary}


def policy_keys(reward_sources: Sequence[str]) -> list[str]:
    """The policy dimension of the asset's partitions: ``sft`` and ``rl-<source>`` per reward source."""
    return ["sft", *(f"rl-{source}" for source in reward_sources)]
