"""The LLM agent in the RL stage (issue 25): its pure parts, and base -> SFT -> RL end to end on live
MiniWoB++ with a tiny causal LM (the real SmolLM2 takes the same path: `stepwise rl --policy llm`)."""

import json

import numpy as np
import pytest

from envs.miniwob.demonstrations import import_demonstrations
from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig
from training.llm.policy import TurnRecord
from training.llm.sft import draw_minibatches
from training.rl.llm_learner import LLMLearnerSettings
from training.rl.llm_runs import (
    LLMRunSettings,
    llm_report,
    llm_training_seeds,
    run_llm_agent,
    turn_logp,
)
from warehouse.catalog import Warehouse


def test_minibatches_cover_every_example_once_per_epoch_and_repeat_with_the_seed():
    batches = draw_minibatches(10, steps=5, batch=4, seed=3)
    assert all(len(b) == 4 for b in batches)
    flat = [i for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10))  # the first epoch is a permutation
    assert draw_minibatches(10, steps=5, batch=4, seed=3) == batches
    assert draw_minibatches(10, steps=5, batch=4, seed=4) != batches
    assert all(len(b) == 3 for b in draw_minibatches(3, steps=2, batch=8, seed=0))
    with pytest.raises(ValueError, match="no SFT examples"):
        draw_minibatches(0, steps=1, batch=1, seed=0)


def test_training_seeds_depend_on_the_rl_seed_and_iteration_not_the_reward_source():
    a = llm_training_seeds(LLMRunSettings(reward_source="outcome", instances_per_task=3), 2)
    b = llm_training_seeds(LLMRunSettings(reward_source="orm", instances_per_task=3), 2)
    assert a == b and len(set(a)) == 3
    assert llm_training_seeds(LLMRunSettings(instances_per_task=3), 3) != a
    assert llm_training_seeds(LLMRunSettings(instances_per_task=3, rl_seed=1), 2) != a


def test_run_keys_name_what_changes_learning_only():
    base = LLMRunSettings()
    assert base.rl_key("sft-a") == LLMRunSettings(iterations=9, workers=1, held_out_seeds=3).rl_key("sft-a")
    assert base.rl_key("sft-a") != base.rl_key("sft-b")
    assert base.rl_key("sft-a").startswith("outcome-s0-")
    assert LLMRunSettings(reward_source="orm").rl_key("sft-a").startswith("orm-s0-")
    assert base.sft_key("base-1") == LLMRunSettings(iterations=7).sft_key("base-1")
    assert base.sft_key("base-1") != LLMRunSettings(sft_steps=5).sft_key("base-1")


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown reward source 'nope'"):
        LLMRunSettings(reward_source="nope")
    with pytest.raises(ValueError, match="at least one task"):
        LLMRunSettings(tasks=())
    with pytest.raises(ValueError, match="sft_steps must be >= 0"):
        LLMRunSettings(sft_steps=-1)


def test_a_turns_log_probability_is_the_sum_over_its_tokens():
    turn = TurnRecord(
        np.array([1, 2]), np.array([3, 4, 5]), np.array([-0.5, -1.0, -0.25], dtype=np.float32), True, "CLICK(1)", ""
    )
    assert turn_logp(turn) == pytest.approx(-1.75)


def test_the_report_puts_the_stages_side_by_side():
    stage = {
        "stage": "llm_sft",
        "policy_id": "llm-sft-x",
        "episodes": 8,
        "success_rate": 0.25,
        "format_ok_rate": 0.5,
        "tokens_per_s": 12.0,
        "env_steps_per_s": 0.4,
        "prompt_tokens_per_step": 610.0,
    }
    text = llm_report([stage])
    assert "| llm_sft | llm-sft-x | 25.0% (8) | 50.0% | 12.0 | 0.40 | 610 |" in text


@pytest.mark.e2e
def test_base_sft_and_rl_of_an_llm_agent_on_live_miniwob(small_demos, tmp_path, tiny_causal_lm_path):
    home = tmp_path / "home"
    warehouse = Warehouse(home)
    import_demonstrations(small_demos, warehouse, workers=1)
    settings = LLMRunSettings(
        model=tiny_causal_lm_path,
        tasks=("login-user",),
        sft_steps=3,
        sft_batch=2,
        sft_examples_per_task=3,
        iterations=2,
        instances_per_task=1,
        group_size=2,
        held_out_seeds=1,
        max_new_tokens=6,
        learner=LLMLearnerSettings(learning_rate=1e-4, batch_turns=8, micro_batch=4),
    )
    logs: list[str] = []

    def pool_factory(workers: int) -> EnvPool:
        return EnvPool(
            MiniWoBConfig(episode_max_time_ms=settings.episode_max_time_ms), PoolConfig(workers=workers, spares=0)
        )

    result = run_llm_agent(warehouse, settings, pool_factory, run_id="llm-test", log=logs.append)
    policies = {
        r["kind"]: r
        for r in warehouse.query("SELECT policy_id, kind, parent_policy_id, env_steps FROM policies").to_pylist()
    }
    assert set(policies) == {"llm_base", "llm_sft", "llm_rl"}
    assert policies["llm_sft"]["parent_policy_id"] == result["base"]
    assert policies["llm_rl"]["parent_policy_id"] == result["sft"] and policies["llm_rl"]["env_steps"] > 0
    evals = warehouse.query("SELECT policy_id, policy_label, episodes FROM agent_eval ORDER BY created_at").to_pylist()
    assert [e["policy_label"] for e in evals] == ["llm_base", "llm_sft", "llm_rl:outcome"]
    iterations = warehouse.query("SELECT * FROM rl_iterations ORDER BY iteration").to_pylist()
    assert [r["iteration"] for r in iterations] == [0, 1]
    steps = warehouse.query(
        "SELECT r.*, e.purpose FROM rl_step_rewards r JOIN episodes e USING (episode_id)"
    ).to_pylist()
    assert steps and all(s["purpose"] == "rl_training" and s["logp"] <= 0 for s in steps)
    assert sum(r["steps"] for r in iterations) == len(steps)  # a reward and a log-probability per step
    sft_params = json.loads(
        warehouse.query("SELECT parameters FROM policies WHERE kind = 'llm_sft'").to_pylist()[0]["parameters"]
    )
    assert sft_params["examples"] > 0
    assert [s["stage"] for s in result["stages"]] == ["llm_base", "llm_sft", "llm_rl:outcome"]
    assert any("SFT step 3/3" in line for line in logs)

    # Run again with more iterations: the SFT model is reused and the RL run resumes after its last one.
    more = LLMRunSettings(**{**settings.__dict__, "iterations": 3})
    logs.clear()
    run_llm_agent(warehouse, more, pool_factory, run_id="llm-test-2", log=logs.append)
    assert any("trained before; loading it" in line for line in logs)
    assert any("resuming after iteration 2" in line for line in logs)
    assert [r["iteration"] for r in warehouse.query("SELECT iteration FROM rl_iterations ORDER BY 1").to_pylist()] == [
        0,
        1,
        2,
    ]
