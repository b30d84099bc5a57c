"""Human labels stage (group ``human_labels``): selection and push to Label Studio, the sync into
``human_labels`` (asset and the ``label_studio_sync`` sensor), per-step training labels, annotator
agreement and the comparison of label sources. Stage logic: :mod:`annotation.labelstudio.human_labels`."""

from typing import Any

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    Config,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    asset_check,
    define_asset_job,
    sensor,
)
from pydantic import Field

from annotation.labelstudio.human_labels import (
    CANDIDATE_UPSTREAM,
    DOWNSTREAM_OF_LABELS,
    INTERFACE_NAMES,
    PUSH_VERSION,
    REPORT_VERSION,
    SELECTION_VERSION,
    SYNC_VERSION,
    TABLES_BY_ASSET,
    PushOptions,
    SelectionOptions,
    SensorSettings,
    build_agreement,
    build_human_step_labels,
    build_source_comparison,
    check_no_secrets,
    check_queue_unique,
    check_traced_to_queue,
    check_unique_annotations,
    check_unsure_excluded,
    push_queue,
    select_candidates,
    sync_projects,
    sync_tick,
)
from assets.metadata import check_result, to_metadata, unique_key_checks
from assets.resources import LabelStudioResource, WarehouseResource

GROUP = "human_labels"
SHARES_HELP = "budget share per episode source (a source, a family like synthetic, or *); 0 leaves it out"


def _with_url(summary: dict[str, Any]) -> dict[str, Any]:
    return to_metadata(summary) | {"label_studio": MetadataValue.url(summary["label_studio"])}


class CandidateSelectionConfig(Config):
    budget: int = Field(SelectionOptions.budget, description="how many steps to put in front of people")
    spot_check_share: float = Field(SelectionOptions.spot_check_share, description="budget share of spot checks")
    max_per_episode: int = Field(SelectionOptions.max_per_episode, description="at most this many steps per episode")
    seed: int = SelectionOptions.seed
    prediction_model: str | None = Field(None, description="rm_predictions model to use (default: the latest)")
    episode_source: str | None = Field(None, description="only episodes of this source: it gets the whole budget")
    source_shares: dict[str, float] = Field(default_factory=SelectionOptions().shares, description=SHARES_HELP)
    min_disagreement: float = Field(SelectionOptions.min_disagreement, description="picked first within a source")


class PushConfig(Config):
    interfaces: list[str] = Field(default_factory=lambda: list(INTERFACE_NAMES), description="interfaces to push to")
    overlap_share: float = Field(PushOptions.overlap_share, description="share of tasks two annotators see (kappa)")
    chunk_size: int = Field(PushOptions.chunk_size, description="tasks per bulk import request")
    milestone_review_budget: int = Field(PushOptions.milestone_review_budget, description="sets to review, in total")
    match_budget: int = Field(PushOptions.match_budget, description="milestone-action pairs to label, in total")
    match_threshold: float = Field(PushOptions.match_threshold, description="the matcher's threshold (ADMIRE delta)")
    match_embedder: str = Field(PushOptions.match_embedder, description="minilm (all-MiniLM-L6-v2) | hashing")
    task_specs_dir: str | None = Field(None, description="task specs with milestones (default: envs/task_specs)")


class SyncConfig(Config):
    full_resync: bool = Field(default=True, description="export every project even if its counts did not change")


@asset(
    group_name=GROUP,
    code_version=SELECTION_VERSION,
    kinds={"duckdb", "parquet"},
    deps=CANDIDATE_UPSTREAM,
    description=(
        "Active selection under a budget shared by episode source (config source_shares; default mostly human "
        "demonstrations and rollouts, little synthetic, no mismatched-instruction episodes): within a source the "
        "steps whose label sources disagree first (LCS vs environment, or the reward model vs them), stratified by "
        "task and success/failure, with spot checks. Steps already queued are left out. Table `annotation_candidates`."
    ),
)
def annotation_candidates(
    context: AssetExecutionContext, config: CandidateSelectionConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    options = SelectionOptions(**config.model_dump())
    summary = select_candidates(warehouse.get(), options, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(metadata=to_metadata(summary))


@asset(
    group_name=GROUP,
    code_version=PUSH_VERSION,
    kinds={"labelstudio", "parquet"},
    deps=["annotation_candidates"],
    description=(
        "Pushes the selected steps (step correctness, step progress) and milestone items (review, milestone-action "
        "match) to Label Studio with the current model's prediction as a pre-annotation. Idempotent: an item is "
        "never queued twice for the same interface version. Table `annotation_queue`."
    ),
)
def annotation_queue(
    context: AssetExecutionContext, config: PushConfig, warehouse: WarehouseResource, label_studio: LabelStudioResource
) -> MaterializeResult:
    options = PushOptions(**(config.model_dump() | {"interfaces": tuple(config.interfaces)}))
    site = label_studio.site(progress=context.log.info)
    summary = push_queue(warehouse.get(), site, options, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(metadata=_with_url(summary))


@asset(
    group_name=GROUP,
    code_version=SYNC_VERSION,
    kinds={"labelstudio", "parquet"},
    deps=["annotation_queue"],
    description=(
        "Every Label Studio annotation of the Stepwise projects, one row per annotation id: created, updated in "
        "place, or retracted when deleted; pseudonymous annotator ids, lead time, lineage to the project and task. "
        "The `label_studio_sync` sensor keeps it current; materializing runs a full sync now. Table `human_labels`."
    ),
)
def human_labels(
    context: AssetExecutionContext, config: SyncConfig, warehouse: WarehouseResource, label_studio: LabelStudioResource
) -> MaterializeResult:
    site = label_studio.site(progress=context.log.info)
    summary = sync_projects(
        warehouse.get(), site, full_resync=config.full_resync, run_id=context.run_id, log=context.log.info
    )
    return MaterializeResult(metadata=_with_url(summary))


@asset(
    group_name=GROUP,
    code_version=REPORT_VERSION,
    kinds={"parquet"},
    deps=["human_labels"],
    description=(
        "Per-step training labels from people: majority correctness (unsure, skipped and retracted answers excluded) "
        "and mean progress. Table `human_step_labels`; progress also lands in `progress_labels` with source 'human' "
        "(dataset 'human'), so reward-model datasets read human labels like the others."
    ),
)
def human_step_labels(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    return MaterializeResult(metadata=to_metadata(build_human_step_labels(warehouse.get(), run_id=context.run_id)))


@asset(
    group_name=GROUP,
    code_version=REPORT_VERSION,
    kinds={"parquet"},
    deps=["human_labels"],
    description=(
        "Annotator agreement and statistics: Cohen's kappa where tasks overlap (quadratic-weighted for progress "
        "and the 1-5 milestone scale), per-annotator volume, unsure and skip rates, lead time. "
        "Table `annotator_stats`, plot."
    ),
)
def annotation_agreement(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    return MaterializeResult(metadata=to_metadata(build_agreement(warehouse.get(), run_id=context.run_id)))


@asset(
    group_name=GROUP,
    code_version=REPORT_VERSION,
    kinds={"duckdb", "parquet"},
    deps=["human_step_labels"],
    description=(
        "Label sources compared on the same steps: people vs soft-LCS vs environment milestones vs the reward model, "
        "for correctness (key step / progress rises) and progress: agreement, Cohen's kappa, mean absolute difference, "
        "Pearson r. Table `label_source_agreement`, plot."
    ),
)
def label_source_comparison(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    return MaterializeResult(metadata=to_metadata(build_source_comparison(warehouse.get(), run_id=context.run_id)))


@asset_check(asset="human_labels", description="one row per Label Studio annotation: no annotation counted twice")
def human_labels_unique_annotations(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_unique_annotations(warehouse.get()))


@asset_check(
    asset="human_labels",
    description="unsure, skipped and retracted annotations are never usable for training",
    blocking=True,
)
def human_labels_unsure_excluded(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_unsure_excluded(warehouse.get()))


@asset_check(asset="human_labels", description="labels come from queued items (lineage to annotation_queue)")
def human_labels_traced_to_queue(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_traced_to_queue(warehouse.get()), warn_only=True)


@asset_check(asset="annotation_queue", description="no item queued twice for the same interface version")
def annotation_queue_no_duplicates(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_queue_unique(warehouse.get()))


@asset_check(
    asset="human_labels",
    description="no Label Studio key or password in the warehouse (Parquet, catalog, lineage, plots)",
)
def annotation_tables_free_of_secrets(
    warehouse: WarehouseResource, label_studio: LabelStudioResource
) -> AssetCheckResult:
    return check_result(check_no_secrets(warehouse.get(), label_studio.site()))


def build_label_studio_sensor(
    *,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    **settings: Any,
) -> SensorDefinition:
    """The sensor that keeps ``human_labels`` current (each tick:
    :func:`annotation.labelstudio.human_labels.sync_tick`);
    ``settings`` are :class:`SensorSettings` fields: name, back-off, tick budget, ``on_stage``."""
    timing = SensorSettings(**settings)

    @sensor(
        name=timing.name,
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=DOWNSTREAM_OF_LABELS,
        default_status=default_status,
        description="Pulls new, updated and deleted Label Studio annotations into human_labels; "
        "backs off while Label Studio is down.",
    )
    def label_studio_sync(
        context: SensorEvaluationContext, warehouse: WarehouseResource, label_studio: LabelStudioResource
    ):
        site = label_studio.site(start=False)
        tick = sync_tick(warehouse.get(), site, context.cursor, timing, log=context.log.info, warn=context.log.warning)
        if tick.run_key is None:
            skip = SkipReason(tick.skip)
            return skip if tick.cursor is None else SensorResult(skip_reason=skip, cursor=tick.cursor)
        return SensorResult(
            run_requests=[
                RunRequest(
                    run_key=tick.run_key,
                    asset_selection=[AssetKey(k) for k in DOWNSTREAM_OF_LABELS],
                    tags={"stepwise/trigger": "label_studio_sync"},
                )
            ],
            asset_events=[
                AssetMaterialization("human_labels", description=e["description"], metadata=to_metadata(e["metadata"]))
                for e in tick.events
            ],
            cursor=tick.cursor,
        )

    return label_studio_sync


label_studio_sync = build_label_studio_sensor()

HUMAN_LABEL_ASSETS = [
    annotation_candidates,
    annotation_queue,
    human_labels,
    human_step_labels,
    annotation_agreement,
    label_source_comparison,
]
HUMAN_LABEL_CHECKS = [
    human_labels_unique_annotations,
    human_labels_unsure_excluded,
    human_labels_traced_to_queue,
    annotation_queue_no_duplicates,
    annotation_tables_free_of_secrets,
]
HUMAN_LABEL_CHECKS += [unique_key_checks(asset, dict.fromkeys(tables)) for asset, tables in TABLES_BY_ASSET.items()]
HUMAN_LABEL_SENSORS = [label_studio_sync]
HUMAN_LABEL_JOBS = [
    define_asset_job(
        "annotation_push",
        selection=["annotation_candidates", "annotation_queue"],
        description="Pick the least certain steps under a budget and push them to Label Studio.",
    )
]
