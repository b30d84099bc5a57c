"""The demonstrations' import, in its worker processes: each chunk of recording files becomes
Arrow record batches of episodes and steps, with one ``source_files`` row per file and a
quarantine row for whatever could not be imported (see :mod:`envs.miniwob.demonstrations`).

JSON parsing dominates, so the import runs these in processes, not threads."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from envs.miniwob.demo_files import (
    clean_text,
    episode_id_for,
    folder_task,
    stored_path,
)
from envs.miniwob.recordings import (
    RecordingError,
    parse_recording_json,
    read_recording_bytes,
    recorded_task_name,
    recording_to_episode,
)
from envs.process import die_with_parent
from envs.tasks import TASK_VARIANT_FIELD
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES, STEPS, append_step


@dataclass
class Chunk:
    episodes: list[pa.RecordBatch]
    steps: list[pa.RecordBatch]
    files: list[dict]
    quarantine: list[dict]


# Set in each worker by init_worker: recordings another import root already brought in (the
# worker marks them duplicates without converting them).
_already_imported: frozenset[str] = frozenset()


def init_worker(parent_pid: int | None, already_imported: frozenset[str]) -> None:
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


def convert_chunk(
    root_str: str, rel_paths: list[str], created_at: datetime, run_id: str | None, task: str | None = None
) -> Chunk:
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
    return Chunk(episode_batches, step_batches, files, quarantine)


def _quarantine_row(source_file: str, root_key: str, event_index: int | None, severity: str, reason: str) -> dict:
    return {
        "source_file": source_file,
        "import_root": root_key,
        "event_index": event_index,
        "severity": severity,
        "reason": clean_text(reason),
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
        file_row["link_target"] = stored_path(relative_or_absolute(link_target, root))
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


def relative_or_absolute(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def in_chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
