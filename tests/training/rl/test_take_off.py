"""How soon a run takes off on a task (training.rl.take_off): the first iteration at half its
training episodes successful, runs that never get there censored, rows paired seed by seed."""

from __future__ import annotations

import pytest

from training.rl.report import take_off_baselines
from training.rl.take_off import take_off_by_seed, take_off_iteration, take_off_lines, take_off_rows


def test_the_take_off_iteration_is_the_first_at_half_successful():
    assert take_off_iteration({0: [False, False], 1: [True, False], 2: [True, True]}) == 1
    assert take_off_iteration({0: [True, False, False], 1: [False] * 3}) is None  # 1 of 3 is not half
    assert take_off_iteration({3: [True], 1: [False], 2: []}) == 3  # by iteration, not by insertion
    assert take_off_iteration({0: [True, False, False]}, share=0.3) == 0


def _episodes(actor: str, seed: int, task: str, per_iteration: list[tuple[int, int]]) -> list[dict]:
    """``per_iteration``: (successes, episodes) of each iteration from 0."""
    return [
        {"actor": actor, "rl_seed": seed, "task_id": task, "iteration": i, "success": k < wins}
        for i, (wins, n) in enumerate(per_iteration)
        for k in range(n)
    ]


def test_rows_pair_seeds_and_count_a_run_that_never_took_off_as_its_iterations():
    never, at = [(0, 4)] * 4, lambda i: [(0, 4)] * i + [(3, 4)] * (4 - i)
    episodes = [
        *_episodes("outcome", 0, "t", at(2)),
        *_episodes("outcome", 1, "t", at(1)),
        *_episodes("outcome", 2, "t", never),
        *_episodes("outcome", 3, "t", at(3)),
        *_episodes("bonus", 0, "t", at(1)),  # sooner
        *_episodes("bonus", 1, "t", at(1)),  # tie: dropped
        *_episodes("bonus", 2, "t", at(3)),  # sooner than never (censored at 4 iterations)
        *_episodes("bonus", 3, "t", never),  # later than 3
        *_episodes("bonus", 4, "t", at(0)),  # no outcome run of this seed: not paired
    ]
    table = take_off_by_seed(episodes)
    assert table[("outcome", "t")][2] == {"take_off": None, "iterations": 4}
    rows = {r["actor"]: r for r in take_off_rows(table, {"bonus": "outcome"})}
    bonus = rows["bonus"]
    assert (bonus["seeds"], bonus["took_off"], bonus["median_take_off"]) == (5, 4, 1.0)
    assert (bonus["paired_seeds"], bonus["sooner"], bonus["later"]) == (4, 2, 1)
    assert bonus["p"] == pytest.approx(1.0)  # 2 against 1 of 3 discordant seeds
    assert rows["outcome"]["versus"] is None and rows["outcome"]["median_take_off"] == 2.0


def test_the_sign_test_over_seeds():
    episodes = []
    for seed in range(6):
        episodes += _episodes("outcome", seed, "t", [(0, 2), (0, 2), (2, 2)])
        episodes += _episodes("bonus", seed, "t", [(2, 2), (2, 2), (2, 2)])
    (bonus,) = [r for r in take_off_rows(take_off_by_seed(episodes), {"bonus": "outcome"}) if r["versus"]]
    assert (bonus["sooner"], bonus["later"]) == (6, 0) and bonus["p"] == pytest.approx(2 / 2**6)


def test_the_table_shows_compared_rows_and_their_baselines_only():
    episodes = [
        *_episodes("outcome", 0, "t", [(1, 2)]),
        *_episodes("bonus", 0, "t", [(0, 2)]),
        *_episodes("orm", 0, "t", [(2, 2)]),  # neither compared nor a baseline
    ]
    lines = take_off_lines(take_off_rows(take_off_by_seed(episodes), {"bonus": "outcome"}))
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| row")]
    assert body == ["| outcome | t | 1 of 1 | 0 | - | - | - |", "| bonus | t | 0 of 1 | - | outcome | 0 / 1 | 1 |"]
    assert take_off_lines(take_off_rows(take_off_by_seed(episodes), {})) == []


def test_a_row_is_compared_with_the_outcome_under_its_own_estimator_on_its_block():
    runs = [
        {"reward_source": "outcome", "estimator": "reinforce_pp", "block": "dense"},
        {"reward_source": "progrm_env", "estimator": "reinforce_pp", "block": "dense"},
        {"reward_source": "outcome+milestones:decay", "estimator": "reinforce_pp_kl_apart", "block": "sparse"},
    ]
    assert take_off_baselines(runs) == {
        "progrm_env": "outcome",
        "outcome+milestones:decay (reinforce_pp_kl_apart) [sparse]": "outcome (reinforce_pp_kl_apart) [sparse]",
    }


def test_runs_of_different_budgets_compare_over_the_iterations_both_ran():
    """A 10-iteration run that never took off is not sooner than a 20-iteration baseline that took
    off at 12: over the 10 both ran, neither had; a baseline that took off at 4 is sooner."""
    never_in_10, at = [(0, 2)] * 10, lambda i, n: [(0, 2)] * i + [(2, 2)] * (n - i)
    episodes = [
        *_episodes("outcome", 0, "t", at(12, 20)),
        *_episodes("outcome", 1, "t", at(4, 20)),
        *_episodes("outcome", 2, "t", at(3, 20)),
        *_episodes("bonus", 0, "t", never_in_10),  # tie over 10 iterations
        *_episodes("bonus", 1, "t", never_in_10),  # later
        *_episodes("bonus", 2, "t", at(1, 10)),  # sooner
    ]
    (bonus,) = [r for r in take_off_rows(take_off_by_seed(episodes), {"bonus": "outcome"}) if r["versus"]]
    assert (bonus["sooner"], bonus["later"]) == (1, 1)
