"""Training the LLM policy with RL: ProgRM's multi-turn REINFORCE++ at the token level.

RL (ProgRM §2.4, Table 6; the multi-turn credit assignment of its ref. [27], Wen et al.). For a
batch of episodes recorded by :class:`training.llm.policy.HFPolicy` (per turn: prompt and response
tokens and the acting model's log-probabilities) with one reward per turn:

1. every response token gets the KL estimate KL_{t,j} = log pi_old(w_{t,j}) - log pi_ref(w_{t,j})
   (REINFORCE++'s k1 estimator against the frozen reference, the SFT model);
2. token rewards r_{t,j} = -beta * KL_{t,j}, plus the turn's reward at its last token; returns go
   back with gamma_token inside a turn and gamma_turn between turns
   (:func:`training.rl.estimators.multi_turn_token_returns`);
3. the returns of all response tokens of the batch are normalised together (REINFORCE++'s
   global-batch normalisation instead of a critic): these are the advantages;
4. the PPO clipped surrogate (:func:`training.rl.estimators.ppo_clip_loss`), averaged over the
   response tokens of a minibatch, for ``epochs`` passes; AdamW with betas (0.9, 0.95) (ProgRM
   App. D), cosine schedule with 3% warm-up (Table 6).

Table 6 gives gamma 0.9, KL 0.01, clip 0.2, learning rate 7e-5 (for a 7B model; configurable),
batch size 64, 1 epoch, rollout temperature 1.0, ZeRO stage 3. The paper does not say which
discount "gamma" is; we read it as the inter-turn one and keep gamma_token = 1 (as Wen et al.'s
POAD does, as far as our notes recall). "Batch size 64" is read as 64 turns per optimiser step.
What the paper leaves open is flagged in ``training.rl.estimators``.

Constrained decoding (``HFPolicy(constrained=True)``): the behaviour policy is the model's
distribution renormalised over the tokens the action grammar allowed at each position. A turn
records those sets (``TurnRecord.masks``) and every log-probability here (the reference's, the
policy's in the ratio) is renormalised over the same sets (``response_logprobs(masks=...)``), so
the ratio starts at 1 and the KL term compares the two models on the same support; forced
tokens (one allowed token) have log-prob 0 under both and carry no gradient. Unconstrained turns
(``masks`` None) use the whole vocabulary, as before. With ``recompute_logp_old`` the learner
does not trust the recorded log-probs and recomputes them with its own model before the update
(for an actor that acts with other weights or another precision, e.g. an int8 copy).

The supervised warm-start that comes before RL is :mod:`training.llm.sft`.

DeepSpeed: ``use_deepspeed=True`` wraps the policy with ``deepspeed.initialize``
(:func:`deepspeed_engine`) using ``training/ds_zero3.json`` on a GPU (ZeRO-3, bf16) or
``training/ds_zero3_cpu.json`` on a CPU (ZeRO-3, fp32, torch's AdamW, gloo); "auto" values are
filled from the learner's settings the way the Hugging Face integration fills them. What ran
here (no GPU on this machine): both the plain-PyTorch path and DeepSpeed ZeRO-3 on CPU with a tiny
Qwen2 (one process, gloo), in the tests. The bf16 GPU path of ``ds_zero3.json`` (FusedAdam, NCCL,
several ranks under the ``deepspeed`` launcher, a 7B model, ``generate`` with ``synced_gpus``)
has NOT run here. The reference model stays a plain module, whole on every GPU (cast it to bf16:
15 GB for 7B), not partitioned.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.llm.policy import TurnRecord, response_logprobs
from training.llm.sft import SFTExample, answer_nll
from training.rl import estimators

REPO_ROOT = Path(__file__).resolve().parents[2]
DS_ZERO3 = REPO_ROOT / "training" / "ds_zero3.json"
DS_ZERO3_CPU = REPO_ROOT / "training" / "ds_zero3_cpu.json"


@dataclass(frozen=True)
class LLMLearnerSettings:
    """Update hyper-parameters; defaults are ProgRM Table 6 (learning rate: its value for 7B)."""

    learning_rate: float = 7e-5
    gamma_turn: float = estimators.GAMMA  # Table 6 "Gamma", read as the inter-turn discount
    gamma_token: float = 1.0  # intra-turn discount (unstated in the paper)
    kl_coef: float = estimators.KL_COEF
    clip: float = estimators.CLIP
    epochs: int = 1
    batch_turns: int = 64  # turns per optimiser step (Table 6 "batch size 64")
    micro_batch: int = 4  # sequences per forward pass (gradient accumulation inside a batch)
    betas: tuple[float, float] = (0.9, 0.95)  # ProgRM App. D
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_ratio: float = 0.03
    total_steps: int | None = None  # optimiser steps of the whole run, for the cosine schedule (None: constant)
    gradient_checkpointing: bool = False
    use_deepspeed: bool = False
    deepspeed_config: str | None = None  # None: ds_zero3.json with a GPU, ds_zero3_cpu.json without
    seed: int = 0
    recompute_logp_old: bool = False  # recompute pi_old with the learner's model instead of the recorded logp

    def __post_init__(self) -> None:
        if self.batch_turns < 1 or self.micro_batch < 1 or self.epochs < 1:
            raise ValueError("batch_turns, micro_batch and epochs must be >= 1")
        if not 0.0 <= self.gamma_turn <= 1.0 or not 0.0 <= self.gamma_token <= 1.0:
            raise ValueError("discounts must lie in [0, 1]")

    @property
    def accumulation_steps(self) -> int:
        return math.ceil(self.batch_turns / self.micro_batch)


#: An episode as the learner takes it: its turns, and one reward per turn.
Episode = tuple[Sequence[TurnRecord], np.ndarray]


@dataclass
class PreparedBatch:
    """Per turn (flattened over the batch's episodes): old and reference log-probabilities, the
    token KL, token returns and normalised advantages; ``returns`` also per episode."""

    turns: list[TurnRecord]
    logp_old: list[np.ndarray]
    logp_ref: list[np.ndarray]
    kl: list[np.ndarray]
    returns: list[list[np.ndarray]]  # [episode][turn] -> (R,) token returns
    advantages: list[np.ndarray]  # [turn] -> (R,); 0 at forced tokens
    chosen: list[np.ndarray] = field(default_factory=list)  # [turn] -> (R,) bool: not forced by a constraint

    @property
    def n_tokens(self) -> int:
        return int(sum(a.size for a in self.advantages))


def chosen_tokens(turn: TurnRecord) -> np.ndarray:
    """(R,) booleans: the response tokens the policy chose (all of an unconstrained turn), as
    opposed to those a constraint forced (probability 1: no choice, no gradient)."""
    if turn.masks is None:
        return np.ones(turn.n_tokens, dtype=bool)
    return np.asarray([not m.forced for m in turn.masks], dtype=bool)


@dataclass
class LLMUpdateStats:
    """Figures of one update (to log per iteration)."""

    loss: float = 0.0
    kl_to_reference: float = 0.0  # mean token k1 KL of the acting policy to the reference (chosen tokens)
    clip_fraction: float = 0.0
    ratio_mean: float = 1.0
    mean_return: float = 0.0
    mean_advantage_abs: float = 0.0
    turns: int = 0
    tokens: int = 0
    chosen_tokens: int = 0  # of tokens: those in the loss (not forced by the action grammar)
    optimizer_steps: int = 0
    learning_rate: float = 0.0
    seconds: float = 0.0
    returns: list[list[np.ndarray]] = field(default_factory=list)


# -- DeepSpeed ----------------------------------------------------------------------------------


def _fill(value: Any, auto: Any) -> Any:
    return auto if value == "auto" else value


def resolve_deepspeed_config(
    config: str | Path | dict, settings: LLMLearnerSettings, *, hidden_size: int, world_size: int = 1
) -> dict:
    """A DeepSpeed config with every ``"auto"`` filled from the learner's settings, as the Hugging
    Face integration fills them for the Trainer (batch sizes, clipping, optimizer, scheduler, bf16,
    and ZeRO-3's bucket sizes from the hidden size); explicit values are kept."""
    cfg = json.loads(Path(config).read_text()) if isinstance(config, str | Path) else json.loads(json.dumps(config))
    cfg.pop("_comment", None)
    gas = settings.accumulation_steps
    cfg["train_micro_batch_size_per_gpu"] = _fill(
        cfg.get("train_micro_batch_size_per_gpu", "auto"), settings.micro_batch
    )
    cfg["gradient_accumulation_steps"] = _fill(cfg.get("gradient_accumulation_steps", "auto"), gas)
    cfg["train_batch_size"] = _fill(
        cfg.get("train_batch_size", "auto"),
        cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * world_size,
    )
    cfg["gradient_clipping"] = _fill(cfg.get("gradient_clipping", "auto"), settings.max_grad_norm)
    bf16_ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    for precision, auto in (("bf16", bf16_ok), ("fp16", False)):
        if precision in cfg:
            cfg[precision]["enabled"] = _fill(cfg[precision].get("enabled", "auto"), auto)
    if "optimizer" in cfg:
        params = cfg["optimizer"].setdefault("params", {})
        for key, auto in (
            ("lr", settings.learning_rate),
            ("betas", list(settings.betas)),
            ("eps", settings.eps),
            ("weight_decay", settings.weight_decay),
        ):
            params[key] = _fill(params.get(key, "auto"), auto)
    if "scheduler" in cfg and settings.total_steps is None:
        del cfg["scheduler"]  # no planned length: a constant rate, as without DeepSpeed
    if "scheduler" in cfg:
        total = int(settings.total_steps or 1)
        params = cfg["scheduler"].setdefault("params", {})
        params["total_num_steps"] = _fill(params.get("total_num_steps", "auto"), total)
        params["warmup_num_steps"] = _fill(
            params.get("warmup_num_steps", "auto"), max(1, round(settings.warmup_ratio * total))
        )
    zero = cfg.get("zero_optimization", {})
    for key, auto in (
        ("reduce_bucket_size", hidden_size * hidden_size),
        ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
        ("stage3_param_persistence_threshold", 10 * hidden_size),
    ):
        if key in zero:
            zero[key] = _fill(zero[key], auto)
    leftover = [path for path, value in _walk(cfg) if value == "auto"]
    if leftover:
        raise ValueError(f"DeepSpeed config still has 'auto' at {', '.join(leftover)}")
    return cfg


def _walk(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [item for key, value in node.items() for item in _walk(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), node)]


def deepspeed_engine(model: torch.nn.Module, settings: LLMLearnerSettings) -> tuple[Any, Any, Any]:
    """(engine, optimizer, scheduler) from ``deepspeed.initialize`` for the policy model.

    A plain ``python`` process becomes a one-rank cluster (``training.reward_models.train.
    prepare_deepspeed_environment``: MASTER_ADDR/PORT, RANK, WORLD_SIZE, the compiled-ops cache);
    under the ``deepspeed`` launcher the launcher's variables are used."""
    import deepspeed

    from training.reward_models.train import prepare_deepspeed_environment

    prepare_deepspeed_environment()
    path = settings.deepspeed_config or str(DS_ZERO3 if torch.cuda.is_available() else DS_ZERO3_CPU)
    hidden = int(getattr(getattr(model, "config", None), "hidden_size", 1024))
    config = resolve_deepspeed_config(path, settings, hidden_size=hidden, world_size=int(os.environ["WORLD_SIZE"]))
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config
    )
    return engine, optimizer, scheduler


# -- the learner ------------------------------------------------------------------------------


def _cosine_with_warmup(optimizer: torch.optim.Optimizer, settings: LLMLearnerSettings) -> Any:
    total = settings.total_steps
    if total is None:
        return None
    warmup = max(1, round(settings.warmup_ratio * total))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def frozen_reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``model`` (the reference policy of the KL term: the SFT model). Take it
    before the model is handed to DeepSpeed: ZeRO-3 leaves only a partition of each weight."""
    import copy

    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


class LLMLearner:
    """ProgRM's multi-turn REINFORCE++ for a causal LM policy (see the module docstring).

    ``model`` is the policy :class:`~training.llm.policy.HFPolicy` acts with (updated in place);
    ``reference`` the frozen SFT model (:func:`frozen_reference`). ``lock``: the acting policy's
    lock, held during an update so that no actor generates from half-updated weights."""

    def __init__(
        self,
        model: torch.nn.Module,
        reference: torch.nn.Module,
        settings: LLMLearnerSettings | None = None,
        *,
        pad_id: int = 0,
        lock: threading.Lock | None = None,
    ) -> None:
        self.settings = settings or LLMLearnerSettings()
        self.model, self.reference, self.pad_id = model, reference, pad_id
        self.lock = lock
        self.rng = random.Random(self.settings.seed)
        self.optimizer_steps = 0
        enable_checkpointing = getattr(model, "gradient_checkpointing_enable", None)
        if self.settings.gradient_checkpointing and callable(enable_checkpointing):
            enable_checkpointing()
        self.engine: Any = None
        if self.settings.use_deepspeed:
            self.engine, self.optimizer, self.scheduler = deepspeed_engine(model, self.settings)
        else:
            self.optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad],
                lr=self.settings.learning_rate,
                betas=self.settings.betas,
                eps=self.settings.eps,
                weight_decay=self.settings.weight_decay,
            )
            self.scheduler = _cosine_with_warmup(self.optimizer, self.settings)

    @property
    def trained(self) -> torch.nn.Module:
        """What forward passes with gradients go through: the DeepSpeed engine, or the model."""
        return self.engine if self.engine is not None else self.model

    # -- advantages ----------------------------------------------------------------------------

    def prepare(self, episodes: Sequence[Episode]) -> PreparedBatch:
        """Reference log-probabilities, token KL, multi-turn token returns and batch-normalised
        advantages (steps 1-3 of the module docstring) for a batch of episodes."""
        s = self.settings
        turns: list[TurnRecord] = []
        for k, (episode_turns, rewards) in enumerate(episodes):
            if len(episode_turns) != len(np.asarray(rewards).reshape(-1)):
                raise ValueError(f"episode {k}: {len(episode_turns)} turns but {np.asarray(rewards).size} rewards")
            if not np.all(np.isfinite(np.asarray(rewards, dtype=np.float64))):
                raise ValueError(f"episode {k}: rewards must be finite")
            turns.extend(episode_turns)

        def logprobs(model: torch.nn.Module) -> list[np.ndarray]:
            """Every turn's response log-probabilities under ``model``, masked as the policy acted."""
            with torch.inference_mode():
                out = response_logprobs(
                    model,
                    [t.prompt_ids for t in turns],
                    [t.response_ids for t in turns],
                    pad_id=self.pad_id,
                    micro_batch=s.micro_batch,
                    masks=[t.masks for t in turns],
                )
            return [o.double().cpu().numpy() for o in out]

        if s.recompute_logp_old:
            logp_old = logprobs(self.trained)
        else:
            logp_old = [np.asarray(t.logp, dtype=np.float64) for t in turns]
        logp_ref = logprobs(self.reference)
        kl = [estimators.kl_penalty(o, r) for o, r in zip(logp_old, logp_ref, strict=True)]
        returns: list[list[np.ndarray]] = []
        start = 0
        for episode_turns, rewards in episodes:
            n = len(episode_turns)
            returns.append(
                estimators.multi_turn_token_returns(
                    np.asarray(rewards, dtype=np.float64).reshape(-1).tolist(),
                    [k.tolist() for k in kl[start : start + n]],
                    gamma_turn=s.gamma_turn,
                    gamma_token=s.gamma_token,
                    kl_coef=s.kl_coef,
                )
            )
            start += n
        flat_returns = [g for episode in returns for g in episode]
        chosen = [chosen_tokens(t) for t in turns]
        # REINFORCE++'s batch normalisation over the tokens that are actions of the policy: forced
        # tokens (return still carried through them) would shift the mean and shrink the spread
        picked = [g[c] for g, c in zip(flat_returns, chosen, strict=True)]
        advantages = []
        for g, c, normalised in zip(flat_returns, chosen, estimators.normalise_together(picked), strict=True):
            advantage = np.zeros(g.size)
            advantage[c] = normalised
            advantages.append(advantage)
        return PreparedBatch(turns, logp_old, logp_ref, kl, returns, advantages, chosen)

    # -- optimisation ----------------------------------------------------------------------------

    def _micro_backward(self, loss: torch.Tensor, boundary: bool) -> None:
        """Backward one micro-batch's (already weighted) loss; step the optimiser at the boundary."""
        if self.engine is not None:
            # the minibatch's micro-batch count varies, so the boundary is set by hand and the loss
            # is not divided by DeepSpeed's nominal accumulation steps (it is weighted by tokens)
            self.engine.set_gradient_accumulation_boundary(boundary)
            self.engine.backward(loss, scale_wrt_gas=False)
            self.engine.step()
            if boundary:
                self.optimizer_steps += 1
            return
        loss.backward()
        if boundary:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_steps += 1

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def update(self, episodes: Sequence[Episode]) -> LLMUpdateStats:
        """One REINFORCE++ update on a batch of episodes (ProgRM §2.4): ``epochs`` passes of
        minibatches of ``batch_turns`` turns, PPO-clip loss (GUI-Shepherd Eq. 5 form,
        -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A)) over the response tokens the policy chose
        (all of them unconstrained; forced tokens are left out of the mean)."""
        started = time.perf_counter()
        s = self.settings
        with self.lock if self.lock is not None else nullcontext():
            batch = self.prepare(episodes)
            stats = LLMUpdateStats(
                turns=len(batch.turns),
                tokens=batch.n_tokens,
                chosen_tokens=int(sum(c.sum() for c in batch.chosen)),
                returns=batch.returns,
            )
            if not batch.turns:
                return stats
            was_training = self.model.training
            # train mode for the update; the policy acts in whatever mode it was in (the same
            # numbers for models without dropout, as Qwen2's attention_dropout 0 is)
            self.trained.train()
            losses, clipped, ratios, counted = [], [], [], 0
            for _ in range(s.epochs):
                order = list(range(len(batch.turns)))
                self.rng.shuffle(order)
                for mb_start in range(0, len(order), s.batch_turns):
                    minibatch = order[mb_start : mb_start + s.batch_turns]
                    mb_tokens = max(1, sum(int(batch.chosen[i].sum()) for i in minibatch))
                    micro = [minibatch[i : i + s.micro_batch] for i in range(0, len(minibatch), s.micro_batch)]
                    mb_loss = 0.0
                    for m, idx in enumerate(micro):
                        new = response_logprobs(
                            self.trained,
                            [batch.turns[i].prompt_ids for i in idx],
                            [batch.turns[i].response_ids for i in idx],
                            pad_id=self.pad_id,
                            micro_batch=len(idx),
                            masks=[batch.turns[i].masks for i in idx],
                        )
                        device = new[0].device
                        keep = torch.from_numpy(np.concatenate([batch.chosen[i] for i in idx])).to(device)
                        logp_new = torch.cat(new)[keep]
                        logp_old = torch.from_numpy(np.concatenate([batch.logp_old[i] for i in idx])).float().to(device)
                        logp_old = logp_old[keep]
                        adv = torch.from_numpy(np.concatenate([batch.advantages[i] for i in idx])).float().to(device)
                        adv = adv[keep]
                        if logp_new.numel() == 0:  # every token forced: nothing to learn, but take part in the step
                            loss = torch.cat(new).sum() * 0.0
                        else:
                            weight = logp_new.numel() / mb_tokens  # token mean over the minibatch's chosen tokens
                            loss = estimators.ppo_clip_loss(logp_new, logp_old, adv, s.clip) * weight
                        self._micro_backward(loss, boundary=m == len(micro) - 1)
                        mb_loss += float(loss.detach())
                        with torch.no_grad():
                            ratio = torch.exp(logp_new.detach() - logp_old)
                            clipped.append(float(((ratio < 1 - s.clip) | (ratio > 1 + s.clip)).float().sum()))
                            ratios.append(float(ratio.sum()))
                            counted += ratio.numel()
                    losses.append(mb_loss)
            self.trained.train(was_training)
        all_kl = np.concatenate([k[c] for k, c in zip(batch.kl, batch.chosen, strict=True)] or [np.zeros(0)])
        all_returns = np.concatenate([g for episode in batch.returns for g in episode])
        stats.loss = float(np.mean(losses))
        stats.kl_to_reference = float(all_kl.mean()) if all_kl.size else 0.0
        stats.clip_fraction = sum(clipped) / max(1, counted)
        stats.ratio_mean = sum(ratios) / max(1, counted)
        stats.mean_return = float(all_returns.mean())
        chosen_advantages = [a[c] for a, c in zip(batch.advantages, batch.chosen, strict=True)]
        stats.mean_advantage_abs = (
            float(np.abs(np.concatenate(chosen_advantages)).mean()) if stats.chosen_tokens else 0.0
        )
        stats.optimizer_steps = self.optimizer_steps
        stats.learning_rate = self.current_lr()
        stats.seconds = time.perf_counter() - started
        return stats

    def sft_step(self, examples: Sequence[SFTExample]) -> float:
        """One supervised step with this learner's optimiser (see :func:`training.llm.sft.sft_step`)."""
        with self.lock if self.lock is not None else nullcontext():
            was_training = self.model.training
            self.trained.train()
            micro = [
                examples[i : i + self.settings.micro_batch] for i in range(0, len(examples), self.settings.micro_batch)
            ]
            total = sum(e.n_tokens for e in examples)
            value = 0.0
            for m, chunk in enumerate(micro):
                loss = answer_nll(self.trained, chunk, self.pad_id) * (sum(e.n_tokens for e in chunk) / total)
                self._micro_backward(loss, boundary=m == len(micro) - 1)
                value += float(loss.detach())
            self.trained.train(was_training)
            return value
