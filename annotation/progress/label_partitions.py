"""The labels stage by label family (the Dagster partitions): which families have episodes not
labelled yet, or labelled under a task spec changed since (what the ``new_episodes_to_label``
sensor asks), and a run over a set of families:
those without a stored recipe library labelled from scratch in one pass, the others brought up to
date one by one or side by side (:func:`run_label_partitions`; processes or Ray tasks through
``map_families``). The labelling itself: :mod:`annotation.progress.label_runs` (full runs) and
:mod:`annotation.progress.label_increments` (incremental ones)."""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotation.progress.label_increments import family_paths, family_versions, run_family_labels
from annotation.progress.label_io import label_families, label_family
from annotation.progress.label_runs import LabelSummary, Log, labelled_under_other_spec, run_labeling
from envs.tasks import TaskSpec, TaskSpecError, load_task_specs
from warehouse.catalog import Warehouse
from warehouse.purposes import purpose_filter

FamilyMap = Callable[[Callable[[str], LabelSummary], Sequence[str]], list[LabelSummary]]


def unlabelled_episodes(warehouse: Warehouse, family: str) -> int:
    """Episodes of a family the labels stage has not handled yet (not in its ledger)."""
    return families_with_new_episodes(warehouse).get(family, 0)


def families_with_new_episodes(warehouse: Warehouse) -> dict[str, int]:
    """Label families with episodes not labelled yet (in ``episodes``, not in ``label_ledger``),
    and how many: what the ``new_episodes_to_label`` sensor asks. One anti-join in DuckDB; only the
    distinct task ids of what is new come back to Python. Evaluation episodes never count: the
    labels stage does not take them."""
    rows = warehouse.query(
        "SELECT e.task_id, count(*) AS n FROM episodes e ANTI JOIN label_ledger l USING (episode_id) "
        f"WHERE {purpose_filter()} GROUP BY 1"
    ).to_pylist()
    counts: Counter[str] = Counter()
    for row in rows:
        counts[label_family(row["task_id"])] += int(row["n"])
    return dict(sorted(counts.items()))


def families_with_changed_specs(warehouse: Warehouse, specs: Mapping[str, TaskSpec]) -> dict[str, int]:
    """Label families with labelled episodes whose spec changed since (the label ledger's
    ``spec_digest`` is not that of the spec in hand: ``label_runs.labelled_under_other_spec``), and how
    many: an incremental run of such a family relabels those tasks. Ledger rows written before the
    ledger kept versions do not count: a change cannot be seen for them."""
    rows = warehouse.query(
        "SELECT l.task_id, json_extract_string(e.task_fields, '$.task_variant') AS variant, l.spec_digest, "
        "count(*) AS n FROM label_ledger l JOIN episodes e USING (episode_id) "
        "WHERE l.spec_digest IS NOT NULL GROUP BY ALL"
    ).to_pylist()
    counts: Counter[str] = Counter()
    for row in rows:
        if labelled_under_other_spec(row["spec_digest"], specs, row["task_id"], row["variant"]):
            counts[label_family(row["task_id"])] += int(row["n"])
    return dict(sorted(counts.items()))


def specs_version(specs: Mapping[str, TaskSpec]) -> str:
    """A short hash of every spec's milestone digest: changes exactly when some spec's milestones do."""
    digests = "\n".join(f"{key}={spec.milestone_digest}" for key, spec in sorted(specs.items()))
    return hashlib.sha256(digests.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LabelBacklog:
    """What the ``new_episodes_to_label`` sensor asks for: per label family, its episodes not
    labelled yet and those labelled under a spec changed since; ``version``: the state of the
    episodes and the specs it was read from (part of a request's run key)."""

    new: dict[str, int]
    spec_changed: dict[str, int]
    version: str
    spec_error: str | None = None  # the specs could not be read: spec changes are not looked for

    @property
    def families(self) -> list[str]:
        return sorted(set(self.new) | set(self.spec_changed))

    def describe(self) -> str:
        changed = f"specs unreadable ({self.spec_error})" if self.spec_error else self.spec_changed
        return f"episodes not labelled yet, by label family: {self.new}; labelled under a spec changed since: {changed}"

    def tags(self, family: str) -> dict[str, str]:
        return {
            "stepwise/new_episodes": str(self.new.get(family, 0)),
            "stepwise/spec_changed_episodes": str(self.spec_changed.get(family, 0)),
        }


def label_backlog(warehouse: Warehouse, specs_dir: str | Path) -> LabelBacklog:
    """The families a labels run would change (:class:`LabelBacklog`), with the specs in ``specs_dir``
    (a spec that does not load leaves the new episodes' requests alone and says why)."""
    try:
        specs = load_task_specs(specs_dir)
    except (TaskSpecError, OSError) as exc:
        version = f"{episodes_version(warehouse)}@specs-unreadable"
        return LabelBacklog(families_with_new_episodes(warehouse), {}, version, spec_error=str(exc))
    return LabelBacklog(
        families_with_new_episodes(warehouse),
        families_with_changed_specs(warehouse, specs),
        f"{episodes_version(warehouse)}@specs-{specs_version(specs)}",
    )


def episodes_version(warehouse: Warehouse) -> str:
    """The current versions of ``episodes`` (their materialization ids, joined): changes exactly
    when episodes are published, so a sensor asks for one labels run per family per change."""
    return ",".join(sorted(mid for _, mid, _ in warehouse.current_versions("episodes")))


def family_labels_version(warehouse: Warehouse, family: str) -> str:
    """The current versions of a family's label ledger datasets (base and deltas), joined."""
    return ",".join(sorted(mid for mid, _ in family_versions(warehouse, "label_ledger", family).values()))


def has_library(warehouse: Warehouse, family: str) -> bool:
    """Whether a family has a stored recipe library (so it can be labelled incrementally)."""
    return bool(family_paths(warehouse, "recipe_library_state", family))


#: The labels' options, in words for a config or a command line.
LABEL_MODE_HELP = (
    "incremental: new episodes against the stored recipe libraries (a task's rebuilt when its successes grew "
    "by max(2, 10%) or its spec changed since it was labelled; families without one from scratch) | full: the "
    "families from scratch"
)
REPLAY_MILESTONES_HELP = (
    "milestone labels of the episodes a run labels from the task specs replayed, not from the milestones "
    "rollouts recorded online (episodes that stored another spec version are replayed either way): keep it on "
    "for a home whose rollouts were stored without spec versions and whose specs were fixed after them"
)


def run_label_partitions(
    warehouse: Warehouse,
    families: Sequence[str],
    *,
    mode: str = "incremental",
    specs_dir: str | Path | None = None,
    embedder: str = "minilm",
    theta: float = 0.6,
    run_id: str | None = None,
    log: Log = print,
    asset: str = "progress_labels",
    map_families: FamilyMap | None = None,
    replay_milestones: bool = False,
) -> LabelSummary:
    """The labels stage for a set of label families (the Dagster partitions of a run).

    ``mode="full"`` relabels them from scratch in one streamed pass (every family: exactly the
    all-at-once rows). ``"incremental"``: families with no stored recipe library are labelled from
    scratch together in one pass (so a first run over every family is the full run), and each of
    the others is brought up to date by :func:`run_family_labels` (new episodes against the stored
    libraries, tasks whose successes grew enough rebuilt). Returns the summaries merged.

    ``map_families(update_family, families)``: how the families to bring up to date run when there
    are several (e.g. as tasks on a Ray cluster: the labels asset's ``ray_address``); each calls
    :func:`update_family` on its own, so the rows are those of running them one after another.

    ``replay_milestones``: the episodes this run labels get milestone labels from the specs replayed,
    not from the milestones rollouts recorded online: for a home whose specs were fixed after its
    rollouts. A run without it labels the episodes it touches (new ones; every episode of a rebuilt
    task) from the recorded milestones again, so such a home keeps it on (the asset's config)."""
    if mode not in ("full", "incremental"):
        raise ValueError(f"unknown labels mode {mode!r} (full | incremental)")
    unknown = sorted(set(families) - set(label_families()))
    if unknown:
        raise ValueError(f"unknown label families {unknown}; the families are {label_families()}")
    wanted = [f for f in label_families() if f in set(families)]
    fresh = wanted if mode == "full" else [f for f in wanted if not has_library(warehouse, f)]
    summaries = []
    if fresh:
        every = fresh == label_families()
        summaries.append(
            run_labeling(
                warehouse,
                families=None if every else fresh,
                asset=asset,
                partition_key=None if every else ",".join(fresh),
                specs_dir=specs_dir,
                embedder=embedder,
                theta=theta,
                run_id=run_id,
                log=log,
                replay_milestones=replay_milestones,
            )
        )
    stale = [f for f in wanted if f not in fresh]
    if map_families is not None and len(stale) > 1:
        job = functools.partial(
            update_family,
            str(warehouse.home),
            asset=asset,
            specs_dir=None if specs_dir is None else str(specs_dir),
            embedder=embedder,
            theta=theta,
            run_id=run_id,
            replay_milestones=replay_milestones,
        )
        log(f"bringing {len(stale)} label families up to date at once: {', '.join(stale)}")
        summaries += map_families(job, stale)
        return merge_summaries(summaries)
    for family in stale:
        summaries.append(
            run_family_labels(
                warehouse,
                family,
                asset=asset,
                specs_dir=specs_dir,
                embedder=embedder,
                theta=theta,
                run_id=run_id,
                log=log,
                replay_milestones=replay_milestones,
            )
        )
    return merge_summaries(summaries)


def update_family(home: str, family: str, **options: Any) -> LabelSummary:
    """:func:`run_family_labels` on the warehouse at ``home``, for a process that has only the path
    (a Ray task on another node of a cluster whose nodes share the home's file system)."""
    return run_family_labels(Warehouse(home), family, **options, log=lambda message: print(message, flush=True))


def merge_summaries(summaries: Sequence[LabelSummary]) -> LabelSummary:
    """Several runs' summaries as one (counts added, per-family incremental reports kept by family)."""
    merged = LabelSummary()
    for s in summaries:
        merged.episodes += s.episodes
        merged.batches += s.batches
        merged.families += s.families
        for key, n in s.label_rows.items():
            merged.label_rows[key] = merged.label_rows.get(key, 0) + n
        for key, n in s.recipes.items():
            merged.recipes[key] = merged.recipes.get(key, 0) + n
        for key, n in s.unlabelled.items():
            merged.unlabelled[key] = merged.unlabelled.get(key, 0) + n
        for key, n in s.milestone_origins.items():
            merged.milestone_origins[key] = merged.milestone_origins.get(key, 0) + n
        for key, notes in s.tasks_without_recipe.items():
            merged.tasks_without_recipe.setdefault(key, {}).update(notes)
        merged.plots.update(s.plots)
        merged.outputs.update(s.outputs)
        if s.incremental:
            merged.incremental.update({fam: s.incremental for fam in s.families})
        merged.materialization_id = s.materialization_id
    return merged
