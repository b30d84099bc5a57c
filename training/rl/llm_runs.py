"""The LLM actor in the RL stage (issue 25): a pretrained causal LM, SFT on demonstrations, then
ProgRM's multi-turn REINFORCE++ in live MiniWoB++, with the same tables and lineage as the learned
CPU policy (:mod:`training.rl.runs`).

Every seed's agent is an LLM; on this CPU the one that can be had is SmolLM2-135M-Instruct
(:func:`training.base.pretrained.load_smollm2`); a folder in ``save_pretrained``'s layout takes its
place (:attr:`LLMRunSettings.model`). :func:`run_llm_agent` does, in order:

1. **Base**: greedy held-out episodes of the pretrained model (``policies.kind = 'llm_base'``).
2. **SFT** (ProgRM §3: the actor is supervised first; :mod:`training.llm.sft`):
   (actor prompt, the recorded action written as ProgRM Table 11's answer) pairs from successful
   expert episodes of the tasks (:func:`training.policy.store.imitation_trajectories`: human
   demonstrations and scripted-expert rollouts, never a policy's own or an evaluation episode),
   minibatches drawn by a seeded generator; then greedy held-out episodes (``llm_sft``).
3. **RL**: per iteration, episodes sampled at temperature 1 on training seeds (the same seed
   ranges and common-random-number rule as the CPU runs: an iteration's instances depend on the
   RL seed and the iteration only), rewards from the run's source (``Rollout.format_ok`` carries
   the parse flags for GUI-Shepherd Eq. 3), one :meth:`LLMLearner.update` with the SFT model as
   the KL reference; each iteration is published like a CPU run's (``episodes``, ``steps``,
   ``rollout_attempts``, ``rl_iterations``, ``rl_step_rewards``), then checkpointed (weights,
   optimiser, state): a killed run resumes after its last checkpoint. Greedy held-out episodes of
   the final model close the run (``llm_rl``).

Evaluations land in ``agent_eval`` / ``agent_eval_episodes`` (evaluation ``held_out``;
``policy_label`` ``llm_base``, ``llm_sft`` or ``llm_rl:<source>``). ProgRM Table 1
(:func:`training.rl.evaluation.run_rl_report`) reads the CPU policy's ``rl`` runs only;
:func:`llm_report` compares the three stages of an LLM agent on the same held-out seeds.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from envs.pool import EnvPool
from envs.task_catalog import CatalogTask
from training.base.pretrained import SMOLLM2_ALIAS
from training.llm.policy import LLM_EPISODE_CLOCK_MS, HFPolicy, TurnRecord
from training.llm.sft import sft_data, supervised_fine_tuning
from training.policy.episodes import (
    Log,
    PoolFactory,
    catalog_tasks,
    episode_jobs,
    episode_outputs,
    evaluation_outputs,
    run_episodes,
)
from training.policy.evaluation import EvalEpisode, eval_episode, sample_seeds
from training.policy.store import HELD_OUT_SEED_BASE, TRAIN_SEED_BASE
from training.rl.iterations import (
    IterationTarget,
    IterationUpdate,
    SampledIteration,
    checkpoint_state,
    resume_run,
    run_iteration,
)
from training.rl.llm_learner import (
    LLMLearner,
    LLMLearnerSettings,
    frozen_reference,
)
from training.rl.rewards import REWARD_SOURCES, SOURCE_MODEL_KIND, make_reward_source
from training.rl.runs import RLStageError
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.plotting import Markdown
from warehouse.purposes import EpisodePurpose
from warehouse.storage import git_revision, replace_dir_atomic
from warehouse.tables_rl import POLICIES

LLM_CODE_VERSION = "llm-rl-1"


@dataclass(frozen=True)
class LLMRunSettings:
    """One LLM agent: the model, its tasks, SFT, the RL run and the held-out evaluation.

    Defaults fit this 2-core CPU (SmolLM2 generates ~10-15 tokens/s here): two short catalog tasks,
    a few hundred SFT examples, a few RL iterations. ``learner`` defaults to ProgRM Table 6 except
    the learning rate (1e-5 for a 135M model) and the batch (16 turns: an iteration has fewer)."""

    model: str = SMOLLM2_ALIAS  # "smollm2" (training.base.pretrained) or a folder in save_pretrained's layout
    tasks: tuple[str, ...] = ("click-option", "enter-text")
    sft_steps: int = 60
    sft_batch: int = 8
    sft_learning_rate: float = 3e-5
    sft_examples_per_task: int = 150  # successful expert episodes per task to draw pairs from
    reward_source: str = "outcome"
    rl_seed: int = 0
    iterations: int = 3
    instances_per_task: int = 2
    group_size: int = 2
    temperature: float = 1.0
    max_new_tokens: int = 48
    # MiniWoB++'s episode clock: its 10 s ended every base episode of a model thinking 5-10 s a step
    # on this CPU before its second action
    episode_max_time_ms: int = LLM_EPISODE_CLOCK_MS
    held_out_seeds: int = 8
    workers: int = 2
    learner: LLMLearnerSettings = field(
        default_factory=lambda: LLMLearnerSettings(learning_rate=1e-5, batch_turns=16, micro_batch=2)
    )

    def __post_init__(self) -> None:
        if self.reward_source not in REWARD_SOURCES:
            raise ValueError(f"unknown reward source {self.reward_source!r}; choose one of {', '.join(REWARD_SOURCES)}")
        if not self.tasks:
            raise ValueError("an LLM agent needs at least one task")
        for name in ("sft_steps", "iterations", "held_out_seeds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sft_batch < 1 or self.instances_per_task < 1 or self.group_size < 1:
            raise ValueError("sft_batch, instances_per_task and group_size must be at least 1")

    def sft_key(self, base_id: str) -> str:
        """What the SFT model is a function of: the base model, the tasks and the SFT settings."""
        part = {k: getattr(self, k) for k in ("tasks", "sft_steps", "sft_batch", "sft_learning_rate")}
        part |= {"examples": self.sft_examples_per_task, "base": base_id, "code": LLM_CODE_VERSION}
        return _digest(part)

    def rl_key(self, sft_id: str) -> str:
        """``<source>-s<seed>-<hash>`` of everything that changes what the run learns (not the
        number of iterations, which a resumed run may extend, nor the number of workers)."""
        part = asdict(self) | {"sft": sft_id, "code": LLM_CODE_VERSION}
        for name in ("iterations", "workers", "held_out_seeds", "reward_source", "rl_seed", "episode_max_time_ms"):
            part.pop(name)
        return f"{self.reward_source}-s{self.rl_seed}-{_digest(part)}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------


def llm_training_seeds(settings: LLMRunSettings, iteration: int) -> list[int]:
    """An iteration's task instances: a function of the RL seed and the iteration only (common random
    numbers across reward sources), in the CPU runs' training range, salted apart from them."""
    base = TRAIN_SEED_BASE + 10_000 * settings.rl_seed
    return sample_seeds(base, settings.instances_per_task, f"llm|s{settings.rl_seed}|{iteration}")


def turn_logp(turn: TurnRecord) -> float:
    """log pi(answer | prompt) of a turn: the sum of its response tokens' log-probabilities."""
    return float(np.sum(turn.logp))


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def load_base_model(settings: LLMRunSettings, home: Path) -> tuple[Any, Any, str]:
    """(model, tokenizer, base policy id). A missing or corrupt model file fails here, in one line,
    before any episode (training.base.pretrained checks the GGUF)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.base.pretrained import load_smollm2, smollm2_gguf

    if settings.model == SMOLLM2_ALIAS:
        model, tokenizer = load_smollm2(home)
        source = str(smollm2_gguf())
    else:
        folder = Path(settings.model)
        if not (folder / "config.json").is_file():
            raise RLStageError(f"LLM model folder {folder}: no config.json (expected save_pretrained's layout)")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        source = str(folder.resolve())
    weights = sum(float(p.detach().double().sum()) for p in model.parameters())
    return model.eval(), tokenizer, f"llm-base-{_digest([source, round(weights, 3)])}"


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


@dataclass
class _Agent:
    """What the stages of one LLM agent share."""

    settings: LLMRunSettings
    warehouse: Warehouse
    tasks: list[CatalogTask]
    model: Any
    tokenizer: Any
    base_id: str
    run_id: str
    log: Log
    held_out: list[int] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    def policy(self, policy_id: str, *, greedy: bool, record: bool = False) -> HFPolicy:
        return HFPolicy(
            self.model,
            self.tokenizer,
            policy_id=policy_id,
            greedy=greedy,
            temperature=self.settings.temperature,
            max_new_tokens=self.settings.max_new_tokens,
            record=record,
            seed=self.settings.rl_seed,
        )


def run_llm_agent(
    warehouse: Warehouse, settings: LLMRunSettings, pool_factory: PoolFactory, *, run_id: str, log: Log = print
) -> dict[str, Any]:
    """Base -> SFT -> RL of an LLM agent, each evaluated greedily on the same held-out seeds (see
    the module docstring). Returns the asset's metadata: the three stages side by side."""
    torch.set_num_threads(2)
    tasks = catalog_tasks(settings.tasks)
    model, tokenizer, base_id = load_base_model(settings, warehouse.home)
    agent = _Agent(settings, warehouse, tasks, model, tokenizer, base_id, run_id, log)
    agent.held_out = sample_seeds(HELD_OUT_SEED_BASE, settings.held_out_seeds, "held_out")
    with pool_factory(settings.workers) as pool:
        _register(agent, base_id, "llm_base", None, warehouse.home / "models" / "llm", {"model": settings.model})
        _evaluate(agent, pool, base_id, "llm_base")
        sft_id = _supervise(agent)
        _evaluate(agent, pool, sft_id, "llm_sft")
        rl_id = _reinforce(agent, pool, sft_id)
        _evaluate(agent, pool, rl_id, f"llm_rl:{settings.reward_source}")
    return {"base": base_id, "sft": sft_id, "rl": rl_id, "stages": agent.stages, "peak_rss_mb": peak_rss_mb()}


def _register(
    agent: _Agent, policy_id: str, policy_kind: str, parent: str | None, checkpoint: Path, extra: dict
) -> None:
    """A ``policies`` row for one stage of the agent (the checkpoint it can be loaded from)."""
    w, s = agent.warehouse, agent.settings
    m = Materialization(
        asset="llm_agent",
        run_id=agent.run_id,
        code_version=f"{LLM_CODE_VERSION}+{git_revision()}",
        parameters={"policy_id": policy_id, "settings": asdict(s)},
        inputs=[],
    )
    row = {
        "policy_id": policy_id,
        "kind": policy_kind,
        "reward_source": s.reward_source if policy_kind == "llm_rl" else None,
        "estimator": "reinforce_pp" if policy_kind == "llm_rl" else None,
        "rl_seed": s.rl_seed if policy_kind == "llm_rl" else None,
        "parent_policy_id": parent,
        "checkpoint_path": w.relative(checkpoint),
        "tasks": list(s.tasks),
        "env_steps": extra.get("env_steps"),
        "parameters": json.dumps(
            {k: v for k, v in extra.items() if k != "env_steps"} | {"settings": asdict(s)}, default=str
        ),
        "created_at": datetime.now(UTC),
        "run_id": agent.run_id,
    }
    w.publish(m, [w.stage_table("policies", policy_id, pa.Table.from_pylist([row], schema=POLICIES), m)])


def _evaluate(agent: _Agent, pool: EnvPool, policy_id: str, label: str) -> list[EvalEpisode]:
    """Greedy episodes of the current weights on the held-out seeds, published as ``agent_eval``."""
    if not agent.held_out:
        return []
    policy = agent.policy(f"eval:{policy_id}", greedy=True)
    jobs = episode_jobs(agent.tasks, agent.held_out, f"eval:{policy_id}:held_out")
    result, seconds = run_episodes(pool, jobs, policy, f"{label} held-out evaluation", agent.log)
    episodes = [eval_episode(policy_id, r) for r in result.episodes]
    w = agent.warehouse
    m = Materialization(
        asset="llm_agent",
        run_id=agent.run_id,
        code_version=f"{LLM_CODE_VERSION}+{git_revision()}",
        parameters={"policy_id": policy_id, "evaluation": "held_out", "seeds": agent.held_out},
        inputs=w.current_inputs(["policies"]),
    )
    dataset = f"eval/{policy_id}/held_out"
    outputs = episode_outputs(w, result, dataset, m, agent.run_id, EpisodePurpose.EVALUATION)
    outputs += evaluation_outputs(w, episodes, "held_out", policy_label=label, rl_seed=None, dataset=dataset, m=m)
    w.publish(m, outputs)
    c = policy.counters
    stage = {
        "stage": label,
        "policy_id": policy_id,
        "episodes": len(episodes),
        "success_rate": float(np.mean([e.success for e in episodes])) if episodes else float("nan"),
        "format_ok_rate": c.format_ok_rate,
        "env_steps_per_s": result.steps / max(seconds, 1e-9),
        "tokens_per_s": c.generated_tokens / max(c.seconds, 1e-9),
        "prompt_tokens_per_step": c.prompt_tokens / max(1, c.steps),
        "format_failures": dict(c.format_failures),
        "lost": len(result.lost),
    }
    agent.stages.append(stage)
    agent.log(
        f"{label}: success {stage['success_rate']:.2f} on {len(episodes)} held-out episodes, well-formed "
        f"answers {c.format_ok_rate:.2f}, {stage['tokens_per_s']:.1f} tokens/s, "
        f"{stage['env_steps_per_s']:.2f} env steps/s, peak RSS {peak_rss_mb():.0f} MB"
    )
    return episodes


def _supervise(agent: _Agent) -> str:
    """SFT of the base model on the tasks' expert episodes (:mod:`training.llm.sft`); registered as
    ``llm_sft``. A model already trained with the same key is loaded instead of trained again."""
    s, w = agent.settings, agent.warehouse
    sft_id = f"llm-sft-{s.sft_key(agent.base_id)}"
    folder = w.home / "policies" / "llm" / sft_id
    if (folder / "config.json").is_file() and _registered(w, sft_id):
        agent.log(f"{sft_id}: trained before; loading it")
        _load_weights(agent.model, folder)
        return sft_id
    examples, counts = sft_data(w, agent.tasks, s.sft_examples_per_task, agent.tokenizer, 3072)
    if not examples:
        raise RLStageError(f"no SFT example for {list(s.tasks)}: {counts} (import demonstrations first)")
    started = time.perf_counter()
    before, after = supervised_fine_tuning(
        agent.model,
        examples,
        steps=s.sft_steps,
        batch=s.sft_batch,
        learning_rate=s.sft_learning_rate,
        seed=s.learner.seed,
        pad_id=agent.pad_id,
        log=agent.log,
    )
    agent.log(
        f"SFT: {counts}; probe NLL per answer token {before:.3f} -> {after:.3f} ({time.perf_counter() - started:.0f} s)"
    )
    replace_dir_atomic(folder, lambda d: (agent.model.save_pretrained(d), agent.tokenizer.save_pretrained(d)))
    _register(agent, sft_id, "llm_sft", agent.base_id, folder, counts | {"probe_nll": [before, after]})
    return sft_id


def _milestone_cache(reward_source: str) -> Any:
    """ADMIRE matches milestones by sentence encodings: it needs an encoding cache (MiniLM); the
    other sources need none."""
    if reward_source != "admire":
        return None
    from training.base.encoder import EmbeddingCache, EncoderConfig, SegmentEncoder

    return EmbeddingCache(SegmentEncoder.shared(EncoderConfig()))


def _registered(warehouse: Warehouse, policy_id: str) -> bool:
    try:
        rows = warehouse.query("SELECT 1 FROM policies WHERE policy_id = ?", [policy_id])
    except Exception:  # noqa: BLE001 - no policies view yet
        return False
    return rows.num_rows > 0


def _load_weights(model: Any, folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.load_state_dict(saved.state_dict())
    model.eval()


@dataclass
class _LLMRun:
    """An RL run of the LLM agent: the LLM family's :class:`~training.rl.iterations.PolicyTrainer`
    (sample with the HF policy, update with :class:`~training.rl.llm_learner.LLMLearner`)."""

    agent: _Agent
    learner: LLMLearner
    run_key: str

    def sample(self, pool: EnvPool, iteration: int) -> SampledIteration:
        """An iteration's episodes on its training seeds, sampled at the run's temperature."""
        s = self.agent.settings
        acting_id = f"llm-rl:{self.run_key}:i{iteration:03d}"
        policy = self.agent.policy(acting_id, greedy=False, record=True)
        jobs = episode_jobs(self.agent.tasks, llm_training_seeds(s, iteration), acting_id, s.group_size)
        result, rollout_s = run_episodes(
            pool, jobs, policy, f"{self.run_key} iteration {iteration + 1}", self.agent.log
        )
        kept = [r for r in result.episodes if r.n_steps and len(policy.turns.get(r.episode_id, [])) == r.n_steps]
        if not kept:
            raise RLStageError(f"{self.run_key}: iteration {iteration} produced no usable episode")
        turns = [policy.turns[r.episode_id] for r in kept]
        c = policy.counters
        return SampledIteration(
            acting_id=acting_id,
            result=result,
            kept=kept,
            rollouts=[policy.rollout(r) for r in kept],
            step_logp=[[turn_logp(turn) for turn in episode] for episode in turns],
            step_candidates=[[None] * len(episode) for episode in turns],
            seconds=rollout_s,
            decisions=turns,
            note=f", well-formed {c.format_ok_rate:.2f}, {c.generated_tokens / max(c.seconds, 1e-9):.1f} tokens/s",
        )

    def update(self, sample: SampledIteration, rewards: Sequence[np.ndarray]) -> IterationUpdate:
        """One REINFORCE++ update on the episodes' turns (advantages per token: none per step)."""
        stats = self.learner.update(list(zip(sample.decisions, rewards, strict=True)))
        return IterationUpdate(
            loss=stats.loss, kl_to_reference=stats.kl_to_reference, clip_fraction=stats.clip_fraction
        )

    def save_weights(self, folder: Path) -> None:
        """The model (``save_pretrained``) and the optimiser's state."""
        self.agent.model.save_pretrained(folder)
        torch.save(self.learner.optimizer.state_dict(), folder / "optimizer.pt")

    def load_weights(self, folder: Path) -> None:
        """Restore what :meth:`save_weights` wrote."""
        _load_weights(self.agent.model, folder)
        self.learner.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))


def _reinforce(agent: _Agent, pool: EnvPool, sft_id: str) -> str:
    """RL from the SFT model (see the module docstring); registered as ``llm_rl``."""
    s, w = agent.settings, agent.warehouse
    run_key = s.rl_key(sft_id)
    run_dir = w.home / "policies" / "llm_rl" / run_key
    reference = frozen_reference(agent.model)
    checkpoint = run_dir / "checkpoint"
    # a resumed run keeps the reward model its checkpoint recorded, as a CPU run does (not the newest)
    saved = checkpoint_state(checkpoint)
    source = make_reward_source(
        s.reward_source,
        w,
        cache=_milestone_cache(s.reward_source),
        gamma=s.learner.gamma_turn,
        model_id=saved.reward_model_id if saved is not None and SOURCE_MODEL_KIND[s.reward_source] else None,
    )
    total = s.iterations * len(agent.tasks) * s.instances_per_task * s.group_size
    learner_settings = replace(s.learner, total_steps=max(1, total // s.learner.batch_turns))
    # no lock: sampling and updates take turns in this loop, so no actor sees half-updated weights
    run = _LLMRun(agent, LLMLearner(agent.model, reference, learner_settings, pad_id=agent.pad_id), run_key)
    state = resume_run(run, source, checkpoint, run_key, agent.log)
    sft_folder = w.home / "policies" / "llm" / sft_id
    target = IterationTarget(
        asset="llm_agent",
        code_version=f"{LLM_CODE_VERSION}+{git_revision()}",
        partition_key=None,
        dataset_prefix="llm_rl",
        run_key=run_key,
        reward_source=s.reward_source,
        estimator="reinforce_pp",
        rl_seed=s.rl_seed,
        settings=asdict(s),
        lineage=[LineageInput(kind="asset", input_asset="llm_agent", path=w.relative(sft_folder), version=sft_id)],
        run_id=agent.run_id,
        iterations=s.iterations,
    )
    for iteration in range(state.iteration, s.iterations):
        run_iteration(w, run, source, pool, target, state, iteration=iteration, checkpoint=checkpoint, log=agent.log)
    rl_id = f"llm-rl-{run_key}"
    final = run_dir / "final"
    replace_dir_atomic(final, lambda d: (agent.model.save_pretrained(d), agent.tokenizer.save_pretrained(d)))
    _register(agent, rl_id, "llm_rl", sft_id, final, {"run_key": run_key, "env_steps": state.env_steps})
    return rl_id


def llm_report(stages: Sequence[dict]) -> Markdown:
    """The stages of an LLM agent side by side (a markdown table)."""
    lines = [
        "| stage | policy | held-out success | well-formed answers | tokens/s | env steps/s | prompt tokens/step |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for st in stages:
        lines.append(
            f"| {st['stage']} | {st['policy_id']} | {100 * st['success_rate']:.1f}% ({st['episodes']}) | "
            f"{100 * st['format_ok_rate']:.1f}% | {st['tokens_per_s']:.1f} | {st['env_steps_per_s']:.2f} | "
            f"{st['prompt_tokens_per_step']:.0f} |"
        )
    return Markdown("\n".join(lines))
