"""The guidance stage in Dagster, reduced but end to end on live MiniWoB++: real demonstrations,
labels, a PRM trained for real, an SFT policy, then every method of ``guidance_evaluation`` (base,
best-of-N with the PRM, the oracle, the GUI-PRA judge in local mode and an ablation, reflect and
retry) on held-out seeds, and the report, all read back in SQL."""

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.demonstrations import DEMONSTRATION_ASSETS
from assets.guidance import GUIDANCE_CHECKS, guidance_evaluation, guidance_report
from assets.labels import LABEL_ASSETS, all_label_families_tags
from assets.resources import EnvPoolResource, WarehouseResource
from assets.reward_models import reward_model, reward_model_datasets
from assets.rl import policy_sft
from training.guidance.runs import METHODS
from warehouse.catalog import Warehouse

pytestmark = pytest.mark.e2e

EVALUATION = {
    "held_out_seeds": 2,
    "n_values": [1, 3],
    "verifiers": ["prm"],
    "judge_n": 3,
    "judge_variants": ["full", "no_memory"],
    "retries": 1,
    "workers": 2,
}


def test_every_method_materializes_and_the_report_reads_them_back(small_demos, tmp_path):
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
    prm = materialize(
        [reward_model_datasets, reward_model],
        partition_key="prm",
        resources=resources,
        instance=instance,
        run_config={"ops": {"reward_model": {"config": {"train_steps": 20, "threads": 1}}}},
    )
    assert prm.success
    sft = materialize(
        [policy_sft],
        resources=resources,
        instance=instance,
        run_config={
            "ops": {
                "policy_sft": {
                    "config": {
                        "tasks": ["login-user", "search-engine"],
                        "low": -1.0,
                        "high": 2.0,
                        "selection_seeds": 2,
                        "sparse_selection_seeds": 0,
                        "held_out_seeds": 2,
                        "epochs": 3,
                    }
                }
            }
        },
    )
    assert sft.success

    for method in METHODS:
        result = materialize(
            [guidance_evaluation, *GUIDANCE_CHECKS],
            partition_key=method,
            resources=resources,
            instance=instance,
            selection=["guidance_evaluation"],
            run_config={"ops": {"guidance_evaluation": {"config": EVALUATION}}},
        )
        assert result.success, method
        assert all(e.passed for e in result.get_asset_check_evaluations()), method
    report = materialize([guidance_report], resources=resources, instance=instance)
    assert report.success
    text = report.asset_materializations_for_node("guidance_report")[0].metadata["report"].value
    for setting in ("base", "prm:N=3", "oracle:N=3", "judge:full:N=3", "judge:no_memory:N=3", "retry:R=1"):
        assert f"| {setting} |" in text
    assert "N sweep" in text and "pass@2" in text
    # the PRM of this home learned from no alternatives: every evaluated task is one it never saw a
    # candidate of, and the report says so per task (issue 42 item 2)
    states_table = text.split("Training states with candidates each verifier learned from")[1].split("\n\n")[1]
    task_rows = [line for line in states_table.splitlines() if line.startswith("| ") and "`" not in line]
    assert task_rows and all(line.endswith("| 0 + 0 |") for line in task_rows)

    warehouse = Warehouse(home)
    rows = warehouse.query(
        "SELECT setting, method, episodes, success_rate, verifier_calls_per_step, judge_mode, pass_at "
        "FROM guidance_eval WHERE task_id = 'all' ORDER BY setting"
    ).to_pylist()
    by_setting = {r["setting"]: r for r in rows}
    assert set(by_setting) == {"base", "prm:N=3", "oracle:N=3", "judge:full:N=3", "judge:no_memory:N=3", "retry:R=1"}
    assert all(r["episodes"] == 4 for r in rows)  # 2 tasks x 2 held-out seeds (instances)
    assert by_setting["prm:N=3"]["verifier_calls_per_step"] == 1.0  # the N candidates in one batch
    assert by_setting["judge:full:N=3"]["judge_mode"] == "local"
    # the PRM's sweep is keyed by the model that verified it; base and the oracle have none
    prm_id = warehouse.query("SELECT model_id FROM models WHERE kind = 'prm'").column("model_id").to_pylist()
    keyed = warehouse.query(
        "SELECT DISTINCT setting, verifier_model_id FROM guidance_episodes WHERE setting IN ('base', 'oracle:N=3', "
        "'prm:N=3')"
    ).to_pylist()
    assert {(r["setting"], r["verifier_model_id"]) for r in keyed} == {
        ("base", ""),
        ("oracle:N=3", ""),
        ("prm:N=3", prm_id[0]),
    }
    passes = json.loads(by_setting["retry:R=1"]["pass_at"])
    assert passes["1"] == by_setting["base"]["success_rate"] and passes["2"] >= passes["1"]
    # every guided step is recorded, the judge's say that it ran locally
    modes = warehouse.query(
        "SELECT setting, list(DISTINCT mode) AS modes, count(*) AS n, max(n_candidates) AS most FROM guidance_steps "
        "GROUP BY 1"
    ).to_pylist()
    modes = {r["setting"]: r for r in modes}
    assert modes["judge:full:N=3"]["modes"] == ["local"] and modes["base"]["modes"] == ["none"]
    assert modes["prm:N=3"]["most"] == 3
    notes = (
        warehouse.query("SELECT DISTINCT note FROM guidance_steps WHERE setting = 'judge:full:N=3'")
        .column("note")
        .to_pylist()
    )
    assert all("local mode" in n for n in notes)
    # the trajectories are in episodes/steps, and every guided episode has its steps logged
    missing = warehouse.query(
        "SELECT count(*) AS n FROM guidance_episodes g WHERE NOT EXISTS "
        "(SELECT 1 FROM episodes e WHERE e.episode_id = g.episode_id) OR g.n_steps <> "
        "(SELECT count(*) FROM guidance_steps s WHERE s.episode_id = g.episode_id)"
    ).to_pylist()[0]["n"]
    assert missing == 0
    lineage = (
        warehouse.query(
            "SELECT DISTINCT input_asset FROM lineage "
            "WHERE asset = 'guidance_evaluation' AND partition_key = 'best_of_n'"
        )
        .column("input_asset")
        .to_pylist()
    )
    assert {"reward_model", "policy_sft"} <= set(lineage)
