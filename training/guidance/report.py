"""The guidance stage's report (:func:`run_guidance_report`): every setting evaluated for a policy,
read back from ``guidance_eval`` / ``guidance_episodes`` / ``guidance_steps``: the N sweep with paired
differences to the base policy (95% paired-bootstrap intervals, McNemar), the judge's ablations,
pass@k and the cost per step; its markdown, plots and the best-of-N check. The evaluation itself:
:mod:`training.guidance.runs`."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.guidance.proposals import GuidanceError
from training.guidance.runs import METHODS, setting_rows
from warehouse.catalog import Warehouse
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown, figure_markdown, pyplot
from warehouse.statistics import p_value_text


def run_guidance_report(warehouse: Warehouse, policy_id: str | None = None) -> dict[str, Any]:
    """Every setting evaluated for a policy (the newest evaluated one by default), recomputed from
    ``guidance_episodes`` and ``guidance_steps`` so that differences to the base policy are paired
    whatever order the methods ran in."""
    try:
        if policy_id is None:
            found = warehouse.query("SELECT policy_id FROM guidance_eval ORDER BY created_at DESC LIMIT 1").to_pylist()
            if not found:
                raise GuidanceError("no guidance evaluation yet: materialize guidance_evaluation first")
            policy_id = found[0]["policy_id"]
        evals = warehouse.query(
            "SELECT * FROM guidance_eval WHERE policy_id = ? AND task_id = 'all'", [policy_id]
        ).to_pylist()
        episodes = warehouse.query("SELECT * FROM guidance_episodes WHERE policy_id = ?", [policy_id]).to_pylist()
        steps = warehouse.query(
            "SELECT s.* FROM guidance_steps s JOIN guidance_episodes e USING (episode_id) WHERE e.policy_id = ?",
            [policy_id],
        ).to_pylist()
    except GuidanceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the views do not exist yet
        raise GuidanceError(f"no guidance evaluation yet ({exc})") from None
    report = guidance_report(policy_id, evals, episodes, steps)
    report["verifier_states"] = verifier_candidate_states(warehouse, sorted({_sweep_key(e)[1] for e in evals} - {""}))
    return report


def verifier_candidate_states(warehouse: Warehouse, model_ids: Sequence[str]) -> dict[str, dict[str, dict[str, int]]]:
    """For each verifier model, per task, how many training states with candidates it learned from,
    by how they were labelled (``replay`` | ``recording``; issue 42 item 2): read from the stats of the
    ``rm_examples`` version it was trained on. Models trained before those stats existed are left out."""
    if not model_ids or not warehouse.has_table("models"):
        return {}
    rows = warehouse.query(
        "SELECT m.model_id, l.parameters->'stats'->'alternative_states_by_task' AS states FROM models m "
        "JOIN lineage_materializations l ON l.materialization_id = m.dataset_materialization_id "
        "WHERE list_contains(?, m.model_id)",
        [list(model_ids)],
    ).to_pylist()
    return {r["model_id"]: json.loads(r["states"]) for r in rows if r["states"] is not None}


_META_KEYS = ("policy_id", "setting", "verifier_model_id", "method", "verifier", "n", "variant", "judge_mode")


def _sweep_key(row: Mapping) -> tuple[str, str]:
    """(setting, verifier model id): rows of homes written before the model id read it as ''."""
    return row["setting"], row.get("verifier_model_id") or ""


def _verifier_labels(evals: Sequence[Mapping]) -> dict[tuple[str, str], str]:
    """The name a verifier's series goes by in the tables and plots: its name, or ``name@model``
    where the report holds sweeps of that verifier with more than one model."""
    models: dict[str, set[str]] = defaultdict(set)
    for e in evals:
        if e["verifier"]:
            models[e["verifier"]].add(_sweep_key(e)[1])
    labels = {}
    for e in evals:
        verifier, model = e["verifier"], _sweep_key(e)[1]
        if verifier:
            labels[(verifier, model)] = f"{verifier}@{model}" if len(models[verifier]) > 1 else verifier
    return labels


def guidance_report(
    policy_id: str, evals: Sequence[Mapping], episodes: Sequence[Mapping], steps: Sequence[Mapping]
) -> dict[str, Any]:
    """The report's figures (pure): one ``all`` row per (setting, verifier model) with paired
    differences to base; ``series`` names a verifier's sweep (``prm``, or ``prm@<model>`` when
    sweeps with two PRMs are reported side by side)."""
    by_setting: dict[tuple[str, str], list[Mapping]] = defaultdict(list)
    for e in episodes:
        by_setting[_sweep_key(e)].append(e)
    steps_by_episode: dict[str, list[Mapping]] = defaultdict(list)
    for s in steps:
        steps_by_episode[s["episode_id"]].append(s)
    base_eps = by_setting.get(("base", ""), [])
    base = {(e["task_id"], int(e["seed"])): bool(e["success"]) for e in base_eps} or None
    labels = _verifier_labels(evals)
    rows = []
    for meta in evals:
        mine = by_setting.get(_sweep_key(meta), [])
        my_steps = [s for e in mine for s in steps_by_episode.get(e["episode_id"], [])]
        attempts = max((int(e["attempt"]) for e in mine), default=0) + 1
        retries = int(meta["variant"]) if meta["method"] == "retry" and meta["variant"] else 0
        fields = {k: meta.get(k) for k in _META_KEYS} | {"verifier_model_id": _sweep_key(meta)[1]}
        row = setting_rows(fields, mine, my_steps, base, max_attempts=max(attempts, retries + 1))[-1]
        row["series"] = labels.get((meta["verifier"], _sweep_key(meta)[1]), meta["verifier"])
        row["created_at"] = meta.get("created_at") or row["created_at"]  # when the sweep ran, not now
        rows.append(row)
    order = {m: i for i, m in enumerate(METHODS)}
    rows.sort(key=lambda r: (order.get(r["method"], 9), r["series"] or "", r["n"] or 0, r["variant"] or ""))
    return {"policy_id": policy_id, "rows": rows, "tasks": sorted({e["task_id"] for e in episodes})}


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _interval(row: Mapping) -> str:
    return f"{_pct(row['success_rate'])} [{_pct(row['success_low'])}, {_pct(row['success_high'])}]"


def _delta(row: Mapping) -> str:
    if row["delta_vs_base"] is None or row["method"] == "base":
        return "-"
    p = row["mcnemar_p"]
    p_text = p_value_text(p)
    return (
        f"{100 * row['delta_vs_base']:+.1f} [{100 * row['delta_low']:+.1f}, {100 * row['delta_high']:+.1f}] "
        f"(+{row['only_setting']}/-{row['only_base']}, p {p_text})"
    )


def report_markdown(report: Mapping[str, Any]) -> Markdown:
    """The N sweep, the oracle, the judge's ablations, retries and the cost per step."""
    rows = report["rows"]
    base = next((r for r in rows if r["method"] == "base"), None)
    lines = [
        f"Policy `{report['policy_id']}` on held-out seeds of {', '.join(report['tasks'])}. Success in % with a "
        "95% bootstrap interval; the difference to the base policy is paired (same task and seed) with a 95% "
        "paired-bootstrap interval, (+instances only this setting solved / -only the base solved, McNemar p).",
        "",
        "| setting | verifier model | N | episodes | success % [95% CI] | vs base (paired) | "
        "ms/step (propose + verify) | verifier calls/step | overridden | fallback |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r.get('verifier_model_id') or '-'} | {r['n']} | {r['episodes']} | "
            f"{_interval(r)} | {_delta(r)} | "
            f"{r['propose_ms']:.0f} + {r['verify_ms']:.0f} | {r['verifier_calls_per_step']:.2f} | "
            f"{100 * r['changed_choice']:.0f}% | {100 * r['fallback_steps']:.0f}% |"
        )
    sweep = sorted({r["n"] for r in rows if r["method"] in ("best_of_n", "oracle")})
    verifiers = sorted({r["series"] for r in rows if r["method"] in ("best_of_n", "oracle") and r["series"]})
    if sweep and base is not None:
        lines += ["", "N sweep (GUI-Shepherd Table 5's layout; N = 1 is the base policy):", ""]
        lines += ["| verifier | " + " | ".join(f"N={n}" for n in [1, *sweep]) + " |"]
        lines += ["|---|" + "---:|" * (len(sweep) + 1)]
        for v in verifiers:
            cells = [_pct(base["success_rate"])]
            for n in sweep:
                hit = next(
                    (r for r in rows if r["series"] == v and r["n"] == n and r["method"] in ("best_of_n", "oracle")),
                    None,
                )
                cells.append(_pct(hit["success_rate"]) if hit else "")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines += _verifier_states_lines(report)
    retry = [r for r in rows if r["method"] == "retry" and r["pass_at"]]
    for r in retry:
        passes = json.loads(r["pass_at"])
        lines += [
            "",
            f"{r['setting']}: " + ", ".join(f"pass@{k} {_pct(v)}" for k, v in passes.items()) + " (pass@k: k attempts)",
        ]
    return Markdown("\n".join(lines))


def _verifier_states_lines(report: Mapping[str, Any]) -> list[str]:
    """Per evaluated task, the training states with candidates each verifier model saw (replayed +
    labelled from the recording): a task at 0 is one the verifier ranks candidates of unseen."""
    seen = report.get("verifier_states") or {}
    if not seen:
        return []
    models = sorted(seen)
    lines = [
        "",
        "Training states with candidates each verifier learned from, per task (replayed + from the recording; "
        "0: it never saw a candidate of that task):",
        "",
        "| task | " + " | ".join(f"`{m}`" for m in models) + " |",
        "|---|" + "---:|" * len(models),
    ]
    for task in report["tasks"]:
        cells = []
        for m in models:
            by = seen[m].get(task, {})
            cells.append(f"{by.get('replay', 0)} + {by.get('recording', 0)}")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines


def report_plots(report: Mapping[str, Any], folder: Path) -> dict[str, Markdown]:
    """Success against N per verifier (base and oracle marked), and agent-side ms per step against N."""
    rows = report["rows"]
    base = next((r for r in rows if r["method"] == "base"), None)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series: dict[str, list[Mapping]] = defaultdict(list)
    for r in rows:
        if r["method"] in ("best_of_n", "oracle"):
            series[r["series"]].append(r)
    for name, items in sorted(series.items()):
        items = sorted(items, key=lambda r: r["n"])
        ns = [1, *(r["n"] for r in items)] if base else [r["n"] for r in items]
        rates = ([base["success_rate"]] if base else []) + [r["success_rate"] for r in items]
        style = "--" if name == "oracle" else "-"
        axes[0].plot(ns, rates, style, marker="o", label=name)
        ms = [r["propose_ms"] + r["verify_ms"] for r in items]
        if base:
            ms = [base["propose_ms"] + base["verify_ms"], *ms]
        axes[1].plot(ns, ms, style, marker="o", label=name)
    for r in rows:
        if r["method"] == "judge":
            axes[0].scatter([r["n"]], [r["success_rate"]], marker="s", label=f"judge {r['variant']}")
    if base is not None:
        axes[0].axhline(base["success_rate"], color="#999", linestyle=":", label="base policy")
    axes[0].set_xscale("log", base=2)
    axes[1].set_xscale("log", base=2)
    axes[0].set_ylim(0, 1)
    axes[0].set_xlabel("N candidates per step")
    axes[0].set_ylabel("held-out success rate")
    axes[1].set_xlabel("N candidates per step")
    axes[1].set_ylabel("agent ms per step (propose + verify)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    out = {"sweep_plot": figure_markdown(fig, folder / "best_of_n_sweep.png", "best-of-N sweep")}
    retry = [r for r in rows if r["method"] == "retry" and r["pass_at"]]
    if retry:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for r in retry:
            passes = json.loads(r["pass_at"])
            ax.plot([int(k) for k in passes], list(passes.values()), marker="o", label=r["setting"])
        ax.set_xlabel("attempts k (k - 1 retries)")
        ax.set_ylabel("pass@k")
        ax.set_ylim(0, 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out["retry_plot"] = figure_markdown(fig, folder / "retry_pass_at_k.png", "reflect and retry")
    return out


def check_best_of_n(report: Mapping[str, Any], verifier: str = "prm") -> CheckOutcome:
    """GUI-Shepherd's claim on our agent: best-of-N with the trained PRM succeeds more often than the
    base policy (paired, at the N values evaluated, on average over them)."""
    rows = [r for r in report["rows"] if r["method"] == "best_of_n" and r["verifier"] == verifier]
    if len({r.get("verifier_model_id") or "" for r in rows}) > 1:  # sweeps with several models: the newest
        newest = max(rows, key=lambda r: r["created_at"]).get("verifier_model_id") or ""
        rows = [r for r in rows if (r.get("verifier_model_id") or "") == newest]
    base = next((r for r in report["rows"] if r["method"] == "base"), None)
    if not rows or base is None:
        return CheckOutcome(False, {"reason": f"no base or no {verifier} best-of-N evaluation"})
    deltas = {f"N={r['n']}": r["delta_vs_base"] for r in rows}
    values = [d for d in deltas.values() if d is not None and not math.isnan(d)]
    passed = bool(values) and float(np.mean(values)) > 0
    return CheckOutcome(passed, {"base": base["success_rate"], "delta_vs_base": deltas})
