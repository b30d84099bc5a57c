"""How soon an RL run takes off on a task: what final held-out success cannot see.

Two rewards that end level after a fixed budget may still differ in how fast they got there; a
dense reward added to the outcome (ADMIRE's milestone bonus, ADMIRE §3.2; potential-based shaping)
is meant to help exploration, which should show first as speed. A run's *take-off iteration* on a
task is the first iteration whose training episodes there succeed at a share of at least
:data:`TAKE_OFF_SHARE`; a run that never gets there is censored. Two runs are compared over the
iterations both ran (a run resumed for a larger budget against one that was not): one that had not
taken off by the shorter budget counts as that budget, later than any that had, and two such tie.
Rows are compared seed by seed against the
outcome under the same estimator on the same block, with an exact sign test (ties dropped), as the
report's other per-seed comparisons are.

Pure functions: the report reads the training episodes (``rl_episode_rewards``) and calls these.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from warehouse.statistics import mcnemar_exact_p

#: The training success share on a task at which a run counts as taken off (fixed before any take-off
#: figure was read; the pre-registration is quoted in issue 41's stop-70 note).
TAKE_OFF_SHARE = 0.5


def take_off_iteration(
    successes_by_iteration: Mapping[int, Sequence[bool]], share: float = TAKE_OFF_SHARE
) -> int | None:
    """The first iteration whose episodes succeed at ``share`` or more (None: never; iterations
    without an episode on the task are skipped)."""
    for iteration in sorted(successes_by_iteration):
        outcomes = successes_by_iteration[iteration]
        if outcomes and sum(outcomes) / len(outcomes) >= share:
            return iteration
    return None


def take_off_by_seed(episodes: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """Per (row label, task), per RL seed: the run's take-off iteration (None: never) and how many
    iterations it ran (the censoring point). ``episodes``: training episodes with ``actor`` (the
    report's row label), ``rl_seed``, ``iteration``, ``task_id`` and ``success``."""
    outcomes: dict[tuple[str, str, int], dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    iterations: dict[tuple[str, int], set[int]] = defaultdict(set)
    for e in episodes:
        outcomes[(e["actor"], e["task_id"], e["rl_seed"])][e["iteration"]].append(bool(e["success"]))
        iterations[(e["actor"], e["rl_seed"])].add(e["iteration"])
    table: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for (actor, task, seed), by_iteration in sorted(outcomes.items()):
        ran = len(iterations[(actor, seed)])
        table[(actor, task)][seed] = {"take_off": take_off_iteration(by_iteration), "iterations": ran}
    return dict(table)


def _censored(run: Mapping[str, Any], horizon: int) -> int:
    """The take-off iteration seen over the first ``horizon`` iterations: a run that had not taken
    off by then counts as ``horizon`` (so two runs of different budgets compare on the shorter)."""
    took_off = run["take_off"]
    return horizon if took_off is None or took_off >= horizon else took_off


def take_off_rows(
    table: Mapping[tuple[str, str], Mapping[int, Mapping[str, Any]]], baselines: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One row per (row label, task): seeds, how many took off, the median take-off iteration of
    those that did, and against ``baselines[label]`` (the outcome under the row's estimator on its
    block) the seeds that took off sooner and later and the sign test's p."""
    rows = []
    for (actor, task), seeds in sorted(table.items()):
        took_off = sorted(r["take_off"] for r in seeds.values() if r["take_off"] is not None)
        row: dict[str, Any] = {
            "actor": actor,
            "task_id": task,
            "seeds": len(seeds),
            "took_off": len(took_off),
            "median_take_off": float(np.median(took_off)) if took_off else None,
            "versus": None,
        }
        baseline = table.get((baselines.get(actor, ""), task))
        if baseline is not None:
            common = sorted(set(seeds) & set(baseline))
            horizon = {s: min(seeds[s]["iterations"], baseline[s]["iterations"]) for s in common}
            sooner = sum(_censored(seeds[s], horizon[s]) < _censored(baseline[s], horizon[s]) for s in common)
            later = sum(_censored(seeds[s], horizon[s]) > _censored(baseline[s], horizon[s]) for s in common)
            row |= {"versus": baselines[actor], "paired_seeds": len(common), "sooner": sooner, "later": later}
            row["p"] = mcnemar_exact_p(sooner, later)  # the exact sign test: the same binomial
        rows.append(row)
    return rows


def take_off_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's table (markdown) of the rows that have a baseline and of their baselines, under
    a short explanation."""
    baselines = {(r["versus"], r["task_id"]) for r in rows if r["versus"] is not None}
    if not baselines:
        return []
    shown = [r for r in rows if r["versus"] is not None or (r["actor"], r["task_id"]) in baselines]
    lines = [
        "",
        f"**How soon runs take off** (the first iteration whose training episodes on a task succeed at "
        f"{TAKE_OFF_SHARE:.0%} or more, iterations from 0), seed by seed against the outcome under the same "
        "estimator over the iterations both runs ran (not taken off by then: later than any that did; two such "
        "tie); exact sign test, ties dropped:",
        "",
        "| row | task | took off | median iteration | versus | sooner / later | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(shown, key=lambda r: (r["task_id"], r["versus"] is not None, r["actor"])):
        median = "-" if r["median_take_off"] is None else f"{r['median_take_off']:g}"
        paired = "- | - | -" if r["versus"] is None else f"{r['versus']} | {r['sooner']} / {r['later']} | {r['p']:.2g}"
        lines.append(f"| {r['actor']} | {r['task_id']} | {r['took_off']} of {r['seeds']} | {median} | {paired} |")
    return lines
