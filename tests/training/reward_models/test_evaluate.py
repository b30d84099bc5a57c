"""Evaluation metrics as ProgRM reports them (Tables 2-3), calibration and plots."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from training.base.states import TextStep, TextTrajectory
from training.reward_models.evaluate import (
    PAIRED_COLUMNS,
    EvaluationSet,
    evaluate_scores,
    markdown_table,
    plot_calibration,
    plot_progress_curves,
)
from training.reward_models.examples import EpisodeLabels
from training.reward_models.metrics import (
    calibration_bins,
    choose_threshold,
    key_step_progress_error,
    paired_success_comparison,
    success_judgement,
)
from warehouse.statistics import mcnemar_exact_p, roc_auc


def test_success_judgement_counts_and_rates():
    # 10 trajectories: 6 successes, 4 failures
    scores = [0.9, 0.8, 0.7, 0.6, 0.4, 0.2, 0.9, 0.3, 0.1, 0.2]
    success = [True, True, True, True, True, False, False, False, False, True]
    m = success_judgement(scores, success, threshold=0.5)
    assert (m["tp"], m["fn"], m["tn"], m["fp"]) == (4, 2, 3, 1)
    assert m["tp_pct"] == 40 and m["fp_pct"] == 10
    assert m["precision"] == pytest.approx(80.0) and m["recall"] == pytest.approx(100 * 4 / 6)
    assert m["accuracy"] == pytest.approx(70.0)


def test_threshold_maximises_accuracy_and_prefers_the_middle():
    assert choose_threshold([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == pytest.approx(0.5)
    t = choose_threshold([0.6, 0.7, 0.8, 0.9], [False, False, True, True])
    assert 0.7 < t < 0.8
    assert choose_threshold([0.3, 0.4], [True, True]) == 0.5


def test_key_step_error_uses_only_milestone_steps():
    labels = {"e": EpisodeLabels((0.0, 0.5, 0.5, 1.0), (False, True, False, True), "v")}
    scores = {"e": np.array([0.9, 0.4, 0.0, 0.7])}
    m = key_step_progress_error(scores, labels)
    assert m["key_steps"] == 2 and m["key_step_progress_error"] == pytest.approx((0.1 + 0.3) / 2)


def test_roc_auc_matches_pair_counting():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, size=40) / 4
    y = rng.random(40) < 0.5
    pairs = [(a, b) for a, b in itertools.product(s[y], s[~y])]
    expected = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert roc_auc(s, y) == pytest.approx(expected)
    assert np.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_calibration_bins_and_ece():
    bins = calibration_bins([0.05, 0.15, 0.95, 0.95], [0.0, 0.0, 1.0, 1.0], n_bins=10)
    assert bins.counts.sum() == 4 and bins.counts[9] == 2
    assert bins.ece == pytest.approx((0.05 + 0.15 + 0.05 + 0.05) / 4)


def _evaluation_set():
    trajs = [
        TextTrajectory(
            f"e{i}",
            "login-user" if i % 2 else "click",
            "goal",
            tuple(TextStep(("body",), f"A{t}") for t in range(3)),
            success=i % 3 != 0,
        )
        for i in range(6)
    ]
    env = {
        t.episode_id: EpisodeLabels((0.0, 0.5, 1.0 if t.success else 0.5), (False, True, bool(t.success)), "env")
        for t in trajs
    }
    lcs = {
        t.episode_id: EpisodeLabels((1 / 3, 2 / 3, 1.0 if t.success else 2 / 3), (True, True, bool(t.success)), "lcs")
        for t in trajs
    }
    verdicts = {
        t.episode_id: [
            ("positive", "derived"),
            ("positive", "derived"),
            ("positive" if t.success else "negative", "human"),
        ]
        for t in trajs
    }
    return EvaluationSet(trajs, lcs, env, verdicts)


def test_evaluate_scores_and_tables(tmp_path):
    data = _evaluation_set()
    progrm = {t.episode_id: np.array(data.env_labels[t.episode_id].progress) for t in data.trajectories}
    orm = {t.episode_id: np.array([0.5, 0.5, 0.9]) for t in data.trajectories}
    m_progrm = evaluate_scores("progrm_env", progrm, data, threshold=0.75)
    m_orm = evaluate_scores("orm", orm, data, threshold=0.75)
    assert m_progrm["accuracy"] == 100 and m_progrm["key_step_progress_error"] == 0
    assert m_orm["accuracy"] == pytest.approx(100 * 4 / 6) and m_orm["key_step_progress_error"] > 0
    assert m_progrm["mean_final_step_score"] == pytest.approx(
        np.mean([1.0 if t.success else 0.5 for t in data.trajectories])
    )
    assert m_progrm["human_labelled_steps"] == 6 and m_progrm["labelled_steps"] == 18
    table = markdown_table({"orm": m_orm, "progrm_env": m_progrm}, (("accuracy", "Acc"),), ["orm", "progrm_env"])
    assert "| ORM | 66.667 |" in table.replace("66.67", "66.667") or "| ORM |" in table
    assert "| ProgRM-Env | 100 |" in table
    curves = plot_progress_curves(data.trajectories[:4], {"progrm_env": progrm, "orm": orm}, data, tmp_path / "c.png")
    calib = plot_calibration({"progrm_env": progrm, "orm": orm}, data, tmp_path / "k.png")
    assert curves.stat().st_size > 10_000 and calib.stat().st_size > 10_000
    assert curves.read_bytes()[:4] == b"\x89PNG"


def test_mcnemar_exact_p_is_the_two_sided_binomial_test():
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(7, 7) == 1.0
    assert mcnemar_exact_p(10, 0) == pytest.approx(2 / 2**10) == mcnemar_exact_p(0, 10)
    assert mcnemar_exact_p(3, 1) == pytest.approx(2 * (1 + 4) / 16)
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for wins, losses in ((3, 17), (60, 45), (250, 198), (1, 2)):
        assert mcnemar_exact_p(wins, losses) == pytest.approx(binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-9)


def test_paired_success_comparison_counts_discordant_trajectories():
    success = [True, True, False, False, True]
    model = [0.9, 0.8, 0.2, 0.7, 0.3]  # threshold 0.5: right, right, right, wrong, wrong
    orm = [0.4, 0.9, 0.6, 0.1, 0.2]  # threshold 0.3: right, right, wrong, right, wrong
    paired = paired_success_comparison(model, 0.5, orm, 0.3, success)
    assert (paired["wins"], paired["losses"]) == (1, 1)  # trajectory 2 vs trajectory 3
    assert paired["accuracy_gain"] == 0.0 and paired["mcnemar_p"] == 1.0
    table = markdown_table(
        {"progrm_env": {"mcnemar_p_vs_orm": 2e-9, "accuracy_gain_vs_orm": -5.12}}, PAIRED_COLUMNS, ["progrm_env"]
    )
    assert "| ProgRM-Env | -5.120 | – | – | <0.001 |" in table
    better = paired_success_comparison([0.9, 0.9, 0.1, 0.1, 0.9], 0.5, orm, 0.5, success)
    assert (better["wins"], better["losses"]) == (3, 0) and better["accuracy_gain"] == pytest.approx(60.0)


def test_latest_models_passes_over_models_this_encoder_cannot_load(trained_progrm, tmp_path):
    """A model trained on another encoder's embeddings (before the batch-invariant encoder, or
    another torch) is skipped for the newest one that loads; with none left, its kind is untrained."""
    import json
    import shutil
    from datetime import UTC, datetime

    import pyarrow as pa

    from training.base.registry import latest_models, stale_encoder_reason
    from training.reward_models.models import RewardScorer
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.tables_training import MODELS

    stale = tmp_path / "stale"
    shutil.copytree(trained_progrm, stale)
    config_file = stale / "reward_model_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({k: v for k, v in config.items() if k != "encoder_fingerprint"}))
    assert stale_encoder_reason(trained_progrm) is None
    assert "encoder unrecorded" in (stale_encoder_reason(stale) or "")

    warehouse = Warehouse(tmp_path / "home")

    def publish(model_id: str, checkpoint, day: int) -> None:
        row = {
            "model_id": model_id,
            "kind": "progrm_env",
            "checkpoint_path": str(checkpoint),
            "created_at": datetime(2026, 1, day, tzinfo=UTC),
        }
        m = Materialization(asset="test_models")
        warehouse.publish(m, [warehouse.stage_table("models", model_id, pa.Table.from_pylist([row], schema=MODELS), m)])

    publish("stale-only", stale, 1)
    assert latest_models(warehouse, ["progrm_env"]) == []  # nothing this code can load: untrained
    publish("usable", trained_progrm, 2)
    publish("stale-newer", stale, 3)
    [found] = latest_models(warehouse, ["progrm_env", "orm"])
    assert found.model_id == "usable"
    RewardScorer.from_checkpoint(found.checkpoint_path)  # and it loads


def test_two_models_of_one_kind_are_reported_side_by_side(tiny_home, trained_orm, tmp_path):
    """Issue 41 item 7: ``compare_models`` puts a further model of a kind beside the latest one, each
    its own row keyed by model id; the checks still read one model per kind, the latest."""
    import shutil
    from datetime import UTC, datetime

    import pyarrow as pa

    from training.reward_models.runs import ReportSettings, latest_report_metrics, run_evaluation_report
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.tables_training import MODELS

    home = tmp_path / "home"
    shutil.copytree(tiny_home, home)
    warehouse = Warehouse(home)
    for model_id, day in (("orm-demonstrations", 1), ("orm-round-1", 2)):
        row = {"model_id": model_id, "kind": "orm", "checkpoint_path": str(trained_orm)}
        row |= {"created_at": datetime(2026, 1, day, tzinfo=UTC)}
        m = Materialization(asset="test_models")
        warehouse.publish(m, [warehouse.stage_table("models", model_id, pa.Table.from_pylist([row], schema=MODELS), m)])

    settings = ReportSettings(kinds=("orm",), latency_calls=2, threads=1, compare_models=("orm-demonstrations",))
    metadata = run_evaluation_report(warehouse, settings, run_id="report-1", log=lambda _: None)
    rows = warehouse.query("SELECT model_id, kind, metric, value FROM rm_metrics WHERE split = 'test'").to_pylist()
    accuracy = {r["model_id"]: r["value"] for r in rows if r["metric"] == "accuracy"}
    assert set(accuracy) == {"orm-demonstrations", "orm-round-1"} and {r["kind"] for r in rows} == {"orm"}
    assert accuracy["orm-demonstrations"] == accuracy["orm-round-1"]  # one checkpoint: the same figures
    report = str(metadata["report"])
    assert "| ORM |" in report and "| ORM (orm-demonstrations) |" in report  # the latest first, then the other
    assert "orm@" not in report  # keys are for rows and metadata; every table names a model one way
    assert metadata["thresholds"].keys() == {"orm", "orm@orm-demonstrations"}
    # the checks read the model of record only (the latest of the kind)
    assert {r["model_id"] for r in latest_report_metrics(warehouse)} == {"orm-round-1"}
    unknown = ReportSettings(kinds=("orm",), latency_calls=2, threads=1, compare_models=("orm-nowhere",))
    with pytest.raises(LookupError, match="orm-nowhere"):
        run_evaluation_report(warehouse, unknown, run_id="report-2", log=lambda _: None)


def _reference_roc_auc(s: np.ndarray, y: np.ndarray) -> float:
    """The rank-sum AUC as it was first written (a Python loop over runs of tied scores)."""
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_the_fast_aucs_and_their_bootstraps_give_the_reference_bits():
    """The AUC by pair counting, the draws by ``integers`` and the bootstrap built on them give the
    bits of the rank-sum AUC over ``rng.choice`` draws, so reports made before stay the same."""
    from warehouse.statistics import bootstrap_auc, percentile_interval, within_group_auc

    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(2, 60))
        s = [rng.random(n), np.round(rng.random(n), 1), rng.integers(0, 3, n).astype(float)][trial % 3]
        y = rng.random(n) < rng.random()
        assert roc_auc(s, y) == _reference_roc_auc(s, y) or np.isnan(_reference_roc_auc(s, y))
    s, y = np.round(rng.random(50), 1), rng.random(50) < 0.4
    pos, neg = np.sort(s[y]), np.sort(s[~y])
    draw = np.random.default_rng(0)
    labels = np.r_[np.ones(len(pos), bool), np.zeros(len(neg), bool)]
    draws = [
        _reference_roc_auc(np.r_[draw.choice(pos, len(pos)), draw.choice(neg, len(neg))], labels) for _ in range(200)
    ]
    assert bootstrap_auc(s, y, resamples=200, seed=0) == (_reference_roc_auc(s, y), *percentile_interval(draws, 0.95))
    groups = np.array(["a", "b", "c"])[rng.integers(0, 3, 50)]
    auc, low, high = bootstrap_auc(s, y, groups=groups, resamples=200)
    assert auc == within_group_auc(s, y, groups) and low <= auc <= high


def test_scorers_of_one_encoder_share_it_and_its_cache_and_score_the_same(trained_orm, trained_progrm, tiny_home):
    """A report loads every kind with one MiniLM and one segment cache: the second model encodes
    nothing the first has encoded, and every score has the bits of a scorer loaded on its own."""
    from training.reward_models.evaluate import trajectory_states
    from training.reward_models.models import RewardScorer, SharedSegmentEncoders
    from training.reward_models.readers import read_trajectories
    from warehouse.catalog import Warehouse

    warehouse = Warehouse(tiny_home)
    ids = warehouse.query("SELECT episode_id FROM episodes ORDER BY episode_id LIMIT 6").column(0).to_pylist()
    trajectories = list(read_trajectories(warehouse, ids).values())
    states = [state for t in trajectories for state in trajectory_states("progrm_lcs", t)]
    shared = SharedSegmentEncoders()
    orm = RewardScorer.from_checkpoint(trained_orm, shared=shared)
    progrm = RewardScorer.from_checkpoint(trained_progrm, shared=shared)
    assert progrm.encoder is orm.encoder and progrm.cache is orm.cache and len(shared.by_encoder) == 1
    orm_scores = orm.score_states(states)
    encoded = orm.cache.misses
    progrm_scores = progrm.score_states(states)
    assert orm.cache.misses == encoded > 0  # the ProgRM model found every segment encoded
    assert np.array_equal(orm_scores, RewardScorer.from_checkpoint(trained_orm).score_states(states))
    assert np.array_equal(progrm_scores, RewardScorer.from_checkpoint(trained_progrm).score_states(states))
    # the report times each kind's single calls on a cache of its own (no segments another kind's
    # scoring encoded), with the same model and encoder, hence the same scores
    timed = progrm.with_own_cache()
    assert timed.model is progrm.model and timed.encoder is progrm.encoder
    assert timed.cache is not progrm.cache and len(timed.cache) == 0
    assert np.array_equal(timed.score_states(states), progrm_scores)
