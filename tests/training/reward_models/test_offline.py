"""Scoring away from the warehouse (training.reward_models.offline): the trajectories exported,
scored with a checkpoint elsewhere, and reported here give the report's own numbers."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from training.base.registry import ModelRecord
from training.reward_models.evaluate import load_evaluation_set, run_report
from training.reward_models.offline import (
    OfflineFileError,
    export_evaluation_sets,
    offline_report,
    read_scores_file,
    read_trajectories_file,
    score_trajectories_files,
)
from warehouse.catalog import Warehouse

COMPARED = ("accuracy", "precision", "recall", "key_step_progress_error", "all_step_progress_error_lcs", "threshold")


def test_export_score_report_gives_the_reports_metrics(tiny_home, trained_progrm, tmp_path):
    warehouse = Warehouse(tiny_home)
    counts = export_evaluation_sets(warehouse, tmp_path / "sets")
    assert counts["test"] == len(load_evaluation_set(warehouse, "test").trajectories) > 0
    exported = read_trajectories_file(tmp_path / "sets" / "test.jsonl.gz")
    assert exported == load_evaluation_set(warehouse, "test").trajectories  # the same trajectories, field for field

    written = score_trajectories_files(trained_progrm, tmp_path / "sets", tmp_path / "scores.json", latency_calls=5)
    assert written["kind"] == "progrm_env" and set(written["scores"]) == {"test", "validation"}
    offline = offline_report(warehouse, read_scores_file(tmp_path / "scores.json"))

    direct = run_report(
        warehouse, [ModelRecord("m", "progrm_env", str(trained_progrm))], plots_dir=tmp_path / "plots", latency_calls=5
    ).metrics["progrm_env"]
    for split in ("test", "validation"):
        for metric in COMPARED:
            if metric in direct[split]:
                a, b = offline[split][metric], direct[split][metric]
                assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-9), (split, metric)
    assert offline["test"]["latency_ms_p50"] > 0


def test_damaged_files_and_foreign_scores_are_one_error_naming_them(tiny_home, tmp_path):
    bad = tmp_path / "test.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"episode_id": "e1"}\n'))
    with pytest.raises(OfflineFileError, match=r"test.jsonl.gz, line 1: not a trajectory"):
        read_trajectories_file(bad)
    (tmp_path / "plain.jsonl.gz").write_text("not gzip")
    with pytest.raises(OfflineFileError, match="not a gzipped trajectories file"):
        read_trajectories_file(tmp_path / "plain.jsonl.gz")
    (tmp_path / "s.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(OfflineFileError, match="not a scores file of format"):
        read_scores_file(tmp_path / "s.json")
    foreign = {"format": "stepwise-rm-scores-1", "kind": "progrm_env", "scores": {"test": {"x": [0.5]}}}
    with pytest.raises(OfflineFileError, match=r"the scores of split 'test' miss or mis-size \d+ of its"):
        offline_report(Warehouse(tiny_home), foreign)
