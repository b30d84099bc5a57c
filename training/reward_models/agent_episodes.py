"""Reward models judged on the agent's own episodes: the metric every learned reward lives by.

A reward model is only as useful to RL and to best-of-N as its ranking of the *policy's* episodes:
a model that scores a policy's successes above its failures gives a usable signal, one at AUC 0.5
gives noise however well it does on held-out demonstrations. This module measures exactly that
on **held-out agent episodes**: the greedy episodes that evaluate SFT and RL checkpoints
(``episodes.purpose = 'evaluation'``, held-out and selection seeds; not the SFT policy's sampled
selection episodes, which repeat the long tasks' instances). No training table holds them
(``warehouse.purposes``), so no model has seen these episodes or their task instances.

Each model gives an episode one score (:func:`episode_score`), and the AUC of those scores against
the environment's success (Mann-Whitney, :func:`warehouse.statistics.roc_auc`) is
reported per task family and overall, with a stratified bootstrap interval
(:func:`bootstrap_auc`), seeded, so the same episodes and models give the same figures; and over
all episodes within their own task (:data:`WITHIN_TASK`), which a pooled AUC can overstate by
ranking easy tasks above hard ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from annotation.progress.key_steps import milestone_progress
from annotation.progress.labeling import milestone_hits
from envs.task_catalog import load_catalog
from training.base.registry import key_kind
from training.base.states import TextTrajectory
from training.reward_models.evaluate import predict_trajectories
from training.reward_models.examples import EpisodeLabels
from training.reward_models.kinds import PROGRESS_KINDS, STEP_JUDGE_KINDS, model_names
from training.reward_models.metrics import key_step_progress_error
from warehouse.catalog import Warehouse
from warehouse.plotting import Markdown, figure_markdown, pyplot
from warehouse.purposes import EpisodePurpose, greedy_evaluation_filter, purpose_filter
from warehouse.statistics import bootstrap_auc
from warehouse.tables_training import RM_AGENT_AUC
from warehouse.trajectories import load_trajectories

#: The episodes judged: greedy evaluation episodes of trained policies (never trained on).
AGENT_EPISODE_SET = "agent_evaluation"
ALL_FAMILIES = "all"
#: The episodes of checkpoints that gave no training data either (no policy rollout of theirs).
UNSEEN_CHECKPOINTS = "all:unseen_checkpoints"
#: All episodes again, ranked only against episodes of their own task (:func:`within_group_auc`).
WITHIN_TASK = "all:within_task"
#: The episodes of one task (``task:<task_id>``), where the task has both outcomes: the per-task
#: figures behind the within-task AUC (issue 41 item 2), so a task the model inverts is named.
TASK_PREFIX = "task:"


def episode_score(kind: str, step_scores: Sequence[float] | np.ndarray) -> float:
    """One score per episode from a model's per-step scores.

    Step judges (``prm``, ``guidnav``: P(step correct), GUI-Shepherd Eq. 5) score an episode by its
    weakest step, the aggregate Math-Shepherd uses for a solution; the ORM (P(success) of a state,
    ProgRM §3's baseline) and the ProgRM models (predicted progress, ProgRM Eq. 1) by the last
    step, where the episode's outcome is decided."""
    scores = np.asarray(step_scores, dtype=np.float64)
    if scores.size == 0:
        raise ValueError("an episode without steps has no score")
    return float(scores.min() if kind in STEP_JUDGE_KINDS else scores[-1])


@dataclass(frozen=True)
class AgentEpisode:
    episode_id: str
    task_id: str
    family: str
    policy_id: str
    success: bool
    checkpoint_seen: bool = False  # the checkpoint's own rollouts are training data (the flywheel's)
    milestones: EpisodeLabels | None = None  # environment-milestone progress, where it reached one


def milestone_labels(
    task_id: str, milestones_hit: Sequence[Sequence[str] | None], label_version: str = "env-online"
) -> EpisodeLabels | None:
    """ProgRM_Env's labels of an agent episode from the milestones it reached (§2.2: a key step
    reaches a new milestone, progress rises evenly), computed here because evaluation episodes are
    never labelled by the labels stage; None when the task has no spec or no milestone was reached.
    ``label_version`` names where the milestones came from: ``env-online`` (recorded) or ``env-replayed``."""
    task = load_catalog("miniwob").get(task_id)
    if task is None or not task.spec.milestones:
        return None
    progress, is_key = milestone_progress(
        [hits or () for hits in milestones_hit], [m.name for m in task.spec.milestones]
    )
    if not is_key.any():
        return None
    return EpisodeLabels(tuple(progress.tolist()), tuple(is_key.tolist()), label_version)


def read_agent_episodes(warehouse: Warehouse) -> list[AgentEpisode]:
    """The held-out agent episodes (see the module docstring), in episode order. An evaluation
    episode's ``policy_id`` is ``eval:<checkpoint>``; ``checkpoint_seen`` says whether that
    checkpoint also made policy rollouts (same policy, other seeds). Their milestone labels come
    from the milestones recorded online, replayed from the catalog's spec where the episode was
    recorded under another version of it (``annotation.progress.labeling.milestone_hits``)."""
    rows = warehouse.query(
        "SELECT episode_id, task_id, coalesce(task_family, 'unknown') AS family, policy_id, success, spec_digest, "
        "EXISTS (SELECT 1 FROM episodes r WHERE r.purpose = 'policy_rollout' "
        "AND 'eval:' || r.policy_id = e.policy_id) AS seen, "
        "(SELECT list(s.milestones_hit ORDER BY s.step_idx) FROM steps s WHERE s.episode_id = e.episode_id) AS hits "
        f"FROM episodes e WHERE {purpose_filter('e.purpose', (EpisodePurpose.EVALUATION.value,))} "
        f"AND {greedy_evaluation_filter('e.episode_id')} AND n_steps > 0 ORDER BY episode_id"
    ).to_pylist()
    replayed = _replayed_stale_hits(warehouse, rows)
    return [
        AgentEpisode(
            r["episode_id"],
            r["task_id"],
            r["family"],
            r["policy_id"] or "",
            r["success"],
            bool(r["seen"]),
            milestone_labels(r["task_id"], replayed[r["episode_id"]], "env-replayed")
            if r["episode_id"] in replayed
            else milestone_labels(r["task_id"], r["hits"] or []),
        )
        for r in rows
    ]


def _replayed_stale_hits(warehouse: Warehouse, rows: Sequence[Mapping]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Episode id -> its milestones replayed from the catalog's spec, for the rows recorded under
    another version of that spec (read with their screens; the others are not read again)."""
    catalog = load_catalog("miniwob")
    stale = [
        r["episode_id"]
        for r in rows
        if r["task_id"] in catalog and catalog[r["task_id"]].spec.is_other_version(r["spec_digest"])
    ]
    if not stale:
        return {}
    replayed = {}
    for trajectory in load_trajectories(warehouse, "e.episode_id IN (SELECT unnest(?))", [stale]):
        hits = milestone_hits(trajectory, catalog[trajectory.task_id].spec)
        if hits is not None:
            replayed[trajectory.episode_id] = hits
    return replayed


def auc_rows(
    model_id: str, kind: str, episodes: Sequence[AgentEpisode], scores: Mapping[str, np.ndarray], run_id: str | None
) -> list[dict]:
    """``rm_agent_auc`` rows of one model: per family of the scored episodes, then over all of them."""
    scored = [e for e in episodes if e.episode_id in scores and len(scores[e.episode_id])]
    groups: dict[str, list[AgentEpisode]] = {}
    for e in scored:
        groups.setdefault(e.family, []).append(e)
    groups[ALL_FAMILIES] = scored
    if any(e.checkpoint_seen for e in scored):  # only then does the subset differ from "all"
        groups[UNSEEN_CHECKPOINTS] = [e for e in scored if not e.checkpoint_seen]
    if len({e.task_id for e in scored}) > 1:  # with one task it is the "all" row again
        groups[WITHIN_TASK] = scored
        for task in sorted({e.task_id for e in scored}):
            members = [e for e in scored if e.task_id == task]
            if len({e.success for e in members}) == 2:  # a task of one outcome has no AUC
                groups[TASK_PREFIX + task] = members
    created = datetime.now(UTC)
    rows = []
    for family, members in sorted(groups.items(), key=lambda kv: (_family_rank(kv[0]), kv[0])):
        if not members:
            continue
        values = [episode_score(kind, scores[e.episode_id]) for e in members]
        success = [e.success for e in members]
        within = family == WITHIN_TASK
        auc, low, high = bootstrap_auc(values, success, groups=[e.task_id for e in members] if within else None)
        # ProgRM Table 3 on agent episodes: progress kinds only, steps that reached a new milestone
        labelled = {e.episode_id: e.milestones for e in members if e.milestones is not None}
        key = key_step_progress_error(scores, labelled) if kind in PROGRESS_KINDS and not within else {}
        rows.append(
            {
                "model_id": model_id,
                "kind": kind,
                "episode_set": AGENT_EPISODE_SET,
                "family": family,
                "episodes": len(members),
                "successes": int(sum(success)),
                "policies": len({e.policy_id for e in members}),
                "auc": auc,
                "auc_low": low,
                "auc_high": high,
                "key_step_error": key.get("key_step_progress_error"),
                "key_steps": key.get("key_steps"),
                "score_rule": "min over steps" if kind in STEP_JUDGE_KINDS else "last step",
                "report_run_id": run_id,
                "created_at": created,
            }
        )
    return rows


def _family_rank(family: str) -> int:
    """Rows in order: task families, then single tasks, then the rows over all episodes."""
    return 2 if family.startswith(ALL_FAMILIES) else 1 if family.startswith(TASK_PREFIX) else 0


@dataclass
class AgentEpisodeReport:
    rows: pa.Table
    markdown: str
    plot: Markdown | None
    task_plot: Markdown | None = None  # the per-task AUCs (:func:`per_task_auc_plot`)


def agent_episode_report(
    warehouse: Warehouse,
    scorers: Mapping[str, tuple[str, object]],
    trajectories: Mapping[str, TextTrajectory],
    episodes: Sequence[AgentEpisode],
    *,
    plot_path: Path,
    run_id: str | None,
) -> AgentEpisodeReport:
    """Score ``episodes`` with each model (``scorers``: report key (:func:`report_keys`) -> (model
    id, scorer)) and build the ``rm_agent_auc`` rows, a markdown table and a plot of AUC with
    intervals per model and family."""
    ordered = [trajectories[e.episode_id] for e in episodes if e.episode_id in trajectories]
    rows: list[dict] = []
    for key, (model_id, scorer) in scorers.items():
        rows += auc_rows(model_id, key_kind(key), episodes, predict_trajectories(scorer, ordered), run_id)
    table = pa.Table.from_pylist(rows, schema=RM_AGENT_AUC)
    per_task = any(r["family"].startswith(TASK_PREFIX) for r in rows)
    return AgentEpisodeReport(
        table,
        auc_markdown(rows),
        auc_plot(rows, plot_path) if rows else None,
        per_task_auc_plot(rows, plot_path.with_name(f"{plot_path.stem}_per_task.png")) if per_task else None,
    )


def _fmt(row: Mapping) -> str:
    if row["auc"] is None or np.isnan(row["auc"]):
        return "n/a (one class)"
    return f"{row['auc']:.2f} [{row['auc_low']:.2f}, {row['auc_high']:.2f}]"


def auc_markdown(rows: Sequence[Mapping]) -> str:
    """One line per model, one column per family (AUC [95% interval]), episodes counted."""
    if not rows:
        return "No held-out agent episodes (materialize `policy_sft` / `agent_evaluation` first)."
    overall = [f for f in (ALL_FAMILIES, UNSEEN_CHECKPOINTS, WITHIN_TASK) if any(r["family"] == f for r in rows)]
    tasks = sorted({r["family"] for r in rows if r["family"].startswith(TASK_PREFIX)})
    families = sorted({r["family"] for r in rows} - set(overall) - set(tasks)) + overall
    counts = {r["family"]: f"{r['episodes']} ({r['successes']} ok)" for r in rows}
    lines = [
        "| model | score | " + " | ".join(families) + " |",
        "|---|---|" + "---:|" * len(families),
        "| episodes | | " + " | ".join(counts.get(f, "") for f in families) + " |",
    ]
    by_kind: dict[str, dict[str, Mapping]] = {}  # by model, as the report names it (model_names)
    labels = model_names(rows)
    for r in rows:
        by_kind.setdefault(labels[r["model_id"]], {})[r["family"]] = r
    for kind, fams in by_kind.items():
        rule = next(iter(fams.values()))["score_rule"]
        lines.append(f"| {kind} | {rule} | " + " | ".join(_fmt(fams[f]) if f in fams else "" for f in families) + " |")
    errors = [
        f"{labels[r['model_id']]} {r['key_step_error']:.3f} ({r['key_steps']} key steps)"
        for r in rows
        if r["family"] == ALL_FAMILIES and r.get("key_step_error") is not None and not np.isnan(r["key_step_error"])
    ]
    if errors:
        lines.append("\nKey-step progress error on agent episodes that reached a milestone: " + "; ".join(errors) + ".")
    if tasks:
        lines += [
            "",
            "Per task (tasks with both outcomes; AUC [95% interval]):",
            "",
            "| task | episodes | " + " | ".join(by_kind) + " |",
            "|---|---:|" + "---:|" * len(by_kind),
        ]
        for task in tasks:
            lines.append(
                f"| {task.removeprefix(TASK_PREFIX)} | {counts[task]} | "
                + " | ".join(_fmt(fams[task]) if task in fams else "" for fams in by_kind.values())
                + " |"
            )
    return "\n".join(lines)


def per_task_auc_plot(rows: Sequence[Mapping], path: Path) -> Markdown:
    """Each model's AUC on each task's held-out agent episodes (tasks with both outcomes), with
    its interval: where a pooled or within-task figure comes from, and which task a model inverts."""
    plt = pyplot()
    tasks = sorted({r["family"] for r in rows if r["family"].startswith(TASK_PREFIX)})
    labels = model_names(rows)
    models = list(dict.fromkeys(r["model_id"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.32 * len(tasks)))
    height = 0.8 / max(1, len(models))
    for k, model in enumerate(models):
        found = {r["family"]: r for r in rows if r["model_id"] == model and r["family"] in tasks}
        ys, auc, low, high = [], [], [], []
        for i, task in enumerate(tasks):
            r = found.get(task)
            if r is None or r["auc"] is None or np.isnan(r["auc"]):
                continue
            ys.append(i - 0.4 + height * (k + 0.5))
            auc.append(r["auc"])
            low.append(r["auc"] - r["auc_low"])
            high.append(r["auc_high"] - r["auc"])
        ax.errorbar(auc, ys, xerr=[low, high], fmt="o", markersize=4, capsize=2, linewidth=1, label=labels[model])
    ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(np.arange(len(tasks)), [t.removeprefix(TASK_PREFIX) for t in tasks])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("AUC, episode score vs success, within the task (95% bootstrap)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    return figure_markdown(fig, path, "reward models per task on held-out agent episodes")


def auc_plot(rows: Sequence[Mapping], path: Path) -> Markdown:
    """AUC against success per model (overall, with its interval), chance marked."""
    plt = pyplot()
    overall = [r for r in rows if r["family"] == ALL_FAMILIES and r["auc"] is not None and not np.isnan(r["auc"])]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = np.arange(len(overall))
    auc = np.array([r["auc"] for r in overall])
    err = np.array([[r["auc"] - r["auc_low"] for r in overall], [r["auc_high"] - r["auc"] for r in overall]])
    ax.bar(x, auc, yerr=err if len(overall) else None, capsize=4, color="#4c72b0")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance")
    labels = model_names(rows)
    ax.set_xticks(x, [labels[r["model_id"]] for r in overall])
    ax.set_ylim(0, 1)
    ax.set_ylabel("AUC, episode score vs success")
    n = overall[0]["episodes"] if overall else 0
    ax.set_title(f"Reward models on {n} held-out agent episodes (95% bootstrap)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return figure_markdown(fig, path, "reward models on held-out agent episodes")
