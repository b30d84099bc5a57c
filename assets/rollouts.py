"""Rollouts stage (group ``rollouts``): policies acting in live environments -> episodes and steps.

``rollouts`` runs the MiniWoB++ catalog in Chromium through the worker pool; ``android_rollouts``
runs the Android catalog on the devices configured on the ``env_pool`` resource. Both are
partitioned by batch x task family (a batch fixes the seeds). Both are partitioned, so keep them
out of an unpartitioned job selecting everything.

Stage logic: :mod:`envs.rollouts`.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    Failure,
    MaterializeResult,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
    multi_asset_check,
)
from pydantic import Field

from assets.config import renamed_field
from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import EnvPoolResource, WarehouseResource
from envs.rollouts import (
    ANDROID_ASSET_NAME,
    ASSET_NAME,
    ATTEMPTS_TABLE,
    BATCH_KEYS,
    CHECK_DESCRIPTIONS,
    ROLLOUT_ATTEMPTS,
    ROLLOUT_VERSION,
    WARN_ONLY_CHECKS,
    RolloutError,
    RolloutRequest,
    check_rollout_run,
    families,
    policy_names,
    run_rollout_batch,
)

GROUP = "rollouts"
MINIWOB_PARTITIONS = MultiPartitionsDefinition(
    {"batch": StaticPartitionsDefinition(BATCH_KEYS), "family": StaticPartitionsDefinition(families("miniwob"))}
)
ANDROID_PARTITIONS = MultiPartitionsDefinition(
    {"batch": StaticPartitionsDefinition(BATCH_KEYS), "family": StaticPartitionsDefinition(families("android"))}
)


class RolloutConfig(Config):
    tasks: list[str] = Field(default=[], description="task ids within the partition's family; empty: all of them")
    episodes_per_task: int = Field(default=4, description="episodes per task (ignored when seeds are given)")
    exploration_policy: str = Field(default="noisy_expert", description=f"one of {policy_names()}")
    policy: str | None = Field(default=None, description="the old name of exploration_policy (still accepted)")
    noise: float = Field(default=0.2, description="noisy_expert: probability that a step wanders off the solution")
    workers: int = Field(default=2, description="episodes run at once (2 suits a 2-core machine)")
    base_seed: int = Field(default=0, description="seeds are base_seed + 10000 * batch number + episode index")
    seeds: list[int] = Field(default=[], description="explicit seeds for every task (overrides the derived ones)")
    max_steps: int = Field(default=0, description="step budget per episode; 0: the task's own")


def _materialize(
    context: AssetExecutionContext,
    config: RolloutConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
    backend: str,
    asset_name: str,
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    request = RolloutRequest(
        backend=backend,
        family=keys["family"],
        batch=keys["batch"],
        tasks=tuple(config.tasks),
        episodes_per_task=config.episodes_per_task,
        exploration_policy=renamed_field(config, "policy", "exploration_policy", context.log.warning),
        noise=config.noise,
        workers=config.workers,
        base_seed=config.base_seed,
        seeds=tuple(config.seeds),
        max_steps=config.max_steps,
    )
    wh = warehouse.get()
    try:
        summary = run_rollout_batch(
            wh,
            request,
            lambda workers: env_pool.pool(backend, workers, log=context.log.warning),
            asset=asset_name,
            run_id=context.run_id,
            partition_key=context.partition_key,
            spares=env_pool.spares,
            pool_settings=env_pool.settings(),
            log=context.log.info,
            warn=context.log.warning,
        )
    except RolloutError as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(
        metadata=to_metadata(summary.metadata()) | table_metadata(wh, "episodes", also=("steps", ATTEMPTS_TABLE))
    )


@asset(
    name=ASSET_NAME,
    group_name=GROUP,
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
    return _materialize(context, config, warehouse, env_pool, "miniwob", ASSET_NAME)


@asset(
    name=ANDROID_ASSET_NAME,
    group_name=GROUP,
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
    return _materialize(context, config, warehouse, env_pool, "android", ANDROID_ASSET_NAME)


def rollout_checks(asset_name: str) -> AssetsDefinition:
    """One multi-asset check per asset: the checks share one step (one process under the
    multiprocess executor instead of five) and read only the rows this run wrote."""
    specs = [
        AssetCheckSpec(f"{asset_name}_{name}", asset=asset_name, description=description)
        for name, description in CHECK_DESCRIPTIONS.items()
    ]

    @multi_asset_check(specs=specs, name=f"{asset_name}_checks", description=f"data checks of {asset_name}")
    def checks(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> Iterator[AssetCheckResult]:
        for name, outcome in check_rollout_run(warehouse.get(), context.run.run_id).items():
            yield check_result(
                outcome, check_name=f"{asset_name}_{name}", asset_key=asset_name, warn_only=name in WARN_ONLY_CHECKS
            )

    return checks


ROLLOUT_ASSETS = [rollouts, android_rollouts]
ROLLOUT_CHECKS = [
    rollout_checks(ASSET_NAME),
    rollout_checks(ANDROID_ASSET_NAME),
    *(
        unique_key_checks(name, {"episodes": None, "steps": None, ATTEMPTS_TABLE: ROLLOUT_ATTEMPTS})
        for name in (ASSET_NAME, ANDROID_ASSET_NAME)
    ),
]
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
