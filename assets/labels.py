"""Labels stage (group ``labels``): synthetic trajectories, the recipe library and progress
labels, the reward-model split and the label-quality report (ProgRM §2.2, App. B-C).

Stage logic: :mod:`annotation.labels`.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSpec,
    Config,
    MaterializeResult,
    asset,
    asset_check,
    multi_asset,
)
from pydantic import Field

from annotation.labels import (
    LABELS_CODE_VERSION,
    check_improved_beats_paper,
    check_progress_labels,
    default_specs_dir,
    run_label_quality_report,
    run_labeling,
    run_split,
    run_synthesis,
)
from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import WarehouseResource

GROUP = "labels"
TRAJECTORY_ASSETS = ["human_demonstrations", "rollouts"]


class SynthesisConfig(Config):
    seed: int = 0


class LabelConfig(Config):
    task_specs_dir: str = Field(default_factory=default_specs_dir, description="folder of task specs (YAML)")
    embedder: str = Field(default="minilm", description="minilm (the real Sentence-BERT) | hashing (quick runs)")
    theta: float = Field(default=0.6, description="θ_L of ProgRM §2.2: recipe group similarity threshold")


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
            deps=[*TRAJECTORY_ASSETS, "synthetic_trajectories"],
            kinds={"parquet"},
            description="Recipes per task (ProgRM §2.2, Eq. 10), paper-faithful and improved modes, "
            "with member episodes.",
        ),
        AssetSpec(
            "progress_labels",
            group_name=GROUP,
            deps=[*TRAJECTORY_ASSETS, "synthetic_trajectories"],
            kinds={"parquet"},
            description="Per-step progress labels: LCS (paper, improved) and environment milestones; key steps.",
        ),
    ],
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
    summary = run_labeling(
        wh,
        specs_dir=config.task_specs_dir,
        embedder=config.embedder,
        theta=config.theta,
        run_id=context.run_id,
        log=context.log.info,
    )
    yield MaterializeResult(
        asset_key="recipe_library",
        metadata=to_metadata(
            {
                "recipes": summary.recipes,
                "tasks_without_recipe": summary.tasks_without_recipe,
                "path": summary.outputs["recipes"],
            }
        )
        | table_metadata(wh, "recipes"),
    )
    yield MaterializeResult(
        asset_key="progress_labels",
        metadata=to_metadata(
            {
                "episodes": summary.episodes,
                "label_rows": summary.label_rows,
                "unlabelled_episodes": summary.unlabelled,
                "path": summary.outputs["progress_labels"],
                "progress_curves": summary.plots["progress_curves"],
                "label_distribution": summary.plots["label_distribution"],
            }
        )
        | table_metadata(wh, "progress_labels", also=("label_notes",)),
    )
    for name, outcome in check_progress_labels(wh).items():
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


LABEL_ASSETS = [synthetic_trajectories, recipes_and_progress_labels, progress_split, label_quality_report]
LABEL_CHECKS = [
    improved_beats_paper_on_held_out,
    unique_key_checks("synthetic_trajectories", dict.fromkeys(("episodes", "steps"))),
    unique_key_checks("recipe_library", {"recipes": None}),
    unique_key_checks("progress_labels", dict.fromkeys(("progress_labels", "label_notes"))),
    unique_key_checks("progress_split", {"progress_split": None}),
    unique_key_checks("label_quality_report", {"label_quality": None}),
]
