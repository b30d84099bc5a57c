"""Human annotation in Label Studio: selection, push, sync sensor, labels, agreement and source comparison.

Assets (group ``annotation``)::

    steps, episodes, progress_labels, rm_predictions
        -> annotation_candidates      active selection under a budget (table annotation_candidates)
        -> annotation_queue           pushed to Label Studio, idempotently (table annotation_queue)
    Label Studio --sensor/asset-->  human_labels   (table human_labels; the sensor keeps it current)
        -> human_step_labels          per-step training labels (+ progress_labels rows, source 'human')
        -> annotation_agreement       Cohen's kappa, per-annotator stats and a plot (table annotator_stats)
        -> label_source_comparison    human vs LCS vs environment vs model on the same steps

The sensor ``label_studio_sync`` pulls new, updated and deleted annotations every 30 s, backs
off exponentially while Label Studio is unreachable, resumes an interrupted snapshot export, and
requests a run of the three downstream assets when labels changed.

Register with ``ANNOTATION_ASSETS``, ``ANNOTATION_CHECKS``, ``ANNOTATION_SENSORS`` and
``ANNOTATION_RESOURCES`` (``label_studio``; ``warehouse`` comes from pipelines.resources).
"""

import base64
import functools
import io
import mimetypes
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    Config,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    asset_check,
    sensor,
)
from pydantic import Field

from annotation.labelstudio.agreement import (
    annotator_stats,
    compare_label_sources,
    pairwise_agreement,
    pooled_kappa,
    step_training_labels,
)
from annotation.labelstudio.client import (
    LabelStudioAuthError,
    LabelStudioClient,
    LabelStudioError,
    LabelStudioUnavailable,
)
from annotation.labelstudio.interfaces import (
    INTERFACES,
    STEP_INTERFACES,
    Interface,
    correctness_prediction,
    match_prediction,
    progress_prediction,
)
from annotation.labelstudio.push import (
    QueueItem,
    ensure_project,
    match_task_data,
    milestone_review_data,
    push_items,
    reconcile_queue,
    step_task_data,
)
from annotation.labelstudio.render import StepView
from annotation.labelstudio.secrets import API_KEY_ENV, scrub
from annotation.labelstudio.selection import (
    MatchPairCandidate,
    StepCandidate,
    match_item_key,
    milestone_set_item_key,
    select_match_pairs,
    select_steps,
    step_item_key,
)
from annotation.labelstudio.sync import ProjectSyncer, SyncState, backoff_seconds, sync_lock
from assets.resources import LabelStudioResource, WarehouseResource
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.model import Screen, UIElement
from warehouse.schema import PROGRESS_LABELS
from warehouse.storage import git_revision
from warehouse.tables_annotation import (
    ANNOTATION_CANDIDATES,
    ANNOTATION_QUEUE,
    ANNOTATOR_STATS,
    HUMAN_STEP_LABELS,
    LABEL_SOURCE_AGREEMENT,
)

GROUP = "annotation"
SELECTION_VERSION = "active-selection-1"
PUSH_VERSION = "labelstudio-push-1"
REPORT_VERSION = "annotation-report-1"
#: Assets whose tables the selection reads (steps, episodes, progress_labels); add the reward-model predictions asset when it lands.
CANDIDATE_UPSTREAM: list[str] = ["human_demonstrations", "progress_labels"]
DOWNSTREAM_OF_LABELS = ["human_step_labels", "annotation_agreement", "label_source_comparison"]
ANNOTATION_TABLES = (
    "annotation_candidates",
    "annotation_queue",
    "human_labels",
    "human_step_labels",
    "annotator_stats",
    "label_source_agreement",
)


# -- resource -------------------------------------------------------------------------------------


# -- small helpers ----------------------------------------------------------------------------------


def _query(warehouse: Warehouse, sql: str, params: list | None = None) -> pa.Table | None:
    """A query, or None when a table it reads does not exist (yet)."""
    try:
        return warehouse.query(sql, params)
    except duckdb.CatalogException:
        return None
    except duckdb.BinderException:
        return None


def _columns(warehouse: Warehouse, view: str) -> list[str]:
    table = _query(warehouse, f"SELECT * FROM {view} LIMIT 0")
    return [] if table is None else table.column_names


def _current_rows(warehouse: Warehouse, table_name: str, dataset: str) -> tuple[list[dict], str | None, str | None]:
    current = warehouse.current_version(table_name, dataset)
    if current is None:
        return [], None, None
    return pq.read_table(current[1]).to_pylist(), current[0], current[1]


def _all_current(warehouse: Warehouse, table_name: str) -> list[tuple[str, str, str]]:
    """(dataset, materialization_id, path) of every current version of a table."""
    if not warehouse.db_path.exists():
        return []
    with warehouse.connect(read_only=True) as con:
        try:
            return con.execute(
                "SELECT dataset, materialization_id, path FROM table_versions WHERE is_current AND table_name = ? ORDER BY dataset",
                [table_name],
            ).fetchall()
        except duckdb.CatalogException:
            return []


def _read_all(warehouse: Warehouse, table_name: str, schema: pa.Schema) -> pa.Table:
    versions = _all_current(warehouse, table_name)
    if not versions:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(path).cast(schema) for _, _, path in versions])


def _png_markdown(fig, warehouse: Warehouse, name: str, alt: str) -> str:
    plots = warehouse.home / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    fig.savefig(plots / f"{name}.png", dpi=110)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f"![{alt}](data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()})"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _md_table(rows: Sequence[dict], columns: Sequence[str], max_rows: int = 40) -> str:
    if not rows:
        return "_none_"

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"\n… {len(rows) - max_rows} more rows")
    return "\n".join(lines)


# -- reading the automatic labels and predictions ---------------------------------------------------

_PROB_COLUMNS = ("p_positive", "prob_positive", "positive_prob", "p_correct")
_VALUE_COLUMNS = ("progress", "predicted_progress", "prediction", "score", "reward", "value")
_MODEL_COLUMNS = ("model_id", "model_version", "model")


def _prediction_sql(warehouse: Warehouse, model: str | None) -> tuple[str, str | None, list]:
    """A SELECT over rm_predictions giving (episode_id, step_idx, model_progress, model_prob, model_id), or ''."""
    cols = _columns(warehouse, "rm_predictions")
    if not cols or "episode_id" not in cols or "step_idx" not in cols:
        return "", None, []
    value = next((c for c in _VALUE_COLUMNS if c in cols), None)
    prob = next((c for c in _PROB_COLUMNS if c in cols), None)
    if value is None and prob is None:
        return "", None, []
    model_col = next((c for c in _MODEL_COLUMNS if c in cols), None)
    chosen = model
    params: list = []
    if model_col and chosen is None:
        order = "max(created_at)" if "created_at" in cols else f"max({model_col})"
        found = _query(
            warehouse,
            f"SELECT {model_col} AS m FROM rm_predictions GROUP BY 1 ORDER BY {order} DESC NULLS LAST, 1 DESC LIMIT 1",
        )
        chosen = found.column("m")[0].as_py() if found is not None and found.num_rows else None
    where = f"WHERE {model_col} = ?" if model_col and chosen is not None else ""
    if where:
        params.append(chosen)
    sql = (
        f"SELECT episode_id, step_idx::INTEGER AS step_idx, "
        f"{f'avg({value})::DOUBLE' if value else 'NULL::DOUBLE'} AS model_progress, "
        f"{f'avg({prob})::DOUBLE' if prob else 'NULL::DOUBLE'} AS model_prob "
        f"FROM rm_predictions {where} GROUP BY 1, 2"
    )
    return sql, (str(chosen) if chosen is not None else ("rm_predictions" if not model_col else None)), params


def load_step_candidates(
    warehouse: Warehouse, *, model: str | None = None, episode_source: str | None = None
) -> list[StepCandidate]:
    """Every step with its LCS and environment labels and the current model's prediction (None where absent)."""
    pred_sql, model_id, params = _prediction_sql(warehouse, model)
    has_labels = bool(_columns(warehouse, "progress_labels"))
    label_cte = (
        """
        lcs AS (SELECT episode_id, step_idx, progress, is_key_step FROM (
                  SELECT *, row_number() OVER (PARTITION BY episode_id, step_idx
                                               ORDER BY (method = 'improved') DESC NULLS LAST, label_version DESC NULLS LAST) AS rn
                  FROM progress_labels WHERE source = 'lcs') WHERE rn = 1),
        env AS (SELECT episode_id, step_idx, progress, is_key_step FROM (
                  SELECT *, row_number() OVER (PARTITION BY episode_id, step_idx ORDER BY label_version DESC NULLS LAST) AS rn
                  FROM progress_labels WHERE source = 'env') WHERE rn = 1)
        """
        if has_labels
        else """
        lcs AS (SELECT NULL::VARCHAR AS episode_id, NULL::INTEGER AS step_idx, NULL::DOUBLE AS progress, NULL::BOOLEAN AS is_key_step WHERE false),
        env AS (SELECT * FROM lcs)
        """
    )
    pred_cte = (
        f", pred AS ({pred_sql}), pred_prev AS (SELECT *, lag(model_progress) OVER (PARTITION BY episode_id ORDER BY step_idx) AS previous FROM pred)"
        if pred_sql
        else ""
    )
    source_filter = "WHERE e.source = ?" if episode_source else ""
    sql = f"""
        WITH {label_cte} {pred_cte}
        SELECT s.episode_id, s.step_idx, e.task_id, e.success,
               lcs.progress AS lcs_progress, env.progress AS env_progress,
               lcs.is_key_step AS lcs_key_step, env.is_key_step AS env_key_step,
               {
        "p.model_progress, coalesce(p.previous, CASE WHEN s.step_idx = 0 THEN 0.0 END) AS model_previous_progress, p.model_prob"
        if pred_sql
        else "NULL::DOUBLE AS model_progress, NULL::DOUBLE AS model_previous_progress, NULL::DOUBLE AS model_prob"
    }
        FROM steps s JOIN episodes e USING (episode_id)
        LEFT JOIN lcs ON lcs.episode_id = s.episode_id AND lcs.step_idx = s.step_idx
        LEFT JOIN env ON env.episode_id = s.episode_id AND env.step_idx = s.step_idx
        {"LEFT JOIN pred_prev p ON p.episode_id = s.episode_id AND p.step_idx = s.step_idx" if pred_sql else ""}
        {source_filter}
    """
    table = _query(warehouse, sql, params + ([episode_source] if episode_source else []))
    if table is None:
        return []
    return [
        StepCandidate(
            episode_id=r["episode_id"],
            step_idx=int(r["step_idx"]),
            task_id=r["task_id"],
            success=r["success"],
            lcs_progress=r["lcs_progress"],
            env_progress=r["env_progress"],
            lcs_key_step=r["lcs_key_step"],
            env_key_step=r["env_key_step"],
            model_progress=r["model_progress"] if r["model_progress"] is not None else r["model_prob"],
            model_previous_progress=r["model_previous_progress"],
            model_id=model_id if (r["model_progress"] is not None or r["model_prob"] is not None) else None,
        )
        for r in table.to_pylist()
    ]


# -- annotation_candidates ----------------------------------------------------------------------------


class CandidateSelectionConfig(Config):
    budget: int = Field(default=500, description="how many steps to put in front of people this round")
    spot_check_share: float = Field(
        default=0.1, description="share of the budget for random spot checks of agreeing labels"
    )
    max_per_episode: int = Field(default=2, description="at most this many steps of one episode")
    seed: int = 0
    prediction_model: str | None = Field(default=None, description="rm_predictions model to use (default: the latest)")
    episode_source: str | None = Field(default=None, description="only episodes of this source (e.g. rollout)")


@asset(
    group_name=GROUP,
    code_version=SELECTION_VERSION,
    kinds={"duckdb", "parquet"},
    deps=CANDIDATE_UPSTREAM,
    description=(
        "Active selection: the steps whose automatic labels are least certain (LCS vs environment labels disagree, "
        "or the reward model disagrees with them), under a budget, stratified by task and success/failure, with "
        "spot checks. Steps already queued for people are left out. Table `annotation_candidates`."
    ),
)
def annotation_candidates(
    context: AssetExecutionContext,
    config: CandidateSelectionConfig,
    warehouse: WarehouseResource,
    label_studio: LabelStudioResource,
) -> MaterializeResult:
    wh = warehouse.get()
    candidates = load_step_candidates(wh, model=config.prediction_model, episode_source=config.episode_source)
    queued = _read_all(wh, "annotation_queue", ANNOTATION_QUEUE)
    step_rows = (
        queued.filter(pc.is_in(queued.column("interface"), pa.array(list(STEP_INTERFACES))))
        .select(["episode_id", "step_idx"])
        .to_pylist()
        if queued.num_rows
        else []
    )
    exclude = {(r["episode_id"], int(r["step_idx"])) for r in step_rows if r["episode_id"] is not None}
    picked = select_steps(
        candidates,
        config.budget,
        exclude=exclude,
        spot_check_share=config.spot_check_share,
        max_per_episode=config.max_per_episode,
        seed=config.seed,
    )
    rows = [
        {
            "episode_id": s.candidate.episode_id,
            "step_idx": s.candidate.step_idx,
            "task_id": s.candidate.task_id,
            "success": s.candidate.success,
            "stratum": s.candidate.stratum,
            "reason": s.reason,
            "uncertainty": s.uncertainty,
            "rank_in_stratum": s.rank_in_stratum,
            "lcs_progress": s.candidate.lcs_progress,
            "env_progress": s.candidate.env_progress,
            "lcs_key_step": s.candidate.lcs_key_step,
            "env_key_step": s.candidate.env_key_step,
            "model_progress": s.candidate.model_progress,
            "model_previous_progress": s.candidate.model_previous_progress,
            "model_id": s.candidate.model_id,
        }
        for s in picked
    ]
    materialization = Materialization(
        asset="annotation_candidates",
        run_id=context.run_id,
        code_version=SELECTION_VERSION,
        parameters={
            **config.model_dump(),
            "candidates": len(candidates),
            "excluded_already_queued": len(exclude),
            "git": git_revision(),
        },
        inputs=_table_inputs(wh, ("steps", "episodes", "progress_labels", "rm_predictions", "annotation_queue")),
    )
    output = wh.stage_table(
        "annotation_candidates", "latest", pa.Table.from_pylist(rows, schema=ANNOTATION_CANDIDATES), materialization
    )
    wh.publish(materialization, [output])
    reasons = Counter(r["reason"] for r in rows)
    strata = Counter(r["stratum"] for r in rows)
    context.log.info(f"selected {len(rows)} of {len(candidates)} steps: {dict(reasons)}")
    return MaterializeResult(
        metadata={
            "selected": len(rows),
            "candidate_steps": len(candidates),
            "already_queued_steps": len(exclude),
            "by_reason": MetadataValue.json(dict(reasons)),
            "strata": len(strata),
            "with_model_prediction": sum(1 for r in rows if r["model_progress"] is not None),
            "materialization_id": materialization.materialization_id,
            "selection_plot": MetadataValue.md(_selection_plot(wh, rows))
            if rows
            else MetadataValue.md("_nothing selected_"),
        }
    )


def _table_inputs(wh: Warehouse, tables: Sequence[str]) -> list[LineageInput]:
    inputs = []
    for table_name in tables:
        for dataset, materialization_id, path in _all_current(wh, table_name):
            inputs.append(
                LineageInput(
                    kind="asset",
                    input_asset=table_name,
                    input_materialization_id=materialization_id,
                    path=path,
                    version=dataset,
                )
            )
    return inputs


def _selection_plot(wh: Warehouse, rows: Sequence[dict]) -> str:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    reasons = sorted({r["reason"] for r in rows})
    for reason in reasons:
        left.hist(
            [r["uncertainty"] for r in rows if r["reason"] == reason], bins=20, range=(0, 1), alpha=0.7, label=reason
        )
    left.set_xlabel("uncertainty")
    left.set_ylabel("selected steps")
    left.legend(fontsize=7)
    by_task: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        by_task[r["task_id"]]["success" if r["success"] else "failure"] += 1
    tasks = sorted(by_task, key=lambda t: sum(by_task[t].values()))[-25:]
    right.barh(tasks, [by_task[t]["success"] for t in tasks], color="#3a7", label="success")
    right.barh(
        tasks,
        [by_task[t]["failure"] for t in tasks],
        left=[by_task[t]["success"] for t in tasks],
        color="#d54",
        label="failure",
    )
    right.tick_params(axis="y", labelsize=6)
    right.set_xlabel("selected steps per task")
    right.legend(fontsize=7)
    fig.tight_layout()
    return _png_markdown(fig, wh, "annotation_candidates", "selected steps: uncertainty and strata")


# -- annotation_queue (push) -----------------------------------------------------------------------------


class PushConfig(Config):
    interfaces: list[str] = Field(default_factory=lambda: list(INTERFACES), description="interfaces to push to")
    overlap_share: float = Field(default=0.1, description="share of tasks shown to two annotators (for Cohen's kappa)")
    chunk_size: int = Field(default=1000, description="tasks per bulk import request")
    milestone_review_budget: int = Field(
        default=100, description="milestone sets to review (1-5 scale), in total per interface version"
    )
    match_budget: int = Field(
        default=200, description="milestone-action pairs to label yes/no, in total per interface version"
    )
    match_threshold: float = Field(default=0.75, description="the matcher's similarity threshold (ADMIRE delta)")
    match_embedder: str = Field(
        default="minilm",
        description="similarity for match pairs: minilm (all-MiniLM-L6-v2, offline) or hashing (no model)",
    )
    task_specs_dir: str | None = Field(
        default=None, description="task specs with milestones (default: envs/task_specs)"
    )


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
    unknown = sorted(set(config.interfaces) - set(INTERFACES))
    if unknown:
        raise ValueError(f"unknown interfaces {unknown}; known: {sorted(INTERFACES)}")
    wh = warehouse.get()
    client = label_studio.client(progress=context.log.info)
    try:
        context.log.info(f"Label Studio: {client.url} (key from {client.credentials.source})")
        candidates_version = wh.current_version("annotation_candidates", "latest")
        candidates = pq.read_table(candidates_version[1]).to_pylist() if candidates_version else []
        items_by_interface = _build_items(wh, label_studio, config, candidates, client, context.log.info)
        summary: dict[str, dict] = {}
        outputs = []
        materialization = Materialization(
            asset="annotation_queue",
            run_id=context.run_id,
            code_version=PUSH_VERSION,
            parameters={k: v for k, v in config.model_dump().items()}
            | {"ls_server": client.server_key, "namespace": label_studio.project_namespace},
            inputs=_table_inputs(wh, ("annotation_candidates",)),
        )
        project_urls = {}
        for name in config.interfaces:
            interface = INTERFACES[name]
            handle = ensure_project(
                client,
                interface,
                label_studio.project_namespace,
                overlap_share=config.overlap_share,
                local_files_root=label_studio.stepwise_home() if client.server_key == "local" else None,
            )
            dataset = f"{client.server_key}-{interface.version_key}"
            previous, _, _ = _current_rows(wh, "annotation_queue", dataset)
            adopted = reconcile_queue(client, handle, previous)
            queued_keys = {r["item_key"] for r in previous} | {r["item_key"] for r in adopted}
            items = items_by_interface.get(name, [])

            def progress(done: int, total: int, name: str = name) -> None:
                context.log.info(f"{name}: imported {done}/{total} tasks")

            outcome = push_items(
                client,
                handle,
                items,
                queued_keys,
                chunk_size=config.chunk_size,
                progress=progress,
                expected=len({i.item_key for i in items} - queued_keys),
            )
            new_rows = adopted + outcome.pushed_rows
            project_urls[name] = f"{client.url}/projects/{handle.project_id}"
            summary[name] = {
                "project_id": handle.project_id,
                "pushed": len(outcome.pushed_rows),
                "adopted": len(adopted),
                "already_queued": outcome.already_queued,
                "queued_total": len(previous) + len(new_rows),
                "seconds": round(outcome.seconds, 2),
            }
            if new_rows or not previous:
                for row in new_rows:
                    row.setdefault(
                        "selection_materialization_id", candidates_version[0] if candidates_version else None
                    )
                table = pa.Table.from_pylist(previous + new_rows, schema=ANNOTATION_QUEUE)
                outputs.append(wh.stage_table("annotation_queue", dataset, table, materialization))
        if outputs:
            wh.publish(materialization, outputs)
    finally:
        client.close()
    total_pushed = sum(s["pushed"] for s in summary.values())
    context.log.info(f"pushed {total_pushed} tasks: {summary}")
    return MaterializeResult(
        metadata={
            "pushed": total_pushed,
            "by_interface": MetadataValue.json(summary),
            "label_studio": MetadataValue.url(client.url),
            "projects": MetadataValue.json(project_urls),
            "login": MetadataValue.text(_login_hint(label_studio)),
        }
    )


def _login_hint(label_studio: LabelStudioResource) -> str:
    if label_studio.uses_local_server():
        return f"admin@stepwise.local; password in {label_studio.data_dir() / 'stepwise-credentials.json'}"
    return "your own Label Studio account"


def _screenshot_url(path: str | None, home: Path, local_root: Path | None) -> str | None:
    """A URL Label Studio can show for a screenshot (relative paths are under ``home``).

    On the project's own server (``local_root`` = STEPWISE_HOME, which every project has as a
    local-files storage) a file under it is served at ``/data/local-files/?d=<path relative to the
    server's document root, the parent of STEPWISE_HOME>``; anywhere else it is inlined as a data
    URI when small (<= 400 kB), else left out.
    """
    if not path:
        return None
    file = Path(path)
    if not file.is_absolute():
        file = home / file
    if not file.is_file():
        return None
    if local_root is not None:
        root = local_root.resolve()
        if file.resolve().is_relative_to(root):
            return f"/data/local-files/?d={file.resolve().relative_to(root.parent)}"
    if file.stat().st_size > 400_000:
        return None
    mime = mimetypes.guess_type(file.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(file.read_bytes()).decode()}"


_ELEMENT_FIELDS = (
    "ref",
    "role",
    "text",
    "element_id",
    "classes",
    "description",
    "value",
    "bounds",
    "clickable",
    "editable",
    "checked",
    "focused",
    "parent_ref",
    "depth",
)


def _bounds_column(bounds: pa.Array | None, n: int) -> list[tuple[float, float, float, float]]:
    """Element bounds as 4-tuples, through numpy when every element has four (the usual case)."""
    if bounds is None:
        return [(0.0, 0.0, 0.0, 0.0)] * n
    lengths = pc.fill_null(pc.list_value_length(bounds), 0).to_numpy()
    if (lengths == 4).all():
        values = pc.list_flatten(bounds).to_numpy(zero_copy_only=False).astype("float64").reshape(-1, 4)
        return [tuple(row) for row in values.tolist()]
    return [
        tuple(float(b) for b in box) if box and len(box) == 4 else (0.0, 0.0, 0.0, 0.0) for box in bounds.to_pylist()
    ]


def screens_from_arrow(screens: pa.ChunkedArray | pa.Array) -> list[Screen]:
    """The ``steps.screen`` column as Screens, converting column-wise (much faster than row dicts)."""
    if isinstance(screens, pa.ChunkedArray):
        screens = screens.combine_chunks() if screens.num_chunks != 1 else screens.chunk(0)
    offsets = screens.offsets.to_pylist()
    flat = screens.values
    names = set(flat.type.names) if flat.type.num_fields else set()
    columns = {
        name: (flat.field(name).to_pylist() if name in names else [None] * len(flat))
        for name in _ELEMENT_FIELDS
        if name != "bounds"
    }
    columns["bounds"] = _bounds_column(flat.field("bounds") if "bounds" in names else None, len(flat))
    elements = [
        UIElement(
            ref=str(ref),
            role=role or "",
            text=text or "",
            element_id=element_id or "",
            classes=classes or "",
            description=description or "",
            value=value,
            bounds=bounds,
            clickable=bool(clickable),
            editable=bool(editable),
            checked=checked,
            focused=bool(focused),
            parent_ref=parent_ref,
            depth=int(depth or 0),
        )
        for ref, role, text, element_id, classes, description, value, bounds, clickable, editable, checked, focused, parent_ref, depth in zip(
            *(columns[name] for name in _ELEMENT_FIELDS), strict=True
        )
    ]
    valid = screens.is_valid().to_pylist()
    return [Screen(tuple(elements[offsets[i] : offsets[i + 1]]) if valid[i] else ()) for i in range(len(screens))]


def _step_views(
    wh: Warehouse, keys: set[tuple[str, int]], home: Path, local_root: Path | None
) -> dict[tuple[str, int], StepView]:
    """StepViews (screen, action, history) for the given steps; histories from the episodes' action texts."""
    if not keys:
        return {}
    episodes = sorted({e for e, _ in keys})
    actions = _query(
        wh,
        "SELECT episode_id, step_idx, action_text FROM steps WHERE episode_id IN (SELECT unnest(?::VARCHAR[])) "
        "ORDER BY episode_id, step_idx",
        [episodes],
    )
    history: dict[tuple[str, int], tuple[str, ...]] = {}
    current, done = None, []
    for episode_id, step_idx, action_text in (
        zip(*(actions.column(c).to_pylist() for c in ("episode_id", "step_idx", "action_text")), strict=True)
        if actions is not None
        else ()
    ):
        if episode_id != current:
            current, done = episode_id, []
        if (episode_id, int(step_idx)) in keys:
            history[(episode_id, int(step_idx))] = tuple(done)
        done.append(action_text)
    wanted = pa.table({"episode_id": [k[0] for k in keys], "step_idx": pa.array([k[1] for k in keys], pa.int32())})
    with wh.connect(read_only=True) as con:
        con.register("wanted", wanted)
        table = con.sql(
            "SELECT s.episode_id, s.step_idx, s.action_type, s.action_text, s.target_ref, s.input_text, s.scroll_direction, "
            "s.screen, s.screenshot_path, e.task_id, e.instruction FROM steps s JOIN episodes e USING (episode_id) "
            "JOIN wanted w ON w.episode_id = s.episode_id AND w.step_idx = s.step_idx"
        ).to_arrow_table()
    screens = screens_from_arrow(table.column("screen"))
    columns = {name: table.column(name).to_pylist() for name in table.column_names if name != "screen"}
    views: dict[tuple[str, int], StepView] = {}
    for i, screen in enumerate(screens):
        key = (columns["episode_id"][i], int(columns["step_idx"][i]))
        views[key] = StepView(
            episode_id=key[0],
            step_idx=key[1],
            task_id=columns["task_id"][i],
            instruction=columns["instruction"][i] or "",
            screen=screen,
            action_type=columns["action_type"][i],
            action_text=columns["action_text"][i],
            target_ref=columns["target_ref"][i],
            input_text=columns["input_text"][i],
            scroll_direction=columns["scroll_direction"][i],
            history=history.get(key, ()),
            screenshot_url=_screenshot_url(columns["screenshot_path"][i], home, local_root),
        )
    return views


def _step_prediction(interface: str, row: dict) -> dict | None:
    """The pre-annotation for a step from the current model (None without a model)."""
    model, value = row.get("model_id"), row.get("model_progress")
    if not model or value is None:
        return None
    if interface == "step_progress":
        return {"model_version": model, "score": 1.0, "result": progress_prediction(float(value))}
    previous = row.get("model_previous_progress")
    delta = float(value) - float(previous if previous is not None else 0.0)
    label = "positive" if delta > 0 else "negative"
    return {
        "model_version": model,
        "score": round(min(1.0, 0.5 + abs(delta)), 4),
        "result": correctness_prediction(label),
    }


def _build_items(
    wh: Warehouse,
    label_studio: LabelStudioResource,
    config: PushConfig,
    candidates: list[dict],
    client: LabelStudioClient,
    log: Callable[[str], None],
) -> dict[str, list[QueueItem]]:
    home = wh.home
    local = label_studio.stepwise_home() if client.server_key == "local" else None
    items: dict[str, list[QueueItem]] = defaultdict(list)
    step_interfaces = [i for i in config.interfaces if i in STEP_INTERFACES]
    if step_interfaces and candidates:
        views = _step_views(wh, {(c["episode_id"], int(c["step_idx"])) for c in candidates}, home, local)
        rendered: dict[str, dict] = {}  # the HTML of a step, shared by the step interfaces

        def render(view: StepView, interface: Interface, key: str, reason: str | None) -> dict:
            if key not in rendered:
                rendered[key] = step_task_data(view, interface=interface, item_key=key, extra={"reason": reason})
            data = rendered.pop(key) if len(step_interfaces) == 1 else dict(rendered[key])
            data["interface_version"] = interface.version_key
            return data

        for name in step_interfaces:
            interface = INTERFACES[name]
            for c in candidates:
                view = views.get((c["episode_id"], int(c["step_idx"])))
                if view is None:
                    continue
                key = step_item_key(view.episode_id, view.step_idx)
                prediction = _step_prediction(name, c)
                fields = {
                    k: c.get(k) for k in ("success", "stratum", "reason", "uncertainty", "lcs_progress", "env_progress")
                }
                fields["model_progress"] = c.get("model_progress")
                if prediction:
                    first = prediction["result"][0]["value"]
                    fields["prediction_label"] = (first.get("choices") or [None])[0]
                    fields["prediction_value"] = first.get("number") / 100 if first.get("number") is not None else None
                data = functools.partial(render, view, interface, key, c.get("reason"))
                items[name].append(QueueItem(name, key, data, prediction, fields))
    if {"milestone_review", "milestone_match"} & set(config.interfaces):
        _milestone_items(wh, config, items, home, local, client.server_key, log)
    return items


def load_milestone_sets(wh: Warehouse, specs_dir: str | None = None) -> list[dict]:
    """Milestone sets to review: the ``milestones`` table when one exists, else the task specs' milestones.

    A set is {milestone_set_id, task_id, source, milestones: [text, ...]}. The ``milestones``
    table may use ``milestone``/``text``/``description``/``name`` for the text and
    ``milestone_idx``/``idx``/``position`` for the order; sets are told apart by
    ``milestone_set_id``/``set_id``/``version``/``label_version`` when present.
    """
    cols = _columns(wh, "milestones")
    if cols and "task_id" in cols:
        text = next((c for c in ("milestone", "text", "description", "name") if c in cols), None)
        order = next((c for c in ("milestone_idx", "idx", "position", "order_idx") if c in cols), None)
        set_col = next((c for c in ("milestone_set_id", "set_id", "version", "label_version") if c in cols), None)
        if text:
            table = _query(
                wh,
                f"SELECT task_id, {set_col or 'NULL'}::VARCHAR AS set_id, {text}::VARCHAR AS text, "
                f"{order or 'NULL'} AS ord FROM milestones",
            )
            sets: dict[tuple, list] = defaultdict(list)
            for row in table.to_pylist() if table is not None else []:
                sets[(row["task_id"], row["set_id"])].append(
                    (row["ord"] if row["ord"] is not None else len(sets[(row["task_id"], row["set_id"])]), row["text"])
                )
            return [
                {
                    "milestone_set_id": f"{task}:{set_id or 'v0'}",
                    "task_id": task,
                    "source": "milestones",
                    "milestones": [t for _, t in sorted(ms, key=lambda m: m[0])],
                }
                for (task, set_id), ms in sorted(sets.items(), key=str)
            ]
    from envs.tasks import load_task_specs

    folder = Path(specs_dir) if specs_dir else Path(__file__).resolve().parents[1] / "envs" / "task_specs"
    out = []
    for sub in sorted(p for p in [folder, *folder.glob("*")] if p.is_dir()):
        try:
            specs = load_task_specs(sub)
        except Exception:  # noqa: BLE001 - a folder without specs, or a spec another stage is still writing
            continue
        for task_id, spec in sorted(specs.items()):
            if spec.milestones:
                out.append(
                    {
                        "milestone_set_id": f"{task_id}:spec",
                        "task_id": task_id,
                        "source": "task_spec",
                        "milestones": [m.name for m in spec.milestones],
                    }
                )
    unique = {s["milestone_set_id"]: s for s in out}
    return list(unique.values())


def _embedder(name: str):
    from annotation.text_similarity import HashingTextEmbedder, TextEmbedder

    return TextEmbedder() if name == "minilm" else HashingTextEmbedder()


def _milestone_items(
    wh: Warehouse,
    config: PushConfig,
    items: dict[str, list[QueueItem]],
    home: Path,
    local: Path | None,
    server_key: str,
    log: Callable[[str], None],
) -> None:
    """Milestone review items (one per milestone set) and milestone-action match pairs near the matcher's threshold."""
    from annotation.labelstudio.selection import stable_hash
    from annotation.text_similarity import text_similarity_matrix

    sets = load_milestone_sets(wh, config.task_specs_dir)
    if not sets:
        log("no milestone sets (no `milestones` table and no task specs with milestones): nothing to review")
        return
    tasks = sorted({s["task_id"] for s in sets})
    episodes = _query(
        wh,
        "SELECT episode_id, task_id, success, instruction, n_steps FROM episodes "
        "WHERE task_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY episode_id",
        [tasks],
    )
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in episodes.to_pylist() if episodes is not None else []:
        by_task[row["task_id"]].append(row)
    queued = [
        r
        for r in _read_all(wh, "annotation_queue", ANNOTATION_QUEUE).to_pylist()
        if r["interface"] in ("milestone_review", "milestone_match") and r["ls_server"] == server_key
    ]
    queued_keys = {r["item_key"] for r in queued}
    n_queued = Counter(r["interface"] for r in queued)

    if "milestone_review" in config.interfaces:
        interface = INTERFACES["milestone_review"]
        room = max(
            0, config.milestone_review_budget - n_queued["milestone_review"]
        )  # budgets are totals per interface version
        chosen = [s for s in sets if milestone_set_item_key(s["milestone_set_id"]) not in queued_keys][:room]
        references = {}
        for s in chosen:
            ok = sorted(
                (e for e in by_task.get(s["task_id"], []) if e["success"]),
                key=lambda e: (e["n_steps"], e["episode_id"]),
            )
            references[s["milestone_set_id"]] = ok[len(ok) // 2] if ok else None  # a typical (median-length) success
        ref_views = _step_views(wh, {(e["episode_id"], 0) for e in references.values() if e}, home, local)
        ref_actions = _episode_actions(wh, [e["episode_id"] for e in references.values() if e])
        for s in chosen:
            ref = references[s["milestone_set_id"]]
            instruction = (
                ref["instruction"]
                if ref
                else (by_task.get(s["task_id"]) or [{"instruction": s["task_id"]}])[0]["instruction"]
            )
            key = milestone_set_item_key(s["milestone_set_id"])
            data = milestone_review_data(
                instruction=instruction or s["task_id"],
                task_id=s["task_id"],
                milestone_set_id=s["milestone_set_id"],
                milestones=s["milestones"],
                reference=ref_views.get((ref["episode_id"], 0)) if ref else None,
                reference_actions=ref_actions.get(ref["episode_id"], []) if ref else [],
                interface=interface,
                item_key=key,
            )
            items["milestone_review"].append(
                QueueItem(
                    "milestone_review",
                    key,
                    data,
                    None,
                    {
                        "task_id": s["task_id"],
                        "milestone_set_id": s["milestone_set_id"],
                        "reason": "milestone_review",
                        "stratum": f"{s['task_id']}|{s['source']}",
                    },
                )
            )

    room = max(0, config.match_budget - n_queued["milestone_match"])
    if "milestone_match" in config.interfaces and room > 0:
        interface = INTERFACES["milestone_match"]
        sampled: list[dict] = []
        for task_id in tasks:  # a few episodes per task and outcome keep this cheap on large corpora
            for outcome in (True, False):
                pool = sorted(
                    (e for e in by_task.get(task_id, []) if bool(e["success"]) == outcome),
                    key=lambda e: stable_hash(e["episode_id"], seed=7),
                )
                sampled += pool[:4]
        actions = _episode_actions(wh, [e["episode_id"] for e in sampled], with_index=True)
        embed = _embedder(config.match_embedder).embed
        pairs: list[MatchPairCandidate] = []
        episode_info = {e["episode_id"]: e for e in sampled}
        for s in sets:
            for episode_id, steps in actions.items():
                episode = episode_info[episode_id]
                if episode["task_id"] != s["task_id"] or not steps:
                    continue
                similarity = text_similarity_matrix(s["milestones"], [text for _, text in steps], embed)
                for m_idx, milestone in enumerate(s["milestones"]):
                    for j, (step_idx, _) in enumerate(steps):
                        pairs.append(
                            MatchPairCandidate(
                                s["milestone_set_id"],
                                m_idx,
                                milestone,
                                episode_id,
                                step_idx,
                                s["task_id"],
                                episode["success"],
                                float(similarity[m_idx, j]),
                            )
                        )
        chosen_pairs = select_match_pairs(pairs, room, threshold=config.match_threshold, exclude=queued_keys)
        views = _step_views(wh, {(p.episode_id, p.step_idx) for p, _ in chosen_pairs}, home, local)
        n_by_set = {s["milestone_set_id"]: len(s["milestones"]) for s in sets}
        matcher = f"matcher:{config.match_embedder}@{config.match_threshold}"
        for pair, score in chosen_pairs:
            view = views.get((pair.episode_id, pair.step_idx))
            if view is None:
                continue
            key = match_item_key(pair)
            data = match_task_data(
                view,
                milestone_set_id=pair.milestone_set_id,
                milestone_idx=pair.milestone_idx,
                n_milestones=n_by_set[pair.milestone_set_id],
                milestone=pair.milestone,
                interface=interface,
                item_key=key,
            )
            predicted = "yes" if pair.similarity >= config.match_threshold else "no"
            prediction = {
                "model_version": matcher,
                "score": round(pair.similarity, 4),
                "result": match_prediction(predicted),
            }
            items["milestone_match"].append(
                QueueItem(
                    "milestone_match",
                    key,
                    data,
                    prediction,
                    {
                        "success": pair.success,
                        "stratum": pair.stratum,
                        "reason": "match_threshold",
                        "uncertainty": score,
                        "prediction_label": predicted,
                        "prediction_value": pair.similarity,
                    },
                )
            )


def _episode_actions(wh: Warehouse, episode_ids: Sequence[str], *, with_index: bool = False) -> dict[str, list]:
    if not episode_ids:
        return {}
    table = _query(
        wh,
        "SELECT episode_id, step_idx, action_text FROM steps WHERE episode_id IN (SELECT unnest(?::VARCHAR[])) "
        "ORDER BY episode_id, step_idx",
        [sorted(set(episode_ids))],
    )
    out: dict[str, list] = defaultdict(list)
    for row in table.to_pylist() if table is not None else []:
        out[row["episode_id"]].append((int(row["step_idx"]), row["action_text"]) if with_index else row["action_text"])
    return dict(out)


# -- human_labels (sync) -----------------------------------------------------------------------------------


def managed_projects(
    client: LabelStudioClient, namespace: str, interfaces: Sequence[str] | None = None
) -> list[tuple[Interface, int]]:
    """The Label Studio projects of our interfaces that exist on the server (found by title)."""
    found = []
    for name in interfaces or list(INTERFACES):
        interface = INTERFACES[name]
        project_id = client.find_project(interface.project_title(namespace))
        if project_id is not None:
            found.append((interface, project_id))
    return found


def _queue_version(wh: Warehouse, server_key: str, interface: Interface) -> tuple[str, str] | None:
    return wh.current_version("annotation_queue", f"{server_key}-{interface.version_key}")


def _sync_lock_path(label_studio: LabelStudioResource) -> Path:
    return label_studio.data_dir() / ".stepwise-sync.lock"


class SyncConfig(Config):
    full_resync: bool = Field(default=True, description="export every project even if its counts did not change")


@asset(
    group_name=GROUP,
    code_version="human-labels-sync-1",
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
    wh = warehouse.get()
    client = label_studio.client(progress=context.log.info)
    results = []
    try:
        with sync_lock(_sync_lock_path(label_studio), timeout_s=600) as taken:
            if not taken:
                raise LabelStudioError("another sync held the lock for 10 minutes")
            syncer = ProjectSyncer(
                client,
                wh,
                salt=label_studio.salt(),
                run_id=context.run_id,
                blocking=True,
                full_resync_every_s=0.0 if config.full_resync else 1800.0,
                log=context.log.info,
            )
            state = SyncState()
            for interface, project_id in managed_projects(client, label_studio.project_namespace):
                results.append(
                    syncer.sync(
                        interface,
                        project_id,
                        state.project(client.server_key, project_id),
                        queue_version=_queue_version(wh, client.server_key, interface),
                    )
                )
    finally:
        client.close()
    return MaterializeResult(metadata=_sync_metadata(results, client.url))


def _sync_metadata(results: Sequence, url: str) -> dict[str, Any]:
    return {
        "projects": MetadataValue.json(
            {
                r.interface: {
                    "project_id": r.project_id,
                    "status": r.status,
                    "created": r.diff.created,
                    "updated": r.diff.updated,
                    "retracted": r.diff.retracted,
                    "active": r.active,
                    "usable_for_training": r.usable,
                    "export_id": r.export_id,
                    "seconds": round(r.seconds, 2),
                }
                for r in results
            }
        ),
        "created": sum(r.diff.created for r in results),
        "updated": sum(r.diff.updated for r in results),
        "retracted": sum(r.diff.retracted for r in results),
        "active_labels": sum(r.active for r in results),
        "usable_for_training": sum(r.usable for r in results),
        "label_studio": MetadataValue.url(url),
    }


# -- the sensor ------------------------------------------------------------------------------------------------


def build_label_studio_sensor(
    *,
    name: str = "label_studio_sync",
    minimum_interval_seconds: int = 30,
    backoff_base_s: float = 30.0,
    backoff_max_s: float = 900.0,
    full_resync_every_s: float = 1800.0,
    tick_budget_s: float = 35.0,
    on_stage: Callable[[str, dict], None] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
):
    """The sensor that keeps ``human_labels`` current (see the module docstring).

    Each tick: skip while backing off; otherwise sync every Stepwise project (cheap when nothing
    changed), report a ``human_labels`` materialization per changed project and request a run of
    the downstream assets. Label Studio unreachable or slow: the tick records the state (a
    pending export survives) and backs off ``backoff_base_s`` x 2^(failures-1), at most
    ``backoff_max_s``. A refused key raises one clear :class:`LabelStudioAuthError`. Projects left
    when a tick has run ``tick_budget_s`` wait for the next tick (Dagster stops a sensor
    evaluation after 60 s); a large export that outlives its request is picked up by title later.
    ``on_stage`` is called at each stage of a project sync (tests use it to stop the server mid-sync).
    """

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=DOWNSTREAM_OF_LABELS,
        default_status=default_status,
        description="Pulls new, updated and deleted Label Studio annotations into human_labels; backs off while Label Studio is down.",
    )
    def label_studio_sync(
        context: SensorEvaluationContext, warehouse: WarehouseResource, label_studio: LabelStudioResource
    ):
        state = SyncState.from_json(context.cursor)
        now = time.time()
        if state.retry_after and now < state.retry_after:
            return SkipReason(
                f"backing off after {state.consecutive_failures} failed attempt(s) (last: {state.last_error}); "
                f"next attempt in {state.retry_after - now:.0f} s"
            )
        wh = warehouse.get()
        results = []
        client: LabelStudioClient | None = None
        try:
            with sync_lock(_sync_lock_path(label_studio), timeout_s=0) as taken:
                if not taken:
                    return SkipReason("another sync is running")
                client = label_studio.client(start=False)
                syncer = ProjectSyncer(
                    client,
                    wh,
                    salt=label_studio.salt(),
                    run_id=f"sensor:{name}",
                    blocking=False,
                    full_resync_every_s=full_resync_every_s,
                    on_stage=on_stage,
                    log=context.log.info,
                )
                tick_started = time.monotonic()
                projects = sorted(
                    managed_projects(client, label_studio.project_namespace),  # least recently checked first
                    key=lambda p: state.project(client.server_key, p[1]).last_checked_at or 0.0,
                )
                for interface, project_id in projects:
                    if time.monotonic() - tick_started > tick_budget_s:
                        context.log.info(f"tick budget used; {interface.name} waits for the next tick")
                        break
                    results.append(
                        syncer.sync(
                            interface,
                            project_id,
                            state.project(client.server_key, project_id),
                            queue_version=_queue_version(wh, client.server_key, interface),
                        )
                    )
        except LabelStudioAuthError:
            raise
        except (LabelStudioUnavailable, LabelStudioError) as exc:
            state.consecutive_failures += 1
            delay = backoff_seconds(state.consecutive_failures, base_s=backoff_base_s, max_s=backoff_max_s)
            state.retry_after = now + delay
            state.last_error = scrub(exc)[:300]
            context.log.warning(f"Label Studio sync failed ({state.last_error}); retrying in {delay:.0f} s")
            return SensorResult(
                skip_reason=SkipReason(f"Label Studio unavailable: {state.last_error}; retrying in {delay:.0f} s"),
                cursor=state.to_json(),
            )
        finally:
            if client is not None:
                client.close()
        state.consecutive_failures, state.retry_after, state.last_error = 0, None, None
        applied = [r for r in results if r.status == "applied"]
        waiting = [r for r in results if r.status == "waiting_for_export"]
        events = [
            AssetMaterialization(
                asset_key=AssetKey("human_labels"),
                description=f"{r.interface}: +{r.diff.created} new, {r.diff.updated} updated, {r.diff.retracted} retracted",
                metadata={
                    "interface": r.interface,
                    "ls_project_id": r.project_id,
                    "created": r.diff.created,
                    "updated": r.diff.updated,
                    "retracted": r.diff.retracted,
                    "active_labels": r.active,
                    "usable_for_training": r.usable,
                    "export_id": r.export_id or 0,
                    "materialization_id": r.materialization_id or "",
                    "path": MetadataValue.path(r.output_path or ""),
                },
            )
            for r in applied
        ]
        if not applied:
            reason = (
                f"waiting for {len(waiting)} Label Studio export(s)"
                if waiting
                else f"no annotation changes in {len(results)} project(s)"
                if results
                else "no Stepwise projects in Label Studio yet"
            )
            return SensorResult(skip_reason=SkipReason(reason), cursor=state.to_json())
        run_key = "labels-" + "-".join(sorted(r.materialization_id or "" for r in applied))
        return SensorResult(
            run_requests=[
                RunRequest(
                    run_key=run_key,
                    asset_selection=[AssetKey(k) for k in DOWNSTREAM_OF_LABELS],
                    tags={"stepwise/trigger": "label_studio_sync"},
                )
            ],
            asset_events=events,
            cursor=state.to_json(),
        )

    return label_studio_sync


label_studio_sync = build_label_studio_sensor()


# -- downstream: training labels, agreement, source comparison ----------------------------------------------------


def _human_rows(wh: Warehouse) -> list[dict]:
    from warehouse.tables_annotation import HUMAN_LABELS

    return _read_all(wh, "human_labels", HUMAN_LABELS).to_pylist()


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
    wh = warehouse.get()
    rows = _human_rows(wh)
    versions = sorted({r["interface_version"] for r in rows if r.get("interface_version")})
    label_version = "human:" + ",".join(versions) if versions else "human"
    labels = step_training_labels(rows, label_version)
    progress_rows = [
        {
            "episode_id": r["episode_id"],
            "step_idx": r["step_idx"],
            "source": "human",
            "method": "annotated",
            "progress": r["progress"],
            "is_key_step": r["correctness"] == "positive",
            "recipe_id": None,
            "completion_ratio": None,
            "label_version": label_version,
        }
        for r in labels
        if r["progress"] is not None
    ]
    materialization = Materialization(
        asset="human_step_labels",
        run_id=context.run_id,
        code_version=REPORT_VERSION,
        parameters={"label_version": label_version},
        inputs=_table_inputs(wh, ("human_labels",)),
    )
    outputs = [
        wh.stage_table(
            "human_step_labels", "human", pa.Table.from_pylist(labels, schema=HUMAN_STEP_LABELS), materialization
        ),
        wh.stage_table(
            "progress_labels", "human", pa.Table.from_pylist(progress_rows, schema=PROGRESS_LABELS), materialization
        ),
    ]
    wh.publish(materialization, outputs)
    counts = Counter(r["correctness"] for r in labels)
    return MaterializeResult(
        metadata={
            "steps": len(labels),
            "positive": counts.get("positive", 0),
            "negative": counts.get("negative", 0),
            "no_majority_or_unsure_only": counts.get(None, 0),
            "with_progress": len(progress_rows),
            "unsure_answers_excluded": sum(r["unsure_votes"] for r in labels),
            "label_version": label_version,
        }
    )


@asset(
    group_name=GROUP,
    code_version=REPORT_VERSION,
    kinds={"parquet"},
    deps=["human_labels"],
    description=(
        "Annotator agreement and statistics: Cohen's kappa where tasks overlap (quadratic-weighted for progress and the "
        "1-5 milestone scale), per-annotator volume, unsure and skip rates, lead time. Table `annotator_stats`, plot."
    ),
)
def annotation_agreement(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    rows = _human_rows(wh)
    stats = annotator_stats(rows)
    pairs = pairwise_agreement(rows)
    kappas = {}
    for name in INTERFACES:
        kappa, n_pairs = pooled_kappa(rows, name)
        kappas[name] = {"kappa": None if kappa is None else round(kappa, 4), "overlapping_pairs": n_pairs}
    materialization = Materialization(
        asset="annotation_agreement",
        run_id=context.run_id,
        code_version=REPORT_VERSION,
        inputs=_table_inputs(wh, ("human_labels",)),
    )
    output = wh.stage_table(
        "annotator_stats", "human", pa.Table.from_pylist(stats, schema=ANNOTATOR_STATS), materialization
    )
    wh.publish(materialization, [output])
    active = [r for r in rows if r["status"] == "active"]
    milestone_scores = [r["value"] for r in active if r["interface"] == "milestone_review" and r["value"] is not None]
    metadata = {
        "annotations": len(active),
        "annotators": len({r["annotator_id"] for r in active if r["annotator_id"]}),
        "cohen_kappa": MetadataValue.json(kappas),
        "unsure_share": MetadataValue.float(
            sum(1 for r in active if r["label"] == "unsure")
            / max(1, sum(1 for r in active if r["interface"] == "step_correctness"))
        ),
        "retracted": sum(1 for r in rows if r["status"] == "retracted"),
        "annotator_stats": MetadataValue.md(
            _md_table(
                stats,
                [
                    "annotator_id",
                    "interface",
                    "n_annotations",
                    "n_unsure",
                    "n_skipped",
                    "median_lead_time_s",
                    "n_overlapping_tasks",
                    "agreement_with_others",
                    "kappa_with_others",
                ],
            )
        ),
        "annotator_pairs": MetadataValue.md(
            _md_table(
                [p.__dict__ for p in pairs],
                ["interface", "annotator_a", "annotator_b", "n_items", "agreement", "kappa"],
            )
        ),
    }
    if milestone_scores:  # ADMIRE B.5.2 reports the mean score and the share rated 4 or 5
        metadata["milestone_mean_score"] = MetadataValue.float(sum(milestone_scores) / len(milestone_scores))
        metadata["milestone_share_4_or_5"] = MetadataValue.float(
            sum(1 for s in milestone_scores if s >= 4) / len(milestone_scores)
        )
    if stats:
        metadata["plot"] = MetadataValue.md(_annotator_plot(wh, stats, kappas))
    return MaterializeResult(metadata=metadata)


def _annotator_plot(wh: Warehouse, stats: Sequence[dict], kappas: dict) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    annotators = sorted({s["annotator_id"] for s in stats})
    interfaces = sorted({s["interface"] for s in stats})
    bottom = [0] * len(annotators)
    for interface in interfaces:
        counts = [
            next((s["n_annotations"] for s in stats if s["annotator_id"] == a and s["interface"] == interface), 0)
            for a in annotators
        ]
        axes[0].bar(annotators, counts, bottom=bottom, label=interface)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    axes[0].set_title("annotations per annotator")
    axes[0].legend(fontsize=7)
    leads = [[s["median_lead_time_s"] or 0 for s in stats if s["annotator_id"] == a] for a in annotators]
    axes[1].bar(annotators, [max(v) if v else 0 for v in leads], color="#58a")
    axes[1].set_title("median lead time (s)")
    names = [k for k, v in kappas.items() if v["kappa"] is not None]
    axes[2].bar(names, [kappas[k]["kappa"] for k in names], color="#a85")
    axes[2].set_ylim(-0.2, 1.0)
    axes[2].set_title("Cohen's kappa (overlapping tasks)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    return _png_markdown(fig, wh, "annotation_agreement", "annotator statistics and agreement")


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
    wh = warehouse.get()
    human = _current_rows(wh, "human_step_labels", "human")[0]
    keys = {(r["episode_id"], int(r["step_idx"])) for r in human}
    candidates = {(c.episode_id, c.step_idx): c for c in load_step_candidates(wh)} if keys else {}
    steps = []
    for r in human:
        c = candidates.get((r["episode_id"], int(r["step_idx"])))
        model_delta = None
        if c is not None and c.model_progress is not None:
            model_delta = c.model_progress - (c.model_previous_progress or 0.0)
        steps.append(
            {
                "human_progress": r["progress"],
                "human_correct": None if r["correctness"] is None else r["correctness"] == "positive",
                "lcs_progress": c.lcs_progress if c else None,
                "lcs_correct": c.lcs_key_step if c else None,
                "env_progress": c.env_progress if c else None,
                "env_correct": c.env_key_step if c else None,
                "model_progress": c.model_progress if c else None,
                "model_correct": None if model_delta is None else model_delta > 0,
            }
        )
    comparison = compare_label_sources(steps)
    materialization = Materialization(
        asset="label_source_comparison",
        run_id=context.run_id,
        code_version=REPORT_VERSION,
        inputs=_table_inputs(wh, ("human_step_labels", "progress_labels", "rm_predictions")),
    )
    output = wh.stage_table(
        "label_source_agreement",
        "human",
        pa.Table.from_pylist(comparison, schema=LABEL_SOURCE_AGREEMENT),
        materialization,
    )
    wh.publish(materialization, [output])
    metadata: dict[str, Any] = {
        "steps_with_human_labels": len(steps),
        "comparisons": MetadataValue.md(
            _md_table(
                comparison,
                [
                    "source_a",
                    "source_b",
                    "quantity",
                    "n_steps",
                    "agreement",
                    "cohen_kappa",
                    "mean_abs_diff",
                    "pearson_r",
                ],
            )
        ),
    }
    if comparison:
        metadata["plot"] = MetadataValue.md(_comparison_plot(wh, comparison))
    return MaterializeResult(metadata=metadata)


def _comparison_plot(wh: Warehouse, comparison: Sequence[dict]) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, quantity in zip(axes, ("correctness", "progress"), strict=True):
        rows = [r for r in comparison if r["quantity"] == quantity]
        names = [f"{r['source_a']}~{r['source_b']}\n(n={r['n_steps']})" for r in rows]
        ax.bar(names, [r["agreement"] or 0 for r in rows], color="#7a9", label="agreement")
        ax.plot(
            names,
            [r["cohen_kappa"] if r["cohen_kappa"] is not None else float("nan") for r in rows],
            "o",
            color="#a33",
            label="kappa",
        )
        ax.set_ylim(-0.2, 1.05)
        ax.set_title(quantity)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png_markdown(fig, wh, "label_source_comparison", "label sources compared on the same steps")


# -- checks ----------------------------------------------------------------------------------------------------


@asset_check(asset="human_labels", description="one row per Label Studio annotation: no annotation counted twice")
def human_labels_unique_annotations(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = _human_rows(warehouse.get())
    counts = Counter((r["ls_server"], r["annotation_id"]) for r in rows)
    duplicates = sum(1 for n in counts.values() if n > 1)
    return AssetCheckResult(passed=duplicates == 0, metadata={"annotations": len(counts), "duplicated_ids": duplicates})


@asset_check(
    asset="human_labels",
    description="unsure, skipped and retracted annotations are never usable for training",
    blocking=True,
)
def human_labels_unsure_excluded(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = _human_rows(warehouse.get())
    bad = sum(
        1
        for r in rows
        if r["usable_for_training"] and (r["label"] == "unsure" or r["was_cancelled"] or r["status"] != "active")
    )
    return AssetCheckResult(
        passed=bad == 0, metadata={"violations": bad, "unsure": sum(1 for r in rows if r["label"] == "unsure")}
    )


@asset_check(
    asset="human_labels",
    description="labels come from queued items (lineage to annotation_queue)",
)
def human_labels_traced_to_queue(warehouse: WarehouseResource) -> AssetCheckResult:
    wh = warehouse.get()
    queue = {
        (r["ls_server"], r["ls_project_id"], r["ls_task_id"])
        for r in _read_all(wh, "annotation_queue", ANNOTATION_QUEUE).to_pylist()
    }
    rows = _human_rows(wh)
    untraced = sum(1 for r in rows if (r["ls_server"], r["ls_project_id"], r["ls_task_id"]) not in queue)
    return AssetCheckResult(
        passed=untraced == 0, severity=AssetCheckSeverity.WARN, metadata={"labels": len(rows), "not_in_queue": untraced}
    )


@asset_check(asset="annotation_queue", description="no item queued twice for the same interface version")
def annotation_queue_no_duplicates(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = _read_all(warehouse.get(), "annotation_queue", ANNOTATION_QUEUE).to_pylist()
    counts = Counter((r["ls_server"], r["interface_version"], r["item_key"]) for r in rows)
    duplicates = sum(1 for n in counts.values() if n > 1)
    return AssetCheckResult(passed=duplicates == 0, metadata={"queued": len(rows), "duplicated_items": duplicates})


@asset_check(
    asset="human_labels",
    description="no Label Studio key or password in the warehouse (Parquet, catalog, lineage, plots)",
)
def annotation_tables_free_of_secrets(
    warehouse: WarehouseResource, label_studio: LabelStudioResource
) -> AssetCheckResult:
    from annotation.labelstudio.audit import file_text, files_containing
    from annotation.labelstudio.secrets import read_local_secrets

    wh = warehouse.get()
    secrets = [s for s in (os.environ.get(label_studio.api_key_env), os.environ.get(API_KEY_ENV)) if s]
    local = read_local_secrets(label_studio.data_dir())
    if local is not None:
        secrets += [s for s in (local.api_key, local.password) if s]
    found = [
        f"data/{table}/{path}" for table in ANNOTATION_TABLES for path in files_containing(wh.data_dir / table, secrets)
    ]
    found += [f"plots/{path}" for path in files_containing(wh.home / "plots", secrets)]
    if wh.db_path.exists() and any(s.encode() in file_text(wh.db_path) for s in secrets):
        found.append(wh.db_path.name)
    return AssetCheckResult(
        passed=not found, metadata={"secrets_checked": len(secrets), "files_with_a_secret": MetadataValue.json(found)}
    )


ANNOTATION_ASSETS = [
    annotation_candidates,
    annotation_queue,
    human_labels,
    human_step_labels,
    annotation_agreement,
    label_source_comparison,
]
ANNOTATION_CHECKS = [
    human_labels_unique_annotations,
    human_labels_unsure_excluded,
    human_labels_traced_to_queue,
    annotation_queue_no_duplicates,
    annotation_tables_free_of_secrets,
]
ANNOTATION_SENSORS = [label_studio_sync]
