"""Reliability against the real server: stopped during a sync and restarted; a bad token.

The restart test stops the session's Label Studio server in the middle of a sync (after the
snapshot export is ready, before its download), checks that the sensor backs off without writing
anything, restarts the server, and checks that the sensor resumes the same export and that no
annotation is lost or counted twice.
"""

from __future__ import annotations

import time

import jwt
import pytest
from dagster import DagsterInstance, SensorResult

from annotation.labelstudio.client import LabelStudioAuthError, LabelStudioClient
from annotation.labelstudio.interfaces import correctness_prediction
from annotation.labelstudio.sync import human_labels_dataset
from annotation.labelstudio.sync_state import SyncState
from assets.human_labels import build_label_studio_sensor
from assets.resources import LabelStudioResource
from tests.annotation.labelstudio.helpers import labels, push, queued_tasks, tick

pytestmark = pytest.mark.e2e


def _fast_forward(cursor: str) -> str:
    """The cursor as it would be once the back-off has elapsed (instead of sleeping through it)."""
    state = SyncState.from_json(cursor)
    state.retry_after = time.time() - 1
    return state.to_json()


def test_server_stopped_during_a_sync_then_restarted(ls_server, ls_credentials, small_warehouse, ls_resource):
    instance = DagsterInstance.ephemeral()
    push(small_warehouse, ls_resource, budget=8, interfaces=("step_correctness",), instance=instance)
    client = ls_resource.client()
    tasks = queued_tasks(small_warehouse, "step_correctness")
    ids = [client.create_annotation(t["ls_task_id"], correctness_prediction("positive"), lead_time=1.0) for t in tasks]
    client.close()
    project_id = tasks[0]["ls_project_id"]

    stopped_at_export: list[int] = []

    def stop_server_mid_sync(stage: str, info: dict) -> None:
        if stage == "export_ready" and not stopped_at_export:
            stopped_at_export.append(info["export_id"])
            assert ls_server.stop()

    sensor = build_label_studio_sensor(
        name="restart_test_sensor", backoff_base_s=30.0, backoff_max_s=900.0, on_stage=stop_server_mid_sync
    )
    try:
        # the back-off starts when the failure happens, somewhere inside the tick: bracket it, so a slow
        # machine (stopping the server can take seconds) does not read as a wrong back-off
        tick_started = time.time()
        failed = tick(sensor, small_warehouse, ls_resource, instance)
        tick_ended = time.time()
        assert stopped_at_export, "the sync reached the export before the server went down"
        assert isinstance(failed, SensorResult) and not failed.asset_events and not failed.run_requests
        assert "unavailable" in failed.skip_reason.skip_message.lower()
        state = SyncState.from_json(failed.cursor)
        assert state.consecutive_failures == 1
        assert state.project(client.server_key, project_id).pending_export_id == stopped_at_export[0]  # kept to resume
        assert (
            small_warehouse.current_version("human_labels", human_labels_dataset(client.server_key, project_id)) is None
        )

        assert state.retry_after is not None and tick_started + 30 <= state.retry_after <= tick_ended + 30
        waiting = tick(sensor, small_warehouse, ls_resource, instance, failed.cursor)  # within the back-off: no request
        assert "backing off" in waiting.skip_message
        tick_started = time.time()
        down = tick(sensor, small_warehouse, ls_resource, instance, _fast_forward(failed.cursor))  # still down
        tick_ended = time.time()
        down_state = SyncState.from_json(down.cursor)
        assert down_state.consecutive_failures == 2 and down_state.retry_after is not None
        assert tick_started + 60 <= down_state.retry_after <= tick_ended + 60  # doubled
        assert down_state.project(client.server_key, project_id).pending_export_id == stopped_at_export[0]
    finally:
        ls_server.start()  # the session's server must come back whatever happened

    # the token issued before the restart still works (the server signs with the same key)
    assert LabelStudioClient(ls_credentials).whoami()["email"] == ls_credentials.username
    resumed = tick(sensor, small_warehouse, ls_resource, instance, _fast_forward(down.cursor))
    assert isinstance(resumed, SensorResult) and len(resumed.asset_events) == 1
    event = resumed.asset_events[0].metadata
    assert event["export_id"].value == stopped_at_export[0]  # the interrupted export, resumed
    assert event["created"].value == len(ids)
    assert SyncState.from_json(resumed.cursor).consecutive_failures == 0

    # changes made after the restart arrive on the next tick; repeating changes nothing
    client = ls_resource.client()
    client.update_annotation(ids[0], correctness_prediction("negative"))
    client.delete_annotation(ids[1])
    client.close()
    after = tick(sensor, small_warehouse, ls_resource, instance, resumed.cursor)
    assert (after.asset_events[0].metadata["updated"].value, after.asset_events[0].metadata["retracted"].value) == (
        1,
        1,
    )
    again = tick(sensor, small_warehouse, ls_resource, instance, after.cursor)
    assert not getattr(again, "asset_events", None)
    rows = labels(small_warehouse)
    assert sorted(r["annotation_id"] for r in rows) == sorted(ids)  # every annotation exactly once
    by_id = {r["annotation_id"]: r for r in rows}
    assert by_id[ids[0]]["label"] == "negative" and by_id[ids[1]]["status"] == "retracted"


def test_a_bad_token_gives_one_clear_error(ls_server, ls_credentials, small_warehouse, monkeypatch, namespace):
    log = ls_server.log_path
    fake = jwt.encode(
        {"token_type": "refresh", "exp": int(time.time()) + 3600, "user_id": 1},
        "not-the-key-of-this-label-studio-server",
        algorithm="HS256",
    )
    for bad_key in (fake, "0123456789abcdef0123456789abcdef01234567"):
        monkeypatch.setenv("LABEL_STUDIO_URL", ls_credentials.url)
        monkeypatch.setenv("LABEL_STUDIO_API_KEY", bad_key)
        before = _refused(log)
        sensor = build_label_studio_sensor(name="bad_token_sensor")
        started = time.monotonic()
        with pytest.raises(LabelStudioAuthError) as raised:
            tick(
                sensor,
                small_warehouse,
                LabelStudioResource(home=str(small_warehouse.home), project_namespace=namespace),
                DagsterInstance.ephemeral(),
            )
        assert time.monotonic() - started < 10, "no retries with back-off sleeps"
        message = str(raised.value)
        assert "rejected the API key" in message and "LABEL_STUDIO_API_KEY" in message
        assert bad_key not in message and raised.value.__cause__ is None
        assert raised.value.__context__ is None or raised.value.__suppress_context__  # one error, no chained traceback
        time.sleep(0.5)  # let the server flush its request log
        assert _refused(log) - before == 1, "exactly one refused request, not a stack of retries"


def _refused(log) -> int:
    """Requests the server answered 401 (its log writes each request line twice: count distinct lines)."""
    return len({line for line in log.read_text().splitlines() if '" 401 ' in line})


def test_a_slow_export_is_waited_for_and_resumed_not_asked_again(small_warehouse, ls_resource):
    """The export request times out while Label Studio is still building the snapshot: the sync waits,
    then finds that same export by its title and applies it (no second export, nothing lost)."""
    from annotation.labelstudio.interfaces import INTERFACES
    from annotation.labelstudio.sync import ProjectSyncer
    from annotation.labelstudio.sync_state import ProjectSyncState

    push(small_warehouse, ls_resource, budget=12, interfaces=("step_correctness",))
    client = ls_resource.client()
    tasks = queued_tasks(small_warehouse, "step_correctness")
    ids = [client.create_annotation(t["ls_task_id"], correctness_prediction("negative")) for t in tasks]
    project_id = tasks[0]["ls_project_id"]
    state = ProjectSyncState()
    impatient = ProjectSyncer(client, small_warehouse, salt="s", export_request_timeout_s=0.02)
    first = impatient.sync(INTERFACES["step_correctness"], project_id, state)
    assert first.status == "waiting_for_export" and state.pending_export_title and state.pending_export_id is None
    title = state.pending_export_title
    deadline = time.time() + 60
    while client.find_export(project_id, title) is None and time.time() < deadline:
        time.sleep(0.5)
    patient = ProjectSyncer(client, small_warehouse, salt="s")
    second = patient.sync(INTERFACES["step_correctness"], project_id, state)
    assert second.status == "applied" and second.diff.created == len(ids)
    assert client.find_export(project_id, title) is None  # applied, then deleted: one export in all
    assert sorted(r["annotation_id"] for r in labels(small_warehouse)) == sorted(ids)
    client.close()
