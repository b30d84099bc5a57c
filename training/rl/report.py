"""ProgRM Table 1 and the RL plots (pure): the report's rows from held-out evaluation episodes,
its markdown and plots, and the checks of the paper's two claims (ProgRM §4.2, Table 1).

:func:`training.rl.runs.run_rl_report` reads the episodes from the warehouse and calls
:func:`table_one`; nothing here touches the warehouse.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.policy.evaluation import FAILURE_MODES, bootstrap_interval, mean_interval, paired_comparison
from training.reward_models.kinds import PROGRESS_KINDS
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown, figure_markdown, pyplot


def learning_curves_plot(rows: Sequence[dict], path: Path) -> Markdown:
    """Success rate, reward, KL to SFT and entropy per iteration of one run."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    iterations = [r["iteration"] + 1 for r in rows]
    axes[0].plot(iterations, [r["success_rate"] for r in rows], marker="o", label="success (training episodes)")
    axes[0].plot(iterations, [r["mean_reward"] for r in rows], marker="s", label="reward per episode")
    axes[0].set_title("success and reward", fontsize=9)
    axes[1].plot(iterations, [r["kl_to_reference"] for r in rows], marker="o", color="#d62728")
    axes[1].set_title("KL to the SFT policy", fontsize=9)
    axes[2].plot(iterations, [r["entropy"] for r in rows], marker="o", color="#2ca02c")
    axes[2].set_title("policy entropy", fontsize=9)
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "learning curves")


def table_one(sft_id: str, runs: Sequence[dict], by_policy: dict[str, list[dict]]) -> dict[str, Any]:
    """The report's figures (pure): one row per reward source (and estimator) over its RL seeds."""
    families = sorted({e["task_family"] for items in by_policy.values() for e in items if e["task_family"]})
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        label = r["reward_source"] if r["estimator"] == "reinforce_pp" else f"{r['reward_source']} ({r['estimator']})"
        groups[label].append(r)

    def summarise(label: str, policy_ids: Sequence[str], env_steps: Sequence[int]) -> dict:
        items = [e for p in policy_ids for e in by_policy.get(p, [])]
        per_seed = [float(np.mean([e["success"] for e in by_policy[p]])) for p in policy_ids if by_policy.get(p)]
        mean, low, high = mean_interval(per_seed)
        if len(per_seed) < 2:  # one policy: an interval over its episodes instead
            low, high = bootstrap_interval([e["success"] for e in items])
        row: dict[str, Any] = {
            "actor": label,
            "seeds": len(per_seed),
            "episodes": len(items),
            "success_rate": mean,
            "success_low": low,
            "success_high": high,
            "mean_env_return": float(np.mean([e["env_return"] for e in items])) if items else float("nan"),
            "env_steps": int(np.mean(env_steps)) if env_steps else 0,
        }
        for family in families:
            fam = [e for e in items if e["task_family"] == family]
            row[f"{family}_success"] = float(np.mean([e["success"] for e in fam])) if fam else float("nan")
            row[f"{family}_return"] = float(np.mean([e["env_return"] for e in fam])) if fam else float("nan")
        modes = Counter(e["failure_mode"] for e in items if e["failure_mode"])
        row["failure_modes"] = {mode: modes.get(mode, 0) for mode in FAILURE_MODES}
        return row

    rows = [summarise("SFT", [sft_id], [0])]
    for label, members in sorted(groups.items()):
        rows.append(summarise(label, [m["policy_id"] for m in members], [m["env_steps"] or 0 for m in members]))

    def outcomes(policy_ids: Sequence[str], with_seed: bool) -> dict[tuple, bool]:
        out = {}
        for p in policy_ids:
            seed = next((m["rl_seed"] for m in runs if m["policy_id"] == p), 0)
            for e in by_policy.get(p, []):
                out[(e["task_id"], e["seed"], seed if with_seed else 0)] = bool(e["success"])
        return out

    comparisons = []
    baseline = groups.get("outcome", [])
    for label, members in sorted(groups.items()):
        ids = [m["policy_id"] for m in members]
        # versus SFT: every RL seed's episode paired with SFT's episode on the same task and seed
        sft_outcomes = {k: v for k, v in outcomes([sft_id], False).items()}
        paired_sft = {
            (task, seed, rl): sft_outcomes[(task, seed, 0)]
            for (task, seed, rl) in outcomes(ids, True)
            if (task, seed, 0) in sft_outcomes
        }
        comparisons.append({"actor": label, "versus": "SFT"} | paired_comparison(outcomes(ids, True), paired_sft))
        if baseline and label != "outcome":
            comparisons.append(
                {"actor": label, "versus": "outcome"}
                | paired_comparison(outcomes(ids, True), outcomes([m["policy_id"] for m in baseline], True))
            )
    return {"sft_policy_id": sft_id, "families": families, "rows": rows, "comparisons": comparisons}


def report_markdown(report: dict[str, Any]) -> Markdown:
    """The report as markdown tables (Table 1's layout, then the paired tests)."""
    families = report["families"]
    head = ["actor", "seeds", "SR (95% CI)", "Rwd"] + [f"{f} SR / Rwd" for f in families] + ["env steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["rows"]:
        cells = [
            r["actor"],
            str(r["seeds"]),
            f"{100 * r['success_rate']:.1f} [{100 * r['success_low']:.1f}, {100 * r['success_high']:.1f}]",
            f"{r['mean_env_return']:.3f}",
            *(f"{100 * r[f'{f}_success']:.1f} / {r[f'{f}_return']:.2f}" for f in families),
            f"{r['env_steps']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| actor | versus | pairs | only actor solves | only the other solves | McNemar p |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in report["comparisons"]:
        p = c["mcnemar_p"]
        lines.append(
            f"| {c['actor']} | {c['versus']} | {c['pairs']} | {c['only_a']} | {c['only_b']} | "
            f"{'<0.001' if p < 0.001 else f'{p:.3f}'} |"
        )
    lines += ["", "| actor | " + " | ".join(FAILURE_MODES) + " |", "|---|" + "---:|" * len(FAILURE_MODES)]
    for r in report["rows"]:
        lines.append(f"| {r['actor']} | " + " | ".join(str(r["failure_modes"][m]) for m in FAILURE_MODES) + " |")
    return Markdown("\n".join(lines))


def report_plot(report: dict[str, Any], path: Path) -> Markdown:
    """Held-out success per actor with its 95% interval."""
    plt = pyplot()
    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    y = list(range(len(rows)))
    rates = [r["success_rate"] for r in rows]
    errors = [
        [r["success_rate"] - r["success_low"] for r in rows],
        [r["success_high"] - r["success_rate"] for r in rows],
    ]
    ax.barh(y, rates, xerr=errors, color=["#999"] + ["#1f77b4"] * (len(rows) - 1), capsize=4)
    ax.set_yticks(y, [r["actor"] for r in rows])
    ax.set_xlim(0, 1)
    ax.set_xlabel("success rate on held-out seeds (95% interval)")
    ax.invert_yaxis()
    fig.tight_layout()
    return figure_markdown(fig, path, "agent success by reward source")


def check_table_one(report: dict[str, Any]) -> dict[str, CheckOutcome]:
    """ProgRM Table 1's claims on our runs: RL from SFT improves on SFT, and ProgRM's progress
    rewards beat the outcome reward (both on held-out success)."""
    rates = {r["actor"]: r["success_rate"] for r in report["rows"]}
    sft = rates.get("SFT", float("nan"))
    outcome = rates.get("outcome")
    progrm = {k: v for k, v in rates.items() if k in PROGRESS_KINDS}
    rl = {k: v for k, v in rates.items() if k != "SFT"}
    return {
        "rl_improves_on_sft": CheckOutcome(bool(rl) and all(v > sft for v in rl.values()), {"sft": sft, "rl": rl}),
        "progrm_beats_outcome": CheckOutcome(
            outcome is not None and bool(progrm) and all(v > outcome for v in progrm.values()),
            {"outcome": outcome, "progrm": progrm},
        ),
    }
