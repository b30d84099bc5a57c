"""Folders that name their owner process, and the removal of those whose owner is gone (envs.scratch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from envs.scratch import (
    OWNER_FILE,
    make_owned_folder,
    owner_alive,
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
    assert owner["pid"] == os.getpid() and owner_alive(owner["pid"], owner["started"])
    assert reap_abandoned("stepwise-env-*", tmp_path) == [] and folder.exists()


def test_only_folders_whose_owner_is_gone_are_removed_and_stop_runs_first(tmp_path):
    started = psutil.Process().create_time()

    def folder(name: str, owner: dict | str | None) -> os.PathLike:
        path = tmp_path / f"stepwise-env-{name}"
        path.mkdir()
        if owner is not None:
            (path / OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
        return path

    dead = folder("dead", {"pid": _dead_pid(), "started": 1.0})
    reused = folder("reused", {"pid": os.getpid(), "started": started - 3600})  # the pid is another process's now
    alive = folder("alive", {"pid": os.getpid(), "started": started})
    unowned = folder("unowned", None)  # being made
    garbled = folder("garbled", "{")
    other = tmp_path / "ray-x"  # another pattern
    other.mkdir()
    (other / OWNER_FILE).write_text(json.dumps({"pid": _dead_pid(), "started": 1.0}))
    stopped: list = []
    reaped = reap_abandoned("stepwise-env-*", tmp_path, stop=lambda path, owner: stopped.append((path, path.exists())))
    assert sorted(reaped) == sorted([dead, reused])
    assert sorted(stopped) == sorted([(dead, True), (reused, True)])  # before the folder went
    assert not dead.exists() and not reused.exists()
    assert all(p.exists() for p in (alive, unowned, garbled, other))


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
    unlocked = profile("unlocked", None)
    assert reap_abandoned_chromium_profiles(tmp_path, host="thishost") == [dead]
    assert not dead.exists() and live.exists() and elsewhere.exists() and unlocked.exists()
