"""Fuzz (d): malformed Label Studio exports and sync cursors are errors listed, never crashes.

``annotation_rows`` over generated exports (a valid export mutated, and arbitrary JSON): rows
that fit the ``human_labels`` table, each malformed item in the error list, no readable annotation
lost; ``merge_labels`` applies them idempotently; ``SyncState.from_json`` reads any cursor text.
A sync with a malformed export applies what it can, lists the rest, and retracts nothing.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from annotation.labelstudio.client import ExportSnapshot, ProjectCounts
from annotation.labelstudio.interfaces import INTERFACES
from annotation.labelstudio.sync import ProjectSyncer, annotation_rows, merge_labels, parse_timestamp
from annotation.labelstudio.sync_state import ProjectSyncState, SyncState
from tests.annotation.labelstudio.test_sync_merge import annotation, export
from tests.envs.fuzzing import fuzz_settings
from warehouse.catalog import Warehouse
from warehouse.tables_annotation import HUMAN_LABELS

NOW = datetime(2026, 1, 3, tzinfo=UTC)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "", "12", "1e400", "2026-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00", "nan"]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_FIELDS = ["id", "data", "annotations", "result", "value", "choices", "number", "text", "from_name", "origin"]
_FIELDS += ["lead_time", "completed_by", "was_cancelled", "created_at", "updated_at", "step_idx", "episode_id"]


def _valid_export(interface: str) -> list[dict]:
    tasks = export(annotation(1), annotation(2, "negative", rationale="why"), task_id=7)
    tasks += export(annotation(3, "unsure", user=4), task_id=8, step_idx=5)
    if interface == "step_progress":
        for task in tasks:
            for a in task["annotations"]:
                a["result"] = [{"from_name": "progress", "type": "number", "value": {"number": 40}}]
    return tasks


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


@st.composite
def _exports(draw, interface: str) -> Any:
    if draw(st.integers(0, 4)) == 0:
        return draw(_JSON)
    tasks = copy.deepcopy(_valid_export(interface))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(tasks)))
        if not path:
            continue
        parent: Any = tasks
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(_JSON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(_FIELDS))] = draw(_JSON)
        else:
            parent.append(draw(_JSON))
    return tasks


def _rows(tasks: Any, interface: str, errors: list[str]) -> list[dict]:
    return annotation_rows(
        tasks,
        interface=INTERFACES[interface],
        project_id=5,
        server_key="local",
        salt="salt",
        task_url=lambda p, t: f"http://127.0.0.1:9/projects/{p}/data?task={t}",
        errors=errors,
    )


def _readable_ids(tasks: Any) -> set[int]:
    """Annotation ids an export states plainly (integer ids of objects in a list of tasks with integer ids)."""
    found: set[int] = set()
    for task in tasks if isinstance(tasks, list) else []:
        if (
            not isinstance(task, dict)
            or type(task.get("id")) is not int
            or not isinstance(task.get("annotations"), list)
        ):
            continue
        for a in task["annotations"]:
            if isinstance(a, dict) and type(a.get("id")) is int and abs(a["id"]) < 2**62:
                found.add(a["id"])
    return found


@pytest.mark.fuzz
@fuzz_settings(300)
@given(data=st.data(), interface=st.sampled_from(sorted(INTERFACES)))
def test_fuzz_exports_become_rows_or_listed_errors(data, interface):
    tasks = data.draw(_exports(interface), label="export")
    errors: list[str] = []
    rows = _rows(tasks, interface, errors)  # never raises
    assert all(isinstance(e, str) and e for e in errors)
    pa.Table.from_pylist(rows, schema=HUMAN_LABELS)  # every row fits the table
    # nothing readable is lost: each plainly stated annotation has its row (or an error says why)
    assert _readable_ids(tasks) <= {r["annotation_id"] for r in rows} or errors
    previous, _ = merge_labels([], _rows(_valid_export(interface), interface, []), NOW)
    merged, diff = merge_labels(previous, rows, NOW, retract_missing=not errors)
    pa.Table.from_pylist(merged, schema=HUMAN_LABELS)
    again, diff_again = merge_labels(merged, rows, NOW, retract_missing=not errors)
    assert not diff_again.changed and again == merged
    if errors:  # a malformed export retracts nothing
        assert diff.retracted == 0


@pytest.mark.fuzz
@fuzz_settings(300)
@given(text=st.text(max_size=80) | _JSON.map(json.dumps) | st.builds(lambda v: json.dumps({"projects": v}), _JSON))
def test_fuzz_any_cursor_reads_as_a_state(text):
    state = SyncState.from_json(text)
    again = SyncState.from_json(state.to_json())
    assert again == state
    assert isinstance(state.consecutive_failures, int)
    stamp = parse_timestamp(text)
    assert stamp is None or stamp.tzinfo is not None


def test_a_malformed_export_is_reported_not_raised():
    tasks: list[Any] = _valid_export("step_correctness")
    tasks[0]["annotations"][0]["lead_time"] = "slow"
    tasks[0]["annotations"][1]["result"] = "positive"  # not a list of regions
    tasks[1]["data"]["step_idx"] = 1e400
    tasks += ["not a task", {"id": None, "annotations": [annotation(9)]}, {"id": 12, "annotations": "x"}]
    errors: list[str] = []
    rows = _rows(tasks, "step_correctness", errors)
    assert sorted(r["annotation_id"] for r in rows) == [1, 2, 3]
    by_id = {r["annotation_id"]: r for r in rows}
    assert by_id[1]["lead_time_s"] is None and by_id[1]["label"] == "positive"
    assert by_id[2]["label"] is None and not by_id[2]["usable_for_training"]
    assert by_id[3]["step_idx"] is None
    assert len(errors) == 4 and any("tasks[3]" in e for e in errors) and any("task 12" in e for e in errors)


class _FakeClient:
    """What ProjectSyncer.sync asks of Label Studio, answering with a given export."""

    server_key = "local"

    def __init__(self, tasks: Any) -> None:
        self.tasks = tasks

    def project_counts(self, project_id: int) -> ProjectCounts:
        return ProjectCounts(2, 3, 0, 0, str(id(self.tasks)))

    def create_export(self, project_id: int, title: str, *, timeout_s: float | None = None) -> ExportSnapshot:
        return ExportSnapshot(1, title, "completed", "md5", 2)

    def download_export(self, project_id: int, export_id: int) -> Any:
        return self.tasks

    def delete_export(self, project_id: int, export_id: int) -> None:
        pass

    def task_url(self, project_id: int, task_id: int) -> str:
        return f"http://127.0.0.1:9/projects/{project_id}/data?task={task_id}"


def test_a_sync_with_a_malformed_export_applies_the_rest_and_retracts_nothing(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    interface = INTERFACES["step_correctness"]
    syncer = ProjectSyncer(_FakeClient(_valid_export("step_correctness")), warehouse, salt="salt")  # type: ignore[arg-type]
    first = syncer.sync(interface, 5, ProjectSyncState(), now=1000.0)
    assert first.status == "applied" and first.active == 3 and not first.errors

    broken = _valid_export("step_correctness")
    broken[1] = {"id": "not a number", "annotations": broken[1]["annotations"]}  # annotation 3 unreadable
    broken[0]["annotations"][0]["lead_time"] = {"nested": True}
    syncer.client = _FakeClient(broken)  # type: ignore[assignment]
    second = syncer.sync(interface, 5, ProjectSyncState(), now=2000.0)
    assert second.errors and second.diff.retracted == 0 and second.active == 3
    rows = warehouse.query("SELECT annotation_id, status FROM human_labels ORDER BY 1").to_pylist()
    assert [(r["annotation_id"], r["status"]) for r in rows] == [(1, "active"), (2, "active"), (3, "active")]
