"""Import a folder of recorded MiniWoB++ demonstrations into the warehouse.

Files are converted in parallel worker processes (JSON parsing dominates, so processes, not
threads), in chunks that come back as Arrow record batches. Every file ends up in exactly one of
three states, recorded in the ``source_files`` table:

* ``imported``: it became an episode;
* ``duplicate``: the same recording (same decompressed bytes, ``recording_sha256``) as another
  file, whose episode it shares (``episode_id``; ``link_target`` names that file): a git-style
  link file pointing to another file of the folder, a byte-identical copy under another name, or
  a recording another import root brought into the warehouse first (``link_target`` is then that
  file's absolute path, ``<import_root>/<source_file>``);
* ``quarantined``: it could not be imported; ``quarantine`` says why (corrupted gzip, malformed
  JSON, over a size or nesting bound, no task, no states, ...). Event-level problems inside
  imported files are listed there too.

Bad input never aborts the import: whatever goes wrong with one file (including errors nobody
foresaw) is that file's quarantine reason. Only a problem with the whole batch stops it: the
folder does not exist or holds no recordings, the warehouse cannot be written.

**Task.** An episode's task is the one the recording names (``taskName``); recordings that name
none (the first MiniWoB++ batches) take the ``task`` argument when given (validated: a known task
id), else the nearest folder between the file and the import root (the root included) that is a
known MiniWoB++ task (``known_task_ids``); with neither, the file is quarantined. When that folder
names a known task other than the episode's, the episode records it as its variant,
``task_fields`` key ``task_variant`` (e.g. recordings under ``email-inbox-nl-turk/`` that call
themselves ``email-inbox``), so that variants never merge silently.

**Identity.** An episode is its recording's content: ``demo:<task>:<first 16 hex of the
recording's sha256>``, whatever folder it came through. A recording already in the warehouse
from another import root is a ``duplicate`` here, and its episode stays with the import that
first brought it (owner: the earliest ``created_at``, which a re-import keeps for the episodes it
already held). Re-importing a folder replaces its previous version, never adds to it.

**File names** are stored losslessly and readably (``stored_path``): as UTF-8 text, each byte
that is not UTF-8 written ``\\xHH`` and each backslash doubled; ``fs_path`` turns the stored form
back into the name on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from envs.miniwob.recordings import (
    TASK_NAME,
    RecordingError,
    parse_recording_json,
    read_recording_bytes,
    recorded_task_name,
    recording_to_episode,
)
from envs.process import die_with_parent
from envs.tasks import TASK_VARIANT_FIELD
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.model import KNOWN_ACTION_TYPES
from warehouse.plotting import Markdown, figure_markdown, pyplot
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES, QUARANTINE, SOURCE_FILES, STEPS, append_step, same_type
from warehouse.storage import REPO_ROOT, git_revision

IMPORTER_VERSION = "demos-4"
DEMO_SUFFIXES = (".json.gz", ".json")
ASSET_NAME = "human_demonstrations"
MAX_REASON_CHARS = 500


@dataclass
class ImportReport:
    import_root: str
    files: int = 0
    imported: int = 0
    duplicates: int = 0
    duplicates_of_other_imports: int = 0
    quarantined: int = 0
    episodes: int = 0
    successes: int = 0
    failures: int = 0
    steps: int = 0
    untyped_steps: int = 0
    event_problems: int = 0
    tasks: int = 0
    variants: int = 0
    seconds: float = 0.0
    materialization_id: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def untyped_share(self) -> float:
        return self.untyped_steps / self.steps if self.steps else 0.0


# -- file names and tasks ---------------------------------------------------------------------


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


def _clean_text(text: str) -> str:
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
    return sorted(p for p in root.rglob("*") if p.name.endswith(DEMO_SUFFIXES) and _is_file(p))


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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def episode_id_for(task_id: str, recording_sha256: str) -> str:
    """Content-derived episode id: the task and the recording's hash (see the module docstring)."""
    return f"demo:{task_id}:{recording_sha256[:16]}"


# -- workers ----------------------------------------------------------------------------------


@dataclass
class _Chunk:
    episodes: list[pa.RecordBatch]
    steps: list[pa.RecordBatch]
    files: list[dict]
    quarantine: list[dict]


# Set in each worker by _init_worker: recordings another import root already brought in (the
# worker marks them duplicates without converting them).
_already_imported: frozenset[str] = frozenset()


def _init_worker(parent_pid: int | None, already_imported: frozenset[str]) -> None:
    """Pool initializer: die with the importing process; know which recordings to skip."""
    global _already_imported
    if parent_pid is not None:
        die_with_parent(parent_pid)
    _already_imported = already_imported


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert_chunk(
    root_str: str, rel_paths: list[str], created_at: datetime, run_id: str | None, task: str | None = None
) -> _Chunk:
    """Worker: convert some files (``rel_paths`` in ``os.fsdecode`` form). Pure apart from reading them."""
    root = Path(root_str)
    root_key = stored_path(root_str)
    converted: list[tuple[dict, dict, dict[str, list]]] = []  # (file row, episode row, step columns)
    files: list[dict] = []
    quarantine: list[dict] = []
    for rel in rel_paths:
        path = root / rel
        stored = stored_path(rel)
        file_row: dict[str, Any] = {
            "source_file": stored,
            "import_root": root_key,
            "file_sha256": None,
            "recording_sha256": None,
            "link_target": None,
            "status": "quarantined",
            "episode_id": None,
            "n_steps": None,
        }
        files.append(file_row)
        try:
            episode_row, steps, problems = _convert_file(path, rel, root, file_row, created_at, run_id, task)
        except RecordingError as exc:
            quarantine.append(_quarantine_row(stored, root_key, None, "file", str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - whatever one file does, it is that file's reason
            reason = f"cannot convert: {type(exc).__name__}: {exc}"
            quarantine.append(_quarantine_row(stored, root_key, None, "file", reason))
            continue
        if episode_row is None:
            continue  # a duplicate: nothing to convert
        converted.append((file_row, episode_row, steps))
        for problem in problems:
            quarantine.append(_quarantine_row(stored, root_key, problem.event_index, "event", problem.reason))
    episode_batches, step_batches = _to_batches(converted, quarantine, root_key)
    return _Chunk(episode_batches, step_batches, files, quarantine)


def _quarantine_row(source_file: str, root_key: str, event_index: int | None, severity: str, reason: str) -> dict:
    return {
        "source_file": source_file,
        "import_root": root_key,
        "event_index": event_index,
        "severity": severity,
        "reason": _clean_text(reason),
    }


def _convert_file(
    path: Path,
    rel: str,
    root: Path,
    file_row: dict[str, Any],
    created_at: datetime,
    run_id: str | None,
    task: str | None,
) -> tuple[dict | None, dict[str, list], list]:
    """One file -> (episode row, step columns, event problems), or (None, ...) for a duplicate.
    Fills in ``file_row``; raises RecordingError (or anything else) for a file to quarantine."""
    try:
        file_row["file_sha256"] = _file_sha256(path)
    except OSError as exc:
        raise RecordingError(f"cannot read file: {exc.strerror or exc}") from None
    data, link_target = read_recording_bytes(path)
    recording_sha = hashlib.sha256(data).hexdigest()
    file_row["recording_sha256"] = recording_sha
    if link_target is not None:
        file_row["link_target"] = stored_path(_relative_or_absolute(link_target, root))
        if link_target.is_relative_to(root):
            # The target is imported on its own; this file names the same recording.
            file_row["status"] = "duplicate"
            return None, {}, []
    if recording_sha in _already_imported:
        file_row["status"] = "duplicate"  # the parent fills in whose
        return None, {}, []
    recording = parse_recording_json(data)
    from_folder = folder_task(rel, root.name)
    task_id = recorded_task_name(recording) or task or from_folder
    if task_id is None:
        raise RecordingError(
            "no task: the recording names none ('taskName') and no folder on its path is a known MiniWoB++ task"
        )
    episode = recording_to_episode(recording, task_hint=task_id)
    if not episode.steps:
        raise RecordingError("recording has no actions (empty episode)")
    fields = dict(episode.fields or {})
    if from_folder is not None and from_folder != episode.task_id:
        fields[TASK_VARIANT_FIELD] = from_folder
    episode_id = episode_id_for(episode.task_id, recording_sha)
    episode_row = {
        "episode_id": episode_id,
        "task_id": episode.task_id,
        "task_family": "miniwob",
        "instruction": episode.instruction,
        "task_fields": json.dumps(fields, sort_keys=True) if fields else None,
        "source": "human_demo",
        "purpose": EpisodePurpose.DEMONSTRATION.value,
        "parent_episode_id": None,
        "policy_id": "human",
        "env_backend": "miniwob",
        "seed": None,
        "success": episode.success,
        "outcome_reward": episode.raw_reward,
        "decayed_reward": episode.decayed_reward,
        "n_steps": len(episode.steps),
        "duration_ms": episode.duration_ms,
        "source_file": file_row["source_file"],
        "source_sha256": recording_sha,
        "import_root": file_row["import_root"],
        "created_at": created_at,
        "run_id": run_id,
    }
    steps: dict[str, list] = {name: [] for name in STEPS.names}
    for idx, step in enumerate(episode.steps):
        append_step(
            steps,
            episode_id,
            idx,
            step.action,
            step.screen,
            done=idx == len(episode.steps) - 1,
            time_ms=step.time_ms,
            raw_event_first=step.raw_event_first,
            raw_event_last=step.raw_event_last,
            problem=step.problem,
        )
    file_row.update(status="imported", episode_id=episode_id, n_steps=len(episode.steps))
    return episode_row, steps, episode.problems


_ARROW_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


def _to_batches(
    converted: list[tuple[dict, dict, dict[str, list]]], quarantine: list[dict], root_key: str
) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    """Arrow batches of the converted files: one per chunk, or, when some value does not fit the
    schema (a lone surrogate in a text, a number out of range), one per file, the misfits quarantined."""
    try:
        return [_episode_batch([e for _, e, _ in converted])], [_steps_batch([s for _, _, s in converted])]
    except _ARROW_ERRORS:
        pass
    episode_batches, step_batches = [], []
    for file_row, episode_row, steps in converted:
        try:
            episode_batch, step_batch = _episode_batch([episode_row]), _steps_batch([steps])
        except _ARROW_ERRORS as exc:
            stored = file_row["source_file"]
            quarantine[:] = [q for q in quarantine if q["source_file"] != stored]  # its event rows go too
            quarantine.append(_quarantine_row(stored, root_key, None, "file", f"cannot store the episode: {exc}"))
            file_row.update(status="quarantined", episode_id=None, n_steps=None)
            continue
        episode_batches.append(episode_batch)
        step_batches.append(step_batch)
    return episode_batches, step_batches


def _episode_batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=EPISODES)


def _steps_batch(columns: list[dict[str, list]]) -> pa.RecordBatch:
    merged: dict[str, list] = {name: [] for name in STEPS.names}
    for steps in columns:
        for name in STEPS.names:
            merged[name].extend(steps[name])
    return pa.RecordBatch.from_pydict(merged, schema=STEPS)


def _relative_or_absolute(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- the import -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Earlier:
    """A recording another import root brought in first."""

    episode_id: str
    path: str  # <import_root>/<source_file>, stored form


def _recordings_in_warehouse(warehouse: Warehouse, root_key: str) -> tuple[dict[str, _Earlier], dict[str, datetime]]:
    """(recordings whose episode belongs to another import root, by recording hash; when this root
    first imported each recording it holds now). The owner of a recording held by several roots
    is the one that imported it first (earliest ``created_at``, then the root's name)."""
    rows = warehouse.query(
        "SELECT source_sha256, episode_id, import_root, source_file, created_at FROM episodes "
        "WHERE source = 'human_demo' AND source_sha256 IS NOT NULL"
    ).to_pylist()
    own = {r["source_sha256"]: r["created_at"] for r in rows if r["import_root"] == root_key}
    earliest: dict[str, dict] = {}
    for r in rows:
        if r["import_root"] == root_key:
            continue
        best = earliest.get(r["source_sha256"])
        if best is None or _first_import(r["created_at"], r["import_root"]) < _first_import(
            best["created_at"], best["import_root"]
        ):
            earliest[r["source_sha256"]] = r
    others = {
        sha: _Earlier(r["episode_id"], f"{r['import_root']}/{r['source_file']}")
        for sha, r in earliest.items()
        if sha not in own or _first_import(r["created_at"], r["import_root"]) < _first_import(own[sha], root_key)
    }
    return others, {sha: when for sha, when in own.items() if when is not None}


def _first_import(created_at: datetime | None, import_root: str | None) -> tuple[datetime, str]:
    """Sort key of "who imported a recording first" (rows without a time come last)."""
    return (created_at or datetime.max.replace(tzinfo=UTC), import_root or "")


def import_demonstrations(
    root: Path | str,
    warehouse: Warehouse,
    *,
    run_id: str | None = None,
    workers: int | None = None,
    chunk_size: int = 64,
    task: str | None = None,
    max_files_per_task: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> ImportReport:
    """Convert every recording under ``root`` and publish episodes, steps, source_files and
    quarantine as one new version of the dataset keyed by ``root`` (atomic: all or nothing).

    ``task``: the task of recordings that do not name theirs (a known MiniWoB++ task id), for
    folders not named after the task. ``max_files_per_task``: a fixed sample of each task folder
    (:func:`sample_per_task`; a quick run such as ``stepwise demo``), every recording when None.
    Bad files are quarantined; only a missing folder, a bad ``task`` or an unwritable warehouse
    raise."""
    started = time.perf_counter()
    task = validate_task_override(task)
    root = Path(root).resolve()
    root_key = stored_path(root)
    rel_paths = [str(p.relative_to(root)) for p in find_demo_files(root)]
    if not rel_paths:
        raise FileNotFoundError(f"no *.json or *.json.gz demonstrations under {root_key}")
    if max_files_per_task is not None:
        rel_paths = sample_per_task(rel_paths, max_files_per_task)
    workers = workers or min(2, os.cpu_count() or 1)
    created_at = datetime.now(UTC)
    report = ImportReport(import_root=root_key, files=len(rel_paths))
    earlier, first_imported = _recordings_in_warehouse(warehouse, root_key)

    chunks = _convert_all(
        root,
        rel_paths,
        created_at=created_at,
        run_id=run_id,
        task=task,
        workers=workers,
        chunk_size=chunk_size,
        already=frozenset(earlier),
        progress=progress,
    )
    converted = _merge_chunks(chunks)
    keep = _keep_imported_rows(converted, earlier)
    converted.episodes = _keep_first_import_times(converted.episodes, first_imported, created_at)

    materialization, outputs = _publish_import(
        warehouse, converted, root_key=root_key, run_id=run_id, workers=workers, task=task
    )
    _fill_report(report, converted, keep=keep, earlier=earlier, materialization=materialization, outputs=outputs)
    report.seconds = time.perf_counter() - started
    if log:
        log(json.dumps({k: v for k, v in report.__dict__.items() if k != "outputs"}, default=str))
    return report


@dataclass
class _Converted:
    """What the workers made of the files, put together: episode and step tables, file and quarantine rows."""

    episodes: pa.Table
    steps: pa.Table
    files: list[dict]
    quarantine: list[dict]


def _convert_all(
    root: Path,
    rel_paths: list[str],
    *,
    created_at: datetime,
    run_id: str | None,
    task: str | None,
    workers: int,
    chunk_size: int,
    already: frozenset[str],
    progress: Callable[[int, int], None] | None,
) -> list[_Chunk]:
    """Convert the files chunk by chunk, in this process (``workers <= 1``) or in worker processes."""
    batches = list(_chunks(rel_paths, chunk_size))
    args = ([str(root)] * len(batches), batches, [created_at] * len(batches), [run_id] * len(batches))
    if workers <= 1:
        _init_worker(None, already)
        try:
            results: Iterator[_Chunk] = (_convert_chunk(*a, task) for a in zip(*args, strict=True))
            return _collect(results, batches, progress, len(rel_paths))
        finally:
            _init_worker(None, frozenset())  # a later import in this process must not skip these recordings
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(os.getpid(), already))
    with pool:
        results = pool.map(_convert_chunk, *args, [task] * len(batches))
        return _collect(results, batches, progress, len(rel_paths))


def _merge_chunks(chunks: list[_Chunk]) -> _Converted:
    """Concatenate the chunks' batches into tables and their file and quarantine rows into lists."""
    return _Converted(
        episodes=pa.Table.from_batches([b for c in chunks for b in c.episodes], schema=EPISODES),
        steps=pa.Table.from_batches([b for c in chunks for b in c.steps], schema=STEPS),
        files=[row for c in chunks for row in c.files],
        quarantine=[row for c in chunks for row in c.quarantine],
    )


def _keep_imported_rows(converted: _Converted, earlier: dict[str, _Earlier]) -> list[dict]:
    """Settle duplicates and drop the episode and step rows of files that are duplicates; returns the imported."""
    files = converted.files
    keep = _resolve_duplicates(files, converted.quarantine, earlier)
    # Episode and step rows follow the order of the files the workers converted.
    was_converted = [row for row in files if row.get("_was_converted")]
    mask = [row["status"] == "imported" for row in was_converted]
    converted.episodes = converted.episodes.filter(pa.array(mask, type=pa.bool_()))
    converted.steps = converted.steps.filter(
        pa.array(
            [ok for row, ok in zip(was_converted, mask, strict=True) for _ in range(row["n_steps"])], type=pa.bool_()
        )
    )
    for row in files:
        row.pop("_was_converted", None)
    return keep


def _publish_import(
    warehouse: Warehouse, converted: _Converted, *, root_key: str, run_id: str | None, workers: int, task: str | None
) -> tuple[Materialization, list[TableOutput]]:
    """Stage the four tables as one new version of the root's dataset and publish them together."""
    files = converted.files
    materialization = Materialization(
        asset=ASSET_NAME,
        run_id=run_id,
        code_version=f"{IMPORTER_VERSION}+{git_revision()}",
        parameters={"import_root": root_key, "workers": workers, "task": task},
        inputs=[
            LineageInput(kind="file", path=f"{root_key}/{f['source_file']}", version=f["file_sha256"]) for f in files
        ],
    )
    dataset = root_key
    outputs: list[TableOutput] = [
        warehouse.stage_table("episodes", dataset, converted.episodes, materialization),
        warehouse.stage_table("steps", dataset, converted.steps, materialization),
        warehouse.stage_table(
            "source_files", dataset, pa.Table.from_pylist(files, schema=SOURCE_FILES), materialization
        ),
        warehouse.stage_table(
            "quarantine", dataset, pa.Table.from_pylist(converted.quarantine, schema=QUARANTINE), materialization
        ),
    ]
    warehouse.publish(materialization, outputs)
    return materialization, outputs


def _fill_report(
    report: ImportReport,
    converted: _Converted,
    *,
    keep: list[dict],
    earlier: dict[str, _Earlier],
    materialization: Materialization,
    outputs: list[TableOutput],
) -> None:
    """Record in ``report`` what the import published: counts of files, episodes, steps and problems."""
    episodes, steps, files, quarantine = converted.episodes, converted.steps, converted.files, converted.quarantine
    report.materialization_id = materialization.materialization_id
    report.outputs = {o.table_name: str(o.path) for o in outputs}
    report.episodes = episodes.num_rows
    report.imported = len(keep)
    report.duplicates = sum(f["status"] == "duplicate" for f in files)
    report.duplicates_of_other_imports = sum(
        f["status"] == "duplicate" and f["recording_sha256"] in earlier for f in files
    )
    report.quarantined = sum(f["status"] == "quarantined" for f in files)
    # pyarrow.compute generates its kernels (sum, equal, ...) at import time: its typing does not list them.
    report.successes = int(pc.sum(episodes["success"].cast(pa.int64())).as_py() or 0)  # type: ignore[attr-defined]
    report.failures = report.episodes - report.successes
    report.steps = steps.num_rows
    unknown = pc.equal(steps["action_type"], "UNKNOWN")  # type: ignore[attr-defined]
    report.untyped_steps = int(pc.sum(unknown.cast(pa.int64())).as_py() or 0)  # type: ignore[attr-defined]
    report.event_problems = sum(q["severity"] == "event" for q in quarantine)
    report.tasks = len(set(episodes["task_id"].to_pylist()))
    report.variants = sum(
        TASK_VARIANT_FIELD in json.loads(f) for f in episodes["task_fields"].to_pylist() if f is not None
    )
    report.quarantine_reasons = _quarantine_reasons(quarantine)


def _quarantine_reasons(quarantine: list[dict]) -> dict[str, int]:
    """How many files were quarantined for each kind of reason (the text before its first colon, digits as N)."""
    reasons: dict[str, int] = {}
    for q in quarantine:
        if q["severity"] == "file":
            key = re.sub(r"\d+", "N", q["reason"].split(":")[0])
            reasons[key] = reasons.get(key, 0) + 1
    return reasons


def _resolve_duplicates(files: list[dict], quarantine: list[dict], earlier: dict[str, _Earlier]) -> list[dict]:
    """Settle which file holds each recording, in path order; returns the imported files.

    A recording another root brought in first is a duplicate of that root's file; of byte-identical
    files in this import, the first (in path order) is imported and the others are duplicates of
    it, even one quarantined for a reason of its place (no task from its folder); link files share
    the episode of the file they point to."""
    first_by_recording: dict[str, dict] = {}
    for row in files:
        if row["status"] == "imported":
            row["_was_converted"] = True
            first = first_by_recording.setdefault(row["recording_sha256"], row)
            if first is not row:
                row.update(status="duplicate", link_target=first["source_file"], episode_id=first["episode_id"])
    settled_elsewhere: set[str] = set()
    for row in files:
        sha = row["recording_sha256"]
        if row["status"] == "duplicate" and sha in earlier and not row["link_target"]:
            row.update(episode_id=earlier[sha].episode_id, link_target=earlier[sha].path)
        elif row["status"] == "quarantined" and sha is not None and sha in first_by_recording:
            first = first_by_recording[sha]
            row.update(status="duplicate", link_target=first["source_file"], episode_id=first["episode_id"])
            settled_elsewhere.add(row["source_file"])
    if settled_elsewhere:
        quarantine[:] = [
            q for q in quarantine if not (q["severity"] == "file" and q["source_file"] in settled_elsewhere)
        ]
    episode_by_file = {f["source_file"]: f["episode_id"] for f in files if f["episode_id"] is not None}
    for row in files:
        if row["status"] == "duplicate" and row["episode_id"] is None:
            if row["recording_sha256"] in earlier:
                row["episode_id"] = earlier[row["recording_sha256"]].episode_id
            elif row["link_target"]:
                row["episode_id"] = episode_by_file.get(row["link_target"])
    return [row for row in files if row["status"] == "imported"]


def _keep_first_import_times(episodes: pa.Table, first_imported: dict[str, datetime], now: datetime) -> pa.Table:
    """An episode this root already held keeps the time it was first imported (``created_at``):
    which import brought a recording first decides who owns it, so re-imports must not reset it."""
    if not first_imported or episodes.num_rows == 0:
        return episodes
    times = [first_imported.get(sha, now) for sha in episodes["source_sha256"].to_pylist()]
    column = EPISODES.field("created_at")
    return episodes.set_column(episodes.schema.get_field_index("created_at"), column, pa.array(times, type=column.type))


def _collect(
    results: Iterable[_Chunk], batches: list[list[str]], progress: Callable[[int, int], None] | None, total: int
) -> list[_Chunk]:
    chunks = []
    done = 0
    for chunk, batch in zip(results, batches, strict=True):
        chunks.append(chunk)
        done += len(batch)
        if progress:
            progress(done, total)
    return chunks


# -- defaults, the success plot and the checks of the imported demonstrations -------------------

DEFAULT_DEMOS_DIR = REPO_ROOT.parent / "shared" / "data" / "miniwob-demos"
MAX_UNTYPED_SHARE = 0.02


def default_demos_dir() -> str:
    """$STEPWISE_DEMOS_DIR, else the shared demonstrations next to the repository."""
    return os.environ.get("STEPWISE_DEMOS_DIR", str(DEFAULT_DEMOS_DIR))


def success_by_task_plot(warehouse: Warehouse, import_root: str) -> Markdown:
    """Successes and failures per task of one import as a horizontal bar chart."""
    rows = warehouse.query(
        "SELECT task_id, count(*) FILTER (WHERE success) AS ok, count(*) FILTER (WHERE NOT success) AS failed "
        "FROM episodes WHERE import_root = ? GROUP BY task_id ORDER BY ok + failed",
        [import_root],
    ).to_pylist()
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, max(3, 0.18 * len(rows))))
    tasks = [r["task_id"] for r in rows]
    ax.barh(tasks, [r["ok"] for r in rows], color="#3a7", label="success")
    ax.barh(tasks, [r["failed"] for r in rows], left=[r["ok"] for r in rows], color="#d54", label="failure")
    ax.set_xscale("log")
    ax.set_xlabel("episodes (log scale)")
    ax.tick_params(axis="y", labelsize=6)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = warehouse.home / "plots" / "human_demonstrations_success_by_task.png"
    return figure_markdown(fig, path, "success and failure per task")


def check_schema(warehouse: Warehouse) -> CheckOutcome:
    """The ``episodes`` and ``steps`` views have the documented columns and types."""
    problems = []
    with warehouse.connect(read_only=True) as con:
        for view, schema in (("episodes", EPISODES), ("steps", STEPS)):
            actual = con.sql(f"SELECT * FROM {view} LIMIT 0").to_arrow_table().schema
            for fld in schema:
                if fld.name not in actual.names:
                    problems.append(f"{view}.{fld.name} missing")
                elif not same_type(actual.field(fld.name).type, fld.type):
                    problems.append(f"{view}.{fld.name}: {actual.field(fld.name).type} != {fld.type}")
    return CheckOutcome(not problems, {"problems": problems})


def check_no_empty_episodes(warehouse: Warehouse) -> CheckOutcome:
    """Every demonstration has at least one step, and ``n_steps`` matches the steps table."""
    row = warehouse.query(
        """
        SELECT count(*) FILTER (WHERE e.n_steps = 0 OR s.n IS NULL) AS empty,
               count(*) FILTER (WHERE s.n IS NOT NULL AND s.n <> e.n_steps) AS mismatched
        FROM episodes e LEFT JOIN (SELECT episode_id, count(*) AS n FROM steps GROUP BY 1) s USING (episode_id)
        WHERE e.source = 'human_demo'
        """
    ).to_pylist()[0]
    return CheckOutcome(
        row["empty"] == 0 and row["mismatched"] == 0, {"empty": row["empty"], "n_steps_mismatch": row["mismatched"]}
    )


def check_action_types_known(warehouse: Warehouse) -> CheckOutcome:
    """Action types are canonical, and untyped (UNKNOWN) steps stay under MAX_UNTYPED_SHARE."""
    rows = warehouse.query(
        "SELECT action_type, count(*) AS n FROM steps JOIN episodes USING (episode_id) "
        "WHERE source = 'human_demo' GROUP BY 1"
    ).to_pylist()
    counts = {r["action_type"]: r["n"] for r in rows}
    total = sum(counts.values())
    foreign = sorted(set(counts) - KNOWN_ACTION_TYPES - {"UNKNOWN"})
    untyped = counts.get("UNKNOWN", 0) / total if total else 1.0
    return CheckOutcome(
        not foreign and untyped < MAX_UNTYPED_SHARE and total > 0,
        {"counts": counts, "untyped_share": float(untyped), "foreign_types": foreign},
    )


def check_success_and_failure(warehouse: Warehouse) -> CheckOutcome:
    """Both successful and failed demonstrations are present (failures matter for labels)."""
    row = warehouse.query(
        "SELECT count(*) FILTER (WHERE success) AS ok, count(*) FILTER (WHERE NOT success) AS failed "
        "FROM episodes WHERE source = 'human_demo'"
    ).to_pylist()[0]
    ok, failed = row["ok"], row["failed"]
    return CheckOutcome(
        ok > 0 and failed > 0, {"successes": ok, "failures": failed, "success_rate": float(ok / max(1, ok + failed))}
    )
