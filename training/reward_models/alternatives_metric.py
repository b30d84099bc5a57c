"""Reward models choosing among alternatives at one state: what a verifier is for.

Best-of-N (GUI-Shepherd Alg. 2, GuidNav Eqs. 4-6) executes the candidate a verifier scores highest,
so a verifier is as good as its top-1 among the candidates a policy proposes at one state. On the
held-out states of ``step_alternatives`` (states of greedy evaluation episodes: never trained on),
each candidate has a Monte-Carlo value (the share of the policy's continuations after it that
succeeded, or the outcome where its own step ended the episode). Per model:

* ``top1``: the share of states where the candidate it scores highest has the best value there;
* ``policy_top1``: the same for the policy's own argmax (candidate 0): what best-of-N must beat;
* ``random_top1``: the expected share for a uniformly random pick (the share of best candidates);
* ``gain`` = top1 - policy_top1 with a paired bootstrap interval over states, the states only the
  model or only the policy gets right, and McNemar's exact p;
* ``plan_top1`` / ``policy_plan_top1``: how often the pick is the task plan's next step, on states
  whose candidates include it (label (a): the scripted expert's plan as the demonstration).

Only *informative* states count: at least two candidates with a value, not all the same (where
every candidate is as good, any pick is right and says nothing). Step judges score each candidate's
``(instruction, history, screen, candidate)``; progress models score the candidate appended to the
history with the current screen standing in for the next (ProgRM's gain, Eq. 2: the current
progress is the same for all candidates, so it does not change the choice). The ORM judges
outcomes, not candidates: it is not scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from training.base.registry import key_kind
from training.base.states import StepState, TextTrajectory, action_state
from training.reward_models.kinds import PROGRESS_KINDS, STEP_JUDGE_KINDS, model_names
from warehouse.catalog import Warehouse
from warehouse.statistics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_rows,
    mcnemar_exact_p,
    percentile_interval,
)
from warehouse.tables_training import LABELLED_BY_REPLAY, RM_ALTERNATIVE_TOP1

ALL_FAMILIES = "all"
#: The kinds that can choose among candidates.
CHOOSING_KINDS: tuple[str, ...] = (*STEP_JUDGE_KINDS, *PROGRESS_KINDS)


@dataclass(frozen=True)
class HeldOutState:
    """One held-out state with its candidates (candidate 0: the policy's argmax)."""

    state_id: str
    episode_id: str
    step_idx: int
    family: str
    descriptions: tuple[str, ...]
    values: tuple[float, ...]
    matches_plan: tuple[bool | None, ...]
    policy_ranks: tuple[int | None, ...] = ()  # the proposer's rank of each candidate (None: never proposed)

    @property
    def informative(self) -> bool:
        return len(self.values) >= 2 and len(set(self.values)) > 1

    def proposals(self, n: int) -> HeldOutState | None:
        """The state as best-of-N sees it with the proposer's top ``n``: the candidates it ranked
        below ``n``, in order (a recorded action it never proposed is left out); None when that
        leaves nothing to choose between (fewer than two, or all of one value)."""
        keep = [i for i, r in enumerate(self.policy_ranks or range(len(self.values))) if r is not None and r < n]
        state = HeldOutState(
            self.state_id,
            self.episode_id,
            self.step_idx,
            self.family,
            tuple(self.descriptions[i] for i in keep),
            tuple(self.values[i] for i in keep),
            tuple(self.matches_plan[i] for i in keep),
            tuple(self.policy_ranks[i] for i in keep) if self.policy_ranks else (),
        )
        return state if keep and keep[0] == 0 and state.informative else None

    def best(self) -> set[int]:
        top = max(self.values)
        return {i for i, v in enumerate(self.values) if v == top}


def read_held_out_states(warehouse: Warehouse) -> list[HeldOutState]:
    """The informative held-out states (see the module docstring), in state order; candidates whose
    value is unknown are left out, the order of the rest kept (candidate 0 stays first when known).
    Replayed candidates only: one labelled from the recording has no measured value to rank by."""
    rows = warehouse.query(
        "SELECT state_id, episode_id, step_idx, coalesce(task_family, 'unknown') AS family, candidate, "
        "action_description, mc_value, matches_plan, policy_rank FROM step_alternatives "
        f"WHERE purpose = 'evaluation' AND mc_value IS NOT NULL AND labelled_by = '{LABELLED_BY_REPLAY}' "
        "ORDER BY state_id, candidate"
    ).to_pylist()
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        grouped.setdefault(r["state_id"], []).append(r)
    states = []
    for state_id, members in grouped.items():
        if members[0]["candidate"] != 0:
            continue  # the policy's own pick is unknown: the comparison cannot be made
        state = HeldOutState(
            state_id,
            members[0]["episode_id"],
            int(members[0]["step_idx"]),
            members[0]["family"],
            tuple(m["action_description"] or "" for m in members),
            tuple(float(m["mc_value"]) for m in members),
            tuple(m["matches_plan"] for m in members),
            tuple(m["policy_rank"] for m in members),
        )
        if state.informative:
            states.append(state)
    return states


def candidate_states(kind: str, trajectory: TextTrajectory, state: HeldOutState) -> list[StepState]:
    """What a model of ``kind`` scores for each candidate of ``state`` (see the module docstring)."""
    before = action_state(trajectory, state.step_idx)
    if kind in STEP_JUDGE_KINDS:
        return [StepState(before.instruction, before.history, before.screen_lines, d) for d in state.descriptions]
    return [StepState(before.instruction, (*before.history, d), before.screen_lines) for d in state.descriptions]


def candidate_scores(
    kind: str, scorer, states: Sequence[HeldOutState], trajectories: Mapping[str, TextTrajectory]
) -> dict[str, np.ndarray]:
    """Each state's candidate scores by a model of ``kind`` (states whose trajectory is missing are
    left out), all states scored in one batch."""
    batch: list[StepState] = []
    spans: list[tuple[str, int, int]] = []
    for s in states:
        traj = trajectories.get(s.episode_id)
        if traj is None or not 0 <= s.step_idx < len(traj):
            continue
        start = len(batch)
        batch += candidate_states(kind, traj, s)
        spans.append((s.state_id, start, len(batch)))
    scores = scorer.score_states(batch) if batch else np.zeros(0)
    return {state_id: scores[a:b] for state_id, a, b in spans}


def picks(
    kind: str, scorer, states: Sequence[HeldOutState], trajectories: Mapping[str, TextTrajectory]
) -> dict[str, int]:
    """The candidate each state's highest score falls on (the first among equal scores)."""
    return {sid: int(np.argmax(scores)) for sid, scores in candidate_scores(kind, scorer, states, trajectories).items()}


def _bootstrap(model: np.ndarray, policy: np.ndarray, *, level: float = 0.95) -> tuple[float, float, float, float]:
    """Percentile intervals (top1 low/high, gain low/high) over states resampled with replacement."""
    rows = bootstrap_rows(len(model), resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
    top1 = model[rows].mean(axis=1)
    gain = top1 - policy[rows].mean(axis=1)
    return (*percentile_interval(top1, level), *percentile_interval(gain, level))


def top1_rows(
    model_id: str, kind: str, states: Sequence[HeldOutState], chosen: Mapping[str, int], run_id: str | None
) -> list[dict]:
    """``rm_alternative_top1`` rows of one model: per family of the scored states, then over all."""
    scored = [s for s in states if s.state_id in chosen]
    groups: dict[str, list[HeldOutState]] = {}
    for s in scored:
        groups.setdefault(s.family, []).append(s)
    groups[ALL_FAMILIES] = scored
    created = datetime.now(UTC)
    rows = []
    for family, members in sorted(groups.items(), key=lambda kv: (kv[0] == ALL_FAMILIES, kv[0])):
        if not members:
            continue
        right = np.array([chosen[s.state_id] in s.best() for s in members], dtype=float)
        policy = np.array([0 in s.best() for s in members], dtype=float)
        low, high, gain_low, gain_high = _bootstrap(right, policy)
        wins = int(((right == 1) & (policy == 0)).sum())
        losses = int(((right == 0) & (policy == 1)).sum())
        planned = [s for s in members if any(m is True for m in s.matches_plan)]
        rows.append(
            {
                "model_id": model_id,
                "kind": kind,
                "family": family,
                "states": len(members),
                "top1": float(right.mean()),
                "top1_low": low,
                "top1_high": high,
                "policy_top1": float(policy.mean()),
                "random_top1": float(np.mean([len(s.best()) / len(s.values) for s in members])),
                "gain": float(right.mean() - policy.mean()),
                "gain_low": gain_low,
                "gain_high": gain_high,
                "wins": wins,
                "losses": losses,
                "mcnemar_p": mcnemar_exact_p(wins, losses),
                "plan_states": len(planned),
                "plan_top1": float(np.mean([s.matches_plan[chosen[s.state_id]] is True for s in planned]))
                if planned
                else None,
                "policy_plan_top1": float(np.mean([s.matches_plan[0] is True for s in planned])) if planned else None,
                "report_run_id": run_id,
                "created_at": created,
            }
        )
    return rows


@dataclass
class AlternativesReport:
    rows: pa.Table
    markdown: str


def alternatives_report(
    scorers: Mapping[str, tuple[str, object]],
    states: Sequence[HeldOutState],
    trajectories: Mapping[str, TextTrajectory],
    *,
    run_id: str | None,
) -> AlternativesReport:
    """Every choosing model (``scorers``: report key (:func:`report_keys`) -> (model id, scorer)) on
    the held-out states."""
    rows: list[dict] = []
    for key, (model_id, scorer) in scorers.items():
        kind = key_kind(key)
        if kind in CHOOSING_KINDS:
            rows += top1_rows(model_id, kind, states, picks(kind, scorer, states, trajectories), run_id)
    return AlternativesReport(pa.Table.from_pylist(rows, schema=RM_ALTERNATIVE_TOP1), top1_markdown(rows))


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def top1_markdown(rows: Sequence[Mapping]) -> str:
    """One line per model (over all families): its top-1 against the policy's own pick."""
    overall = [r for r in rows if r["family"] == ALL_FAMILIES]
    if not overall:
        return (
            "No held-out alternatives (materialize `step_alternatives` with the `evaluation` source: "
            "states of the policies' evaluation episodes)."
        )
    lines = [
        f"{overall[0]['states']} held-out states with candidates of different Monte-Carlo values; best candidate "
        "picked, % [95% bootstrap]:",
        "",
        "| model | top-1 | policy's argmax | random pick | gain [95%] | only model / only policy right, p "
        "| plan's step picked (model / policy) |",
        "|---|---|---:|---:|---|---|---|",
    ]
    names = model_names(overall)
    for r in overall:
        name = names[r["model_id"]]
        plan = (
            f"{_pct(r['plan_top1'])} / {_pct(r['policy_plan_top1'])} ({r['plan_states']})" if r["plan_states"] else ""
        )
        lines.append(
            f"| {name} | {_pct(r['top1'])} [{_pct(r['top1_low'])}, "
            f"{_pct(r['top1_high'])}] | {_pct(r['policy_top1'])} | {_pct(r['random_top1'])} | "
            f"{100 * r['gain']:+.1f} [{100 * r['gain_low']:+.1f}, {100 * r['gain_high']:+.1f}] | "
            f"{r['wins']} / {r['losses']}, p = {r['mcnemar_p']:.3g} | {plan} |"
        )
    return "\n".join(lines)
