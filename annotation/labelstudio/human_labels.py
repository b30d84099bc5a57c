"""The human-label stage: people label steps in Label Studio, and their labels come back to the warehouse.

``assets/human_labels.py`` declares the assets, checks and sensor (Dagster group ``human_labels``)
and calls one function here for each::

    steps, episodes, progress_labels, rm_predictions
        -> annotation_candidates      select_candidates: active selection under a budget, shared by episode source
        -> annotation_queue           push_queue: pushed to Label Studio, idempotently
    (both at once without Dagster: push_from_cli, the body of `stepwise annotate push`)
    Label Studio -> human_labels      sync_projects (asset), sync_tick (the label_studio_sync sensor)
        -> human_step_labels          build_human_step_labels: per-step training labels (+ progress_labels)
        -> annotation_agreement       build_agreement: Cohen's kappa, annotator statistics, a plot
        -> label_source_comparison    build_source_comparison: human vs LCS vs environment vs model

No Dagster here. The pure parts live in ``annotation/labelstudio/``: selection, queue items,
reports, plots, agreement, the sync's merge. The edge that touches the warehouse is the
``read_*`` functions of :mod:`annotation.labelstudio.reads` and :func:`publish_tables` here;
running syncs (asset and sensor tick) is :mod:`annotation.labelstudio.sensor`.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from annotation.labelstudio.audit import file_text, files_containing
from annotation.labelstudio.connection import LabelStudioSite, connect
from annotation.labelstudio.interfaces import INTERFACES, STEP_INTERFACES
from annotation.labelstudio.plots import annotator_plot, comparison_plot, selection_plot
from annotation.labelstudio.push import QueueItem, ensure_project, push_items, reconcile_queue
from annotation.labelstudio.queue import (
    match_episodes,
    match_items,
    match_pairs,
    queued_step_keys,
    review_choices,
    review_items,
    step_items,
)
from annotation.labelstudio.reads import (
    current_rows,
    read_episode_actions,
    read_human_labels,
    read_milestone_sets,
    read_queue,
    read_step_candidates,
    read_step_judgements,
    read_step_views,
    read_task_episodes,
    table_inputs,
)
from annotation.labelstudio.reports import (
    agreement_report,
    comparison_steps,
    duplicate_annotations,
    duplicate_queue_items,
    human_step_label_rows,
    selection_summary,
    source_comparison,
    source_summary,
    step_labels_summary,
    untraced_labels,
    unusable_violations,
)
from annotation.labelstudio.secrets import API_KEY_ENV, credentials_from_environment, read_local_secrets
from annotation.labelstudio.selection import (
    DEFAULT_SOURCE_SHARES,
    MIN_DISAGREEMENT,
    candidate_rows,
    select_by_source,
    select_match_pairs,
)
from annotation.labelstudio.sensor import SensorSettings, TickOutcome, sync_projects, sync_tick
from annotation.labelstudio.sync import SYNC_CODE_VERSION
from warehouse.catalog import Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown
from warehouse.schema import PROGRESS_LABELS
from warehouse.storage import git_revision
from warehouse.tables_annotation import (
    ANNOTATION_CANDIDATES,
    ANNOTATION_QUEUE,
    ANNOTATOR_STATS,
    HUMAN_STEP_LABELS,
    LABEL_SOURCE_AGREEMENT,
)

__all__ = [  # what assets/human_labels.py and the CLI (`stepwise annotate push`) use
    "CANDIDATE_UPSTREAM",
    "DOWNSTREAM_OF_LABELS",
    "INTERFACE_NAMES",
    "DEFAULT_SOURCE_SHARES",
    "PUSH_VERSION",
    "REPORT_VERSION",
    "SELECTION_VERSION",
    "SYNC_VERSION",
    "AnnotatePushOptions",
    "CheckOutcome",
    "LabelStudioSite",
    "Markdown",
    "PushOptions",
    "SelectionOptions",
    "SensorSettings",
    "TickOutcome",
    "build_agreement",
    "build_human_step_labels",
    "build_source_comparison",
    "check_no_secrets",
    "check_queue_unique",
    "check_traced_to_queue",
    "check_unique_annotations",
    "check_unsure_excluded",
    "cli_site",
    "parse_source_shares",
    "push_from_cli",
    "push_report_lines",
    "push_queue",
    "select_candidates",
    "sync_projects",
    "sync_tick",
]

SELECTION_VERSION = "active-selection-2"  # 2: budget shared by episode source, disagreements first
PUSH_VERSION = "labelstudio-push-1"
REPORT_VERSION = "annotation-report-1"
SYNC_VERSION = SYNC_CODE_VERSION
#: Assets whose tables the selection reads: steps and episodes, progress_labels, rm_predictions.
CANDIDATE_UPSTREAM = ["human_demonstrations", "progress_labels", "reward_model_report"]
#: What the sensor asks to run when labels changed.
DOWNSTREAM_OF_LABELS = ["human_step_labels", "annotation_agreement", "label_source_comparison"]
#: The tables each asset of the stage writes (their keys are checked).
TABLES_BY_ASSET: dict[str, tuple[str, ...]] = {
    "annotation_candidates": ("annotation_candidates",),
    "annotation_queue": ("annotation_queue",),
    "human_labels": ("human_labels",),
    "human_step_labels": ("human_step_labels",),
    "annotation_agreement": ("annotator_stats",),
    "label_source_comparison": ("label_source_agreement",),
}
HUMAN_LABEL_TABLES = (
    "annotation_candidates",
    "annotation_queue",
    "human_labels",
    "human_step_labels",
    "annotator_stats",
    "label_source_agreement",
)
INTERFACE_NAMES: tuple[str, ...] = tuple(INTERFACES)

Log = Callable[[str], None]


def _no_log(message: str) -> None:
    pass


@dataclass(frozen=True)
class SelectionOptions:
    """How many steps to put in front of people, and how to pick them (see annotation.labelstudio.selection)."""

    budget: int = 500
    spot_check_share: float = 0.1
    max_per_episode: int = 2
    seed: int = 0
    prediction_model: str | None = None  # an rm_predictions model_id; None: the latest model
    episode_source: str | None = None  # only episodes of this source (e.g. rollout): it gets the whole budget
    # the budget's share per episode source (a source, a family such as "synthetic", or "*"; see selection.py)
    source_shares: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SOURCE_SHARES))
    min_disagreement: float = MIN_DISAGREEMENT  # label sources this far apart: picked first within a source

    def shares(self) -> dict[str, float]:
        return {self.episode_source: 1.0} if self.episode_source else dict(self.source_shares)


@dataclass(frozen=True)
class PushOptions:
    """What to push to Label Studio, and how (milestone budgets are totals per interface version)."""

    interfaces: tuple[str, ...] = INTERFACE_NAMES
    overlap_share: float = 0.1
    chunk_size: int = 1000
    milestone_review_budget: int = 100
    match_budget: int = 200
    match_threshold: float = 0.75
    match_embedder: str = "minilm"  # minilm (all-MiniLM-L6-v2, offline) | hashing (no model)
    task_specs_dir: str | None = None


# -- publishing ----------------------------------------------------------------------------------------


def _plot_path(warehouse: Warehouse, name: str) -> Path:
    return warehouse.home / "plots" / f"{name}.png"


def publish_tables(
    warehouse: Warehouse, materialization: Materialization, tables: Sequence[tuple[str, str, list[dict], pa.Schema]]
) -> None:
    """Stage (table name, dataset, rows, schema) outputs and make them current together."""
    outputs = [
        warehouse.stage_table(name, dataset, pa.Table.from_pylist(rows, schema=schema), materialization)
        for name, dataset, rows, schema in tables
    ]
    warehouse.publish(materialization, outputs)


# -- annotation_candidates -------------------------------------------------------------------------------


def select_candidates(
    warehouse: Warehouse, options: SelectionOptions, *, run_id: str | None = None, log: Log = _no_log
) -> dict[str, Any]:
    """Pick the steps whose automatic labels are least certain, the budget shared by episode source,
    leaving out those already queued; publish them as ``annotation_candidates`` (dataset ``latest``,
    rows in the order people will see them) and summarize, with what each source got."""
    candidates = read_step_candidates(warehouse, model=options.prediction_model, episode_source=options.episode_source)
    exclude = queued_step_keys(read_queue(warehouse))
    picked, allocations = select_by_source(
        candidates,
        options.budget,
        options.shares(),
        exclude=exclude,
        spot_check_share=options.spot_check_share,
        max_per_episode=options.max_per_episode,
        seed=options.seed,
        min_disagreement=options.min_disagreement,
    )
    rows = candidate_rows(picked)
    by_source = source_summary(allocations, options.budget)
    materialization = Materialization(
        asset="annotation_candidates",
        run_id=run_id,
        code_version=SELECTION_VERSION,
        parameters={
            **asdict(options),
            "source_shares": options.shares(),
            "source_budget": {a.key: a.budget for a in allocations},
            "source_selected": {a.key: a.selected for a in allocations},
            "candidates": len(candidates),
            "excluded_already_queued": len(exclude),
            "git": git_revision(),
        },
        inputs=table_inputs(warehouse, ("steps", "episodes", "progress_labels", "rm_predictions", "annotation_queue")),
    )
    publish_tables(warehouse, materialization, [("annotation_candidates", "latest", rows, ANNOTATION_CANDIDATES)])
    summary = selection_summary(rows, len(candidates), len(exclude)) | by_source
    log(
        f"selected {len(rows)} of {len(candidates)} steps: {summary['by_reason']}; "
        f"by source {summary['selected_share_by_source']}"
    )
    plot = (
        selection_plot(rows, _plot_path(warehouse, "annotation_candidates")) if rows else Markdown("_nothing selected_")
    )
    return summary | {"materialization_id": materialization.materialization_id, "selection_plot": plot}


# -- annotation_queue ------------------------------------------------------------------------------------------


def _embed(name: str) -> Callable:
    from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder

    return (TextEmbedder() if name == "minilm" else HashingTextEmbedder()).embed


def milestone_queue_items(
    warehouse: Warehouse, options: PushOptions, server_key: str, local_root: Path | None, log: Log = _no_log
) -> dict[str, list[QueueItem]]:
    """Milestone review items (one per milestone set) and milestone-action match pairs near the matcher's threshold."""
    from annotation.progress.text_similarity import text_similarity_matrix

    sets = read_milestone_sets(warehouse, options.task_specs_dir)
    if not sets:
        log("no milestone sets (no `milestones` table and no task specs with milestones): nothing to review")
        return {}
    tasks = sorted({s["task_id"] for s in sets})
    by_task = read_task_episodes(warehouse, tasks)
    queued = [
        r
        for r in read_queue(warehouse)
        if r["interface"] in ("milestone_review", "milestone_match") and r["ls_server"] == server_key
    ]
    queued_keys = {r["item_key"] for r in queued}
    n_queued = Counter(r["interface"] for r in queued)
    items: dict[str, list[QueueItem]] = {}
    if "milestone_review" in options.interfaces:
        choices = review_choices(
            sets, by_task, queued_keys, options.milestone_review_budget - n_queued["milestone_review"]
        )
        references = [ref for _, ref in choices if ref]
        views = read_step_views(warehouse, {(e["episode_id"], 0) for e in references}, local_root)
        actions = read_episode_actions(warehouse, [e["episode_id"] for e in references])
        items["milestone_review"] = review_items(choices, by_task, views, actions)
    room = max(0, options.match_budget - n_queued["milestone_match"])
    if "milestone_match" in options.interfaces and room > 0:
        episodes = match_episodes(tasks, by_task)
        actions = read_episode_actions(warehouse, [e["episode_id"] for e in episodes], with_index=True)
        embed = _embed(options.match_embedder)
        pairs = match_pairs(sets, episodes, actions, lambda a, b: text_similarity_matrix(a, b, embed))
        chosen = select_match_pairs(pairs, room, threshold=options.match_threshold, exclude=queued_keys)
        views = read_step_views(warehouse, {(p.episode_id, p.step_idx) for p, _ in chosen}, local_root)
        items["milestone_match"] = match_items(
            chosen, views, sets, threshold=options.match_threshold, embedder=options.match_embedder
        )
    return items


def queue_items(
    warehouse: Warehouse,
    options: PushOptions,
    candidates: Sequence[Mapping[str, Any]],
    server_key: str,
    local_root: Path | None,
    log: Log = _no_log,
) -> dict[str, list[QueueItem]]:
    """Every interface's items: the selected steps, and milestone items (rendered when pushed)."""
    items: dict[str, list[QueueItem]] = defaultdict(list)
    step_names = [i for i in options.interfaces if i in STEP_INTERFACES]
    if step_names and candidates:
        views = read_step_views(warehouse, {(c["episode_id"], int(c["step_idx"])) for c in candidates}, local_root)
        items.update(step_items(candidates, views, step_names, read_step_judgements(warehouse, candidates)))
    if {"milestone_review", "milestone_match"} & set(options.interfaces):
        items.update(milestone_queue_items(warehouse, options, server_key, local_root, log))
    return items


def push_queue(
    warehouse: Warehouse,
    site: LabelStudioSite,
    options: PushOptions,
    *,
    run_id: str | None = None,
    log: Log = _no_log,
) -> dict[str, Any]:
    """Push the selected steps and milestone items to Label Studio, never an item twice per interface
    version (``annotation_queue``, one dataset per server and interface version); a summary."""
    unknown = sorted(set(options.interfaces) - set(INTERFACES))
    if unknown:
        raise ValueError(f"unknown interfaces {unknown}; known: {sorted(INTERFACES)}")
    client = site.connect()
    summary: dict[str, dict] = {}
    project_urls = {}
    try:
        log(f"Label Studio: {client.url} (key from {client.credentials.source})")
        candidates_version = warehouse.current_version("annotation_candidates", "latest")
        candidates = pq.read_table(candidates_version[1]).to_pylist() if candidates_version else []
        local_root = site.home if client.server_key == "local" else None
        items = queue_items(warehouse, options, candidates, client.server_key, local_root, log)
        materialization = Materialization(
            asset="annotation_queue",
            run_id=run_id,
            code_version=PUSH_VERSION,
            parameters=asdict(options) | {"ls_server": client.server_key, "namespace": site.namespace},
            inputs=table_inputs(warehouse, ("annotation_candidates",)),
        )
        outputs = []
        for name in options.interfaces:
            handle = ensure_project(
                client,
                INTERFACES[name],
                site.namespace,
                overlap_share=options.overlap_share,
                local_files_root=local_root,
            )
            dataset = f"{client.server_key}-{handle.interface.version_key}"
            previous = current_rows(warehouse, "annotation_queue", dataset)
            adopted = reconcile_queue(client, handle, previous)
            queued_keys = {r["item_key"] for r in previous} | {r["item_key"] for r in adopted}
            mine = items.get(name, [])

            def progress(done: int, total: int, name: str = name) -> None:
                log(f"{name}: imported {done}/{total} tasks")

            outcome = push_items(
                client,
                handle,
                mine,
                queued_keys,
                chunk_size=options.chunk_size,
                progress=progress,
                expected=len({i.item_key for i in mine} - queued_keys),
            )
            new_rows = adopted + outcome.pushed_rows
            project_urls[name] = f"{client.url}/projects/{handle.project_id}"
            summary[name] = {
                "project_id": handle.project_id,
                "pushed": len(outcome.pushed_rows),
                "adopted": len(adopted),
                "already_queued": outcome.already_queued,
                "queued_total": len(previous) + len(new_rows),
                "seconds": round(outcome.seconds, 2),
            }
            if new_rows or not previous:
                for row in new_rows:
                    row.setdefault(
                        "selection_materialization_id", candidates_version[0] if candidates_version else None
                    )
                table = pa.Table.from_pylist(previous + new_rows, schema=ANNOTATION_QUEUE)
                outputs.append(warehouse.stage_table("annotation_queue", dataset, table, materialization))
        if outputs:
            warehouse.publish(materialization, outputs)
    finally:
        client.close()
    total = sum(s["pushed"] for s in summary.values())
    log(f"pushed {total} tasks: {summary}")
    return {
        "pushed": total,
        "by_interface": summary,
        "label_studio": client.url,
        "projects": project_urls,
        "login": site.login_hint(),
    }


# -- `stepwise annotate push` --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnnotatePushOptions:
    """``stepwise annotate push``: a fresh selection (unless ``select`` is False), then the push."""

    selection: SelectionOptions = field(default_factory=SelectionOptions)
    push: PushOptions = field(default_factory=PushOptions)
    select: bool = True


def parse_source_shares(specs: Sequence[str]) -> dict[str, float]:
    """``--share SOURCE=WEIGHT`` arguments over the default shares (``--share rollout=0.5``; ``=0`` leaves a
    source out); a ValueError with a one-line message for a malformed one."""
    shares = dict(DEFAULT_SOURCE_SHARES)
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--share {spec!r}: expected SOURCE=WEIGHT, e.g. human_demo=0.6 or synthetic=0")
        try:
            shares[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--share {spec!r}: {value!r} is not a number") from None
        if not shares[key.strip()] >= 0:
            raise ValueError(f"--share {spec!r}: a share must be >= 0")
    return shares


def cli_site(
    home: Path, *, namespace: str = "Stepwise", start: bool = True, progress: Log | None = None
) -> LabelStudioSite:
    """The Label Studio the CLI talks to: ``LABEL_STUDIO_URL`` + ``LABEL_STUDIO_API_KEY`` when set, else the
    project's own server under ``home`` (started if it is not running, with ``start``)."""
    return LabelStudioSite(
        connect=lambda: connect(home, start_local=start, progress=progress),
        namespace=namespace,
        home=Path(home),
        own_server=credentials_from_environment() is None,
    )


def push_from_cli(
    warehouse: Warehouse,
    site: LabelStudioSite | None = None,
    options: AnnotatePushOptions | None = None,
    log: Log = _no_log,
) -> dict[str, Any]:
    """Select (``annotation_candidates``) and push (``annotation_queue``) without Dagster, as the
    ``annotation_push`` job does; ``site`` None: :func:`cli_site` on the warehouse's home. ``log`` gets
    progress and, at the end, a short report (what each source got, the projects, where to log in).
    Returns {"selection": the selection summary (None without ``select``), "push": the push summary}."""
    options = options or AnnotatePushOptions()
    site = site or cli_site(warehouse.home, progress=log)
    selection = select_candidates(warehouse, options.selection, log=log) if options.select else None
    pushed = push_queue(warehouse, site, options.push, log=log)
    for line in push_report_lines(selection, pushed):
        log(line)
    return {"selection": selection, "push": pushed}


def push_report_lines(selection: Mapping[str, Any] | None, pushed: Mapping[str, Any]) -> list[str]:
    """The end of ``stepwise annotate push``'s output: the selection by source, each project, the login."""
    lines = []
    if selection is not None:
        shares = ", ".join(f"{k} {v:g}" for k, v in selection["source_shares"].items())
        lines.append(f"selected {selection['selected']} steps; shares configured: {shares}")
        for key, got in selection["selected_share_by_source"].items():
            lines.append(f"  {key:<34} {got:6.1%} of the selection")
    lines.append(f"pushed {pushed['pushed']} new tasks to {pushed['label_studio']}")
    for name, outcome in pushed["by_interface"].items():
        lines.append(
            f"  {name:<18} {outcome['pushed']:>5} new, {outcome['queued_total']:>5} queued in all  "
            f"{pushed['projects'][name]}"
        )
    lines.append(f"annotators log in at {pushed['label_studio']}/user/login/ as {pushed['login']}")
    return lines


# -- downstream of the labels -----------------------------------------------------------------------------------


def build_human_step_labels(warehouse: Warehouse, *, run_id: str | None = None) -> dict[str, Any]:
    """Per-step training labels from people (``human_step_labels``; progress also as ``progress_labels``
    rows of source 'human', dataset 'human'); a summary."""
    labels, progress_rows, label_version = human_step_label_rows(read_human_labels(warehouse))
    materialization = Materialization(
        asset="human_step_labels",
        run_id=run_id,
        code_version=REPORT_VERSION,
        parameters={"label_version": label_version},
        inputs=table_inputs(warehouse, ("human_labels",)),
    )
    publish_tables(
        warehouse,
        materialization,
        [
            ("human_step_labels", "human", labels, HUMAN_STEP_LABELS),
            ("progress_labels", "human", progress_rows, PROGRESS_LABELS),
        ],
    )
    return step_labels_summary(labels, progress_rows, label_version)


def build_agreement(warehouse: Warehouse, *, run_id: str | None = None) -> dict[str, Any]:
    """Annotator statistics (``annotator_stats``) and Cohen's kappa where tasks overlap; a summary and plot."""
    stats, kappas, summary = agreement_report(read_human_labels(warehouse))
    materialization = Materialization(
        asset="annotation_agreement",
        run_id=run_id,
        code_version=REPORT_VERSION,
        inputs=table_inputs(warehouse, ("human_labels",)),
    )
    publish_tables(warehouse, materialization, [("annotator_stats", "human", stats, ANNOTATOR_STATS)])
    if stats:
        summary["plot"] = annotator_plot(stats, kappas, _plot_path(warehouse, "annotation_agreement"))
    return summary


def build_source_comparison(warehouse: Warehouse, *, run_id: str | None = None) -> dict[str, Any]:
    """People vs LCS vs environment vs the model on the human-labelled steps (``label_source_agreement``)."""
    human = current_rows(warehouse, "human_step_labels", "human")
    candidates = {(c.episode_id, c.step_idx): c for c in read_step_candidates(warehouse)} if human else {}
    comparison, summary = source_comparison(comparison_steps(human, candidates))
    materialization = Materialization(
        asset="label_source_comparison",
        run_id=run_id,
        code_version=REPORT_VERSION,
        inputs=table_inputs(warehouse, ("human_step_labels", "progress_labels", "rm_predictions")),
    )
    publish_tables(
        warehouse, materialization, [("label_source_agreement", "human", comparison, LABEL_SOURCE_AGREEMENT)]
    )
    if comparison:
        summary["plot"] = comparison_plot(comparison, _plot_path(warehouse, "label_source_comparison"))
    return summary


# -- checks ------------------------------------------------------------------------------------------------------


def check_unique_annotations(warehouse: Warehouse) -> CheckOutcome:
    """One ``human_labels`` row per Label Studio annotation."""
    return duplicate_annotations(read_human_labels(warehouse))


def check_unsure_excluded(warehouse: Warehouse) -> CheckOutcome:
    """Unsure, skipped and retracted annotations are never usable for training."""
    return unusable_violations(read_human_labels(warehouse))


def check_traced_to_queue(warehouse: Warehouse) -> CheckOutcome:
    """Every label belongs to a queued task (lineage to ``annotation_queue``)."""
    return untraced_labels(read_human_labels(warehouse), read_queue(warehouse))


def check_queue_unique(warehouse: Warehouse) -> CheckOutcome:
    """No item queued twice for the same interface version."""
    return duplicate_queue_items(read_queue(warehouse))


def check_no_secrets(warehouse: Warehouse, site: LabelStudioSite) -> CheckOutcome:
    """No Label Studio key or password in the stage's tables, the plots or the catalog."""
    secrets = [s for s in (os.environ.get(site.api_key_env), os.environ.get(API_KEY_ENV)) if s]
    local = read_local_secrets(site.data_dir)
    if local is not None:
        secrets += [s for s in (local.api_key, local.password) if s]
    found = [
        f"data/{table}/{path}"
        for table in HUMAN_LABEL_TABLES
        for path in files_containing(warehouse.data_dir / table, secrets)
    ]
    found += [f"plots/{path}" for path in files_containing(warehouse.home / "plots", secrets)]
    if warehouse.db_path.exists() and any(s.encode() in file_text(warehouse.db_path) for s in secrets):
        found.append(warehouse.db_path.name)
    return CheckOutcome(not found, {"secrets_checked": len(secrets), "files_with_a_secret": found})
