"""Where things live on disk, and atomic Parquet writes.

Everything the project produces goes under ``STEPWISE_HOME`` (default ``.stepwise/`` in the
current directory). A Parquet file is written to a temporary name in the same folder and renamed
into place, so a reader never sees half a file and a crash never replaces good data with bad.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
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


def write_parquet_atomic(table: pa.Table, path: Path, *, row_group_size: int = 64_000) -> Path:
    """Write ``table`` to ``path`` through a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp_name, compression="zstd", row_group_size=row_group_size)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
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
