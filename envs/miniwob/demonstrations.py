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
known MiniWoB++ task (``demo_files.known_task_ids``); with neither, the file is quarantined. When that folder
names a known task other than the episode's, the episode records it as its variant,
``task_fields`` key ``task_variant`` (e.g. recordings under ``email-inbox-nl-turk/`` that call
themselves ``email-inbox``), so that variants never merge silently.

**Identity.** An episode is its recording's content: ``demo:<task>:<first 16 hex of the
recording's sha256>``, whatever folder it came through. A recording already in the warehouse
from another import root is a ``duplicate`` here, and its episode stays with the import that
first brought it (owner: the earliest ``created_at``, which a re-import keeps for the episodes it
already held). Re-importing a folder replaces its previous version, never adds to it.

**File names** are stored losslessly and readably (``demo_files.stored_path``): as UTF-8 text, each byte
that is not UTF-8 written ``\\xHH`` and each backslash doubled; ``fs_path`` turns the stored form
back into the name on disk.

The files' names, tasks and episode ids are in :mod:`envs.miniwob.demo_files`; the conversion
that runs in the worker processes is in :mod:`envs.miniwob.demo_conversion`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from envs.miniwob.demo_conversion import Chunk, convert_chunk, in_chunks, init_worker
from envs.miniwob.demo_files import (
    find_demo_files,
    sample_per_task,
    stored_path,
    validate_task_override,
)
from envs.tasks import TASK_VARIANT_FIELD
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.model import KNOWN_ACTION_TYPES
from warehouse.plotting import Markdown, figure_markdown, pyplot
from warehouse.schema import EPISODES, QUARANTINE, SOURCE_FILES, STEPS, same_type
from warehouse.storage import REPO_ROOT, git_revision

IMPORTER_VERSION = "demos-5"  # demos-5: a click that steps a number field is an INPUT
ASSET_NAME = "human_demonstrations"


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
) -> list[Chunk]:
    """Convert the files chunk by chunk, in this process (``workers <= 1``) or in worker processes."""
    batches = list(in_chunks(rel_paths, chunk_size))
    args = ([str(root)] * len(batches), batches, [created_at] * len(batches), [run_id] * len(batches))
    if workers <= 1:
        init_worker(None, already)
        try:
            results: Iterator[Chunk] = (convert_chunk(*a, task) for a in zip(*args, strict=True))
            return _collect(results, batches, progress, len(rel_paths))
        finally:
            init_worker(None, frozenset())  # a later import in this process must not skip these recordings
    pool = ProcessPoolExecutor(max_workers=workers, initializer=init_worker, initargs=(os.getpid(), already))
    with pool:
        results = pool.map(convert_chunk, *args, [task] * len(batches))
        return _collect(results, batches, progress, len(rel_paths))


def _merge_chunks(chunks: list[Chunk]) -> _Converted:
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
    results: Iterable[Chunk], batches: list[list[str]], progress: Callable[[int, int], None] | None, total: int
) -> list[Chunk]:
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
