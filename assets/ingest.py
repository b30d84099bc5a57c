"""Ingest stage: recorded human demonstrations -> episodes and steps in the warehouse."""

import os
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)

from assets.plots import save_and_inline
from assets.resources import WarehouseResource
from envs.miniwob.demo_import import ASSET_NAME, IMPORTER_VERSION, import_demonstrations
from warehouse.model import KNOWN_ACTION_TYPES
from warehouse.schema import EPISODES, STEPS, same_type
from warehouse.storage import REPO_ROOT

DEFAULT_DEMOS_DIR = REPO_ROOT.parent / "shared" / "data" / "miniwob-demos"
MAX_UNTYPED_SHARE = 0.02


def default_demos_dir() -> str:
    return os.environ.get("STEPWISE_DEMOS_DIR", str(DEFAULT_DEMOS_DIR))


class DemoImportConfig(Config):
    demos_dir: str = default_demos_dir()
    workers: int = 2


@asset(
    name=ASSET_NAME,
    group_name="ingest",
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

    report = import_demonstrations(
        Path(config.demos_dir), warehouse.get(), run_id=context.run_id, workers=config.workers, progress=progress
    )
    return MaterializeResult(
        metadata={
            "files": report.files,
            "episodes": report.episodes,
            "successes": report.successes,
            "failures": report.failures,
            "steps": report.steps,
            "tasks": report.tasks,
            "duplicate_files": report.duplicates,
            "quarantined_files": report.quarantined,
            "untyped_step_share": MetadataValue.float(report.untyped_share),
            "seconds": MetadataValue.float(report.seconds),
            "materialization_id": report.materialization_id,
            "steps_path": MetadataValue.path(report.outputs["steps"]),
            "episodes_path": MetadataValue.path(report.outputs["episodes"]),
            "quarantine_reasons": MetadataValue.json(report.quarantine_reasons),
            "success_by_task": MetadataValue.md(_success_by_task_plot(warehouse, report.import_root)),
        }
    )


def _success_by_task_plot(warehouse: WarehouseResource, import_root: str) -> str:
    """Successes and failures per task as a horizontal bar chart, inlined as markdown."""
    import matplotlib.pyplot as plt

    rows = (
        warehouse.get()
        .query(
            "SELECT task_id, count(*) FILTER (WHERE success) AS ok, count(*) FILTER (WHERE NOT success) AS failed "
            "FROM episodes WHERE import_root = ? GROUP BY task_id ORDER BY ok + failed",
            [import_root],
        )
        .to_pylist()
    )
    fig, ax = plt.subplots(figsize=(7, max(3, 0.18 * len(rows))))
    tasks = [r["task_id"] for r in rows]
    ax.barh(tasks, [r["ok"] for r in rows], color="#3a7", label="success")
    ax.barh(tasks, [r["failed"] for r in rows], left=[r["ok"] for r in rows], color="#d54", label="failure")
    ax.set_xscale("log")
    ax.set_xlabel("episodes (log scale)")
    ax.tick_params(axis="y", labelsize=6)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return save_and_inline(
        fig, warehouse.get().home / "plots" / "human_demonstrations_success_by_task.png", "success and failure per task"
    )


# -- asset checks -----------------------------------------------------------------------------


@asset_check(asset=ASSET_NAME, description="episodes and steps views have the documented columns and types")
def demonstrations_schema(warehouse: WarehouseResource) -> AssetCheckResult:
    problems = []
    with warehouse.get().connect(read_only=True) as con:
        for view, schema in (("episodes", EPISODES), ("steps", STEPS)):
            actual = con.sql(f"SELECT * FROM {view} LIMIT 0").to_arrow_table().schema
            for fld in schema:
                if fld.name not in actual.names:
                    problems.append(f"{view}.{fld.name} missing")
                elif not same_type(actual.field(fld.name).type, fld.type):
                    problems.append(f"{view}.{fld.name}: {actual.field(fld.name).type} != {fld.type}")
    return AssetCheckResult(passed=not problems, metadata={"problems": MetadataValue.json(problems)})


@asset_check(asset=ASSET_NAME, description="every episode has at least one step, and n_steps matches the steps table")
def demonstrations_no_empty_episodes(warehouse: WarehouseResource) -> AssetCheckResult:
    (empty, mismatched) = (
        warehouse.get()
        .query(
            """
        SELECT count(*) FILTER (WHERE e.n_steps = 0 OR s.n IS NULL),
               count(*) FILTER (WHERE s.n IS NOT NULL AND s.n <> e.n_steps)
        FROM episodes e LEFT JOIN (SELECT episode_id, count(*) AS n FROM steps GROUP BY 1) s USING (episode_id)
        WHERE e.source = 'human_demo'
        """
        )
        .to_pylist()[0]
        .values()
    )
    return AssetCheckResult(
        passed=empty == 0 and mismatched == 0, metadata={"empty": empty, "n_steps_mismatch": mismatched}
    )


@asset_check(
    asset=ASSET_NAME, description=f"action types are canonical; untyped (UNKNOWN) steps under {MAX_UNTYPED_SHARE:.0%}"
)
def demonstrations_action_types_known(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = (
        warehouse.get()
        .query(
            "SELECT action_type, count(*) AS n FROM steps JOIN episodes USING (episode_id) "
            "WHERE source = 'human_demo' GROUP BY 1"
        )
        .to_pylist()
    )
    counts = {r["action_type"]: r["n"] for r in rows}
    total = sum(counts.values())
    foreign = sorted(set(counts) - KNOWN_ACTION_TYPES - {"UNKNOWN"})
    untyped = counts.get("UNKNOWN", 0) / total if total else 1.0
    return AssetCheckResult(
        passed=not foreign and untyped < MAX_UNTYPED_SHARE and total > 0,
        metadata={
            "counts": MetadataValue.json(counts),
            "untyped_share": MetadataValue.float(untyped),
            "foreign_types": MetadataValue.json(foreign),
        },
    )


@asset_check(
    asset=ASSET_NAME, description="both successful and failed episodes are present (failures matter for labels)"
)
def demonstrations_success_and_failure(warehouse: WarehouseResource) -> AssetCheckResult:
    ok, failed = (
        warehouse.get()
        .query(
            "SELECT count(*) FILTER (WHERE success), count(*) FILTER (WHERE NOT success) FROM episodes WHERE source = 'human_demo'"
        )
        .to_pylist()[0]
        .values()
    )
    return AssetCheckResult(
        passed=ok > 0 and failed > 0,
        severity=AssetCheckSeverity.WARN,
        metadata={"successes": ok, "failures": failed, "success_rate": MetadataValue.float(ok / max(1, ok + failed))},
    )


INGEST_CHECKS = [
    demonstrations_schema,
    demonstrations_no_empty_episodes,
    demonstrations_action_types_known,
    demonstrations_success_and_failure,
]
