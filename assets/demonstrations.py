"""Demonstrations stage (group ``demonstrations``): recorded MiniWoB++ human demonstrations ->
episodes and steps in the warehouse, with every file accounted for.

Stage logic: :mod:`envs.miniwob.demonstrations`.
"""

from pathlib import Path

from dagster import AssetCheckResult, AssetExecutionContext, Config, MaterializeResult, asset, asset_check
from pydantic import Field

from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import WarehouseResource
from envs.miniwob.demonstrations import (
    ASSET_NAME,
    IMPORTER_VERSION,
    MAX_UNTYPED_SHARE,
    check_action_types_known,
    check_no_empty_episodes,
    check_schema,
    check_success_and_failure,
    default_demos_dir,
    import_demonstrations,
    success_by_task_plot,
)

GROUP = "demonstrations"


class DemoImportConfig(Config):
    demos_dir: str = Field(default_factory=default_demos_dir, description="folder of recordings (*.json, *.json.gz)")
    workers: int = Field(default=2, description="parsing processes")
    task: str | None = Field(
        default=None, description="task of recordings that do not name theirs (a MiniWoB++ task id); default: none"
    )
    max_files_per_task: int | None = Field(
        default=None, description="a fixed sample of at most this many recordings per task (stepwise demo); None: all"
    )


@asset(
    name=ASSET_NAME,
    group_name=GROUP,
    code_version=IMPORTER_VERSION,
    kinds={"parquet", "duckdb"},
    description=(
        "Recorded MiniWoB++ human demonstrations turned into step-level trajectories (CLICK on the "
        "element under the pointer, key runs merged into INPUT, scrolls), written to the `episodes`, "
        "`steps`, `source_files` and `quarantine` tables."
    ),
)
def human_demonstrations(
    context: AssetExecutionContext, config: DemoImportConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    last_decile = -1

    def progress(done: int, total: int) -> None:
        nonlocal last_decile
        decile = done * 10 // total
        if decile != last_decile:
            last_decile = decile
            context.log.info(f"imported {done}/{total} files ({100 * done // total}%)")

    wh = warehouse.get()
    report = import_demonstrations(
        Path(config.demos_dir),
        wh,
        run_id=context.run_id,
        workers=config.workers,
        task=config.task,
        max_files_per_task=config.max_files_per_task,
        progress=progress,
    )
    return MaterializeResult(
        metadata=to_metadata(
            {
                "files": report.files,
                "episodes": report.episodes,
                "successes": report.successes,
                "failures": report.failures,
                "steps": report.steps,
                "tasks": report.tasks,
                "duplicate_files": report.duplicates,
                "quarantined_files": report.quarantined,
                "duplicates_of_other_imports": report.duplicates_of_other_imports,
                "variant_episodes": report.variants,
                "untyped_step_share": report.untyped_share,
                "seconds": report.seconds,
                "materialization_id": report.materialization_id,
                "steps_path": Path(report.outputs["steps"]),
                "episodes_path": Path(report.outputs["episodes"]),
                "quarantine_reasons": report.quarantine_reasons,
                "success_by_task": success_by_task_plot(wh, report.import_root),
            }
        )
        | table_metadata(wh, "episodes", also=("steps", "source_files", "quarantine"))
    )


@asset_check(asset=ASSET_NAME, description="episodes and steps views have the documented columns and types")
def demonstrations_schema(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_schema(warehouse.get()))


@asset_check(asset=ASSET_NAME, description="every episode has at least one step, and n_steps matches the steps table")
def demonstrations_no_empty_episodes(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_no_empty_episodes(warehouse.get()))


@asset_check(
    asset=ASSET_NAME, description=f"action types are canonical; untyped (UNKNOWN) steps under {MAX_UNTYPED_SHARE:.0%}"
)
def demonstrations_action_types_known(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_action_types_known(warehouse.get()))


@asset_check(
    asset=ASSET_NAME, description="both successful and failed episodes are present (failures matter for labels)"
)
def demonstrations_success_and_failure(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_success_and_failure(warehouse.get()), warn_only=True)


DEMONSTRATION_ASSETS = [human_demonstrations]
DEMONSTRATION_CHECKS = [
    unique_key_checks(ASSET_NAME, dict.fromkeys(("episodes", "steps", "source_files", "quarantine"))),
    demonstrations_schema,
    demonstrations_no_empty_episodes,
    demonstrations_action_types_known,
    demonstrations_success_and_failure,
]
