"""Reward-model metrics as the papers report them (pure functions of scores and labels).

* Success judgement at the final step (ProgRM Table 2): the score of a trajectory's final state,
  thresholded, against the environment's outcome: TP, FN, TN, FP (as % of trajectories, like the
  paper, and as counts), precision, recall, accuracy. The threshold of each model is chosen on the
  validation split (the accuracy-maximising cut; 0.5 when there is no validation data).
* Key-step progress error (Table 3): the mean absolute error between predicted progress and the
  milestone ground truth at the steps where the environment's milestones are reached (progress
  split evenly among milestones, §3.3).
* Average final-step score (Table 3) and latency per call (Table 3, one state per call).
* Step judges (GUI-Shepherd PRM, GuidNav): accuracy, precision, recall and ROC AUC of step
  scores against positive/negative step labels (human where present, else derived).
* Calibration: reliability bins and expected calibration error.
* Each model's success judgement paired with the ORM's on the same trajectories: the trajectories
  only one of them judges right, and McNemar's exact test of whether the accuracy difference is
  more than chance.

A model's scores on a split, the report built from them and its plots:
:mod:`training.reward_models.evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from training.reward_models.examples import EpisodeLabels
from warehouse.statistics import mcnemar_exact_p, roc_auc


def _safe_div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def success_judgement(
    final_scores: Sequence[float] | np.ndarray, success: Sequence[bool] | np.ndarray, threshold: float = 0.5
) -> dict[str, float]:
    """ProgRM Table 2: predicted success = final-step score >= threshold, against the outcome.

    Returns counts (``tp``...), shares of all trajectories in % (``tp_pct``..., as the paper
    prints them), precision, recall and accuracy in %.
    """
    scores = np.asarray(final_scores, dtype=np.float64)
    truth = np.asarray(success, dtype=bool)
    predicted = scores >= threshold
    tp = int(np.sum(predicted & truth))
    fn = int(np.sum(~predicted & truth))
    tn = int(np.sum(~predicted & ~truth))
    fp = int(np.sum(predicted & ~truth))
    n = len(truth)
    return {
        "tp": tp,
        "fn": fn,
        "tn": tn,
        "fp": fp,
        "n_trajectories": n,
        "tp_pct": 100 * _safe_div(tp, n),
        "fn_pct": 100 * _safe_div(fn, n),
        "tn_pct": 100 * _safe_div(tn, n),
        "fp_pct": 100 * _safe_div(fp, n),
        "precision": 100 * _safe_div(tp, tp + fp),
        "recall": 100 * _safe_div(tp, tp + fn),
        "accuracy": 100 * _safe_div(tp + tn, n),
        "threshold": float(threshold),
    }


def choose_threshold(final_scores: Sequence[float] | np.ndarray, success: Sequence[bool] | np.ndarray) -> float:
    """The cut maximising success-judgement accuracy (midpoints between sorted scores; ties go
    to the cut nearest 0.5). 0.5 without data or without both outcomes."""
    scores = np.asarray(final_scores, dtype=np.float64)
    truth = np.asarray(success, dtype=bool)
    if scores.size == 0 or truth.all() or (~truth).all():
        return 0.5
    unique = np.unique(scores)
    cuts = np.concatenate([[unique[0] - 1e-9], (unique[:-1] + unique[1:]) / 2, [unique[-1] + 1e-9]])
    accuracy = np.array([np.mean((scores >= c) == truth) for c in cuts])
    best = np.flatnonzero(accuracy >= accuracy.max() - 1e-12)
    return float(cuts[best[np.argmin(np.abs(cuts[best] - 0.5))]])


def paired_success_comparison(
    final_scores: Sequence[float] | np.ndarray,
    threshold: float,
    baseline_scores: Sequence[float] | np.ndarray,
    baseline_threshold: float,
    success: Sequence[bool] | np.ndarray,
) -> dict[str, float]:
    """A model's success judgement (Table 2) against a baseline's on the same trajectories: the
    accuracy difference in points, the trajectories only the model judges right (``wins``) and only
    the baseline does (``losses``), and McNemar's exact p-value: whether the difference is more
    than the luck of which trajectories were held out."""
    truth = np.asarray(success, dtype=bool)
    right = (np.asarray(final_scores, dtype=np.float64) >= threshold) == truth
    baseline_right = (np.asarray(baseline_scores, dtype=np.float64) >= baseline_threshold) == truth
    wins, losses = int(np.sum(right & ~baseline_right)), int(np.sum(~right & baseline_right))
    return {
        "accuracy_gain": 100 * _safe_div(wins - losses, len(truth)),
        "wins": wins,
        "losses": losses,
        "mcnemar_p": mcnemar_exact_p(wins, losses),
    }


def key_step_progress_error(
    scores: Mapping[str, np.ndarray], milestone_labels: Mapping[str, EpisodeLabels]
) -> dict[str, float]:
    """ProgRM Table 3, key-step progress error: mean |p̂_t - p*_t| over the steps where a new
    milestone is reached (``is_key_step`` of the environment labels)."""
    errors = []
    for episode_id, labels in milestone_labels.items():
        predicted = scores.get(episode_id)
        if predicted is None or len(predicted) != len(labels.progress):
            continue
        key = np.asarray(labels.is_key_step, dtype=bool)
        errors.extend(np.abs(predicted[key] - np.asarray(labels.progress)[key]).tolist())
    arr = np.asarray(errors)
    return {
        "key_step_progress_error": float(arr.mean()) if arr.size else float("nan"),
        "key_steps": int(arr.size),
    }


def all_step_progress_error(scores: Mapping[str, np.ndarray], labels: Mapping[str, EpisodeLabels]) -> float:
    """Mean |p̂_t - p*_t| over every step that has a label (a broader companion of the key-step error)."""
    errors = [
        np.abs(scores[e] - np.asarray(lab.progress))
        for e, lab in labels.items()
        if e in scores and len(scores[e]) == len(lab.progress)
    ]
    return float(np.concatenate(errors).mean()) if errors else float("nan")


def step_judgement(
    scores: Sequence[float] | np.ndarray, positive: Sequence[bool] | np.ndarray, threshold: float = 0.5
) -> dict[str, float]:
    """Step-correctness metrics of a step judge (GUI-Shepherd style): accuracy, precision,
    recall (of positives), negative recall, ROC AUC; in % except AUC."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive, dtype=bool)
    p = s >= threshold
    tp, fp = int(np.sum(p & y)), int(np.sum(p & ~y))
    tn, fn = int(np.sum(~p & ~y)), int(np.sum(~p & y))
    return {
        "step_accuracy": 100 * _safe_div(tp + tn, len(y)),
        "step_precision": 100 * _safe_div(tp, tp + fp),
        "step_recall": 100 * _safe_div(tp, tp + fn),
        "step_negative_recall": 100 * _safe_div(tn, tn + fp),
        "step_auc": roc_auc(s, y),
        "labelled_steps": int(len(y)),
        "positive_share": 100 * _safe_div(int(y.sum()), len(y)),
    }


@dataclass(frozen=True)
class CalibrationBins:
    edges: np.ndarray
    mean_predicted: np.ndarray
    mean_observed: np.ndarray
    counts: np.ndarray

    @property
    def ece(self) -> float:
        """Expected calibration error: count-weighted mean |predicted - observed| over bins."""
        used = self.counts > 0
        if not used.any():
            return float("nan")
        gaps = np.abs(self.mean_predicted[used] - self.mean_observed[used])
        return float(np.sum(gaps * self.counts[used]) / self.counts[used].sum())


def calibration_bins(
    predicted: Sequence[float] | np.ndarray, observed: Sequence[float] | np.ndarray, n_bins: int = 10
) -> CalibrationBins:
    """Reliability diagram data: equal-width bins of the prediction, mean prediction and mean
    target (a success rate or a mean progress label) per bin."""
    p = np.clip(np.asarray(predicted, dtype=np.float64), 0.0, 1.0)
    o = np.asarray(observed, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    which = np.minimum(np.digitize(p, edges[1:-1]), n_bins - 1)
    counts = np.bincount(which, minlength=n_bins)
    sum_p = np.bincount(which, weights=p, minlength=n_bins)
    sum_o = np.bincount(which, weights=o, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return CalibrationBins(edges, sum_p / counts, sum_o / counts, counts)
