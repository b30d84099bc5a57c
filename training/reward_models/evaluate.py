"""Reward models judged as the papers report them: each model's scores on the held-out
trajectories (:func:`predict_trajectories`, latency per call with :func:`measure_latency`), the
metrics of :mod:`training.reward_models.metrics` on them (:func:`evaluate_scores`), and the report
over every kind (:func:`run_report`: tables, paired comparisons with the ORM, plots to files with
matplotlib, Agg).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from training.base.registry import ModelRecord, key_kind, report_keys
from training.base.states import StepState, TextTrajectory
from training.reward_models.examples import EpisodeLabels
from training.reward_models.kinds import (
    DISPLAY_NAMES,
    SUCCESS_JUDGE_KINDS,
    RewardModelKind,
    Verdict,
    display_name,
    kind_spec,
    state_for,
)
from training.reward_models.labels import progress_gains
from training.reward_models.metrics import (
    all_step_progress_error,
    calibration_bins,
    choose_threshold,
    key_step_progress_error,
    paired_success_comparison,
    step_judgement,
    success_judgement,
)
from warehouse.plotting import integer_ticks
from warehouse.statistics import p_value_text

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pyarrow as pa

    from training.reward_models.models import SharedSegmentEncoders

# ---------------------------------------------------------------------------------------------
# Scoring trajectories
# ---------------------------------------------------------------------------------------------


def trajectory_states(kind: str, trajectory: TextTrajectory) -> list[StepState]:
    """The states a model of ``kind`` scores along a trajectory, one per step."""
    return [state_for(kind, trajectory, t) for t in range(len(trajectory))]


def predict_trajectories(
    scorer, trajectories: Sequence[TextTrajectory], *, chunk_states: int = 4096
) -> dict[str, np.ndarray]:
    """Per-step scores of every trajectory (episode_id -> array), scored in large batches."""
    result: dict[str, np.ndarray] = {}
    pending: list[tuple[str, int]] = []
    states: list[StepState] = []

    def flush() -> None:
        scores = scorer.score_states(states)
        start = 0
        for episode_id, n in pending:
            result[episode_id] = scores[start : start + n]
            start += n
        pending.clear()
        states.clear()

    for traj in trajectories:
        traj_states = trajectory_states(scorer.kind, traj)
        pending.append((traj.episode_id, len(traj_states)))
        states.extend(traj_states)
        if len(states) >= chunk_states:
            flush()
    if states:
        flush()
    return result


def measure_latency(scorer, states: Sequence[StepState], *, repeats: int = 1, warmup: int = 3) -> dict[str, float]:
    """Wall time of single-state calls (ms): p50, p95, mean; what an RL loop calling once per step
    sees. The first ``warmup`` calls (thread pools, lazy initialisation) are made but not timed."""
    for state in list(states)[:warmup]:
        scorer.score_states([state])
    states = list(states)[warmup:] or list(states)
    times = []
    for _ in range(repeats):
        for state in states:
            t0 = time.perf_counter()
            scorer.score_states([state])
            times.append((time.perf_counter() - t0) * 1000.0)
    arr = np.asarray(times) if times else np.zeros(1)
    return {
        "latency_ms_p50": float(np.percentile(arr, 50)),
        "latency_ms_p95": float(np.percentile(arr, 95)),
        "latency_ms_mean": float(arr.mean()),
        "latency_calls": len(times),
    }


# ---------------------------------------------------------------------------------------------
# One model on one split
# ---------------------------------------------------------------------------------------------


@dataclass
class EvaluationSet:
    """Held-out trajectories with everything they are judged against."""

    trajectories: list[TextTrajectory]
    lcs_labels: dict[str, EpisodeLabels]
    env_labels: dict[str, EpisodeLabels]
    verdicts: dict[str, list[tuple[Verdict, str]]]  # episode -> per step (verdict, source)

    def final_success(self) -> tuple[list[str], np.ndarray]:
        trajs = [t for t in self.trajectories if t.success is not None and len(t)]
        return [t.episode_id for t in trajs], np.array([bool(t.success) for t in trajs])


def evaluate_scores(
    kind: str,
    scores: Mapping[str, np.ndarray],
    data: EvaluationSet,
    *,
    threshold: float,
) -> dict[str, float]:
    """Every metric of one model's per-step scores on one split (see the module docstring)."""
    metrics: dict[str, float] = {}
    episode_ids, success = data.final_success()
    finals = np.array([scores[e][-1] for e in episode_ids if e in scores])
    if len(finals) == len(episode_ids) and len(finals):
        metrics.update(success_judgement(finals, success, threshold))
        metrics["mean_final_step_score"] = float(finals.mean())
        metrics["mean_final_step_score_success"] = float(finals[success].mean()) if success.any() else float("nan")
        metrics["mean_final_step_score_failure"] = float(finals[~success].mean()) if (~success).any() else float("nan")
        metrics["final_step_ece"] = calibration_bins(finals, success.astype(float)).ece
    if kind_spec(kind).scores_progress:
        metrics.update(key_step_progress_error(scores, data.env_labels))
        metrics["lcs_key_step_progress_error"] = key_step_progress_error(scores, data.lcs_labels)[
            "key_step_progress_error"
        ]
        metrics["all_step_progress_error_env"] = all_step_progress_error(scores, data.env_labels)
        metrics["all_step_progress_error_lcs"] = all_step_progress_error(scores, data.lcs_labels)
    # step-level judgement against positive/negative step labels (all kinds; the PRM's own metric)
    step_scores, step_positive, human = [], [], 0
    for episode_id, per_step in data.verdicts.items():
        s = scores.get(episode_id)
        if s is None or len(s) != len(per_step):
            continue
        for t, (verdict, source) in enumerate(per_step):
            if verdict in ("positive", "negative"):
                step_scores.append(s[t])
                step_positive.append(verdict == "positive")
                human += source == "human"
    if step_scores:
        metrics.update(step_judgement(step_scores, step_positive))
        metrics["human_labelled_steps"] = human
    return metrics


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

MODEL_COLOURS: dict[str, str] = {
    RewardModelKind.ORM.value: "#d62728",
    RewardModelKind.PROGRM_LCS.value: "#1f77b4",
    RewardModelKind.PROGRM_ENV.value: "#2ca02c",
    RewardModelKind.PRM.value: "#9467bd",
    RewardModelKind.GUIDNAV.value: "#8c564b",
}


def pick_sample_trajectories(
    data: EvaluationSet, n_success: int = 3, n_failure: int = 3, min_steps: int = 3
) -> list[TextTrajectory]:
    """Sample trajectories for the progress-curve plots (Figs. 5-6): successes and failures with
    partial progress, of several steps, from different tasks where possible; deterministic."""

    def partial(t: TextTrajectory) -> bool:
        labels = data.env_labels.get(t.episode_id) or data.lcs_labels.get(t.episode_id)
        return labels is not None and 0 < labels.progress[-1] < 1

    chosen: list[TextTrajectory] = []
    for want_success, count in ((True, n_success), (False, n_failure)):
        pool = sorted(
            (
                t
                for t in data.trajectories
                if t.success is want_success and len(t) >= min_steps and (want_success or partial(t))
            ),
            key=lambda t: (t.task_id, t.episode_id),
        )
        seen_tasks: set[str] = set()
        for t in pool:
            if t.task_id not in seen_tasks:
                chosen.append(t)
                seen_tasks.add(t.task_id)
            if len([c for c in chosen if c.success is want_success]) >= count:
                break
    return chosen


def plot_progress_curves(
    samples: Sequence[TextTrajectory],
    scores_by_kind: Mapping[str, Mapping[str, np.ndarray]],
    data: EvaluationSet,
    path: Path,
) -> Path:
    """Predicted progress per step next to the LCS and milestone labels (ProgRM Figs. 5-6)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, max(1, len(samples)))
    rows = max(1, math.ceil(len(samples) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, traj in zip(axes.flat, samples, strict=False):  # the grid may have spare axes
        x = np.arange(0, len(traj) + 1)  # 0 = Init (Fig. 5)
        for key, scores in scores_by_kind.items():
            if not kind_spec(key_kind(key)).scores_progress or traj.episode_id not in scores:
                continue
            ax.plot(
                x,
                np.concatenate([[0.0], scores[traj.episode_id]]),
                marker="o",
                ms=3,
                color=None if "@" in key else MODEL_COLOURS.get(key),
                label=display_name(key),
            )
        for labels, style, name in ((data.lcs_labels, ":", "LCS label"), (data.env_labels, "--", "milestone label")):
            lab = labels.get(traj.episode_id)
            if lab is not None:
                ax.step(
                    x,
                    np.concatenate([[0.0], lab.progress]),
                    where="post",
                    linestyle=style,
                    color="black",
                    alpha=0.7,
                    label=name,
                )
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks(x)
        ax.set_xticklabels(["Init"] + [str(i + 1) for i in range(len(traj))], fontsize=7)
        outcome = "success" if traj.success else "failure"
        ax.set_title(f"{traj.task_id} ({outcome})", fontsize=9)
        ax.set_xlabel("after action", fontsize=8)
        ax.set_ylabel("progress", fontsize=8)
    for ax in list(axes.flat)[len(samples) :]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(6, len(names)), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_training_curves(summary: Mapping, path: Path) -> Path:
    """Training and validation loss against optimizer steps from a training summary
    (``training.reward_models.train``), with the exported step marked: whether a model converged, and where
    early stopping picked its weights; and the validation episodes' within-task AUC where it was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = summary.get("kind", "")
    colour = MODEL_COLOURS.get(kind)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    train = np.asarray(summary.get("loss_curve") or [], dtype=np.float64).reshape(-1, 2)
    validation = np.asarray(summary.get("validation_loss_curve") or [], dtype=np.float64).reshape(-1, 2)
    if len(train):
        ax.plot(train[:, 0], train[:, 1], color=colour, alpha=0.45, linewidth=1, label="training loss")
    if len(validation):
        ax.plot(validation[:, 0], validation[:, 1], color=colour, marker="o", linewidth=1.8, label="validation loss")
    exported = summary.get("exported_step")
    if exported:
        ax.axvline(exported, color="grey", linestyle="--", linewidth=1, label=f"exported (step {exported})")
    stopped = "stopped early" if summary.get("stopped_early") else "ran its budget"
    ax.set_title(
        f"{DISPLAY_NAMES.get(kind, kind)}: {summary.get('global_steps', '?')} of "
        f"{summary.get('max_steps', '?')} steps, {stopped}",
        fontsize=10,
    )
    ax.set_xlabel("optimizer step")
    integer_ticks(ax)
    ax.set_ylabel("loss (BCE / MSE)")
    handles, labels = ax.get_legend_handles_labels()
    auc = np.asarray(summary.get("validation_within_task_auc_curve") or [], dtype=np.float64).reshape(-1, 2)
    if len(auc):  # what the checkpoint was selected by, on its own axis (issue 41 item 2)
        right = ax.twinx()
        (line,) = right.plot(auc[:, 0], auc[:, 1], color="black", marker="s", linewidth=1, label="within-task AUC")
        right.set_ylabel("validation within-task AUC")
        right.set_ylim(0.0, 1.0)
        handles, labels = handles + [line], labels + ["within-task AUC (validation episodes)"]
    ax.legend(handles, labels, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_calibration(
    scores_by_kind: Mapping[str, Mapping[str, np.ndarray]],
    data: EvaluationSet,
    path: Path,
) -> Path:
    """Reliability diagrams: final-step score vs success rate (left); per-step predicted
    progress vs the milestone progress label (right, progress models)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    episode_ids, success = data.final_success()
    for key, scores in scores_by_kind.items():
        kind = key_kind(key)
        colour, name = None if "@" in key else MODEL_COLOURS.get(kind), display_name(key)
        if all(e in scores for e in episode_ids) and episode_ids:
            finals = np.array([scores[e][-1] for e in episode_ids])
            bins = calibration_bins(finals, success.astype(float))
            used = bins.counts > 0
            left.plot(
                bins.mean_predicted[used],
                bins.mean_observed[used],
                marker="o",
                color=colour,
                label=f"{name} (ECE {bins.ece:.3f})",
            )
        if kind_spec(kind).scores_progress:
            pred, obs = [], []
            for e, lab in data.env_labels.items():
                if e in scores and len(scores[e]) == len(lab.progress):
                    pred.append(scores[e])
                    obs.append(np.asarray(lab.progress))
            if pred:
                bins = calibration_bins(np.concatenate(pred), np.concatenate(obs))
                used = bins.counts > 0
                right.plot(
                    bins.mean_predicted[used],
                    bins.mean_observed[used],
                    marker="o",
                    color=colour,
                    label=f"{name} (ECE {bins.ece:.3f})",
                )
    for ax, title, ylabel in (
        (left, "final step: score vs success rate", "observed success rate"),
        (right, "every step: progress vs milestone label", "mean milestone progress"),
    ):
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("mean predicted score")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# The comparison table
# ---------------------------------------------------------------------------------------------

TABLE2_COLUMNS = (
    ("tp_pct", "#TP ↑"),
    ("fn_pct", "#FN ↓"),
    ("tn_pct", "#TN ↑"),
    ("fp_pct", "#FP ↓"),
    ("precision", "Prec ↑"),
    ("recall", "Rec ↑"),
    ("accuracy", "Acc ↑"),
)
TABLE3_COLUMNS = (
    ("key_step_progress_error", "Key Step Prog. Err. ↓"),
    ("mean_final_step_score", "Avg. Fin. Score"),
    ("latency_ms_p50", "Latency p50 (ms) ↓"),
)
PAIRED_COLUMNS = (
    ("accuracy_gain_vs_orm", "Acc − ORM (points)"),
    ("wins_vs_orm", "only it right"),
    ("losses_vs_orm", "only ORM right"),
    ("mcnemar_p_vs_orm", "p (McNemar)"),
)
STEP_COLUMNS = (
    ("step_accuracy", "Step acc ↑"),
    ("step_auc", "AUC ↑"),
    ("step_precision", "Prec ↑"),
    ("step_recall", "Rec ↑"),
    ("step_negative_recall", "Neg. rec ↑"),
    ("labelled_steps", "steps"),
    ("human_labelled_steps", "human"),
)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 10):
        return f"{int(value)}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


def _fmt_metric(key: str, value) -> str:
    if key.startswith("mcnemar_p") and isinstance(value, float) and not math.isnan(value):
        return p_value_text(value)
    return _fmt(value)


def markdown_table(metrics_by_kind: Mapping[str, Mapping[str, float]], columns, kinds: Sequence[str]) -> str:
    head = "| RM | " + " | ".join(name for _, name in columns) + " |"
    sep = "|---|" + "---:|" * len(columns)
    lines = [head, sep]
    for kind in kinds:
        if kind in metrics_by_kind:
            m = metrics_by_kind[kind]
            lines.append(
                f"| {display_name(kind)} | " + " | ".join(_fmt_metric(key, m.get(key)) for key, _ in columns) + " |"
            )
    return "\n".join(lines)


def progress_gain_rewards(scores: Sequence[float], k: int = 1) -> np.ndarray:
    """Eq. 2 rewards from per-step progress scores (re-exported for report users)."""
    return progress_gains(scores, k)


# ---------------------------------------------------------------------------------------------
# The report: every current model on the held-out split (called by the report asset)
# ---------------------------------------------------------------------------------------------


@dataclass
class ReportResult:
    metrics: dict[str, dict[str, dict[str, float]]]  # kind -> split -> metric -> value
    predictions: pa.Table  # rm_predictions rows
    metric_rows: pa.Table  # rm_metrics rows
    markdown: str
    plots: dict[str, Path]
    thresholds: dict[str, float]
    n_trajectories: dict[str, int]


def load_evaluation_set(
    warehouse,
    split: str,
    *,
    lcs_method: str = "improved",
    derived_from: str = "lcs",
    max_trajectories: int | None = None,
) -> EvaluationSet:
    """Held-out trajectories of ``split`` with LCS and milestone labels and step verdicts;
    ``max_trajectories``: a fixed sample of them (by episode id hash), for a quick report."""
    from training.reward_models.examples import step_verdicts_for_export
    from training.reward_models.readers import read_human_verdicts, read_progress_labels, read_splits, read_trajectories

    splits = read_splits(warehouse)
    ids = [e for e, info in splits.items() if info.split == split]
    if max_trajectories is not None and len(ids) > max_trajectories:
        import hashlib

        ids = sorted(ids, key=lambda e: hashlib.sha256(e.encode()).hexdigest())[:max_trajectories]
    trajectories = read_trajectories(warehouse, ids)
    lcs = read_progress_labels(warehouse, "lcs", lcs_method)
    env = read_progress_labels(warehouse, "env")
    human, _ = read_human_verdicts(warehouse)
    derived_labels = lcs if derived_from == "lcs" else env
    derived_name = f"derived:{derived_from}" + (f":{lcs_method}" if derived_from == "lcs" else "")
    verdicts = step_verdicts_for_export(trajectories, derived_labels, human, derived_name)
    ordered = [trajectories[e] for e in sorted(trajectories) if len(trajectories[e])]
    keep = {t.episode_id for t in ordered}
    return EvaluationSet(
        trajectories=ordered,
        lcs_labels={e: v for e, v in lcs.items() if e in keep},
        env_labels={e: v for e, v in env.items() if e in keep},
        verdicts={e: v for e, v in verdicts.items() if e in keep},
    )


def prediction_rows(
    model: ModelRecord, split: str, scores: Mapping[str, np.ndarray], data: EvaluationSet, run_id: str | None
):
    """``rm_predictions`` rows for one model on one split."""
    import pyarrow as pa

    from warehouse.tables_training import RM_PREDICTIONS

    cols: dict[str, list] = {name: [] for name in RM_PREDICTIONS.names}
    for traj in data.trajectories:
        s = scores.get(traj.episode_id)
        if s is None:
            continue
        gains = progress_gains(s)
        lcs, env = data.lcs_labels.get(traj.episode_id), data.env_labels.get(traj.episode_id)
        verdicts = data.verdicts.get(traj.episode_id)
        for t in range(len(traj)):
            cols["model_id"].append(model.model_id)
            cols["kind"].append(model.kind)
            cols["episode_id"].append(traj.episode_id)
            cols["step_idx"].append(t)
            cols["split"].append(split)
            cols["task_id"].append(traj.task_id)
            cols["score"].append(float(s[t]))
            cols["progress_gain"].append(float(gains[t]) if kind_spec(model.kind).scores_progress else None)
            cols["is_final_step"].append(t == len(traj) - 1)
            cols["episode_success"].append(traj.success)
            cols["label_lcs"].append(lcs.progress[t] if lcs and len(lcs.progress) == len(traj) else None)
            cols["label_env"].append(env.progress[t] if env and len(env.progress) == len(traj) else None)
            cols["is_env_key_step"].append(env.is_key_step[t] if env and len(env.is_key_step) == len(traj) else None)
            cols["step_verdict"].append(verdicts[t][0] if verdicts and len(verdicts) == len(traj) else None)
            cols["report_run_id"].append(run_id)
    return pa.Table.from_pydict(cols, schema=RM_PREDICTIONS)


@dataclass
class _ModelScores:
    """One model's scores on the held-out and threshold splits, with its latency and batch time."""

    latency: dict[str, float]
    test: dict[str, np.ndarray]  # the held-out split
    tune: dict[str, np.ndarray]  # the threshold split (the same dict when it is the held-out one)
    batch_seconds: float  # scoring the held-out split in batches


def run_report(
    warehouse,
    models: Sequence[ModelRecord],
    *,
    plots_dir: Path,
    run_id: str | None = None,
    split: str = "test",
    threshold_split: str = "validation",
    latency_calls: int = 100,
    cache_home=None,
    log=None,
    max_trajectories: int | None = None,
    shared: SharedSegmentEncoders | None = None,
) -> ReportResult:
    """Score ``split`` (and ``threshold_split`` for the success thresholds) with every model,
    compute the metrics, draw the plots and build the ``rm_predictions`` / ``rm_metrics`` rows.
    ``cache_home``: a STEPWISE_HOME whose saved segment caches the scorers start from; ``shared``:
    the encoders and caches the models load on (a new one by default), for a caller scoring more
    with the same models."""
    import pyarrow as pa

    from training.reward_models.models import SharedSegmentEncoders
    from warehouse.tables_training import RM_METRICS

    say = log or (lambda msg: None)
    held_out, tuning = _load_report_sets(warehouse, split, threshold_split, max_trajectories)
    say(f"report: {len(held_out.trajectories)} {split} and {len(tuning.trajectories)} {threshold_split} trajectories")
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    scores_by_kind: dict[str, dict[str, np.ndarray]] = {}
    thresholds: dict[str, float] = {}
    prediction_tables = []
    keys = report_keys(models)
    shared = shared if shared is not None else SharedSegmentEncoders()
    for key, model in zip(keys, models, strict=True):
        # one MiniLM and one segment cache for every kind, warmed with the segments training
        # already encoded (frozen mode); single calls are timed on a cache of the model's own
        scorer = shared.load(model.checkpoint_path, cache_home)
        scores = _score_model(scorer, model.kind, held_out, tuning, latency_calls, cache_home)
        thresholds[key] = _success_threshold(scores.tune, tuning)
        metrics[key] = _model_metrics(
            model.kind, scores, held_out, tuning, thresholds[key], split=split, threshold_split=threshold_split
        )
        scores_by_kind[key] = scores.test
        prediction_tables.append(prediction_rows(model, split, scores.test, held_out, run_id))
        if tuning is not held_out:
            prediction_tables.append(prediction_rows(model, threshold_split, scores.tune, tuning, run_id))
        say(_model_progress_line(key, metrics[key][split], scores.latency))

    if "orm" in scores_by_kind:  # ProgRM Table 2's comparison, paired: same trajectories, same outcomes
        _add_orm_comparison(metrics, scores_by_kind, thresholds, held_out, split)
    metric_cols = _metric_columns(metrics, models, run_id)
    plots = _draw_report_plots(scores_by_kind, held_out, plots_dir)
    markdown = _report_markdown({k: v[split] for k, v in metrics.items()}, keys, split)
    predictions = pa.concat_tables(prediction_tables) if prediction_tables else None
    return ReportResult(
        metrics=metrics,
        predictions=predictions,
        metric_rows=pa.Table.from_pydict(metric_cols, schema=RM_METRICS),
        markdown=markdown,
        plots=plots,
        thresholds=thresholds,
        n_trajectories={split: len(held_out.trajectories), threshold_split: len(tuning.trajectories)},
    )


def _load_report_sets(
    warehouse, split: str, threshold_split: str, max_trajectories: int | None
) -> tuple[EvaluationSet, EvaluationSet]:
    """Load the held-out split and the threshold split (the same set when they are one split)."""
    held_out = load_evaluation_set(warehouse, split, max_trajectories=max_trajectories)
    tuning = (
        load_evaluation_set(warehouse, threshold_split, max_trajectories=max_trajectories)
        if threshold_split != split
        else held_out
    )
    return held_out, tuning


def _score_model(
    scorer, kind: str, held_out: EvaluationSet, tuning: EvaluationSet, latency_calls: int, cache_home=None
) -> _ModelScores:
    """Time the scorer one state per call, then score the held-out and threshold splits in batches."""
    # latency first: one state per call in trajectory order, as an RL loop calls it, on a cache
    # warmed from the home only (the shared one holds what other kinds' scoring encoded)
    latency_states = [s for t in held_out.trajectories for s in trajectory_states(kind, t)][:latency_calls]
    timed = scorer.with_own_cache(cache_home) if getattr(scorer, "cache", None) is not None else scorer
    latency = measure_latency(timed, latency_states)
    # the batch pass is timed from encoded segments: on one cache for every kind the first kind
    # would otherwise pay for every kind's encoding (each kind is timed on the same terms)
    if hasattr(scorer, "encode_segments"):
        scorer.encode_segments([s for t in held_out.trajectories for s in trajectory_states(scorer.kind, t)])
    t0 = time.perf_counter()
    test_scores = predict_trajectories(scorer, held_out.trajectories)
    batch_seconds = time.perf_counter() - t0
    tune_scores = predict_trajectories(scorer, tuning.trajectories) if tuning is not held_out else test_scores
    return _ModelScores(latency, test_scores, tune_scores, batch_seconds)


def _success_threshold(tune_scores: Mapping[str, np.ndarray], tuning: EvaluationSet) -> float:
    """The final-step score threshold chosen on the threshold split (0.5 without outcomes there)."""
    ids, success = tuning.final_success()
    return choose_threshold([tune_scores[e][-1] for e in ids], success) if ids else 0.5


def _model_metrics(
    kind: str,
    scores: _ModelScores,
    held_out: EvaluationSet,
    tuning: EvaluationSet,
    threshold: float,
    *,
    split: str,
    threshold_split: str,
) -> dict[str, dict[str, float]]:
    """One model's metrics by split: with latency and throughput on the held-out one, and at 0.5 there too."""
    n_steps = sum(len(t) for t in held_out.trajectories)
    metrics = {
        split: evaluate_scores(kind, scores.test, held_out, threshold=threshold)
        | scores.latency
        | {"batch_steps_per_second": n_steps / scores.batch_seconds if scores.batch_seconds else float("nan")},
        threshold_split: evaluate_scores(kind, scores.tune, tuning, threshold=threshold),
    }
    if threshold_split != split:
        metrics[f"{split}@0.5"] = success_judgement(
            [scores.test[e][-1] for e in held_out.final_success()[0]], held_out.final_success()[1], 0.5
        )
    return metrics


def _model_progress_line(kind: str, m: Mapping[str, float], latency: Mapping[str, float]) -> str:
    """The progress log line of one evaluated model: accuracy, key-step error and median latency."""
    return (
        f"report: {kind}: acc {m.get('accuracy', float('nan')):.2f}% key-step err "
        f"{m.get('key_step_progress_error', float('nan')):.3f} p50 {latency['latency_ms_p50']:.1f} ms"
    )


def _add_orm_comparison(
    metrics: dict[str, dict[str, dict[str, float]]],
    scores_by_kind: Mapping[str, Mapping[str, np.ndarray]],
    thresholds: Mapping[str, float],
    held_out: EvaluationSet,
    split: str,
) -> None:
    """Add each other model's success judgement paired with the ORM's to its held-out metrics."""
    ids, success = held_out.final_success()
    orm_finals = [scores_by_kind["orm"][e][-1] for e in ids]
    for kind in scores_by_kind.keys() - {"orm"}:
        paired = paired_success_comparison(
            [scores_by_kind[kind][e][-1] for e in ids], thresholds[kind], orm_finals, thresholds["orm"], success
        )
        metrics[kind][split].update({f"{name}_vs_orm": value for name, value in paired.items()})


def _metric_columns(
    metrics: Mapping[str, Mapping[str, Mapping[str, float]]], models: Sequence[ModelRecord], run_id: str | None
) -> dict[str, list]:
    """The ``rm_metrics`` columns: one row per model, split and metric."""
    from warehouse.tables_training import RM_METRICS

    metric_cols: dict[str, list] = {name: [] for name in RM_METRICS.names}
    model_ids = {key: m.model_id for key, m in zip(report_keys(models), models, strict=True)}
    for key, by_split in metrics.items():
        for split_name, values in by_split.items():
            for metric, value in values.items():
                metric_cols["model_id"].append(model_ids[key])
                metric_cols["kind"].append(key_kind(key))
                metric_cols["split"].append(split_name)
                metric_cols["metric"].append(metric)
                metric_cols["value"].append(float(value) if value is not None else None)
                metric_cols["report_run_id"].append(run_id)
    return metric_cols


def _draw_report_plots(
    scores_by_kind: Mapping[str, Mapping[str, np.ndarray]], held_out: EvaluationSet, plots_dir: Path
) -> dict[str, Path]:
    """Draw the sample progress curves and the calibration plot (none without models)."""
    plots: dict[str, Path] = {}
    if scores_by_kind:
        samples = pick_sample_trajectories(held_out)
        plots["progress_curves"] = plot_progress_curves(
            samples, scores_by_kind, held_out, plots_dir / "progress_curves.png"
        )
        plots["calibration"] = plot_calibration(scores_by_kind, held_out, plots_dir / "calibration.png")
    return plots


def _report_markdown(test_metrics: Mapping[str, Mapping[str, float]], kinds: list[str], split: str) -> str:
    """The report's Markdown tables of the held-out metrics (ProgRM Tables 2 and 3, paired, step
    judgement); ``kinds``: the models' :func:`report_keys`."""
    outcome_kinds = sorted(
        (k for k in kinds if key_kind(k) in SUCCESS_JUDGE_KINDS),
        key=lambda k: (SUCCESS_JUDGE_KINDS.index(key_kind(k)), kinds.index(k)),
    )
    judge_kinds = [k for k in kinds if key_kind(k) not in SUCCESS_JUDGE_KINDS]
    return (
        f"### Success judgement at the final step ({split}; ProgRM Table 2, % of trajectories)\n\n"
        + markdown_table(test_metrics, TABLE2_COLUMNS + (("threshold", "threshold"),), outcome_kinds + judge_kinds)
        + f"\n\n### Progress estimation and latency ({split}; ProgRM Table 3)\n\n"
        + markdown_table(
            test_metrics,
            TABLE3_COLUMNS + (("all_step_progress_error_env", "All-step err (env)"), ("final_step_ece", "ECE (final)")),
            outcome_kinds + judge_kinds,
        )
        + (
            f"\n\n### Success judgement paired with the ORM ({split}; McNemar's exact test)\n\n"
            + markdown_table(test_metrics, PAIRED_COLUMNS, [k for k in outcome_kinds + judge_kinds if k != "orm"])
            if "orm" in kinds and len(kinds) > 1
            else ""
        )
        + f"\n\n### Step judgement against step labels ({split})\n\n"
        + markdown_table(test_metrics, STEP_COLUMNS, kinds)
    )
