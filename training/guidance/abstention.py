"""Best-of-N that knows when to trust its verifier: keep the policy's own choice unless the verifier
prefers another candidate by more than a margin fitted where the truth is known.

On held-out states of ``step_alternatives`` every candidate has a Monte-Carlo value (the share of
the policy's continuations after it that succeeded; candidate 0 is the policy's argmax). For a
margin m, the agent executes the verifier's best candidate b when ``score[b] - score[0] > m`` and
the policy's candidate otherwise (m = 0 is plain best-of-N: GUI-Shepherd Alg. 2, i* = argmax).
:func:`fit_margin` picks the m whose choices have the highest mean value over the fitted states;
ties go to the larger margin (override less often). The fit reads only states of episodes outside
the evaluation's own (task, seed) instances, so the margin never sees an evaluation seed.

Not in the papers: GUI-Shepherd and GuidNav always take the verifier's argmax. The margin is the
simplest answer to the measured failure (the PRM overrode the policy on most steps and lowered
success from 44% to 32%, README "Guidance").
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from training.guidance.agent import select, select_with_margin
from training.guidance.proposals import GuidanceError
from training.reward_models.alternatives_metric import candidate_scores, read_held_out_states
from training.reward_models.readers import read_trajectories
from warehouse.catalog import Warehouse


@dataclass(frozen=True)
class MarginFit:
    """A fitted margin and what it does on the states it was fitted on (mean candidate values)."""

    margin: float
    states: int  # informative held-out states fitted on
    value: float  # mean value of the candidates chosen with the margin
    policy_value: float  # ... of the policy's own candidates (never override)
    verifier_value: float  # ... of the verifier's argmax (plain best-of-N, margin 0)
    overridden: float  # share of states where the margin lets the verifier override the policy


def fit_margin(scored: Sequence[tuple[Sequence[float], Sequence[float]]]) -> MarginFit:
    """The margin (see the module docstring) over ``scored``: per state, (the verifier's score of
    each candidate, each candidate's value), candidate 0 the policy's. Tried: 0 and every gap
    ``score[best] - score[0]`` at which a state's choice flips (a margin just at a gap keeps the
    policy there), so the chosen margin is one of finitely many distinct policies."""
    if not scored:
        raise GuidanceError("no held-out state to fit the abstention margin on")
    gaps = []
    for scores, _ in scored:
        best = select(list(scores))
        if best != 0:
            gaps.append(float(scores[best]) - float(scores[0]))
    margins = sorted({0.0, *(g for g in gaps if g > 0)})

    def mean_value(margin: float) -> tuple[float, float]:
        chosen = [select_with_margin(list(scores), margin) for scores, _ in scored]
        values = [float(v[i]) for (_, v), i in zip(scored, chosen, strict=True)]
        return float(np.mean(values)), float(np.mean([i != 0 for i in chosen]))

    results = [(margin, *mean_value(margin)) for margin in margins]
    best_value = max(value for _, value, _ in results)
    margin, value, overridden = max(r for r in results if r[1] == best_value)  # ties: the largest margin
    return MarginFit(
        margin=margin,
        states=len(scored),
        value=value,
        policy_value=float(np.mean([float(v[0]) for _, v in scored])),
        verifier_value=mean_value(0.0)[0],
        overridden=overridden,
    )


def fit_verifier_margin(
    warehouse: Warehouse, kind: str, scorer, excluded_instances: Collection[tuple[str, int]], n: int | None = None
) -> MarginFit:
    """:func:`fit_margin` for the reward model ``scorer`` of ``kind`` on the warehouse's held-out
    states with alternatives, leaving out states of episodes on the evaluation's (task, seed)
    instances; with ``n``, each state as best-of-``n`` sees it (the proposer's top ``n`` candidates
    only: a margin fitted on three candidates over-trusted the verifier at N = 16, README
    "Guidance"); a clear error when there is none (run the flywheel's ``step_alternatives`` first)."""
    states = read_held_out_states(warehouse) if warehouse.has_table("step_alternatives") else []
    instances = {}
    if states:
        ids = sorted({s.episode_id for s in states})
        rows = warehouse.query(
            "SELECT episode_id, task_id, seed FROM episodes WHERE list_contains(?, episode_id)", [ids]
        ).to_pylist()
        instances = {r["episode_id"]: (r["task_id"], int(r["seed"])) for r in rows}
    excluded = set(excluded_instances)
    states = [s for s in states if s.episode_id in instances and instances[s.episode_id] not in excluded]
    if n is not None and states:
        states = [seen for s in states if (seen := s.proposals(n)) is not None]
        if not states:
            raise GuidanceError(
                f"no held-out state outside the evaluated instances has two candidates of different value "
                f"among the proposer's top {n}: label more states (step_alternatives, sources [selection])"
            )
    if not states:
        raise GuidanceError(
            "abstention fits its margin on held-out states with alternatives (step_alternatives, purpose "
            "evaluation) outside the evaluated instances, and the warehouse has none: run `stepwise flywheel` first"
        )
    trajectories = read_trajectories(warehouse, sorted({s.episode_id for s in states}))
    scored = candidate_scores(kind, scorer, states, trajectories)
    return fit_margin([(list(scored[s.state_id]), s.values) for s in states if s.state_id in scored])


def margin_label(margin: float) -> str:
    """How a fitted margin is recorded (``guidance_eval.variant``): ``margin=0.0123``."""
    return f"margin={margin:.4f}" if math.isfinite(margin) else "margin=inf"
