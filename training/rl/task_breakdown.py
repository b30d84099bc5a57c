"""Where a Table-1 row's held-out successes come from (pure): per task over every RL seed, and per
task and RL seed, so a pooled gain can be traced to the tasks and the training runs that made it.

A McNemar test pairs episodes as if independent; the 25 held-out episodes of one RL seed share one
training run, and on a task RL learns outright or not at all per seed (click-checkboxes-large: 28
of 30 runs ended at 0 or 23-25 of 25) a large discordant count can come from two seeds. The
per-seed table shows that without a script over the warehouse.

A run can also leave the floor without learning the task: on use-spinner every RL run that did
clicked the arrow a fixed number of times and submitted, solving only the instances that asked for
that number (stop 68, 200 fresh instances a run). :func:`constant_answer_test` finds that in the
held-out episodes themselves, from the instructions the successes share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from training.policy.task_blocks import DENSE_BLOCK
from warehouse.statistics import p_value_text, poisson_binomial_upper_tail

#: A row's held-out successes on a task are called a constant answer when the chance of as many of
#: its runs with every success on one instruction, were each run's successes spread like the
#: instances it was evaluated on, is under this (on stop 68's home, 51 rows and tasks, the use-spinner
#: rows read p <= 0.004 and every other p >= 0.06: the value is not critical there)...
CONSTANT_ANSWER_ALPHA = 0.01
#: ... and at least this many runs did so: one run is one training run's luck.
CONSTANT_ANSWER_MIN_RUNS = 2


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


def same_instruction_chance(instance_counts: Sequence[int], successes: int) -> float:
    """The chance that ``successes`` instances drawn at random without replacement, from instances
    whose instructions occur ``instance_counts`` times, all share one instruction:
    sum_i C(c_i, k) / C(N, k) (hypergeometric). 1.0 below two successes (nothing to share)."""
    total = sum(instance_counts)
    if successes < 2:
        return 1.0
    if successes > total:
        raise ValueError(f"{successes} successes among {total} instances")
    return sum(math.comb(c, successes) for c in instance_counts) / math.comb(total, successes)


def constant_answer_test(runs: Iterable[tuple[int, Sequence[Mapping[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Task -> whether a row's held-out successes there are one constant answer per training run,
    from (RL seed, held-out episodes with ``instruction``) per run.

    A run is ``tested`` on a task where it has at least two successes there; it is ``on one
    instruction`` where they all share one. Were its successes as many of its evaluated instances
    drawn at random, that would happen with :func:`same_instruction_chance` (instances repeat
    instructions: use-spinner's 25 held-out instances carry 13 targets), so over the tested runs the
    count has a Poisson-binomial law: ``expected`` its mean, ``p_value`` the chance of at least the
    count seen (:func:`warehouse.statistics.poisson_binomial_upper_tail`). ``answers``: the
    instruction of each run on one instruction, as (RL seed key, instruction). ``alarm``: at least
    :data:`CONSTANT_ANSWER_MIN_RUNS` runs on one instruction and ``p_value`` under
    :data:`CONSTANT_ANSWER_ALPHA`. A policy that reads the instruction but solves one of its values
    only (the easiest) is flagged too: it has not learned the task either. Runs whose episodes
    carry no instruction are not tested; a task no run was tested on is left out."""
    tested: dict[str, list[tuple[int, float, str | None]]] = {}
    for rl_seed, episodes in runs:
        by_task: dict[str, list[Mapping[str, Any]]] = {}
        for e in episodes:
            if e.get("instruction") is not None:
                by_task.setdefault(e["task_id"], []).append(e)
        for task, mine in by_task.items():
            solved = Counter(str(e["instruction"]) for e in mine if e["success"])
            if solved.total() < 2:
                continue
            asked = Counter(str(e["instruction"]) for e in mine)
            chance = same_instruction_chance(list(asked.values()), solved.total())
            tested.setdefault(task, []).append((rl_seed, chance, next(iter(solved)) if len(solved) == 1 else None))
    result = {}
    for task, seen in sorted(tested.items()):
        answers = [(seed, answer) for seed, _, answer in seen if answer is not None]
        p = poisson_binomial_upper_tail([chance for _, chance, _ in seen], len(answers))
        result[task] = {
            "tested": len(seen),
            "on_one_instruction": len(answers),
            "expected": sum(chance for _, chance, _ in seen),
            "p_value": p,
            "answers": [(f"s{seed}", answer) for seed, answer in sorted(answers)],  # two runs of a seed: both
            "alarm": len(answers) >= CONSTANT_ANSWER_MIN_RUNS and p < CONSTANT_ANSWER_ALPHA,
        }
    return result


def constant_answer_alarms(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """RL row -> its constant-answer alarms in words, one per task that raised one
    (``row["constant_answers"]``, :func:`constant_answer_test`); rows without one are left out."""
    alarms: dict[str, list[str]] = {}
    for row in rows:
        for task, t in (row.get("constant_answers") or {}).items():
            if t["alarm"]:
                common = Counter(answer for _, answer in t["answers"]).most_common(1)[0][0]
                alarms.setdefault(row["actor"], []).append(
                    f"constant answer on {task}: in {t['on_one_instruction']} of {t['tested']} runs with 2+ held-out "
                    f"successes every success is one instruction ({t['expected']:.2f} expected by chance, "
                    f"p {p_value_text(t['p_value'])}; e.g. '{common}')"
                )
    return alarms


def constant_answer_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The constant-answer test of every row and task where some run had all its successes on one
    instruction and that was not certain (:func:`constant_answer_test`; SFT's rows too), as a
    table; nothing where none did."""
    found = [
        (r, task, t)
        for r in rows
        for task, t in (r.get("constant_answers") or {}).items()
        if t["answers"] and t["p_value"] < 1.0  # 1.0: one instruction on every instance, nothing to see
    ]
    if not found:
        return []
    lines = [
        "",
        "| row | task | runs with 2+ held-out successes | every success one instruction | expected by chance "
        "| p | constant-answer alarm | the instruction and its runs |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r, task, t in found:
        runs_of: dict[str, list[str]] = {}
        for seed, answer in t["answers"]:
            runs_of.setdefault(answer, []).append(seed)
        answers = "; ".join(f"'{answer}': {' '.join(seeds)}" for answer, seeds in runs_of.items())
        alarm = "yes" if t["alarm"] else "no (SFT's own)" if t.get("inherited") else "no"
        lines.append(
            f"| {r['actor']} | {task} | {t['tested']} | {t['on_one_instruction']} | {t['expected']:.2f} | "
            f"{p_value_text(t['p_value'])} | {alarm} | {answers} |"
        )
    return lines


def mark_inherited_answers(rows: Sequence[Mapping[str, Any]]) -> None:
    """Silence the alarm of an RL row's task where its block's SFT row already answered one constant
    there (SFT's held-out successes, two or more, all on one instruction): the runs inherited it
    from the policy they started from, which RL did not teach. Marks such a test ``inherited``.
    SFT rows carry their own ``constant_answers`` (one run, so never an alarm of their own)."""
    sft_on_one = {
        (r.get("block") or DENSE_BLOCK, task)
        for r in rows
        if not r.get("reward_source")
        for task, t in (r.get("constant_answers") or {}).items()
        if t["on_one_instruction"]
    }
    for r in rows:
        if not r.get("reward_source"):
            continue
        for task, t in (r.get("constant_answers") or {}).items():
            if (r.get("block") or DENSE_BLOCK, task) in sft_on_one:
                t["inherited"], t["alarm"] = True, False
