"""Supervised fine-tuning of the LLM policy, the warm-start before RL (ProgRM §3: the actor is
supervised first, 10,000 SFT steps in the paper).

The LLM's SFT stands beside the learned CPU policy's (:mod:`training.policy.sft`) and reads the
same data: :func:`training.policy.store.imitation_trajectories`, the successful expert episodes of
a task (human demonstrations and scripted-expert rollouts, never a policy's own or an evaluation
episode). Each step whose action can be written in the prompt's language becomes a pair (actor
prompt, the recorded action as ProgRM Table 11's answer, ``<think>..</think><action>CALL</action>``
then EOS: :func:`trajectory_sft_pairs`); the loss is the answer's negative log-likelihood with the
prompt tokens masked (:func:`sft_step`), over minibatches drawn by a seeded generator
(:func:`draw_minibatches`); :func:`supervised_fine_tuning` runs the steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envs.miniwob.live import SUPPORTED_ACTIONS
from envs.task_catalog import CatalogTask
from training.llm.policy import encode_prompt, response_logprobs
from training.llm.prompts import HistoryEntry, action_to_call, build_messages, format_response
from training.policy.store import imitation_trajectories
from warehouse.catalog import Warehouse
from warehouse.model import Action, ActionType, Screen

Log = Callable[[str], None]


@dataclass(frozen=True)
class SFTExample:
    """A prompt and the answer to learn (target tokens end with EOS, so the model learns to stop)."""

    prompt_ids: np.ndarray
    target_ids: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.target_ids.shape[0])


def trajectory_sft_pairs(
    instruction: str,
    steps: Sequence[tuple[Screen, Action]],
    *,
    max_steps: int,
    supported: frozenset[ActionType] | None = None,
    thought: str = "",
) -> list[tuple[list[dict[str, str]], str]]:
    """(actor messages, target answer) for each step of a successful trajectory whose action can be
    written in the prompt's language (a target among the numbered elements). Demonstrations carry
    no reasoning, so the think block holds ``thought`` (empty by default)."""
    pairs: list[tuple[list[dict[str, str]], str]] = []
    history: list[HistoryEntry] = []
    for t, (screen, action) in enumerate(steps):
        messages, elements = build_messages(
            instruction, screen, history, step_index=t, max_steps=max_steps, supported=supported
        )
        call = action_to_call(action, elements)
        if call is not None:
            pairs.append((messages, format_response(call, thought)))
        history.append(HistoryEntry(action))
    return pairs


def sft_examples(tokenizer: Any, pairs: Sequence[tuple[list[dict[str, str]], str]]) -> list[SFTExample]:
    """Tokenise (messages, answer) pairs: the prompt as the policy renders it, the answer + EOS."""
    out = []
    eos = tokenizer.eos_token_id
    for messages, answer in pairs:
        target = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
        if eos is not None:
            target.append(eos)
        out.append(SFTExample(encode_prompt(tokenizer, messages), np.asarray(target, dtype=np.int64)))
    return out


def answer_nll(model: torch.nn.Module, examples: Sequence[SFTExample], pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood per answer token of a batch, prompt tokens masked (with gradients)."""
    logp = response_logprobs(
        model,
        [e.prompt_ids for e in examples],
        [e.target_ids for e in examples],
        pad_id=pad_id,
        micro_batch=len(examples),
    )
    return -torch.cat(logp).mean()


def sft_loss(model: torch.nn.Module, examples: Sequence[SFTExample], *, pad_id: int = 0, micro_batch: int = 4) -> float:
    """Mean negative log-likelihood per target token (no gradients)."""
    total, tokens = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(examples), micro_batch):
            chunk = examples[i : i + micro_batch]
            n = sum(e.n_tokens for e in chunk)
            total += float(answer_nll(model, chunk, pad_id)) * n
            tokens += n
    return total / max(1, tokens)


def sft_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[SFTExample],
    *,
    pad_id: int = 0,
    micro_batch: int = 4,
    max_grad_norm: float = 1.0,
) -> float:
    """One supervised step: mean NLL of the target tokens given the prompt (prompt tokens masked),
    accumulated over micro-batches, weighted by tokens; returns the loss before the step."""
    was_training = model.training
    model.train()
    total = sum(e.n_tokens for e in examples)
    value = 0.0
    for i in range(0, len(examples), micro_batch):
        chunk = examples[i : i + micro_batch]
        loss = answer_nll(model, chunk, pad_id) * (sum(e.n_tokens for e in chunk) / total)
        loss.backward()
        value += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    return value


def draw_minibatches(n_examples: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """``steps`` minibatches of example indices: epochs of a seeded shuffle, cut into ``batch``-sized
    pieces (the last piece of an epoch joins the next epoch's first, so every step has ``batch``
    examples when there are that many)."""
    if n_examples < 1:
        raise ValueError("no SFT examples to draw from")
    rng = random.Random(seed)
    order: list[int] = []
    out: list[list[int]] = []
    for _ in range(steps):
        while len(order) < min(batch, n_examples):
            epoch = list(range(n_examples))
            rng.shuffle(epoch)
            order.extend(epoch)
        out.append(order[: min(batch, n_examples)])
        del order[: min(batch, n_examples)]
    return out


def sft_data(warehouse: Warehouse, tasks: Sequence[CatalogTask], per_task: int, tokenizer: Any, max_tokens: int):
    """The SFT examples of the tasks and how many steps could not be written (an action on an
    element the prompt does not number) or were too long for the prompt budget."""
    examples: list[SFTExample] = []
    episodes, steps, unwritable, too_long = 0, 0, 0, 0
    for task in tasks:
        for trajectory in imitation_trajectories(warehouse, task.task_id, per_task):
            episodes += 1
            steps += trajectory.n_steps
            pairs = trajectory_sft_pairs(
                trajectory.instruction,
                list(zip(trajectory.screens, trajectory.actions, strict=True)),
                max_steps=task.max_steps,
                supported=SUPPORTED_ACTIONS,
            )
            unwritable += trajectory.n_steps - len(pairs)
            for example in sft_examples(tokenizer, pairs):
                if example.prompt_ids.size + example.n_tokens > max_tokens:
                    too_long += 1
                else:
                    examples.append(example)
    counts = {"episodes": episodes, "steps": steps, "examples": len(examples)}
    return examples, counts | {"unwritable_steps": unwritable, "too_long": too_long}


def supervised_fine_tuning(
    model: torch.nn.Module,
    examples: Sequence[SFTExample],
    *,
    steps: int,
    batch: int,
    learning_rate: float,
    seed: int,
    pad_id: int,
    log: Log = print,
) -> tuple[float, float]:
    """``steps`` AdamW steps of :func:`sft_step` on minibatches of ``examples``
    (:func:`draw_minibatches`, seeded), the loss logged every 10 steps. Returns the NLL per answer
    token on a fixed probe of up to 32 examples, before and after (a probe of the loss, not a
    validation split); the model is left in eval mode."""
    held = list(examples[:: max(2, len(examples) // 32)][:32])
    before = sft_loss(model, held, pad_id=pad_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))
    losses: list[float] = []
    torch.manual_seed(seed)
    for step, drawn in enumerate(draw_minibatches(len(examples), steps, batch, seed)):
        losses.append(sft_step(model, optimizer, [examples[i] for i in drawn], pad_id=pad_id))
        if (step + 1) % 10 == 0 or step + 1 == steps:
            log(f"SFT step {step + 1}/{steps}: loss {np.mean(losses[-10:]):.3f}")
    model.eval()
    return before, sft_loss(model, held, pad_id=pad_id)
