"""The human-label stage's figures: what was selected, how annotators work and agree, how label sources compare.

Each function draws one figure from plain rows, saves it as a PNG at ``path`` and returns it as
inline markdown (:mod:`warehouse.plotting`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from warehouse.plotting import Markdown, figure_markdown, pyplot


def selection_plot(rows: Sequence[Mapping], path: Path) -> Markdown:
    """``annotation_candidates`` rows: uncertainty by reason, selected steps per task and outcome."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    for reason in sorted({r["reason"] for r in rows}):
        left.hist(
            [r["uncertainty"] for r in rows if r["reason"] == reason], bins=20, range=(0, 1), alpha=0.7, label=reason
        )
    left.set_xlabel("uncertainty")
    left.set_ylabel("selected steps")
    left.legend(fontsize=7)
    by_task: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        by_task[r["task_id"]]["success" if r["success"] else "failure"] += 1
    tasks = sorted(by_task, key=lambda t: sum(by_task[t].values()))[-25:]
    right.barh(tasks, [by_task[t]["success"] for t in tasks], color="#3a7", label="success")
    right.barh(
        tasks,
        [by_task[t]["failure"] for t in tasks],
        left=[by_task[t]["success"] for t in tasks],
        color="#d54",
        label="failure",
    )
    right.tick_params(axis="y", labelsize=6)
    right.set_xlabel("selected steps per task")
    right.legend(fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "selected steps: uncertainty and strata")


def annotator_plot(stats: Sequence[Mapping], kappas: Mapping[str, Mapping], path: Path) -> Markdown:
    """``annotator_stats`` rows and Cohen's kappa per interface: volume, lead time, agreement."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    annotators = sorted({s["annotator_id"] for s in stats})
    bottom = [0] * len(annotators)
    for interface in sorted({s["interface"] for s in stats}):
        counts = [
            next((s["n_annotations"] for s in stats if s["annotator_id"] == a and s["interface"] == interface), 0)
            for a in annotators
        ]
        axes[0].bar(annotators, counts, bottom=bottom, label=interface)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    axes[0].set_title("annotations per annotator")
    axes[0].legend(fontsize=7)
    leads = [[s["median_lead_time_s"] or 0 for s in stats if s["annotator_id"] == a] for a in annotators]
    axes[1].bar(annotators, [max(v) if v else 0 for v in leads], color="#58a")
    axes[1].set_title("median lead time (s)")
    names = [k for k, v in kappas.items() if v["kappa"] is not None]
    axes[2].bar(names, [kappas[k]["kappa"] for k in names], color="#a85")
    axes[2].set_ylim(-0.2, 1.0)
    axes[2].set_title("Cohen's kappa (overlapping tasks)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "annotator statistics and agreement")


def comparison_plot(comparison: Sequence[Mapping], path: Path) -> Markdown:
    """``label_source_agreement`` rows: agreement and kappa per pair of sources, correctness and progress."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, quantity in zip(axes, ("correctness", "progress"), strict=True):
        rows = [r for r in comparison if r["quantity"] == quantity]
        names = [f"{r['source_a']}~{r['source_b']}\n(n={r['n_steps']})" for r in rows]
        ax.bar(names, [r["agreement"] or 0 for r in rows], color="#7a9", label="agreement")
        ax.plot(
            names,
            [r["cohen_kappa"] if r["cohen_kappa"] is not None else float("nan") for r in rows],
            "o",
            color="#a33",
            label="kappa",
        )
        ax.set_ylim(-0.2, 1.05)
        ax.set_title(quantity)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "label sources compared on the same steps")
