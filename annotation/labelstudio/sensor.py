"""Running syncs of every Stepwise project: now, waiting for exports (the ``human_labels`` asset),
or one sensor tick that never waits and backs off while Label Studio is down (``label_studio_sync``).

A project's sync itself is :class:`annotation.labelstudio.sync.ProjectSyncer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from annotation.labelstudio.client import (
    LabelStudioAuthError,
    LabelStudioClient,
    LabelStudioError,
    LabelStudioUnavailable,
)
from annotation.labelstudio.connection import LabelStudioSite, pseudonym_salt
from annotation.labelstudio.reads import queue_version
from annotation.labelstudio.reports import sync_event, sync_summary
from annotation.labelstudio.secrets import scrub
from annotation.labelstudio.sync import FULL_RESYNC_EVERY_S, ProjectSyncer, Stage, managed_projects
from annotation.labelstudio.sync_state import SyncState, backoff_seconds, sync_lock
from warehouse.catalog import Warehouse

Log = Callable[[str], None]


def _no_log(message: str) -> None:
    pass


def sync_projects(
    warehouse: Warehouse,
    site: LabelStudioSite,
    *,
    full_resync: bool = True,
    run_id: str | None = None,
    log: Log = _no_log,
) -> dict[str, Any]:
    """Sync every Stepwise project into ``human_labels`` now, waiting for exports (and for a running sync)."""
    client = site.connect()
    results = []
    try:
        with sync_lock(site.lock_path, timeout_s=600) as taken:
            if not taken:
                raise LabelStudioError("another sync held the lock for 10 minutes")
            syncer = ProjectSyncer(
                client,
                warehouse,
                salt=pseudonym_salt(site.home),
                run_id=run_id,
                blocking=True,
                full_resync_every_s=0.0 if full_resync else FULL_RESYNC_EVERY_S,
                log=log,
            )
            state = SyncState()
            for interface, project_id in managed_projects(client, site.namespace):
                project_state = state.project(client.server_key, project_id)
                queued = queue_version(warehouse, client.server_key, interface)
                results.append(syncer.sync(interface, project_id, project_state, queue_version=queued))
    finally:
        client.close()
    return sync_summary(results) | {"label_studio": client.url}


@dataclass(frozen=True)
class SensorSettings:
    """The sync sensor's timing (see :func:`sync_tick`); ``on_stage`` sees each stage of a project sync."""

    name: str = "label_studio_sync"
    backoff_base_s: float = 30.0
    backoff_max_s: float = 900.0
    full_resync_every_s: float = FULL_RESYNC_EVERY_S
    tick_budget_s: float = 35.0
    on_stage: Stage | None = None


@dataclass
class TickOutcome:
    """What one sensor evaluation decided. ``run_key`` set: labels changed, run ``DOWNSTREAM_OF_LABELS``
    and report ``events`` (``human_labels`` materializations); else ``skip`` says why not. ``cursor``
    None leaves the cursor as it was."""

    skip: str | None = None
    cursor: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    run_key: str | None = None


def sync_tick(
    warehouse: Warehouse,
    site: LabelStudioSite,
    cursor: str | None,
    settings: SensorSettings | None = None,
    *,
    log: Log = _no_log,
    warn: Log = _no_log,
) -> TickOutcome:
    """One evaluation of the sync sensor.

    Skip while backing off; otherwise sync every Stepwise project, least recently checked first
    (cheap when nothing changed). Label Studio unreachable or slow: record the state (a pending
    export survives) and back off ``backoff_base_s`` x 2^(failures-1), at most ``backoff_max_s``. A
    refused key raises :class:`LabelStudioAuthError`. Projects left when the tick has run
    ``tick_budget_s`` wait for the next tick (Dagster stops a sensor evaluation after 60 s).
    """
    settings = settings or SensorSettings()
    state = SyncState.from_json(cursor)
    now = time.time()
    if state.retry_after and now < state.retry_after:
        return TickOutcome(
            skip=f"backing off after {state.consecutive_failures} failed attempt(s) (last: {state.last_error}); "
            f"next attempt in {state.retry_after - now:.0f} s"
        )
    results = []
    client: LabelStudioClient | None = None
    try:
        with sync_lock(site.lock_path, timeout_s=0) as taken:
            if not taken:
                return TickOutcome(skip="another sync is running")
            client = site.connect()
            syncer = ProjectSyncer(
                client,
                warehouse,
                salt=pseudonym_salt(site.home),
                run_id=f"sensor:{settings.name}",
                blocking=False,
                full_resync_every_s=settings.full_resync_every_s,
                on_stage=settings.on_stage,
                log=log,
            )
            started = time.monotonic()
            server_key = client.server_key
            projects = sorted(
                managed_projects(client, site.namespace),
                key=lambda p: state.project(server_key, p[1]).last_checked_at or 0.0,
            )
            for interface, project_id in projects:
                if time.monotonic() - started > settings.tick_budget_s:
                    log(f"tick budget used; {interface.name} waits for the next tick")
                    break
                project_state = state.project(server_key, project_id)
                queued = queue_version(warehouse, server_key, interface)
                results.append(syncer.sync(interface, project_id, project_state, queue_version=queued))
    except LabelStudioAuthError:
        raise
    except (LabelStudioUnavailable, LabelStudioError) as exc:
        state.consecutive_failures += 1
        delay = backoff_seconds(
            state.consecutive_failures, base_s=settings.backoff_base_s, max_s=settings.backoff_max_s
        )
        state.retry_after = now + delay
        state.last_error = scrub(exc)[:300]
        warn(f"Label Studio sync failed ({state.last_error}); retrying in {delay:.0f} s")
        return TickOutcome(
            skip=f"Label Studio unavailable: {state.last_error}; retrying in {delay:.0f} s", cursor=state.to_json()
        )
    finally:
        if client is not None:
            client.close()
    state.consecutive_failures, state.retry_after, state.last_error = 0, None, None
    applied = [r for r in results if r.status == "applied"]
    if not applied:
        waiting = sum(1 for r in results if r.status == "waiting_for_export")
        if waiting:
            reason = f"waiting for {waiting} Label Studio export(s)"
        elif results:
            reason = f"no annotation changes in {len(results)} project(s)"
        else:
            reason = "no Stepwise projects in Label Studio yet"
        return TickOutcome(skip=reason, cursor=state.to_json())
    return TickOutcome(
        cursor=state.to_json(),
        events=[sync_event(r) for r in applied],
        run_key="labels-" + "-".join(sorted(r.materialization_id or "" for r in applied)),
    )
