"""One RL iteration path for every policy family (issue 40, item 2).

An RL run, whatever its policy, repeats one iteration (ProgRM §3.3, Algorithm 1's outer loop):
sample episodes with the acting policy on the iteration's training instances, turn them into
per-step rewards with the run's reward source, update the policy, publish the iteration
(``episodes``, ``steps``, ``rollout_attempts``, ``rl_iterations``, ``rl_step_rewards`` with its
lineage), then checkpoint (weights, optimiser state and :class:`RunState`), so a killed run resumes
after its last published iteration and records none twice.

What differs between policy families is behind :class:`PolicyTrainer`, one per family, as TRL
keeps one trainer per method: the learned CPU policy's (:mod:`training.rl.runs`: candidate
scoring, REINFORCE++/GRPO/PPO with :class:`~training.rl.learner.Learner`) and the LLM's
(:mod:`training.rl.llm_runs`: token-level REINFORCE++ with
:class:`~training.rl.llm_learner.LLMLearner`). Everything else, the order of the steps above, the
rows written and the run state, is here once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from envs.pool import EnvPool
from envs.pool_jobs import BatchResult
from envs.protocol import EpisodeRecord
from training.policy.episodes import Log, episode_outputs
from training.policy.rollouts import Rollout
from training.rl.rewards.admire import MilestoneStore, TaskMilestones
from training.rl.rewards.base import RewardSource
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.storage import replace_dir_atomic
from warehouse.tables_rl import RL_ITERATIONS, RL_STEP_REWARDS


@dataclass
class RunState:
    """What a checkpoint holds besides the weights and the optimiser (its ``state.json``)."""

    iteration: int = 0  # iterations completed
    env_steps: int = 0
    milestones: dict = field(default_factory=dict)  # ADMIRE's milestones learned so far, by task
    reward_model_id: str | None = None  # the model the rewards came from (None: no model, or an old checkpoint)


@dataclass(frozen=True)
class SampledIteration:
    """An iteration's episodes as the acting policy sampled them.

    ``kept`` are the episodes with a recorded decision for every step (only those can be learned
    from); ``rollouts`` are the same episodes as the reward source reads them, and ``step_logp`` /
    ``step_candidates`` their per-step log-probabilities and candidate counts (None where the
    policy chooses among no enumerated candidates, as an LLM writes its answer). ``decisions``
    holds what the family's update learns from, per kept episode (the CPU policy's
    ``StepDecision``s, the LLM's ``TurnRecord``s), and ``note`` its figures for the log line."""

    acting_id: str
    result: BatchResult
    kept: list[EpisodeRecord]
    rollouts: list[Rollout]
    step_logp: list[list[float]]
    step_candidates: list[list[int | None]]
    seconds: float
    decisions: list[Any]
    note: str = ""


@dataclass(frozen=True)
class IterationUpdate:
    """What one policy update reports. ``advantages`` holds one array per kept episode where the
    estimator has per-step advantages, and is empty where they are per token (the LLM's)."""

    loss: float
    kl_to_reference: float
    clip_fraction: float
    entropy: float | None = None
    value_loss: float | None = None
    advantages: Sequence[np.ndarray] = ()
    note: str = ""  # the family's own figures for the iteration's log line, e.g. ", entropy 0.412"


class PolicyTrainer(Protocol):
    """A policy family's side of an RL iteration."""

    def sample(self, pool: EnvPool, iteration: int) -> SampledIteration:
        """Sample the iteration's episodes on its training instances (fails if none is usable)."""
        ...

    def update(self, sample: SampledIteration, rewards: Sequence[np.ndarray]) -> IterationUpdate:
        """One policy update from the sampled episodes (``sample.decisions``) and their per-step rewards."""
        ...

    def save_weights(self, folder: Path) -> None:
        """Write the weights and the optimiser state into ``folder`` (the checkpoint being made)."""
        ...

    def load_weights(self, folder: Path) -> None:
        """Restore the weights and the optimiser state from a checkpoint folder."""
        ...


@dataclass(frozen=True)
class IterationTarget:
    """Where and as what a run's iterations are published."""

    asset: str  # the Dagster asset whose materializations the iterations are
    code_version: str
    partition_key: str | None
    dataset_prefix: str  # each iteration's staged tables go under "<prefix>/<run key>/i<iteration>"
    run_key: str
    reward_source: str
    estimator: str
    rl_seed: int
    settings: dict[str, Any]
    lineage: list[LineageInput]
    run_id: str
    iterations: int  # the run's length, for the log line


def reward_model_of(source: RewardSource) -> str | None:
    """The reward model a source scores with, local or served (None: the outcome, ADMIRE)."""
    scorer = getattr(source, "scorer", None)
    model_id = getattr(scorer, "model_id", None)
    return str(model_id) if model_id else None


def checkpoint_state(checkpoint: Path) -> RunState | None:
    """The :class:`RunState` a checkpoint folder holds (its ``state.json``); None before the first
    checkpoint. Older checkpoints lack the later fields, which keep their defaults."""
    state_file = checkpoint / "state.json"
    return RunState(**json.loads(state_file.read_text())) if state_file.exists() else None


def resume_run(trainer: PolicyTrainer, source: RewardSource, checkpoint: Path, run_key: str, log: Log) -> RunState:
    """The run's state: from its last checkpoint (weights, optimiser and ADMIRE's milestones
    restored), else a fresh one. The reward model is the source's (the caller pins a resumed run's
    source to the model its checkpoint recorded: :func:`checkpoint_state`)."""
    state = checkpoint_state(checkpoint)
    if state is None:
        return RunState(reward_model_id=reward_model_of(source))
    trainer.load_weights(checkpoint)
    state.reward_model_id = reward_model_of(source)
    store = getattr(source, "store", None)
    if isinstance(store, MilestoneStore):
        for task, m in state.milestones.items():
            store.tasks[task] = TaskMilestones(m["milestones"], m["exemplar"], m["exemplar_steps"], m["version"])
    log(f"{run_key}: resuming after iteration {state.iteration} ({state.env_steps} environment steps)")
    return state


def run_iteration(
    warehouse: Warehouse,
    trainer: PolicyTrainer,
    source: RewardSource,
    pool: EnvPool,
    target: IterationTarget,
    state: RunState,
    *,
    iteration: int,
    checkpoint: Path,
    log: Log,
) -> None:
    """One iteration: sample, reward, update, publish, then checkpoint into ``checkpoint``
    (replaced whole); ``state`` counts it."""
    sample = trainer.sample(pool, iteration)
    started = time.perf_counter()
    batch = source.rewards(sample.rollouts, iteration)
    reward_s = time.perf_counter() - started
    started = time.perf_counter()
    update = trainer.update(sample, batch.rewards)
    update_s = time.perf_counter() - started
    state.iteration = iteration + 1
    state.env_steps += sample.result.steps
    store = getattr(source, "store", None)
    if isinstance(store, MilestoneStore):
        state.milestones = {t: asdict(m) for t, m in store.tasks.items()}
    seconds = (sample.seconds, reward_s, update_s)
    publish_iteration(warehouse, target, iteration, sample, batch.rewards, batch.details, update, seconds, state)

    def write(folder: Path) -> None:
        trainer.save_weights(folder)
        (folder / "state.json").write_text(json.dumps(asdict(state)))

    replace_dir_atomic(checkpoint, write)
    log(
        f"{target.run_key} iteration {iteration + 1}/{target.iterations}: "
        f"success {np.mean([r.success for r in sample.kept]):.2f}, "
        f"reward {np.mean([float(np.sum(x)) for x in batch.rewards]):.3f}, KL {update.kl_to_reference:.4f}"
        f"{update.note}{sample.note}; rollout {seconds[0]:.1f} s, reward {reward_s:.1f} s, update {update_s:.1f} s"
    )


def publish_iteration(
    warehouse: Warehouse,
    target: IterationTarget,
    iteration: int,
    sample: SampledIteration,
    rewards: Sequence[np.ndarray],
    details: dict,
    update: IterationUpdate,
    seconds: tuple[float, float, float],
    state: RunState,
) -> None:
    """The iteration's episodes, its ``rl_iterations`` row and one ``rl_step_rewards`` row per step
    (reward, advantage where the estimator has one per step, the chosen action's log-probability),
    in one publish."""
    m = Materialization(
        asset=target.asset,
        run_id=target.run_id,
        partition_key=target.partition_key,
        code_version=target.code_version,
        parameters={"run_key": target.run_key, "iteration": iteration, "settings": target.settings},
        inputs=target.lineage,
    )
    kept = sample.kept
    dataset = f"{target.dataset_prefix}/{target.run_key}/i{iteration:03d}"
    row = {
        "run_key": target.run_key,
        "iteration": iteration,
        "policy_id": sample.acting_id,
        "reward_source": target.reward_source,
        "estimator": target.estimator,
        "rl_seed": target.rl_seed,
        "episodes": len(kept),
        "steps": sum(r.n_steps for r in kept),
        "env_steps_total": state.env_steps,
        "success_rate": float(np.mean([r.success for r in kept])),
        "mean_env_return": float(np.mean([sum(s.env_reward for s in r.steps) for r in kept])),
        "mean_reward": float(np.mean([float(np.sum(x)) for x in rewards])),
        "kl_to_reference": update.kl_to_reference,
        "entropy": update.entropy,
        "loss": update.loss,
        "clip_fraction": update.clip_fraction,
        "value_loss": update.value_loss,
        "seconds_rollout": seconds[0],
        "seconds_reward": seconds[1],
        "seconds_update": seconds[2],
        "reward_details": json.dumps(details, sort_keys=True, default=str),
        "created_at": datetime.now(UTC),
    }
    advantages = list(update.advantages) or [np.empty(0)] * len(kept)
    step_rows = [
        {
            "episode_id": r.episode_id,
            "step_idx": t,
            "run_key": target.run_key,
            "iteration": iteration,
            "reward_source": target.reward_source,
            "reward": float(reward[t]),
            "advantage": float(adv[t]) if t < len(adv) else None,
            "logp": logp,
            "n_candidates": n_candidates,
        }
        for r, reward, adv, logps, candidates in zip(
            kept, rewards, advantages, sample.step_logp, sample.step_candidates, strict=True
        )
        for t, (logp, n_candidates) in enumerate(zip(logps, candidates, strict=True))
    ]
    outputs = episode_outputs(warehouse, sample.result, dataset, m, target.run_id, EpisodePurpose.RL_TRAINING) + [
        warehouse.stage_table("rl_iterations", dataset, pa.Table.from_pylist([row], schema=RL_ITERATIONS), m),
        warehouse.stage_table("rl_step_rewards", dataset, pa.Table.from_pylist(step_rows, schema=RL_STEP_REWARDS), m),
    ]
    warehouse.publish(m, outputs)
