"""The sparse rule reads what RL samples: SFT samples at temperature 1 on the long tasks' selection
seeds, in live MiniWoB++; those episodes land beside the greedy ones, the policy records their rates
and the rule that chose its sparse block, and the same model draws the same actions on the same
instances whatever policy id it runs under (the stream is keyed by the instance alone)."""

from __future__ import annotations

import json

import pytest

from envs.miniwob.demonstrations import import_demonstrations
from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig
from training.policy.episodes import catalog_tasks, evaluate_policy
from training.policy.learned import PolicyModel
from training.policy.sft import SFTSettings
from training.policy.sft_stage import (
    SAMPLED_SELECTION_STREAM,
    PolicySettings,
    demonstration_solution_steps,
    run_policy_sft,
)
from training.policy.task_blocks import SPARSE_RULE_SAMPLED, SPARSE_RULE_SAMPLED_UNSOLVED, sparse_block
from training.reward_models.agent_episodes import read_agent_episodes
from warehouse.catalog import Warehouse
from warehouse.purposes import SAMPLED_SELECTION

pytestmark = pytest.mark.e2e


def pool_factory(workers: int) -> EnvPool:
    return EnvPool(MiniWoBConfig(), PoolConfig(workers=workers, spares=0))


def test_sft_samples_the_long_tasks_and_the_draws_do_not_depend_on_the_policy_id(small_demos, tmp_path, monkeypatch):
    # login-user as if one fixed answer solved 6% of its instances (use-spinner is no candidate here)
    shares = {"login-user": 0.06, "use-spinner": 0.1}
    monkeypatch.setattr("training.policy.sft_stage.load_constant_answer_rates", lambda: shares)
    warehouse = Warehouse(tmp_path / "home")
    import_demonstrations(small_demos, warehouse, workers=1)
    settings = PolicySettings(
        tasks=("login-user",),
        sft=SFTSettings(epochs=2),
        selection_seeds=3,
        sparse_selection_seeds=0,
        sparse_min_solution_steps=1.0,  # login-user counts as long here: its selection seeds are sampled
        sparse_high=1.0,  # ... and rare enough, whatever its rate: only the constant-answer rule can leave it out
        held_out_seeds=1,
        low=-1,
        high=2,
    )
    result = run_policy_sft(warehouse, settings, pool_factory, run_id="sft", log=lambda _: None)
    policy_id = result["policy_id"]

    rows = warehouse.query(
        "SELECT evaluation, seed, success FROM agent_eval_episodes WHERE policy_id = ? ORDER BY evaluation, seed",
        [policy_id],
    ).to_pylist()
    greedy = [r["seed"] for r in rows if r["evaluation"] == "selection"]
    sampled = [r for r in rows if r["evaluation"] == SAMPLED_SELECTION]
    assert len(greedy) == 3 and [r["seed"] for r in sampled] == greedy  # the same instances, sampled
    rate = sum(r["success"] for r in sampled) / len(sampled)
    assert result["sampled_selection_success"] == {"login-user": rate}

    # the policy records the sampled rates, and the sparse block is chosen from the episodes' rate
    parameters = json.loads(
        warehouse.query("SELECT parameters FROM policies WHERE policy_id = ?", [policy_id]).to_pylist()[0]["parameters"]
    )
    assert parameters["sampled_selection_success"] == {"login-user": rate}
    blocks = parameters["task_blocks"]
    assert blocks["sparse_rule"] in (SPARSE_RULE_SAMPLED, SPARSE_RULE_SAMPLED_UNSOLVED)
    expected = sparse_block(
        parameters["selection_success"],
        demonstration_solution_steps(warehouse),
        high=1.0,
        min_steps=1.0,
        sampled_rates={"login-user": rate},
        constant_shares={"login-user": 0.06},
    )
    assert (blocks["sparse"], blocks["sparse_rule"]) == expected
    # the one long task is farmable by a constant: left out of the sparse block it would have formed
    assert sparse_block(
        parameters["selection_success"],
        demonstration_solution_steps(warehouse),
        high=1.0,
        min_steps=1.0,
        sampled_rates={"login-user": rate},
    )[0] == ["login-user"]
    assert blocks["sparse"] == [] and blocks["sparse_left_out_constant"] == {"login-user": 0.06}
    assert blocks["sparse_constant_shares"] == {"login-user": 0.06}  # what it read, of the long tasks

    def actions(evaluation: str) -> dict[tuple[str, int], str]:
        rows = warehouse.query(
            "SELECT episode_id, step_idx, action_text FROM steps WHERE episode_id LIKE ?",
            [f"eval:{policy_id}:{evaluation}:%"],
        ).to_pylist()
        return {(r["episode_id"].rsplit(":", 1)[-1], r["step_idx"]): r["action_text"] for r in rows}

    stored = actions(SAMPLED_SELECTION)
    assert stored and stored != actions("selection")  # sampled, not the greedy episodes again
    # what judges greedy behaviour (reward models on agent episodes) leaves the sampled ones out
    judged = {e.episode_id for e in read_agent_episodes(warehouse)}
    assert judged and not any(SAMPLED_SELECTION in e for e in judged)

    # the same checkpoint under another id draws the same actions on the same instances
    model = PolicyModel.load(result["checkpoint"])
    with pool_factory(1) as pool:
        again, _ = evaluate_policy(
            model,
            "another-id",
            catalog_tasks(["login-user"]),
            greedy,
            pool,
            evaluation=SAMPLED_SELECTION,
            log=lambda _: None,
            sampling_stream=SAMPLED_SELECTION_STREAM,
        )
    redrawn = {
        (e.episode_id.rsplit(":", 1)[-1], step.step_idx): step.action.canonical_text()
        for e in again.episodes
        for step in e.steps
    }
    assert redrawn == stored
