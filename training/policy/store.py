"""Where trained policies are found, and the seed ranges their episodes are drawn from.

The ranges are disjoint so that no instance a policy trained on can reach its evaluation: RL
training draws from ``TRAIN_SEED_BASE``, the choice of tasks from ``SELECTION_SEED_BASE``, every
held-out evaluation (RL and guidance) from ``HELD_OUT_SEED_BASE`` and the policy rollouts collected
as training data (``training.flywheel.collection``) from ``POLICY_ROLLOUT_SEED_BASE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from warehouse.catalog import Warehouse
from warehouse.purposes import IMITATION_PURPOSES, purpose_filter
from warehouse.trajectories import Trajectory, load_trajectories

TRAIN_SEED_BASE = 1_000_000
SELECTION_SEED_BASE = 2_000_000
HELD_OUT_SEED_BASE = 3_000_000
POLICY_ROLLOUT_SEED_BASE = 4_000_000


class PolicyNotFoundError(RuntimeError):
    """No policy of the kind (or id) asked for is in the warehouse."""


if TYPE_CHECKING:
    from training.policy.learned import PolicyModel


def policy_cache_dir(home: Path | str, fingerprint: str) -> Path:
    """``<home>/cache/policy_embeddings/<encoder fingerprint>``: the encodings of the texts policies
    have read (instructions, histories, candidates), kept between runs. The encoder is batch
    invariant, so a stored encoding is the one a fresh encoding would give (docs/reproducibility.md)."""
    return Path(home) / "cache" / "policy_embeddings" / fingerprint


def warm_policy_cache(model: PolicyModel, home: Path | str) -> int:
    """Load the stored encodings into ``model``'s cache; how many (0 when none are stored)."""
    return model.cache.load(policy_cache_dir(home, model.encoder.fingerprint))


def keep_policy_cache(model: PolicyModel, home: Path | str) -> Path:
    """Store ``model``'s cache for the next run (SFT encodes every candidate of every demonstrated step: minutes); a
    cache that encoded nothing since it was warmed has nothing new and is not written again."""
    directory = policy_cache_dir(home, model.encoder.fingerprint)
    return model.cache.save(directory) if model.cache.misses else directory


def latest_policy(
    warehouse: Warehouse,
    policy_kind: str = "sft",
    policy_id: str | None = None,
    *,
    reward_source: str | None = None,
    estimator: str | None = None,
) -> dict:
    """The newest ``policies`` row of a kind (``sft`` | ``rl``: the ``policies.kind`` column; for
    ``rl``, of one reward source when given, and of one estimator when given too), or the one named,
    with its checkpoint resolved."""
    if policy_id:
        where, params = "policy_id = ?", [policy_id]
    elif reward_source:
        where, params = "kind = ? AND reward_source = ?", [policy_kind, reward_source]
        if estimator:  # rows from before the column existed were REINFORCE++ runs
            where += " AND coalesce(estimator, 'reinforce_pp') = ?"
            params.append(estimator)
    else:
        where, params = "kind = ?", [policy_kind]
    rows = warehouse.query(f"SELECT * FROM policies WHERE {where} ORDER BY created_at DESC LIMIT 1", params).to_pylist()
    if not rows:
        wanted = (
            f"policy {policy_id}"
            if policy_id
            else f"{policy_kind} policy"
            + (f" trained with reward {reward_source}" if reward_source else "")
            + (f" and estimator {estimator}" if reward_source and estimator else "")
        )
        # a named policy that is missing is more likely a typo than a stage that has not run
        first = "" if policy_id else ": materialize policy_sft first (stepwise rl)"
        raise PolicyNotFoundError(f"no {wanted} in the warehouse{first}")
    row = rows[0]
    row["checkpoint"] = warehouse.resolve(row["checkpoint_path"])
    return row


def latest_sft_policy(warehouse: Warehouse, policy_id: str | None = None) -> dict:
    """The newest SFT policy, or the one named, which must be an SFT policy (an RL policy's id names
    no task blocks to start runs from or report on)."""
    row = latest_policy(warehouse, "sft", policy_id)
    if row["kind"] != "sft":
        raise PolicyNotFoundError(f"{row['policy_id']} is an {row['kind']} policy, not an SFT policy")
    return row


def imitation_trajectories(warehouse: Warehouse, task_id: str, limit: int) -> Iterator[Trajectory]:
    """What SFT imitates for a task: up to ``limit`` successful episodes of an expert purpose
    (human demonstrations, the rollouts asset's scripted and noisy experts), never an evaluation
    episode or a policy's own. ``episode_id`` order: a fixed sample (demonstration ids are hashes)."""
    return load_trajectories(
        warehouse,
        "e.episode_id IN (SELECT episode_id FROM episodes WHERE task_id = ? AND success "
        f"AND {purpose_filter('purpose', IMITATION_PURPOSES)} ORDER BY episode_id LIMIT ?)",
        [task_id, limit],
    )
