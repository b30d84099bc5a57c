"""ProgRM Table 1 and the RL plots (pure): the report's rows from held-out evaluation episodes,
its markdown and plots, and the checks of the paper's two claims (ProgRM §4.2, Table 1).

:func:`training.rl.evaluation.run_rl_report` reads the episodes from the warehouse and calls
:func:`table_one`; nothing here touches the warehouse.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from training.policy.evaluation import FAILURE_MODES
from training.policy.task_blocks import (
    DENSE_BLOCK,
    SPARSE_BLOCK,
    SPARSE_RULES,
)
from training.reward_models.exploits import PAID_FAILURE, UNPAID_SUCCESS, PaidEpisode, select_exploits
from training.reward_models.kinds import PROGRESS_KINDS
from training.rl.advice import FLYWHEEL_TAG_PREFIX, advice_markdown
from training.rl.budgets import budget_lines, row_budgets
from training.rl.pairing import comparison_lines, paired_rows
from training.rl.rewards.composed import CONTROL_FORMS, Composition, parse_composition
from training.rl.rewards.orm import ORM_RULE_BY_BLOCK, ORM_RULES
from training.rl.take_off import take_off_lines
from training.rl.task_breakdown import (
    constant_answer_alarms,
    constant_answer_lines,
    constant_answer_test,
    mark_inherited_answers,
    per_seed_lines,
    per_seed_task_successes,
    per_task_lines,
    per_task_successes,
)
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown, figure_markdown, pyplot
from warehouse.statistics import (
    bootstrap_auc,
    p_value_text,
    seed_bootstrap_interval,
)


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


def seed_band_curves(curves: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per actor, the training success per iteration over its RL seeds: mean, lowest and highest
    seed, and how many seeds reached that iteration (a run still going counts only up to its last
    iteration)."""
    by_actor: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in curves:
        by_actor[c["actor"]][int(c["iteration"])].append(float(c["success_rate"]))
    out = {}
    for actor, per_iteration in sorted(by_actor.items()):
        iterations = sorted(per_iteration)
        values = [per_iteration[i] for i in iterations]
        out[actor] = {
            "iteration": [float(i + 1) for i in iterations],
            "mean": [float(np.mean(v)) for v in values],
            "low": [float(min(v)) for v in values],
            "high": [float(max(v)) for v in values],
            "seeds": [float(len(v)) for v in values],
        }
    return out


def learning_curves_by_actor(curves: Sequence[Mapping[str, Any]], path: Path) -> Markdown:
    """Training success per iteration, one panel per block, one line per row of the table: the mean
    over RL seeds and a band from the lowest to the highest seed."""
    plt = pyplot()
    blocks = sorted({c["block"] or DENSE_BLOCK for c in curves}) or [DENSE_BLOCK]
    fig, axes = plt.subplots(1, len(blocks), figsize=(6 * len(blocks), 3.8), squeeze=False)
    for ax, block in zip(axes[0], blocks, strict=True):
        bands = seed_band_curves([c for c in curves if (c["block"] or DENSE_BLOCK) == block])
        for actor, band in bands.items():
            (line,) = ax.plot(band["iteration"], band["mean"], marker="o", markersize=3, label=actor)
            ax.fill_between(band["iteration"], band["low"], band["high"], color=line.get_color(), alpha=0.15)
        ax.set_title(f"{block} block: training success (mean over seeds, band: lowest to highest)", fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel("success rate of the training episodes")
        ax.xaxis.get_major_locator().set_params(integer=True)
        if bands:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_markdown(fig, path, "learning curves over RL seeds")


#: The sources whose reward is dense (per step), against the outcome's one signal at the end.
DENSE_SOURCES: tuple[str, ...] = (*PROGRESS_KINDS, "prm", "guidnav", "admire", "milestones")


def run_label(run: Mapping[str, Any]) -> str:
    """A row's actor: the reward source, its estimator when not REINFORCE++, ``P(success)`` for an
    ORM paying its probability (the rare-positive rule), where its reward model came from when that
    is a flywheel round (``reward_model_tag``: ``flywheel r3``), its block when not dense."""
    source, estimator = run["reward_source"], run["estimator"]
    label = source if estimator == "reinforce_pp" else f"{source} ({estimator})"
    if run.get("orm_rule") == "probability":
        label = f"{label} · P(success)"
    if tag := run.get("reward_model_tag"):
        label = f"{label} · {tag}"
    block = run.get("block") or DENSE_BLOCK
    return label if block == DENSE_BLOCK else f"{label} [{block}]"


def take_off_baselines(runs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each row's baseline for how soon it takes off (:mod:`training.rl.take_off`): the outcome under
    the row's own estimator on its block (rows of the outcome itself have none)."""
    return {
        run_label(r): run_label({"reward_source": "outcome", "estimator": r["estimator"], "block": r.get("block")})
        for r in runs
        if r["reward_source"] != "outcome"
    }


def sft_label(block: str) -> str:
    """The SFT row of a block: ``SFT`` on the dense block, ``SFT [sparse]`` on the sparse one."""
    return "SFT" if block == DENSE_BLOCK else f"SFT [{block}]"


def table_one(
    sft_id: str,
    runs: Sequence[dict],
    by_policy: dict[str, list[dict]],
    blocks: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The report's figures (pure): one row per reward source (and estimator, and block) over its RL
    seeds, and one SFT row per block of ``blocks`` that has tasks (all of SFT's episodes in one row
    without ``blocks``); success and environment reward with 95% intervals by a two-level bootstrap
    over seeds and their episodes (:func:`seed_bootstrap_interval`); paired McNemar tests of every
    source against SFT, against the ORM (ProgRM's claim: the ORM whose model came from the same
    place) and against the outcome reward (ADMIRE's and GUI-Shepherd's), and of every run whose
    reward model came from a flywheel round against the same source and estimator with today's
    models (the effect of the agent's own episodes, on its own), and of a composed source against its
    learned part alone (:func:`compared_runs`), each pairing episodes on the same task, seed and RL seed."""
    families = sorted({e["task_family"] for items in by_policy.values() for e in items if e["task_family"]})
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[run_label(r)].append(r)
    rl_seed_of = {r["policy_id"]: r["rl_seed"] for r in runs}

    def summarise(
        label: str,
        policy_ids: Sequence[str],
        env_steps: Sequence[int],
        run: dict | None = None,
        tasks: Collection[str] | None = None,
        block: str | None = None,
        budgets: Sequence[int] = (),
    ) -> dict:
        kept = {p: [e for e in by_policy.get(p, []) if tasks is None or e["task_id"] in tasks] for p in policy_ids}
        items = [e for p in policy_ids for e in kept[p]]
        seeds = [kept[p] for p in policy_ids if kept[p]]
        mean, low, high = seed_bootstrap_interval([[float(e["success"]) for e in g] for g in seeds])
        reward, reward_low, reward_high = seed_bootstrap_interval([[e["env_return"] for e in g] for g in seeds])
        row: dict[str, Any] = {
            "actor": label,
            "reward_source": run["reward_source"] if run else None,
            "estimator": run["estimator"] if run else None,
            "reward_model_tag": run.get("reward_model_tag") if run else None,
            "block": (run.get("block") or DENSE_BLOCK) if run else block,
            "seeds": len(seeds),
            "seed_success": [float(np.mean([e["success"] for e in g])) for g in seeds],
            "episodes": len(items),
            "success_rate": mean,
            "success_low": low,
            "success_high": high,
            "mean_env_return": reward,
            "env_return_low": reward_low,
            "env_return_high": reward_high,
            "env_steps": int(np.mean(env_steps)) if env_steps else 0,
            "iterations": list(budgets),
        }
        for family in families:
            fam = [e for e in items if e["task_family"] == family]
            row[f"{family}_success"] = float(np.mean([e["success"] for e in fam])) if fam else float("nan")
            row[f"{family}_return"] = float(np.mean([e["env_return"] for e in fam])) if fam else float("nan")
        modes = Counter(e["failure_mode"] for e in items if e["failure_mode"])
        row["failure_modes"] = {mode: modes.get(mode, 0) for mode in FAILURE_MODES}
        row["task_successes"] = per_task_successes(items)
        row["constant_answers"] = constant_answer_test((rl_seed_of.get(p, 0), kept[p]) for p in policy_ids)
        if run:
            row["seed_task_successes"] = per_seed_task_successes((rl_seed_of[p], kept[p]) for p in policy_ids)
        return row

    if blocks is None:
        rows = [summarise("SFT", [sft_id], [0], block=DENSE_BLOCK)]
    else:
        rows = [summarise(sft_label(b), [sft_id], [0], tasks=set(t), block=b) for b, t in blocks.items() if t]
    for label, members in sorted(groups.items()):
        ids, steps = [m["policy_id"] for m in members], [m["env_steps"] or 0 for m in members]
        rows.append(summarise(label, ids, steps, members[0], budgets=row_budgets(members)))

    def outcomes(policy_ids: Sequence[str], with_seed: bool) -> dict[tuple, bool]:
        return held_out_outcomes(by_policy, policy_ids, rl_seed_of if with_seed else {})

    comparisons = []
    sft_outcomes = outcomes([sft_id], False)
    for label, members in sorted(groups.items()):
        ids = [m["policy_id"] for m in members]
        mine = outcomes(ids, True)
        # versus SFT: every RL seed's episode paired with SFT's episode on the same task and seed
        paired_sft = {(t, s, rl): sft_outcomes[(t, s, 0)] for (t, s, rl) in mine if (t, s, 0) in sft_outcomes}
        block = members[0].get("block") or DENSE_BLOCK
        comparisons.append({"actor": label, "versus": sft_label(block)} | paired_rows(mine, paired_sft))
        for other in dict.fromkeys(run_label(o) for o in compared_runs(groups, members[0])):
            if other in groups and other != label:
                theirs = outcomes([m["policy_id"] for m in groups[other]], True)
                comparisons.append({"actor": label, "versus": other} | paired_rows(mine, theirs))
    mark_inherited_answers(rows)
    return {
        "sft_policy_id": sft_id,
        "families": families,
        "rows": rows,
        "comparisons": comparisons,
        "design": experiment_design(rows),
    }


def held_out_outcomes(
    by_policy: Mapping[str, Sequence[Mapping[str, Any]]], policy_ids: Sequence[str], rl_seed_of: Mapping[str, int]
) -> dict[tuple, bool]:
    """Each held-out episode's success by (task, instance seed, RL seed) over ``policy_ids``, the RL seed
    read from ``rl_seed_of`` (0 for a policy not in it: SFT, or where seeds are not to be told apart):
    the keys the paired tests match episodes on."""
    return {
        (e["task_id"], e["seed"], rl_seed_of.get(p, 0)): bool(e["success"])
        for p in policy_ids
        for e in by_policy.get(p, [])
    }


def compared_runs(groups: Mapping[str, Sequence[Mapping[str, Any]]], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runs a row of ``run``'s group is paired with besides SFT (``groups``: the report's runs by
    row label): the block's ORM (ProgRM's baseline, its model from the same place) and the outcome
    (ADMIRE's and GUI-Shepherd's); the same source with today's models when its model came from a
    flywheel round, and the same source pinned to a model no flywheel round trained (``model <id>``:
    e.g. the demonstration-trained model, pinned after a round replaced it); a run of another estimator
    the same reward under REINFORCE++ (what the estimator alone changed) and the outcome under its own
    estimator; a composed source's learned part alone, and a control (``outcome+<source>:shuffled``)
    the shaped form it controls for."""
    block = run.get("block") or DENSE_BLOCK
    tag = run.get("reward_model_tag")
    others = [block_orm(groups, block, tag), {"reward_source": "outcome", "estimator": "reinforce_pp", "block": block}]
    if tag:
        others.append({**run, "reward_model_tag": None})
    if tag and tag.startswith(FLYWHEEL_TAG_PREFIX):
        same = ("reward_source", "estimator", "orm_rule")
        for members in groups.values():
            other = members[0]
            other_tag = other.get("reward_model_tag") or ""
            if (
                other_tag
                and not other_tag.startswith(FLYWHEEL_TAG_PREFIX)
                and (other.get("block") or DENSE_BLOCK) == block
                and all(other.get(k) == run.get(k) for k in same)
            ):
                others.append(dict(other))
    if run["estimator"] != "reinforce_pp":  # the estimator's own effect: the same reward under REINFORCE++
        others.append({**run, "estimator": "reinforce_pp"})
        if run["reward_source"] != "outcome":  # and the outcome under the same estimator
            others.append({"reward_source": "outcome", "estimator": run["estimator"], "block": block})
    if composition := parse_composition(run["reward_source"]):
        others.append({**run, "reward_source": composition.source, "estimator": "reinforce_pp"})
        others.append({**run, "reward_source": composition.source})  # under its own estimator, where run
        if composition.form in CONTROL_FORMS:  # a control is read against what it controls for
            others.append({**run, "reward_source": Composition(composition.source, "shaped").name})
    return others


def block_orm(groups: Collection[str], block: str, tag: str | None = None) -> dict[str, Any]:
    """The ORM run a block's sources are compared with: the one paying by the block's rule
    (:data:`ORM_RULE_BY_BLOCK`), or the block's other ORM where only that one ran (runs from before
    the rule)."""
    base = {"reward_source": "orm", "estimator": "reinforce_pp", "block": block, "reward_model_tag": tag}
    declared = base | {"orm_rule": ORM_RULE_BY_BLOCK.get(block, "threshold")}
    others = [base | {"orm_rule": rule} for rule in ORM_RULES if rule != declared["orm_rule"]]
    return next((o for o in [declared, *others] if run_label(o) in groups), declared)


#: The spread of held-out success between RL seeds of one source in the first Table-1 run
#: (2026-11-23, README: three seeds per source, six sources, 100 episodes per seed): the pooled
#: standard deviation of the per-seed success rates, recovered from its t-intervals over three seeds
#: (half-width = t(0.975, 2) * sd / sqrt(3)). The power calculation's prior where a block has no
#: source with two seeds yet.
FIRST_TABLE_SEED_SD = 0.069


def minimum_detectable_difference(seed_sd: float, seeds: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest difference in success rate between two sources of ``seeds`` RL seeds each that a
    two-sided test at level ``alpha`` finds with probability ``power``, when a seed's success rate
    varies with standard deviation ``seed_sd`` (normal approximation over seeds,
    ``(z_{1-alpha/2} + z_power) * sd * sqrt(2 / seeds)``). Conservative for common random numbers,
    which pair the seeds and can only shrink the variance of the difference."""
    if seeds < 1:
        raise ValueError("seeds must be at least 1")
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * seed_sd * math.sqrt(2.0 / seeds)


def seeds_needed(seed_sd: float, difference: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """How many RL seeds per source detect ``difference`` (the inverse of
    :func:`minimum_detectable_difference`), at least 2."""
    if difference <= 0:
        raise ValueError("difference must be positive")
    z = NormalDist()
    return max(2, math.ceil(2 * ((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * seed_sd / difference) ** 2))


def pooled_seed_sd(per_seed_rates: Sequence[Sequence[float]]) -> float | None:
    """The pooled within-source standard deviation of per-seed success rates over the sources with
    at least two seeds (None when none has)."""
    groups = [np.asarray(g, dtype=np.float64) for g in per_seed_rates if len(g) >= 2]
    if not groups:
        return None
    dof = sum(g.size - 1 for g in groups)
    return float(math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof))


def experiment_design(rows: Sequence[Mapping[str, Any]], *, alpha: float = 0.05, power: float = 0.8) -> list[dict]:
    """What the runs can detect, per block (the Table-1 issue's power calculation): the spread of
    success between seeds, measured on the block's sources with two seeds or more, or
    :data:`FIRST_TABLE_SEED_SD` where that is larger or nothing is measured yet, and for each
    source the smallest difference from another source with as many seeds that the design detects
    (:func:`minimum_detectable_difference`)."""
    out = []
    for block in sorted({r.get("block") or DENSE_BLOCK for r in rows if r.get("reward_source")}):
        runs = [r for r in rows if r.get("reward_source") and (r.get("block") or DENSE_BLOCK) == block]
        measured = pooled_seed_sd([r["seed_success"] for r in runs])
        # Conservative: never more power than the first table's spread allows. A few seeds at a
        # floor (every rate near 0) measure a spread of almost nothing, which says nothing of the
        # spread once a source leaves the floor.
        sd = FIRST_TABLE_SEED_SD if measured is None else max(measured, FIRST_TABLE_SEED_SD)
        if measured is None:
            sd_from = "the first table (2026-11-23)"
        elif measured >= FIRST_TABLE_SEED_SD:
            sd_from = "this block's seeds"
        else:
            sd_from = f"the first table's, above this block's {100 * measured:.1f}"
        for r in runs:
            out.append(
                {
                    "block": block,
                    "actor": r["actor"],
                    "seeds": r["seeds"],
                    "seed_sd": sd,
                    "measured_sd": measured,
                    "sd_from": sd_from,
                    "detectable": minimum_detectable_difference(sd, r["seeds"], alpha=alpha, power=power)
                    if r["seeds"]
                    else math.nan,
                }
            )
    return out


#: How a training episode ended, by the environment's raw reward (MiniWoB++: 1 success, a fraction
#: for a submission partly right, -1 a wrong submission, 0 no submission before the step limit).
EPISODE_ENDINGS: tuple[str, ...] = ("success", "partial credit", "wrong submission", "no submission")


def episode_ending(success: bool, env_outcome: float | None) -> str:
    """One of :data:`EPISODE_ENDINGS` for an episode's success and raw environment reward."""
    if success:
        return "success"
    raw = env_outcome or 0.0
    return "wrong submission" if raw < 0 else "partial credit" if raw > 0 else "no submission"


def reward_by_ending(episodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What each run's reward paid for, on its own training episodes: per actor (:func:`run_label`)
    and episode ending (:func:`episode_ending`), the number of episodes and their mean summed
    reward. A reward that pays a failure ending more than a success trains towards that failure
    (the evidence for a claim that fails). ``episodes`` as :func:`training_reward_auc`'s, with
    ``env_outcome`` (the raw environment reward)."""
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in episodes:
        groups[run_label(e)][episode_ending(bool(e["success"]), e.get("env_outcome"))].append(float(e["reward"]))
    return [
        {"actor": actor}
        | {
            ending: {"episodes": len(v), "mean_reward": float(np.mean(v)) if v else float("nan")}
            for ending in EPISODE_ENDINGS
            for v in [by_ending.get(ending, [])]
        }
        for actor, by_ending in sorted(groups.items())
    ]


def exploits_by_actor(episodes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per actor (:func:`run_label`), the training episodes its reward misranked within their task
    and run, which the next reward-model datasets weigh more (issue 41 item 2,
    :func:`training.reward_models.exploits.select_exploits`): paid failures and unpaid successes.
    ``episodes`` as :func:`reward_by_ending`'s, with ``episode_id`` and ``run_key``."""
    label_of = {e["episode_id"]: run_label(e) for e in episodes}
    chosen = select_exploits(
        PaidEpisode(e["episode_id"], e["run_key"], str(e.get("task_id") or ""), float(e["reward"]), bool(e["success"]))
        for e in episodes
    )
    counts: dict[str, dict[str, int]] = {actor: {PAID_FAILURE: 0, UNPAID_SUCCESS: 0} for actor in label_of.values()}
    for x in chosen:
        counts[label_of[x.episode_id]][x.kind] += 1
    return counts


def training_reward_auc(episodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """How well each run's reward told its own training episodes apart (the Table-1 issue): per
    actor (:func:`run_label`), the ROC AUC of an episode's summed reward (the reward the policy
    was trained on, before any shaping) against the episode's success, over every training
    episode of its RL seeds, with a bootstrap 95% interval (successes and failures resampled
    apart). An exact outcome reward gives 1; a reward no better than chance, 0.5. With each
    episode's ``task_id``, also the AUC within tasks (``within_task_auc``,
    :func:`warehouse.statistics.within_group_auc`): a reward that pays an easy
    task more than a hard one ranks well pooled and may still not tell a success from a failure of
    the same task.

    ``episodes``: one mapping per RL training episode with ``reward_source``, ``estimator``,
    ``block``, ``reward_model_tag`` (optional), ``task_id`` (optional), ``reward`` (summed over
    its steps) and ``success``."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in episodes:
        groups[run_label(e)].append(e)
    rows = []
    for label, items in sorted(groups.items()):
        rewards = [float(e["reward"]) for e in items]
        success = [bool(e["success"]) for e in items]
        auc, low, high = bootstrap_auc(rewards, success)
        nan = float("nan")
        tasks = [str(e.get("task_id") or "") for e in items]
        within = bootstrap_auc(rewards, success, groups=tasks) if all(tasks) else (nan, nan, nan)
        rows.append(
            {
                "actor": label,
                "episodes": len(items),
                "successes": sum(success),
                "auc": auc,
                "auc_low": low,
                "auc_high": high,
                "within_task_auc": within[0],
                "within_task_low": within[1],
                "within_task_high": within[2],
            }
        )
    return rows


#: Below this within-task AUC on its own training episodes a reward cannot tell a task's successes
#: from its failures (issue 41 item 5): an agent trained on it learns what the reward pays instead.
HACKING_AUC_FLOOR = 0.6
#: A failure ending judged against successes only with at least this many training episodes.
HACKING_MIN_ENDING_EPISODES = 20


def _failures_paid_like_success(paid: Mapping[str, Any] | None) -> list[str]:
    """The failure endings a row of :func:`reward_by_ending` paid at least as much as its successes."""
    if not paid or not paid["success"]["episodes"]:
        return []
    success = paid["success"]["mean_reward"]
    return [
        f"paid '{ending}' {paid[ending]['mean_reward']:.2f} ({paid[ending]['episodes']} episodes), "
        f"success {success:.2f}"
        for ending in EPISODE_ENDINGS[1:]
        if paid[ending]["episodes"] >= HACKING_MIN_ENDING_EPISODES and paid[ending]["mean_reward"] >= success
    ]


def reward_hacking_alarms(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per RL row, the signs that its reward pays something other than success (issue 41 item 5):

    * its **training return rose** (the mean over seeds of the last iteration's mean episode reward
      minus the first's, ``report["curves"]``) **while held-out success fell** below the SFT row
      of its block (``report["rows"]``; the paired McNemar p of that comparison is given);
    * its **within-task AUC** on its own training episodes (``report["training_reward_auc"]``) is
      under :data:`HACKING_AUC_FLOOR` (the pooled AUC where a run's episodes carry no task);
    * it **paid a failure ending at least as much as success** on average over its training
      episodes (``report["reward_by_ending"]``; an ending of at least
      :data:`HACKING_MIN_ENDING_EPISODES` episodes): the policy gradient then pushes towards that
      ending, whatever the ranking within tasks says (a PRM bonus paid never-submitted episodes
      1.29 against 1.25 for successes, and its agents repeated actions until the step limit).

    Each row lists its ``alarms`` in words (none: the reward shows no sign of being gamed), and,
    beside them, ``mean_kl``: the mean over its seeds' iterations of the KL to SFT (how far training
    moved the policy; stop 65's estimator finding was read from it). Rows without a curve of two
    iterations or an AUC judge only by what they have."""
    rows = {r["actor"]: r for r in report["rows"]}
    sft_p = {c["actor"]: c["mcnemar_p"] for c in report["comparisons"] if c["versus"].startswith("SFT")}
    auc = {a["actor"]: a for a in report.get("training_reward_auc", [])}
    paid = {a["actor"]: a for a in report.get("reward_by_ending", [])}
    by_seed: dict[str, dict[Any, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for c in report.get("curves", []):
        by_seed[c["actor"]][c["seed"]].append(c)
    alarms = []
    for row in report["rows"]:
        if not row.get("reward_source"):
            continue
        actor = row["actor"]
        sft = rows.get(sft_label(row.get("block") or DENSE_BLOCK))
        changes = [
            float(last["mean_reward"]) - float(first["mean_reward"])
            for curve in by_seed[actor].values()
            if len(curve) >= 2 and "mean_reward" in curve[0]
            for first, last in [(min(curve, key=lambda c: c["iteration"]), max(curve, key=lambda c: c["iteration"]))]
        ]
        return_change = float(np.mean(changes)) if changes else float("nan")
        kls = [
            float(c["kl_to_reference"])
            for curve in by_seed[actor].values()
            for c in curve
            if c.get("kl_to_reference") is not None
        ]
        mean_kl = float(np.mean(kls)) if kls else float("nan")
        success_change = row["success_rate"] - sft["success_rate"] if sft else float("nan")
        judged = auc.get(actor, {})
        within = judged.get("within_task_auc", float("nan"))
        ranking = within if not math.isnan(within) else judged.get("auc", float("nan"))
        said = []
        if return_change > 0 and success_change < 0:
            p = sft_p.get(actor, float("nan"))
            said.append(
                f"training return +{return_change:.3f} while held-out success fell {100 * -success_change:.1f} "
                f"points below SFT (McNemar p {p_value_text(p)})"
            )
        if ranking < HACKING_AUC_FLOOR:
            what = "within-task" if not math.isnan(within) else "pooled"
            said.append(f"{what} AUC {ranking:.2f} < {HACKING_AUC_FLOOR} on its own training episodes")
        said += _failures_paid_like_success(paid.get(actor))
        alarms.append(
            {
                "actor": actor,
                "return_change": return_change,
                "success_change": success_change,
                "ranking_auc": ranking,
                "mean_kl": mean_kl,
                "alarms": said,
            }
        )
    return alarms


def _family_cell(success: float, env_return: float) -> str:
    """A family's SR / reward, or a dash where the row has no task of that family (a block without
    it): 'nan / nan' read like a failed measurement."""
    if math.isnan(success):
        return "-"
    return f"{100 * success:.1f} / {env_return:.2f}"


def report_markdown(report: dict[str, Any]) -> Markdown:
    """The report as markdown: which reward to use here (:mod:`training.rl.advice`, where the report
    has ``advice``), then the tables (Table 1's layout, the paired tests, the rewards' own rankings
    and alarms, the power calculation, failure modes)."""
    families = report["families"]
    head = ["actor", "seeds", "SR (95% CI)", "Rwd (95% CI)"] + [f"{f} SR / Rwd" for f in families] + ["env steps"]
    lines = advice_markdown(report.get("advice", []))
    if report.get("sparse_rule") and any(r.get("block") == SPARSE_BLOCK for r in report["rows"]):
        rule = SPARSE_RULES.get(report["sparse_rule"], report["sparse_rule"])
        lines += [f"Sparse block chosen by the {report['sparse_rule']} rule: {rule}.", ""]
        if left_out := report.get("sparse_left_out"):
            shares = ", ".join(f"{task} ({share:.1%})" for task, share in left_out.items())
            lines[-1:] = [f"Left out of it, one fixed answer solving too many of their instances: {shares}.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["rows"]:
        cells = [
            r["actor"],
            str(r["seeds"]),
            f"{100 * r['success_rate']:.1f} [{100 * r['success_low']:.1f}, {100 * r['success_high']:.1f}]",
            f"{r['mean_env_return']:.3f} [{r['env_return_low']:.3f}, {r['env_return_high']:.3f}]",
            *(_family_cell(r[f"{f}_success"], r[f"{f}_return"]) for f in families),
            f"{r['env_steps']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += budget_lines(report["rows"])
    lines += comparison_lines(report["comparisons"])
    lines += per_task_lines(report["rows"])
    lines += per_seed_lines(report["rows"])
    lines += constant_answer_lines(report["rows"])
    lines += take_off_lines(report.get("take_off", []))
    if report.get("training_reward_auc"):
        lines += [
            "",
            "| actor | training episodes | successes | reward AUC vs success [95%] | within tasks [95%] |",
            "|---|---:|---:|---|---|",
        ]
        for a in report["training_reward_auc"]:
            within = a.get("within_task_auc", math.nan)
            lines.append(
                f"| {a['actor']} | {a['episodes']} | {a['successes']} | "
                f"{a['auc']:.2f} [{a['auc_low']:.2f}, {a['auc_high']:.2f}] | "
                + (
                    "-"
                    if math.isnan(within)
                    else f"{within:.2f} [{a['within_task_low']:.2f}, {a['within_task_high']:.2f}]"
                )
                + " |"
            )
    if report.get("reward_by_ending"):
        lines += [
            "",
            "| actor (summed reward on its training episodes: mean (episodes)) | "
            + " | ".join(EPISODE_ENDINGS)
            + " | misranked, to the reward models: paid failures / unpaid successes |",
            "|---|" + "---:|" * (len(EPISODE_ENDINGS) + 1),
        ]
        exploits = report.get("exploits", {})
        for a in report["reward_by_ending"]:
            cells = [
                "-" if not a[k]["episodes"] else f"{a[k]['mean_reward']:.2f} ({a[k]['episodes']})"
                for k in EPISODE_ENDINGS
            ]
            handed = exploits.get(a["actor"])
            cells.append(f"{handed[PAID_FAILURE]} / {handed[UNPAID_SUCCESS]}" if handed else "-")
            lines.append(f"| {a['actor']} | " + " | ".join(cells) + " |")
    if alarms := report.get("hacking_alarms"):
        lines += [
            "",
            "| actor | training return, last - first iteration | held-out success vs SFT | AUC on its episodes "
            "| mean KL to SFT over iterations | reward-hacking alarm |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for a in alarms:
            kl = a.get("mean_kl", math.nan)
            kl_cell = "-" if math.isnan(kl) else f"{kl:.3f}"
            lines.append(
                f"| {a['actor']} | {a['return_change']:+.3f} | {100 * a['success_change']:+.1f} points | "
                f"{a['ranking_auc']:.2f} | {kl_cell} | {'; '.join(a['alarms']) or 'none'} |"
            )
    if report.get("design"):
        lines += [
            "",
            "| block | actor | seeds | seed-to-seed SD of success (from) "
            "| smallest difference detected (alpha 0.05, power 0.8) |",
            "|---|---|---:|---|---:|",
        ]
        for d in report["design"]:
            lines.append(
                f"| {d['block']} | {d['actor']} | {d['seeds']} | {100 * d['seed_sd']:.1f} ({d['sd_from']}) | "
                f"{100 * d['detectable']:.1f} points |"
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


def _beats(report: dict[str, Any], actors: Sequence[str], versus: str) -> CheckOutcome:
    """Every actor of ``actors`` above ``versus`` on held-out success, with the paired tests."""
    rates = {r["actor"]: r["success_rate"] for r in report["rows"]}
    paired = {c["actor"]: c for c in report["comparisons"] if c["versus"] == versus and c["actor"] in actors}
    present = [a for a in actors if a in rates]
    passed = versus in rates and bool(present) and all(rates[a] > rates[versus] for a in present)
    return CheckOutcome(
        passed,
        {
            versus: rates.get(versus),
            "actors": {a: rates[a] for a in present},
            "paired": {a: {k: c[k] for k in ("pairs", "only_a", "only_b", "mcnemar_p")} for a, c in paired.items()},
        },
        "" if present and versus in rates else f"no runs to compare: {list(actors)} against {versus}",
    )


def _beats_per_block(report: dict[str, Any], sources: Sequence[str]) -> CheckOutcome:
    """ProgRM's claim in every block that ran it: each of ``sources`` (REINFORCE++, today's models)
    above the block's ORM (:func:`block_orm`) on held-out success."""
    present = {r["actor"] for r in report["rows"]}
    per_block, passed = {}, []
    for block in sorted({r.get("block") or DENSE_BLOCK for r in report["rows"] if r.get("reward_source")}):
        versus = run_label(block_orm(present, block))
        actors = [run_label({"reward_source": k, "estimator": "reinforce_pp", "block": block}) for k in sources]
        if versus in present and any(a in present for a in actors):
            outcome = _beats(report, actors, versus)
            per_block[block] = outcome.metadata
            passed.append(outcome.passed)
    return CheckOutcome(
        bool(passed) and all(passed),
        per_block,
        "" if passed else f"no block has an ORM run beside {list(sources)}",
    )


def check_table_one(report: dict[str, Any]) -> dict[str, CheckOutcome]:
    """The claims on our runs, on held-out success: RL from SFT improves on SFT; ProgRM's progress
    rewards beat the learned ORM (ProgRM §4.2, Table 1: the ORM is its baseline); on the sparse
    block, every dense reward beats the exact outcome (ADMIRE's and GUI-Shepherd's claim); no
    run's reward raised an alarm (:func:`reward_hacking_alarms`); and no row's held-out successes on
    a task are one constant answer per run (:func:`training.rl.task_breakdown.constant_answer_test`)."""
    rates = {r["actor"]: r["success_rate"] for r in report["rows"]}
    sft = rates.get("SFT", float("nan"))
    rl_rows = [r for r in report["rows"] if r.get("reward_source")]
    rl = {r["actor"]: r["success_rate"] for r in rl_rows}
    sft_of = {r["actor"]: rates.get(sft_label(r.get("block") or DENSE_BLOCK), float("nan")) for r in rl_rows}
    sparse_dense = [
        r["actor"] for r in report["rows"] if r.get("block") == SPARSE_BLOCK and r.get("reward_source") in DENSE_SOURCES
    ]
    sparse_outcome = run_label({"reward_source": "outcome", "estimator": "reinforce_pp", "block": SPARSE_BLOCK})
    # which runs fail the claim, and whether each block passes on its own: one row at SFT's floor
    # (a sparse outcome run) should not hide that every dense row beat SFT
    not_above = {a: {"rl": v, "sft": sft_of[a]} for a, v in rl.items() if not v > sft_of[a]}
    blocks = {r["actor"]: r.get("block") or DENSE_BLOCK for r in rl_rows}
    return {
        "rl_improves_on_sft": CheckOutcome(
            bool(rl) and not not_above,
            {"sft": sft, "rl": rl}
            | ({"sft_sparse": rates[sft_label(SPARSE_BLOCK)]} if sft_label(SPARSE_BLOCK) in rates else {})
            | {
                "not_above_sft": not_above,
                "every_run_above_sft_by_block": {
                    b: not any(blocks[a] == b for a in not_above) for b in sorted(set(blocks.values()))
                },
            },
        ),
        "progrm_beats_orm": _beats_per_block(report, list(PROGRESS_KINDS)),
        "dense_beats_outcome_on_sparse": _beats(report, sparse_dense, sparse_outcome),
        "no_reward_hacking_alarm": CheckOutcome(
            not any(a["alarms"] for a in report.get("hacking_alarms", [])),
            {a["actor"]: a["alarms"] for a in report.get("hacking_alarms", []) if a["alarms"]},
        ),
        "no_constant_answer": CheckOutcome(not (constant := constant_answer_alarms(report["rows"])), constant),
    }
