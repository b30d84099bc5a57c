"""Paired comparisons of two RL report rows on the same held-out episodes, keyed (task, seed, RL
seed): McNemar's counts and exact p, the difference in success with its interval over RL seeds, on
how many RL seeds one row was higher and lower (with the exact sign test), and the same task by task
where the rows span more than one task; and their markdown table. Split from
:mod:`training.rl.report`, which pairs the rows (:func:`~training.rl.report.compared_runs`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from warehouse.statistics import mcnemar_exact_p, p_value_text, paired_comparison, paired_difference


def paired_by_task(a: Mapping[tuple, bool], b: Mapping[tuple, bool]) -> dict[str, dict[str, float]]:
    """McNemar's counts and p of two actors task by task (keys (task, seed, RL seed)), where their
    common episodes span more than one task ({} otherwise): a block's pooled test can hide that one
    task moved and another did not, or went the other way."""
    tasks = sorted({k[0] for k in a.keys() & b.keys()})
    if len(tasks) < 2:
        return {}
    by_task: dict[str, dict[str, float]] = {}
    for t in tasks:
        mine, theirs = ({k: v for k, v in x.items() if k[0] == t} for x in (a, b))
        by_task[t] = paired_comparison(mine, theirs) | _seed_counts(mine, theirs)
    return by_task


def seeds_higher_lower(a: Mapping[tuple, bool], b: Mapping[tuple, bool]) -> tuple[int, int]:
    """On how many RL seeds (the keys' last element) ``a`` solved more of the common episodes than
    ``b``, and on how many fewer. McNemar pairs episodes as if each were independent, but a seed's
    episodes share one training run: where a task is learned outright or not at all (stop 67,
    click-checkboxes-large: 0 or 23-25 of 25 per seed), a difference of two seeds reads as 48
    discordant episodes. These counts show it as what it is."""
    margin: dict[Any, int] = defaultdict(int)
    for k in a.keys() & b.keys():
        margin[k[-1]] += int(a[k]) - int(b[k])
    return sum(m > 0 for m in margin.values()), sum(m < 0 for m in margin.values())


def _seed_counts(a: Mapping[tuple, bool], b: Mapping[tuple, bool]) -> dict[str, float]:
    """:func:`seeds_higher_lower` as a comparison's fields, with the exact sign test over RL seeds."""
    higher, lower = seeds_higher_lower(a, b)
    return {"seeds_higher": higher, "seeds_lower": lower, "seeds_sign_p": mcnemar_exact_p(higher, lower)}


def paired_rows(a: Mapping[tuple, bool], b: Mapping[tuple, bool]) -> dict[str, Any]:
    """McNemar's counts of two actors on the same (task, seed, RL seed), the paired difference
    in success with its interval over RL seeds (the issue's "lower bound above -5 points"), and the
    counts task by task (:func:`paired_by_task`)."""
    difference, low, high = paired_difference(a, b)
    return (
        paired_comparison(a, b)
        | _seed_counts(a, b)
        | {
            "difference": difference,
            "difference_low": low,
            "difference_high": high,
            "by_task": paired_by_task(a, b),
        }
    )


def comparison_lines(comparisons: Sequence[Mapping[str, Any]]) -> list[str]:
    """The paired comparisons' table: McNemar's counts and p, the difference with its interval, and
    on how many RL seeds the actor was higher and lower (:func:`seeds_higher_lower`)."""
    lines = [
        "",
        "| actor | versus | pairs | only actor solves | only the other solves | McNemar p "
        "| difference, points [95%, over RL seeds] | RL seeds higher / lower (sign test p) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in comparisons:
        p = c["mcnemar_p"]
        difference = c.get("difference", float("nan"))
        lines.append(
            f"| {c['actor']} | {c['versus']} | {c['pairs']} | {c['only_a']} | {c['only_b']} | "
            f"{p_value_text(p)} | "
            + (
                "-"
                if math.isnan(difference)
                else f"{100 * difference:+.1f} [{100 * c['difference_low']:+.1f}, {100 * c['difference_high']:+.1f}]"
            )
            + f" | {_seeds_cell(c)} |"
        )
    by_task = [(c, t, n) for c in comparisons for t, n in (c.get("by_task") or {}).items()]
    if by_task:
        lines += [
            "",
            "| task | actor | versus | pairs | only actor solves | only the other solves | McNemar p "
            "| RL seeds higher / lower (sign test p) |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {t} | {c['actor']} | {c['versus']} | {n['pairs']} | {n['only_a']} | {n['only_b']} | "
            f"{p_value_text(n['mcnemar_p'])} | {_seeds_cell(n)} |"
            for c, t, n in by_task
        ]
    return lines


def _seeds_cell(paired: Mapping[str, Any]) -> str:
    """ "higher / lower (sign test p)", or a dash where the rows share no episode."""
    if not paired["pairs"]:
        return "-"
    return f"{paired['seeds_higher']} / {paired['seeds_lower']} ({p_value_text(paired['seeds_sign_p'])})"
