"""Plots of the labels stage (progress curves, label distribution, label quality), each saved
under the home's ``plots/`` and returned as inline markdown for the asset's metadata."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from warehouse.plotting import Markdown, figure_markdown, integer_ticks, legend_if_labelled, pyplot

STYLE = {"lcs/paper": ("#999", "--"), "lcs/improved": ("#1f77b4", "-"), "env": ("#2ca02c", ":")}


def _label_key(row: Mapping) -> str:
    return row["source"] if row["method"] is None else f"{row['source']}/{row['method']}"


def progress_curves_plot(
    label_rows: Sequence[Mapping], trajectories: Mapping, path: Path, per_outcome: int = 3, seed: int = 0
) -> Markdown:
    """Progress along sample trajectories, successful (top) and failed (bottom), each label source
    a line and key steps marked, in the style of ProgRM Figs. 5-6."""
    curves: dict[str, dict[str, list[tuple[int, float, bool]]]] = defaultdict(lambda: defaultdict(list))
    for r in label_rows:
        curves[r["episode_id"]][_label_key(r)].append((r["step_idx"], r["progress"], r["is_key_step"]))
    complete = [
        e
        for e, c in curves.items()
        if {"lcs/improved", "env"} <= set(c) and e in trajectories and trajectories[e].n_steps >= 3
    ]
    rng = random.Random(seed)
    picks = {
        outcome: rng.sample(pool, min(per_outcome, len(pool)))
        for outcome, pool in (
            ("success", [e for e in complete if trajectories[e].success]),
            ("failure", [e for e in complete if not trajectories[e].success]),
        )
    }
    plt = pyplot()
    fig, axes = plt.subplots(2, per_outcome, figsize=(4 * per_outcome, 6), squeeze=False)
    for row, outcome in enumerate(("success", "failure")):
        for col in range(per_outcome):
            ax = axes[row][col]
            if col >= len(picks[outcome]):
                ax.axis("off")
                continue
            episode_id = picks[outcome][col]
            for key, points in sorted(curves[episode_id].items()):
                points.sort()
                colour, dash = STYLE.get(key, ("#d62728", "-"))
                xs = [p[0] for p in points]
                ax.step(xs, [p[1] for p in points], where="post", color=colour, linestyle=dash, label=key)
                ax.scatter([p[0] for p in points if p[2]], [p[1] for p in points if p[2]], color=colour, s=18, zorder=3)
            t = trajectories[episode_id]
            ax.set_title(f"{t.task_id} ({outcome})", fontsize=8)
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("step", fontsize=7)
            integer_ticks(ax)
            ax.tick_params(labelsize=7)
            if row == 0 and col == 0:
                ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Progress labels along sample trajectories (dots: key steps)", fontsize=10)
    fig.tight_layout()
    return figure_markdown(fig, path, "progress curves")


def label_distribution_plot(label_rows: Sequence[Mapping], path: Path) -> Markdown:
    """Histogram of step progress per label source, with the share of key steps in the legend."""
    values: dict[str, list[float]] = defaultdict(list)
    keys: dict[str, int] = defaultdict(int)
    for r in label_rows:
        values[_label_key(r)].append(r["progress"])
        keys[_label_key(r)] += bool(r["is_key_step"])
    counts = {key: (np.histogram(xs, bins=20, range=(0.0, 1.0))[0], len(xs), keys[key]) for key, xs in values.items()}
    return label_distribution_plot_from_counts(counts, path)


def label_distribution_plot_from_counts(counts: Mapping[str, tuple[np.ndarray, int, int]], path: Path) -> Markdown:
    """:func:`label_distribution_plot` from per-source counts (20 bins over [0, 1], steps, key
    steps), which a streamed run accumulates batch by batch instead of keeping every row."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    edges = np.linspace(0.0, 1.0, 21)
    for key, (hist, n, n_key) in sorted(counts.items()):
        if not n:
            continue
        colour, _ = STYLE.get(key, ("#d62728", "-"))
        ax.stairs(hist, edges, color=colour, linewidth=1.5, label=f"{key} ({n} steps, {n_key / n:.0%} key)")
    ax.set_xlabel("progress label")
    ax.set_ylabel("steps")
    ax.set_yscale("log")
    legend_if_labelled(ax, fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "label distribution")


def quality_plot(rows: Sequence[Mapping], path: Path) -> Markdown:
    """Key-step progress error per task (and task set), paper vs improved mode."""
    by_set: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        by_set[r["task_set"]][r["method"]] = r["key_step_progress_error"]
    names = sorted(by_set, key=lambda s: (s not in ("dev", "held_out"), s))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(names) + 1.5))
    for offset, method, colour in ((-0.2, "paper", "#999"), (0.2, "improved", "#1f77b4")):
        bars = [(i, by_set[n][method]) for i, n in enumerate(names) if by_set[n].get(method) is not None]
        ax.barh([i + offset for i, _ in bars], [v for _, v in bars], height=0.4, color=colour, label=method)
        for i, n in enumerate(names):  # a missing value is said, not drawn as a zero bar
            if by_set[n].get(method) is None:
                ax.text(0, i + offset, " n/a", va="center", fontsize=6, color=colour)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("key-step progress error (lower is better)")
    ax.invert_yaxis()
    legend_if_labelled(ax, fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "label quality")
