"""Ingesting annotations: Label Studio snapshot exports -> the ``human_labels`` table, nothing lost.

One sync of one project:

1. **Change check** (two small requests): task and annotation counts, and the latest task update
   (editing an annotation touches its task). Unchanged since the last applied sync: stop here.
   A full sync still runs every ``full_resync_every_s`` as a safety net.
2. **Snapshot export** of every task with an annotation, skipped and ground-truth ones included.
   The export's title is recorded *before* asking for it, so a sync interrupted while Label
   Studio builds a slow export finds that export again on its next attempt instead of losing it.
3. **Diff by annotation id** against the current ``human_labels`` rows of the project:
   new ids are added, changed ones replaced (``revision`` + 1), ids no longer exported are
   retracted (``status = 'retracted'``, kept for audit, not for training). Applying the same
   snapshot twice changes nothing, so a retried sync never counts an annotation twice.
4. **Publish** the project's new table version atomically, with lineage to the Label Studio server
   (``local`` or host:port, never a key), project, export and the queue it came from.

A failure anywhere before the publish leaves the previous version current; the caller keeps the
returned state (pending export, fingerprints) and retries later: the Dagster sensor backs off
exponentially (:func:`annotation.labelstudio.sync_state.backoff_seconds`).

Pure parts (:func:`annotation_rows`, :func:`merge_labels`; the backoff in ``sync_state``) are separate
from the I/O (:class:`ProjectSyncer`).

An export is outside data: a malformed task or annotation (not an object, no usable id, a result
that cannot be read, a value of the wrong type) is listed in the sync's errors and the rest is
applied. An annotation whose id is readable keeps its row (its answer empty, not usable for
training when the answer cannot be read); while an export has such errors, annotations missing
from it are not retracted (they may be the unreadable ones).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from annotation.labelstudio.client import (
    ExportSnapshot,
    LabelStudioClient,
    LabelStudioError,
    LabelStudioTimeout,
    LabelStudioUnavailable,
    ProjectCounts,
)
from annotation.labelstudio.interfaces import INTERFACES, Interface, ParsedAnswer, parse_result
from annotation.labelstudio.sync_state import INT64, ProjectSyncState
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.tables_annotation import HUMAN_LABELS

SYNC_CODE_VERSION = "human-labels-sync-1"
EXPORT_TITLE_PREFIX = "stepwise-sync-"
FULL_RESYNC_EVERY_S = 1800.0
EXPORT_TIMEOUT_S = 900.0  # an export not done by then (e.g. lost in a server restart) is asked for again
NOT_FOUND_GRACE_S = 120.0

Stage = Callable[[str, dict[str, Any]], None]


# -- pure parts ----------------------------------------------------------------------------------


def pseudonymous_annotator_id(user_id: object, salt: str, server_key: str) -> str | None:
    """``ann-`` + 12 hex of HMAC-SHA256(salt, server|user): stable per person, meaningless without the salt."""
    if user_id is None:
        return None
    if isinstance(user_id, dict):
        user_id = user_id.get("id") or user_id.get("email")
    # backslashreplace: the same bytes as before for any valid text; a lone surrogate cannot crash it
    message = f"{server_key}|{user_id}".encode("utf-8", "backslashreplace")
    digest = hmac.new(salt.encode("utf-8", "backslashreplace"), message, hashlib.sha256).hexdigest()
    return f"ann-{digest[:12]}"


def parse_timestamp(text: str | None) -> datetime | None:
    """An ISO timestamp of an export (``...Z`` allowed) in UTC; None when absent or unreadable."""
    if not text or not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: a date at the edge of the calendar
        return None


def _content_hash(annotation: dict) -> str:
    relevant = {
        k: annotation.get(k)
        for k in ("result", "was_cancelled", "ground_truth", "updated_at", "lead_time", "completed_by")
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


INT32 = 2**31


def _int_or_none(value: object, limit: int = INT64) -> int | None:
    """A whole number in (-limit, limit) from a JSON number or text; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | str) or value == "":
        return None  # JSON gives numbers or text; anything else (None included) is no id
    try:
        number = int(value)
    except (ValueError, OverflowError):  # OverflowError: inf
        return None
    return number if -limit < number < limit else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _text_or_none(value: object) -> str | None:
    """A text field of an export as stored: text (a lone surrogate escaped), a number as text, else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class _Unreadable(Exception):
    """One task or annotation of an export that cannot become a row."""


def annotation_rows(
    tasks: Sequence[dict],
    *,
    interface: Interface,
    project_id: int,
    server_key: str,
    salt: str,
    task_url: Callable[[int, int], str],
    errors: list[str] | None = None,
) -> list[dict]:
    """One ``human_labels`` row per annotation in a Label Studio JSON export (status active).

    Malformed items are described in ``errors`` (when given) and left out, or, for an annotation
    whose id is readable, kept with an empty answer (see the module docstring); never an exception."""
    problems: list[str] = [] if errors is None else errors
    rows: list[dict] = []
    if not isinstance(tasks, list | tuple):
        problems.append(f"the export is not a list of tasks ({type(tasks).__name__})")
        return rows
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            problems.append(f"tasks[{i}] is not an object")
            continue
        task_id = _int_or_none(task.get("id"))
        if task_id is None:
            problems.append(f"tasks[{i}] has no usable id: {_brief(task.get('id'))}")
            continue
        data = task.get("data")
        if data is None:
            data = {}
        elif not isinstance(data, dict):
            problems.append(f"task {task_id}: 'data' is not an object")
            data = {}
        annotations = task.get("annotations") or []
        if not isinstance(annotations, list):
            problems.append(f"task {task_id}: 'annotations' is not a list")
            continue
        for j, annotation in enumerate(annotations):
            where = f"task {task_id}, annotations[{j}]"
            try:
                rows.append(
                    _annotation_row(
                        annotation, data, where, problems, interface, project_id, task_id, server_key, salt, task_url
                    )
                )
            except _Unreadable as exc:
                problems.append(f"{where}: {exc}")
    return rows


def _brief(value: object) -> str:
    return repr(value)[:80]


def _annotation_row(
    annotation: object,
    data: dict,
    where: str,
    problems: list[str],
    interface: Interface,
    project_id: int,
    task_id: int,
    server_key: str,
    salt: str,
    task_url: Callable[[int, int], str],
) -> dict:
    if not isinstance(annotation, dict):
        raise _Unreadable("not an object")
    annotation_id = _int_or_none(annotation.get("id"))
    if annotation_id is None:
        raise _Unreadable(f"no usable id: {_brief(annotation.get('id'))}")
    try:
        content_hash = _content_hash(annotation)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _Unreadable(f"annotation {annotation_id} cannot be read: {type(exc).__name__}") from None
    result = annotation.get("result")
    regions = [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []
    try:
        answer = parse_result(interface.name, regions)
        if answer.value is not None and not math.isfinite(answer.value):
            raise ValueError(f"value {answer.value!r} is not a finite number")
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        problems.append(f"{where} (annotation {annotation_id}): unreadable result ({type(exc).__name__}: {exc})")
        answer = ParsedAnswer()
    if result is not None and (not isinstance(result, list) or len(regions) != len(result)):
        problems.append(f"{where} (annotation {annotation_id}): 'result' holds items that are not regions")
    cancelled = bool(annotation.get("was_cancelled"))
    origins = {str(r.get("origin", "")) for r in regions}
    return {
        "ls_server": server_key,
        "annotation_id": annotation_id,
        "ls_project_id": project_id,
        "ls_task_id": task_id,
        "ls_task_url": _text_or_none(task_url(project_id, task_id)),
        "interface": interface.name,
        "interface_version": _text_or_none(data.get("interface_version")) or interface.version_key,
        "item_key": _text_or_none(data.get("item_key")),
        "episode_id": _text_or_none(data.get("episode_id")),
        "step_idx": _int_or_none(data.get("step_idx"), INT32),
        "task_id": _text_or_none(data.get("task_id")),
        "milestone_set_id": _text_or_none(data.get("milestone_set_id")),
        "milestone_idx": _int_or_none(data.get("milestone_idx"), INT32),
        "label": _text_or_none(answer.label),
        "value": answer.value,
        "quality_factuality": _text_or_none(answer.factuality),
        "quality_order": _text_or_none(answer.order),
        "quality_granularity": _text_or_none(answer.granularity),
        "rationale": _text_or_none(answer.rationale),
        "status": "active",
        "was_cancelled": cancelled,
        "ground_truth": bool(annotation.get("ground_truth")),
        "usable_for_training": (not cancelled) and answer.has_answer and answer.label != "unsure",
        "annotator_id": pseudonymous_annotator_id(annotation.get("completed_by"), salt, server_key),
        "lead_time_s": _float_or_none(annotation.get("lead_time")),
        "from_prediction": bool(annotation.get("parent_prediction"))
        or any(o.startswith("prediction") for o in origins),
        "created_at": parse_timestamp(annotation.get("created_at")),
        "updated_at": parse_timestamp(annotation.get("updated_at")),
        "content_hash": content_hash,
    }


@dataclass(frozen=True)
class LabelDiff:
    created: int = 0
    updated: int = 0
    retracted: int = 0
    restored: int = 0
    unchanged: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.retracted or self.restored)


def merge_labels(
    previous: Sequence[dict], current: Sequence[dict], now: datetime, *, retract_missing: bool = True
) -> tuple[list[dict], LabelDiff]:
    """Apply a full snapshot (``current``) to the project's rows (``previous``), keyed by annotation id.

    New ids are added (revision 1); changed ones replaced (revision + 1, first sync time kept);
    ids missing from the snapshot retracted (kept, ``status = 'retracted'``) unless
    ``retract_missing`` is False (a snapshot with unreadable items: they keep their rows); a
    retracted id that reappears is restored. Idempotent: merging the same snapshot again changes nothing.
    """
    before = {int(r["annotation_id"]): r for r in previous}
    seen: set[int] = set()
    merged: list[dict] = []
    created = updated = retracted = restored = unchanged = 0
    for row in current:
        annotation_id = int(row["annotation_id"])
        if annotation_id in seen:
            continue  # an export never repeats an annotation; be safe anyway
        seen.add(annotation_id)
        old = before.get(annotation_id)
        if old is None:
            merged.append({**row, "first_synced_at": now, "last_synced_at": now, "retracted_at": None, "revision": 1})
            created += 1
        elif old.get("status") == "retracted":
            merged.append(
                {
                    **row,
                    "first_synced_at": old.get("first_synced_at") or now,
                    "last_synced_at": now,
                    "retracted_at": None,
                    "revision": int(old.get("revision") or 1) + 1,
                }
            )
            restored += 1
        elif old.get("content_hash") != row.get("content_hash"):
            merged.append(
                {
                    **row,
                    "first_synced_at": old.get("first_synced_at") or now,
                    "last_synced_at": now,
                    "retracted_at": None,
                    "revision": int(old.get("revision") or 1) + 1,
                }
            )
            updated += 1
        else:
            merged.append(dict(old))
            unchanged += 1
    for annotation_id, old in before.items():
        if annotation_id in seen:
            continue
        if old.get("status") == "retracted" or not retract_missing:
            merged.append(dict(old))
            unchanged += 1
        else:
            merged.append(
                {**old, "status": "retracted", "retracted_at": now, "last_synced_at": now, "usable_for_training": False}
            )
            retracted += 1
    merged.sort(key=lambda r: int(r["annotation_id"]))
    return merged, LabelDiff(created, updated, retracted, restored, unchanged)


def human_labels_dataset(server_key: str, project_id: int) -> str:
    """The warehouse dataset holding one Label Studio project's labels."""
    return f"labelstudio-{server_key}-project-{project_id}"


@dataclass
class ProjectSyncResult:
    interface: str
    project_id: int
    status: str  # unchanged | waiting_for_export | applied | no_changes
    diff: LabelDiff = field(default_factory=LabelDiff)
    active: int = 0
    total: int = 0
    usable: int = 0
    export_id: int | None = None
    materialization_id: str | None = None
    output_path: str | None = None
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # malformed items of the export, left out or kept empty


# -- I/O -------------------------------------------------------------------------------------------


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


class ProjectSyncer:
    """Runs syncs of Label Studio projects into the warehouse (see the module docstring)."""

    def __init__(
        self,
        client: LabelStudioClient,
        warehouse: Warehouse,
        *,
        salt: str,
        run_id: str | None = None,
        blocking: bool = False,
        export_request_timeout_s: float = 45.0,
        export_wait_s: float = 600.0,
        full_resync_every_s: float = FULL_RESYNC_EVERY_S,
        on_stage: Stage | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.warehouse = warehouse
        self.salt = salt
        self.run_id = run_id
        self.blocking = blocking
        self.export_request_timeout_s = export_request_timeout_s
        self.export_wait_s = export_wait_s
        self.full_resync_every_s = full_resync_every_s
        self.on_stage = on_stage or (lambda stage, info: None)
        self.log = log or (lambda message: None)

    # -- helpers ---------------------------------------------------------------------------------
    def _previous_rows(self, dataset: str) -> tuple[list[dict], str | None]:
        current = self.warehouse.current_version("human_labels", dataset)
        if current is None:
            return [], None
        return pq.read_table(current[1]).to_pylist(), current[0]

    def _last_publish_at(self, dataset: str) -> float | None:
        if not self.warehouse.db_path.exists():
            return None
        with self.warehouse.connect(read_only=True) as con:
            try:
                row = con.execute(
                    "SELECT max(created_at) FROM table_versions WHERE table_name = 'human_labels' AND dataset = ?",
                    [dataset],
                ).fetchone()
            except Exception:  # noqa: BLE001 - a catalog without the table yet
                return None
        return row[0].timestamp() if row and row[0] is not None else None

    def _request_export(self, project_id: int, state: ProjectSyncState, fingerprint: str, now: float):
        state.pending_export_title = f"{EXPORT_TITLE_PREFIX}{uuid.uuid4().hex[:12]}"
        state.pending_export_id = None
        state.pending_fingerprint = fingerprint
        state.export_requested_at = now
        self.on_stage("export_requested", {"project_id": project_id, "title": state.pending_export_title})
        export = self.client.create_export(
            project_id, state.pending_export_title, timeout_s=self.export_request_timeout_s
        )
        state.pending_export_id = export.export_id
        return export

    def _pending_export(self, project_id: int, state: ProjectSyncState, now: float):
        """The export asked for earlier, if it can still be used (None: ask for a new one)."""
        age = now - (state.export_requested_at or now)
        if state.pending_export_id is None and state.pending_export_title:
            found = self.client.find_export(project_id, state.pending_export_title)
            if found is None:
                if age > NOT_FOUND_GRACE_S:
                    state.clear_pending()
                return found
            state.pending_export_id = found.export_id
            return found
        if state.pending_export_id is None:
            return None
        try:
            export = self.client.get_export(project_id, state.pending_export_id)
        except LabelStudioUnavailable:
            raise
        except Exception:  # noqa: BLE001 - deleted or unreadable: ask again
            state.clear_pending()
            return None
        if export.status == "failed" or (export.status != "completed" and age > EXPORT_TIMEOUT_S):
            self.client.delete_export(project_id, export.export_id)
            state.clear_pending()
            return None
        return export

    # -- one project -------------------------------------------------------------------------------
    def sync(
        self,
        interface: Interface,
        project_id: int,
        state: ProjectSyncState,
        *,
        now: float | None = None,
        queue_version: tuple[str, str] | None = None,
    ) -> ProjectSyncResult:
        """Sync one project; mutates ``state`` (keep it even when this raises, to resume)."""
        started = time.perf_counter()
        now = time.time() if now is None else now
        server_key = self.client.server_key
        dataset = human_labels_dataset(server_key, project_id)
        result = ProjectSyncResult(interface.name, project_id, "unchanged")
        state.last_checked_at = now

        # 1. change check
        counts = self.client.project_counts(project_id)
        fingerprint = counts.fingerprint()
        self.on_stage("counted", {"project_id": project_id, "fingerprint": fingerprint})
        if self._up_to_date(dataset, state, counts, fingerprint, now):
            result.seconds = time.perf_counter() - started
            return result

        # 2. snapshot export
        export = self._ready_export(project_id, state, dataset, fingerprint, now, result)
        if export is None:
            result.seconds = time.perf_counter() - started
            return result
        result.export_id = export.export_id
        self.on_stage("export_ready", {"project_id": project_id, "export_id": export.export_id})

        # 3. diff by annotation id
        rows, errors = self._snapshot_rows(interface, project_id, export, state)
        result.errors = errors
        previous, previous_materialization = self._previous_rows(dataset)
        self._refuse_emptied_snapshot(project_id, export, state, counts, rows, previous)
        merged, diff = merge_labels(previous, rows, datetime.fromtimestamp(now, UTC), retract_missing=not errors)
        result.diff = diff
        result.total = len(merged)
        result.active = sum(1 for r in merged if r["status"] == "active")
        result.usable = sum(1 for r in merged if r["usable_for_training"])

        # 4. publish
        if diff.changed or previous_materialization is None:
            self._publish(
                interface, project_id, export, merged, errors, previous_materialization, queue_version, result
            )
        else:
            result.status = "no_changes"
        self.on_stage("published", {"project_id": project_id, "status": result.status})
        self._close_applied(project_id, export, state, fingerprint, now)
        result.seconds = time.perf_counter() - started
        self.log(
            f"{interface.name} (project {project_id}): {result.status}; +{diff.created} new, {diff.updated} updated, "
            f"{diff.retracted} retracted; {result.active} active labels ({result.seconds:.1f} s)"
        )
        return result

    # -- the steps of one sync -----------------------------------------------------------------------
    def _up_to_date(
        self, dataset: str, state: ProjectSyncState, counts: ProjectCounts, fingerprint: str, now: float
    ) -> bool:
        """Whether the change check says there is nothing to sync (no pending export, no full resync due)."""
        has_previous = self.warehouse.current_version("human_labels", dataset) is not None
        due_full = state.last_full_sync_at is None or now - state.last_full_sync_at >= self.full_resync_every_s
        nothing_yet = counts.total_annotations + counts.skipped_annotations == 0 and not has_previous
        return state.pending_export_title is None and (
            nothing_yet or (fingerprint == state.fingerprint and has_previous and not due_full)
        )

    def _fresh_pending_export(
        self, project_id: int, state: ProjectSyncState, dataset: str, now: float
    ) -> ExportSnapshot | None:
        """The pending export, unless there is none usable or a newer snapshot was published since it was asked for."""
        export = self._pending_export(project_id, state, now) if state.pending_export_title else None
        if export is not None:
            last_publish = self._last_publish_at(dataset)
            if (
                last_publish is not None
                and state.export_requested_at is not None
                and last_publish > state.export_requested_at
            ):
                # another sync applied a newer snapshot meanwhile: this one is stale
                self.client.delete_export(project_id, export.export_id)
                state.clear_pending()
                export = None
        return export

    def _ready_export(
        self,
        project_id: int,
        state: ProjectSyncState,
        dataset: str,
        fingerprint: str,
        now: float,
        result: ProjectSyncResult,
    ) -> ExportSnapshot | None:
        """A completed export to apply (resumed or asked for), or None with ``result`` marked as waiting for one."""
        export = self._fresh_pending_export(project_id, state, dataset, now)
        if export is None and state.pending_export_title is None:
            try:
                export = self._request_export(project_id, state, fingerprint, now)
            except LabelStudioTimeout:
                if self.blocking:
                    raise
                # a large export outlived the request; Label Studio goes on building it: find it by title next time
                self.log(f"export of project {project_id} is still being built; resuming it on the next attempt")
                result.status = "waiting_for_export"
                return None
        if export is None:
            result.status = "waiting_for_export"
            return None
        if export.status != "completed":
            if not self.blocking:
                result.status = "waiting_for_export"
                result.export_id = export.export_id
                return None
            export = self.client.wait_for_export(project_id, export, timeout_s=self.export_wait_s)
            if export.status != "completed":
                state.clear_pending()
                raise LabelStudioUnavailable(
                    f"Label Studio could not build export {export.export_id} of project {project_id}"
                )
        return export

    def _snapshot_rows(
        self, interface: Interface, project_id: int, export: ExportSnapshot, state: ProjectSyncState
    ) -> tuple[list[dict], list[str]]:
        """Download the export and read it into ``human_labels`` rows, with its malformed items listed."""
        try:
            tasks = self.client.download_export(project_id, export.export_id)
        except LabelStudioUnavailable:
            raise  # transient: keep the export to resume
        except LabelStudioError:
            state.clear_pending()  # the snapshot is gone or unreadable: ask for a new one next time
            raise
        self.on_stage("downloaded", {"project_id": project_id, "export_id": export.export_id, "tasks": len(tasks)})
        errors: list[str] = []
        rows = annotation_rows(
            tasks,
            interface=interface,
            project_id=project_id,
            server_key=self.client.server_key,
            salt=self.salt,
            task_url=self.client.task_url,
            errors=errors,
        )
        if errors:
            self.log(f"export {export.export_id} of project {project_id}: {len(errors)} malformed items: {errors[0]}")
        return rows, errors

    def _refuse_emptied_snapshot(
        self,
        project_id: int,
        export: ExportSnapshot,
        state: ProjectSyncState,
        counts: ProjectCounts,
        rows: list[dict],
        previous: list[dict],
    ) -> None:
        """Raise (dropping the export) when an empty snapshot would retract all labels of a project with annotations."""
        active_before = sum(1 for r in previous if r.get("status") == "active")
        if not rows and active_before and (counts.total_annotations + counts.skipped_annotations) > 0:
            self.client.delete_export(project_id, export.export_id)
            state.clear_pending()
            raise LabelStudioUnavailable(
                f"export {export.export_id} of project {project_id} is empty while the project has annotations; "
                "retrying later"
            )

    def _publish(
        self,
        interface: Interface,
        project_id: int,
        export: ExportSnapshot,
        merged: list[dict],
        errors: list[str],
        previous_materialization: str | None,
        queue_version: tuple[str, str] | None,
        result: ProjectSyncResult,
    ) -> None:
        """Publish the merged rows as the project's new table version, with lineage; ``result`` says where."""
        server_key = self.client.server_key
        diff = result.diff
        materialization = Materialization(
            asset="human_labels",
            run_id=self.run_id,
            code_version=SYNC_CODE_VERSION,
            parameters={
                "ls_server": server_key,
                "ls_project_id": project_id,
                "interface_version": interface.version_key,
                "export_id": export.export_id,
                "export_md5": export.md5,
                "created": diff.created,
                "updated": diff.updated,
                "retracted": diff.retracted,
                "restored": diff.restored,
                "malformed_items": len(errors),
            },
            inputs=[
                LineageInput(
                    kind="file",
                    path=f"labelstudio://{server_key}/projects/{project_id}/exports/{export.export_id}",
                    version=export.md5 or str(export.export_id),
                )
            ],
        )
        if previous_materialization:
            materialization.inputs.append(
                LineageInput(
                    kind="asset", input_asset="human_labels", input_materialization_id=previous_materialization
                )
            )
        if queue_version:
            materialization.inputs.append(
                LineageInput(
                    kind="asset",
                    input_asset="annotation_queue",
                    input_materialization_id=queue_version[0],
                    path=queue_version[1],
                )
            )
        table = pa.Table.from_pylist(merged, schema=HUMAN_LABELS)
        dataset = human_labels_dataset(server_key, project_id)
        output = self.warehouse.stage_table("human_labels", dataset, table, materialization)
        self.warehouse.publish(materialization, [output])
        result.status = "applied"
        result.materialization_id = materialization.materialization_id
        result.output_path = str(output.path)

    def _close_applied(
        self, project_id: int, export: ExportSnapshot, state: ProjectSyncState, fingerprint: str, now: float
    ) -> None:
        """Record the applied snapshot in ``state`` and delete its export from Label Studio."""
        state.fingerprint = state.pending_fingerprint or fingerprint
        state.last_full_sync_at = now
        state.clear_pending()
        self.client.delete_export(project_id, export.export_id)
