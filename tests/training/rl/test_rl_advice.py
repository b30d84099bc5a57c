"""Which reward to use, from a report's own rows and paired tests (training.rl.advice)."""

from __future__ import annotations

import math

import pytest

from training.rl.advice import (
    BETTER,
    NO_DIFFERENCE,
    NOT_RUN,
    UNRESOLVED,
    WITHIN_MARGIN,
    WORSE,
    advice_markdown,
    advice_summary,
    judge_comparison,
    reward_advice,
    uses_exact_outcome,
)
from training.rl.report import report_markdown, table_one
from warehouse.statistics import holm_adjusted


def test_holm_adjustment_by_hand():
    # sorted: 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, but never below the one before: 0.06)
    adjusted = holm_adjusted([0.04, 0.01, math.nan, 0.03])
    assert adjusted[:2] == pytest.approx([0.06, 0.03]) and adjusted[3] == pytest.approx(0.06)
    assert math.isnan(adjusted[2])
    assert holm_adjusted([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjusted([]) == []


def test_which_sources_need_the_exact_outcome():
    assert uses_exact_outcome("outcome") and uses_exact_outcome("admire")
    assert uses_exact_outcome("outcome+progrm_env:shaped") and uses_exact_outcome("outcome+prm:decay")
    assert not any(uses_exact_outcome(s) for s in ("orm", "progrm_env", "progrm_lcs", "prm", "guidnav"))


def test_judging_one_comparison():
    def c(difference: float, low: float, high: float) -> dict:
        return {"difference": difference, "difference_low": low, "difference_high": high}

    margin = 0.05
    assert judge_comparison(c(0.03, 0.01, 0.05), 0.01, margin=margin) == BETTER
    assert judge_comparison(c(-0.14, -0.26, -0.05), 0.001, margin=margin) == WORSE
    # McNemar alone says worse (p 0.007), the interval over RL seeds reaches +3: not shown either way
    assert judge_comparison(c(-0.04, -0.112, 0.03), 0.007, margin=margin) == UNRESOLVED
    assert judge_comparison(c(-0.04, -0.112, 0.03), 0.007, margin=None) == NO_DIFFERENCE
    assert judge_comparison(c(-0.01, -0.04, 0.02), 0.5, margin=margin) == WITHIN_MARGIN
    assert judge_comparison(c(-0.01, -0.066, 0.042), 0.54, margin=margin) == UNRESOLVED
    assert judge_comparison(c(0.03, 0.01, 0.05), 0.06, margin=margin) == WITHIN_MARGIN  # not significant after Holm
    assert judge_comparison(c(0.03, -0.01, 0.05), 0.2, margin=None) == NO_DIFFERENCE
    assert judge_comparison(None, math.nan, margin=margin) == NOT_RUN
    assert judge_comparison(c(0.0, 0.0, 0.0) | {"pairs": 0}, 1.0, margin=margin) == NOT_RUN


def _row(actor: str, source: str | None, success: float, seeds: int = 5, block: str = "dense", **extra: str) -> dict:
    return {"actor": actor, "reward_source": source, "estimator": "reinforce_pp", "block": block, "seeds": seeds,
            "success_rate": success} | extra  # fmt: skip


def _cmp(actor: str, versus: str, difference: float, low: float, high: float, p: float, pairs: int = 500) -> dict:
    return {"actor": actor, "versus": versus, "difference": difference, "difference_low": low,
            "difference_high": high, "mcnemar_p": p, "pairs": pairs}  # fmt: skip


def test_with_the_outcome_the_outcome_unless_a_reward_beat_it_and_without_it_the_best_clean_learned_reward():
    report = {
        "rows": [
            _row("SFT", None, 0.50),
            _row("outcome", "outcome", 0.70),
            _row("outcome+progrm_env:shaped", "outcome+progrm_env:shaped", 0.70),
            _row("outcome+prm:decay", "outcome+prm:decay", 0.62),
            _row("orm", "orm", 0.62),
            _row("progrm_env", "progrm_env", 0.66),  # higher than the ORM, but its reward is gamed
            _row("progrm_lcs", "progrm_lcs", 0.52, seeds=2),
        ],
        "comparisons": [
            _cmp("outcome", "SFT", 0.20, 0.15, 0.25, 1e-6),
            _cmp("outcome+progrm_env:shaped", "SFT", 0.20, 0.15, 0.25, 1e-6),
            _cmp("outcome+progrm_env:shaped", "outcome", 0.0, -0.01, 0.0, 1.0),
            _cmp("outcome+prm:decay", "SFT", 0.12, 0.07, 0.17, 1e-4),
            _cmp("outcome+prm:decay", "outcome", -0.08, -0.10, -0.05, 1e-5),
            _cmp("orm", "SFT", 0.12, 0.05, 0.18, 1e-4),
            _cmp("orm", "outcome", -0.08, -0.15, -0.02, 1e-3),
            _cmp("progrm_env", "SFT", 0.16, 0.08, 0.22, 1e-5),
            _cmp("progrm_lcs", "SFT", 0.02, -0.05, 0.08, 0.4),
            _cmp("orm", "progrm_env", -0.04, -0.1, 0.02, 0.2),  # neither outcome nor SFT: not part of the advice
        ],
        "hacking_alarms": [
            {"actor": "progrm_env", "alarms": ["paid 'no submission' 1.29 (30 episodes), success 1.25"]},
            {"actor": "orm", "alarms": []},
        ],
    }
    (block,) = reward_advice(report)
    assert block["block"] == "dense" and block["outcome_actor"] == "outcome" and block["sft_actor"] == "SFT"
    assert block["tests"] == 9
    assert block["with_outcome"]["actor"] == "outcome"
    assert block["safe_to_add"] == ["outcome+progrm_env:shaped"]
    assert block["worse_than_outcome"] == ["outcome+prm:decay", "orm"]
    assert block["without_outcome"]["actor"] == "orm"  # progrm_env is higher but raised an alarm
    assert block["provisional"] == ["progrm_lcs"]
    judged = {r["actor"]: r for r in block["rows"]}
    assert judged["progrm_lcs"]["versus_sft"]["judgement"] == NO_DIFFERENCE
    assert judged["progrm_env"]["versus_outcome"] is None
    assert judged["orm"]["versus_outcome"]["adjusted_p"] == pytest.approx(3e-3)  # 7th smallest of 9: x (9 - 7 + 1)
    text = "\n".join(advice_markdown([block]))
    assert "with the exact outcome: **outcome** (no reward beat it)" in text
    assert "without one: **orm**" in text and "provisional: 1 row(s)" in text
    assert "| progrm_env | 5 | 66.0 | - | +16.0 [+8.0, +22.0], Holm p <0.001: better | yes |" in text
    assert advice_summary(block) == (
        "with the exact outcome: outcome; without one: orm (provisional: fewer than 5 RL seeds)"
    )

    # a composed reward that beats the outcome after Holm is what a user with an outcome should take
    report["rows"][3] = _row("outcome+prm:decay", "outcome+prm:decay", 0.78)
    report["comparisons"][4] = _cmp("outcome+prm:decay", "outcome", 0.08, 0.04, 0.12, 1e-5)
    (block,) = reward_advice(report)
    assert block["with_outcome"]["actor"] == "outcome+prm:decay" and block["worse_than_outcome"] == ["orm"]

    # the same lead at p = 0.02, no longer significant once adjusted for the block's nine tests (the
    # 7th smallest: x 3 = 0.06): the outcome stays
    report["comparisons"][4] = _cmp("outcome+prm:decay", "outcome", 0.08, 0.04, 0.12, 0.02)
    (block,) = reward_advice(report)
    assert block["with_outcome"]["actor"] == "outcome"
    assert {r["actor"]: r for r in block["rows"]}["outcome+prm:decay"]["versus_outcome"]["judgement"] == WITHIN_MARGIN


def test_the_specs_milestones_without_the_outcome_say_they_need_a_spec():
    report = {
        "rows": [_row("SFT", None, 0.50), _row("outcome", "outcome", 0.70), _row("milestones", "milestones", 0.64)],
        "comparisons": [
            _cmp("outcome", "SFT", 0.20, 0.15, 0.25, 1e-6),
            _cmp("milestones", "SFT", 0.14, 0.08, 0.20, 1e-5),
            _cmp("milestones", "outcome", -0.06, -0.10, -0.02, 1e-3),
        ],
    }
    (block,) = reward_advice(report)
    assert block["without_outcome"]["actor"] == "milestones" and not uses_exact_outcome("milestones")
    assert block["without_outcome"]["why"].endswith("its spec defines them, checked by the environment")


def test_no_outcome_run_and_no_learned_reward_that_beat_sft_say_so():
    report = {
        "rows": [_row("SFT", None, 0.5), _row("orm", "orm", 0.45), _row("SFT [sparse]", None, 0.0, block="sparse")],
        "comparisons": [_cmp("orm", "SFT", -0.05, -0.12, 0.02, 0.3)],
    }
    (block,) = reward_advice(report)  # the sparse block has no RL row: no advice for it
    assert block["with_outcome"] == {"actor": None, "why": "no outcome run in this block to compare with"}
    assert block["without_outcome"]["actor"] is None and "beat SFT" in block["without_outcome"]["why"]


def test_the_report_opens_with_the_advice_of_each_block():
    """table_one's rows and comparisons feed the advice as they are (hand-made held-out episodes:
    SFT solves 10 of 40 seeds per task, the outcome 30, the ORM 20, on 5 RL seeds)."""
    tasks, seeds = ("click-tab-2", "enter-text"), range(40)

    def episodes(policy_id: str, solved_seeds: int) -> list[dict]:
        return [
            {
                "policy_id": policy_id,
                "task_id": t,
                "task_family": "f",
                "seed": s,
                "success": s < solved_seeds,
                "env_return": 1.0 if s < solved_seeds else -1.0,
                "failure_mode": None,
            }  # fmt: skip
            for t in tasks
            for s in seeds
        ]

    by_policy = {"sft": episodes("sft", 10)}
    runs = []
    for source, solved in (("outcome", 30), ("orm", 20)):
        for rl_seed in range(5):
            pid = f"{source}{rl_seed}"
            by_policy[pid] = episodes(pid, solved)
            runs.append(
                {
                    "policy_id": pid,
                    "reward_source": source,
                    "estimator": "reinforce_pp",
                    "rl_seed": rl_seed,
                    "env_steps": 10,
                }  # fmt: skip
            )
    report = table_one("sft", runs, by_policy)
    report["advice"] = reward_advice(report)
    (block,) = report["advice"]
    assert block["with_outcome"]["actor"] == "outcome" and block["worse_than_outcome"] == ["orm"]
    assert block["without_outcome"]["actor"] == "orm" and not block["provisional"]
    text = str(report_markdown(report))
    assert text.startswith("**Which reward to use here (dense block)**")
    assert text.index("Which reward to use here") < text.index("| actor | seeds | SR (95% CI)")


def test_other_estimators_empty_comparisons_and_blocks_without_sft_stay_out_of_the_advice():
    report = {
        "rows": [
            _row("SFT", None, 0.5),
            _row("outcome", "outcome", 0.7),
            _row("orm · flywheel r2", "orm", 0.65, reward_model_tag="flywheel r2"),
            {**_row("outcome (grpo)", "outcome", 0.9), "estimator": "grpo"},  # another learner: table only
            _row("outcome+progrm_env:shuffled", "outcome+progrm_env:shuffled", 0.95),  # a control: table only
            _row("progrm_env", "progrm_env", float("nan"), seeds=0),  # no evaluated episodes yet
            _row("outcome [sparse]", "outcome", 0.02, block="sparse"),
            _row("orm [sparse]", "orm", 0.06, block="sparse"),
        ],
        "comparisons": [
            _cmp("outcome", "SFT", 0.2, 0.15, 0.25, 1e-6),
            _cmp("orm · flywheel r2", "SFT", 0.15, 0.1, 0.2, 1e-5),
            _cmp("orm · flywheel r2", "outcome", -0.05, -0.08, -0.02, 0.01),
            _cmp("outcome (grpo)", "outcome", 0.2, 0.15, 0.25, 1e-6),
            _cmp("outcome+progrm_env:shuffled", "outcome", 0.25, 0.2, 0.3, 1e-7),
            _cmp("progrm_env", "SFT", math.nan, math.nan, math.nan, 1.0, pairs=0),
            _cmp("orm [sparse]", "outcome [sparse]", 0.04, 0.01, 0.07, 0.004),
        ],
        "hacking_alarms": [{"actor": "outcome", "alarms": ["training return +0.2 while held-out success fell"]}],
    }
    dense, sparse = reward_advice(report)
    assert [r["actor"] for r in dense["rows"]] == ["outcome", "orm · flywheel r2", "progrm_env"]
    assert dense["tests"] == 3  # the empty comparison, the other estimator's and the control's are not in the family
    assert (
        dense["with_outcome"]["actor"] == "outcome" and "its own alarm: training return" in dense["with_outcome"]["why"]
    )
    assert dense["worse_than_outcome"] == ["orm · flywheel r2"]  # 0.01 x 2 = 0.02, interval below 0
    assert dense["without_outcome"]["actor"] == "orm · flywheel r2"
    assert "labelled with success" in dense["without_outcome"]["why"]  # the flywheel needs success labels
    assert {r["actor"]: r for r in dense["rows"]}["progrm_env"]["versus_sft"] is None
    # the sparse block: Holm over its own single test, no SFT row to judge the learned reward by
    assert sparse["tests"] == 1 and sparse["sft_actor"] is None
    assert sparse["with_outcome"]["actor"] == "orm [sparse]"  # beat the outcome, alarm silent
    assert sparse["without_outcome"] == {"actor": None, "why": "no SFT row in this block to compare with"}

    # an alarm vetoes a row that beat the outcome
    report["hacking_alarms"].append({"actor": "orm [sparse]", "alarms": ["paid 'no submission' as much as success"]})
    _, sparse = reward_advice(report)
    assert sparse["with_outcome"]["actor"] == "outcome [sparse]"


def test_rows_with_the_kl_kept_apart_are_judged_against_both_outcomes_and_say_their_estimator():
    """REINFORCE++ with the KL penalty kept out of the normalisation changes the learner, not the reward:
    its rows join the advice, judged against the REINFORCE++ outcome (never taken for it) and, for a
    reward other than the outcome, against the outcome under the same estimator, which it must beat
    too: otherwise its gain may be the estimator's (stop 65's use-spinner reading)."""
    apart = {"estimator": "reinforce_pp_kl_apart"}
    outcome_apart, shaped_apart = "outcome (reinforce_pp_kl_apart)", "outcome+progrm_env:shaped (reinforce_pp_kl_apart)"
    report = {
        "rows": [
            _row("SFT", None, 0.5),
            {**_row(outcome_apart, "outcome", 0.96), **apart},  # listed before the outcome
            _row("outcome", "outcome", 0.9),
            {**_row(shaped_apart, "outcome+progrm_env:shaped", 0.97), **apart},  # highest, beat only the outcome
            {**_row("progrm_env (reinforce_pp_kl_apart)", "progrm_env", 0.7), **apart},
            {**_row("outcome (rloo)", "outcome", 0.99), "estimator": "rloo"},  # another learner: table only
        ],
        "comparisons": [
            _cmp(outcome_apart, "outcome", 0.06, 0.03, 0.1, 1e-4),
            _cmp(outcome_apart, "SFT", 0.46, 0.4, 0.55, 1e-9),
            _cmp("outcome", "SFT", 0.4, 0.33, 0.47, 1e-9),
            _cmp(shaped_apart, "outcome", 0.07, 0.03, 0.11, 1e-4),
            _cmp(shaped_apart, "SFT", 0.47, 0.4, 0.55, 1e-9),
            _cmp(shaped_apart, outcome_apart, 0.01, -0.02, 0.04, 0.8),
            _cmp("progrm_env (reinforce_pp_kl_apart)", "SFT", 0.2, 0.1, 0.3, 1e-6),
            _cmp("progrm_env (reinforce_pp_kl_apart)", outcome_apart, -0.26, -0.35, -0.2, 1e-9),
            _cmp("outcome (rloo)", "outcome", 0.09, 0.05, 0.13, 1e-5),
        ],
        "hacking_alarms": [],
    }
    (dense,) = reward_advice(report)
    assert dense["outcome_actor"] == "outcome" and dense["tests"] == 8
    judged = {r["actor"]: r for r in dense["rows"]}
    assert set(judged) == {"outcome", outcome_apart, shaped_apart, "progrm_env (reinforce_pp_kl_apart)"}
    assert judged[outcome_apart]["versus_outcome"]["judgement"] == BETTER
    assert judged[outcome_apart]["estimator"] == "reinforce_pp_kl_apart"
    assert judged[outcome_apart]["versus_estimator_outcome"] is None  # it is that outcome
    assert judged[shaped_apart]["versus_outcome"]["judgement"] == BETTER
    assert judged[shaped_apart]["versus_estimator_outcome"]["judgement"] == WITHIN_MARGIN
    # the composed row is higher but did not beat the outcome under its own estimator: the estimator's
    # outcome is recommended, and the composed row is safe to add to it
    assert dense["with_outcome"]["actor"] == outcome_apart
    assert "the same reward, trained with reinforce_pp_kl_apart" in dense["with_outcome"]["why"]
    assert dense["safe_to_add"] == [shaped_apart]
    assert dense["without_outcome"]["actor"] == "progrm_env (reinforce_pp_kl_apart)"
    assert dense["without_outcome"]["why"].endswith("trained with reinforce_pp_kl_apart, not REINFORCE++")
    markdown = "\n".join(advice_markdown([dense]))
    assert "REINFORCE++ with the KL kept apart" in markdown and "vs the outcome under its estimator" in markdown

    # had it beaten that outcome too, the composed row would be the choice, saying so
    report["comparisons"][5] = _cmp(shaped_apart, outcome_apart, 0.04, 0.01, 0.07, 1e-3)
    (dense,) = reward_advice(report)
    assert dense["with_outcome"]["actor"] == shaped_apart
    assert "and beat the outcome under it too" in dense["with_outcome"]["why"]
    # and without that outcome's run it still qualifies, saying the gain may be the estimator's
    report["rows"] = [r for r in report["rows"] if r["actor"] != outcome_apart]
    report["comparisons"] = [c for c in report["comparisons"] if outcome_apart not in (c["actor"], c["versus"])]
    (dense,) = reward_advice(report)
    assert dense["with_outcome"]["actor"] == shaped_apart
    assert "was not run: the gain may be the estimator's" in dense["with_outcome"]["why"]


def test_a_block_where_no_run_beat_sft_says_so_instead_of_calling_rewards_safe():
    """This stop's sparse block, as measured (375 paired held-out episodes per row): the outcome 2
    successes, the decaying bonus the same 2, the shaped form 0, SFT 0. Every composed row is
    "within 5 points" of the outcome, which at the floor says nothing about the reward."""
    report = {
        "rows": [
            _row("SFT [sparse]", None, 0.0, block="sparse"),
            _row("outcome [sparse]", "outcome", 2 / 375, block="sparse"),
            _row("outcome+progrm_env:decay [sparse]", "outcome+progrm_env:decay", 2 / 375, block="sparse"),
            _row("outcome+progrm_env:shaped [sparse]", "outcome+progrm_env:shaped", 0.0, block="sparse"),
        ],
        "comparisons": [
            _cmp("outcome [sparse]", "SFT [sparse]", 0.005, 0.0, 0.019, 0.5, pairs=375),
            _cmp("outcome+progrm_env:decay [sparse]", "SFT [sparse]", 0.005, 0.0, 0.019, 0.5, pairs=375),
            _cmp("outcome+progrm_env:decay [sparse]", "outcome [sparse]", 0.0, 0.0, 0.0, 1.0, pairs=375),
            _cmp("outcome+progrm_env:shaped [sparse]", "SFT [sparse]", 0.0, 0.0, 0.0, 1.0, pairs=375),
            _cmp("outcome+progrm_env:shaped [sparse]", "outcome [sparse]", -0.005, -0.019, 0.0, 0.5, pairs=375),
        ],
    }
    (block,) = reward_advice(report)
    assert block["no_run_beat_sft"] and block["with_outcome"]["actor"] == "outcome [sparse]"
    assert len(block["safe_to_add"]) == 2  # within the margin, as judged...
    text = "\n".join(advice_markdown([block]))
    assert "- **no run beat SFT [sparse]** on this block" in text  # ...and qualified right below
    assert advice_summary(block) == "with the exact outcome: outcome [sparse]; without one: none; no run beat SFT here"

    # once a run leaves SFT's level (here the outcome, by a margin both tests agree on), the note goes
    report["comparisons"][0] = _cmp("outcome [sparse]", "SFT [sparse]", 0.2, 0.12, 0.28, 1e-8, pairs=375)
    (block,) = reward_advice(report)
    assert not block["no_run_beat_sft"] and "no run beat" not in "\n".join(advice_markdown([block]))
    assert not reward_advice({"rows": [_row("outcome", "outcome", 0.5)], "comparisons": []})[0]["no_run_beat_sft"]
