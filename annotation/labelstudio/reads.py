"""Reading the warehouse for the human-label stage: the edge of :mod:`annotation.labelstudio.human_labels`.

Every function takes the :class:`~warehouse.catalog.Warehouse` and returns plain rows, Arrow
tables or the pure modules' objects (StepCandidate, StepView); a table a query needs that does
not exist yet reads as empty.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from annotation.labelstudio.interfaces import Interface
from annotation.labelstudio.queue import (
    action_histories,
    milestone_sets_from_rows,
    milestone_sets_from_specs,
    step_views,
)
from annotation.labelstudio.render import StepView
from annotation.labelstudio.selection import STEP_JUDGE_KINDS, StepCandidate, step_candidates
from annotation.progress.label_io import default_specs_dir
from warehouse.catalog import LineageInput, Warehouse
from warehouse.purposes import purpose_filter
from warehouse.tables_annotation import ANNOTATION_QUEUE, HUMAN_LABELS


def _query(warehouse: Warehouse, sql: str, params: list | None = None) -> pa.Table | None:
    """A query, or None when a table it reads does not exist (yet)."""
    try:
        return warehouse.query(sql, params)
    except (duckdb.CatalogException, duckdb.BinderException):
        return None


def _current_versions(warehouse: Warehouse, table_name: str) -> list[tuple[str, str, str]]:
    """(dataset, materialization_id, absolute path) of every current version of a table."""
    return [(dataset, mid, str(path)) for dataset, mid, path in warehouse.current_versions(table_name)]


def table_inputs(warehouse: Warehouse, tables: Iterable[str]) -> list[LineageInput]:
    """Lineage inputs for every current version of these tables."""
    return [
        LineageInput(kind="asset", input_asset=name, input_materialization_id=mid, path=path, version=dataset)
        for name in tables
        for dataset, mid, path in _current_versions(warehouse, name)
    ]


def read_all_versions(warehouse: Warehouse, table_name: str, schema: pa.Schema) -> pa.Table:
    """Every current version (dataset) of a table, concatenated."""
    versions = _current_versions(warehouse, table_name)
    if not versions:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(path).cast(schema) for _, _, path in versions])


def read_queue(warehouse: Warehouse) -> list[dict]:
    """``annotation_queue``: every item pushed, on every server."""
    return read_all_versions(warehouse, "annotation_queue", ANNOTATION_QUEUE).to_pylist()


def read_human_labels(warehouse: Warehouse) -> list[dict]:
    """``human_labels``: every annotation seen, of every project."""
    return read_all_versions(warehouse, "human_labels", HUMAN_LABELS).to_pylist()


def current_rows(warehouse: Warehouse, table_name: str, dataset: str) -> list[dict]:
    """The rows of the current version of one dataset of a table (none when there is none)."""
    current = warehouse.current_version(table_name, dataset)
    return pq.read_table(current[1]).to_pylist() if current else []


def read_prediction_model(warehouse: Warehouse, model: str | None = None) -> str | None:
    """The ``rm_predictions`` model to use: ``model``, else the one trained last (``models.created_at``;
    the greatest id among models without a record)."""
    if model is not None:
        return model
    table = _query(
        warehouse,
        "SELECT p.model_id FROM (SELECT DISTINCT model_id FROM rm_predictions) p LEFT JOIN models m USING (model_id) "
        "GROUP BY 1 ORDER BY max(m.created_at) DESC NULLS LAST, 1 DESC LIMIT 1",
    )
    return table.column(0)[0].as_py() if table is not None and table.num_rows else None


def read_step_candidates(
    warehouse: Warehouse, *, model: str | None = None, episode_source: str | None = None
) -> list[StepCandidate]:
    """Every step with its LCS and environment labels and the model's prediction (see ``step_candidates``).

    Steps of evaluation episodes are never candidates: a human label becomes PRM training data."""
    source, params = (" AND e.source = ?", [episode_source]) if episode_source else ("", [])
    steps = _query(
        warehouse,
        "SELECT s.episode_id, s.step_idx, e.task_id, e.success, e.source "
        f"FROM steps s JOIN episodes e USING (episode_id) WHERE {purpose_filter()}{source}",
        params,
    )
    if steps is None or not steps.num_rows:
        return []
    labels = _query(
        warehouse,
        "SELECT l.episode_id, l.step_idx, l.source, l.method, l.progress, l.is_key_step, l.label_version "
        f"FROM progress_labels l JOIN episodes e USING (episode_id) WHERE l.source IN ('lcs', 'env'){source}",
        params,
    )
    model_id = read_prediction_model(warehouse, model)
    predictions = (
        _query(
            warehouse,
            "SELECT episode_id, step_idx, kind, score FROM rm_predictions WHERE model_id = ?",
            [model_id],
        )
        if model_id is not None
        else None
    )
    return step_candidates(
        steps.to_pylist(),
        labels.to_pylist() if labels is not None else [],
        predictions.to_pylist() if predictions is not None else [],
        model_id,
    )


def read_step_judgements(warehouse: Warehouse, candidates: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """A step judge's probability of a correct step for the candidates whose model is one (the
    ``annotation_candidates`` table has no column for it)."""
    models = sorted({c["model_id"] for c in candidates if c.get("model_id") and c.get("model_progress") is None})
    if not models:
        return {}
    table = _query(
        warehouse,
        "SELECT episode_id, step_idx, avg(score) AS p FROM rm_predictions "
        "WHERE list_contains(?, model_id) AND list_contains(?, kind) GROUP BY 1, 2",
        [models, sorted(STEP_JUDGE_KINDS)],
    )
    return {(r["episode_id"], int(r["step_idx"])): r["p"] for r in table.to_pylist()} if table is not None else {}


def read_step_views(
    warehouse: Warehouse, keys: set[tuple[str, int]], local_root: Path | None
) -> dict[tuple[str, int], StepView]:
    """StepViews (screen, action, history) of the given steps."""
    if not keys:
        return {}
    actions = _query(
        warehouse,
        "SELECT episode_id, step_idx, action_text FROM steps WHERE episode_id IN (SELECT unnest(?::VARCHAR[])) "
        "ORDER BY episode_id, step_idx",
        [sorted({e for e, _ in keys})],
    )
    histories = action_histories(actions.to_pylist() if actions is not None else [], keys)
    wanted = pa.table({"episode_id": [k[0] for k in keys], "step_idx": pa.array([k[1] for k in keys], pa.int32())})
    with warehouse.connect(read_only=True) as con:
        con.register("wanted", wanted)
        table = con.sql(
            "SELECT s.episode_id, s.step_idx, s.action_type, s.action_text, s.target_ref, s.input_text, "
            "s.scroll_direction, s.screen, s.screenshot_path, e.task_id, e.instruction "
            "FROM steps s JOIN episodes e USING (episode_id) "
            "JOIN wanted w ON w.episode_id = s.episode_id AND w.step_idx = s.step_idx"
        ).to_arrow_table()
    return step_views(table, histories, home=warehouse.home, local_root=local_root)


def read_episode_actions(warehouse: Warehouse, episode_ids: Sequence[str], *, with_index: bool = False) -> dict:
    """Each episode's action texts in order (with ``with_index``: (step_idx, action_text) pairs)."""
    if not episode_ids:
        return {}
    table = _query(
        warehouse,
        "SELECT episode_id, step_idx, action_text FROM steps WHERE episode_id IN (SELECT unnest(?::VARCHAR[])) "
        "ORDER BY episode_id, step_idx",
        [sorted(set(episode_ids))],
    )
    out: dict[str, list] = defaultdict(list)
    for row in table.to_pylist() if table is not None else []:
        out[row["episode_id"]].append((int(row["step_idx"]), row["action_text"]) if with_index else row["action_text"])
    return dict(out)


def read_task_episodes(warehouse: Warehouse, tasks: Sequence[str]) -> dict[str, list[dict]]:
    """The episodes of these tasks (id, task, outcome, instruction, length), per task; evaluation
    episodes excluded (what annotators label becomes training data)."""
    table = _query(
        warehouse,
        "SELECT episode_id, task_id, success, instruction, n_steps FROM episodes e "
        f"WHERE task_id IN (SELECT unnest(?::VARCHAR[])) AND {purpose_filter()} ORDER BY episode_id",
        [list(tasks)],
    )
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in table.to_pylist() if table is not None else []:
        by_task[row["task_id"]].append(row)
    return by_task


def read_milestone_sets(warehouse: Warehouse, specs_dir: str | None = None) -> list[dict]:
    """Milestone sets to review: a ``milestones`` table's when one exists, else the task specs' milestones.

    No stage writes a ``milestones`` table yet; one brought by hand may name the text
    ``milestone``/``text``/``description``/``name``, the order ``milestone_idx``/``idx``/``position``/
    ``order_idx`` and the set ``milestone_set_id``/``set_id``/``version``/``label_version``.
    """
    probe = _query(warehouse, "SELECT * FROM milestones LIMIT 0")
    cols = probe.column_names if probe is not None else []
    if "task_id" in cols:
        text = next((c for c in ("milestone", "text", "description", "name") if c in cols), None)
        order = next((c for c in ("milestone_idx", "idx", "position", "order_idx") if c in cols), None)
        set_col = next((c for c in ("milestone_set_id", "set_id", "version", "label_version") if c in cols), None)
        if text:
            table = _query(
                warehouse,
                f"SELECT task_id, {set_col or 'NULL'}::VARCHAR AS set_id, {text}::VARCHAR AS text, "
                f"{order or 'NULL'} AS ord FROM milestones",
            )
            return milestone_sets_from_rows(table.to_pylist() if table is not None else [])
    # the labels stage's folder, so $STEPWISE_TASK_SPECS reaches the annotation reports too
    return milestone_sets_from_specs(Path(specs_dir or default_specs_dir()))


def queue_version(warehouse: Warehouse, server_key: str, interface: Interface) -> tuple[str, str] | None:
    """(materialization_id, path) of the queue of one interface version on one server."""
    return warehouse.current_version("annotation_queue", f"{server_key}-{interface.version_key}")
