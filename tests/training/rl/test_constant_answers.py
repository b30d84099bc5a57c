"""The constant-answer test (training.rl.task_breakdown): a row whose runs each solve only the
instances asking for one answer is flagged, in the report, its asset check and the advice; a row
that reads the instruction, and a task whose instruction never varies, are not."""

from __future__ import annotations

import math

import pytest

from training.rl.advice import reward_advice
from training.rl.report import check_table_one, report_markdown, table_one
from training.rl.task_breakdown import (
    CONSTANT_ANSWER_MIN_RUNS,
    constant_answer_alarms,
    constant_answer_test,
    same_instruction_chance,
)

INSTANCES = range(40)


def _target(seed: int) -> int:
    return seed % 10  # 10 targets, each asked by 4 of the 40 instances


def _episodes(policy_id: str, solved, task: str = "use-spinner", instruction=None) -> list[dict]:
    return [
        {
            "policy_id": policy_id,
            "task_id": task,
            "task_family": "spinner",
            "seed": seed,
            "instruction": instruction if instruction is not None else f"Select {_target(seed)} with the spinner",
            "success": solved(seed),
            "env_return": 1.0 if solved(seed) else -1.0,
            "failure_mode": None,
        }
        for seed in INSTANCES
    ]


def test_the_chance_that_random_successes_share_an_instruction_by_hand():
    assert same_instruction_chance([2, 1, 1], 2) == pytest.approx(1 / 6)  # C(2,2) / C(4,2)
    assert same_instruction_chance([4] * 10, 4) == pytest.approx(10 / math.comb(40, 4))
    assert same_instruction_chance([25], 5) == 1.0  # one instruction for every instance: always shared
    assert same_instruction_chance([3, 2], 1) == same_instruction_chance([3, 2], 0) == 1.0
    with pytest.raises(ValueError, match="6 successes among 5 instances"):
        same_instruction_chance([3, 2], 6)


def test_runs_that_each_solve_one_target_raise_the_alarm_and_readers_do_not():
    constant = constant_answer_test((s, _episodes("c", lambda seed, s=s: _target(seed) == s)) for s in range(3))
    reader = constant_answer_test((s, _episodes("r", lambda seed, s=s: seed < 6 + s)) for s in range(3))
    button = _episodes("f", lambda seed: seed < 5, task="click-button", instruction="Click the button.")
    fixed = constant_answer_test((s, button) for s in range(3))  # one instruction everywhere: sharing says nothing
    t = constant["use-spinner"]
    assert (t["tested"], t["on_one_instruction"], t["alarm"]) == (3, 3, True)
    assert t["answers"] == [(f"s{s}", f"Select {s} with the spinner") for s in range(3)]
    twice = constant_answer_test((0, _episodes("c", lambda seed, s=s: _target(seed) == s)) for s in (1, 2))
    assert twice["use-spinner"]["answers"] == [("s0", "Select 1 with the spinner"), ("s0", "Select 2 with the spinner")]
    assert t["expected"] == pytest.approx(3 * 10 / math.comb(40, 4)) and t["p_value"] < 1e-9
    assert reader["use-spinner"]["on_one_instruction"] == 0 and reader["use-spinner"]["p_value"] == 1.0
    assert not reader["use-spinner"]["alarm"]
    f = fixed["click-button"]
    assert (f["on_one_instruction"], f["expected"], f["p_value"], f["alarm"]) == (3, 3.0, 1.0, False)


def test_one_run_or_one_success_a_run_is_not_evidence():
    one_run = constant_answer_test([(0, _episodes("c", lambda seed: _target(seed) == 2))])
    assert one_run["use-spinner"]["on_one_instruction"] == 1 < CONSTANT_ANSWER_MIN_RUNS
    assert not one_run["use-spinner"]["alarm"]
    singles = constant_answer_test((s, _episodes("c", lambda seed, s=s: seed == s)) for s in range(5))
    assert singles == {}  # a run with one success shares nothing: no run tested
    unlabelled = [e | {"instruction": None} for e in _episodes("c", lambda seed: _target(seed) == 2)]
    assert constant_answer_test([(0, unlabelled), (1, unlabelled)]) == {}


def test_a_constant_answer_that_beats_the_outcome_is_flagged_and_not_advised():
    """On 5 RL seeds: the outcome and SFT solve nothing; ``outcome+progrm_env:decay`` solves, run by
    run, the 4 instances of one target (20 successes); ``outcome+prm:decay`` solves 8 instances of 8
    targets a run. Both beat the outcome by McNemar and over seeds; only the reader is advised."""
    by_policy = {"sft": _episodes("sft", lambda seed: False)}
    runs = []
    rows = {"outcome": lambda s: lambda seed: False}
    rows["outcome+progrm_env:decay"] = lambda s: lambda seed: _target(seed) == s
    rows["outcome+prm:decay"] = lambda s: lambda seed: seed < 8
    for source, solved in rows.items():
        for rl_seed in range(5):
            pid = f"{source}-{rl_seed}"
            by_policy[pid] = _episodes(pid, solved(rl_seed))
            runs.append(
                {"policy_id": pid, "reward_source": source, "estimator": "reinforce_pp"}
                | {"rl_seed": rl_seed, "env_steps": 10}
            )
    report = table_one("sft", runs, by_policy)
    report["advice"] = reward_advice(report)
    assert set(constant_answer_alarms(report["rows"])) == {"outcome+progrm_env:decay"}
    (block,) = report["advice"]
    judged = {r["actor"]: r for r in block["rows"]}
    assert judged["outcome+progrm_env:decay"]["versus_outcome"]["judgement"] == "better"
    assert judged["outcome+progrm_env:decay"]["alarms"][0].startswith("constant answer on use-spinner: in 5 of 5")
    assert block["with_outcome"]["actor"] == "outcome+prm:decay"
    text = str(report_markdown(report))
    assert "| outcome+progrm_env:decay | use-spinner | 5 | 5 |" in text
    assert "'Select 0 with the spinner': s0; 'Select 1" in text
    assert "| outcome+prm:decay | use-spinner |" not in text  # nothing on one instruction: not in the table
    check = check_table_one(report)["no_constant_answer"]
    assert not check.passed and set(check.metadata) == {"outcome+progrm_env:decay"}
    readers = [r for r in runs if r["reward_source"] != "outcome+progrm_env:decay"]
    assert check_table_one(table_one("sft", readers, by_policy))["no_constant_answer"].passed


def test_a_constant_sft_already_answered_is_not_blamed_on_rl():
    """SFT solves the instances of target 2 (4 of 40); RL runs keep doing so: the table shows it, the
    alarm stays silent, and the check passes."""
    by_policy = {"sft": _episodes("sft", lambda seed: _target(seed) == 2)}
    runs = []
    for rl_seed in range(5):
        pid = f"outcome-{rl_seed}"
        by_policy[pid] = _episodes(pid, lambda seed: _target(seed) == 2)
        runs.append({"policy_id": pid, "reward_source": "outcome", "estimator": "reinforce_pp"} | {"rl_seed": rl_seed})
    report = table_one("sft", [r | {"env_steps": 10} for r in runs], by_policy)
    rl = next(r for r in report["rows"] if r["reward_source"])["constant_answers"]["use-spinner"]
    assert rl["on_one_instruction"] == 5 and rl["p_value"] < 1e-9 and rl["inherited"] and not rl["alarm"]
    assert constant_answer_alarms(report["rows"]) == {}
    text = str(report_markdown(report))
    assert "| SFT | use-spinner | 1 | 1 |" in text and "| no (SFT's own) |" in text
    assert check_table_one(report)["no_constant_answer"].passed
