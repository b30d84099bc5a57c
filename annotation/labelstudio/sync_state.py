"""What the Label Studio sync keeps between attempts (:mod:`annotation.labelstudio.sync` does the
sync): each project's state (the last snapshot applied, an export being waited for) and the
failures so far, as JSON in the Dagster sensor's cursor, read back field by field so that a
damaged cursor costs a full sync and never a crashed sensor; the backoff after failures; and the
lock that keeps two syncs of one home from running at once."""

from __future__ import annotations

import fcntl
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INT64 = 2**63


@dataclass
class ProjectSyncState:
    fingerprint: str | None = None  # the counts of the last applied snapshot
    pending_export_title: str | None = None
    pending_export_id: int | None = None
    pending_fingerprint: str | None = None
    export_requested_at: float | None = None
    last_full_sync_at: float | None = None
    last_checked_at: float | None = None  # the last attempt, applied or not: projects checked longest ago go first

    def clear_pending(self) -> None:
        self.pending_export_title = self.pending_export_id = self.pending_fingerprint = None
        self.export_requested_at = None


@dataclass
class SyncState:
    """Everything a sync needs to resume; JSON in the Dagster sensor's cursor (never a secret)."""

    projects: dict[str, ProjectSyncState] = field(default_factory=dict)
    consecutive_failures: int = 0
    retry_after: float | None = None
    last_error: str | None = None

    def project(self, server_key: str, project_id: int) -> ProjectSyncState:
        return self.projects.setdefault(f"{server_key}|{project_id}", ProjectSyncState())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> SyncState:
        """The state in a cursor; what cannot be read (not JSON, a value of the wrong type) starts
        afresh, field by field: a lost cursor costs a full sync, never a crashed sensor."""
        if not text or not isinstance(text, str):
            return cls()
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return cls()
        if not isinstance(raw, dict):
            return cls()
        projects_raw = raw.get("projects")
        projects = {
            k: ProjectSyncState(**{f: _typed(v.get(f), kind) for f, kind in _PROJECT_STATE_TYPES.items()})
            for k, v in (projects_raw.items() if isinstance(projects_raw, dict) else ())
            if isinstance(k, str) and isinstance(v, dict)
        }
        failures = _typed(raw.get("consecutive_failures"), int)
        return cls(
            projects=projects,
            consecutive_failures=max(0, min(failures, 1_000)) if failures is not None else 0,
            retry_after=_typed(raw.get("retry_after"), float),
            last_error=_typed(raw.get("last_error"), str),
        )


_PROJECT_STATE_TYPES: dict[str, type] = {
    "fingerprint": str,
    "pending_export_title": str,
    "pending_export_id": int,
    "pending_fingerprint": str,
    "export_requested_at": float,
    "last_full_sync_at": float,
    "last_checked_at": float,
}


def _typed(value: Any, kind: type) -> Any:
    """``value`` if it is of ``kind`` (an int counts as a float, a bool as neither), else None."""
    if isinstance(value, bool):
        return None
    if kind is float and isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if kind is int and isinstance(value, int):
        return value if -INT64 < value < INT64 else None
    if kind is str and isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return None


def backoff_seconds(failures: int, *, base_s: float = 30.0, max_s: float = 900.0) -> float:
    """Exponential back-off after ``failures`` consecutive failed attempts: base, 2 base, 4 base, ... capped."""
    if failures <= 0:
        return 0.0
    return float(min(max_s, base_s * 2 ** (failures - 1)))


@contextmanager
def sync_lock(path: Path, *, timeout_s: float = 0.0) -> Iterator[bool]:
    """An inter-process lock so two syncs (sensor and asset) never interleave; yields whether it was taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    taken = False
                    break
                time.sleep(0.2)
        try:
            yield taken
        finally:
            if taken:
                fcntl.flock(handle, fcntl.LOCK_UN)
