"""Import a folder of recorded MiniWoB++ demonstrations into the warehouse.

Files are converted in parallel worker processes (JSON parsing dominates, so processes, not
threads), in chunks that come back as Arrow record batches. Every file ends up in exactly one of
three states, recorded in the ``source_files`` table:

* ``imported``: it became an episode;
* ``duplicate``: same recording as a file already imported (git-style link files pointing to
  another file of the folder, or byte-identical recordings); its episode is the original's;
* ``quarantined``: it could not be imported; ``quarantine`` says why (corrupted gzip, malformed
  JSON, no states, ...). Event-level problems inside imported files are listed there too.

Episode ids are derived from the recording's content, so re-importing a folder replaces its
previous version instead of adding duplicates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from envs.miniwob.recordings import RecordingError, parse_recording_json, read_recording_bytes, recording_to_episode
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.figures import Markdown, figure_markdown, pyplot
from warehouse.model import KNOWN_ACTION_TYPES
from warehouse.schema import EPISODES, QUARANTINE, SOURCE_FILES, STEPS, append_step, same_type
from warehouse.storage import REPO_ROOT, git_revision

IMPORTER_VERSION = "demos-3"
DEMO_SUFFIXES = (".json.gz", ".json")
ASSET_NAME = "human_demonstrations"


@dataclass
class ImportReport:
    import_root: str
    files: int = 0
    imported: int = 0
    duplicates: int = 0
    quarantined: int = 0
    episodes: int = 0
    successes: int = 0
    failures: int = 0
    steps: int = 0
    untyped_steps: int = 0
    event_problems: int = 0
    tasks: int = 0
    seconds: float = 0.0
    materialization_id: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def untyped_share(self) -> float:
        return self.untyped_steps / self.steps if self.steps else 0.0


def find_demo_files(root: Path) -> list[Path]:
    """All recordings under ``root`` (``*.json.gz`` and ``*.json``), in a stable order."""
    if not root.is_dir():
        raise FileNotFoundError(f"demonstrations folder not found: {root}")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(DEMO_SUFFIXES))


def episode_id_for(task_id: str, recording_sha256: str) -> str:
    return f"demo:{task_id}:{recording_sha256[:16]}"


@dataclass
class _Chunk:
    episodes: pa.RecordBatch
    steps: pa.RecordBatch
    files: list[dict]
    quarantine: list[dict]


def _convert_chunk(root_str: str, rel_paths: list[str], created_at: datetime, run_id: str | None) -> _Chunk:
    """Worker: convert some files. Pure apart from reading them."""
    root = Path(root_str)
    episodes: dict[str, list] = {name: [] for name in EPISODES.names}
    steps: dict[str, list] = {name: [] for name in STEPS.names}
    files: list[dict] = []
    quarantine: list[dict] = []
    for rel in rel_paths:
        path = root / rel
        file_row: dict[str, Any] = {
            "source_file": rel,
            "import_root": root_str,
            "file_sha256": None,
            "recording_sha256": None,
            "link_target": None,
            "status": "quarantined",
            "episode_id": None,
            "n_steps": None,
        }
        files.append(file_row)
        try:
            file_row["file_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            data, link_target = read_recording_bytes(path)
            recording_sha = hashlib.sha256(data).hexdigest()
            file_row["recording_sha256"] = recording_sha
            if link_target is not None:
                file_row["link_target"] = _relative_or_absolute(link_target, root)
                if link_target.is_relative_to(root):
                    # The target is imported on its own; this file names the same recording.
                    file_row["status"] = "duplicate"
                    continue
            episode = recording_to_episode(parse_recording_json(data), task_hint=path.parent.name)
            if not episode.steps:
                raise RecordingError("recording has no actions (empty episode)")
        except RecordingError as exc:
            quarantine.append(
                {
                    "source_file": rel,
                    "import_root": root_str,
                    "event_index": None,
                    "severity": "file",
                    "reason": str(exc),
                }
            )
            continue
        episode_id = episode_id_for(episode.task_id, recording_sha)
        file_row.update(status="imported", episode_id=episode_id, n_steps=len(episode.steps))
        for problem in episode.problems:
            quarantine.append(
                {
                    "source_file": rel,
                    "import_root": root_str,
                    "event_index": problem.event_index,
                    "severity": "event",
                    "reason": problem.reason,
                }
            )
        row = {
            "episode_id": episode_id,
            "task_id": episode.task_id,
            "task_family": "miniwob",
            "instruction": episode.instruction,
            "task_fields": json.dumps(episode.fields, sort_keys=True) if episode.fields else None,
            "source": "human_demo",
            "parent_episode_id": None,
            "policy_id": "human",
            "env_backend": "miniwob",
            "seed": None,
            "success": episode.success,
            "outcome_reward": episode.raw_reward,
            "decayed_reward": episode.decayed_reward,
            "n_steps": len(episode.steps),
            "duration_ms": episode.duration_ms,
            "source_file": rel,
            "source_sha256": recording_sha,
            "import_root": root_str,
            "created_at": created_at,
            "run_id": run_id,
        }
        for name, value in row.items():
            episodes[name].append(value)
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
    return _Chunk(
        pa.RecordBatch.from_pydict(episodes, schema=EPISODES),
        pa.RecordBatch.from_pydict(steps, schema=STEPS),
        files,
        quarantine,
    )


def _relative_or_absolute(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def import_demonstrations(
    root: Path | str,
    warehouse: Warehouse,
    *,
    run_id: str | None = None,
    workers: int | None = None,
    chunk_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> ImportReport:
    """Convert every recording under ``root`` and publish episodes, steps, source_files and
    quarantine as one new version of the dataset keyed by ``root`` (atomic: all or nothing)."""
    import time

    started = time.perf_counter()
    root = Path(root).resolve()
    rel_paths = [str(p.relative_to(root)) for p in find_demo_files(root)]
    if not rel_paths:
        raise FileNotFoundError(f"no *.json or *.json.gz demonstrations under {root}")
    workers = workers or min(2, os.cpu_count() or 1)
    created_at = datetime.now(UTC)
    report = ImportReport(import_root=str(root), files=len(rel_paths))

    batches = list(_chunks(rel_paths, chunk_size))
    if workers <= 1:
        results: Iterator[_Chunk] = (_convert_chunk(str(root), b, created_at, run_id) for b in batches)
        chunks = _collect(results, batches, progress, len(rel_paths))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = pool.map(
                _convert_chunk,
                [str(root)] * len(batches),
                batches,
                [created_at] * len(batches),
                [run_id] * len(batches),
            )
            chunks = _collect(results, batches, progress, len(rel_paths))

    episodes = pa.Table.from_batches([c.episodes for c in chunks], schema=EPISODES)
    steps = pa.Table.from_batches([c.steps for c in chunks], schema=STEPS)
    files = [row for c in chunks for row in c.files]
    quarantine = [row for c in chunks for row in c.quarantine]

    # Episode and step rows follow the order of the files the workers imported.
    converted = [(row, row["n_steps"]) for row in files if row["status"] == "imported"]
    # Byte-identical recordings under different names: keep the first (in path order).
    first_file_by_episode: dict[str, str] = {}
    for row, _ in converted:
        earlier = first_file_by_episode.setdefault(row["episode_id"], row["source_file"])
        if earlier != row["source_file"]:
            row.update(status="duplicate", link_target=earlier)
    episodes = episodes.filter(pa.array([row["status"] == "imported" for row, _ in converted], type=pa.bool_()))
    steps = steps.filter(
        pa.array([row["status"] == "imported" for row, n in converted for _ in range(n)], type=pa.bool_())
    )
    keep_files = [row for row, _ in converted if row["status"] == "imported"]
    # Link files inherit the episode of the file they point to.
    episode_by_file = {f["source_file"]: f["episode_id"] for f in keep_files}
    for row in files:
        if row["status"] == "duplicate" and row["episode_id"] is None and row["link_target"]:
            row["episode_id"] = episode_by_file.get(row["link_target"])

    materialization = Materialization(
        asset=ASSET_NAME,
        run_id=run_id,
        code_version=f"{IMPORTER_VERSION}+{git_revision()}",
        parameters={"import_root": str(root), "workers": workers},
        inputs=[LineageInput(kind="file", path=str(root / f["source_file"]), version=f["file_sha256"]) for f in files],
    )
    dataset = str(root)
    outputs: list[TableOutput] = [
        warehouse.stage_table("episodes", dataset, episodes, materialization),
        warehouse.stage_table("steps", dataset, steps, materialization),
        warehouse.stage_table(
            "source_files", dataset, pa.Table.from_pylist(files, schema=SOURCE_FILES), materialization
        ),
        warehouse.stage_table(
            "quarantine", dataset, pa.Table.from_pylist(quarantine, schema=QUARANTINE), materialization
        ),
    ]
    warehouse.publish(materialization, outputs)

    report.materialization_id = materialization.materialization_id
    report.outputs = {o.table_name: str(o.path) for o in outputs}
    report.episodes = episodes.num_rows
    report.imported = len(keep_files)
    report.duplicates = sum(f["status"] == "duplicate" for f in files)
    report.quarantined = sum(f["status"] == "quarantined" for f in files)
    # pyarrow.compute generates its kernels (sum, equal, ...) at import time: its typing does not list them.
    report.successes = int(pc.sum(episodes["success"].cast(pa.int64())).as_py() or 0)  # type: ignore[attr-defined]
    report.failures = report.episodes - report.successes
    report.steps = steps.num_rows
    unknown = pc.equal(steps["action_type"], "UNKNOWN")  # type: ignore[attr-defined]
    report.untyped_steps = int(pc.sum(unknown.cast(pa.int64())).as_py() or 0)  # type: ignore[attr-defined]
    report.event_problems = sum(q["severity"] == "event" for q in quarantine)
    report.tasks = len(set(episodes["task_id"].to_pylist()))
    reasons: dict[str, int] = {}
    for q in quarantine:
        if q["severity"] == "file":
            key = re.sub(r"\d+", "N", q["reason"].split(":")[0])
            reasons[key] = reasons.get(key, 0) + 1
    report.quarantine_reasons = reasons
    report.seconds = time.perf_counter() - started
    if log:
        log(json.dumps({k: v for k, v in report.__dict__.items() if k != "outputs"}, default=str))
    return report


def _collect(results: Iterator[_Chunk], batches: list[list[str]], progress, total: int) -> list[_Chunk]:
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
