"""Cohen's kappa (checked against scikit-learn), annotator statistics, training labels, source comparison."""

from __future__ import annotations

import random

import pytest
from sklearn.metrics import cohen_kappa_score

from annotation.labelstudio.agreement import (
    annotator_stats,
    cohen_kappa,
    compare_label_sources,
    pairwise_agreement,
    pooled_kappa,
    step_training_labels,
)


def test_kappa_matches_scikit_learn():
    rng = random.Random(0)
    a = [rng.choice("pn") for _ in range(200)]
    b = [x if rng.random() < 0.8 else rng.choice("pn") for x in a]
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))
    x = [rng.randint(1, 5) for _ in range(200)]
    y = [min(5, max(1, v + rng.choice((-1, 0, 0, 1)))) for v in x]
    assert cohen_kappa(x, y, weights="quadratic") == pytest.approx(cohen_kappa_score(x, y, weights="quadratic"))
    assert cohen_kappa(["p"] * 5, ["p"] * 5) == 1.0
    assert cohen_kappa([], []) is None


def label(annotator: str, task: int, interface: str = "step_correctness", value=None, **extra) -> dict:
    row = {
        "annotator_id": annotator,
        "ls_server": "local",
        "ls_project_id": 1,
        "ls_task_id": task,
        "interface": interface,
        "status": "active",
        "was_cancelled": False,
        "label": None,
        "value": None,
        "lead_time_s": 2.0 + task,
        "episode_id": f"e{task}",
        "step_idx": 0,
        "task_id": "t",
    }
    if interface == "step_correctness":
        row["label"] = value
    else:
        row["value"] = value
    return row | extra


def test_agreement_only_where_tasks_overlap_and_unsure_is_no_label():
    rows = [label("A", t, value="positive" if t % 3 else "negative") for t in range(12)]
    rows += [label("B", t, value="positive" if t % 3 else "negative") for t in range(6)]
    rows += [label("B", 6, value="unsure"), label("C", 100, value="positive")]
    (pair,) = pairwise_agreement(rows)
    assert (pair.annotator_a, pair.annotator_b, pair.n_items, pair.agreement, pair.kappa) == ("A", "B", 6, 1.0, 1.0)
    kappa, n_pairs = pooled_kappa(rows, "step_correctness")
    assert (kappa, n_pairs) == (1.0, 6)
    stats = {s["annotator_id"]: s for s in annotator_stats(rows)}
    assert stats["B"]["n_unsure"] == 1 and stats["B"]["n_overlapping_tasks"] == 6
    assert stats["C"]["n_overlapping_tasks"] == 0 and stats["C"]["kappa_with_others"] is None
    assert stats["A"]["median_lead_time_s"] == pytest.approx(7.5)


def test_training_labels_majority_excludes_unsure_skipped_retracted():
    rows = [
        label("A", 1, value="positive"),
        label("B", 1, value="positive"),
        label("C", 1, value="negative"),
        label("A", 2, value="unsure"),
        label("B", 2, value="negative", status="retracted"),
        label("A", 3, value="positive"),
        label("B", 3, value="negative"),
        label("A", 4, value="negative", was_cancelled=True),
        label("A", 1, interface="step_progress", value=0.5),
        label("B", 1, interface="step_progress", value=0.7),
    ]
    by_episode = {r["episode_id"]: r for r in step_training_labels(rows, "human:v")}
    assert by_episode["e1"]["correctness"] == "positive" and by_episode["e1"]["correctness_votes"] == 3
    assert by_episode["e1"]["progress"] == pytest.approx(0.6) and by_episode["e1"]["progress_votes"] == 2
    assert by_episode["e2"]["correctness"] is None and by_episode["e2"]["unsure_votes"] == 1
    assert by_episode["e3"]["correctness"] is None  # a tie is no label
    assert "e4" not in by_episode


def test_compare_label_sources_on_common_steps():
    steps = [
        {
            "human_correct": i % 2 == 0,
            "lcs_correct": i % 2 == 0,
            "env_correct": True,
            "human_progress": i / 10,
            "lcs_progress": i / 10,
            "env_progress": None,
        }
        for i in range(10)
    ]
    rows = {(r["source_a"], r["source_b"], r["quantity"]): r for r in compare_label_sources(steps)}
    assert rows[("human", "lcs", "correctness")]["cohen_kappa"] == 1.0
    assert rows[("human", "env", "correctness")]["agreement"] == 0.5
    assert rows[("human", "lcs", "progress")]["mean_abs_diff"] == 0.0 and rows[("human", "lcs", "progress")][
        "pearson_r"
    ] == pytest.approx(1.0)
    assert ("human", "env", "progress") not in rows and ("human", "model", "correctness") not in rows
