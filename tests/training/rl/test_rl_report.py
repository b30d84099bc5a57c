"""ProgRM Table 1 from hand-made held-out episodes: rows, intervals, paired tests, claims' checks."""

from __future__ import annotations

import math

import pytest

from training.rl.pairing import comparison_lines
from training.rl.report import (
    FIRST_TABLE_SEED_SD,
    check_table_one,
    experiment_design,
    exploits_by_actor,
    minimum_detectable_difference,
    pooled_seed_sd,
    report_markdown,
    reward_by_ending,
    reward_hacking_alarms,
    seeds_needed,
    table_one,
    training_reward_auc,
)
from training.rl.task_breakdown import per_seed_lines
from warehouse.statistics import paired_difference

TASKS = [("click-tab-2", "click"), ("enter-text", "type")]
SEEDS = range(10)


def _episodes(policy_id: str, solved: set[tuple[str, int]]) -> list[dict]:
    return [
        {
            "policy_id": policy_id,
            "task_id": task,
            "task_family": family,
            "seed": seed,
            "success": (task, seed) in solved,
            "env_return": 1.0 if (task, seed) in solved else -1.0,
            "failure_mode": None if (task, seed) in solved else "out_of_steps",
        }
        for task, family in TASKS
        for seed in SEEDS
    ]


def _solved(task_seeds: int) -> set[tuple[str, int]]:
    """The first ``task_seeds`` seeds of every task."""
    return {(task, seed) for task, _ in TASKS for seed in range(task_seeds)}


@pytest.fixture()
def report() -> dict:
    by_policy = {
        "sft": _episodes("sft", _solved(4)),
        "out0": _episodes("out0", _solved(5)),
        "out1": _episodes("out1", _solved(5)),
        "lcs0": _episodes("lcs0", _solved(9)),
        "lcs1": _episodes("lcs1", _solved(7)),
    }
    runs = [
        {"policy_id": "out0", "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 100},
        {"policy_id": "out1", "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 1, "env_steps": 300},
        {"policy_id": "lcs0", "reward_source": "progrm_lcs", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1},
        {"policy_id": "lcs1", "reward_source": "progrm_lcs", "estimator": "grpo", "rl_seed": 1, "env_steps": 1},
    ]
    return table_one("sft", runs, by_policy)


def test_rows_average_over_rl_seeds_with_an_interval(report: dict) -> None:
    rows = {r["actor"]: r for r in report["rows"]}
    assert list(rows) == ["SFT", "outcome", "progrm_lcs", "progrm_lcs (grpo)"]
    assert report["families"] == ["click", "type"]
    outcome = rows["outcome"]
    assert outcome["seeds"] == 2 and outcome["episodes"] == 40
    assert outcome["success_rate"] == pytest.approx(0.5)
    # two seeds that agree still leave the episodes' sampling: the interval is not zero-width
    assert 0.0 <= outcome["success_low"] < 0.5 < outcome["success_high"] <= 1.0
    assert -1.0 <= outcome["env_return_low"] < 0.0 < outcome["env_return_high"] <= 1.0
    assert outcome["env_steps"] == 200
    assert outcome["click_success"] == pytest.approx(0.5) and outcome["type_return"] == pytest.approx(0.0)
    assert outcome["failure_modes"]["out_of_steps"] == 20


def test_a_single_policy_gets_a_bootstrap_interval_over_episodes(report: dict) -> None:
    sft = next(r for r in report["rows"] if r["actor"] == "SFT")
    assert sft["success_rate"] == pytest.approx(0.4)
    assert sft["success_low"] < 0.4 < sft["success_high"]
    assert 0.0 <= sft["success_low"] and sft["success_high"] <= 1.0


def test_paired_tests_pair_each_rl_seed_with_sft_and_with_the_outcome_runs(report: dict) -> None:
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    versus_sft = by[("progrm_lcs", "SFT")]
    assert versus_sft["pairs"] == 20 and versus_sft["only_a"] == 10 and versus_sft["only_b"] == 0
    assert versus_sft["mcnemar_p"] < 0.01
    versus_outcome = by[("progrm_lcs", "outcome")]
    # pairs share task, seed and RL seed: lcs0 is paired with out0 only
    assert versus_outcome["pairs"] == 20 and versus_outcome["only_a"] == 8
    assert ("outcome", "outcome") not in by
    # the paired difference: (only a - only b) / pairs, its interval over RL seeds around it
    assert versus_sft["difference"] == pytest.approx(10 / 20)
    assert versus_sft["difference_low"] <= versus_sft["difference"] <= versus_sft["difference_high"]
    expected = (versus_outcome["only_a"] - versus_outcome["only_b"]) / versus_outcome["pairs"]
    assert versus_outcome["difference"] == pytest.approx(expected)
    assert "| progrm_lcs | SFT | 20 | 10 | 0 |" in report_markdown(report)
    assert f"| {100 * versus_sft['difference']:+.1f} [" in report_markdown(report)


def test_the_paired_difference_interval_is_over_rl_seeds():
    # seed 0: a solves every pair b does not; seed 1: they tie. Over seeds the interval spans both.
    a = {("t", s, rl): True for s in range(10) for rl in (0, 1)}
    b = {("t", s, 0): False for s in range(10)} | {("t", s, 1): True for s in range(10)}
    difference, low, high = paired_difference(a, b)
    assert difference == pytest.approx(0.5) and low == pytest.approx(0.0) and high == pytest.approx(1.0)
    assert paired_difference(a, b) == (difference, low, high)  # seeded
    assert all(math.isnan(x) for x in paired_difference(a, {}))


def test_intervals_stay_within_the_rates_range_whatever_the_seeds():
    """Three seeds far apart: a t-interval printed "33.3 [-49.5, 116.1]"; the bootstrap stays in [0, 1]."""
    from warehouse.statistics import seed_bootstrap_interval

    mean, low, high = seed_bootstrap_interval([[1.0] * 10, [0.0] * 10, [0.0] * 10])
    assert mean == pytest.approx(1 / 3) and 0.0 <= low < mean < high <= 1.0
    assert seed_bootstrap_interval([[1.0, 0.0]]) == seed_bootstrap_interval([[1.0, 0.0]])  # seeded
    assert all(math.isnan(v) for v in seed_bootstrap_interval([]))


def _with_orm_and_sparse(report_runs: list[dict], by_policy: dict) -> dict:
    by_policy = dict(by_policy)
    by_policy["orm0"] = _episodes("orm0", _solved(3))
    by_policy["env0"] = _episodes("env0", _solved(6))
    by_policy["sout0"] = _episodes("sout0", _solved(1))
    by_policy["senv0"] = _episodes("senv0", _solved(2))
    runs = [
        *report_runs,
        {"policy_id": "orm0", "reward_source": "orm", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1},
        {"policy_id": "env0", "reward_source": "progrm_env", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1},
        {
            "policy_id": "sout0",
            "reward_source": "outcome",
            "estimator": "reinforce_pp",
            "rl_seed": 0,
            "block": "sparse",
        },
        {
            "policy_id": "senv0",
            "reward_source": "progrm_env",
            "estimator": "reinforce_pp",
            "rl_seed": 0,
            "block": "sparse",
        },
    ]
    return table_one("sft", [r | {"env_steps": r.get("env_steps", 1)} for r in runs], by_policy)


BASE_RUNS = [
    {"policy_id": "out0", "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 100},
    {"policy_id": "lcs0", "reward_source": "progrm_lcs", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1},
]


def test_the_claims_are_each_papers_own_on_held_out_success():
    by_policy = {p: _episodes(p, _solved(n)) for p, n in (("sft", 4), ("out0", 5), ("lcs0", 9))}
    report = _with_orm_and_sparse(BASE_RUNS, by_policy)
    rows = {r["actor"]: r for r in report["rows"]}
    assert {"orm", "progrm_env", "outcome [sparse]", "progrm_env [sparse]"} <= set(rows)
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    assert by[("progrm_lcs", "orm")]["only_a"] == 12  # ProgRM's claim: against the learned ORM
    assert by[("progrm_env [sparse]", "outcome [sparse]")]["only_a"] == 2  # blocks are compared within
    assert ("progrm_env [sparse]", "outcome") not in by
    checks = check_table_one(report)
    assert checks["rl_improves_on_sft"].passed is False  # orm (30%) and the sparse runs are below SFT (40%)
    assert checks["progrm_beats_orm"].passed  # lcs 90%, env 60% > orm 30%
    assert checks["progrm_beats_orm"].metadata["dense"]["paired"]["progrm_lcs"]["only_a"] == 12
    assert checks["dense_beats_outcome_on_sparse"].passed  # 20% > 10% on the sparse block
    worse = dict(report, rows=[r | {"success_rate": 0.2} if r["actor"] == "progrm_env" else r for r in report["rows"]])
    assert not check_table_one(worse)["progrm_beats_orm"].passed
    dense_only = table_one("sft", BASE_RUNS, by_policy)
    missing = check_table_one(dense_only)
    assert (
        not missing["progrm_beats_orm"].passed and "no block has an ORM run" in missing["progrm_beats_orm"].description
    )
    assert not missing["dense_beats_outcome_on_sparse"].passed


def test_progrm_is_compared_with_each_blocks_orm_paying_by_the_blocks_rule():
    """On the sparse block the ORM pays P(success) (its row says so) and is the one ProgRM's sparse
    runs are tested against; the check holds ProgRM's claim in every block that ran an ORM."""
    by_policy = {p: _episodes(p, _solved(n)) for p, n in (("sft", 4), ("out0", 5), ("lcs0", 9))}
    by_policy |= {"sorm0": _episodes("sorm0", _solved(1)), "slcs0": _episodes("slcs0", _solved(3))}
    sparse = {"estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1, "block": "sparse"}
    runs = [
        *BASE_RUNS,
        {"policy_id": "sorm0", "reward_source": "orm", "orm_rule": "probability"} | sparse,
        {"policy_id": "slcs0", "reward_source": "progrm_lcs", "orm_rule": None} | sparse,
    ]
    report = table_one("sft", runs, by_policy)
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    assert by[("progrm_lcs [sparse]", "orm · P(success) [sparse]")]["only_a"] == 4
    check = check_table_one(report)["progrm_beats_orm"]
    assert check.passed and set(check.metadata) == {"sparse"}  # no dense ORM ran: only the sparse block counts
    worse = dict(
        report, rows=[r | {"success_rate": 0.0} if r["actor"] == "progrm_lcs [sparse]" else r for r in report["rows"]]
    )
    assert not check_table_one(worse)["progrm_beats_orm"].passed


def test_learning_curves_are_the_mean_over_seeds_with_the_lowest_and_highest_seed(tmp_path):
    from training.rl.report import learning_curves_by_actor, seed_band_curves

    curves = [
        {"actor": "orm", "block": "dense", "seed": s, "iteration": i, "success_rate": rate}
        for s, rates in ((0, [0.1, 0.3]), (1, [0.3, 0.5]), (2, [0.2]))  # seed 2 is still at its first iteration
        for i, rate in enumerate(rates)
    ] + [{"actor": "outcome [sparse]", "block": "sparse", "seed": 0, "iteration": 0, "success_rate": 0.0}]
    bands = seed_band_curves(curves)
    assert bands["orm"]["mean"] == pytest.approx([0.2, 0.4]) and bands["orm"]["seeds"] == [3.0, 2.0]
    assert bands["orm"]["low"] == [0.1, 0.3] and bands["orm"]["high"] == [0.3, 0.5]
    assert bands["orm"]["iteration"] == [1.0, 2.0]  # iterations count from 1 in the plot
    text = str(learning_curves_by_actor(curves, tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 0 and "learning curves over RL seeds" in text


def test_markdown_has_one_row_per_actor_and_comparison(report: dict) -> None:
    text = str(report_markdown(report))
    assert "| outcome | 2 | 50.0 [" in text
    assert [line.startswith("| progrm_lcs | SFT |") for line in text.splitlines()].count(True) == 1
    assert "click SR / Rwd" in text and "type SR / Rwd" in text


def test_each_rows_successes_are_counted_per_task_over_its_seeds(report: dict) -> None:
    rows = {r["actor"]: r for r in report["rows"]}
    assert rows["SFT"]["task_successes"] == {"click-tab-2": [4, 10], "enter-text": [4, 10]}
    assert rows["outcome"]["task_successes"] == {"click-tab-2": [10, 20], "enter-text": [10, 20]}
    text = str(report_markdown(report))
    assert "| dense block: held-out successes / episodes | click-tab-2 | enter-text |" in text
    assert "| progrm_lcs | 9 / 10 | 9 / 10 |" in text and "| SFT | 4 / 10 | 4 / 10 |" in text


def test_no_episodes_gives_nan_not_an_error() -> None:
    report = table_one("sft", [], {})
    assert len(report["rows"]) == 1 and math.isnan(report["rows"][0]["success_rate"])
    assert not check_table_one(report)["rl_improves_on_sft"].passed


def test_each_block_has_its_own_sft_row_and_is_compared_with_it():
    """SFT is evaluated on both blocks' tasks; its rows and every run's comparison with it keep to
    the run's block (enter-text plays the sparse block here)."""
    solved = {("click-tab-2", s) for s in range(6)} | {("enter-text", 0)}
    sft_episodes = _episodes("sft", solved)
    sparse_run = [e for e in _episodes("senv0", {("enter-text", s) for s in range(3)}) if e["task_id"] == "enter-text"]
    dense_run = [e for e in _episodes("out0", _solved(5)) if e["task_id"] == "click-tab-2"]
    runs = [
        {"policy_id": "out0", "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1},
        {
            "policy_id": "senv0",
            "reward_source": "progrm_env",
            "estimator": "reinforce_pp",
            "rl_seed": 0,
            "env_steps": 1,
            "block": "sparse",
        },
    ]
    blocks = {"dense": ["click-tab-2"], "sparse": ["enter-text"]}
    report = table_one("sft", runs, {"sft": sft_episodes, "out0": dense_run, "senv0": sparse_run}, blocks)
    rows = {r["actor"]: r for r in report["rows"]}
    assert rows["SFT"]["success_rate"] == 0.6 and rows["SFT"]["episodes"] == 10
    assert rows["SFT [sparse]"]["success_rate"] == 0.1 and rows["SFT [sparse]"]["block"] == "sparse"
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    assert by[("progrm_env [sparse]", "SFT [sparse]")]["pairs"] == 10
    assert by[("progrm_env [sparse]", "SFT [sparse]")]["only_a"] == 2
    assert by[("outcome", "SFT")]["only_b"] == 1
    improves = check_table_one(report)["rl_improves_on_sft"]
    assert not improves.passed  # outcome 50% < SFT 60% on the dense block, though 30% > 10% on the sparse one
    assert improves.metadata["sft_sparse"] == 0.1
    assert improves.metadata["not_above_sft"] == {"outcome": {"rl": 0.5, "sft": 0.6}}
    assert improves.metadata["every_run_above_sft_by_block"] == {"dense": False, "sparse": True}
    empty_sparse = table_one("sft", runs[:1], {"sft": sft_episodes}, {"dense": ["click-tab-2"], "sparse": []})
    assert [r["actor"] for r in empty_sparse["rows"]] == ["SFT", "outcome"]
    # the rule that chose the sparse block is said above the table, where a sparse row is in it
    assert "Sparse block chosen by the unsolved rule" in report_markdown(report | {"sparse_rule": "unsolved"})
    left_out = report | {"sparse_rule": "sampled", "sparse_left_out": {"use-spinner": 0.1, "click-shades": 0.225}}
    assert "one fixed answer solving too many of their instances: use-spinner (10.0%), click-shades (22.5%)." in (
        report_markdown(left_out)
    )
    assert "Sparse block" not in report_markdown(empty_sparse | {"sparse_rule": "unsolved"})
    # a block without a family's tasks shows a dash in that family's column, not "nan / nan"
    sparse_line = next(line for line in report_markdown(report).splitlines() if line.startswith("| SFT [sparse]"))
    assert "| - |" in sparse_line and "nan" not in report_markdown(report)


def test_each_runs_reward_is_judged_on_its_own_training_episodes():
    def episode(source: str, reward: float, success: bool, **extra) -> dict:
        return {"reward_source": source, "estimator": "reinforce_pp", "reward": reward, "success": success} | extra

    episodes = [
        *(episode("outcome", float(ok), ok) for ok in (True, False, False, True)),  # exact: AUC 1
        episode("orm", 0.9, False),  # a confident wrong judgement ranks a failure first
        episode("orm", 0.8, True),
        episode("orm", 0.1, False),
        episode("prm", 2.0, True, block="sparse"),
        episode("prm", 1.0, False, block="sparse"),
    ]
    rows = {r["actor"]: r for r in training_reward_auc(episodes)}
    assert set(rows) == {"outcome", "orm", "prm [sparse]"}
    assert rows["outcome"]["auc"] == 1.0 and rows["outcome"]["episodes"] == 4 and rows["outcome"]["successes"] == 2
    assert rows["orm"]["auc"] == 0.5  # above one failure, below the other
    assert rows["orm"]["auc_low"] <= 0.5 <= rows["orm"]["auc_high"]
    # what each reward paid for, by how the episode ended (the raw environment reward)
    endings = [
        episode("orm", 0.9, False) | {"env_outcome": 0.0},  # never submitted, paid most
        episode("orm", 0.7, False) | {"env_outcome": 0.5},  # partly right
        episode("orm", 0.5, True) | {"env_outcome": 1.0},
        episode("orm", 0.1, False) | {"env_outcome": -1.0},
        episode("orm", 0.3, False) | {"env_outcome": -1.0},
    ]
    (paid,) = reward_by_ending(endings)
    assert paid["no submission"] == {"episodes": 1, "mean_reward": pytest.approx(0.9)}
    assert paid["wrong submission"] == {"episodes": 2, "mean_reward": pytest.approx(0.2)}
    assert paid["partial credit"]["mean_reward"] == pytest.approx(0.7) and paid["success"]["episodes"] == 1
    table = str(report_markdown({"families": [], "rows": [], "comparisons": [], "reward_by_ending": [paid]}))
    assert "| orm | 0.50 (1) | 0.70 (1) | 0.20 (2) | 0.90 (1) | - |" in table
    # what the runs hand to the reward models: the failures paid at least as much as a success of
    # their task and run (two here), and the successes paid no more than a failure (the one)
    ids = [e | {"episode_id": f"e{i}", "run_key": "orm-s0", "task_id": "t"} for i, e in enumerate(endings)]
    exact = [episode("outcome", float(ok), ok) | {"episode_id": f"o{ok}", "run_key": "out-s0"} for ok in (True, False)]
    handed = exploits_by_actor(ids + exact)
    assert handed["orm"] == {"paid_failure": 2, "unpaid_success": 1}
    assert handed["outcome"] == {"paid_failure": 0, "unpaid_success": 0}  # an exact reward misranks nothing
    table = str(
        report_markdown({"families": [], "rows": [], "comparisons": [], "reward_by_ending": [paid], "exploits": handed})
    )
    assert "| orm | 0.50 (1) | 0.70 (1) | 0.20 (2) | 0.90 (1) | 2 / 1 |" in table
    probability = [episode("orm", 0.2, True, block="sparse") | {"orm_rule": "probability"}]
    assert training_reward_auc(probability)[0]["actor"] == "orm · P(success) [sparse]"  # the table row's name
    only_failures = training_reward_auc([episode("orm", 0.3, False)])[0]
    assert math.isnan(only_failures["auc"])  # no success to rank: no AUC, not an error
    text = str(
        report_markdown({"families": [], "rows": [], "comparisons": [], "training_reward_auc": list(rows.values())})
    )
    assert "| outcome | 4 | 2 | 1.00 [1.00, 1.00] | - |" in text  # no task given: no within-task AUC
    # with tasks: a reward that pays the easy task more ranks well pooled and inverts within each task
    by_task = [
        *(episode("orm", r, True, task_id="easy") for r in (0.90, 0.91, 0.92)),
        episode("orm", 0.95, False, task_id="easy"),
        episode("orm", 0.1, True, task_id="hard"),
        *(episode("orm", r, False, task_id="hard") for r in (0.20, 0.21, 0.22)),
    ]
    (judged,) = training_reward_auc(by_task)
    assert judged["auc"] == pytest.approx(9 / 16) and judged["within_task_auc"] == 0.0
    text = str(report_markdown({"families": [], "rows": [], "comparisons": [], "training_reward_auc": [judged]}))
    assert "| orm | 8 | 4 | 0.56 [" in text and "| 0.00 [0.00, 0.00] |" in text


def test_the_power_calculation_matches_the_normal_formula_and_inverts() -> None:
    # (1.960 + 0.842) * 0.10 * sqrt(2 / 5) = 0.1772: two arms of 5 seeds, seeds spread by 10 points
    assert minimum_detectable_difference(0.10, 5) == pytest.approx(0.1772, abs=1e-4)
    # more seeds detect less; a stricter level or more power needs more
    assert minimum_detectable_difference(0.10, 10) < minimum_detectable_difference(0.10, 5)
    assert minimum_detectable_difference(0.10, 5, alpha=0.01) > minimum_detectable_difference(0.10, 5)
    n = seeds_needed(0.10, 0.15)
    assert minimum_detectable_difference(0.10, n) <= 0.15 < minimum_detectable_difference(0.10, n - 1)
    with pytest.raises(ValueError):
        minimum_detectable_difference(0.1, 0)


def test_the_seed_spread_is_pooled_over_sources_with_two_seeds_or_more() -> None:
    assert pooled_seed_sd([[0.5]]) is None
    # deviations 0.1, 0.1 (1 dof) and 0, 0, 0 (2 dof): sqrt(0.02 / 3)
    assert pooled_seed_sd([[0.4, 0.6], [0.7, 0.7, 0.7], [0.9]]) == pytest.approx(math.sqrt(0.02 / 3))


def test_the_design_says_what_each_block_can_detect(report: dict) -> None:
    design = {d["actor"]: d for d in report["design"]}
    assert set(design) == {"outcome", "progrm_lcs", "progrm_lcs (grpo)"}  # RL rows only
    # outcome's two seeds both solve 50%: a measured spread of 0, and the first table's, larger, is used
    assert design["outcome"]["measured_sd"] == pytest.approx(0.0)
    assert design["outcome"]["seed_sd"] == FIRST_TABLE_SEED_SD and "above this block's" in design["outcome"]["sd_from"]
    spread = experiment_design(
        [{"actor": a, "reward_source": a, "seeds": 2, "seed_success": rates} for a, rates in (("x", [0.2, 0.6]),)]
    )
    assert spread[0]["seed_sd"] == pytest.approx(math.sqrt(0.08)) and spread[0]["sd_from"] == "this block's seeds"
    one_seed = experiment_design([{"actor": "orm", "reward_source": "orm", "seeds": 1, "seed_success": [0.4]}])
    assert one_seed[0]["seed_sd"] == FIRST_TABLE_SEED_SD and "first table" in one_seed[0]["sd_from"]
    assert one_seed[0]["detectable"] == pytest.approx(minimum_detectable_difference(FIRST_TABLE_SEED_SD, 1))
    assert "smallest difference detected" in report_markdown(report)


def test_a_flywheel_row_is_compared_with_the_same_source_pinned_to_a_model_no_round_trained():
    """After a round replaced a kind's model, its demonstration-trained model can still be pinned
    (``--reward-model <id>``: tagged ``model <id>``): the round's row is paired with that row too,
    and not with another source's, a flywheel round's or another block's."""
    base = {"estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1}
    runs = [
        base | {"policy_id": "orm_fw", "reward_source": "orm", "reward_model_tag": "flywheel r2"},
        base | {"policy_id": "orm_demo", "reward_source": "orm", "reward_model_tag": "model orm-demo"},
        base | {"policy_id": "orm_r1", "reward_source": "orm", "reward_model_tag": "flywheel r1"},
        base | {"policy_id": "env_demo", "reward_source": "progrm_env", "reward_model_tag": "model env-demo"},
        base
        | {"policy_id": "orm_sparse", "reward_source": "orm", "reward_model_tag": "model orm-demo", "block": "sparse"},
    ]
    by_policy = {p: _episodes(p, _solved(n)) for p, n in [("sft", 2), ("orm_fw", 9), ("orm_demo", 3), ("orm_r1", 5),
                                                          ("env_demo", 4), ("orm_sparse", 1)]}  # fmt: skip
    report = table_one("sft", runs, by_policy)
    versus = {c["versus"] for c in report["comparisons"] if c["actor"] == "orm · flywheel r2"}
    assert "orm · model orm-demo" in versus
    assert not versus & {"orm · flywheel r1", "progrm_env · model env-demo", "orm · model orm-demo [sparse]"}
    pinned = next(
        c for c in report["comparisons"] if (c["actor"], c["versus"]) == ("orm · flywheel r2", "orm · model orm-demo")
    )
    assert pinned["pairs"] == 20 and pinned["only_a"] == 12 and pinned["only_b"] == 0
    # the pinned row itself is not paired back with the round's (it is not a flywheel row)
    assert not any(c["actor"] == "orm · model orm-demo" and "flywheel" in c["versus"] for c in report["comparisons"])


def test_a_control_is_compared_with_the_shaped_form_it_controls_for():
    """``outcome+<source>:shuffled`` is paired with ``outcome+<source>:shaped`` (the comparison its
    control exists for), besides the outcome and its learned part alone; the shaped row is not
    paired with the control in turn."""
    base = {"estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1, "block": "sparse"}
    runs = [
        base | {"policy_id": "out", "reward_source": "outcome"},
        base | {"policy_id": "shaped", "reward_source": "outcome+progrm_env:shaped"},
        base | {"policy_id": "shuffled", "reward_source": "outcome+progrm_env:shuffled"},
    ]
    by_policy = {p: _episodes(p, _solved(n)) for p, n in [("sft", 1), ("out", 1), ("shaped", 6), ("shuffled", 3)]}
    report = table_one("sft", runs, by_policy)
    versus = {c["versus"]: c for c in report["comparisons"] if c["actor"] == "outcome+progrm_env:shuffled [sparse]"}
    assert {"outcome [sparse]", "outcome+progrm_env:shaped [sparse]"} <= set(versus)
    assert versus["outcome+progrm_env:shaped [sparse]"]["only_b"] == 3 * len(TASKS)  # shaped solved 6 a task, it 3
    assert not any(
        c["actor"] == "outcome+progrm_env:shaped [sparse]" and "shuffled" in c["versus"] for c in report["comparisons"]
    )


def test_a_run_of_another_estimator_is_compared_with_the_same_reward_under_reinforce_pp():
    """``outcome+progrm_env:shaped_kl_apart`` is paired with the same reward under REINFORCE++ (what the
    estimator alone changed) and with the outcome under its own estimator (what the learned part adds
    there), besides the REINFORCE++ outcome; REINFORCE++ rows are not paired with estimator rows."""
    base = {"rl_seed": 0, "env_steps": 1, "block": "sparse"}
    pp, apart = {"estimator": "reinforce_pp"}, {"estimator": "reinforce_pp_kl_apart"}
    runs = [
        base | pp | {"policy_id": "out", "reward_source": "outcome"},
        base | apart | {"policy_id": "out_apart", "reward_source": "outcome"},
        base | pp | {"policy_id": "shaped", "reward_source": "outcome+progrm_env:shaped"},
        base | apart | {"policy_id": "shaped_apart", "reward_source": "outcome+progrm_env:shaped"},
    ]
    solved = [("sft", 1), ("out", 1), ("out_apart", 4), ("shaped", 2), ("shaped_apart", 7)]
    report = table_one("sft", runs, {p: _episodes(p, _solved(n)) for p, n in solved})
    versus = {c["versus"]: c for c in report["comparisons"] if c["actor"].startswith("outcome+progrm_env:shaped (")}
    assert {
        "outcome [sparse]",
        "outcome (reinforce_pp_kl_apart) [sparse]",
        "outcome+progrm_env:shaped [sparse]",
    } <= set(versus)
    assert versus["outcome (reinforce_pp_kl_apart) [sparse]"]["only_a"] == 3 * len(TASKS)  # 7 against 4 a task
    assert versus["outcome+progrm_env:shaped [sparse]"]["only_a"] == 5 * len(TASKS)
    outcome_apart = {
        c["versus"] for c in report["comparisons"] if c["actor"] == "outcome (reinforce_pp_kl_apart) [sparse]"
    }
    assert "outcome [sparse]" in outcome_apart and not any("kl_apart" in v for v in outcome_apart)
    assert not any(
        c["actor"] in ("outcome [sparse]", "outcome+progrm_env:shaped [sparse]") and "kl_apart" in c["versus"]
        for c in report["comparisons"]
    )


def test_runs_on_flywheel_models_are_their_own_rows_compared_with_todays_models():
    """A source trained against a flywheel round's reward model is a row of its own (not averaged
    with the same source on today's model), compared with that source on today's model (the
    effect of the agent's own episodes, on its own) and with the ORM of the same round."""
    base = {"estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1}
    runs = [
        base | {"policy_id": "orm0", "reward_source": "orm"},
        base | {"policy_id": "orm_fw", "reward_source": "orm", "reward_model_tag": "flywheel r3"},
        base | {"policy_id": "lcs0", "reward_source": "progrm_lcs"},
        base | {"policy_id": "lcs_fw", "reward_source": "progrm_lcs", "reward_model_tag": "flywheel r3"},
    ]
    by_policy = {
        "sft": _episodes("sft", _solved(2)),
        "orm0": _episodes("orm0", _solved(2)),
        "orm_fw": _episodes("orm_fw", _solved(3)),
        "lcs0": _episodes("lcs0", _solved(2)),
        "lcs_fw": _episodes("lcs_fw", _solved(8)),
    }
    report = table_one("sft", runs, by_policy)
    rows = {r["actor"]: r for r in report["rows"]}
    assert set(rows) == {"SFT", "orm", "orm · flywheel r3", "progrm_lcs", "progrm_lcs · flywheel r3"}
    assert rows["progrm_lcs · flywheel r3"]["success_rate"] == pytest.approx(0.8)
    assert rows["progrm_lcs"]["success_rate"] == pytest.approx(0.2)
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    today = by[("progrm_lcs · flywheel r3", "progrm_lcs")]
    assert today["pairs"] == 20 and today["only_a"] == 12 and today["only_b"] == 0
    assert by[("progrm_lcs · flywheel r3", "orm · flywheel r3")]["only_a"] == 10  # ProgRM's claim, same round
    assert ("progrm_lcs · flywheel r3", "orm") not in by
    assert by[("orm · flywheel r3", "orm")]["only_a"] == 2
    assert ("progrm_lcs", "orm · flywheel r3") not in by  # today's runs keep today's baseline
    auc = training_reward_auc(
        [
            {"reward_source": "orm", "estimator": "reinforce_pp", "reward": r, "success": s, "reward_model_tag": t}
            for r, s, t in [
                (1.0, True, "flywheel r3"),
                (0.0, False, "flywheel r3"),
                (0.0, True, None),
                (1.0, False, None),
            ]
        ]
    )
    assert {a["actor"]: a["auc"] for a in auc} == {"orm": 0.0, "orm · flywheel r3": 1.0}


def test_the_hacking_alarm_flags_a_rising_return_with_falling_success_and_a_reward_that_cannot_rank():
    """Issue 41 item 5, by hand: SFT solves 4 of 10 seeds per task; the ORM run 3 (below SFT) while
    its training return rose, the outcome run 5 (above SFT) while its return rose too; the ORM's
    reward ranks its own episodes at within-task AUC 0.5, the outcome's at 1."""
    by_policy = {p: _episodes(p, _solved(n)) for p, n in (("sft", 4), ("out0", 5), ("orm0", 3))}
    runs = [
        {"policy_id": "out0", "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 9},
        {"policy_id": "orm0", "reward_source": "orm", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 9},
    ]
    report = table_one("sft", runs, by_policy)
    report["curves"] = [
        {"actor": actor, "seed": 0, "iteration": i, "mean_reward": reward, "kl_to_reference": 0.1 * i}
        for actor, rewards in (("outcome", (0.3, 0.4, 0.6)), ("orm", (0.5, 0.9, 0.8)))
        for i, reward in enumerate(rewards)
    ]
    trained = [
        {"reward_source": source, "estimator": "reinforce_pp", "task_id": task, "reward": reward, "success": success}
        for task in ("a", "b")
        for source, pays in (("outcome", {True: 1.0, False: 0.0}), ("orm", {True: 0.7, False: 0.7}))
        for success in (True, False, True, False)
        for reward in [pays[success]]
    ]
    report["training_reward_auc"] = training_reward_auc(trained)
    alarms = {a["actor"]: a for a in reward_hacking_alarms(report)}
    assert alarms["outcome"]["alarms"] == []  # its return rose and so did held-out success
    assert alarms["outcome"]["return_change"] == pytest.approx(0.3)
    assert alarms["outcome"]["mean_kl"] == pytest.approx(0.1)  # (0 + 0.1 + 0.2) / 3: how far it moved from SFT
    orm = alarms["orm"]
    assert orm["return_change"] == pytest.approx(0.3) and orm["success_change"] == pytest.approx(-0.1)
    assert orm["ranking_auc"] == pytest.approx(0.5)
    assert len(orm["alarms"]) == 2
    assert orm["alarms"][0].startswith("training return +0.300 while held-out success fell 10.0 points below SFT")
    assert orm["alarms"][1] == "within-task AUC 0.50 < 0.6 on its own training episodes"
    report["hacking_alarms"] = list(alarms.values())
    check = check_table_one(report)["no_reward_hacking_alarm"]
    assert not check.passed and set(check.metadata) == {"orm"}
    assert "| orm | +0.300 | -10.0 points | 0.50 | 0.100 | training return +0.300" in report_markdown(report)
    # a return that fell, with success below SFT, raises no alarm on that count
    report["curves"] = [c | {"mean_reward": -c["iteration"]} for c in report["curves"]]
    again = {a["actor"]: a["alarms"] for a in reward_hacking_alarms(report)}
    assert again == {"orm": ["within-task AUC 0.50 < 0.6 on its own training episodes"], "outcome": []}
    # a failure ending paid as much as success (enough episodes of it) is a sign of its own
    endings = {"success": {"episodes": 40, "mean_reward": 1.25}, "partial credit": {"episodes": 30, "mean_reward": 0.5}}
    endings |= {"wrong submission": {"episodes": 5, "mean_reward": 2.0}}  # too few episodes to judge
    endings |= {"no submission": {"episodes": 222, "mean_reward": 1.29}}
    report["reward_by_ending"] = [{"actor": "outcome"} | endings]
    flagged = {a["actor"]: a["alarms"] for a in reward_hacking_alarms(report)}
    assert flagged["outcome"] == ["paid 'no submission' 1.29 (222 episodes), success 1.25"]


def test_every_report_prints_a_p_value_one_way():
    """One rule for p-values in every table (RL report, guidance, reward-model report): three
    decimals, "<0.001" below (never "0.000"), "n/a" where there is no test."""
    from warehouse.statistics import p_value_text

    assert [p_value_text(p) for p in (0.0, 0.0004, 0.001, 0.0456, 1.0, float("nan"), None)] == [
        "<0.001",
        "<0.001",
        "0.001",
        "0.046",
        "1.000",
        "n/a",
        "n/a",
    ]


def test_a_block_of_two_tasks_is_also_compared_task_by_task():
    """The pooled test says 5 / 2; task by task one task moved up and the other down."""
    solved = {("click-tab-2", s) for s in range(9)} | {("enter-text", s) for s in range(2)}
    by_policy = {"sft": _episodes("sft", _solved(4)), "out0": _episodes("out0", solved)}
    report = table_one("sft", BASE_RUNS[:1], by_policy)
    (versus_sft,) = [c for c in report["comparisons"] if c["versus"] == "SFT"]
    assert (versus_sft["only_a"], versus_sft["only_b"]) == (5, 2)
    by_task = versus_sft["by_task"]
    assert {t: (n["pairs"], n["only_a"], n["only_b"]) for t, n in by_task.items()} == {
        "click-tab-2": (10, 5, 0),
        "enter-text": (10, 0, 2),
    }
    assert by_task["click-tab-2"]["mcnemar_p"] == pytest.approx(0.0625)  # 2 * 0.5 ** 5
    assert by_task["enter-text"]["seeds_lower"] == 1 and by_task["click-tab-2"]["seeds_higher"] == 1  # one RL seed
    assert "| enter-text | outcome | SFT | 10 | 0 | 2 | 0.500 | 0 / 1 (1.000) |" in str(report_markdown(report))
    # one task: nothing to split
    one = {p: [e for e in eps if e["task_id"] == "click-tab-2"] for p, eps in by_policy.items()}
    assert table_one("sft", BASE_RUNS[:1], one)["comparisons"][0]["by_task"] == {}


def test_seeds_that_learned_a_task_outright_are_counted_as_seeds_not_as_episodes():
    """Two of three RL seeds learn a task outright (10 of 10) where the other row's seeds solve 1:
    McNemar sees 18 discordant episodes; over seeds it is 2 higher, 0 lower, 1 tied."""
    sft = _episodes("sft", set())
    learned = {("click-tab-2", s) for s in SEEDS}
    runs = [
        {"policy_id": f"{src}{k}", "reward_source": src, "estimator": "reinforce_pp", "rl_seed": k, "env_steps": 1}
        for src in ("outcome", "orm")
        for k in range(3)
    ]
    by_policy = {"sft": sft} | {
        "outcome0": _episodes("outcome0", learned),
        "outcome1": _episodes("outcome1", learned),
        "outcome2": _episodes("outcome2", {("click-tab-2", 0)}),
    }
    by_policy |= {f"orm{k}": _episodes(f"orm{k}", {("click-tab-2", 0)}) for k in range(3)}
    report = table_one("sft", runs, by_policy)
    by = {(c["actor"], c["versus"]): c for c in report["comparisons"]}
    versus_orm = by[("outcome", "orm")]
    assert (versus_orm["only_a"], versus_orm["only_b"]) == (18, 0)
    assert (versus_orm["seeds_higher"], versus_orm["seeds_lower"]) == (2, 0)
    assert (by[("orm", "outcome")]["seeds_higher"], by[("orm", "outcome")]["seeds_lower"]) == (0, 2)
    line = next(x for x in str(report_markdown(report)).splitlines() if x.startswith("| outcome | orm |"))
    assert versus_orm["seeds_sign_p"] == 0.5  # 2 of 2 seeds one way: 2 * 0.5 ** 2
    # against SFT (one policy, no RL seed of its own) each RL seed is paired with SFT's episodes
    assert (by[("outcome", "SFT")]["seeds_higher"], by[("outcome", "SFT")]["seeds_lower"]) == (3, 0)
    assert line.endswith("| 2 / 0 (0.500) |")


def test_rows_without_a_common_episode_show_dashes_not_a_sign_test():
    none_shared = {"actor": "a", "versus": "b", "pairs": 0, "only_a": 0, "only_b": 0, "mcnemar_p": 1.0}
    none_shared |= {"difference": float("nan"), "seeds_higher": 0, "seeds_lower": 0, "seeds_sign_p": 1.0}
    assert comparison_lines([none_shared])[-1] == "| a | b | 0 | 0 | 0 | 1.000 | - | - |"


def test_each_rl_row_counts_its_successes_per_task_and_rl_seed_in_a_table_per_task():
    """The per-seed table shows what a pooled count hides: outcome's 21 successes on click-tab-2 are
    two seeds at 10 of 10 and one at 1; the ORM's are 1, 1 and 1; a seed a row never ran is a dash."""
    sft = _episodes("sft", set())
    learned = {("click-tab-2", s) for s in SEEDS}
    runs = [
        {"policy_id": f"{src}{k}", "reward_source": src, "estimator": "reinforce_pp", "rl_seed": k, "env_steps": 1}
        for src, seeds in (("outcome", (0, 1, 2)), ("orm", (0, 1, 10)))
        for k in seeds
    ]
    by_policy = {"sft": sft, "outcome0": _episodes("outcome0", learned), "outcome1": _episodes("outcome1", learned)}
    by_policy |= {"outcome2": _episodes("outcome2", {("click-tab-2", 0)})}
    by_policy |= {f"orm{k}": _episodes(f"orm{k}", {("click-tab-2", 0), ("enter-text", 5)}) for k in (0, 1, 10)}
    report = table_one("sft", runs, by_policy)
    rows = {r["actor"]: r for r in report["rows"]}
    assert "seed_task_successes" not in rows["SFT"]  # SFT has no RL seed
    assert rows["outcome"]["seed_task_successes"]["s2"] == {"click-tab-2": [1, 10], "enter-text": [0, 10]}
    assert sorted(rows["orm"]["seed_task_successes"]) == ["s0", "s1", "s10"]
    lines = str(report_markdown(report)).splitlines()
    header = "| dense block, click-tab-2: held-out successes per RL seed (of 10) | s0 | s1 | s2 | s10 |"
    at = lines.index(header)
    assert lines[at + 2 : at + 4] == ["| orm | 1 | 1 | - | 1 |", "| outcome | 10 | 10 | 1 | - |"]
    at = lines.index(header.replace("click-tab-2", "enter-text"))
    assert lines[at + 2 : at + 4] == ["| orm | 1 | 1 | - | 1 |", "| outcome | 0 | 0 | 0 | - |"]


def test_per_seed_cells_show_episodes_where_seeds_evaluated_different_numbers():
    rows = [
        {"actor": "outcome", "block": "sparse", "seed_task_successes": {"s0": {"t": [3, 25]}, "s1": {"t": [2, 20]}}}
    ]
    assert per_seed_lines(rows)[1:] == [
        "| sparse block, t: held-out successes per RL seed | s0 | s1 |",
        "|---|---:|---:|",
        "| outcome | 3 / 25 | 2 / 20 |",
    ]


def test_two_runs_of_one_seed_in_a_row_add_up_in_the_per_seed_table():
    runs = [
        {"policy_id": p, "reward_source": "outcome", "estimator": "reinforce_pp", "rl_seed": 0, "env_steps": 1}
        for p in ("old", "new")
    ]
    by_policy = {
        "sft": _episodes("sft", set()),
        "old": _episodes("old", _solved(2)),
        "new": _episodes("new", _solved(3)),
    }
    rows = {r["actor"]: r for r in table_one("sft", runs, by_policy)["rows"]}
    assert rows["outcome"]["seed_task_successes"] == {"s0": {"click-tab-2": [5, 20], "enter-text": [5, 20]}}
