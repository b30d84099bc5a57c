"""The RL stage in Dagster, reduced but end to end on live MiniWoB++: real demonstrations, labels,
a ProgRM model, SFT, RL runs with the outcome, ProgRM and ADMIRE rewards, held-out evaluation and
Table 1 in SQL."""

import json

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.demonstrations import DEMONSTRATION_ASSETS
from assets.labels import LABEL_ASSETS, all_label_families_tags
from assets.resources import EnvPoolResource, WarehouseResource
from assets.reward_models import reward_model, reward_model_datasets
from assets.rl import RL_CHECKS, agent_evaluation, policy_sft, rl_report, rl_run
from training.rl.export import export_rl_data
from warehouse.catalog import Warehouse

pytestmark = pytest.mark.e2e

RUNS = ("outcome", "progrm_env", "admire")


def test_sft_rl_runs_evaluation_and_report(small_demos, tmp_path):
    home = tmp_path / "home"
    resources = {"warehouse": WarehouseResource(home=str(home)), "env_pool": EnvPoolResource(spares=0)}
    instance = DagsterInstance.ephemeral()
    upstream = materialize(
        [*DEMONSTRATION_ASSETS, *LABEL_ASSETS],
        resources=resources,
        instance=instance,
        tags=all_label_families_tags(),
        run_config={
            "ops": {
                "human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}},
                "recipes_and_progress_labels": {"config": {"embedder": "hashing"}},
            }
        },
    )
    assert upstream.success
    progrm = materialize(
        [reward_model_datasets, reward_model],
        partition_key="progrm_env",
        resources=resources,
        instance=instance,
        run_config={"ops": {"reward_model": {"config": {"train_steps": 20, "threads": 1}}}},
    )
    assert progrm.success

    sft = materialize(
        [policy_sft, *RL_CHECKS[:2]],
        resources=resources,
        instance=instance,
        selection=["policy_sft"],
        run_config={
            "ops": {
                "policy_sft": {
                    "config": {
                        "tasks": ["login-user", "search-engine"],
                        "low": -1.0,
                        "high": 2.0,  # both tasks, whatever SFT's success on them
                        "selection_seeds": 3,
                        "held_out_seeds": 4,
                        "epochs": 4,
                    }
                }
            }
        },
    )
    assert sft.success
    assert all(e.passed for e in sft.get_asset_check_evaluations())
    for run in RUNS:
        partition = MultiPartitionKey({"run": run, "seed": "s0"})
        result = materialize(
            [rl_run, agent_evaluation],
            partition_key=partition,
            resources=resources,
            instance=instance,
            run_config={
                "ops": {
                    "rl_run": {"config": {"iterations": 2, "instances_per_task": 2, "group_size": 2}},
                    "agent_evaluation": {"config": {"held_out_seeds": 4}},
                }
            },
        )
        assert result.success, run
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert checks == {"every_iteration_recorded": True}
    report = materialize([rl_report], resources=resources, instance=instance)
    assert report.success
    table = report.asset_materializations_for_node("rl_report")[0].metadata["table_one"].value
    for actor in ("SFT", *RUNS):
        assert f"| {actor} |" in table

    warehouse = Warehouse(home)
    iterations = warehouse.query(
        "SELECT reward_source, count(*) AS n, count(DISTINCT iteration) AS d FROM rl_iterations GROUP BY 1"
    ).to_pylist()
    assert {r["reward_source"]: (r["n"], r["d"]) for r in iterations} == {run: (2, 2) for run in RUNS}
    evaluated = warehouse.query("SELECT DISTINCT reward_source FROM agent_eval WHERE evaluation = 'held_out'")
    assert set(evaluated.column("reward_source").to_pylist()) == {"sft", *RUNS}
    # every RL episode is in the warehouse with its acting policy, and every step has its reward
    orphans = warehouse.query(
        "SELECT count(*) AS n FROM steps s JOIN episodes e USING (episode_id) WHERE e.policy_id LIKE 'rl:%' "
        "AND NOT EXISTS (SELECT 1 FROM rl_step_rewards r WHERE r.episode_id = s.episode_id AND r.step_idx = s.step_idx)"
    ).to_pylist()[0]["n"]
    assert orphans == 0
    # the ProgRM run's episodes trace back to the reward model that scored them
    lineage = warehouse.query(
        "SELECT DISTINCT input_asset FROM lineage WHERE asset = 'rl_run' AND parameters::VARCHAR LIKE '%progrm_env%'"
    ).to_pylist()
    assert {"reward_model", "policy_sft"} <= {r["input_asset"] for r in lineage}

    # the episodes and step rewards as external trainers (OpenRLHF, verl) read them
    summary = export_rl_data(warehouse, tmp_path / "export")
    rl_steps = warehouse.query("SELECT count(*) AS n FROM rl_step_rewards").to_pylist()[0]["n"]
    assert summary.steps == rl_steps and summary.episodes > 0
    steps = pq.read_table(summary.steps_path).to_pylist()
    assert steps[0]["prompt"][0]["role"] == "system" and steps[0]["prompt"][1]["role"] == "user"
    assert sum(s["response"] is None for s in steps) == summary.steps_without_response < len(steps)
    first = json.loads(summary.trajectories_path.read_text().splitlines()[0])
    assert len(first["step_rewards"]) == sum(m["role"] == "assistant" for m in first["messages"])
