"""Incremental label runs: one label family brought up to date against its stored recipe
libraries (the partitioned ``progress_labels`` asset), and the reading and compaction of a family's
base and delta datasets. The full runs and the writers they share: :mod:`annotation.progress.label_runs`.

An incremental run labels the episodes not yet in the family's ledger against the stored libraries,
rebuilds (relabels whole, library version + 1) the tasks whose recipe-eligible successes grew enough
or whose spec changed since their episodes were labelled, and compacts the family into a new base
when anything was rebuilt or removed or the delta slots are full.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from annotation.progress.label_io import (
    default_specs_dir,
    family_dataset,
)
from annotation.progress.label_runs import (
    DELTA_SLOTS,
    LABEL_TABLES,
    LABELS_CODE_VERSION,
    LabelOutputs,
    LabelSummary,
    Log,
    empty_outputs,
    family_where,
    labelled_under_other_spec,
    ledger_rows,
    make_embedder,
    milestone_origins_line,
    milestone_source,
    retired_datasets,
    run_labeling,
    spec_inputs,
    write_batch,
)
from annotation.progress.label_state import (
    LibraryState,
    label_against_library,
    needs_rebuild,
)
from annotation.progress.label_stream import BatchLabels, stream_labels
from annotation.progress.labeling import (
    LABEL_VERSION,
    LCS_METHODS,
    RECIPE_SOURCES,
    env_labels,
)
from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder
from envs.tasks import TASK_VARIANT_FIELD, TaskSpec, load_task_specs
from warehouse.catalog import Materialization, TableOutput, Warehouse
from warehouse.purposes import purpose_filter
from warehouse.schema import LABEL_LEDGER, LIBRARY_STATE
from warehouse.storage import git_revision
from warehouse.trajectories import Trajectory, iter_task_batches, load_trajectories

# -- incremental runs -----------------------------------------------------------------------------


def family_versions(warehouse: Warehouse, table: str, family: str) -> dict[str, tuple[str, Path]]:
    """Current (materialization id, file) of a family's base and delta datasets of a table, by dataset."""
    prefix = family_dataset(family)
    return {
        dataset: (mid, path)
        for dataset, mid, path in warehouse.current_versions(table)
        if dataset == prefix or dataset.startswith(prefix + "/+")
    }


def family_paths(warehouse: Warehouse, table: str, family: str) -> dict[str, Path]:
    """Current files of a family's base and delta datasets of a table, by dataset."""
    return {dataset: path for dataset, (_, path) in family_versions(warehouse, table, family).items()}


def _slot_rows(warehouse: Warehouse, family: str) -> dict[str, int]:
    """Rows held by each current delta dataset of a family (all labels tables together)."""
    rows = warehouse.query(
        "SELECT dataset, sum(n_rows) AS n FROM table_versions WHERE is_current AND list_contains(?, table_name) "
        "AND starts_with(dataset, ?) GROUP BY dataset",
        [list(LABEL_TABLES), family_dataset(family) + "/+"],
    ).to_pylist()
    return {r["dataset"]: int(r["n"] or 0) for r in rows}


def _read(paths: Iterable[Path | str], sql: str, schema: pa.Schema) -> pa.Table:
    """``sql`` over the union of these Parquet files (``{files}``), every column of ``schema``
    present (:func:`_union_source`)."""
    with duckdb.connect() as con:
        return con.sql(sql.replace("{files}", _union_source(con, [str(p) for p in paths], schema))).to_arrow_table()


def _union_source(con: duckdb.DuckDBPyConnection, files: Sequence[str], schema: pa.Schema) -> str:
    """A SQL source over these Parquet files with every column of ``schema``: a file written before
    a column existed (an older home) reads it as null, as the warehouse's views do."""
    con.register("schema_rows", schema.empty_table())
    if not files:
        return "schema_rows"
    return (
        "(SELECT * FROM schema_rows UNION ALL BY NAME "
        f"SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true))"
    )


def run_family_labels(
    warehouse: Warehouse,
    family: str,
    *,
    specs_dir: str | Path | None = None,
    embedder: str = "minilm",
    theta: float = 0.6,
    run_id: str | None = None,
    log: Log = print,
    mode: str = "incremental",
    rebuild_share: float = 0.1,
    rebuild_at_least: int = 2,
    asset: str = "family_progress_labels",
    replay_milestones: bool = False,
) -> LabelSummary:
    """Bring one label family's labels up to date (see the module docstring). ``mode="full"``
    relabels the family from scratch; ``"incremental"`` (default) labels only what is new,
    rebuilding the recipe libraries of tasks whose recipe-eligible successes grew by at least
    ``max(rebuild_at_least, rebuild_share x the successes they were built from)``, and of tasks
    whose spec changed since their episodes were labelled.
    ``replay_milestones``: the episodes this run labels get milestones replayed from the specs
    (:func:`run_labeling`); the labels it leaves alone keep theirs."""

    guard = warehouse.guard(LABEL_TABLES, [family_dataset(family)])
    states_table = _read(
        family_paths(warehouse, "recipe_library_state", family).values(), "SELECT * FROM {files}", LIBRARY_STATE
    )
    if mode == "full" or states_table.num_rows == 0:
        if mode != "full":
            log(f"{family}: no recipe library stored yet: labelling the family from scratch")
        return run_labeling(
            warehouse,
            specs_dir=specs_dir,
            embedder=embedder,
            theta=theta,
            run_id=run_id,
            log=log,
            families=[family],
            asset=asset,
            partition_key=family,
            replay_milestones=replay_milestones,
        )
    specs = load_task_specs(specs_dir or default_specs_dir())
    states = {(r["task_id"], r["method"]): LibraryState.from_row(r) for r in states_table.to_pylist()}
    update = _plan_family_update(warehouse, family, states, specs, rebuild_share, rebuild_at_least)
    m = _family_update_materialization(warehouse, family, update, states, specs, asset, run_id, theta, embedder)
    m.parameters["milestones"] = milestone_source(replay_milestones)
    log(update.describe(family))
    if update.unversioned:
        log(
            f"{family}: {update.unversioned} episodes were labelled before the label ledger recorded their spec "
            "versions: a spec changed since is not seen for them; a full run (`stepwise label`, the asset's "
            "`mode: full`) relabels them once"
        )
    out = LabelOutputs(warehouse, m, [family], suffix=".new" if update.compact else f"/+{update.free[0]}")
    embed = make_embedder(embedder)
    try:
        if update.incremental_ids:
            _label_against_stored_libraries(
                warehouse, out, family, update.incremental_ids, states, specs, embed, replay_milestones
            )
        if update.rebuild:
            _relabel_rebuilt_tasks(
                warehouse, out, family, update.rebuild, update.version_of, specs, embed, theta, replay_milestones
            )
        outputs = out.close()
    except BaseException:
        out.abort()
        raise
    if update.compact:
        outputs = _compact(warehouse, family, m, outputs, update.rebuild, sorted(update.removed))
    warehouse.publish(m, outputs, guard=guard)
    out.summary.materialization_id = m.materialization_id
    out.summary.incremental = update.report()
    log(milestone_origins_line(out.summary.milestone_origins))
    out.summary.outputs = {table: str(warehouse.data_dir / table) for table in LABEL_TABLES}
    return out.summary


@dataclass(frozen=True)
class _FamilyUpdate:
    """What an incremental run of one family does: the episodes new and gone, the tasks rebuilt, where rows go."""

    new_rows: list[dict]  # episodes not in the family's ledger yet
    removed: set[str]  # ledger episodes no longer in ``episodes``
    rebuild: list[str]  # tasks whose recipe libraries are rebuilt (relabelled whole)
    incremental_ids: list[str]  # new episodes labelled against their task's stored library
    free: list[int]  # delta slots without rows
    compact: bool  # whether the family is compacted into a new base (else written to delta slot free[0])
    version_of: dict[str, int]  # the new library version of each rebuilt task
    spec_changed: list[str] = field(default_factory=list)  # rebuilt because their spec changed since labelled
    unversioned: int = 0  # labelled episodes whose ledger row has no spec version (labelled before it was kept)

    def report(self) -> dict:
        """The run's counts, as recorded in the materialization and the summary."""
        return {
            "new_episodes": len(self.new_rows),
            "labelled_against_library": len(self.incremental_ids),
            "rebuilt_tasks": {task: self.version_of[task] for task in self.rebuild},
            "spec_changed_tasks": self.spec_changed,
            "removed_episodes": len(self.removed),
            "compacted": self.compact,
        }

    def describe(self, family: str) -> str:
        """One log line saying what the run does."""
        rebuild = self.rebuild
        return (
            f"{family}: {len(self.new_rows)} new episodes ({len(self.incremental_ids)} against the stored recipes), "
            f"{len(rebuild)} tasks rebuilt {rebuild[:5]}{'...' if len(rebuild) > 5 else ''}"
            + (f" ({len(self.spec_changed)} for a changed spec)" if self.spec_changed else "")
            + ", "
            f"{len(self.removed)} removed; {'compacting' if self.compact else f'delta slot +{self.free[0]}'}"
        )


def _plan_family_update(
    warehouse: Warehouse,
    family: str,
    states: Mapping[tuple[str, str], LibraryState],
    specs: Mapping[str, TaskSpec],
    rebuild_share: float,
    rebuild_at_least: int,
) -> _FamilyUpdate:
    """Compare the family's episodes with its ledger and decide what to label, rebuild and compact.
    A task is rebuilt when its new recipe-eligible successes call for it (``needs_rebuild``), or when
    the spec its labelled episodes were labelled with is no longer the one in hand (its milestone
    labels are stale: every episode of it, recorded or not, is labelled from the spec)."""
    fam_where, fam_params = family_where([family])
    ledger_paths = list(family_paths(warehouse, "label_ledger", family).values())
    labelled_with = _ledger_spec_digests(ledger_paths)
    current = warehouse.query(
        "SELECT e.episode_id, e.task_id, e.success, e.source, "
        f"json_extract_string(e.task_fields, '$.{TASK_VARIANT_FIELD}') AS variant FROM episodes e WHERE {fam_where}",
        fam_params,
    ).to_pylist()
    known_set = set(labelled_with)
    spec_changed = sorted(
        {
            r["task_id"]
            for r in current
            if labelled_under_other_spec(labelled_with.get(r["episode_id"]), specs, r["task_id"], r["variant"])
        }
    )
    new_rows = [r for r in current if r["episode_id"] not in known_set]
    removed = known_set - {r["episode_id"] for r in current}
    new_successes = Counter(r["task_id"] for r in new_rows if r["success"] and r["source"] in RECIPE_SOURCES)
    new_tasks = sorted({r["task_id"] for r in new_rows})
    rebuild = sorted(
        {
            task
            for task in new_tasks
            if any(
                needs_rebuild(
                    states.get((task, method)), new_successes[task], share=rebuild_share, at_least=rebuild_at_least
                )
                for method in LCS_METHODS
            )
        }
        | set(spec_changed)
    )
    incremental_ids = [r["episode_id"] for r in new_rows if r["task_id"] not in set(rebuild)]
    # labelled without a spec version and not relabelled by this run (a rebuilt task's are)
    unversioned = sum(
        1
        for r in current
        if r["episode_id"] in known_set and labelled_with[r["episode_id"]] is None and r["task_id"] not in rebuild
    )
    used = _slot_rows(warehouse, family)
    free = [k for k in range(DELTA_SLOTS) if not used.get(f"{family_dataset(family)}/+{k}")]
    compact = bool(rebuild or removed or not free)
    version_of = {
        task: max((states[(task, m)].version for m in LCS_METHODS if (task, m) in states), default=0) + 1
        for task in rebuild
    }
    return _FamilyUpdate(
        new_rows, removed, rebuild, incremental_ids, free, compact, version_of, spec_changed, unversioned
    )


def _ledger_spec_digests(paths: Sequence[Path]) -> dict[str, str | None]:
    """Episode id -> the spec digest its ledger row recorded (None for rows written before the
    ledger kept it, including whole files without the column)."""
    table = _read(paths, "SELECT episode_id, spec_digest FROM {files}", LABEL_LEDGER)
    return dict(zip(table.column("episode_id").to_pylist(), table.column("spec_digest").to_pylist(), strict=True))


def _family_update_materialization(
    warehouse: Warehouse,
    family: str,
    update: _FamilyUpdate,
    states: Mapping[tuple[str, str], LibraryState],
    specs: dict[str, TaskSpec],
    asset: str,
    run_id: str | None,
    theta: float,
    embedder: str,
) -> Materialization:
    """The materialization of an incremental run, with its parameters and lineage."""
    return Materialization(
        asset=asset,
        run_id=run_id,
        partition_key=family,
        code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
        parameters={
            "theta": theta,
            "embedder": embedder,
            "label_version": LABEL_VERSION,
            "families": [family],
            "mode": "incremental",
            **update.report(),
            "library_versions": {task: s.version for (task, method), s in states.items() if method == "improved"},
        },
        inputs=warehouse.current_inputs(["episodes", "steps"])
        + warehouse.current_inputs(list(LABEL_TABLES))
        + spec_inputs(specs),
    )


def _label_against_stored_libraries(
    warehouse: Warehouse,
    out: LabelOutputs,
    family: str,
    episode_ids: list[str],
    states: Mapping[tuple[str, str], LibraryState],
    specs: Mapping[str, TaskSpec],
    embed: TextEmbedder | HashingTextEmbedder,
    replay_milestones: bool,
) -> None:
    """Label new episodes of tasks whose library stays against that library (cost: the batch), and ledger them."""
    batch = list(load_trajectories(warehouse, "list_contains(?, e.episode_id)", [episode_ids]))
    out.summary.episodes += len(batch)
    out.env(family, env_labels(batch, specs, replay_milestones=replay_milestones))
    for method in LCS_METHODS:
        task_states = {t.task_id: states[(t.task_id, method)] for t in batch}
        out.lcs(family, method, label_against_library(batch, task_states, embed, method))
    versions = {t.task_id: {mm: states[(t.task_id, mm)].version for mm in LCS_METHODS} for t in batch}
    out.rows("label_ledger", family, ledger_rows(batch, versions, out.m.materialization_id, specs))


def _relabel_rebuilt_tasks(
    warehouse: Warehouse,
    out: LabelOutputs,
    family: str,
    rebuild: list[str],
    version_of: Mapping[str, int],
    specs: Mapping[str, TaskSpec],
    embed: TextEmbedder | HashingTextEmbedder,
    theta: float,
    replay_milestones: bool,
) -> None:
    """Relabel the rebuilt tasks whole, batch by batch, with their libraries' next versions, and ledger them."""
    mid = out.m.materialization_id
    rebuilt_batches = iter_task_batches(warehouse, f"list_contains(?, e.task_id) AND {purpose_filter()}", [rebuild])
    batches = _with_batches(rebuilt_batches, embed, specs, theta, version_of, replay_milestones)
    for result, batch_trajectories in batches:
        out.summary.episodes += result.episodes
        write_batch(out, family, result, mid, version_of)
        versions = {task: dict.fromkeys(LCS_METHODS, version_of[task]) for task in result.task_ids}
        out.rows("label_ledger", family, ledger_rows(batch_trajectories, versions, mid, specs))


def _with_batches(
    batches: Iterable[list[Trajectory]],
    embed,
    specs: Mapping[str, TaskSpec],
    theta: float,
    version_of: Mapping[str, int],
    replay_milestones: bool = False,
) -> Iterator[tuple[BatchLabels, list[Trajectory]]]:
    """Stream-label rebuilt tasks batch by batch (each batch embeds its own texts), with the batch."""
    for batch in batches:
        for result in stream_labels(
            [batch],
            embed,
            specs,
            theta=theta,
            embed_scope="batch",
            version_of=version_of,
            replay_milestones=replay_milestones,
        ):
            yield result, batch


#: Per table, which rows of a rebuilt task or removed episode a compaction drops (``rebuilt``:
#: the rebuilt tasks; ``dropped``: the episodes of rebuilt tasks and the removed episodes).
_DROP = {
    "progress_labels": "episode_id IN (SELECT episode_id FROM dropped)",
    "recipes": "task_id IN (SELECT task_id FROM rebuilt)",
    "recipe_library_state": "task_id IN (SELECT task_id FROM rebuilt)",
    "label_notes": "(scope = 'task' AND key IN (SELECT task_id FROM rebuilt)) "
    "OR (scope <> 'task' AND key IN (SELECT episode_id FROM dropped))",
    "label_ledger": "episode_id IN (SELECT episode_id FROM dropped)",
}


def _compact(
    warehouse: Warehouse,
    family: str,
    m: Materialization,
    new_outputs: list[TableOutput],
    rebuilt: list[str],
    removed: list[str],
) -> list[TableOutput]:
    """The family's new base per table: its current base and deltas, minus the rows of rebuilt
    tasks and removed episodes, plus this run's rows; then every delta slot emptied. Runs in
    DuckDB over the Parquet files (streamed, not in this process's memory)."""
    from warehouse.storage import slug

    by_table = {o.table_name: o for o in new_outputs}
    ledger_files = [str(p) for p in family_paths(warehouse, "label_ledger", family).values()]
    old_ledger = _read(ledger_files, "SELECT episode_id, task_id FROM {files}", LABEL_LEDGER)
    rebuilt_set = set(rebuilt)
    dropped = sorted(
        set(removed)
        | {
            e
            for e, t in zip(
                old_ledger.column("episode_id").to_pylist(), old_ledger.column("task_id").to_pylist(), strict=True
            )
            if t in rebuilt_set
        }
    )
    outputs = []
    for table, schema in LABEL_TABLES.items():
        old = [str(p) for p in family_paths(warehouse, table, family).values()]
        new = by_table[table]
        target = warehouse.data_dir / table / slug(family_dataset(family)) / f"{m.materialization_id}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)[1])
        columns = ", ".join(schema.names)
        with duckdb.connect() as con:
            con.register("rebuilt", pa.table({"task_id": pa.array(rebuilt, pa.string())}))
            con.register("dropped", pa.table({"episode_id": pa.array(dropped, pa.string())}))
            parts = []
            if old:
                parts.append(f"SELECT {columns} FROM {_union_source(con, old, schema)} WHERE NOT ({_DROP[table]})")
            parts.append(f"SELECT {columns} FROM read_parquet({_sql_list([str(new.path)])})")
            con.execute(f"COPY ({' UNION ALL '.join(parts)}) TO {_sql_list([str(tmp)])[1:-1]} (FORMAT parquet)")
            counted = con.execute(f"SELECT count(*) FROM read_parquet({_sql_list([str(tmp)])})").fetchone()
            n_rows = counted[0] if counted else 0
        new.path.unlink(missing_ok=True)
        tmp.replace(target)
        outputs.append(TableOutput(table, family_dataset(family), target, int(n_rows)))
    outputs += empty_outputs(warehouse, retired_datasets(warehouse, [family], True, False), m)
    return outputs


def _sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
