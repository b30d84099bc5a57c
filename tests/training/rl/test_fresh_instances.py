"""scripts/fresh_instances.py's pure parts: the fresh seeds, the printout, and how a run's successes
spread over the instances' instructions (one constant answer against reading the instruction)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from training.policy.evaluation import sample_seeds
from training.policy.store import HELD_OUT_SEED_BASE
from training.rl.task_breakdown import success_spread

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "fresh_instances.py"
_spec = importlib.util.spec_from_file_location("fresh_instances", SCRIPT)
assert _spec and _spec.loader
fresh_instances = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fresh_instances)


def _episode(run: str, rl_seed: int, seed: int, target: int, success: bool) -> dict:
    instruction = f"Select {target} with the spinner and hit Submit."
    return {"run": run, "rl_seed": rl_seed, "task_id": "use-spinner", "seed": seed, "instruction": instruction} | {
        "success": success
    }


def test_a_constant_answer_solves_one_instruction_and_a_reader_spreads():
    constant = [_episode("a", 0, seed, target=seed % 5, success=seed % 5 == 2) for seed in range(20)]
    reader = [_episode("b", 0, seed, target=seed % 5, success=seed < 6) for seed in range(20)]
    assert success_spread(constant) == {
        "use-spinner": {
            "successes": 4,
            "instructions": 1,
            "most_common": "Select 2 with the spinner and hit Submit.",
            "top_share": 1.0,
        }
    }
    spread = success_spread(reader)["use-spinner"]
    assert (spread["successes"], spread["instructions"], spread["top_share"]) == (6, 5, 2 / 6)
    assert success_spread([_episode("a", 0, 1, 1, False)]) == {}


def test_fresh_seeds_leave_out_the_runs_own_held_out_instances():
    used = sample_seeds(HELD_OUT_SEED_BASE, 25, "held_out")
    assert set(used) <= set(sample_seeds(HELD_OUT_SEED_BASE, 225, "held_out"))  # the runs' own stream holds them
    seeds = fresh_instances.fresh_seeds(200, "held_out", used)
    assert len(seeds) == len(set(seeds)) == 200 and not set(seeds) & set(used)
    assert seeds == fresh_instances.fresh_seeds(200, "held_out", used)
    assert all(HELD_OUT_SEED_BASE <= s < HELD_OUT_SEED_BASE + 100_000 for s in seeds)


def test_the_printout_pairs_the_runs_by_seed_and_instance_and_shows_the_spread():
    """Row b learned a constant (target 2: 4 of 20) on seeds 0 and 1, row a on seed 2 only."""
    episodes = []
    for rl_seed in range(3):
        for seed in range(20):
            episodes.append(_episode("a", rl_seed, seed, seed % 5, rl_seed == 2 and seed % 5 == 2))
            episodes.append(_episode("b", rl_seed, seed, seed % 5, rl_seed < 2 and seed % 5 == 2))
    lines = fresh_instances.comparison_text("a", "b", "sparse", episodes).splitlines()
    at = lines.index("| sparse block, use-spinner: held-out successes per RL seed (of 20) | s0 | s1 | s2 |")
    assert lines[at + 2 : at + 4] == ["| a | 0 | 0 | 4 |", "| b | 4 | 4 | 0 |"]
    paired = next(line for line in lines if line.startswith("| b | a |"))
    assert paired.startswith("| b | a | 60 | 8 | 4 |") and paired.endswith("| 2 / 1 (1.000) |")
    assert "| b | s1 | use-spinner | 4 | 1 | Select 2 with the spinner and hit Submit. (100%) |" in lines


def test_the_script_reads_the_runs_the_report_reads(tmp_path):
    """``reported_runs``: per source, estimator, seed, block and reward-model tag the newest run; a
    run without a block is dense; a run pinned to a model is a row of its own, not a newer run of
    today's models (the script used to take the newest run of a seed whatever its model)."""
    import json
    from datetime import UTC, datetime

    import pyarrow as pa

    from training.policy.store import PolicyNotFoundError
    from training.rl.evaluation import reported_runs, run_rl_report
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.tables_rl import POLICIES

    def run(key: str, minute: int, **parameters: object) -> dict:
        return {
            "policy_id": f"rl-{key}-sft-1",
            "kind": "rl",
            "parent_policy_id": "sft-1",
            "reward_source": "outcome",
            "estimator": "reinforce_pp",
            "rl_seed": 0,
            "parameters": json.dumps(parameters),
            "checkpoint_path": f"models/policies/{key}",
            "created_at": datetime(2026, 12, 1, 12, minute, tzinfo=UTC),
        }

    rows = [
        run("old", 1, block="sparse"),
        run("new", 2, block="sparse", iterations=10),
        run("pinned", 3, block="sparse", reward_model_id="rm-7", iterations=20),
        run("dense", 4),
    ]
    warehouse = Warehouse(tmp_path / "home")
    m = Materialization(asset="rl_run")
    base = dict.fromkeys(POLICIES.names)
    table = pa.Table.from_pylist([base | r for r in rows], schema=POLICIES)
    warehouse.publish(m, [warehouse.stage_table("policies", "rl", table, m)])
    runs, tags = reported_runs(warehouse, "sft-1")
    chosen = {(r["run_key"], r["block"], r["reward_model_tag"]) for r in runs}
    assert chosen == {("new", "sparse", None), ("pinned", "sparse", "model rm-7"), ("dense", "dense", None)}
    assert tags == {"old": None, "new": None, "pinned": "model rm-7", "dense": None}
    # each run's budget: its settings' where nothing is recorded yet ...
    assert {r["run_key"]: r["iterations"] for r in runs} == {"new": 10, "pinned": 20, "dense": None}
    # ... and what ran once rl_iterations has it: "new" trained 20, then a rerun asked for 10 (nothing trains)
    from warehouse.tables_rl import RL_ITERATIONS

    ran = [dict.fromkeys(RL_ITERATIONS.names) | {"run_key": "new", "iteration": i} for i in range(20)]
    m = Materialization(asset="rl_run")
    warehouse.publish(m, [warehouse.stage_table("rl_iterations", "new", pa.Table.from_pylist(ran, RL_ITERATIONS), m)])
    runs, _ = reported_runs(warehouse, "sft-1")
    assert {r["run_key"]: r["iterations"] for r in runs} == {"new": 20, "pinned": 20, "dense": None}
    with pytest.raises(PolicyNotFoundError, match="rl-new-sft-1 is an rl policy, not an SFT policy"):
        run_rl_report(warehouse, sft_policy_id="rl-new-sft-1")
