"""The reward flywheel (group ``flywheel``): the agent's own episodes as reward-model data.

``policy_rollouts`` samples episodes from a policy checkpoint (the SFT policy or the newest RL
checkpoint of a reward source) at temperature, partitioned by policy x task family; a round
(config) fixes the seeds. Its episodes are ``purpose = policy_rollout``: the labels stage (its
sensor sees new episodes of a family) labels them, the split and the reward-model datasets take
them like any other training episode.

Stage logic: :mod:`training.flywheel`.
"""

from collections.abc import Callable, Iterator
from typing import Any, cast

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
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

from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import EnvPoolResource, WarehouseResource
from envs.rollouts import ATTEMPTS_TABLE, ROLLOUT_ATTEMPTS, families
from training.flywheel.alternative_labels import RecordingLabels
from training.flywheel.alternatives import (
    ALTERNATIVES_VERSION,
    SOURCE_PURPOSES,
    AlternativesRequest,
    check_alternatives_run,
    run_alternatives,
)
from training.flywheel.alternatives import ASSET_NAME as ALTERNATIVES_ASSET
from training.flywheel.collection import (
    ASSET_NAME,
    COLLECTION_VERSION,
    CollectionError,
    CollectionRequest,
    policy_keys,
    run_collection,
)
from training.flywheel.rounds import ASSET_NAME as ROUND_ASSET
from training.flywheel.rounds import ROUNDS_VERSION, FlywheelError, record_round
from training.rl.rewards import REWARD_SOURCES
from warehouse.catalog import Warehouse
from warehouse.plotting import Markdown

GROUP = "flywheel"
POLICY_ROLLOUT_PARTITIONS = MultiPartitionsDefinition(
    {
        "family": StaticPartitionsDefinition(families("miniwob")),
        "policy": StaticPartitionsDefinition(policy_keys(REWARD_SOURCES)),
    }
)


class PolicyRolloutConfig(Config):
    round: int = Field(default=0, description="fixes the seeds (the same for every policy); a new round adds episodes")
    episodes_per_task: int = Field(default=16, description="episodes per task")
    temperature: float = Field(default=1.0, description="sampling temperature (1: the policy's own distribution)")
    tasks: list[str] = Field(default=[], description="task ids in the family; empty: the policy's own tasks there")
    all_tasks: bool = Field(default=False, description="every task of the family instead of the policy's own")
    workers: int = Field(default=2, description="episodes run at once (2 suits a 2-core machine)")


@asset(
    name=ASSET_NAME,
    group_name=GROUP,
    partitions_def=POLICY_ROLLOUT_PARTITIONS,
    code_version=COLLECTION_VERSION,
    deps=["policy_sft"],
    kinds={"chromium", "pytorch", "parquet"},
    description=(
        "Episodes sampled at temperature from a policy checkpoint (SFT, or the newest RL checkpoint of a "
        "reward source) on live MiniWoB++, on seeds of their own (never an evaluation seed): reward-model "
        "training data from the agent itself (ProgRM §3). `episodes.purpose = 'policy_rollout'`, "
        "`episodes.policy_id` names the checkpoint."
    ),
)
def policy_rollouts(
    context: AssetExecutionContext,
    config: PolicyRolloutConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    wh = warehouse.get()

    def request() -> CollectionRequest:
        return CollectionRequest(
            policy=keys["policy"],
            family=keys["family"],
            round=config.round,
            episodes_per_task=config.episodes_per_task,
            temperature=config.temperature,
            tasks=tuple(config.tasks),
            all_tasks=config.all_tasks,
            workers=config.workers,
        )

    summary = _run_partition(context, wh, env_pool, run_collection, request)
    return MaterializeResult(metadata=to_metadata(summary) | table_metadata(wh, "episodes", also=("steps",)))


def _run_partition(
    context: AssetExecutionContext,
    wh: Warehouse,
    env_pool: EnvPoolResource,
    stage: Callable[..., dict[str, Any]],
    request: Callable[[], Any],
) -> dict[str, Any]:
    """Run a flywheel stage on a partition with live MiniWoB++ workers; a request that cannot run
    (bad settings, no checkpoint, nothing to replay) fails with its one line, before any browser."""
    try:
        return stage(
            wh,
            request(),
            lambda workers: env_pool.pool("miniwob", workers, log=context.log.warning),
            run_id=context.run_id,
            partition_key=context.partition_key,
            log=context.log.info,
        )
    except CollectionError as exc:
        raise Failure(str(exc)) from None


class AlternativesConfig(Config):
    round: int = Field(
        default=0, description="the round (its policy rollouts give states; the held-out states ignore it)"
    )
    states_per_task: int = Field(default=8, description="states sampled per task and source")
    top_k: int = Field(default=4, description="the policy's most probable candidates replayed at each state")
    continuations: int = Field(default=4, description="m: continuations by the policy after each candidate")
    horizon: int = Field(default=0, description="steps of a continuation (0: the rest of the task's budget)")
    temperature: float = Field(default=1.0, description="sampling temperature of the continuations")
    sources: list[str] = Field(
        default=list(SOURCE_PURPOSES),
        description="where states come from: policy_rollout, exploration, evaluation; also selection (the "
        "policy's evaluation episodes on selection seeds: held-out states for guidance's abstention margin)",
    )
    tasks: list[str] = Field(default=[], description="task ids in the family; empty: the policy's own tasks there")
    all_tasks: bool = Field(default=False, description="every task of the family instead of the policy's own")
    workers: int = Field(default=2, description="replays run at once")
    recording_labels: str = Field(
        default="diverged",
        description="where candidates are labelled from the recording instead of by replay (the plan's step, "
        "the field a typed value belongs to, the recorded continuation): diverged (states no replay reproduced), "
        "always (no browser starts), never (such states are dropped)",
    )


@asset(
    name=ALTERNATIVES_ASSET,
    group_name=GROUP,
    partitions_def=POLICY_ROLLOUT_PARTITIONS,
    code_version=ALTERNATIVES_VERSION,
    deps=[ASSET_NAME],
    kinds={"chromium", "pytorch", "parquet"},
    description=(
        "Alternatives at one state (GuidNav self-play, Math-Shepherd Monte-Carlo labels): at states sampled from "
        "the policy's rollouts, expert rollouts and (held out) its evaluation episodes, the policy's top-k "
        "candidates, each carried out by deterministic replay and labelled by the plan's next step, the milestones "
        "it reaches and the success of m continuations. Where no replay reproduces a state, its candidates are "
        "labelled from the recording (labelled_by = 'recording')."
    ),
)
def step_alternatives(
    context: AssetExecutionContext,
    config: AlternativesConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    wh = warehouse.get()

    def request() -> AlternativesRequest:
        return AlternativesRequest(
            policy=keys["policy"],
            family=keys["family"],
            round=config.round,
            states_per_task=config.states_per_task,
            top_k=config.top_k,
            continuations=config.continuations,
            horizon=config.horizon,
            temperature=config.temperature,
            sources=tuple(config.sources),
            tasks=tuple(config.tasks),
            all_tasks=config.all_tasks,
            workers=config.workers,
            recording_labels=cast(RecordingLabels, config.recording_labels),
        )

    summary = _run_partition(context, wh, env_pool, run_alternatives, request)
    return MaterializeResult(metadata=to_metadata(summary) | table_metadata(wh, "step_alternatives"))


ALTERNATIVES_CHECKS = {
    "labels_in_range": "Monte-Carlo values in [0, 1], successes within continuations, rows written",
    "replays_reproduce_states": "at most 10% of the replays did not reproduce their recorded state (warn)",
}


@multi_asset_check(
    specs=[
        AssetCheckSpec(f"{ALTERNATIVES_ASSET}_{name}", asset=ALTERNATIVES_ASSET, description=text)
        for name, text in ALTERNATIVES_CHECKS.items()
    ],
    name=f"{ALTERNATIVES_ASSET}_checks",
    description="data checks of step_alternatives",
)
def alternatives_checks(
    context: AssetCheckExecutionContext, warehouse: WarehouseResource
) -> Iterator[AssetCheckResult]:
    for name, outcome in check_alternatives_run(warehouse.get(), context.run.run_id).items():
        yield check_result(
            outcome,
            check_name=f"{ALTERNATIVES_ASSET}_{name}",
            asset_key=ALTERNATIVES_ASSET,
            warn_only=name == "replays_reproduce_states",
        )


class FlywheelRoundConfig(Config):
    round: int = Field(description="the round recorded (0: the baseline, before any policy rollout)")


@asset(
    name=ROUND_ASSET,
    group_name=GROUP,
    code_version=ROUNDS_VERSION,
    deps=[AssetKey("reward_model_report")],
    kinds={"duckdb", "matplotlib"},
    description=(
        "One flywheel round recorded from the reward-model report that just ran: each kind's model, its "
        "training mix and its AUC on held-out agent episodes; table `flywheel_rounds`, a plot of AUC by round."
    ),
)
def flywheel_round(
    context: AssetExecutionContext, config: FlywheelRoundConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    wh = warehouse.get()
    try:
        result = record_round(
            wh, config.round, run_id=context.run_id, plot_path=wh.home / "plots" / "flywheel" / "auc_by_round.png"
        )
    except FlywheelError as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(
        metadata=to_metadata(
            {"round": result["round"], "rounds": Markdown(result["markdown"]), "auc_by_round": result["plot"]}
        )
    )


FLYWHEEL_ASSETS = [policy_rollouts, step_alternatives, flywheel_round]
FLYWHEEL_CHECKS = [
    unique_key_checks(ASSET_NAME, {"episodes": None, "steps": None, ATTEMPTS_TABLE: ROLLOUT_ATTEMPTS}),
    unique_key_checks(ALTERNATIVES_ASSET, {"step_alternatives": None}),
    alternatives_checks,
]
FLYWHEEL_JOBS = [
    define_asset_job(
        "policy_rollouts_job",
        selection=[ASSET_NAME],
        partitions_def=POLICY_ROLLOUT_PARTITIONS,
        description="policy rollouts, one family x policy partition per run",
    ),
    define_asset_job(
        "step_alternatives_job",
        selection=[ALTERNATIVES_ASSET],
        partitions_def=POLICY_ROLLOUT_PARTITIONS,
        description="alternatives at one state, one family x policy partition per run",
    ),
    define_asset_job(
        "progress_split_job",
        selection=["progress_split"],
        description="the reward-model split again, after new episodes were labelled",
    ),
    define_asset_job("flywheel_round_job", selection=[ROUND_ASSET], description="record a flywheel round"),
]
