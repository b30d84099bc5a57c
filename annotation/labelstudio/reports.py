"""Report bodies of the human-label stage: training labels, agreement, source comparison, checks.

Pure functions over plain rows (``human_labels``, ``annotation_queue`` and ``annotation_candidates``
columns); they return table rows and the figures an asset reports (numbers, markdown tables,
JSON-able dicts). Plots are in :mod:`annotation.labelstudio.plots`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from annotation.labelstudio.agreement import (
    annotator_stats,
    compare_label_sources,
    pairwise_agreement,
    pooled_kappa,
    step_training_labels,
)
from annotation.labelstudio.interfaces import INTERFACES
from annotation.labelstudio.selection import SourceAllocation, StepCandidate
from annotation.labelstudio.sync import ProjectSyncResult
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown

ANNOTATOR_STATS_COLUMNS = (
    "annotator_id",
    "interface",
    "n_annotations",
    "n_unsure",
    "n_skipped",
    "median_lead_time_s",
    "n_overlapping_tasks",
    "agreement_with_others",
    "kappa_with_others",
)
PAIR_COLUMNS = ("interface", "annotator_a", "annotator_b", "n_items", "agreement", "kappa")
COMPARISON_COLUMNS = (
    "source_a",
    "source_b",
    "quantity",
    "n_steps",
    "agreement",
    "cohen_kappa",
    "mean_abs_diff",
    "pearson_r",
)


def md_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], max_rows: int = 40) -> Markdown:
    """Rows as a markdown table (floats to 3 decimals), at most ``max_rows`` of them."""
    if not rows:
        return Markdown("_none_")

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"\n… {len(rows) - max_rows} more rows")
    return Markdown("\n".join(lines))


# -- selection --------------------------------------------------------------------------------------


def selection_summary(rows: Sequence[Mapping[str, Any]], n_candidates: int, n_excluded: int) -> dict[str, Any]:
    """What a selection picked (``annotation_candidates`` rows), by reason and stratum."""
    return {
        "selected": len(rows),
        "candidate_steps": n_candidates,
        "already_queued_steps": n_excluded,
        "by_reason": dict(Counter(r["reason"] for r in rows)),
        "strata": len({r["stratum"] for r in rows}),
        "with_model_prediction": sum(1 for r in rows if r["model_progress"] is not None),
    }


SOURCE_COLUMNS = (
    "source",
    "share",
    "budget",
    "selected",
    "of_budget",
    "disagreements",
    "candidates",
    "candidate_disagreements",
    "covers",
)


def source_summary(allocations: Sequence[SourceAllocation], budget: int) -> dict[str, Any]:
    """How the budget went by episode source: the configured shares, the share of the selection each
    source got, and a table (share, budget, picks, disagreements among them, candidates, sources covered)."""
    selected = sum(a.selected for a in allocations)
    rows = [
        {
            "source": a.key,
            "share": a.share,
            "budget": a.budget,
            "selected": a.selected,
            "of_budget": round(a.selected / budget, 3) if budget > 0 else None,
            "disagreements": a.selected_disagreements,
            "candidates": a.candidates,
            "candidate_disagreements": a.disagreements,
            "covers": ", ".join(a.sources) or "-",
        }
        for a in allocations
    ]
    return {
        "source_shares": {a.key: a.share for a in allocations if a.key != "-"},
        "selected_share_by_source": {
            a.key: round(a.selected / selected, 3) for a in allocations if selected and a.selected
        },
        "selected_disagreements": sum(a.selected_disagreements for a in allocations),
        "by_source": md_table(rows, SOURCE_COLUMNS),
    }


# -- sync -----------------------------------------------------------------------------------------------


def sync_summary(results: Sequence[ProjectSyncResult]) -> dict[str, Any]:
    """A sync of every project: per project, and the totals."""
    return {
        "projects": {
            r.interface: {
                "project_id": r.project_id,
                "status": r.status,
                "created": r.diff.created,
                "updated": r.diff.updated,
                "retracted": r.diff.retracted,
                "active": r.active,
                "usable_for_training": r.usable,
                "export_id": r.export_id,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        },
        "created": sum(r.diff.created for r in results),
        "updated": sum(r.diff.updated for r in results),
        "retracted": sum(r.diff.retracted for r in results),
        "active_labels": sum(r.active for r in results),
        "usable_for_training": sum(r.usable for r in results),
    }


def sync_event(result: ProjectSyncResult) -> dict[str, Any]:
    """A ``human_labels`` materialization for a project whose labels changed: description and metadata."""
    r = result
    return {
        "description": f"{r.interface}: +{r.diff.created} new, {r.diff.updated} updated, {r.diff.retracted} retracted",
        "metadata": {
            "interface": r.interface,
            "ls_project_id": r.project_id,
            "created": r.diff.created,
            "updated": r.diff.updated,
            "retracted": r.diff.retracted,
            "active_labels": r.active,
            "usable_for_training": r.usable,
            "export_id": r.export_id or 0,
            "materialization_id": r.materialization_id or "",
            "path": Path(r.output_path or ""),
        },
    }


# -- training labels -------------------------------------------------------------------------------------


def human_label_version(rows: Iterable[Mapping[str, Any]]) -> str:
    """``human:<interface versions>``: the version of labels built from these rows."""
    versions = sorted({r["interface_version"] for r in rows if r.get("interface_version")})
    return "human:" + ",".join(versions) if versions else "human"


def human_step_label_rows(rows: Sequence[dict]) -> tuple[list[dict], list[dict], str]:
    """(``human_step_labels`` rows, ``progress_labels`` rows of source 'human', label version) from ``human_labels``."""
    label_version = human_label_version(rows)
    labels = step_training_labels(rows, label_version)
    progress_rows = [
        {
            "episode_id": r["episode_id"],
            "step_idx": r["step_idx"],
            "source": "human",
            "method": "annotated",
            "progress": r["progress"],
            "is_key_step": r["correctness"] == "positive",
            "recipe_id": None,
            "completion_ratio": None,
            "label_version": label_version,
        }
        for r in labels
        if r["progress"] is not None
    ]
    return labels, progress_rows, label_version


def step_labels_summary(labels: Sequence[Mapping], progress_rows: Sequence[Mapping], label_version: str) -> dict:
    """Counts of the per-step training labels."""
    counts = Counter(r["correctness"] for r in labels)
    return {
        "steps": len(labels),
        "positive": counts.get("positive", 0),
        "negative": counts.get("negative", 0),
        "no_majority_or_unsure_only": counts.get(None, 0),
        "with_progress": len(progress_rows),
        "unsure_answers_excluded": sum(r["unsure_votes"] for r in labels),
        "label_version": label_version,
    }


# -- agreement -----------------------------------------------------------------------------------------------


def agreement_report(rows: Sequence[dict]) -> tuple[list[dict], dict[str, dict], dict[str, Any]]:
    """(``annotator_stats`` rows, Cohen's kappa per interface, summary) of ``human_labels`` rows."""
    stats = annotator_stats(rows)
    pairs = pairwise_agreement(rows)
    kappas = {}
    for name in INTERFACES:
        kappa, n_pairs = pooled_kappa(rows, name)
        kappas[name] = {"kappa": None if kappa is None else round(kappa, 4), "overlapping_pairs": n_pairs}
    active = [r for r in rows if r["status"] == "active"]
    summary: dict[str, Any] = {
        "annotations": len(active),
        "annotators": len({r["annotator_id"] for r in active if r["annotator_id"]}),
        "cohen_kappa": kappas,
        "unsure_share": float(
            sum(1 for r in active if r["label"] == "unsure")
            / max(1, sum(1 for r in active if r["interface"] == "step_correctness"))
        ),
        "retracted": sum(1 for r in rows if r["status"] == "retracted"),
        "annotator_stats": md_table(stats, ANNOTATOR_STATS_COLUMNS),
        "annotator_pairs": md_table([p.__dict__ for p in pairs], PAIR_COLUMNS),
    }
    scores = [r["value"] for r in active if r["interface"] == "milestone_review" and r["value"] is not None]
    if scores:  # ADMIRE B.5.2 reports the mean score and the share rated 4 or 5
        summary["milestone_mean_score"] = float(sum(scores) / len(scores))
        summary["milestone_share_4_or_5"] = float(sum(1 for s in scores if s >= 4) / len(scores))
    return stats, kappas, summary


# -- label sources compared ----------------------------------------------------------------------------------


def model_verdict(candidate: StepCandidate) -> bool | None:
    """Whether the model calls the step correct: a step judge's probability above 1/2, or progress rising."""
    if candidate.model_step_prob is not None:
        return candidate.model_step_prob > 0.5
    if candidate.model_progress is None:
        return None
    return candidate.model_progress - (candidate.model_previous_progress or 0.0) > 0


def comparison_steps(
    human: Iterable[Mapping[str, Any]], candidates: Mapping[tuple[str, int], StepCandidate]
) -> list[dict]:
    """Each human-labelled step (``human_step_labels`` rows) with every source's progress and verdict."""
    steps = []
    for r in human:
        c = candidates.get((r["episode_id"], int(r["step_idx"])))
        steps.append(
            {
                "human_progress": r["progress"],
                "human_correct": None if r["correctness"] is None else r["correctness"] == "positive",
                "lcs_progress": c.lcs_progress if c else None,
                "lcs_correct": c.lcs_key_step if c else None,
                "env_progress": c.env_progress if c else None,
                "env_correct": c.env_key_step if c else None,
                "model_progress": c.model_progress if c else None,
                "model_correct": model_verdict(c) if c else None,
            }
        )
    return steps


def source_comparison(steps: Sequence[dict]) -> tuple[list[dict], dict[str, Any]]:
    """(``label_source_agreement`` rows, summary) of :func:`comparison_steps`."""
    comparison = compare_label_sources(steps)
    return comparison, {
        "steps_with_human_labels": len(steps),
        "comparisons": md_table(comparison, COMPARISON_COLUMNS),
    }


# -- checks ------------------------------------------------------------------------------------------------------


def duplicate_annotations(rows: Iterable[Mapping[str, Any]]) -> CheckOutcome:
    """One ``human_labels`` row per Label Studio annotation."""
    counts = Counter((r["ls_server"], r["annotation_id"]) for r in rows)
    duplicates = sum(1 for n in counts.values() if n > 1)
    return CheckOutcome(duplicates == 0, {"annotations": len(counts), "duplicated_ids": duplicates})


def unusable_violations(rows: Sequence[Mapping[str, Any]]) -> CheckOutcome:
    """Unsure, skipped and retracted annotations are never usable for training."""
    bad = sum(
        1
        for r in rows
        if r["usable_for_training"] and (r["label"] == "unsure" or r["was_cancelled"] or r["status"] != "active")
    )
    return CheckOutcome(bad == 0, {"violations": bad, "unsure": sum(1 for r in rows if r["label"] == "unsure")})


def untraced_labels(rows: Sequence[Mapping[str, Any]], queue: Iterable[Mapping[str, Any]]) -> CheckOutcome:
    """Every label belongs to a queued task."""
    queued = {(r["ls_server"], r["ls_project_id"], r["ls_task_id"]) for r in queue}
    untraced = sum(1 for r in rows if (r["ls_server"], r["ls_project_id"], r["ls_task_id"]) not in queued)
    return CheckOutcome(untraced == 0, {"labels": len(rows), "not_in_queue": untraced})


def duplicate_queue_items(queue: Sequence[Mapping[str, Any]]) -> CheckOutcome:
    """No item queued twice for the same interface version of one server."""
    counts = Counter((r["ls_server"], r["interface_version"], r["item_key"]) for r in queue)
    duplicates = sum(1 for n in counts.values() if n > 1)
    return CheckOutcome(duplicates == 0, {"queued": len(queue), "duplicated_items": duplicates})
