"""Where things live on disk, and atomic Parquet writes.

Everything the project produces goes under ``STEPWISE_HOME`` (default ``.stepwise/`` in the
current directory). A Parquet file is written to a temporary name in the same folder and renamed
into place, so a reader never sees half a file and a crash never replaces good data with bad.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parent.parent


def stepwise_home() -> Path:
    """The output root: $STEPWISE_HOME, else ./.stepwise (created if missing)."""
    home = Path(os.environ.get("STEPWISE_HOME") or Path.cwd() / ".stepwise").resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def slug(text: str) -> str:
    """A file-name-safe form of an identifier (dataset keys are often paths)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")
    return cleaned[-120:] or "default"


@contextmanager
def atomic_path(path: Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that creates its own file (``torch.save``,
    ``pq.write_table``, ``np.save``): renamed onto ``path`` when the block ends, removed if it
    raises, so ``path`` is either the old file or the whole new one. Names are unique per call
    (process, thread and a random token), so two writers never share one. ``suffix`` keeps a
    required extension (``np.save`` appends ``.npy`` to a name without it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique_sibling(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o666) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file and an atomic rename.
    The file is created with ``mode`` (less the umask, as ``open`` does); 0o600 for secrets."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
    return path


def write_parquet_atomic(table: pa.Table, path: Path, *, row_group_size: int = 64_000) -> Path:
    """Write ``table`` to ``path`` (zstd) through a temporary file and an atomic rename."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=row_group_size)
    return path


@lru_cache(maxsize=1)
def git_revision() -> str:
    """The repository's commit (with +dirty when the tree has changes), or 'unknown' outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not sha:
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def replace_dir_atomic(target: Path, write: Callable[[Path], object]) -> None:
    """Write the folder ``target`` through ``write(staging)`` into a temporary sibling, then swap it
    in: a killed write leaves the old folder (or none), never a half one. The old folder goes to a
    name of its own before it is deleted, so one left by a killed delete never blocks a later save;
    both folders are made by ``mkdir``, so the new one has its mode (the umask applied)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _unique_sibling(target)
    staging.mkdir()
    old: Path | None = None
    try:
        write(staging)
        if target.exists():
            old = _unique_sibling(target, ".old")
            old.mkdir()
            os.replace(target, old)  # onto the empty folder just made: POSIX rename allows it
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _unique_sibling(path: Path, suffix: str = "") -> Path:
    """A hidden name beside ``path``, unique per call (process, thread and a random token)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}{suffix}")
