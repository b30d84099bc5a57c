"""Flywheel rounds recorded from the reward-model report: one row per kind and round, replaceable."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from training.flywheel.rounds import FlywheelError, next_round, record_round, recorded_rounds, rounds_markdown
from warehouse.catalog import Materialization, Warehouse
from warehouse.tables_training import MODELS, RM_AGENT_AUC, RM_ALTERNATIVE_TOP1


def _report(wh: Warehouse, run_id: str, model_id: str, auc: float, mix: dict, within: float | None = None) -> None:
    """What a report run leaves behind: the model row and its rm_agent_auc rows."""
    m = Materialization(asset="reward_model", run_id=run_id)
    model = {name: None for name in MODELS.names} | {
        "model_id": model_id,
        "kind": "orm",
        "n_train_examples": sum(mix.values()),
        "training_mix": json.dumps(mix),
        "created_at": datetime.now(UTC),
    }
    wh.publish(m, [wh.stage_table("models", model_id, pa.Table.from_pylist([model], schema=MODELS), m)])
    report = Materialization(asset="reward_model_report", run_id=run_id)
    rows = [
        {
            "model_id": model_id,
            "kind": "orm",
            "episode_set": "agent_evaluation",
            "family": family,
            "episodes": 40,
            "successes": 15,
            "policies": 3,
            "auc": value,
            "auc_low": value - 0.1,
            "auc_high": value + 0.1,
            "score_rule": "last step",
            "report_run_id": run_id,
            "created_at": datetime.now(UTC),
        }
        for family, value in (("miniwob-forms", auc), ("all", auc), ("all:within_task", within))
        if value is not None
    ]
    table = pa.Table.from_pylist(rows, schema=RM_AGENT_AUC)
    wh.publish(report, [wh.stage_table("rm_agent_auc", model_id, table, report)])


def test_rounds_are_recorded_from_the_latest_report(tmp_path):
    wh = Warehouse(tmp_path / "home")
    plot = tmp_path / "auc.png"
    with pytest.raises(FlywheelError, match="no reward-model report"):
        record_round(wh, 0, run_id=None, plot_path=plot)
    assert next_round(wh) == 0
    _report(wh, "run-a", "orm-a", 0.52, {"demonstration": 900, "synthetic": 100})
    first = record_round(wh, 0, run_id=None, plot_path=plot)
    assert [(r["round"], r["model_id"], r["auc"]) for r in first["rows"]] == [(0, "orm-a", 0.52)]
    assert first["rows"][0]["agent_examples"] == 0
    assert next_round(wh) == 1
    _report(wh, "run-b", "orm-b", 0.71, {"demonstration": 900, "policy_rollout": 300}, within=0.55)
    second = record_round(wh, 1, run_id=None, plot_path=plot)
    assert second["rows"][0]["model_id"] == "orm-b" and second["rows"][0]["agent_examples"] == 300
    assert second["rows"][0]["auc_within_task"] == 0.55  # the same report's within-task row
    assert first["rows"][0]["auc_within_task"] is None  # a report without one records none
    assert "| 1 | orm | 0.71 [0.61, 0.81] | 0.55 [0.45, 0.65] |  | 1,200 | 300 | 0 | 0 |" in second["markdown"]
    assert "| 0 | orm | 0.52 [0.42, 0.62] | n/a |" in second["markdown"]
    assert plot.stat().st_size > 0
    record_round(wh, 1, run_id=None, plot_path=plot)  # a round run again replaces its record
    assert recorded_rounds(wh) == [0, 1]
    assert wh.query("SELECT count(*) FROM flywheel_rounds")[0][0].as_py() == 2
    with pytest.raises(FlywheelError, match="round must be 0 or more"):
        record_round(wh, -1, run_id=None, plot_path=plot)


def test_a_round_records_the_top1_among_candidates_of_the_same_report(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _report(wh, "run-a", "orm-a", 0.6, {"demonstration": 10})
    m = Materialization(asset="reward_model_report", run_id="run-a")
    top1 = {name: None for name in RM_ALTERNATIVE_TOP1.names} | {
        "model_id": "orm-a",
        "kind": "orm",
        "family": "all",
        "states": 30,
        "top1": 0.6,
        "top1_low": 0.45,
        "top1_high": 0.75,
        "policy_top1": 0.5,
        "report_run_id": "run-a",
    }
    other = top1 | {"family": "miniwob-forms", "top1": 0.1}
    table = pa.Table.from_pylist([top1, other], schema=RM_ALTERNATIVE_TOP1)
    wh.publish(m, [wh.stage_table("rm_alternative_top1", "orm-a", table, m)])
    (row,) = record_round(wh, 0, run_id=None, plot_path=tmp_path / "p.png")["rows"]
    assert (row["top1"], row["policy_top1"], row["top1_states"]) == (0.6, 0.5, 30)
    assert "60.0 [45.0, 75.0] (50.0; 30 states)" in rounds_markdown([row])


def test_a_report_without_agent_episodes_cannot_make_a_round(tmp_path):
    wh = Warehouse(tmp_path / "home")
    m = Materialization(asset="reward_model_report", run_id="r")
    table = pa.Table.from_pylist([], schema=RM_AGENT_AUC)
    wh.publish(m, [wh.stage_table("rm_agent_auc", "x", table, m)])
    with pytest.raises(FlywheelError, match="judged no held-out agent episode"):
        record_round(wh, 0, run_id=None, plot_path=tmp_path / "p.png")
