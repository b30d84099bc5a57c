"""Constrained decoding of one answer on the CPU, with the prompt's prefix kept in a KV cache.

:func:`constrained_generate` is a plain decoding loop (no ``model.generate``) over an
:class:`~training.llm.action_grammar.ActionGrammar`:

* forced tokens (a literal of the format, or a position where only one token is allowed) are
  appended without sampling and with log-prob 0; consecutive forced tokens go through the model in
  one forward pass, and forced tokens at the end of the answer (``)\\n</action>`` and EOS) in none,
  since no choice follows them ("jump-forward" decoding);
* at every other position the next token is drawn from the model's distribution restricted to the
  allowed set and renormalised (softmax of the masked logits at ``temperature``; the most likely
  allowed token when greedy), and its log-probability under the masked distribution at
  temperature 1 (the policy's own) is recorded with the allowed set;
* the prompt's keys and values are kept in a :class:`PrefixCache`: the next prompt reuses the
  longest common token prefix with a kept one (the system message and the instruction are the same
  at every step of an episode, and the system message across episodes), so only the rest is
  computed.

The recorded log-probabilities come from the decoding loop's own logits, which equal the learner's
full forward pass (``training.llm.policy.response_logprobs`` with the same masks) up to float32
rounding of incremental attention (about 1e-6 here; the tests check 1e-4); ``HFPolicy(rescore=True)``
records the learner's numbers instead, at the cost of one more forward pass over the whole prompt.
"""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from training.llm.action_grammar import ActionGrammar, End, Literal, State, Text, TokenSet, walk


@dataclass(frozen=True)
class Generation:
    """One constrained answer: tokens, the allowed set and masked log-prob of each, and its text."""

    response_ids: np.ndarray  # (R,) int64, ends with EOS
    masks: tuple[TokenSet, ...]  # (R,) allowed sets; a one-token set is a forced position
    logp: np.ndarray  # (R,) float32: log pi(token | ...) renormalised over the allowed set; 0 where forced
    text: str  # the answer without EOS, as the grammar spelled it
    n_forced: int
    n_sampled: int
    reused_prompt_tokens: int  # prompt tokens whose keys and values came from the prefix cache
    forward_passes: int


# -- the prompt prefix cache -------------------------------------------------------------------------


@dataclass
class _Entry:
    ids: np.ndarray
    cache: Any  # a transformers DynamicCache holding exactly ``ids``


class PrefixCache:
    """The keys and values of the last ``capacity`` prompts (least recently used goes first).

    A new prompt starts from a copy of the kept prompt that shares the longest token prefix with it
    (at least ``min_tokens``), cut back to that prefix, so a kept cache is never changed. About
    46 KB per token for SmolLM2-135M (30 layers, 3 key-value heads of 64, float32): 25 MB for a
    550-token prompt."""

    def __init__(self, capacity: int = 4, min_tokens: int = 16) -> None:
        self.capacity, self.min_tokens = capacity, min_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt_ids: np.ndarray) -> tuple[Any, int]:
        """(a private copy of the best kept cache cut to the shared prefix, its length), or
        (None, 0). At least one prompt token is always left to compute (its logits are needed)."""
        self.lookups += 1
        best_key, best = None, 0
        for key, entry in self._entries.items():
            shared = _common_prefix(entry.ids, prompt_ids)
            if shared > best:
                best_key, best = key, shared
        best = min(best, len(prompt_ids) - 1)
        if best_key is None or best < self.min_tokens:
            return None, 0
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        cache = copy.deepcopy(entry.cache)
        if len(entry.ids) > best:
            cache.crop(-(len(entry.ids) - best))
        self.hits += 1
        return cache, best

    def store(self, prompt_ids: np.ndarray, cache: Any) -> None:
        """Keep a copy of ``cache`` (which must hold exactly ``prompt_ids``)."""
        if self.capacity <= 0:
            return
        self._entries[self._next_key] = _Entry(np.asarray(prompt_ids).copy(), copy.deepcopy(cache))
        self._next_key += 1
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every kept prompt (after the model's weights change, a kept cache is stale)."""
        self._entries.clear()


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if differs.size else n


# -- sampling under a mask -----------------------------------------------------------------------


def sample_masked(
    logits: torch.Tensor,
    allowed: torch.Tensor,
    *,
    greedy: bool,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[int, float]:
    """(token, its log-prob at temperature 1 under the softmax renormalised over ``allowed``).

    The token is the allowed argmax when ``greedy`` (or ``temperature`` <= 0), else a draw from
    softmax(masked logits / temperature). Never a token outside ``allowed``."""
    masked = logits.float().masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(masked, dim=-1)
    if greedy or temperature <= 0:
        token = int(torch.argmax(masked))
    else:
        probs = torch.softmax(masked / temperature, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logp[token])


# -- the decoding loop ---------------------------------------------------------------------------


def _accepts_logits_to_keep(model: Any) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


# long: one decoding loop over the grammar's states, with the two closures (force, next_logits) that
# share the model's KV cache and the tokens not yet fed; split apart, that state would travel through
# every call.
def constrained_generate(
    model: Any,
    prompt_ids: np.ndarray,
    grammar: ActionGrammar,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 256,
    prefix_cache: PrefixCache | None = None,
) -> Generation:
    """One answer that the grammar allows (see the module docstring). ``max_new_tokens`` bounds
    the free text (a thought or a string argument is closed once the answer reaches it); the
    structure of the answer is always completed, so an answer may exceed it by its forced parts."""
    index = grammar.index
    device = next(model.parameters()).device
    keep_ok = _accepts_logits_to_keep(model)
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    cache, reused = prefix_cache.lookup(prompt_ids) if prefix_cache is not None else (None, 0)
    pending: list[int] = prompt_ids[reused:].tolist()  # fed to the model before the next choice
    prompt_pending = len(pending)  # how many of ``pending`` are prompt tokens (for the prefix cache)
    response: list[int] = []
    masks: list[TokenSet] = []
    logps: list[float] = []
    forward_passes = 0

    def force(tokens: tuple[int, ...] | list[int]) -> None:
        for token in tokens:
            response.append(int(token))
            masks.append(TokenSet(np.asarray([token], dtype=np.int32)))
            logps.append(0.0)
            pending.append(int(token))

    def next_logits() -> torch.Tensor:
        nonlocal cache, pending, prompt_pending, forward_passes
        ids = torch.tensor([pending], dtype=torch.long, device=device)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if keep_ok else {}
        with torch.inference_mode():  # acting: no graph (the learner recomputes with gradients)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, **kwargs)
        cache = out.past_key_values
        forward_passes += 1
        if prompt_pending and prefix_cache is not None:
            kept = copy.deepcopy(cache)
            extra = len(pending) - prompt_pending  # forced answer tokens fed with the prompt
            if extra:
                kept.crop(-extra)
            prefix_cache.store(prompt_ids, kept)
        prompt_pending = 0
        pending = []
        return out.logits[0, -1]

    force(index.canonical(grammar.prefix))
    state: State = grammar.root
    text_tokens = 0  # tokens written inside the current free text
    while True:
        if isinstance(state, End):
            force([index.eos_id])
            break
        if isinstance(state, Literal):
            force(index.canonical(state.rest))
            if isinstance(state.then, End):
                force([index.eos_id])
                break
            state, text_tokens = state.then, 0
            continue
        if isinstance(state, Text) and (text_tokens >= grammar.bound(state) or len(response) >= max_new_tokens):
            close = grammar.forced_close(state)
            force(index.canonical(close))
            after = walk(state, close)
            assert after is not None, f"the forced close {close!r} is not in the grammar"
            state, text_tokens = after, 0
            continue
        allowed = grammar.allowed(state)
        if allowed.forced:
            token = int(allowed.ids[0])
            force([token])
        else:
            logits = next_logits()
            mask = torch.from_numpy(allowed.to_mask(logits.shape[-1])).to(logits.device)
            token, logp = sample_masked(logits, mask, greedy=greedy, temperature=temperature, generator=generator)
            response.append(token)
            masks.append(allowed)
            logps.append(logp)
            pending = [token]
        after = walk(state, index.strings[token])
        assert after is not None, "a token outside the allowed set was chosen"
        text_tokens = text_tokens + 1 if isinstance(after, Text) else 0
        state = after
    n_forced = sum(m.forced for m in masks)
    text = "".join(index.strings[t] for t in response[:-1])
    return Generation(
        response_ids=np.asarray(response, dtype=np.int64),
        masks=tuple(masks),
        logp=np.asarray(logps, dtype=np.float32),
        text=text,
        n_forced=n_forced,
        n_sampled=len(response) - n_forced,
        reused_prompt_tokens=reused,
        forward_passes=forward_passes,
    )
