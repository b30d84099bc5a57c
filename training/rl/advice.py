"""Which reward to use, read from a home's own Table 1 (pure).

The README's "Which reward to use" answers for the runs in it; a user who runs ``stepwise rl`` on
their own tasks needs the same answer for theirs. :func:`reward_advice` takes the report of
:func:`training.rl.report.table_one` (with its hacking alarms) and, per task block:

* judges every REINFORCE++ row (and every row of REINFORCE++ with the KL penalty kept out of the
  batch normalisation, :data:`ADVISED_ESTIMATORS`) against the block's **exact outcome** run under
  REINFORCE++ and against **SFT** (:func:`judge_comparison`): "better" or "worse" needs the paired
  McNemar test the report already made, Holm-adjusted over every test the block's advice reads
  (:func:`warehouse.statistics.holm_adjusted`, so that "better" is not the luckiest of many
  comparisons), **and** the paired difference's interval over RL seeds on one side of 0 (McNemar
  treats episodes as independent; the episodes of one RL seed share its training);
* vetoes a row whose reward raised a hacking alarm (:func:`training.rl.report.reward_hacking_alarms`):
  its agents may be learning what the reward pays rather than the task; and a row whose held-out
  successes on a task are one constant answer per run
  (:func:`training.rl.task_breakdown.constant_answer_test`): its gain is not the task's;
* recommends one reward to a user **with** an exact outcome (the outcome itself unless a row beat
  it, issue 41's dense target: composed rewards within :data:`NON_INFERIORITY_MARGIN` of it are
  listed as safe to add) and one to a user **without** one (the best row that uses no exact outcome
  and beat SFT, or none);
* marks the advice provisional where a row has fewer than :data:`ADVICE_MIN_SEEDS` RL seeds (issue
  41 item 6 asks for at least five: between-seed spread is the largest source of error here);
* says so where no run of a block beat its SFT row, the exact outcome's included (a block at the
  floor, such as the unsolved sparse fallback): there "within 5 points of the outcome" only means
  that both stayed where SFT was, and tells a user nothing about the reward.

Nothing here reads the warehouse; ``run_rl_report`` adds the result to the report as ``advice``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from training.rl.budgets import budget_text, mixed_budgets
from training.rl.rewards.composed import is_control, parse_composition
from training.rl.task_breakdown import constant_answer_alarms
from warehouse.statistics import holm_adjusted, p_value_text

#: Family-wise error rate of the advice's claims (Holm over each block's tests).
ADVICE_ALPHA = 0.05
#: Issue 41's dense target: a composed reward is "no worse than the outcome" when the 95% interval
#: of its paired difference stays above minus this share.
NON_INFERIORITY_MARGIN = 0.05
#: Fewer RL seeds than this per row and the advice says it is provisional (issue 41 item 6).
ADVICE_MIN_SEEDS = 5
#: The estimators whose rows the advice judges: REINFORCE++ and its variant that only keeps the KL
#: penalty out of the batch normalisation (the same reward and learner otherwise, so a user can take
#: either). GRPO, RLOO and PPO rows change the learner with the reward: table only.
ADVISED_ESTIMATORS: frozenset[str] = frozenset({"reinforce_pp", "reinforce_pp_kl_apart"})

#: How the report tags a run whose reward model a flywheel round trained (``flywheel r2``); a run
#: pinned to another model is tagged ``model <id>`` (``training.rl.evaluation.run_rl_report``).
FLYWHEEL_TAG_PREFIX = "flywheel r"

#: Sources that pay the exact outcome themselves, besides ``outcome`` and the composed
#: ``outcome+<source>:<form>``: ADMIRE adds its milestone reward to the outcome (Alg. 1).
OUTCOME_PAYING_SOURCES: frozenset[str] = frozenset({"outcome", "admire"})

#: Sources that read each task's spec (its milestones, checked by the environment) instead of a model:
#: a user without an exact outcome can use one only where someone wrote the task's milestones.
SPEC_SOURCES: frozenset[str] = frozenset({"milestones"})

BETTER, WORSE, WITHIN_MARGIN, UNRESOLVED, NO_DIFFERENCE, NOT_RUN = (
    "better",
    "worse",
    f"within {100 * NON_INFERIORITY_MARGIN:.0f} points",
    "unresolved",
    "no difference shown",
    "not run",
)


def uses_exact_outcome(reward_source: str) -> bool:
    """Whether a reward source needs the environment's exact outcome: a user without one cannot use it."""
    return reward_source in OUTCOME_PAYING_SOURCES or parse_composition(reward_source) is not None


def judge_comparison(comparison: Mapping[str, Any] | None, adjusted_p: float, *, margin: float | None) -> str:
    """One paired comparison in words. :data:`BETTER` or :data:`WORSE` only where **both** tests
    agree: the Holm-adjusted McNemar p is under :data:`ADVICE_ALPHA` (episodes paired on task,
    seed and RL seed, treated as independent) **and** the 95% interval of the paired difference over
    RL seeds (:func:`warehouse.statistics.paired_difference`, which keeps the spread between
    seeds that McNemar ignores) excludes 0 on that side. Otherwise, with a ``margin``,
    :data:`WITHIN_MARGIN` where that interval's lower bound is above ``-margin`` (unadjusted: Holm
    covers the McNemar claims only) and :data:`UNRESOLVED` where it is not; without one,
    :data:`NO_DIFFERENCE`. :data:`NOT_RUN` for a comparison with no paired episodes."""
    if comparison is None or not comparison.get("pairs", 1):
        return NOT_RUN
    low, high = comparison.get("difference_low", math.nan), comparison.get("difference_high", math.nan)
    if adjusted_p < ADVICE_ALPHA and low > 0:
        return BETTER
    if adjusted_p < ADVICE_ALPHA and high < 0:
        return WORSE
    if margin is None:
        return NO_DIFFERENCE
    return WITHIN_MARGIN if low > -margin else UNRESOLVED


def reward_advice(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per block that has REINFORCE++ rows, the judged rows and the two recommendations (see the
    module's docstring). Rows of REINFORCE++ and of :data:`ADVISED_ESTIMATORS` are judged, each against
    the block's REINFORCE++ outcome and SFT; rows of another estimator (``admire_grpo``, ``prm_ppo``)
    change the learner with the reward, so they stay in the table and out of the advice; so do
    controls (``outcome+<source>:shuffled``), which no user should train with.

    Each block: ``block``, ``outcome_actor`` and ``sft_actor`` (None where the block has none),
    ``tests`` (how many p-values Holm adjusted over: each row's comparison with the outcome, with SFT
    and with its estimator's outcome that has paired episodes), ``rows`` (per row: ``actor``, ``reward_source``,
    ``estimator``, ``reward_model_tag``, ``seeds``, ``success_rate``, ``uses_exact_outcome``, ``alarms``, and for
    ``versus_outcome``, ``versus_sft`` and, for a row of another estimator, ``versus_estimator_outcome``
    (against the outcome under that estimator) the comparison's ``difference``, ``difference_low``,
    ``difference_high``, ``pairs``, the raw and adjusted p and the ``judgement``), ``with_outcome``
    and ``without_outcome`` (the ``actor`` recommended or None, and ``why``), ``safe_to_add``,
    ``worse_than_outcome``, ``provisional`` (the rows with too few seeds), ``no_run_beat_sft``
    (True where the block has an SFT row, some row was compared with it, and none was better) and
    ``mixed_budgets`` (each RL row's iterations where the block's rows did not all run one budget,
    :func:`training.rl.budgets.mixed_budgets`; empty otherwise): the judgements stand, but a
    difference between rows of different budgets is partly the budget's."""
    rows = {r["actor"]: r for r in report["rows"]}
    alarms = {a["actor"]: list(a["alarms"]) for a in report.get("hacking_alarms", [])}
    for actor, said in constant_answer_alarms(report["rows"]).items():
        alarms[actor] = alarms.get(actor, []) + said
    blocks: dict[str, list[Mapping[str, Any]]] = {}
    for r in report["rows"]:
        if r.get("reward_source") and r.get("estimator") in ADVISED_ESTIMATORS and not is_control(r["reward_source"]):
            blocks.setdefault(r["block"], []).append(r)
    advice = []
    for block, rl_rows in blocks.items():
        estimator_of = {r["actor"]: r["estimator"] for r in rl_rows}
        # the outcome never has a reward model, so its row carries no tag; one per estimator
        outcome_of = {r["estimator"]: r["actor"] for r in rl_rows if r["reward_source"] == "outcome"}
        outcome_actor = outcome_of.get("reinforce_pp")
        # a row of another estimator is also read against the outcome under that estimator
        own_outcome = {a: outcome_of.get(e) for a, e in estimator_of.items() if e != "reinforce_pp"}
        sft_actor = next((a for a, r in rows.items() if not r.get("reward_source") and r.get("block") == block), None)
        found: list[tuple[str, str, Mapping[str, Any]]] = []
        for c in report["comparisons"]:
            if c["actor"] not in estimator_of or not c.get("pairs") or math.isnan(float(c["mcnemar_p"])):
                continue
            if outcome_actor and c["versus"] == outcome_actor and c["actor"] != outcome_actor:
                found.append((c["actor"], "versus_outcome", c))
            elif sft_actor and c["versus"] == sft_actor:
                found.append((c["actor"], "versus_sft", c))
            elif c["versus"] == own_outcome.get(c["actor"]) and c["actor"] != c["versus"]:
                found.append((c["actor"], "versus_estimator_outcome", c))
        adjusted = holm_adjusted([float(c["mcnemar_p"]) for _, _, c in found])
        judged: dict[str, dict[str, Any]] = {
            r["actor"]: {
                "actor": r["actor"],
                "reward_source": r["reward_source"],
                "estimator": r["estimator"],
                "reward_model_tag": r.get("reward_model_tag"),
                "seeds": r["seeds"],
                "success_rate": r["success_rate"],
                "uses_exact_outcome": uses_exact_outcome(r["reward_source"]),
                "alarms": alarms.get(r["actor"], []),
                "versus_outcome": None,
                "versus_sft": None,
                "versus_estimator_outcome": None,
            }
            for r in rl_rows
        }
        for (actor, side, c), p in zip(found, adjusted, strict=True):
            judged[actor][side] = {
                "difference": c.get("difference", math.nan),
                "difference_low": c.get("difference_low", math.nan),
                "difference_high": c.get("difference_high", math.nan),
                "pairs": c["pairs"],
                "mcnemar_p": float(c["mcnemar_p"]),
                "adjusted_p": p,
                "judgement": judge_comparison(c, p, margin=None if side == "versus_sft" else NON_INFERIORITY_MARGIN),
            }
        recommended = _recommend(block, outcome_actor, sft_actor, list(judged.values()), len(found))
        # only the rows judged here: a GRPO row or a control at another budget changes no judgement
        advice.append(recommended | {"mixed_budgets": mixed_budgets(rl_rows).get(block, {})})
    return advice


def _judgement(row: Mapping[str, Any], side: str) -> str:
    return row[side]["judgement"] if row[side] else NOT_RUN


def _beat_its_estimators_outcome(row: Mapping[str, Any]) -> bool:
    """A row of another estimator that pays more than the outcome (a composed or learned reward) must
    also beat the outcome under its own estimator, where that was run: otherwise its gain over the
    REINFORCE++ outcome may be the estimator's alone (stop 65 on use-spinner: the outcome with the KL
    kept apart and the shaped ProgRM-Env reward, no difference shown)."""
    if row["estimator"] == "reinforce_pp" or row["reward_source"] == "outcome":
        return True
    return _judgement(row, "versus_estimator_outcome") in (BETTER, NOT_RUN)


def _addition_baseline(row: Mapping[str, Any]) -> str:
    """What "safe to add" reads a composed row against: the outcome under its own estimator where that
    was run (adding the learned part is then the only change), else the REINFORCE++ outcome."""
    return "versus_estimator_outcome" if row.get("versus_estimator_outcome") else "versus_outcome"


def _estimator_note(row: Mapping[str, Any], *, against_outcome: bool = True) -> str:
    """What a recommendation of a row of another estimator must say besides the reward (``against_outcome``:
    it was chosen for beating the outcome, not SFT)."""
    estimator = row["estimator"]
    if estimator == "reinforce_pp":
        return ""
    if row["reward_source"] == "outcome":
        return f"; the same reward, trained with {estimator} instead of REINFORCE++"
    if not against_outcome:
        return f"; trained with {estimator}, not REINFORCE++"
    if row.get("versus_estimator_outcome") is None:
        return (
            f"; trained with {estimator}, not REINFORCE++, and the outcome under {estimator} was not run: "
            "the gain may be the estimator's"
        )
    return f"; trained with {estimator}, not REINFORCE++, and beat the outcome under it too"


def _by_success(row: Mapping[str, Any]) -> float:
    """Sort key: held-out success, a row without any (no episodes) last."""
    rate = float(row["success_rate"])
    return -math.inf if math.isnan(rate) else rate


def _recommend(
    block: str, outcome_actor: str | None, sft_actor: str | None, rows: Sequence[dict[str, Any]], tests: int
) -> dict[str, Any]:
    """The block's two recommendations from its judged rows: among the rows that qualify, the one of
    highest held-out success (a ranking by point estimate: they are not tested against each other).
    A row with an alarm never qualifies (the KL-apart outcome's included); the exact outcome under
    REINFORCE++ cannot be gamed, so its alarm (a training return rising while held-out success
    falls: over-fitting; or a constant answer, which it pays on the instances that ask for it) is
    only named: it is still the baseline."""
    by_actor = {r["actor"]: r for r in rows}
    clean = [r for r in rows if not r["alarms"]]
    beat_outcome = [r for r in clean if _judgement(r, "versus_outcome") == BETTER and _beat_its_estimators_outcome(r)]
    learned_beat_sft = [r for r in clean if not r["uses_exact_outcome"] and _judgement(r, "versus_sft") == BETTER]
    with_outcome: dict[str, Any]
    if outcome_actor is None:
        with_outcome = {"actor": None, "why": "no outcome run in this block to compare with"}
    elif beat_outcome:
        best = max(beat_outcome, key=_by_success)
        with_outcome = {"actor": best["actor"], "why": "beat the exact outcome, alarm silent" + _estimator_note(best)}
    else:
        over_fitting = "; its own alarm: " + "; ".join(by_actor[outcome_actor]["alarms"])
        with_outcome = {
            "actor": outcome_actor,
            "why": "no reward beat it" + (over_fitting if by_actor[outcome_actor]["alarms"] else ""),
        }
    without_outcome: dict[str, Any]
    if learned_beat_sft:
        best = max(learned_beat_sft, key=_by_success)
        why = "beat SFT without the outcome, alarm silent" + _estimator_note(best, against_outcome=False)
        if best["reward_source"] in SPEC_SOURCES:
            why += "; it pays each task's milestones as its spec defines them, checked by the environment"
        if (best.get("reward_model_tag") or "").startswith(FLYWHEEL_TAG_PREFIX):
            why += (
                "; its model was retrained on the agent's episodes labelled with success (here by the "
                "environment; without a checker, by annotators)"
            )
        without_outcome = {"actor": best["actor"], "why": why}
    elif sft_actor is None:
        without_outcome = {"actor": None, "why": "no SFT row in this block to compare with"}
    elif any(not r["uses_exact_outcome"] for r in rows):
        without_outcome = {"actor": None, "why": "no reward without the exact outcome beat SFT with its alarm silent"}
    else:
        without_outcome = {"actor": None, "why": "no reward without the exact outcome was run"}
    compared_with_sft = [r for r in rows if r["versus_sft"]]
    return {
        "block": block,
        "outcome_actor": outcome_actor,
        "sft_actor": sft_actor,
        "tests": tests,
        "rows": sorted(rows, key=_by_success, reverse=True),
        "with_outcome": with_outcome,
        "without_outcome": without_outcome,
        "safe_to_add": [
            r["actor"]
            for r in clean
            if parse_composition(r["reward_source"]) and _judgement(r, _addition_baseline(r)) == WITHIN_MARGIN
        ],
        "worse_than_outcome": [r["actor"] for r in rows if _judgement(r, "versus_outcome") == WORSE],
        "provisional": [r["actor"] for r in rows if r["seeds"] < ADVICE_MIN_SEEDS],
        "no_run_beat_sft": bool(compared_with_sft)
        and not any(_judgement(r, "versus_sft") == BETTER for r in compared_with_sft),
    }


#: The ``rl_report`` asset's metadata key of a block's advice line is this prefix and the block.
ADVICE_METADATA_PREFIX = "which_reward_"


def advice_metadata(advice: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each block's :func:`advice_summary` under ``which_reward_<block>``."""
    return {f"{ADVICE_METADATA_PREFIX}{block['block']}": advice_summary(block) for block in advice}


def advice_summary(block: Mapping[str, Any]) -> str:
    """One block's advice in one line (the ``rl_report`` asset's ``which_reward_<block>`` metadata)."""
    floor = "; no run beat SFT here" if block.get("no_run_beat_sft") else ""
    provisional = f" (provisional: fewer than {ADVICE_MIN_SEEDS} RL seeds)" if block["provisional"] else ""
    budgets = " (rows of different budgets)" if block.get("mixed_budgets") else ""
    return (
        f"with the exact outcome: {block['with_outcome']['actor'] or 'no advice'}; "
        f"without one: {block['without_outcome']['actor'] or 'none'}{floor}{provisional}{budgets}"
    )


def _comparison_cell(judged: Mapping[str, Any] | None) -> str:
    if not judged:
        return "-"
    d, low, high = (100 * judged[k] for k in ("difference", "difference_low", "difference_high"))
    p = p_value_text(judged["adjusted_p"])
    return f"{d:+.1f} [{low:+.1f}, {high:+.1f}], Holm p {p}: {judged['judgement']}"


def advice_markdown(advice: Sequence[Mapping[str, Any]]) -> list[str]:
    """The advice as the report prints it, first: per block, the two recommendations in a sentence
    each, then the judged rows."""
    lines: list[str] = []
    for block in advice:
        with_outcome, without = block["with_outcome"], block["without_outcome"]
        lines += [
            f"**Which reward to use here ({block['block']} block)**, REINFORCE++ rows (and REINFORCE++ with the KL "
            "kept apart), each against the REINFORCE++ outcome. Better or worse: "
            f"McNemar's p Holm-adjusted over this block's {block['tests']} tests under {ADVICE_ALPHA} "
            "**and** the 95% interval over RL seeds on one side of 0; within "
            f"{100 * NON_INFERIORITY_MARGIN:.0f} points: that interval's lower bound above "
            f"-{100 * NON_INFERIORITY_MARGIN:.0f} (not adjusted). A row with a reward-hacking or constant-answer "
            "alarm is never recommended (the REINFORCE++ outcome's is named: it is the baseline); the best "
            "qualifying row is chosen by its point estimate:",
            "",
            f"- with the exact outcome: **{with_outcome['actor'] or 'no advice'}** ({with_outcome['why']})"
            + (
                f"; safe to add, within the margin and alarm silent: {', '.join(block['safe_to_add'])}"
                if block["safe_to_add"]
                else ""
            )
            + (f"; worse than it: {', '.join(block['worse_than_outcome'])}" if block["worse_than_outcome"] else ""),
            f"- without one: **{without['actor'] or 'none'}** ({without['why']})",
        ]
        if block.get("no_run_beat_sft"):
            lines.append(
                f"- **no run beat {block['sft_actor']}** on this block, the exact outcome's included: RL did not "
                "learn these tasks here, so a reward within the margin of the outcome only stayed where SFT "
                "was; the comparison says nothing about the reward until some run leaves SFT's level"
            )
        if block["provisional"]:
            lines.append(
                f"- provisional: {len(block['provisional'])} row(s) have fewer than {ADVICE_MIN_SEEDS} RL seeds "
                f"({', '.join(block['provisional'])}); between-seed spread dominates with fewer"
            )
        if mixed := block.get("mixed_budgets"):
            listed = "; ".join(f"{actor} {budget_text(b)}" for actor, b in sorted(mixed.items()))
            lines.append(
                f"- **rows of different budgets** (iterations per run: {listed}): a difference between two of "
                "them is partly the budget's; compare rows of one budget, or resume the others to it"
            )
        sft = block["sft_actor"] or "SFT"
        # rows of another estimator also against the outcome under it (a column only where one was run)
        own = any(r.get("versus_estimator_outcome") for r in block["rows"])
        lines += [
            "",
            "| reward | RL seeds | held-out success % | vs the outcome, points [95% over RL seeds], McNemar "
            f"| vs {sft}, points [95% over RL seeds], McNemar |"
            + (" vs the outcome under its estimator |" if own else "")
            + " alarm |",
            "|---|---:|---:|---|---|" + ("---|" if own else "") + "---|",
        ]
        for r in block["rows"]:
            cells = [
                r["actor"],
                str(r["seeds"]),
                f"{100 * r['success_rate']:.1f}",
                _comparison_cell(r["versus_outcome"]),
                _comparison_cell(r["versus_sft"]),
                *([_comparison_cell(r.get("versus_estimator_outcome"))] if own else []),
                "yes" if r["alarms"] else "none",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines
