"""Flywheel rounds: what each round's reward models learned from, and how they judge the agent.

A round collects policy rollouts, labels them, retrains the reward models on the mix and runs the
reward-model report (``stepwise flywheel``; ``pipelines/flywheel.py`` runs the Dagster jobs). This
module records the round's outcome, one ``flywheel_rounds`` row per model kind, from the report
that just ran (``rm_agent_auc``, families ``all`` and ``all:within_task``) and the model rows
(``models.training_mix``), and plots each kind's AUC by round. Round 0 is the baseline: the models
as they were before any policy rollout was collected.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training.base.registry import LATEST_REPORT_RUN
from training.reward_models.agent_episodes import WITHIN_TASK
from warehouse.catalog import Materialization, Warehouse
from warehouse.plotting import Markdown, figure_markdown, legend_if_labelled, pyplot
from warehouse.purposes import AGENT_PURPOSES
from warehouse.storage import git_revision
from warehouse.tables_training import FLYWHEEL_ROUNDS

ROUNDS_VERSION = "flywheel-rounds-1"
#: Training examples from the agent's own episodes: the flywheel's collections and RL's sampled episodes.
ASSET_NAME = "flywheel_round"


class FlywheelError(RuntimeError):
    """A round that cannot be recorded (no report has run, or it judged no agent episode)."""


def recorded_rounds(warehouse: Warehouse) -> list[int]:
    """The rounds recorded so far, in order."""
    return sorted(warehouse.query("SELECT DISTINCT round FROM flywheel_rounds").column(0).to_pylist())


def next_round(warehouse: Warehouse) -> int:
    """The round a new collection belongs to: 1 after the baseline (0), then one more each time."""
    done = recorded_rounds(warehouse)
    return (done[-1] + 1) if done else 0


def round_rows(warehouse: Warehouse, round_: int) -> list[dict[str, Any]]:
    """``flywheel_rounds`` rows of ``round_`` from the latest reward-model report."""
    report = warehouse.query(f"SELECT {LATEST_REPORT_RUN} AS run_id").to_pylist()
    if not report or report[0]["run_id"] is None:
        raise FlywheelError("no reward-model report has run: materialize reward_model_report first")
    run_id = report[0]["run_id"]
    rows = warehouse.query(
        "SELECT a.kind, a.model_id, a.auc, a.auc_low, a.auc_high, a.episodes, m.n_train_examples, m.training_mix, "
        "t.top1, t.top1_low, t.top1_high, t.policy_top1, t.states AS top1_states, "
        "w.auc AS within, w.auc_low AS within_low, w.auc_high AS within_high "
        "FROM rm_agent_auc a LEFT JOIN models m USING (model_id) "
        "LEFT JOIN rm_alternative_top1 t ON t.model_id = a.model_id AND t.family = 'all' AND t.report_run_id = ? "
        "LEFT JOIN rm_agent_auc w ON w.model_id = a.model_id AND w.family = ? AND w.report_run_id = ? "
        "WHERE a.report_run_id = ? AND a.family = 'all' ORDER BY a.kind",
        [run_id, WITHIN_TASK, run_id, run_id],
    ).to_pylist()
    if not rows:
        raise FlywheelError(
            "the latest reward-model report judged no held-out agent episode: an SFT policy and its "
            "evaluation (stepwise rl) must exist before the flywheel can measure anything"
        )
    collected = warehouse.query("SELECT count(*) FROM episodes WHERE purpose = 'policy_rollout'")[0][0].as_py()
    alternative_states = warehouse.query(
        "SELECT count(DISTINCT state_id) FROM step_alternatives WHERE purpose <> 'evaluation'"
    )[0][0].as_py()
    created = datetime.now(UTC)
    return [
        {
            "round": round_,
            "kind": r["kind"],
            "model_id": r["model_id"],
            "report_run_id": run_id,
            "auc": r["auc"],
            "auc_low": r["auc_low"],
            "auc_high": r["auc_high"],
            "agent_episodes": r["episodes"],
            "training_examples": r["n_train_examples"],
            "agent_examples": sum(json.loads(r["training_mix"] or "{}").get(p, 0) for p in AGENT_PURPOSES),
            "policy_rollout_episodes": collected,
            "created_at": created,
            "top1": r["top1"],
            "top1_low": r["top1_low"],
            "top1_high": r["top1_high"],
            "policy_top1": r["policy_top1"],
            "top1_states": r["top1_states"],
            "alternative_states": alternative_states,
            "auc_within_task": r["within"],
            "auc_within_task_low": r["within_low"],
            "auc_within_task_high": r["within_high"],
        }
        for r in rows
    ]


def record_round(warehouse: Warehouse, round_: int, *, run_id: str | None, plot_path: Path) -> dict[str, Any]:
    """Publish round ``round_`` (replacing an earlier record of it) and plot every round so far."""
    if round_ < 0:
        raise FlywheelError(f"round must be 0 or more, got {round_}")
    rows = round_rows(warehouse, round_)
    m = Materialization(
        asset=ASSET_NAME,
        run_id=run_id,
        code_version=f"{ROUNDS_VERSION}+{git_revision()}",
        parameters={"round": round_},
        inputs=warehouse.current_inputs(["rm_agent_auc", "rm_alternative_top1", "models"]),
    )
    table = pa.Table.from_pylist(rows, schema=FLYWHEEL_ROUNDS)
    warehouse.publish(m, [warehouse.stage_table("flywheel_rounds", f"round-{round_:02d}", table, m)])
    history = warehouse.query("SELECT * FROM flywheel_rounds ORDER BY round, kind").to_pylist()
    return {
        "round": round_,
        "rows": rows,
        "markdown": rounds_markdown(history),
        "plot": rounds_plot(history, plot_path),
        "materialization_id": m.materialization_id,
    }


def _auc_cell(auc: float | None, low: float | None, high: float | None) -> str:
    return "n/a" if auc is None or np.isnan(auc) else f"{auc:.2f} [{low:.2f}, {high:.2f}]"


def rounds_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| round | kind | AUC on agent episodes [95%] | within tasks [95%] | top-1 among candidates [95%] "
        "(policy's argmax) | training examples | from agent episodes | collected | states with alternatives |",
        "|---:|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        auc = _auc_cell(r["auc"], r["auc_low"], r["auc_high"])
        within = _auc_cell(r.get("auc_within_task"), r.get("auc_within_task_low"), r.get("auc_within_task_high"))
        top1 = ""
        if r.get("top1") is not None:
            top1 = (
                f"{100 * r['top1']:.1f} [{100 * r['top1_low']:.1f}, {100 * r['top1_high']:.1f}] "
                f"({100 * r['policy_top1']:.1f}; {r['top1_states']} states)"
            )
        counts = (
            r["training_examples"],
            r["agent_examples"],
            r["policy_rollout_episodes"],
            r.get("alternative_states"),
        )
        lines.append(
            f"| {r['round']} | {r['kind']} | {auc} | {within} | {top1} | "
            + " | ".join(f"{c or 0:,}" for c in counts)
            + " |"
        )
    return "\n".join(lines)


def rounds_plot(rows: Sequence[dict[str, Any]], path: Path) -> Markdown:
    """Each kind's AUC on held-out agent episodes by round, with its interval, and within tasks
    (dashed) where recorded; chance marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind and r["auc"] is not None and not np.isnan(r["auc"])]
        if not mine:
            continue
        x = [r["round"] for r in mine]
        drawn = ax.errorbar(
            x,
            [r["auc"] for r in mine],
            yerr=[[r["auc"] - r["auc_low"] for r in mine], [r["auc_high"] - r["auc"] for r in mine]],
            marker="o",
            capsize=3,
            label=kind,
        )
        within = [(r["round"], r["auc_within_task"]) for r in mine if r.get("auc_within_task") is not None]
        if within:  # dashed, same colour: the same models ranking episodes only within their task
            ax.plot(
                *zip(*within, strict=True),
                linestyle="--",
                marker="x",
                color=drawn[0].get_color(),
                label=f"{kind}, within tasks",
            )
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("flywheel round (0: before any policy rollout)")
    ax.set_ylabel("AUC vs success")
    ax.set_ylim(0, 1)
    ax.set_xticks(sorted({r["round"] for r in rows}))
    ax.set_title("Reward models on held-out agent episodes, by round")
    legend_if_labelled(ax, fontsize=8, loc="lower right")
    fig.tight_layout()
    return figure_markdown(fig, path, "reward-model AUC by flywheel round")
