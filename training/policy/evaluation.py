"""How agents are judged (pure functions): failure modes, per-task figures, intervals and paired
tests between policies, and the Table-1 layout of ProgRM (success rate and mean cumulative
environment reward, overall and per task family).

Failure modes after ProgRM Fig. 3 ("useless repetition", and its "misactions"), in the terms of
our tasks: ``useless_repetition`` (the same action three times in a row, or the last steps
cycling over two actions), ``wrong_field`` (a value typed into a field the instruction did not
name it for), ``wrong_submission`` (the environment ended the episode as a failure: a wrong
answer submitted), ``out_of_steps`` (the step budget ran out without any of the above).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envs.protocol import END_FAILURE, EpisodeRecord
from training.policy.candidates import FEATURE_NAMES, enumerate_candidates

FAILURE_MODES = ("useless_repetition", "wrong_field", "wrong_submission", "out_of_steps")
_FITS = FEATURE_NAMES.index("value_fits_field")
_TYPES_VALUE = FEATURE_NAMES.index("types_a_value")


def env_return(record: EpisodeRecord) -> float:
    """The environment's cumulative reward of an episode (ProgRM Table 1's "Rwd")."""
    return float(sum(step.env_reward for step in record.steps))


def _repetitive(actions: Sequence[str]) -> bool:
    for i in range(len(actions) - 2):
        if actions[i] == actions[i + 1] == actions[i + 2]:
            return True
    tail = actions[-4:]
    return len(tail) == 4 and tail[0] == tail[2] and tail[1] == tail[3] and tail[0] != tail[1]


def wrong_field_step(record: EpisodeRecord) -> int | None:
    """The first step that typed a value into a field the instruction did not name it for: a field
    where the value does not fit while another field of the screen is the one it fits (the
    candidates' ``types_a_value`` and ``value_fits_field`` features); None if no step did."""
    for t, step in enumerate(record.steps):
        action = step.action
        if action.type.value != "INPUT" or action.target is None or not action.text:
            continue
        history = [s.action for s in record.steps[:t]]
        candidates = enumerate_candidates(
            step.screen, record.instruction, record.slots, history, step_index=t, max_steps=max(1, record.n_steps)
        )
        fitting = [
            c.action.target.ref
            for c in candidates
            if c.action.target is not None
            and c.features[_TYPES_VALUE]
            and c.features[_FITS]
            and c.action.text == action.text
        ]
        if fitting and action.target.ref not in fitting:
            return t
    return None


def failure_mode(record: EpisodeRecord) -> str | None:
    """Why a failed episode failed (None for a success); see the module docstring."""
    if record.success:
        return None
    if _repetitive([s.action.canonical_text() for s in record.steps]):
        return "useless_repetition"
    if wrong_field_step(record) is not None:
        return "wrong_field"
    if record.end_reason == END_FAILURE:
        return "wrong_submission"
    return "out_of_steps"


@dataclass(frozen=True)
class EvalEpisode:
    """One evaluation episode, as ``agent_eval_episodes`` stores it."""

    policy_id: str
    task_id: str
    family: str
    seed: int
    episode_id: str
    success: bool
    env_return: float
    n_steps: int
    failure_mode: str | None


def eval_episode(policy_id: str, record: EpisodeRecord) -> EvalEpisode:
    return EvalEpisode(
        policy_id,
        record.task_id,
        record.family,
        record.seed,
        record.episode_id,
        record.success,
        env_return(record),
        record.n_steps,
        failure_mode(record),
    )


def per_task_rows(episodes: Sequence[EvalEpisode]) -> list[dict]:
    """``agent_eval`` figures per (policy, task)."""
    groups: dict[tuple[str, str], list[EvalEpisode]] = defaultdict(list)
    for e in episodes:
        groups[(e.policy_id, e.task_id)].append(e)
    rows = []
    for (policy, task), items in sorted(groups.items()):
        modes = Counter(e.failure_mode for e in items if e.failure_mode)
        rows.append(
            {
                "policy_id": policy,
                "task_id": task,
                "task_family": items[0].family,
                "episodes": len(items),
                "successes": sum(e.success for e in items),
                "success_rate": sum(e.success for e in items) / len(items),
                "mean_env_return": float(np.mean([e.env_return for e in items])),
                "mean_steps": float(np.mean([e.n_steps for e in items])),
                "failure_modes": dict(modes),
            }
        )
    return rows


def sample_seeds(base: int, count: int, salt: str) -> list[int]:
    """``count`` distinct seeds from a seed range, fixed by ``salt`` (different ranges never meet)."""
    rng = random.Random(f"{base}|{salt}")
    return sorted(rng.sample(range(base, base + 100_000), count))
