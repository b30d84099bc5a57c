"""Worker processes that die with their parent.

A pool worker whose parent is killed with SIGKILL gets no notice: it finishes its task, then blocks
forever writing the result to a pipe nobody reads. :func:`die_with_parent` is meant to be called
first thing in a worker (a ``ProcessPoolExecutor`` / ``multiprocessing.Pool`` ``initializer``, or
the top of a ``Process`` target):

* on Linux it asks the kernel to send the worker ``SIGKILL`` when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), which is immediate and needs no cooperation from the worker;
* everywhere, a daemon thread checks every ``poll_s`` seconds that the parent is still the one
  that started the worker (a dead parent's children are re-parented, so ``os.getppid()``
  changes) and ends the worker if not: the fallback where prctl is unavailable, and a second
  line of defence where it is.

Caveats: the death signal fires when the *thread* that forked the worker exits, not only the
process (Linux semantics): create pools from a thread that outlives them (the usual ``with
ProcessPoolExecutor(...)`` block in one function is fine). Under the ``forkserver`` start method
a worker's parent is the fork server, not the process that asked for it: pass no ``parent_pid``
there (the fork server dies with its own parent's pipe closing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEFAULT_POLL_S = 1.0

_watchdog_pid: int | None = None  # the process whose watchdog runs (a forked child inherits the value, not the thread)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Returns whether it took effect (False on other systems or when libc refuses)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_alive(parent_pid: int) -> bool:
    """Is the process that started us still our parent? (A dead parent's children are re-parented.)"""
    return os.getppid() == parent_pid


def _end_self(group: bool = False) -> None:
    # SIGKILL, not sys.exit: the worker may be blocked in a write or deep in C code, and nothing it
    # holds is worth cleaning up once its results have nowhere to go. With ``group`` the whole
    # process group goes (a worker that leads its own group, with the browser it started).
    if group:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(parent_pid: int, poll_s: float, group: bool) -> None:
    while True:
        if not parent_alive(parent_pid):
            _end_self(group)
        time.sleep(poll_s)


def die_with_parent(
    parent_pid: int | None = None, *, poll_s: float = DEFAULT_POLL_S, use_prctl: bool = True, kill_group: bool = False
) -> bool:
    """Make this (worker) process end when its parent dies; call it first in the worker.

    ``parent_pid`` is the parent's pid as the parent saw it (pass ``os.getpid()`` in the parent's
    ``initargs``); by default ``os.getppid()`` at the time of the call. When the parent is already
    gone (it died between forking and this call) the worker ends at once. Returns whether the
    kernel's parent-death signal is set (False: only the polling fallback watches).

    ``kill_group``: the watchdog kills the worker's whole process group (for a worker that called
    ``os.setsid`` and started a browser or adb: they go too). Workers started from short-lived
    threads should pass ``use_prctl=False`` (see the module's caveats)."""
    global _watchdog_pid
    expected = os.getppid() if parent_pid is None else parent_pid
    armed = set_parent_death_signal() if use_prctl else False
    # prctl only covers deaths after the call: the parent may have died in between.
    if not parent_alive(expected):
        _end_self(kill_group)
    if _watchdog_pid != os.getpid():
        _watchdog_pid = os.getpid()
        threading.Thread(
            target=_watch, args=(expected, poll_s, kill_group), name="parent-watchdog", daemon=True
        ).start()
    return armed
