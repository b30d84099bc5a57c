"""Rows of different budgets: found per block, printed under Table 1 and in the advice (training.rl.budgets)."""

from __future__ import annotations

from training.rl.advice import advice_markdown, advice_summary, reward_advice
from training.rl.budgets import budget_lines, mixed_budgets, row_budgets
from training.rl.report import report_markdown, table_one

SEEDS = range(10)


def _episodes(policy_id: str, solved: int) -> list[dict]:
    return [
        {"policy_id": policy_id, "task_id": "click-tab-2", "task_family": "click", "seed": seed,
         "success": seed < solved, "env_return": 1.0 if seed < solved else -1.0, "failure_mode": None}
        for seed in SEEDS
    ]  # fmt: skip


def _run(
    policy_id: str,
    source: str,
    seed: int,
    iterations: int | None,
    block: str = "sparse",
    estimator: str = "reinforce_pp",
) -> dict:
    return {"policy_id": policy_id, "reward_source": source, "estimator": estimator, "rl_seed": seed,
            "env_steps": 100, "block": block, "iterations": iterations}  # fmt: skip


def _report(runs: list[dict]) -> dict:
    by_policy = {"sft": _episodes("sft", 2)}
    by_policy |= {r["policy_id"]: _episodes(r["policy_id"], 3 + r["rl_seed"]) for r in runs}
    report = table_one("sft", runs, by_policy, {"sparse": ["click-tab-2"], "dense": ["click-tab-2"]})
    report["advice"] = reward_advice(report)
    return report


def test_a_rows_budgets_are_its_runs_distinct_iterations_without_the_unrecorded():
    runs = [{"iterations": 20}, {"iterations": 10}, {"iterations": 20}, {"iterations": None}, {}]
    assert row_budgets(runs) == [10, 20]
    assert row_budgets([{}]) == []


OUTCOME, BONUS = "outcome [sparse]", "outcome+milestones:decay [sparse]"


def test_a_block_is_listed_only_where_its_rows_or_a_rows_seeds_ran_different_budgets():
    same = [
        _run("o0", "outcome", 0, 10), _run("o1", "outcome", 1, 10),
        _run("m0", "outcome+milestones:decay", 0, 10), _run("m1", "outcome+milestones:decay", 1, 10),
    ]  # fmt: skip
    assert mixed_budgets(_report(same)["rows"]) == {}
    assert budget_lines(_report(same)["rows"]) == []

    resumed = [*same[:2], _run("m0", "outcome+milestones:decay", 0, 20), _run("m1", "outcome+milestones:decay", 1, 20)]
    assert mixed_budgets(_report(resumed)["rows"]) == {"sparse": {OUTCOME: [10], BONUS: [20]}}

    one_seed_resumed = [*same[:3], _run("m1", "outcome+milestones:decay", 1, 20)]
    assert mixed_budgets(_report(one_seed_resumed)["rows"]) == {"sparse": {OUTCOME: [10], BONUS: [10, 20]}}
    # another block at another budget is not a mix: only rows of one block are compared
    other_block = [*same, _run("d0", "outcome", 0, 20, block="dense"), _run("d1", "outcome", 1, 20, block="dense")]
    assert mixed_budgets(_report(other_block)["rows"]) == {}


def test_the_report_and_the_advice_say_where_budgets_differ():
    runs = [_run("o0", "outcome", 0, 10), _run("o1", "outcome", 1, 10),
            _run("m0", "outcome+milestones:decay", 0, 20), _run("m1", "outcome+milestones:decay", 1, 10)]  # fmt: skip
    report = _report(runs)
    text = str(report_markdown(report))
    assert f"**Budgets differ on the sparse block** (iterations per run: {OUTCOME} 10; {BONUS} 10 and 20)" in text
    (block,) = report["advice"]
    assert block["mixed_budgets"] == {OUTCOME: [10], BONUS: [10, 20]}
    assert advice_summary(block).endswith("(rows of different budgets)")
    assert any(line.startswith("- **rows of different budgets**") for line in advice_markdown(report["advice"]))

    level = _report([r | {"iterations": 10} for r in runs])
    assert "Budgets differ" not in str(report_markdown(level))
    assert level["advice"][0]["mixed_budgets"] == {}
    assert "different budgets" not in advice_summary(level["advice"][0])


def test_the_advice_looks_only_at_the_rows_it_judges():
    """A GRPO row at another budget is in the table's warning, but it changes none of the advice's
    judgements (it judges REINFORCE++ rows only), so the advice does not call its block mixed."""
    runs = [_run("o0", "outcome", 0, 10), _run("o1", "outcome", 1, 10),
            _run("g0", "admire", 0, 20, estimator="grpo"), _run("g1", "admire", 1, 20, estimator="grpo")]  # fmt: skip
    report = _report(runs)
    assert "**Budgets differ on the sparse block**" in str(report_markdown(report))
    (block,) = report["advice"]
    assert block["mixed_budgets"] == {} and "different budgets" not in advice_summary(block)
