"""Temporary folders that name the process they belong to, and the removal of those whose process
is gone.

A browser's profile and temporary folder, or a local Ray cluster's folder, are removed by the code
that made them when it ends normally, and by the pool when it kills a worker. Nothing removes them
when the owning process dies with its parent (a test run killed, a CI job cut off, a Ray node lost):
on this machine 142 browser profiles (2.5 MB each) and 459 Chromium socket folders had piled up
in /tmp by 2026-12-01. Each such folder now holds :data:`OWNER_FILE`, and whoever makes a new one
first removes those whose owner is gone (:func:`reap_abandoned`).

Deleting a folder still in use is the failure to avoid, so an owner counts as gone only when this
machine, in this boot and this pid namespace, has no process of that pid that started at the
recorded moment. The moment is the kernel's start time in clock ticks since boot
(``/proc/<pid>/stat``), not the wall-clock start psutil derives from it, which moves when the
clock is stepped (NTP, a resumed VM). A record from another host, boot or pid namespace (a /tmp
shared between containers) is not ours to judge and is kept.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The file in a folder that names the process it belongs to.
OWNER_FILE = "stepwise-owner.json"
#: The suffix a reaper renames a folder to before deleting it: one reaper wins each folder, and a
#: deletion cut short is finished by the next reaper.
CLAIMED_SUFFIX = ".reaping"
#: Profiles of the earlier layout without Chromium's lock are removed once this old (seconds).
UNLOCKED_PROFILE_AGE_S = 24 * 3600


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks since boot (None: no such process here, or
    not Linux). The command name in ``stat`` may hold spaces and parentheses: fields are counted
    after its closing one."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@functools.cache
def _machine() -> dict[str, Any]:
    """What a record must match to be judged here: host, boot and pid namespace (read once: they do
    not change under a running process)."""
    with contextlib.suppress(OSError):
        namespace = os.stat("/proc/self/ns/pid").st_ino
        return {"host": os.uname().nodename, "boot": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": namespace}
    return {"host": os.uname().nodename, "boot": None, "pid_ns": None}


def owner_record(**extra: Any) -> dict[str, Any]:
    """This process as an owner: its pid, its start (ticks since boot; and psutil's wall-clock start
    where /proc is missing), the machine it runs on, and anything ``extra`` a reaper needs."""
    import psutil

    pid = os.getpid()
    return {"pid": pid, "start_ticks": _start_ticks(pid), "started": psutil.Process(pid).create_time()} | (
        _machine() | extra
    )


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process an owner record names still runs (see the module docstring). True for a
    record of another host, boot or pid namespace, for a process this user may not inspect, and for
    a record this cannot read: only a certain death lets a folder go."""
    import psutil

    here = _machine()
    if any(owner.get(key, here[key]) != here[key] for key in ("host", "pid_ns")):
        return True
    if here["boot"] is not None and owner.get("boot") not in (None, here["boot"]):
        return False  # the machine restarted since: no process of that boot runs
    try:
        pid = int(owner["pid"])
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        ticks = owner.get("start_ticks")
        if ticks is not None and (now := _start_ticks(pid)) is not None:
            return now == int(ticks)
        return abs(process.create_time() - float(owner["started"])) < 1.0
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, KeyError, TypeError, ValueError, OverflowError):
        return True


def write_owner(folder: Path, **extra: Any) -> None:
    """Name this process as ``folder``'s owner (:func:`owner_record`), atomically: a reader sees
    the whole record or none."""
    partial = folder / f".{OWNER_FILE}.partial"
    partial.write_text(json.dumps(owner_record(**extra)))
    os.replace(partial, folder / OWNER_FILE)


def make_owned_folder(prefix: str, base: str | Path | None = None) -> Path:
    """A fresh folder ``<base>/<prefix>XXXXXXXX`` (base: the process's temporary folder) owned by this
    process (:func:`write_owner`); removed again if its record cannot be written (a folder without
    one is never reaped)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        write_owner(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def reap_abandoned(
    pattern: str,
    base: str | Path | None = None,
    *,
    stop: Callable[[Path, dict], None] | None = None,
) -> list[Path]:
    """Remove every folder ``<base>/<pattern>`` (a glob; base: the process's temporary folder) that
    this user made and whose owner is gone (:func:`owner_alive`); the folders removed. Each is first
    claimed by a rename (one reaper wins it); ``stop`` then runs with its old path and the owner's
    record (a Ray cluster's processes, which name that path, must end before its folder goes). A
    folder without an owner record (being made, or not ours), a link, or one whose owner lives is
    never touched. A folder that cannot be judged or removed is logged and passed over: reaping
    never stops the caller."""
    root = Path(base or tempfile.gettempdir())
    for claimed in root.glob(f"{pattern}{CLAIMED_SUFFIX}"):  # a deletion cut short
        shutil.rmtree(claimed, ignore_errors=True)
    reaped = []
    for owner_file in sorted(root.glob(f"{pattern}/{OWNER_FILE}")):
        folder = owner_file.parent
        try:
            if folder.name.endswith(CLAIMED_SUFFIX) or folder.is_symlink():
                continue
            if folder.lstat().st_uid != os.getuid():
                continue
            owner = json.loads(owner_file.read_text())
            if not isinstance(owner, dict) or owner_alive(owner):
                continue
            claimed = folder.with_name(folder.name + CLAIMED_SUFFIX)
            os.rename(folder, claimed)  # FileNotFoundError: another reaper won it
            if stop is not None:
                stop(folder, owner)
            shutil.rmtree(claimed, ignore_errors=True)
        except FileNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - one folder must not stop the caller's start
            logger.warning("could not reap %s: %s", folder, exc)
            continue
        reaped.append(folder)
    if reaped:
        logger.warning("removed %d folder(s) whose owner process is gone: %s", len(reaped), ", ".join(map(str, reaped)))
    return reaped


def reap_abandoned_chromium_profiles(
    base: str | Path | None = None, *, host: str | None = None, now: float | None = None
) -> list[Path]:
    """Remove the browser profiles of the earlier layout (``stepwise-chromium-*``, made without an
    owner record; the Label Studio browser tests still make them) whose browser is gone: Chromium's
    own ``SingletonLock`` (a link to ``<host>-<pid>``) names a process of this host that no longer
    runs; or, without the lock, one untouched for :data:`UNLOCKED_PROFILE_AGE_S`."""
    import psutil

    host = host or os.uname().nodename
    now = time.time() if now is None else now
    reaped = []
    # the lock is a dangling link (its target names a process, not a file): glob would not see it
    for profile in sorted(Path(base or tempfile.gettempdir()).glob("stepwise-chromium-*")):
        try:
            if profile.is_symlink() or profile.lstat().st_uid != os.getuid():
                continue
            try:
                lock_host, _, pid = os.readlink(profile / "SingletonLock").rpartition("-")
            except FileNotFoundError:
                if now - profile.lstat().st_mtime < UNLOCKED_PROFILE_AGE_S:
                    continue
            else:
                if lock_host != host or not pid.isdigit() or psutil.pid_exists(int(pid)):
                    continue
            shutil.rmtree(profile, ignore_errors=True)
        except (OSError, OverflowError, ValueError) as exc:
            logger.warning("could not reap %s: %s", profile, exc)
            continue
        reaped.append(profile)
    return reaped
