"""Folders that name their owner process, and the removal of those whose owner is gone (envs.scratch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from envs.scratch import (
    CLAIMED_SUFFIX,
    OWNER_FILE,
    make_owned_folder,
    owner_alive,
    owner_record,
    reap_abandoned,
    reap_abandoned_chromium_profiles,
)


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_an_owned_folder_names_this_process_and_is_kept_while_it_lives(tmp_path):
    folder = make_owned_folder("stepwise-env-", tmp_path)
    owner = json.loads((folder / OWNER_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner_alive(owner)
    assert reap_abandoned("stepwise-env-*", tmp_path) == [] and folder.exists()


def test_only_folders_whose_owner_is_gone_are_removed_and_stop_runs_first(tmp_path):
    started = psutil.Process().create_time()

    def folder(name: str, owner: dict | str | None) -> os.PathLike:
        path = tmp_path / f"stepwise-env-{name}"
        path.mkdir()
        if owner is not None:
            (path / OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
        return path

    dead_pid = _dead_pid()
    dead = folder("dead", {"pid": dead_pid, "started": 1.0})
    reused = folder("reused", {"pid": os.getpid(), "started": started - 3600})  # the pid is another process's now
    alive = folder("alive", {"pid": os.getpid(), "started": started})
    unowned = folder("unowned", None)  # being made
    garbled = folder("garbled", "{")
    other = tmp_path / "ray-x"  # another pattern
    other.mkdir()
    (other / OWNER_FILE).write_text(json.dumps({"pid": _dead_pid(), "started": 1.0}))
    stopped: list = []

    def stop(path, owner) -> None:  # with the folder's old path, before its (claimed) contents go
        stopped.append((path, path.with_name(path.name + CLAIMED_SUFFIX).exists(), owner["pid"]))

    reaped = reap_abandoned("stepwise-env-*", tmp_path, stop=stop)
    assert sorted(reaped) == sorted([dead, reused])
    assert sorted(stopped) == sorted([(dead, True, dead_pid), (reused, True, os.getpid())])
    assert not dead.exists() and not reused.exists()
    assert all(p.exists() for p in (alive, unowned, garbled, other))
    assert not list(tmp_path.glob(f"*{CLAIMED_SUFFIX}"))


def test_profiles_of_earlier_versions_go_when_their_browser_is_gone(tmp_path):
    def profile(name: str, holder: str | None) -> os.PathLike:
        path = tmp_path / f"stepwise-chromium-{name}"
        path.mkdir()
        if holder is not None:
            os.symlink(holder, path / "SingletonLock")  # Chromium's own lock: <host>-<pid>
        return path

    dead = profile("dead", f"thishost-{_dead_pid()}")
    live = profile("live", f"thishost-{os.getpid()}")
    elsewhere = profile("elsewhere", f"otherhost-{_dead_pid()}")  # a pid of another machine says nothing here
    unlocked = profile("unlocked", None)  # a browser starting, or one that never took the lock
    stale = profile("stale", None)
    os.utime(stale, (1.0, 1.0))  # untouched for longer than UNLOCKED_PROFILE_AGE_S
    assert reap_abandoned_chromium_profiles(tmp_path, host="thishost") == [dead, stale]
    assert not dead.exists() and not stale.exists()
    assert live.exists() and elsewhere.exists() and unlocked.exists()


def test_a_record_of_another_host_boot_or_namespace_and_a_clock_step(tmp_path):
    """Only a certain death lets a folder go: a record from another host or pid namespace (a /tmp
    shared between containers) is kept; one from an earlier boot is gone; and a live owner stays
    alive when the wall clock was stepped (its start is compared in ticks since boot)."""
    me = owner_record()
    assert owner_alive(me)
    assert owner_alive(me | {"host": "another-host", "pid": _dead_pid()})
    assert owner_alive(me | {"pid_ns": -1, "pid": _dead_pid()})
    if me["boot"] is not None:
        assert not owner_alive(me | {"boot": "an-earlier-boot"})
    if me["start_ticks"] is not None:
        assert owner_alive(me | {"started": me["started"] + 3600})  # the clock moved an hour: ticks decide
        assert not owner_alive(me | {"start_ticks": me["start_ticks"] - 1})  # another process under this pid
    assert owner_alive({"pid": "not a pid"}) and owner_alive({"pid": -5, "started": 1.0})  # unreadable: kept


def test_a_deletion_cut_short_is_finished_and_an_owner_record_is_written_whole(tmp_path):
    leftover = tmp_path / f"stepwise-env-abc{CLAIMED_SUFFIX}"
    (leftover / "profile").mkdir(parents=True)
    assert reap_abandoned("stepwise-env-*", tmp_path) == [] and not leftover.exists()
    folder = make_owned_folder("stepwise-env-", tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [OWNER_FILE]  # no partial file left beside it
