"""Finding secrets where they must not be: Parquet, the DuckDB catalog, logs, Dagster storage.

Compressed formats hide a secret from a plain byte search (Parquet pages are zstd-compressed,
DuckDB compresses strings), so those files are decoded first: Parquet through pyarrow, DuckDB
by reading every table; anything else is searched as bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb
import pyarrow.parquet as pq


def _parquet_text(path: Path) -> bytes:
    table = pq.read_table(path)
    return json.dumps(table.to_pylist(), default=str).encode() + str(table.schema.metadata or "").encode()


def _duckdb_text(path: Path) -> bytes:
    con = duckdb.connect(str(path), read_only=True)
    try:
        chunks = []
        for schema, name, kind in con.execute(
            "SELECT table_schema, table_name, table_type FROM information_schema.tables"
        ).fetchall():
            if kind != "BASE TABLE":
                continue
            rows = con.execute(f'SELECT * FROM "{schema}"."{name}"').fetchall()
            chunks.append(json.dumps(rows, default=str))
        return "\n".join(chunks).encode()
    finally:
        con.close()


def file_text(path: Path) -> bytes:
    """The searchable content of a file (decoded when it is Parquet or DuckDB)."""
    try:
        if path.suffix == ".parquet":
            return _parquet_text(path)
        if path.suffix == ".duckdb":
            return _duckdb_text(path)
    except Exception:  # noqa: BLE001 - unreadable as such (locked, half-written): fall back to bytes
        pass
    try:
        return path.read_bytes()
    except OSError:
        return b""


def files_containing(root: Path, secrets: Sequence[str], *, exclude: Iterable[Path] = ()) -> list[str]:
    """Files under ``root`` (not under any ``exclude`` folder) that contain one of ``secrets``."""
    wanted = [s.encode() for s in secrets if s]
    skipped = [Path(e).resolve() for e in exclude]
    found: list[str] = []
    if not wanted or not root.exists():
        return found
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        resolved = path.resolve()
        if any(resolved.is_relative_to(s) for s in skipped):
            continue
        content = file_text(path)
        if any(w in content for w in wanted):
            found.append(str(path.relative_to(root)))
    return found
