"""The reward-model assets in Dagster: datasets -> models (partitioned by kind) -> report, with checks and lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from assets.resources import WarehouseResource
from assets.reward_models import (
    KIND_PARTITIONS,
    REWARD_MODEL_ASSETS,
    REWARD_MODEL_CHECKS,
    reward_model,
    reward_model_datasets,
    reward_model_report,
)
from tests.training.conftest import build_tiny_warehouse
from training.reward_models.runs import check_report_metrics_present
from warehouse.catalog import Warehouse

TRAIN = {
    "train_steps": 30,
    "per_device_train_batch_size": 16,
    "learning_rate": 3e-3,
    "threads": 1,
    "extra_args": ["--eval_strategy", "steps", "--eval_steps", "15", "--save_steps", "15"],
}


def test_asset_definitions():
    assert set(KIND_PARTITIONS.get_partition_keys()) == {"orm", "progrm_lcs", "progrm_env", "prm", "guidnav"}
    keys = {a.key.to_user_string() for a in REWARD_MODEL_ASSETS}
    assert keys == {"reward_model_datasets", "reward_model", "reward_model_report"}
    assert reward_model.partitions_def == KIND_PARTITIONS == reward_model_datasets.partitions_def
    assert reward_model_report.partitions_def is None
    deps = {k.to_user_string() for k in reward_model_datasets.dependency_keys}
    assert {"progress_labels", "progress_split"} <= deps
    assert {k.name for c in REWARD_MODEL_CHECKS for k in c.check_keys} == {
        "reward_model_report_metrics_present",
        "reward_model_report_progrm_beats_orm",
        *(f"{t}_key_unique" for t in ("rm_examples", "rm_trl_stepwise", "models", "rm_predictions", "rm_metrics")),
    }


@pytest.mark.e2e
def test_datasets_models_and_report_materialize_with_checks(tmp_path):
    home = tmp_path / "home"
    build_tiny_warehouse(home)
    resources = {"warehouse": WarehouseResource(home=str(home))}
    instance = DagsterInstance.ephemeral()
    for kind in ("orm", "progrm_lcs", "progrm_env"):
        result = materialize(
            [reward_model_datasets, reward_model],
            partition_key=kind,
            resources=resources,
            instance=instance,
            run_config={"ops": {"reward_model": {"config": TRAIN}}},
        )
        assert result.success
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert checks == {"dataset_is_valid": True, "checkpoint_loads": True}
        meta = result.asset_materializations_for_node("reward_model")[0].metadata
        assert meta["global_steps"].value == 30 and "mae" in meta["validation_metrics"].value
        assert meta["exported_step"].value in (15, 30) and meta["stopped_early"].value is False
        assert meta["training_curves_plot"].value.startswith("![training_curves](data:image/png;base64,")

    report = materialize(
        [reward_model_report, *REWARD_MODEL_CHECKS],
        resources=resources,
        instance=instance,
        run_config={"ops": {"reward_model_report": {"config": {"latency_calls": 10, "threads": 1}}}},
    )
    assert report.success
    checks = {e.check_name: e.passed for e in report.get_asset_check_evaluations()}
    assert checks["reward_model_report_metrics_present"] is True
    versus_orm = (
        next(e for e in report.get_asset_check_evaluations() if e.check_name == "reward_model_report_progrm_beats_orm")
        .metadata["comparison"]
        .value
    )
    for kind in ("progrm_lcs", "progrm_env"):
        assert 0 <= versus_orm[kind]["accuracy_mcnemar_p"] <= 1 and versus_orm[kind]["only_it_right"] >= 0
    meta = report.asset_materializations_for_node("reward_model_report")[0].metadata
    table = meta["report"].value
    for name in ("ORM", "ProgRM-LCS", "ProgRM-Env", "#TP", "Key Step Prog. Err.", "Latency p50", "p (McNemar)"):
        assert name in table
    assert meta["progress_curves_plot"].value.startswith("![progress_curves](data:image/png;base64,")

    warehouse = Warehouse(home)
    models = warehouse.query(
        "SELECT kind, checkpoint_path, dataset_materialization_id, label_versions, training_mix "
        "FROM models ORDER BY kind"
    ).to_pylist()
    assert [m["kind"] for m in models] == ["orm", "progrm_env", "progrm_lcs"]
    assert models[1]["label_versions"] == ["env-test-v1"]
    # the data mix a model learned from, by episode purpose, recorded with it
    assert json.loads(models[1]["training_mix"]).get("demonstration", 0) > 0
    from training.reward_models.models import RewardScorer

    assert not Path(models[1]["checkpoint_path"]).is_absolute()  # stored relative to the home
    served = RewardScorer.from_checkpoint(warehouse.resolve(models[1]["checkpoint_path"]))
    model_ids = warehouse.query("SELECT model_id FROM models WHERE kind = 'progrm_env'").column("model_id").to_pylist()
    assert served.metadata["model_id"] == model_ids[0]
    counts = warehouse.query(
        "SELECT kind, count(*) AS n, count(*) FILTER (WHERE split = 'test') AS test "
        "FROM rm_predictions GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    assert [c["kind"] for c in counts] == ["orm", "progrm_env", "progrm_lcs"] and all(c["test"] > 0 for c in counts)
    metrics = (
        warehouse.query("SELECT DISTINCT metric FROM rm_metrics WHERE split = 'test'").column("metric").to_pylist()
    )
    assert {"accuracy", "key_step_progress_error", "mean_final_step_score", "latency_ms_p50"} <= set(metrics)
    # lineage: from the report's predictions back through the model and its dataset to the labels
    path = warehouse.query(
        "SELECT path FROM table_versions WHERE table_name = 'rm_predictions' AND is_current LIMIT 1"
    ).to_pylist()[0]["path"]
    chain = {r["asset"] for r in warehouse.walk_back(path).to_pylist()}
    assert {
        "reward_model_report",
        "reward_model",
        "reward_model_datasets",
        "progress_labels",
        "progress_split",
        "human_demonstrations",
    } <= chain


@pytest.mark.e2e
def test_stepwise_reward_models_command_trains_and_reports(tmp_path, monkeypatch, capsys):
    """``stepwise reward-models``: the three kinds the report compares, then the report, in one command;
    ``stepwise rl --reward-model`` takes one of them only for runs that score with its kind."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    home = tmp_path / "home"
    build_tiny_warehouse(home)
    env = os.environ | {"STEPWISE_HOME": str(home), "DAGSTER_HOME": str(tmp_path / "dagster"), "HF_HUB_OFFLINE": "1"}
    stepwise = [sys.executable, "-m", "pipelines.cli"]
    repo = Path(__file__).resolve().parents[2]
    refused = subprocess.run(
        [*stepwise, "reward-models", "--kinds", "orm,bogus"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "unknown kind(s) ['bogus']" in refused.stderr
    done = subprocess.run(
        [*stepwise, "reward-models", "--max-steps", "6", "--threads", "1"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in (
        "reward_models[orm]: ok",
        "reward_models[progrm_lcs]: ok",
        "reward_models[progrm_env]: ok",
        "reward_model_report: ok",
        "check reward_model_report_metrics_present:",
    ):
        assert name in done.stdout
    # Every kind has every Table 2-3 metric, none NaN (training is seeded, so the 6-step models are
    # the same in every session; unseeded, a head that predicted no success once left precision 0/0).
    present = check_report_metrics_present(Warehouse(home))
    assert present.metadata["missing"] == [] and present.metadata["nan"] == [], present.metadata
    table = done.stdout[done.stdout.index("kind") :]
    assert all(kind in table for kind in ("orm", "progrm_lcs", "progrm_env")) and "key_step_progress_error" in table
    warehouse = Warehouse(home)
    assert warehouse.query("SELECT count(DISTINCT kind) AS n FROM models").to_pylist()[0]["n"] == 3
    from pipelines.cli import main

    orm_id = warehouse.query("SELECT model_id FROM models WHERE kind = 'orm'")[0][0].as_py()
    monkeypatch.setenv("STEPWISE_HOME", str(home))
    capsys.readouterr()
    assert main(["rl", "--runs", "orm,progrm_env", "--reward-model", orm_id]) == 2
    refusal = capsys.readouterr().err.strip()
    assert refusal == (
        f"stepwise rl: --reward-model {orm_id} is of kind orm; ['progrm_env'] do not score with that kind "
        "(run them without --reward-model)"
    ), refusal
    # runs that score with the model's kind, composed ones included, are each pinned to it
    from pipelines.cli.training import _reward_model_pins

    assert _reward_model_pins(orm_id, ["orm", "outcome+orm:decay"]) == {"orm": orm_id, "outcome+orm:decay": orm_id}
