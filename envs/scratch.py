"""Temporary folders that name the process they belong to, and the removal of those whose process
is gone.

A browser's profile and temporary folder, or a local Ray cluster's folder, are removed by the code
that made them when it ends normally, and by the pool when it kills a worker. Nothing removes them
when the owning process dies with its parent (a test run killed, a CI job cut off, a Ray node lost):
on this machine 142 browser profiles (2.5 MB each) and 459 Chromium socket folders had piled up
in /tmp by 2026-12-01. Each such folder now holds :data:`OWNER_FILE` (the owner's pid and start
time), and whoever makes a new one first removes those whose owner is gone
(:func:`reap_abandoned`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

#: The file in a folder that names the process it belongs to.
OWNER_FILE = "stepwise-owner.json"


def process_started(pid: int) -> float:
    """When process ``pid`` started (seconds since the epoch, as psutil reports it)."""
    import psutil

    return float(psutil.Process(pid).create_time())


def owner_alive(pid: int, started: float) -> bool:
    """Whether the process that owns a folder still runs: pid ``pid``, started at ``started``
    (another start time: the pid was reused by another process). A zombie is gone; a process this
    user may not inspect counts as alive (not ours to judge)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - started) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def write_owner(folder: Path, **extra: str) -> None:
    """Name this process as ``folder``'s owner (and anything ``extra`` a reaper needs)."""
    owner = {"pid": os.getpid(), "started": process_started(os.getpid())} | extra
    (folder / OWNER_FILE).write_text(json.dumps(owner))


def make_owned_folder(prefix: str, base: str | Path | None = None) -> Path:
    """A fresh folder ``<base>/<prefix>XXXXXXXX`` (base: the process's temporary folder) owned by this
    process (:func:`write_owner`)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    write_owner(folder)
    return folder


def reap_abandoned(
    pattern: str,
    base: str | Path | None = None,
    *,
    stop: Callable[[Path, dict], None] | None = None,
) -> list[Path]:
    """Remove every folder ``<base>/<pattern>`` (a glob; base: the process's temporary folder) that
    this user made and whose owner process is gone; the folders removed. ``stop`` runs first for
    each (a Ray cluster's processes must be stopped before its folder goes) with the owner's record.
    A folder without an owner file (being made, or not ours) or whose owner lives is never touched."""
    reaped = []
    for owner_file in sorted(Path(base or tempfile.gettempdir()).glob(f"{pattern}/{OWNER_FILE}")):
        try:
            if owner_file.stat().st_uid != os.getuid():
                continue
            owner = json.loads(owner_file.read_text())
            pid, started = int(owner["pid"]), float(owner["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to judge
        if owner_alive(pid, started):
            continue
        folder = owner_file.parent
        if stop is not None:
            stop(folder, owner)
        shutil.rmtree(folder, ignore_errors=True)
        logger.info("removed %s: its owner (pid %d) is gone", folder, pid)
        reaped.append(folder)
    return reaped


def reap_abandoned_chromium_profiles(base: str | Path | None = None, *, host: str | None = None) -> list[Path]:
    """Remove the browser profiles earlier versions made (``stepwise-chromium-*``, without an owner
    file) whose browser is gone: Chromium's own ``SingletonLock`` (a link to ``<host>-<pid>``) names
    a process of this host that no longer runs. A profile without the lock is left alone."""
    import psutil

    host = host or os.uname().nodename
    reaped = []
    # the lock is a dangling link (its target names a process, not a file): glob would not see it
    for profile in sorted(Path(base or tempfile.gettempdir()).glob("stepwise-chromium-*")):
        lock = profile / "SingletonLock"
        try:
            holder = os.readlink(lock)
            if profile.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        lock_host, _, pid = holder.rpartition("-")
        if lock_host != host or not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        shutil.rmtree(profile, ignore_errors=True)
        reaped.append(profile)
    return reaped
