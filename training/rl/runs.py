"""The RL stage: RL runs from an SFT policy (one per reward source and seed), their evaluation on
held-out seeds, and the Table-1 report (ProgRM §3, Table 1). The SFT policy and its task blocks
come from the SFT stage (:mod:`training.policy.sft_stage`); episodes on the pool and the tables
they land in from :mod:`training.policy.episodes`.

* :func:`run_rl`: iterations of sampling episodes on *training* seeds (temperature 1) in live
  MiniWoB++ through the worker pool, rewards from the run's source, one update by the estimator.
  Every episode of every iteration lands in ``episodes``/``steps`` (policy_id names the acting
  policy, lineage names the reward model), with ``rl_iterations`` and ``rl_step_rewards``, in one
  publish per iteration; then a checkpoint. A killed run resumes from its last checkpoint and
  loses no iteration (an iteration published but not checkpointed is run again and replaced).

A run's held-out evaluation and the Table-1 report's data: :mod:`training.rl.evaluation`.

Seed ranges never meet: training, selection and held-out seeds are drawn from disjoint ranges.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from envs.pool import EnvPool
from envs.protocol import EpisodeRecord
from envs.task_catalog import CatalogTask
from training.base.states import StepState, describe_action
from training.llm.chat_client import ChatClient, ChatEndpoint, ChatEndpointError
from training.policy.episodes import (
    Log,
    PolicyStageError,
    PoolFactory,
    catalog_tasks,
    episode_jobs,
    run_episodes,
)
from training.policy.evaluation import (
    sample_seeds,
)
from training.policy.learned import LearnedPolicy, PolicyModel, StepDecision
from training.policy.store import (
    TRAIN_SEED_BASE,
    keep_policy_cache,
    latest_policy,
    latest_sft_policy,
    warm_policy_cache,
)
from training.policy.task_blocks import DENSE_BLOCK, SPARSE_BLOCK, TASK_BLOCKS, task_blocks
from training.reward_models.scoring import LocalScorer, load_scorer
from training.rl.iterations import (
    IterationTarget,
    IterationUpdate,
    RunState,
    SampledIteration,
    checkpoint_state,
    resume_run,
    reward_model_of,
    run_iteration,
)
from training.rl.learner import CriticState, EpisodeExperience, Learner, LearnerSettings, PRMCritic
from training.rl.report import (
    learning_curves_plot,
)
from training.rl.rewards import (
    REWARD_SOURCES,
    SOURCE_MODEL_KIND,
    RewardSource,
    Rollout,
    check_reward_source,
    make_reward_source,
)
from training.rl.rewards.admire import LLMMilestones
from training.rl.rewards.base import text_trajectory
from training.rl.rewards.composed import DECAY_RATE, DECAY_WEIGHT, parse_composition
from training.rl.rewards.orm import ORM_RULE_BY_BLOCK, ORM_RULES
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.storage import git_revision, replace_dir_atomic
from warehouse.tables_rl import POLICIES

# 2: the ORM reward judges with its report's threshold; 3: the PRM pays 2 P(correct) - 1;
# 4: common random numbers (an iteration's instances do not depend on the reward source);
# 5: the PPO critic judges (state, candidate action) pairs, as the PRM it starts from was trained;
# 6: the acting policy's draws are keyed by (RL seed, SFT policy, iteration, instance), not the run key
RL_CODE_VERSION = "rl-6"

#: A run variant's suffix for REINFORCE++ with its KL penalty kept out of the batch normalisation
#: (estimator ``reinforce_pp_kl_apart``, estimators.py): ``outcome_kl_apart``,
#: ``outcome+progrm_env:shaped_kl_apart``: the same reward, another normalisation.
KL_APART_SUFFIX = "_kl_apart"

#: The runs of the experiment by partition key: a reward source with ProgRM's REINFORCE++, the same
#: with the KL kept apart (:data:`KL_APART_SUFFIX`), and each paper's own estimator for its source
#: (ADMIRE: step-level GRPO; GUI-Shepherd: PPO).
RUN_VARIANTS: dict[str, tuple[str, str]] = {
    **{source: (source, "reinforce_pp") for source in REWARD_SOURCES},
    **{f"{source}{KL_APART_SUFFIX}": (source, "reinforce_pp_kl_apart") for source in REWARD_SOURCES},
    "admire_grpo": ("admire", "grpo"),
    "prm_ppo": ("prm", "ppo"),
    "outcome_rloo": ("outcome", "rloo"),
}
#: The Table-1 experiment: every source with the same estimator.
TABLE_ONE_VARIANTS: tuple[str, ...] = ("outcome", "orm", "progrm_lcs", "progrm_env", "prm", "admire")
#: RL seeds (the rl_run partitions): the Table-1 issue asks five on the sparse block, three elsewhere;
#: s5 .. s9 are there to replicate a finding on seeds it was not found on, and s10 .. s19 (added
#: after stop 64 had used s0 .. s9 on the sparse block) to replicate it again, registered first.
RL_SEEDS: tuple[str, ...] = tuple(f"s{n}" for n in range(20))


#: The rl_run partitions' second dimension (issue 41 item 7): an RL seed on the dense block (``s0``,
#: the keys runs have always had) or on the sparse block (``sparse-s0``), so a sparse and a dense run
#: of one source and seed are two partitions, each with its own history in the UI.
RL_SEED_KEYS: tuple[str, ...] = RL_SEEDS + tuple(f"{SPARSE_BLOCK}-{s}" for s in RL_SEEDS)


def seed_key(block: str, rl_seed: int) -> str:
    """The rl_run partition seed key of an RL seed on a block (:data:`RL_SEED_KEYS`)."""
    return f"s{rl_seed}" if block == DENSE_BLOCK else f"{block}-s{rl_seed}"


def split_seed_key(key: str) -> tuple[str, int]:
    """(block, RL seed) of an rl_run partition seed key: ``s<n>`` (dense) or ``<block>-s<n>``."""
    block, _, seed = key.rpartition("-")
    block = block or DENSE_BLOCK
    if block not in TASK_BLOCKS or not (seed.startswith("s") and seed[1:].isdigit()):
        raise ValueError(f"an RL seed key is s<number> (dense block) or sparse-s<number>, got {key!r}")
    return block, int(seed[1:])


class RLStageError(PolicyStageError):
    """The RL stage cannot start or go on: no SFT policy, no task to train on, no usable episodes."""


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RLSettings:
    """One RL run: the reward source, the estimator, the seed and the environment-step budget."""

    reward_source: str
    estimator: str = "reinforce_pp"
    rl_seed: int = 0
    iterations: int = 10
    instances_per_task: int = 4  # task instances (seeds) per iteration
    group_size: int = 4  # episodes per instance (GRPO / RLOO groups)
    workers: int = 2
    temperature: float = 1.0
    progress_k: int = 1  # ProgRM Eq. 2's history
    reward_endpoint: str | None = None  # a reward-model HTTP service instead of the local checkpoint
    milestone_endpoint: str | None = None  # an OpenAI-compatible base URL for ADMIRE's milestones
    milestone_model: str = "default"
    learner: LearnerSettings = field(default_factory=LearnerSettings)
    block: str = DENSE_BLOCK  # the SFT policy's task block the run trains on (dense | sparse)
    # A registered reward model of the source's kind to train against (e.g. a flywheel round's);
    # None: the newest of its kind. PPO's critic starts from it when the source is the PRM.
    reward_model_id: str | None = None
    # How the ORM pays (ORM_RULES); None: the block's rule, fixed before any run (ORM_RULE_BY_BLOCK).
    orm_rule: str | None = None
    # A composed source's decaying weight (outcome+<source>:decay): lambda_0 and its rate per
    # iteration (ADMIRE App. A.1.2); in the run key only for such a source.
    dense_weight: float = DECAY_WEIGHT
    dense_decay: float = DECAY_RATE
    # Common random numbers (issue 41 item 4): the acting policy's draws keyed by (RL seed, SFT
    # policy, iteration, instance), shared by every source. False: keyed by the run (rl-5's
    # keying), kept only to measure what the sharing buys; in the run key only when False.
    common_sampling: bool = True

    def __post_init__(self) -> None:
        check_reward_source(self.reward_source)
        if self.block not in TASK_BLOCKS:
            raise ValueError(f"unknown task block {self.block!r}; choose one of {', '.join(TASK_BLOCKS)}")
        if self.learner.estimator != self.estimator:
            object.__setattr__(self, "learner", replace(self.learner, estimator=self.estimator))
        if self.iterations < 1 or self.instances_per_task < 1 or self.group_size < 1:
            raise ValueError("iterations, instances_per_task and group_size must be at least 1")
        if self.reward_model_id is not None and SOURCE_MODEL_KIND[self.reward_source] is None:
            raise ValueError(f"the {self.reward_source} reward uses no reward model to pin ({self.reward_model_id})")
        if self.orm_rule is not None and self.orm_rule not in ORM_RULES:
            raise ValueError(f"unknown ORM rule {self.orm_rule!r}; choose one of {', '.join(ORM_RULES)}")
        composition = parse_composition(self.reward_source)
        if (composition.source if composition else self.reward_source) != "orm":
            object.__setattr__(self, "orm_rule", None)  # only the ORM has a rule; other keys stay as they were
        elif self.orm_rule is None:
            object.__setattr__(self, "orm_rule", ORM_RULE_BY_BLOCK[self.block])

    def run_key(self, sft_policy_id: str) -> str:
        """``<source>-<estimator>-s<seed>-<hash>``: the hash covers the SFT policy the run starts
        from and every other setting that changes what it learns (not the budget of iterations,
        which a resumed run may extend, nor where rewards are computed). A pinned reward model is
        part of the hash; "the newest" is not (so keys made before pinning existed stand): an
        unpinned run keeps the model it started with (:func:`run_reward_model`). The ORM's rule is
        in the hash only where it is not ProgRM's threshold, so keys made before the rule existed
        stand where the run does what it did then."""
        settings = asdict(self) | {"sft_policy_id": sft_policy_id, "code_version": RL_CODE_VERSION}
        for name in ("reward_source", "estimator", "rl_seed", "workers", "reward_endpoint", "iterations"):
            settings.pop(name)
        if settings["reward_model_id"] is None:
            settings.pop("reward_model_id")
        if settings["orm_rule"] in (None, "threshold"):
            settings.pop("orm_rule")
        if not self.reward_source.endswith(":decay"):  # keys made before composed sources stand
            settings.pop("dense_weight")
            settings.pop("dense_decay")
        if self.common_sampling:  # keys made before the switch stand
            settings.pop("common_sampling")
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:6]
        return f"{self.reward_source}-{self.estimator}-s{self.rl_seed}-{digest}"


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# RL runs
# ---------------------------------------------------------------------------------------------


def _critic_states(record: EpisodeRecord, decisions: Sequence[StepDecision]) -> list[CriticState]:
    """Each step's state as the PRM reads it, with the policy's candidates there as the PRM reads
    actions (the critic judges those pairs, never a state without an action)."""
    trajectory = text_trajectory(record)
    return [
        CriticState(
            StepState(trajectory.instruction, tuple(s.action for s in trajectory.steps[:t]), step.screen_lines),
            tuple(describe_action(action, recorded.screen) for action in decision.actions),
        )
        for t, (step, recorded, decision) in enumerate(zip(trajectory.steps, record.steps, decisions, strict=True))
    ]


@dataclass
class _RLRun:
    """An RL run of the learned CPU policy: its SFT policy, the model, reward source, learner and
    folder; the CPU family's :class:`~training.rl.iterations.PolicyTrainer` (sample with
    candidate scoring, update with :class:`~training.rl.learner.Learner`)."""

    settings: RLSettings
    sft: dict
    tasks: list[CatalogTask]
    model: PolicyModel
    source: RewardSource
    critic: PRMCritic | None
    learner: Learner
    run_key: str
    run_dir: Path
    log: Log = print

    @property
    def checkpoint(self) -> Path:
        """The folder of the run's latest checkpoint."""
        return self.run_dir / "checkpoint"

    def sample(self, pool: EnvPool, iteration: int) -> SampledIteration:
        """An iteration's episodes on its training seeds, sampled at the run's temperature."""
        settings, sft_id = self.settings, self.sft["policy_id"]
        acting_id = f"rl:{self.run_key}:{sft_id}:i{iteration:03d}"
        policy = LearnedPolicy(
            self.model,
            policy_id=acting_id,
            temperature=settings.temperature,
            record=True,
            sampling_stream=sampling_stream(settings, sft_id, iteration),
        )
        jobs = episode_jobs(self.tasks, training_seeds(settings, sft_id, iteration), acting_id, settings.group_size)
        result, rollout_s = run_episodes(pool, jobs, policy, f"{self.run_key} iteration {iteration + 1}", self.log)
        # Only episodes with a recorded decision for every step can be learned from.
        kept = [r for r in result.episodes if len(policy.decisions.get(r.episode_id, [])) == r.n_steps and r.n_steps]
        if not kept:
            raise RLStageError(f"{self.run_key}: iteration {iteration} produced no usable episode")
        decisions = [policy.decisions[r.episode_id] for r in kept]
        return SampledIteration(
            acting_id=acting_id,
            result=result,
            kept=kept,
            rollouts=[
                Rollout(r, descriptions=tuple(d.action_texts[d.chosen] for d in ds))
                for r, ds in zip(kept, decisions, strict=True)
            ],
            step_logp=[[d.logp for d in ds] for ds in decisions],
            step_candidates=[[d.n_candidates for d in ds] for ds in decisions],
            seconds=rollout_s,
            decisions=decisions,
        )

    def update(self, sample: SampledIteration, rewards: Sequence[np.ndarray]) -> IterationUpdate:
        """One update of the learner on the episodes' decisions, grouped by task instance."""
        experience = [
            EpisodeExperience(
                decisions=decisions,
                rewards=np.asarray(step_rewards, dtype=np.float64),
                group=f"{r.task_id}:{r.seed}",
                states=_critic_states(r, decisions) if self.critic is not None else [],
            )
            for r, decisions, step_rewards in zip(sample.kept, sample.decisions, rewards, strict=True)
        ]
        stats = self.learner.update(experience)
        return IterationUpdate(
            loss=stats.loss,
            kl_to_reference=stats.kl_to_reference,
            clip_fraction=stats.clip_fraction,
            entropy=stats.entropy,
            value_loss=stats.value_loss,
            advantages=stats.advantages,
            note=f", entropy {stats.entropy:.3f}",
        )

    def save_weights(self, folder: Path) -> None:
        """The policy's weights and the learner's state (optimiser, critic)."""
        self.model.save(folder)
        torch.save(self.learner.state_dict(), folder / "learner.pt")

    def load_weights(self, folder: Path) -> None:
        """Restore what :meth:`save_weights` wrote (the encoder is the run's, shared)."""
        self.model.copy_weights_from(PolicyModel.load(folder, encoder=self.model.encoder))
        self.learner.load_state_dict(torch.load(folder / "learner.pt", weights_only=False))


def run_rl(
    warehouse: Warehouse,
    settings: RLSettings,
    pool_factory: PoolFactory,
    *,
    run_id: str,
    sft_policy_id: str | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """One RL run from the SFT policy (see the module docstring); returns the asset's metadata."""
    torch.set_num_threads(2)
    run = _prepare_rl_run(warehouse, settings, sft_policy_id, log)
    state = resume_run(run, run.source, run.checkpoint, run.run_key, log)
    lineage = run.source.lineage() + [
        LineageInput(
            kind="asset", input_asset="policy_sft", path=run.sft["checkpoint_path"], version=run.sft["policy_id"]
        )
    ]
    target = IterationTarget(
        asset="rl_run",
        code_version=f"{RL_CODE_VERSION}+{git_revision()}",
        partition_key=f"{settings.reward_source}|{seed_key(settings.block, settings.rl_seed)}",
        dataset_prefix="rl",
        run_key=run.run_key,
        reward_source=settings.reward_source,
        estimator=settings.estimator,
        rl_seed=settings.rl_seed,
        settings=asdict(settings),
        lineage=lineage,
        run_id=run_id,
        iterations=settings.iterations,
    )
    if state.iteration > settings.iterations:
        log(
            f"{run.run_key} has trained {state.iteration} iterations already, more than the {settings.iterations} "
            f"asked: nothing is trained, and its policy stays the {state.iteration}-iteration one"
        )
    with pool_factory(settings.workers) as pool:
        for iteration in range(state.iteration, settings.iterations):
            run_iteration(
                warehouse, run, run.source, pool, target, state, iteration=iteration, checkpoint=run.checkpoint, log=log
            )
    keep_policy_cache(run.model, warehouse.home)
    return _register_rl_policy(warehouse, settings, run, state, run_id)


def _prepare_rl_run(warehouse: Warehouse, settings: RLSettings, sft_policy_id: str | None, log: Log) -> _RLRun:
    """Load the SFT policy, its tasks, the reward source and the learner (a missing model fails here)."""
    sft = latest_sft_policy(warehouse, sft_policy_id)
    tasks = catalog_tasks(task_blocks(sft)[settings.block])
    if not tasks:
        raise RLStageError(f"the SFT policy {sft['policy_id']} chose no tasks for RL in the {settings.block} block")
    run_key = settings.run_key(sft["policy_id"])
    run_dir = warehouse.home / "policies" / "rl" / sft["policy_id"] / run_key
    reward_model_id = settings.reward_model_id
    if reward_model_id is None and SOURCE_MODEL_KIND[settings.reward_source] and not settings.reward_endpoint:
        reward_model_id = run_reward_model(warehouse, run_key, run_dir / "checkpoint")  # None: a new run, the newest
    model = PolicyModel.load(sft["checkpoint"])
    warm_policy_cache(model, warehouse.home)
    reference = model.frozen_copy()
    milestone_generator = None
    if settings.milestone_endpoint:
        milestone_generator = LLMMilestones(
            ChatClient(ChatEndpoint(settings.milestone_endpoint, settings.milestone_model))
        )
        if settings.reward_source == "admire":
            try:  # down before any rollout: one line, not a run of silent fallbacks
                milestone_generator.check()
            except ChatEndpointError as exc:
                raise RLStageError(f"ADMIRE's milestone endpoint: {exc}") from None
    source = make_reward_source(  # loads the reward model now: a missing one fails before any rollout
        settings.reward_source,
        warehouse,
        cache=model.cache,
        endpoint=settings.reward_endpoint,
        progress_k=settings.progress_k,
        outcome_every_step=settings.estimator == "grpo",
        milestone_generator=milestone_generator,
        model_id=reward_model_id,
        orm_rule=settings.orm_rule or "threshold",
        gamma=settings.learner.gamma,
        dense_weight=settings.dense_weight,
        dense_decay=settings.dense_decay,
    )
    critic = None
    if settings.estimator == "ppo":
        prm = load_scorer(warehouse, "prm", model_id=reward_model_id if settings.reward_source == "prm" else None)
        if not isinstance(prm, LocalScorer):
            raise RLStageError("PPO's critic is initialised from a local PRM checkpoint, not a service")
        critic = PRMCritic(prm.scorer, settings.learner.critic_learning_rate, settings.learner.critic_top_k)
    learner = Learner(model, reference, settings.learner, critic=critic)
    return _RLRun(settings, sft, tasks, model, source, critic, learner, run_key, run_dir, log=log)


def rl_policy_id(run_key: str, sft_policy_id: str) -> str:
    """The policy id of an RL run's final checkpoint: ``rl-<run key>-<SFT policy id>``."""
    return f"rl-{run_key}-{sft_policy_id}"


def run_key_of_policy(policy_id: str, sft_policy_id: str) -> str:
    """The run key inside an id made by :func:`rl_policy_id`."""
    return policy_id.removeprefix("rl-").removesuffix(f"-{sft_policy_id}")


def run_reward_model(warehouse: Warehouse, run_key: str, checkpoint: Path | None = None) -> str | None:
    """The reward model a run has trained against. With its ``checkpoint`` folder: the checkpoint's
    record, or (checkpoints written before they kept it) the lineage of its published iterations;
    None without a checkpoint (a new run, or one started over: the newest model). Without: the
    lineage alone (the report's question about a finished run)."""
    if checkpoint is not None:
        saved = checkpoint_state(checkpoint)
        if saved is None:
            return None
        if saved.reward_model_id:
            return saved.reward_model_id
    rows = warehouse.query(
        "SELECT input_version FROM lineage WHERE asset = 'rl_run' AND input_asset = 'reward_model' "
        "AND json_extract_string(parameters, '$.run_key') = ? ORDER BY created_at DESC LIMIT 1",
        [run_key],
    ).to_pylist()
    return rows[0]["input_version"] if rows else None


def training_seeds(settings: RLSettings, sft_policy_id: str, iteration: int) -> list[int]:
    """The task instances of an iteration: fixed by the RL seed, the SFT policy the run starts from
    and the iteration, **not by the reward source or the estimator**, so that within an RL seed
    every source trains on the same instances in the same iteration (common random numbers: two
    sources are compared on the same draws, which narrows the paired comparison's variance)."""
    base = TRAIN_SEED_BASE + 10_000 * settings.rl_seed
    return sample_seeds(base, settings.instances_per_task, f"s{settings.rl_seed}|{sft_policy_id}|{iteration}")


def sampling_stream(settings: RLSettings, sft_policy_id: str, iteration: int) -> str:
    """The acting policy's sampling stream in an iteration, keyed like :func:`training_seeds` by
    the RL seed, the SFT policy and the iteration and not by the run key (issue 41 item 4): with
    the instance it seeds each episode's draws, so every source's first iteration (the same SFT
    weights) samples the same episodes, and later iterations draw the same numbers on each instance.
    Empty when ``settings.common_sampling`` is off: the policy then keys its draws by its own id,
    which names the run (rl-5's keying)."""
    if not settings.common_sampling:
        return ""
    return f"rl|s{settings.rl_seed}|{sft_policy_id}|i{iteration:03d}"


def _register_rl_policy(
    warehouse: Warehouse, settings: RLSettings, run: _RLRun, state: RunState, run_id: str
) -> dict[str, Any]:
    sft, run_key = run.sft, run.run_key
    policy_id = rl_policy_id(run_key, sft["policy_id"])
    final = run.run_dir / "final"
    replace_dir_atomic(final, run.model.save)
    m = Materialization(
        asset="rl_run",
        run_id=run_id,
        partition_key=f"{settings.reward_source}|{seed_key(settings.block, settings.rl_seed)}",
        code_version=f"{RL_CODE_VERSION}+{git_revision()}",
        parameters={"run_key": run_key, "settings": asdict(settings)},
        inputs=warehouse.current_inputs(["rl_iterations"]),
    )
    row = {
        "policy_id": policy_id,
        "kind": "rl",
        "reward_source": settings.reward_source,
        "estimator": settings.estimator,
        "rl_seed": settings.rl_seed,
        "parent_policy_id": sft["policy_id"],
        "checkpoint_path": warehouse.relative(final),
        "tasks": [t.task_id for t in run.tasks],  # its block's: what it is evaluated on
        "env_steps": state.env_steps,
        # the iterations the policy trained: a rerun asking fewer than a resumed run already did trains none
        "parameters": json.dumps(
            asdict(settings) | {"reward_model": reward_model_of(run.source), "iterations": state.iteration}, default=str
        ),
        "created_at": _now(),
        "run_id": run_id,
    }
    warehouse.publish(
        m, [warehouse.stage_table("policies", policy_id, pa.Table.from_pylist([row], schema=POLICIES), m)]
    )
    curves = warehouse.query("SELECT * FROM rl_iterations WHERE run_key = ? ORDER BY iteration", [run_key]).to_pylist()
    return {
        "policy_id": policy_id,
        "run_key": run_key,
        "iterations": state.iteration,
        "env_steps": state.env_steps,
        "checkpoint": final,
        "final_training_success": curves[-1]["success_rate"] if curves else None,
        "learning_curves": learning_curves_plot(curves, warehouse.home / "plots" / "rl" / f"{run_key}_curves.png"),
    }


# ---------------------------------------------------------------------------------------------
# Partitions and checks
# ---------------------------------------------------------------------------------------------


def rl_settings_for(variant: str, partition_seed: str, **overrides: Any) -> RLSettings:
    """The settings of the run a partition names (``variant`` of :data:`RUN_VARIANTS`, seed key
    ``s<n>`` or ``sparse-s<n>``: :func:`split_seed_key`). A ``block`` override must agree with the
    key's block (None: the key's)."""
    if variant not in RUN_VARIANTS:
        raise ValueError(f"unknown RL run {variant!r}; choose one of {', '.join(RUN_VARIANTS)}")
    block, rl_seed = split_seed_key(partition_seed)
    asked = overrides.pop("block", None)
    if asked is not None and asked != block:
        hint = f"the seed key {seed_key(asked, rl_seed)!r}" if asked in TASK_BLOCKS else f"one of {list(TASK_BLOCKS)}"
        raise ValueError(
            f"partition seed {partition_seed!r} is the {block} block, the config asks for {asked!r}: use {hint}"
        )
    source, estimator = RUN_VARIANTS[variant]
    learner_fields = {f for f in LearnerSettings.__dataclass_fields__}
    learner = LearnerSettings(
        estimator=estimator,
        seed=rl_seed,
        **{k: v for k, v in overrides.items() if k in learner_fields and k not in ("estimator", "seed")},
    )
    rest = {k: v for k, v in overrides.items() if k not in learner_fields}
    return RLSettings(reward_source=source, estimator=estimator, rl_seed=rl_seed, learner=learner, block=block, **rest)


def latest_rl_policy(warehouse: Warehouse, variant: str, partition_seed: str, sft_policy_id: str | None = None) -> dict:
    """The newest registered policy of a run (``variant`` x seed key, its block included) from the
    current SFT policy, whatever its other settings."""
    source, estimator = RUN_VARIANTS[variant]
    block, rl_seed = split_seed_key(partition_seed)
    sft = latest_sft_policy(warehouse, sft_policy_id)
    rows = warehouse.query(
        "SELECT policy_id FROM policies WHERE kind = 'rl' AND reward_source = ? AND estimator = ? AND rl_seed = ? "
        "AND parent_policy_id = ? AND coalesce(json_extract_string(parameters, '$.block'), ?) = ? "
        "ORDER BY created_at DESC LIMIT 1",
        [source, estimator, rl_seed, sft["policy_id"], DENSE_BLOCK, block],
    ).to_pylist()
    if not rows:
        raise RLStageError(
            f"no trained policy of run {variant} {partition_seed} from {sft['policy_id']}: materialize rl_run first"
        )
    return latest_policy(warehouse, policy_id=rows[0]["policy_id"])


def check_rl_run(warehouse: Warehouse, run_key: str, iterations: int) -> CheckOutcome:
    """Every iteration of the run is recorded once, and every step of its episodes has its reward."""
    rows = warehouse.query(
        "SELECT iteration FROM rl_iterations WHERE run_key = ? ORDER BY iteration", [run_key]
    ).to_pylist()
    seen = [r["iteration"] for r in rows]
    missing_rewards = warehouse.query(
        "SELECT count(*) AS n FROM steps s JOIN episodes e USING (episode_id) "
        "WHERE e.policy_id LIKE ? AND NOT EXISTS (SELECT 1 FROM rl_step_rewards r "
        "WHERE r.episode_id = s.episode_id AND r.step_idx = s.step_idx)",
        [f"rl:{run_key}:%"],
    ).to_pylist()[0]["n"]
    passed = seen == list(range(iterations)) and missing_rewards == 0
    return CheckOutcome(passed, {"iterations": seen, "expected": iterations, "steps_without_reward": missing_rewards})
