"""Label maths of the reward models: progress gains (ProgRM Eq. 2), outcome-anchored progress,
step verdicts derived from progress or read from human labels (GUI-Shepherd Eq. 1), GuidNav's
scalar step reward, and the deterministic step sampling of ProgRM App. C."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from training.reward_models.kinds import Verdict

log = logging.getLogger(__name__)


def progress_gains(progress: Sequence[float] | np.ndarray, k: int = 1) -> np.ndarray:
    """ProgRM Eq. (2): r_t = p_t - p_{t-k}, with p_{-1} = ... = 0 (the "Init" placeholder of Fig. 5)."""
    if k < 1:
        raise ValueError("the progress history length k must be >= 1")
    p = np.asarray(progress, dtype=np.float64)
    previous = np.concatenate([np.zeros(min(k, p.size)), p[:-k]]) if p.size else p
    return p - previous


def outcome_anchored_progress(
    progress: Sequence[float] | np.ndarray, success: bool, *, tolerance: float = 1e-9
) -> np.ndarray:
    """Progress labels that agree with the trajectory's outcome: the outcome is the last milestone.

    ProgRM's labels (§2.2) come from key steps alone, so they can contradict the environment's own
    verdict: a successful trajectory whose task spec misses one of its paths ends below 1, and a
    failed one that matched the whole recipe (a wrong value typed, a wrong item clicked) ends at 1.
    The success judgement of Table 2 reads the final score, so such labels teach the model to
    misjudge exactly those trajectories. Here the environment's outcome is treated as the task's
    final milestone, as WikiHow's task-completion reward is:

    * successful: the final step's label is 1 (reaching the goal implies every sub-goal);
    * failed: no step reaches 1; a step labelled 1 gets the highest label below 1 reached so far
      in the trajectory (0 if none): the step that would have completed the task did not.

    Labels strictly between the two are unchanged, so key-step progress is unaffected.
    """
    p = np.asarray(progress, dtype=np.float64).copy()
    if not p.size:
        return p
    if success:
        p[-1] = 1.0
        return p
    best_below_one = 0.0
    for t in range(p.size):
        if p[t] >= 1.0 - tolerance:
            p[t] = best_below_one
        else:
            best_below_one = max(best_below_one, p[t])
    return p


def derive_step_verdicts(progress: Sequence[float], success: bool, *, tolerance: float = 1e-9) -> list[Verdict]:
    """Step correctness derived from progress labels, where no human looked at the step.

    * every step of a successful trajectory is positive (GuidNav §3.1: demonstrated steps are
      assumed correct);
    * in a failed trajectory, a step that gains progress (p*_t > p*_{t-1}, a key step) is
      positive; a step after the last gain is negative (the trajectory went nowhere from there);
      a non-gaining step before the last gain is ``unsure`` (a detour or a needed preparatory
      step: the labels cannot tell), and is filtered like GUI-Shepherd's unsure (App. A.2).
    """
    if success:
        return ["positive"] * len(progress)
    gains = progress_gains(progress)
    gaining = np.flatnonzero(gains > tolerance)
    last_gain = int(gaining[-1]) if gaining.size else -1
    return [
        "positive" if gains[t] > tolerance else ("negative" if t > last_gain else "unsure") for t in range(len(gains))
    ]


HUMAN_POSITIVE = frozenset({"positive", "correct", "good", "true", "yes"})
HUMAN_NEGATIVE = frozenset({"negative", "incorrect", "wrong", "bad", "false", "no"})


def human_step_verdicts(rows: Iterable[Mapping]) -> dict[tuple[str, int], tuple[Verdict, int]]:
    """Majority vote of human step labels per (episode_id, step_idx): (verdict, number of votes).

    Labels other than positive / negative (``unsure``, ``skip``, ...) count as unsure; a tie,
    or only unsure votes, gives ``unsure`` (filtered downstream, GUI-Shepherd App. A.2).
    """
    votes: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for row in rows:
        label = str(row.get("label") or "").strip().lower()
        vote = "positive" if label in HUMAN_POSITIVE else "negative" if label in HUMAN_NEGATIVE else "unsure"
        votes[(str(row["episode_id"]), int(row["step_idx"]))][vote] += 1
    result: dict[tuple[str, int], tuple[Verdict, int]] = {}
    for key, counter in votes.items():
        pos, neg = counter["positive"], counter["negative"]
        verdict: Verdict = "positive" if pos > neg else "negative" if neg > pos else "unsure"
        result[key] = (verdict, sum(counter.values()))
    return result


#: GuidNav's scalar step reward for each verdict (1 for a correct step, 0 for a wrong one);
#: an unsure step is not dropped from a regression: it is worth half.
GUIDNAV_REWARD: dict[str, float] = {"positive": 1.0, "negative": 0.0, "unsure": 0.5}


def alternative_verdict(
    mc_value: float | None, *, ended: bool, ended_success: bool, milestones_hit: Sequence[str] = ()
) -> Verdict:
    """Step correctness of a replayed alternative (``step_alternatives``), Math-Shepherd's hard
    estimate: a candidate is a correct step when the task can still be completed after it, i.e.
    at least one of the policy's continuations after it succeeded (``mc_value > 0``). Where its own
    step ended the episode, the outcome decides. Without continuations (m = 0) a step that reached a
    milestone is positive and anything else ``unsure`` (filtered, as GUI-Shepherd's unsure)."""
    if ended:
        return "positive" if ended_success else "negative"
    if mc_value is not None:
        return "positive" if mc_value > 0 else "negative"
    return "positive" if milestones_hit else "unsure"


def alternative_reward(
    mc_value: float | None, *, ended: bool, ended_success: bool, milestones_hit: Sequence[str] = ()
) -> float | None:
    """GuidNav's scalar step reward (Eq. 3's regression target) of a replayed alternative: the
    Monte-Carlo value itself (Math-Shepherd's soft estimate: the share of continuations that
    succeeded; the outcome where the step ended the episode); None where nothing estimates it."""
    if ended:
        return 1.0 if ended_success else 0.0
    if mc_value is not None:
        return float(mc_value)
    return 1.0 if milestones_hit else None


def recording_verdict(
    *,
    is_recorded: bool,
    matches_plan: bool | None,
    field_match: bool | None,
    mc_value: float | None,
) -> Verdict:
    """Step correctness of a candidate labelled from the recording, where no replay reproduced its
    state (``step_alternatives.labelled_by = 'recording'``; ``training.flywheel.recording_labels``),
    strongest evidence first: a task field's value typed into another field's box is wrong; the task
    plan's next step is right; the recorded action is judged by its own continuation (``mc_value``,
    Math-Shepherd Eq. 2 with one sample: did the episode succeed after it); any other candidate where
    the plan wanted something else is wrong; the rest is ``unsure`` (filtered, as GUI-Shepherd's)."""
    if field_match is False:
        return "negative"
    if matches_plan is True:
        return "positive"
    if is_recorded and mc_value is not None:
        return "positive" if mc_value > 0 else "negative"
    if matches_plan is False:
        return "negative"
    return "unsure"


def sampled_steps(episode_id: str, n_steps: int, n_sampled: int | None) -> list[int]:
    """Which steps of a trajectory to keep when ``n_sampled`` of ``n_steps`` are kept (ProgRM
    App. C samples failed trajectories' steps to balance success:failure ~1:1).

    Deterministic: the steps whose hash of (episode, step) is smallest, in step order.
    """
    if n_sampled is None or n_sampled >= n_steps:
        return list(range(n_steps))
    n_sampled = max(0, n_sampled)
    ranked = sorted(range(n_steps), key=lambda t: hashlib.sha1(f"{episode_id}:{t}".encode()).digest())
    return sorted(ranked[:n_sampled])
