"""A small, typed client for what Stepwise needs from Label Studio, over the SDK 2.x.

It wraps ``label_studio_sdk.LabelStudio`` (which exchanges a personal access token for access
tokens itself) and gives every failure one of three meanings:

* :class:`LabelStudioAuthError` - the key was refused (401/403). Permanent: raised at once with one
  clear sentence naming where the key came from, never retried;
* :class:`LabelStudioUnavailable` - the server is down, restarting, slow or answering 5xx.
  Transient: callers (the sensor) back off and try again later;
* :class:`LabelStudioError` - anything else (a bad request, an unexpected answer).

The SDK's own retries are off (``max_retries=0``): retry policy belongs to the caller, so a bad
token is one error, not a stack of retries. Messages go through :func:`scrub`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx

if TYPE_CHECKING:  # the SDK is imported when a client first talks to Label Studio: importing it
    # costs about a second, which every Dagster process paid for the definitions' resources
    from label_studio_sdk import LabelStudio
    from label_studio_sdk.core.request_options import RequestOptions
    from label_studio_sdk.types.import_api_request import ImportApiRequest

from annotation.labelstudio.secrets import Credentials, scrub

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 60.0


class LabelStudioError(RuntimeError):
    """Label Studio answered something Stepwise cannot use."""


class LabelStudioUnavailable(LabelStudioError):
    """Label Studio could not be reached or is not ready (down, restarting, overloaded): try again later."""


class LabelStudioTimeout(LabelStudioUnavailable):
    """Label Studio did not answer in time (it may still finish the work, e.g. a large export)."""


class LabelStudioAuthError(LabelStudioError):
    """Label Studio refused the API key. Retrying will not help."""


@dataclass(frozen=True)
class ProjectCounts:
    """The numbers that change when annotators work: the cheap change detector of the sync."""

    task_number: int
    total_annotations: int
    skipped_annotations: int
    ground_truth: int
    latest_task_update: str | None

    def fingerprint(self) -> str:
        return (
            f"{self.task_number}|{self.total_annotations}|{self.skipped_annotations}|{self.ground_truth}"
            f"|{self.latest_task_update}"
        )


@dataclass(frozen=True)
class ExportSnapshot:
    export_id: int
    title: str
    status: str  # created | in_progress | completed | failed
    md5: str | None
    task_count: int | None


class LabelStudioClient:
    """Stepwise's calls to one Label Studio server, with errors mapped as the module explains."""

    def __init__(self, credentials: Credentials, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.credentials = credentials
        self.url = credentials.url.rstrip("/")
        self.server_key = credentials.server_key
        self.timeout_s = timeout_s
        self._sdk: LabelStudio | None = None

    def __repr__(self) -> str:
        return f"LabelStudioClient(url={self.url!r}, key from {self.credentials.source})"

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def sdk(self) -> LabelStudio:
        """The SDK client (created lazily; constructing it can already reject an expired token)."""
        if self._sdk is None:
            from label_studio_sdk import LabelStudio

            self._sdk = self._call(
                lambda: LabelStudio(
                    base_url=self.url, api_key=self.credentials.api_key, max_retries=0, timeout=self.timeout_s
                ),
                "connect",
            )
        return self._sdk

    def close(self) -> None:
        if self._sdk is not None:
            try:
                self._sdk._client_wrapper.httpx_client.httpx_client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self._sdk = None

    def _auth_message(self, status: int | None) -> str:
        where = (
            "LABEL_STUDIO_API_KEY"
            if self.credentials.source == "environment"
            else "the project's local data folder (.stepwise/labelstudio/stepwise-credentials.json)"
        )
        return (
            f"Label Studio at {self.url} rejected the API key from {where} (HTTP {status}). "
            "Use a personal access token from Label Studio (Account & Settings > Personal Access Token); "
            "for the project's own server, delete the api_key entry of the credentials file and start again."
        )

    def _call(self, operation: Callable[[], T], what: str) -> T:
        from label_studio_sdk.core.api_error import ApiError

        try:
            return operation()
        except ApiError as exc:
            status = exc.status_code
            if status in (401, 403):
                raise LabelStudioAuthError(self._auth_message(status)) from None
            if status is not None and (status >= 500 or status in (408, 429)):
                raise LabelStudioUnavailable(
                    f"Label Studio at {self.url} is not ready ({what}: HTTP {status})"
                ) from None
            raise LabelStudioError(
                f"Label Studio at {self.url} refused {what} (HTTP {status}): {scrub(_short(exc.body))}"
            ) from None
        except httpx.TimeoutException:
            raise LabelStudioTimeout(f"Label Studio at {self.url} did not answer {what} in time") from None
        except (httpx.TransportError, ConnectionError) as exc:
            raise LabelStudioUnavailable(
                f"Label Studio at {self.url} is unreachable ({what}: {type(exc).__name__})"
            ) from None
        except json.JSONDecodeError:
            raise LabelStudioUnavailable(
                f"Label Studio at {self.url} answered {what} with something that is not JSON"
            ) from None

    def _raw(
        self,
        method: str,
        path: str,
        *,
        params: dict | None = None,
        json_body: Any = None,
        what: str,
        timeout_s: float | None = None,
    ) -> Any:
        """A request through the SDK's authenticated HTTP client, for endpoints the SDK does not type."""

        def send() -> httpx.Response:
            options: RequestOptions = {"max_retries": 0, "timeout": timeout_s or self.timeout_s}
            return self.sdk._client_wrapper.httpx_client.request(
                path, method=method, params=params, json=json_body, request_options=options
            )

        response = self._call(send, what)
        if response.status_code in (401, 403):
            raise LabelStudioAuthError(self._auth_message(response.status_code))
        if response.status_code >= 500 or response.status_code in (408, 429):
            raise LabelStudioUnavailable(
                f"Label Studio at {self.url} is not ready ({what}: HTTP {response.status_code})"
            )
        if response.status_code >= 400:
            raise LabelStudioError(
                f"Label Studio at {self.url} refused {what} (HTTP {response.status_code}): {scrub(response.text[:300])}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise LabelStudioUnavailable(
                f"Label Studio at {self.url} answered {what} with something that is not JSON"
            ) from None

    # -- identity ------------------------------------------------------------------------------
    def whoami(self) -> dict:
        """The user the key belongs to; the cheapest check that the server is up and the key works."""
        user = self._call(lambda: self.sdk.users.whoami(), "whoami")
        return {"id": user.id, "email": getattr(user, "email", None)}

    # -- projects ------------------------------------------------------------------------------
    def find_project(self, title: str) -> int | None:
        """The id of the project titled exactly ``title`` (oldest first), or None."""
        found = self._raw("GET", "api/projects/", params={"title": title, "page_size": 100}, what="list projects")
        results = found.get("results", found) if isinstance(found, dict) else found
        ids = sorted(p["id"] for p in results or [] if p.get("title") == title)
        return ids[0] if ids else None

    def create_project(
        self,
        *,
        title: str,
        label_config: str,
        description: str,
        instruction: str,
        maximum_annotations: int,
        overlap_percentage: int,
    ) -> int:
        project = self._call(
            lambda: self.sdk.projects.create(
                title=title,
                label_config=label_config,
                description=description,
                expert_instruction=instruction,
                show_instruction=True,
                show_skip_button=True,
                enable_empty_annotation=False,
                maximum_annotations=maximum_annotations,
                overlap_cohort_percentage=overlap_percentage,
                show_collab_predictions=True,
                sampling="Sequential sampling",
            ),
            f"create project {title!r}",
        )
        if project.id is None:
            raise LabelStudioError(f"Label Studio created project {title!r} without an id")
        return int(project.id)

    def project(self, project_id: int) -> dict:
        return self._raw("GET", f"api/projects/{project_id}/", what=f"read project {project_id}")

    def update_project(self, project_id: int, **fields: Any) -> None:
        self._raw("PATCH", f"api/projects/{project_id}/", json_body=fields, what=f"update project {project_id}")

    def project_counts(self, project_id: int) -> ProjectCounts:
        """Task and annotation counts plus the latest task change (an annotation edit touches its task)."""
        project = self.project(project_id)
        latest = self._raw(
            "GET",
            "api/tasks/",
            params={
                "project": project_id,
                "page_size": 1,
                "fields": "task_only",
                "query": json.dumps({"ordering": ["-tasks:updated_at"]}),
            },
            what=f"latest task of project {project_id}",
        )
        tasks = (latest or {}).get("tasks") or []
        return ProjectCounts(
            task_number=int(project.get("task_number") or 0),
            total_annotations=int(project.get("total_annotations_number") or 0),
            skipped_annotations=int(project.get("skipped_annotations_number") or 0),
            ground_truth=int(project.get("ground_truth_number") or 0),
            latest_task_update=tasks[0].get("updated_at") if tasks else None,
        )

    def ensure_local_files_storage(self, project_id: int, root: Path | str) -> int:
        """A local-files storage of the project on ``root`` (created once; never synced: it only grants
        the project's annotators access to files under ``root`` at ``/data/local-files/?d=<relative path>``)."""
        root = str(Path(root).resolve())
        found = self._raw("GET", "api/storages/localfiles/", params={"project": project_id}, what="list local storages")
        for storage in found or []:
            if storage.get("path") == root:
                return int(storage["id"])
        created = self._raw(
            "POST",
            "api/storages/localfiles/",
            what="create a local storage",
            json_body={
                "project": project_id,
                "path": root,
                "title": "Stepwise screenshots",
                "use_blob_urls": True,
                "regex_filter": r"\.(png|jpg|jpeg|webp)$",
            },
        )
        return int(created["id"])

    def task_url(self, project_id: int, task_id: int) -> str:
        """The labeling page of one task."""
        return f"{self.url}/projects/{project_id}/data?task={task_id}"

    # -- tasks ---------------------------------------------------------------------------------
    def import_tasks(self, project_id: int, tasks: Sequence[dict]) -> list[int]:
        """Bulk-import tasks (with predictions) in one request; the new task ids, in order."""
        response = self._call(
            lambda: self.sdk.projects.import_tasks(
                id=project_id,
                request=cast("list[ImportApiRequest]", list(tasks)),  # the SDK serializes plain dicts as well
                return_task_ids=True,
                request_options={"timeout_in_seconds": int(max(self.timeout_s, 300))},
            ),
            f"import {len(tasks)} tasks into project {project_id}",
        )
        task_ids = list(getattr(response, "task_ids", None) or [])
        if len(task_ids) != len(tasks):
            raise LabelStudioError(
                f"Label Studio imported {len(task_ids)} of {len(tasks)} tasks into project {project_id}"
            )
        return [int(t) for t in task_ids]

    def iter_tasks(self, project_id: int, *, after_task_id: int = 0, page_size: int = 500) -> Iterator[dict]:
        """Tasks of a project with id > ``after_task_id`` (id, data), in id order."""
        query = {
            "filters": {
                "conjunction": "and",
                "items": [
                    {"filter": "filter:tasks:id", "operator": "greater", "type": "Number", "value": int(after_task_id)}
                ],
            },
            "ordering": ["tasks:id"],
        }
        page = 1
        while True:
            found = self._raw(
                "GET",
                "api/tasks/",
                params={
                    "project": project_id,
                    "page": page,
                    "page_size": page_size,
                    "fields": "task_only",
                    "query": json.dumps(query),
                },
                what=f"list tasks of project {project_id}",
            )
            tasks = (found or {}).get("tasks") or []
            yield from (t for t in tasks if int(t["id"]) > after_task_id)
            if len(tasks) < page_size:
                return
            page += 1

    def delete_tasks(self, project_id: int, task_ids: Sequence[int]) -> None:
        self._raw(
            "POST",
            "api/dm/actions",
            params={"id": "delete_tasks", "project": project_id},
            json_body={"selectedItems": {"all": False, "included": list(task_ids)}},
            what="delete tasks",
        )

    def predictions_to_annotations(self, project_id: int) -> int:
        """Turn every task's prediction into an annotation (a Data Manager bulk action); how many were created."""
        answer = self._raw(
            "POST",
            "api/dm/actions",
            params={"id": "predictions_to_annotations", "project": project_id},
            json_body={"selectedItems": {"all": True, "excluded": []}},
            what="predictions to annotations",
            timeout_s=600,
        )
        detail = str((answer or {}).get("detail", ""))
        digits = [int(w) for w in detail.split() if w.isdigit()]
        return digits[0] if digits else 0

    # -- annotations (used by tests and the benchmark; annotators use the web page) ---------------
    def create_annotation(self, task_id: int, result: list[dict], **fields: Any) -> int:
        created = self._call(
            lambda: self.sdk.annotations.create(id=task_id, result=result, **fields), f"annotate task {task_id}"
        )
        return int(created.id)

    def update_annotation(self, annotation_id: int, result: list[dict]) -> None:
        self._call(
            lambda: self.sdk.annotations.update(id=annotation_id, result=result), f"update annotation {annotation_id}"
        )

    def delete_annotation(self, annotation_id: int) -> None:
        self._call(lambda: self.sdk.annotations.delete(id=annotation_id), f"delete annotation {annotation_id}")

    # -- snapshot exports ----------------------------------------------------------------------
    def create_export(self, project_id: int, title: str, *, timeout_s: float | None = None) -> ExportSnapshot:
        """Ask for a snapshot export of every task with an annotation (skipped and ground truth included).

        Label Studio without a job queue builds the snapshot inside this request; with one it
        answers at once and the snapshot is built in the background (poll :meth:`get_export`).
        """
        body = {
            "title": title,
            "task_filter_options": {"only_with_annotations": True},
            "annotation_filter_options": {"usual": True, "ground_truth": True, "skipped": True},
            "serialization_options": {
                "predictions": {"only_id": True},
                "drafts": {"only_id": True},
                "annotations__completed_by": {"only_id": True},
            },
        }
        created = self._raw(
            "POST",
            f"api/projects/{project_id}/exports/",
            json_body=body,
            what=f"create a snapshot export of project {project_id}",
            timeout_s=timeout_s,
        )
        return _snapshot(created)

    def get_export(self, project_id: int, export_id: int) -> ExportSnapshot:
        found = self._raw("GET", f"api/projects/{project_id}/exports/{export_id}", what=f"read export {export_id}")
        return _snapshot(found)

    def find_export(self, project_id: int, title: str) -> ExportSnapshot | None:
        """The newest export of the project with this title (a snapshot asked for by an interrupted sync)."""
        found = self._raw("GET", f"api/projects/{project_id}/exports/", what=f"list exports of project {project_id}")
        matches = [_snapshot(e) for e in found or [] if e.get("title") == title]
        return max(matches, key=lambda e: e.export_id) if matches else None

    def download_export(self, project_id: int, export_id: int, *, timeout_s: float = 300.0) -> list[dict]:
        """The snapshot's tasks (Label Studio JSON)."""

        def fetch() -> bytes:
            chunks = self.sdk.projects.exports.download(
                id=project_id,
                export_pk=export_id,
                export_type="JSON",
                request_options={"timeout_in_seconds": int(timeout_s), "max_retries": 0},
            )
            return b"".join(chunks)

        payload = self._call(fetch, f"download export {export_id}")
        try:
            return json.loads(payload)
        except ValueError:
            raise LabelStudioUnavailable(f"export {export_id} of project {project_id} came back incomplete") from None

    def delete_export(self, project_id: int, export_id: int) -> None:
        try:
            self._raw("DELETE", f"api/projects/{project_id}/exports/{export_id}", what=f"delete export {export_id}")
        except LabelStudioError:
            pass  # the snapshot file is disposable; a leftover costs disk, not correctness

    def wait_for_export(
        self, project_id: int, export: ExportSnapshot, *, timeout_s: float = 600.0, poll_s: float = 1.0
    ) -> ExportSnapshot:
        """Poll until the snapshot is completed or failed (for callers that may block, not the sensor)."""
        deadline = time.monotonic() + timeout_s
        while export.status not in ("completed", "failed"):
            if time.monotonic() > deadline:
                raise LabelStudioUnavailable(
                    f"export {export.export_id} of project {project_id} not ready after {timeout_s:.0f} s"
                )
            time.sleep(poll_s)
            export = self.get_export(project_id, export.export_id)
        return export


def _snapshot(payload: dict) -> ExportSnapshot:
    counters = payload.get("counters") or {}
    return ExportSnapshot(
        export_id=int(payload["id"]),
        title=str(payload.get("title") or ""),
        status=str(payload.get("status") or "created"),
        md5=payload.get("md5"),
        task_count=counters.get("task_number") if isinstance(counters, dict) else None,
    )


def _short(body: Any, limit: int = 300) -> str:
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:limit]
