"""The recordings' files as the demonstrations' import sees them: which files of a folder are
recordings, how a file's name is stored (losslessly, as readable text) and found again on disk,
which task a recording belongs to (the one it names, an override, or its nearest task folder),
and the content-derived episode id (see :mod:`envs.miniwob.demonstrations`)."""

from __future__ import annotations

import hashlib
import os
import re
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from envs.miniwob.recordings import (
    TASK_NAME,
)

DEMO_SUFFIXES = (".json.gz", ".json")


MAX_REASON_CHARS = 500


def stored_path(path: str | os.PathLike[str]) -> str:
    """A file name as the warehouse stores and shows it: UTF-8 text where the name is UTF-8, each
    other byte as ``\\xHH``, each backslash doubled (so the form is lossless: ``fs_path`` inverts it)."""
    raw = os.fsencode(path)
    out: list[str] = []
    position = 0
    while position < len(raw):
        try:
            text = raw[position:].decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append(raw[position : position + exc.start].decode("utf-8").replace("\\", "\\\\"))
            out.append("".join(f"\\x{b:02x}" for b in raw[position + exc.start : position + exc.end]))
            position += exc.end
            continue
        out.append(text.replace("\\", "\\\\"))
        break
    return "".join(out)


_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2})")


def fs_path(stored: str) -> str:
    """The file name on disk (``os.fsdecode`` form) behind a ``stored_path`` string."""
    parts: list[bytes] = []
    position = 0
    for match in _ESCAPE.finditer(stored):
        parts.append(stored[position : match.start()].encode("utf-8"))
        token = match.group(1)
        parts.append(b"\\" if token == "\\" else bytes([int(token[1:], 16)]))
        position = match.end()
    parts.append(stored[position:].encode("utf-8"))
    return os.fsdecode(b"".join(parts))


def clean_text(text: str) -> str:
    """Text safe to store (Arrow and DuckDB refuse lone surrogates), bounded in length."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_REASON_CHARS]


@cache
def known_task_ids() -> frozenset[str]:
    """MiniWoB++ task ids: the tasks of the installed ``miniwob`` package (its HTML pages) and
    those the project ships specs for. A folder name counts as a task only if it is one of these."""
    names: set[str] = set()
    spec = find_spec("miniwob")  # finds the package without importing it (its import registers gym envs)
    for location in (spec.submodule_search_locations or []) if spec else []:
        names.update(p.name.removesuffix(".html") for p in (Path(location) / "html" / "miniwob").glob("*.html"))
    spec_dir = Path(__file__).resolve().parent.parent / "task_specs" / "miniwob"
    names.update(p.stem for p in spec_dir.glob("*.yaml"))
    return frozenset(names)


def folder_task(rel_path: str, root_name: str) -> str | None:
    """The known task that the nearest folder between a file (``rel_path``, relative to the import
    root) and the root, the root included, is named after; None when no folder is."""
    folders = Path(rel_path).parent.parts
    known = known_task_ids()
    for name in [*reversed(folders), root_name]:
        if name in known:
            return name
    return None


def validate_task_override(task: str | None) -> str | None:
    """The ``task`` argument of an import, checked: None, or a known MiniWoB++ task id."""
    if task is None:
        return None
    if not isinstance(task, str) or not TASK_NAME.fullmatch(task) or task not in known_task_ids():
        raise ValueError(f"task {task!r} is not a known MiniWoB++ task id (see known_task_ids())")
    return task


def find_demo_files(root: Path) -> list[Path]:
    """All recordings under ``root`` (``*.json.gz`` and ``*.json``), in a stable order."""
    if not root.is_dir():
        raise FileNotFoundError(f"demonstrations folder not found: {root}")
    return sorted(p for p in root.rglob("*") if p.name.endswith(DEMO_SUFFIXES) and is_file(p))


def sample_per_task(rel_paths: list[str], max_per_task: int) -> list[str]:
    """At most ``max_per_task`` recordings of each task folder (a recording's parent folder),
    chosen by a hash of the file name: the same sample every run, spread over the batch folders
    rather than the first batch's files; returned in the input's order."""
    if max_per_task < 1:
        raise ValueError(f"max_files_per_task must be at least 1, not {max_per_task}")
    by_task: dict[str, list[str]] = {}
    for rel in rel_paths:
        by_task.setdefault(Path(rel).parent.name, []).append(rel)
    chosen = {
        rel
        for files in by_task.values()
        for rel in sorted(files, key=lambda r: hashlib.sha256(Path(r).name.encode()).hexdigest())[:max_per_task]
    }
    return [rel for rel in rel_paths if rel in chosen]


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def episode_id_for(task_id: str, recording_sha256: str) -> str:
    """Content-derived episode id: the task and the recording's hash (see the module docstring)."""
    return f"demo:{task_id}:{recording_sha256[:16]}"
