"""Report bodies from plain rows: training labels, agreement, source comparison, sync summaries, checks, plots."""

from __future__ import annotations

import pyarrow as pa
import pytest

from annotation.labelstudio.plots import annotator_plot, comparison_plot, selection_plot
from annotation.labelstudio.reports import (
    agreement_report,
    comparison_steps,
    duplicate_annotations,
    duplicate_queue_items,
    human_label_version,
    human_step_label_rows,
    md_table,
    model_verdict,
    selection_summary,
    source_comparison,
    step_labels_summary,
    sync_event,
    sync_summary,
    untraced_labels,
    unusable_violations,
)
from annotation.labelstudio.selection import StepCandidate
from annotation.labelstudio.sync import LabelDiff, ProjectSyncResult
from warehouse.plotting import Markdown
from warehouse.schema import PROGRESS_LABELS
from warehouse.tables_annotation import HUMAN_STEP_LABELS, LABEL_SOURCE_AGREEMENT


def human(annotation_id: int, task: int, annotator: str, interface: str = "step_correctness", **fields) -> dict:
    row = {
        "ls_server": "local",
        "annotation_id": annotation_id,
        "ls_project_id": 1,
        "ls_task_id": task,
        "interface": interface,
        "interface_version": f"{interface}@1",
        "episode_id": f"e{task}",
        "step_idx": 0,
        "task_id": "t",
        "label": None,
        "value": None,
        "status": "active",
        "was_cancelled": False,
        "usable_for_training": True,
        "annotator_id": annotator,
        "lead_time_s": 2.0,
    }
    return row | fields


ROWS = [
    human(1, 1, "ann-a", label="positive"),
    human(2, 1, "ann-b", label="positive"),
    human(3, 2, "ann-a", label="negative"),
    human(4, 2, "ann-b", label="unsure", usable_for_training=False),
    human(5, 1, "ann-a", "step_progress", value=0.5),
    human(6, 3, "ann-a", "milestone_review", value=5.0, episode_id=None, step_idx=None),
    human(
        7,
        3,
        "ann-b",
        "milestone_review",
        value=3.0,
        episode_id=None,
        step_idx=None,
        status="retracted",
        usable_for_training=False,
    ),
]


def test_md_table_formats_and_clips():
    table = md_table([{"a": 1, "b": 0.12345}, {"a": None, "b": "x"}], ["a", "b"], max_rows=1)
    assert isinstance(table, Markdown) and "| 1 | 0.123 |" in table and "1 more rows" in table
    assert md_table([], ["a"]) == "_none_"


def test_human_step_labels_and_their_progress_rows():
    labels, progress, version = human_step_label_rows(ROWS)
    assert version == human_label_version(ROWS) == "human:milestone_review@1,step_correctness@1,step_progress@1"
    by_step = {r["episode_id"]: r for r in labels}
    assert by_step["e1"]["correctness"] == "positive" and by_step["e1"]["progress"] == 0.5
    assert by_step["e2"]["correctness"] == "negative" and by_step["e2"]["unsure_votes"] == 1
    assert [(r["episode_id"], r["source"], r["is_key_step"]) for r in progress] == [("e1", "human", True)]
    pa.Table.from_pylist(labels, schema=HUMAN_STEP_LABELS)
    pa.Table.from_pylist(progress, schema=PROGRESS_LABELS)
    summary = step_labels_summary(labels, progress, version)
    assert (summary["steps"], summary["positive"], summary["unsure_answers_excluded"]) == (2, 1, 1)


def test_agreement_report_summary():
    stats, kappas, summary = agreement_report(ROWS)
    assert {(s["annotator_id"], s["interface"]) for s in stats} >= {("ann-a", "step_correctness")}
    assert kappas["step_correctness"]["overlapping_pairs"] == 1  # task 2's unsure answer is no label
    assert summary["annotations"] == 6 and summary["retracted"] == 1 and summary["annotators"] == 2
    assert summary["unsure_share"] == pytest.approx(1 / 4)
    assert summary["milestone_mean_score"] == 5.0 and summary["milestone_share_4_or_5"] == 1.0
    assert isinstance(summary["annotator_stats"], Markdown) and "ann-a" in summary["annotator_stats"]
    assert "milestone_mean_score" not in agreement_report(ROWS[:4])[2]


def test_sources_compared_on_human_labelled_steps():
    progress_model = StepCandidate("e1", 0, "t", lcs_progress=0.5, lcs_key_step=True, model_progress=0.6)
    judge = StepCandidate("e2", 0, "t", env_progress=0.0, env_key_step=False, model_step_prob=0.3)
    assert model_verdict(progress_model) is True and model_verdict(judge) is False
    assert model_verdict(StepCandidate("x", 0, "t")) is None
    labels, _, _ = human_step_label_rows(ROWS)
    steps = comparison_steps(labels, {("e1", 0): progress_model, ("e2", 0): judge})
    assert steps[0] == {
        "human_progress": 0.5,
        "human_correct": True,
        "lcs_progress": 0.5,
        "lcs_correct": True,
        "env_progress": None,
        "env_correct": None,
        "model_progress": 0.6,
        "model_correct": True,
    }
    assert steps[1]["model_progress"] is None and steps[1]["model_correct"] is False
    comparison, summary = source_comparison(steps)
    pairs = {(r["source_a"], r["source_b"], r["quantity"]): r for r in comparison}
    assert pairs[("human", "model", "correctness")]["agreement"] == 1.0
    assert summary["steps_with_human_labels"] == 2 and "human" in summary["comparisons"]
    pa.Table.from_pylist(comparison, schema=LABEL_SOURCE_AGREEMENT)
    assert comparison_steps(labels, {})[0]["lcs_progress"] is None


def test_selection_and_sync_summaries():
    rows = [
        {"reason": "label_disagreement", "stratum": "t|success", "model_progress": 0.3},
        {"reason": "spot_check", "stratum": "t|failure", "model_progress": None},
    ]
    summary = selection_summary(rows, n_candidates=10, n_excluded=2)
    assert summary == {
        "selected": 2,
        "candidate_steps": 10,
        "already_queued_steps": 2,
        "by_reason": {"label_disagreement": 1, "spot_check": 1},
        "strata": 2,
        "with_model_prediction": 1,
    }
    applied = ProjectSyncResult(
        "step_correctness", 7, "applied", LabelDiff(created=3, updated=1), active=4, usable=3, export_id=9
    )
    applied.materialization_id, applied.output_path = "m1", "/tmp/x.parquet"
    quiet = ProjectSyncResult("step_progress", 8, "unchanged")
    totals = sync_summary([applied, quiet])
    assert (totals["created"], totals["updated"], totals["active_labels"]) == (3, 1, 4)
    assert totals["projects"]["step_progress"]["status"] == "unchanged"
    event = sync_event(applied)
    assert event["description"] == "step_correctness: +3 new, 1 updated, 0 retracted"
    assert event["metadata"]["materialization_id"] == "m1" and str(event["metadata"]["path"]) == "/tmp/x.parquet"


def test_check_outcomes():
    assert duplicate_annotations(ROWS).passed
    assert not duplicate_annotations(ROWS + ROWS[:1]).passed
    assert unusable_violations(ROWS).passed
    bad = unusable_violations([human(9, 9, "a", label="unsure", usable_for_training=True)])
    assert not bad.passed and bad.metadata == {"violations": 1, "unsure": 1}
    queue = [
        {"ls_server": "local", "ls_project_id": 1, "ls_task_id": t, "interface_version": "v", "item_key": f"k{t}"}
        for t in (1, 2, 3)
    ]
    assert untraced_labels(ROWS, queue).passed
    assert untraced_labels(ROWS, queue[:2]).metadata["not_in_queue"] == 2
    assert duplicate_queue_items(queue).passed and not duplicate_queue_items(queue + queue[:1]).passed


def test_plots_are_saved_and_inlined(tmp_path):
    rows = [
        {"reason": "label_disagreement", "uncertainty": 0.6, "task_id": "t", "success": True},
        {"reason": "spot_check", "uncertainty": 0.1, "task_id": "u", "success": False},
    ]
    md = selection_plot(rows, tmp_path / "plots" / "selection.png")
    assert md.startswith("![selected steps") and (tmp_path / "plots" / "selection.png").stat().st_size > 0
    stats, kappas, _ = agreement_report(ROWS)
    assert annotator_plot(stats, kappas, tmp_path / "agreement.png").startswith("![")
    comparison, _ = source_comparison(
        [{"human_correct": True, "lcs_correct": True, "human_progress": 0.5, "lcs_progress": 0.4}]
    )
    assert comparison_plot(comparison, tmp_path / "comparison.png").startswith("![")
