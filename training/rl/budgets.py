"""Which rows of Table 1 ran different budgets (pure).

A run's key leaves out its budget of iterations, so ``stepwise rl --iterations 20`` resumes a
10-iteration run and trains ten more (``training.rl.runs.RLSettings.run_key``). After that the report
shows the longer run in its row beside rows of other sources at the shorter budget, and a paired
difference between them is partly the budget's: stop 70's question L moved both rows of
sft-3c6e8e936e's sparse block by 10-12 points by doubling the budget, more than the reward changed
them. Nothing here decides a test differently; the report and the advice say where the budgets differ
so that nobody reads such a difference as the reward's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def row_budgets(members: Iterable[Mapping[str, Any]]) -> list[int]:
    """The distinct budgets (iterations run) of one row's runs, ascending; a run without a figure (a
    hand-made row) is left out."""
    return sorted({int(m["iterations"]) for m in members if m.get("iterations") is not None})


def mixed_budgets(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """Per block whose RL rows did not all run one budget, each RL row's budgets (``iterations`` of
    :func:`training.rl.report.table_one`'s rows). A block is listed when two rows differ or when one
    row's seeds differ among themselves (some resumed, some not); SFT rows have no budget."""
    by_block: dict[str, dict[str, list[int]]] = {}
    for r in rows:
        if r.get("reward_source") and r.get("iterations"):
            by_block.setdefault(r["block"], {})[r["actor"]] = list(r["iterations"])
    return {
        block: actors
        for block, actors in by_block.items()
        if len({budget for budgets in actors.values() for budget in budgets}) > 1
    }


def budget_text(budgets: Sequence[int]) -> str:
    """``20`` or ``10 and 20`` (a row whose seeds ran different budgets)."""
    return " and ".join(str(b) for b in budgets)


def budget_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's warning under Table 1, one line per block of mixed budgets (none where every row of
    a block ran one budget)."""
    lines = []
    for block, actors in mixed_budgets(rows).items():
        listed = "; ".join(f"{actor} {budget_text(budgets)}" for actor, budgets in sorted(actors.items()))
        lines += [
            "",
            f"**Budgets differ on the {block} block** (iterations per run: {listed}): a difference between rows "
            "of different budgets is partly the budget's (a resumed run keeps its key and its row).",
        ]
    return lines
