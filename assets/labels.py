"""Labels stage (group ``labels``): synthetic trajectories, the recipe library and progress
labels, the reward-model split and the label-quality report (ProgRM §2.2, App. B-C).

Stage logic: :mod:`annotation.progress.labels`.
"""

from collections.abc import Iterator
from typing import Literal

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetSelection,
    AssetSpec,
    BackfillPolicy,
    Config,
    DagsterRunStatus,
    DefaultSensorStatus,
    MaterializeResult,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    StaticPartitionsDefinition,
    asset,
    asset_check,
    define_asset_job,
    multi_asset,
    sensor,
)
from pydantic import Field

from annotation.progress.labels import (
    LABEL_MODE_HELP,
    LABELS_CODE_VERSION,
    REPLAY_MILESTONES_HELP,
    check_improved_beats_paper,
    check_progress_labels,
    default_specs_dir,
    family_labels_version,
    label_backlog,
    label_families,
    run_label_partitions,
    run_label_quality_report,
    run_split,
    run_synthesis,
)
from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import RAY_FAMILIES_HELP, WarehouseResource, ray_family_map

GROUP = "labels"
TRAJECTORY_ASSETS = ["human_demonstrations", "rollouts", "policy_rollouts"]
# Every label family reads every rollout partition (batch x family): a label family is not one of
# the rollouts' dimensions (it also holds Android and off-catalog tasks), and Dagster's default
# between the two partitionings would name upstream partitions that do not exist.
LABEL_INPUTS = [
    AssetDep("human_demonstrations"),
    AssetDep("rollouts", partition_mapping=AllPartitionMapping()),
    AssetDep("policy_rollouts", partition_mapping=AllPartitionMapping()),  # the flywheel's (family x policy)
    AssetDep("synthetic_trajectories"),
]

#: Recipes and progress labels are partitioned by label family (the environment catalog's task
#: families, plus ``other``): a run materializes only the families it names, and a backfill of
#: several runs as one (single-run backfill policy), so "every family" is one streamed pass.
LABEL_FAMILIES = StaticPartitionsDefinition(label_families())


def all_label_families_tags() -> dict[str, str]:
    """Run tags that select every label family in one run (what ``stepwise demo`` runs)."""
    keys = LABEL_FAMILIES.get_partition_keys()
    return {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}


class SynthesisConfig(Config):
    seed: int = 0


class LabelConfig(Config):
    task_specs_dir: str = Field(default_factory=default_specs_dir, description="folder of task specs (YAML)")
    embedder: str = Field(default="minilm", description="minilm (the real Sentence-BERT) | hashing (quick runs)")
    theta: float = Field(default=0.6, description="θ_L of ProgRM §2.2: recipe group similarity threshold")
    mode: Literal["incremental", "full"] = Field(default="incremental", description=LABEL_MODE_HELP)
    ray_address: str | None = Field(default=None, description=RAY_FAMILIES_HELP)
    replay_milestones: bool = Field(default=False, description=REPLAY_MILESTONES_HELP)


class SplitConfig(Config):
    by: str = Field(default="goal", description="goal (ProgRM App. C) | task (held-out tasks)")
    seed: int = 0


class LabelReportConfig(Config):
    task_specs_dir: str = Field(default_factory=default_specs_dir, description="folder of task specs (YAML)")


@asset(
    group_name=GROUP,
    deps=TRAJECTORY_ASSETS,
    code_version=LABELS_CODE_VERSION,
    kinds={"parquet"},
    description="ProgRM App. B: failed trajectories by mismatched instruction and random walk, successful ones "
    "by adding or removing no-op steps; each records its kind and parent.",
)
def synthetic_trajectories(
    context: AssetExecutionContext, config: SynthesisConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    wh = warehouse.get()
    result = run_synthesis(wh, seed=config.seed, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(
        metadata=to_metadata({k: result[k] for k in ("episodes", "steps", "kinds")})
        | table_metadata(wh, "episodes", also=("steps",))
    )


@multi_asset(
    specs=[
        AssetSpec(
            "recipe_library",
            group_name=GROUP,
            deps=LABEL_INPUTS,
            kinds={"parquet"},
            description="Recipes per task (ProgRM §2.2, Eq. 10), paper-faithful and improved modes, "
            "with member episodes; per label family, with the stored library state (recipe_library_state) "
            "that incremental runs label against.",
        ),
        AssetSpec(
            "progress_labels",
            group_name=GROUP,
            deps=LABEL_INPUTS,
            kinds={"parquet"},
            description="Per-step progress labels: LCS (paper, improved) and environment milestones; key steps; "
            "per label family, with the ledger of labelled episodes (label_ledger).",
        ),
    ],
    partitions_def=LABEL_FAMILIES,
    backfill_policy=BackfillPolicy.single_run(),
    check_specs=[
        AssetCheckSpec("labels_in_unit_interval", asset="progress_labels"),
        AssetCheckSpec("labels_non_decreasing", asset="progress_labels"),
        AssetCheckSpec("every_episode_labelled_or_explained", asset="progress_labels"),
    ],
)
def recipes_and_progress_labels(
    context: AssetExecutionContext, config: LabelConfig, warehouse: WarehouseResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    wh = warehouse.get()
    summary = run_label_partitions(
        wh,
        context.partition_keys,
        mode=config.mode,
        specs_dir=config.task_specs_dir,
        embedder=config.embedder,
        theta=config.theta,
        run_id=context.run_id,
        log=context.log.info,
        map_families=ray_family_map(config.ray_address),
        replay_milestones=config.replay_milestones,
    )
    yield MaterializeResult(
        asset_key="recipe_library",
        metadata=to_metadata(
            {
                "families": summary.families,
                "recipes": summary.recipes,
                "tasks_without_recipe": summary.tasks_without_recipe,
                "incremental": summary.incremental or None,
                "path": summary.outputs["recipes"],
            }
        )
        | table_metadata(wh, "recipes", also=("recipe_library_state",)),
    )
    yield MaterializeResult(
        asset_key="progress_labels",
        metadata=to_metadata(
            {
                "episodes": summary.episodes,
                "label_rows": summary.label_rows,
                "unlabelled_episodes": summary.unlabelled,
                "path": summary.outputs["progress_labels"],
                "progress_curves": summary.plots.get("progress_curves"),
                "label_distribution": summary.plots.get("label_distribution"),
            }
        )
        | table_metadata(wh, "progress_labels", also=("label_notes", "label_ledger")),
    )
    for name, outcome in check_progress_labels(wh, context.partition_keys).items():
        yield check_result(outcome, check_name=name, asset_key="progress_labels")


@asset(
    group_name=GROUP,
    deps=["progress_labels"],
    code_version=LABELS_CODE_VERSION,
    kinds={"parquet"},
    description="ProgRM App. C: train/validation/test split by task goal, failed-trajectory steps sampled to "
    "balance success:failure steps near 1:1.",
)
def progress_split(
    context: AssetExecutionContext, config: SplitConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    wh = warehouse.get()
    result = run_split(wh, by=config.by, seed=config.seed, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(metadata=to_metadata({"splits": result["splits"]}) | table_metadata(wh, "progress_split"))


@asset(
    group_name=GROUP,
    deps=["progress_labels"],
    code_version=LABELS_CODE_VERSION,
    kinds={"parquet"},
    description="LCS labels scored against milestone ground truth: key-step precision/recall and progress error, "
    "paper vs improved, dev vs held-out tasks.",
)
def label_quality_report(
    context: AssetExecutionContext, config: LabelReportConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    wh = warehouse.get()
    report = run_label_quality_report(wh, specs_dir=config.task_specs_dir, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(
        metadata=to_metadata(
            {"summary": report.summary, "per_task": report.per_task, "key_step_progress_error": report.plot}
        )
        | table_metadata(wh, "label_quality")
    )


@asset_check(asset=label_quality_report, description="the improved mode beats the paper mode on held-out tasks")
def improved_beats_paper_on_held_out(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_improved_beats_paper(warehouse.get()))


IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]

label_families_job = define_asset_job(
    "label_families",
    selection=AssetSelection.assets("recipe_library", "progress_labels"),
    partitions_def=LABEL_FAMILIES,
    description="Recipes and progress labels for the chosen label families (incremental by default).",
)


@sensor(
    job=label_families_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.STOPPED,
    description="Asks for a labels run of every label family with episodes not labelled yet (e.g. a batch of "
    "rollouts), or labelled under a task spec changed since: new episodes are labelled against the stored recipe "
    "libraries, tasks whose spec changed relabelled whole. A family with a run in flight waits; a failed run is "
    "asked for again when episodes, specs or the family's labels change.",
)
def new_episodes_to_label(context: SensorEvaluationContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    backlog = label_backlog(wh, default_specs_dir())
    if not backlog.families:
        return SkipReason("every episode is labelled, under the specs in hand")
    busy = {
        run.tags.get("dagster/partition")
        for run in context.instance.get_runs(
            RunsFilter(job_name=label_families_job.name, statuses=IN_FLIGHT), limit=100
        )
    }
    context.log.info(f"{backlog.describe()}; runs in flight: {sorted(b for b in busy if b)}")
    requests = [
        RunRequest(
            partition_key=family,
            # One request per state of the episodes, the specs and the family's labels: a run that
            # failed is asked for again once one of them changes (or from the UI), never in a loop.
            run_key=f"{family}@{backlog.version}@{family_labels_version(wh, family)}",
            tags={"stepwise/trigger": "new_episodes_to_label", **backlog.tags(family)},
        )
        for family in backlog.families
        if family not in busy  # a second run of a family would only be refused when it publishes
    ]
    return SensorResult(run_requests=requests) if requests else SkipReason("every family to label is running")


LABEL_ASSETS = [synthetic_trajectories, recipes_and_progress_labels, progress_split, label_quality_report]
LABEL_CHECKS = [
    improved_beats_paper_on_held_out,
    unique_key_checks("synthetic_trajectories", dict.fromkeys(("episodes", "steps"))),
    unique_key_checks("recipe_library", dict.fromkeys(("recipes", "recipe_library_state"))),
    unique_key_checks("progress_labels", dict.fromkeys(("progress_labels", "label_notes", "label_ledger"))),
    unique_key_checks("progress_split", {"progress_split": None}),
    unique_key_checks("label_quality_report", {"label_quality": None}),
]
LABEL_JOBS = [label_families_job]
LABEL_SENSORS = [new_episodes_to_label]
