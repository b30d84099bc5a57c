"""Pushing items to Label Studio: one project per interface version, bulk import, never twice.

Idempotency. The queue (table ``annotation_queue``) records every item pushed, keyed by
(server, interface version, item key). An item already in the queue is never imported again.
A push that died between Label Studio's import and the queue's publish leaves tasks in Label
Studio that the queue does not know: before each push the project's task count is compared with
the queue's, and on a mismatch the tasks past the highest known task id are read back and
*adopted* (recorded with ``adopted = true``), so they are not imported a second time.

Speed. Tasks go in one bulk import request per chunk (1,000 by default) with their
pre-annotations attached as predictions. Rendering is pipelined with importing: while Label
Studio stores chunk k (a request in a background thread), chunk k + 1 is rendered; an item's
HTML is only rendered if the item is not queued yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from annotation.labelstudio.client import LabelStudioClient, LabelStudioError
from annotation.labelstudio.interfaces import Interface
from annotation.labelstudio.render import (
    StepView,
    action_html,
    history_html,
    milestone_html,
    milestones_html,
    screen_html,
)

DEFAULT_CHUNK_SIZE = 1000


@dataclass(frozen=True)
class QueueItem:
    """One thing to show people: the task data Label Studio stores, an optional pre-annotation, and queue columns.

    ``data`` may be a zero-argument function returning the data, so that rendering happens only
    for items that are actually pushed.
    """

    interface: str
    item_key: str
    data: dict[str, Any] | Callable[[], dict[str, Any]]
    prediction: dict[str, Any] | None = None  # {"model_version", "score", "result"}
    fields: dict[str, Any] = field(default_factory=dict)  # annotation_queue columns (episode_id, reason, ...)

    def task_data(self) -> dict[str, Any]:
        return self.data() if callable(self.data) else self.data


@dataclass(frozen=True)
class ProjectHandle:
    interface: Interface
    project_id: int
    title: str
    created: bool


@dataclass
class PushOutcome:
    interface: str
    project_id: int
    pushed_rows: list[dict] = field(default_factory=list)
    adopted_rows: list[dict] = field(default_factory=list)
    already_queued: int = 0
    seconds: float = 0.0


# -- task payloads ---------------------------------------------------------------------------


def step_task_data(
    view: StepView, *, interface: Interface, item_key: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Task data for the step interfaces: instruction, history, action and screen as HTML, plus identifiers."""
    data = {
        "instruction": view.instruction,
        "history_html": history_html(view.history),
        "action_html": action_html(view),
        "screen_html": screen_html(view.screen, view.target_ref, view.screenshot_url),
        "item_key": item_key,
        "interface_version": interface.version_key,
        "episode_id": view.episode_id,
        "step_idx": view.step_idx,
        "task_id": view.task_id,
    }
    data.update(extra or {})
    return data


def milestone_review_data(
    *,
    instruction: str,
    task_id: str,
    milestone_set_id: str,
    milestones: Sequence[str],
    reference: StepView | None,
    reference_actions: Sequence[str],
    interface: Interface,
    item_key: str,
) -> dict[str, Any]:
    """Task data for ``milestone_review``: the milestone list, a successful episode's actions and first screen."""
    return {
        "instruction": instruction,
        "milestones_html": milestones_html(milestones),
        "reference_html": history_html(reference_actions)
        if reference_actions
        else '<p class="sw-none">(no successful episode yet)</p>',
        "screen_html": screen_html(reference.screen, None, reference.screenshot_url)
        if reference
        else '<p class="sw-none">(no screen)</p>',
        "item_key": item_key,
        "interface_version": interface.version_key,
        "task_id": task_id,
        "milestone_set_id": milestone_set_id,
        "n_milestones": len(milestones),
    }


def match_task_data(
    view: StepView,
    *,
    milestone_set_id: str,
    milestone_idx: int,
    n_milestones: int,
    milestone: str,
    interface: Interface,
    item_key: str,
) -> dict[str, Any]:
    """Task data for ``milestone_match``: a milestone next to one step."""
    data = step_task_data(view, interface=interface, item_key=item_key)
    data.update(
        {
            "milestone_html": milestone_html(milestone_idx, n_milestones, milestone),
            "milestone": milestone,
            "milestone_set_id": milestone_set_id,
            "milestone_idx": milestone_idx,
        }
    )
    return data


# -- projects --------------------------------------------------------------------------------


def ensure_project(
    client: LabelStudioClient,
    interface: Interface,
    namespace: str,
    *,
    overlap_share: float = 0.1,
    annotators_per_overlap_task: int = 2,
    local_files_root: Path | None = None,
) -> ProjectHandle:
    """The project of this interface version (found by title), created if missing, its config kept current.

    ``overlap_share`` of the tasks are shown to ``annotators_per_overlap_task`` people (Label
    Studio's overlap cohort), so agreement (Cohen's kappa) can be measured. With
    ``local_files_root`` (the project's own server) the project gets a local-files storage on that
    folder, which is what lets Label Studio serve screenshots under it to the project's annotators.
    """
    handle = _ensure_project(client, interface, namespace, overlap_share, annotators_per_overlap_task)
    if local_files_root is not None:
        client.ensure_local_files_storage(handle.project_id, local_files_root)
    return handle


def _ensure_project(
    client: LabelStudioClient,
    interface: Interface,
    namespace: str,
    overlap_share: float,
    annotators_per_overlap_task: int,
) -> ProjectHandle:
    title = interface.project_title(namespace)
    maximum = annotators_per_overlap_task if overlap_share > 0 else 1
    percentage = int(round(max(0.0, min(1.0, overlap_share)) * 100)) if overlap_share > 0 else 100
    project_id = client.find_project(title)
    if project_id is None:
        project_id = client.create_project(
            title=title,
            label_config=interface.label_config(),
            description=(
                f"Stepwise {interface.version_key}: {interface.title}. Tasks are pushed and synced by the pipeline."
            ),
            instruction=interface.instruction,
            maximum_annotations=maximum,
            overlap_percentage=percentage,
        )
        return ProjectHandle(interface, project_id, title, created=True)
    project = client.project(project_id)
    if " ".join(str(project.get("label_config", "")).split()) != " ".join(interface.label_config().split()):
        try:
            client.update_project(project_id, label_config=interface.label_config())
        except LabelStudioError as exc:
            raise LabelStudioError(
                f"the labeling config of {title!r} changed in a way Label Studio refuses for existing annotations; "
                f"bump the interface version instead ({exc})"
            ) from None
    return ProjectHandle(interface, project_id, title, created=False)


# -- reconciliation and push -------------------------------------------------------------------


def reconcile_queue(
    client: LabelStudioClient, handle: ProjectHandle, queued_rows: Sequence[dict], *, now: datetime | None = None
) -> list[dict]:
    """Queue rows for tasks Label Studio has but the queue does not (an interrupted push), marked adopted.

    Cheap when consistent: one request for the project's task count.
    """
    known_ids = {int(r["ls_task_id"]) for r in queued_rows if int(r["ls_project_id"]) == handle.project_id}
    counts = client.project(handle.project_id)
    if int(counts.get("task_number") or 0) <= len(known_ids):
        return []
    after = max(known_ids, default=0)
    stamp = now or datetime.now(UTC)
    adopted = []
    for task in client.iter_tasks(handle.project_id, after_task_id=after):
        data = task.get("data") or {}
        key = data.get("item_key")
        if not key or int(task["id"]) in known_ids:
            continue  # a task someone imported by hand: not ours to queue
        fields: dict[str, Any] = {}
        if key.startswith("step:") and data.get("episode_id") is None:
            episode_id, _, step = key[len("step:") :].rpartition(":")
            if step.isdigit():
                fields = {"episode_id": episode_id, "step_idx": int(step)}
        adopted.append(_queue_row(client, handle, key, int(task["id"]), data, fields, None, stamp, adopted=True))
    return adopted


def push_items(
    client: LabelStudioClient,
    handle: ProjectHandle,
    items: Iterable[QueueItem],
    already_queued: set[str],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: Callable[[int, int], None] | None = None,
    expected: int | None = None,
) -> PushOutcome:
    """Import the items not yet queued, in bulk chunks (rendering the next chunk while one imports); the new queue rows.

    Every chunk is recorded only once Label Studio has answered for it, so the rows returned are
    exactly the tasks that exist; an error stops at the failing chunk (earlier chunks were
    imported and will be adopted by the next push's reconciliation).
    """
    started = time.perf_counter()
    outcome = PushOutcome(handle.interface.name, handle.project_id)
    seen: set[str] = set(already_queued)
    done = 0

    def send(chunk: list[tuple[QueueItem, dict]]) -> list[int]:
        payload = [
            {"data": data, **({"predictions": [item.prediction]} if item.prediction else {})} for item, data in chunk
        ]
        return client.import_tasks(handle.project_id, payload)

    def record(chunk: list[tuple[QueueItem, dict]], task_ids: list[int]) -> None:
        nonlocal done
        stamp = datetime.now(UTC)
        for (item, data), task_id in zip(chunk, task_ids, strict=True):
            outcome.pushed_rows.append(
                _queue_row(
                    client, handle, item.item_key, task_id, data, item.fields, item.prediction, stamp, adopted=False
                )
            )
        done += len(chunk)
        if progress:
            progress(done, expected if expected is not None else done)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="labelstudio-import") as pool:
        in_flight: tuple[list, Future] | None = None
        chunk: list[tuple[QueueItem, dict]] = []
        for item in items:
            if item.item_key in seen:
                outcome.already_queued += 1
                continue
            seen.add(item.item_key)
            chunk.append((item, item.task_data()))
            if len(chunk) >= max(1, chunk_size):
                if in_flight is not None:
                    record(in_flight[0], in_flight[1].result())
                in_flight = (chunk, pool.submit(send, chunk))
                chunk = []
        if in_flight is not None:
            record(in_flight[0], in_flight[1].result())
        if chunk:
            record(chunk, send(chunk))
    outcome.seconds = time.perf_counter() - started
    return outcome


def _queue_row(
    client: LabelStudioClient,
    handle: ProjectHandle,
    item_key: str,
    task_id: int,
    data: dict,
    fields: dict,
    prediction: dict | None,
    stamp: datetime,
    *,
    adopted: bool,
) -> dict:
    row = {
        "ls_server": client.server_key,
        "interface": handle.interface.name,
        "interface_version": handle.interface.version_key,
        "item_key": item_key,
        "ls_project_id": handle.project_id,
        "ls_task_id": task_id,
        "episode_id": data.get("episode_id"),
        "step_idx": data.get("step_idx"),
        "task_id": data.get("task_id"),
        "milestone_set_id": data.get("milestone_set_id"),
        "milestone_idx": data.get("milestone_idx"),
        "adopted": adopted,
        "pushed_at": stamp,
    }
    if prediction:
        row["prediction_model"] = prediction.get("model_version")
    row.update({k: v for k, v in fields.items() if v is not None})
    return row
