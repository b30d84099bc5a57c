"""The task blocks of the RL experiment, chosen from the SFT policy's success on selection seeds
before any RL run (pre-registered in the policy's parameters): the *dense* block (success neither
near 0 nor near 1: room to improve both ways) and the *sparse* block (long tasks SFT rarely or never
solves: an outcome signal RL rarely sees, ProgRM's argument for progress rewards)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from training.policy.episodes import PolicyStageError

#: The block of tasks a run trained on, where the run does not say (the rule of the first table).
DENSE_BLOCK = "dense"


SPARSE_BLOCK = "sparse"


#: The rules that can choose the sparse block (:func:`sparse_block`), as the report says them.
SPARSE_RULE_SAMPLED = "sampled"


SPARSE_RULE_SAMPLED_UNSOLVED = "sampled_unsolved"


SPARSE_RULE_STRICT = "strict"


SPARSE_RULE_UNSOLVED = "unsolved"


SPARSE_RULES: dict[str, str] = {
    SPARSE_RULE_SAMPLED: "SFT success sampling at temperature 1 (as RL's first iteration does) in (0, 15%] on the "
    "selection seeds and a median solution of >= 5 steps",
    SPARSE_RULE_SAMPLED_UNSOLVED: "none sampled in (0, 15%]: the long tasks (median solution >= 5 steps) SFT "
    "never solved even sampling at temperature 1",
    SPARSE_RULE_STRICT: "SFT success in (0, 15%] on the selection seeds and a median solution of >= 5 steps",
    SPARSE_RULE_UNSOLVED: "none was in (0, 15%]: the long tasks (median solution >= 5 steps) greedy SFT never solved",
}

TASK_BLOCKS: tuple[str, ...] = (DENSE_BLOCK, SPARSE_BLOCK)

#: A task whose best fixed answer solves this share of its instances or more is left out of the
#: sparse block (``envs.fixed_answer``): a constant reaching a third of the block's 15% ceiling lets a
#: run leave the floor without learning the task (use-spinner, stop 69's constant-answer alarm). Fixed
#: before the catalog's rates were measured (stop 70, question M).
MAX_CONSTANT_SHARE = 0.05


def choose_tasks(rates: dict[str, float], low: float, high: float, max_tasks: int) -> list[str]:
    """The tasks whose SFT success is strictly between ``low`` and ``high``, closest to 1/2 first,
    at most ``max_tasks``; if none is, the ``max_tasks`` tasks closest to 1/2 that are neither
    always solved nor never solved (and if there are none, an error)."""
    inside = [t for t, r in rates.items() if low < r < high]
    if not inside:
        inside = [t for t, r in rates.items() if 0.0 < r < 1.0]
    if not inside:
        raise PolicyStageError(f"SFT solves every task always or never ({rates}): no task leaves room for RL")
    return sorted(sorted(inside), key=lambda t: abs(rates[t] - 0.5))[:max_tasks]


def choose_sparse_tasks(
    rates: Mapping[str, float],
    solution_steps: Mapping[str, float],
    *,
    high: float = 0.15,
    min_steps: float = 5.0,
    max_tasks: int = 4,
    include_unsolved: bool = False,
    constant_shares: Mapping[str, float] | None = None,
    max_constant_share: float = MAX_CONSTANT_SHARE,
) -> list[str]:
    """The sparse block of the Table-1 issue: tasks where SFT succeeds on the selection seeds
    sometimes but rarely (success in (0, ``high``]: an outcome signal that RL rarely sees, and still
    some) and whose median successful demonstration takes at least ``min_steps`` steps (human, else
    the experts' rollouts: ``solution_steps``; long horizons, ProgRM's argument), hardest first, at
    most ``max_tasks``; may be empty (then the report says no sparse block ran).
    ``include_unsolved``: success in [0, ``high``] instead (the fallback rule of :func:`sparse_block`).
    ``constant_shares``: each measured task's best fixed answer's share of instances solved
    (:func:`envs.fixed_answer.load_constant_answer_rates`); tasks at ``max_constant_share`` or more
    are left out (:func:`farmable_tasks`), unmeasured ones stay."""
    farmable = farmable_tasks(constant_shares or {}, max_constant_share)
    eligible = [
        t
        for t, r in rates.items()
        if (0.0 <= r if include_unsolved else 0.0 < r)
        and r <= high
        and solution_steps.get(t, 0.0) >= min_steps
        and t not in farmable
    ]
    return sorted(sorted(eligible), key=lambda t: rates[t])[:max_tasks]


def farmable_tasks(constant_shares: Mapping[str, float], max_share: float = MAX_CONSTANT_SHARE) -> dict[str, float]:
    """The tasks one fixed answer solves too often for the sparse block, with their shares."""
    return {t: share for t, share in sorted(constant_shares.items()) if share >= max_share}


def sparse_block(
    rates: Mapping[str, float],
    solution_steps: Mapping[str, float],
    *,
    high: float = 0.15,
    min_steps: float = 5.0,
    max_tasks: int = 4,
    fallback: bool = True,
    sampled_rates: Mapping[str, float] | None = None,
    constant_shares: Mapping[str, float] | None = None,
    max_constant_share: float = MAX_CONSTANT_SHARE,
) -> tuple[list[str], str]:
    """The sparse block and the rule that chose it: the issue's rule (:func:`choose_sparse_tasks`,
    SFT success in (0, ``high``]); when that chooses nothing and ``fallback`` holds, the long tasks
    with success in [0, ``high``], so those greedy SFT never solved on the selection seeds too (RL
    samples at temperature 1 and can still succeed: an outcome signal rarer still, the case of
    ProgRM's argument). Both rules are fixed before any run; the policy records which one chose.

    ``sampled_rates`` (the long tasks' success when SFT *samples* at temperature 1, as RL's first
    iteration does) replace the greedy rates when given: greedy success is not what RL sees. On
    guess-number greedy SFT succeeded on 9 of 100 selection seeds and RL's first sampled iteration
    on 57.5% of its episodes (stop 63), so a block chosen on greedy rates need not be sparse for RL.
    The same two rules then read the sampled rates (``sampled``, then with ``fallback`` the long
    tasks SFT never solved even sampling, ``sampled_unsolved``), so no task that samples above
    ``high`` can join the block.

    Either rule leaves out the tasks one fixed answer solves too often (``constant_shares`` at
    ``max_constant_share`` or more: :func:`choose_sparse_tasks`)."""
    sampled = sampled_rates is not None
    read = sampled_rates if sampled_rates is not None else rates
    common: dict[str, Any] = {"high": high, "min_steps": min_steps, "max_tasks": max_tasks}
    common |= {"constant_shares": constant_shares, "max_constant_share": max_constant_share}
    rare = choose_sparse_tasks(read, solution_steps, **common)
    if rare or not fallback:
        return rare, SPARSE_RULE_SAMPLED if sampled else SPARSE_RULE_STRICT
    never = choose_sparse_tasks(read, solution_steps, include_unsolved=True, **common)
    return never, SPARSE_RULE_SAMPLED_UNSOLVED if sampled else SPARSE_RULE_UNSOLVED


def _recorded_blocks(sft: Mapping[str, Any]) -> dict[str, Any]:
    """What an SFT policy recorded of its blocks (``task_blocks`` in its parameters; {} before them)."""
    return json.loads(sft.get("parameters") or "{}").get("task_blocks") or {}


def task_blocks(sft: Mapping[str, Any]) -> dict[str, list[str]]:
    """The task blocks an SFT policy pre-registered (``task_blocks`` in its parameters); a policy
    made before there were blocks has its chosen tasks as the dense block and no sparse one."""
    recorded = _recorded_blocks(sft)
    return {
        DENSE_BLOCK: list(recorded.get(DENSE_BLOCK) or sft.get("tasks") or []),
        SPARSE_BLOCK: list(recorded.get(SPARSE_BLOCK) or []),
    }


def sparse_block_rule(sft: Mapping[str, Any]) -> str:
    """The rule that chose an SFT policy's sparse block (:func:`sparse_block`); policies made
    before the fallback existed were chosen by the strict rule."""
    return str(_recorded_blocks(sft).get("sparse_rule") or SPARSE_RULE_STRICT)


def sparse_left_out(sft: Mapping[str, Any]) -> dict[str, float]:
    """The long tasks an SFT policy's sparse rule left out for a constant answer, with each one's
    best fixed answer's share ({} for policies made before the rule read them)."""
    return dict(_recorded_blocks(sft).get("sparse_left_out_constant") or {})
