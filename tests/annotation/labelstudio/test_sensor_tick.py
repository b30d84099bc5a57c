"""The sync sensor's decisions without a server: back-off, a busy lock, failures, a refused key; the secrets check."""

from __future__ import annotations

import time

import pytest

from annotation.labelstudio.client import LabelStudioAuthError, LabelStudioUnavailable
from annotation.labelstudio.human_labels import (
    LabelStudioSite,
    SensorSettings,
    TickOutcome,
    check_no_secrets,
    sync_tick,
)
from annotation.labelstudio.sync_state import SyncState, sync_lock
from warehouse.catalog import Warehouse


def site(home, connect) -> LabelStudioSite:
    return LabelStudioSite(connect=connect, namespace="T", home=home, own_server=True)


def unavailable():
    raise LabelStudioUnavailable("connection refused")


def test_backing_off_and_a_busy_lock_leave_the_cursor_alone(tmp_path):
    warehouse = Warehouse(tmp_path)
    never = site(tmp_path, lambda: pytest.fail("must not connect"))
    waiting = SyncState(consecutive_failures=2, retry_after=time.time() + 100, last_error="down")
    tick = sync_tick(warehouse, never, waiting.to_json())
    assert tick.cursor is None and tick.run_key is None and tick.skip.startswith("backing off after 2 failed")
    with sync_lock(never.lock_path) as taken:
        assert taken
        assert sync_tick(warehouse, never, None) == TickOutcome(skip="another sync is running")


def test_failures_back_off_exponentially_and_are_recorded(tmp_path):
    warehouse = Warehouse(tmp_path)
    warnings: list[str] = []
    settings = SensorSettings(backoff_base_s=10.0, backoff_max_s=25.0)
    first = sync_tick(warehouse, site(tmp_path, unavailable), None, settings, warn=warnings.append)
    state = SyncState.from_json(first.cursor)
    assert first.run_key is None and "Label Studio unavailable: connection refused" in first.skip
    assert state.consecutive_failures == 1 and state.retry_after == pytest.approx(time.time() + 10, abs=2)
    assert warnings and "retrying in 10 s" in warnings[0]
    state.retry_after = time.time() - 1  # the back-off has elapsed
    second = SyncState.from_json(sync_tick(warehouse, site(tmp_path, unavailable), state.to_json(), settings).cursor)
    assert second.consecutive_failures == 2 and second.retry_after == pytest.approx(time.time() + 20, abs=2)
    second.retry_after = time.time() - 1
    third = SyncState.from_json(sync_tick(warehouse, site(tmp_path, unavailable), second.to_json(), settings).cursor)
    assert third.retry_after == pytest.approx(time.time() + 25, abs=2)  # capped


def test_a_refused_key_is_raised_not_retried(tmp_path):
    def refused():
        raise LabelStudioAuthError("Label Studio refused the key from the environment")

    with pytest.raises(LabelStudioAuthError):
        sync_tick(Warehouse(tmp_path), site(tmp_path, refused), None)


def test_secrets_check_finds_a_key_in_the_stages_files(tmp_path, monkeypatch):
    warehouse = Warehouse(tmp_path)
    monkeypatch.setenv("MY_LS_KEY", "secret-key-0123456789")
    checked = LabelStudioSite(lambda: None, "T", tmp_path, own_server=False, api_key_env="MY_LS_KEY")
    clean = check_no_secrets(warehouse, checked)
    assert clean.passed and clean.metadata == {"secrets_checked": 1, "files_with_a_secret": []}
    leaked = tmp_path / "plots" / "annotation_agreement.png"
    leaked.parent.mkdir()
    leaked.write_bytes(b"...secret-key-0123456789...")
    found = check_no_secrets(warehouse, checked)
    assert not found.passed and found.metadata["files_with_a_secret"] == ["plots/annotation_agreement.png"]
