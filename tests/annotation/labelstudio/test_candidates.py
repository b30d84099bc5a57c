"""Candidates from plain rows (labels, one model's rm_predictions by kind), and reading them from a warehouse."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from annotation.labelstudio.reads import read_prediction_model, read_step_candidates, read_step_judgements
from annotation.labelstudio.selection import (
    STEP_JUDGE_KINDS,
    Selected,
    StepCandidate,
    candidate_rows,
    step_candidates,
    uncertainty,
)
from warehouse.catalog import Materialization
from warehouse.tables_training import MODELS, RM_PREDICTIONS

STEPS = [{"episode_id": "a", "step_idx": i, "task_id": "t", "success": True} for i in range(3)] + [
    {"episode_id": "b", "step_idx": 0, "task_id": "t", "success": False}
]


def label(episode: str, step: int, source: str, progress: float, **extra) -> dict:
    return {
        "episode_id": episode,
        "step_idx": step,
        "source": source,
        "method": extra.get("method"),
        "progress": progress,
        "is_key_step": extra.get("key", False),
        "label_version": extra.get("version"),
    }


def prediction(episode: str, step: int, score: float, kind: str = "progrm_lcs") -> dict:
    return {"episode_id": episode, "step_idx": step, "kind": kind, "score": score}


def test_labels_prefer_improved_lcs_then_the_latest_version():
    labels = [
        label("a", 0, "lcs", 0.1, method="paper", version="v9"),
        label("a", 0, "lcs", 0.3, method="improved", version="v1"),
        label("a", 0, "lcs", 0.4, method="improved", version="v2"),
        label("a", 0, "lcs", 0.9, method=None, version="v9"),
        label("a", 0, "env", 0.5, version=None, key=True),
        label("a", 0, "env", 0.6, version="v1", key=False),
        label("a", 0, "human", 1.0),  # other sources are not automatic labels
    ]
    by_step = {(c.episode_id, c.step_idx): c for c in step_candidates(STEPS, labels)}
    first = by_step[("a", 0)]
    assert (first.lcs_progress, first.env_progress, first.env_key_step) == (0.4, 0.6, False)
    assert by_step[("a", 1)].lcs_progress is None and by_step[("b", 0)].env_progress is None
    assert all(c.model_id is None and not c.has_prediction for c in by_step.values())
    assert (first.task_id, first.success, by_step[("b", 0)].success) == ("t", True, False)


def test_a_progress_model_fills_progress_and_the_previous_steps():
    predictions = [prediction("a", 0, 0.2), prediction("a", 0, 0.4), prediction("a", 2, 0.9), prediction("b", 0, 0.1)]
    by_step = {(c.episode_id, c.step_idx): c for c in step_candidates(STEPS, [], predictions, "m1")}
    assert by_step[("a", 0)].model_progress == pytest.approx(0.3)  # two report runs: the mean
    assert by_step[("a", 0)].model_previous_progress == 0.0  # before the first step
    assert by_step[("a", 2)].model_previous_progress == pytest.approx(0.3)  # the preceding scored step
    assert by_step[("a", 1)].model_progress is None and by_step[("a", 1)].model_id is None
    assert by_step[("b", 0)].model_previous_progress == 0.0  # never the other episode's score
    assert {c.model_id for c in by_step.values() if c.model_progress is not None} == {"m1"}
    assert all(c.model_step_prob is None for c in by_step.values())


@pytest.mark.parametrize("kind", sorted(STEP_JUDGE_KINDS))
def test_a_step_judge_fills_the_probability_of_a_correct_step(kind):
    predictions = [prediction("a", 0, 0.8, kind), prediction("a", 1, 0.3, kind)]
    by_step = {(c.episode_id, c.step_idx): c for c in step_candidates(STEPS, [], predictions, "judge")}
    assert by_step[("a", 0)].model_step_prob == 0.8 and by_step[("a", 0)].model_progress is None
    assert by_step[("a", 1)].model_id == "judge" and by_step[("a", 1)].model_previous_progress is None
    assert by_step[("a", 2)].model_id is None


def test_step_judge_kinds_are_the_step_judges_of_training():
    from training.reward_models.kinds import KINDS

    judges = {name for name, spec in KINDS.items() if spec.target in ("step_correctness", "step_reward")}
    assert judges == STEP_JUDGE_KINDS
    assert all(spec.scores_progress for name, spec in KINDS.items() if name not in judges)


def test_a_step_judge_disagrees_with_the_labels_key_step_verdict():
    judged = StepCandidate("e", 0, "t", lcs_key_step=True, env_key_step=True, model_step_prob=0.1)
    assert uncertainty(judged) == (pytest.approx(0.9), "model_disagreement")
    split = dict(lcs_progress=0.5, env_progress=0.5, lcs_key_step=True, env_key_step=False)
    assert uncertainty(StepCandidate("e", 0, "t", **split, model_step_prob=0.5)) == (0.5, "label_disagreement")
    assert uncertainty(StepCandidate("e", 0, "t", **split, model_step_prob=1.0))[1] == "label_disagreement"  # a tie
    assert uncertainty(StepCandidate("e", 0, "t", model_step_prob=0.9)) == (0.5, "no_signal")


def test_candidate_rows_have_the_table_columns():
    from warehouse.tables_annotation import ANNOTATION_CANDIDATES

    c = StepCandidate("e", 3, "t", success=False, lcs_progress=0.5, model_progress=0.7, model_id="m")
    rows = candidate_rows([Selected(c, 0.2, "model_disagreement", 0)])
    assert list(rows[0]) == ANNOTATION_CANDIDATES.names
    assert rows[0]["stratum"] == "t|failure" and rows[0]["model_id"] == "m"
    pa.Table.from_pylist(rows, schema=ANNOTATION_CANDIDATES)  # fits the schema


def _publish_models(warehouse, models: list[tuple[str, str, int]]) -> None:
    """Predictions of each (model_id, kind, day trained) for every step, and its ``models`` row."""
    steps = warehouse.query("SELECT episode_id, step_idx FROM steps").to_pylist()
    m = Materialization(asset="test_models")
    outputs = []
    for model_id, kind, day in models:
        rows = [{"model_id": model_id, "kind": kind, "score": 0.9} | s for s in steps]
        record = {"model_id": model_id, "kind": kind, "created_at": datetime(2025, 1, day, tzinfo=UTC)}
        outputs += [
            warehouse.stage_table("rm_predictions", model_id, pa.Table.from_pylist(rows, schema=RM_PREDICTIONS), m),
            warehouse.stage_table("models", model_id, pa.Table.from_pylist([record], schema=MODELS), m),
        ]
    warehouse.publish(m, outputs)


def test_reading_candidates_takes_the_model_trained_last(small_warehouse):
    assert read_prediction_model(small_warehouse) == "rm-test-1"  # no models rows: the greatest id
    _publish_models(small_warehouse, [("prm-new", "prm", 20), ("aaa-old", "progrm_env", 1)])
    assert read_prediction_model(small_warehouse) == "prm-new"
    assert read_prediction_model(small_warehouse, "aaa-old") == "aaa-old"
    judged = read_step_candidates(small_warehouse)
    assert judged and all(c.model_step_prob == 0.9 and c.model_progress is None for c in judged)
    assert {c.model_id for c in judged} == {"prm-new"}
    progress = read_step_candidates(small_warehouse, model="rm-test-1")
    assert all(c.model_progress is not None and c.model_step_prob is None for c in progress)
    assert {c.lcs_progress is not None for c in progress} == {True}  # the fixture labels every step
    rows = candidate_rows(Selected(c, 0.5, "no_signal", 0) for c in judged[:2])
    keys = {(r["episode_id"], r["step_idx"]) for r in rows}
    assert read_step_judgements(small_warehouse, rows).keys() >= keys  # the push reads the probability back


def test_reading_candidates_of_one_source_and_an_empty_warehouse(small_warehouse, tmp_path):
    from warehouse.catalog import Warehouse

    assert read_step_candidates(small_warehouse, episode_source="rollout") == []
    assert len(read_step_candidates(small_warehouse, episode_source="human_demo")) == 3 * 2 * 3 * 4
    assert {c.episode_source for c in read_step_candidates(small_warehouse)} == {"human_demo"}
    assert read_step_candidates(Warehouse(tmp_path / "empty")) == []
