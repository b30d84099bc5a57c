"""Where a Table-1 row's held-out successes come from (pure): per task over every RL seed, and per
task and RL seed, so a pooled gain can be traced to the tasks and the training runs that made it.

A McNemar test pairs episodes as if independent; the 25 held-out episodes of one RL seed share one
training run, and on a task RL learns outright or not at all per seed (click-checkboxes-large: 28
of 30 runs ended at 0 or 23-25 of 25) a large discordant count can come from two seeds. The
per-seed table shows that without a script over the warehouse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from training.policy.task_blocks import DENSE_BLOCK


def per_task_successes(episodes: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Task -> [successes, episodes] over ``episodes`` (a row's held-out episodes, every RL seed)."""
    counts: dict[str, list[int]] = {}
    for e in episodes:
        tally = counts.setdefault(e["task_id"], [0, 0])
        tally[0] += int(bool(e["success"]))
        tally[1] += 1
    return dict(sorted(counts.items()))


def per_seed_task_successes(
    runs: Iterable[tuple[int, Sequence[Mapping[str, Any]]]],
) -> dict[str, dict[str, list[int]]]:
    """RL seed key (``s<seed>``, as the ``rl_run`` partitions) -> task -> [successes, episodes], from
    (RL seed, episodes) per run; two runs of one seed in a row (an ORM of each rule, say) add up
    rather than hide one another, and a seed without episodes is left out."""
    by_seed: dict[int, list[Mapping[str, Any]]] = {}
    for rl_seed, episodes in runs:
        by_seed.setdefault(rl_seed, []).extend(episodes)
    return {f"s{seed}": per_task_successes(episodes) for seed, episodes in sorted(by_seed.items()) if episodes}


def _block_rows(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[Mapping[str, Any]]]:
    blocks: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get(key):
            blocks.setdefault(r.get("block") or DENSE_BLOCK, []).append(r)
    return blocks


def per_task_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One table per block: each row's held-out successes per task (successes / episodes, every RL
    seed pooled), so a pooled rate's gain can be traced to the tasks that made it."""
    lines: list[str] = []
    for block, members in _block_rows(rows, "task_successes").items():
        tasks = sorted({t for r in members for t in r["task_successes"]})
        lines += ["", f"| {block} block: held-out successes / episodes | " + " | ".join(tasks) + " |"]
        lines.append("|---|" + "---:|" * len(tasks))
        for r in members:
            cells = ["-" if t not in r["task_successes"] else "{} / {}".format(*r["task_successes"][t]) for t in tasks]
            lines.append(f"| {r['actor']} | " + " | ".join(cells) + " |")
    return lines


def per_seed_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One table per block and task: each RL row's held-out successes on that task per RL seed
    (columns ``s0``, ``s1``, ...; a dash where the row has no run of that seed). Cells are counts
    when every cell of the table has the same number of episodes (said in the header), else
    ``successes / episodes``."""
    lines: list[str] = []
    for block, members in _block_rows(rows, "seed_task_successes").items():
        seeds = sorted({s for r in members for s in r["seed_task_successes"]}, key=lambda s: int(s[1:]))
        tasks = sorted({t for r in members for per in r["seed_task_successes"].values() for t in per})
        for task in tasks:
            tallies = [r["seed_task_successes"].get(s, {}).get(task) for r in members for s in seeds]
            sizes = {t[1] for t in tallies if t}
            of = f" (of {next(iter(sizes))})" if len(sizes) == 1 else ""
            lines += ["", f"| {block} block, {task}: held-out successes per RL seed{of} | " + " | ".join(seeds) + " |"]
            lines.append("|---|" + "---:|" * len(seeds))
            for r in members:
                cells = []
                for s in seeds:
                    tally = r["seed_task_successes"].get(s, {}).get(task)
                    cells.append("-" if tally is None else str(tally[0]) if of else "{} / {}".format(*tally))
                lines.append(f"| {r['actor']} | " + " | ".join(cells) + " |")
    return lines


def success_spread(episodes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Task -> how a run's successes spread over the instances' instructions: ``successes``,
    ``instructions`` (distinct instructions among them), ``most_common`` (the one solved most) and
    ``top_share`` (its share of the successes).

    A run that learned one constant answer solves only the instances asking for it, so its
    successes share one instruction however many there are (stop 68: on use-spinner every RL run
    that left the floor clicked the arrow a fixed number of times and submitted, solving the
    4.5-11% of instances whose target was that number); a policy that reads the instruction spreads."""
    solved: dict[str, Counter[str]] = {}
    for e in episodes:
        if e["success"]:
            solved.setdefault(e["task_id"], Counter())[str(e["instruction"])] += 1
    spread = {}
    for task, counts in sorted(solved.items()):
        successes = counts.total()
        most_common = max(sorted(counts), key=counts.__getitem__)  # ties: the first in order, every run
        spread[task] = {
            "successes": successes,
            "instructions": len(counts),
            "most_common": most_common,
            "top_share": counts[most_common] / successes,
        }
    return spread
