"""LLM policies behind the environments' ``Policy`` interface, with ProgRM Table 11's prompt.

* :class:`HFPolicy`: a local Hugging Face causal LM that the RL code trains
  (:mod:`training.rl.llm_learner`). Per step it builds the chat prompt (:mod:`training.llm.prompts`;
  the tokenizer's chat template when it has one, else plain ``System:/User:`` text), generates at
  temperature 1 (training, ProgRM Table 6 "rollout temperature 1.0") or greedily (evaluation),
  and parses the answer. It records a :class:`TurnRecord` per step: prompt and response token ids
  and the response tokens' log-probabilities under the acting model, computed by a separate
  forward pass (:func:`response_logprobs`), the very function the learner calls, so the PPO
  ratio starts at 1 rather than at whatever ``generate``'s processed scores were.
  With ``constrained`` (the default) the answer is decoded under the action grammar
  (:mod:`training.llm.action_grammar`, :mod:`training.llm.decoding`): it always parses, its fixed
  parts are forced (log-prob 0), and the turn records the allowed token set of every response
  position (``TurnRecord.masks``), with which the learner renormalises the same way, so the
  behaviour policy it corrects for is the masked one. The prompt's keys and values are reused
  across steps (:class:`~training.llm.decoding.PrefixCache`).
* :class:`EndpointPolicy`: the same prompt and parser over any OpenAI-compatible chat endpoint
  (vLLM, ``transformers serve``, a hosted model), for evaluation and data collection; nothing is
  learned through it.

An answer that does not parse (no ``<action>`` block, an unknown function, an element number
that is not on the screen, ...) is acted as ``NOTHING`` with ``format_ok = False``: the episode
goes on, and GUI-Shepherd's Eq. 3 format reward (``training.rl.rewards.prm.format_rewards``)
penalises the step once :meth:`HFPolicy.rollout` hands the flags to the reward source. An
endpoint that fails or times out is treated the same way, with the reason counted.

Threads: the worker pool calls actors from two threads at once; the model (and its RNG use) is
guarded by the policy's lock, so generation is serial, which on one CPU costs nothing.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.protocol import Actor, EpisodeContext, EpisodeRecord, StepResult
from training.llm.action_grammar import ActionGrammar, TokenIndex, TokenSet, masks_matrix
from training.llm.chat_client import ChatClient, ChatEndpointError
from training.llm.decoding import PrefixCache, constrained_generate
from training.llm.prompts import (
    MAX_ELEMENTS,
    HistoryEntry,
    ParsedAction,
    ParseFailure,
    build_messages,
    offered_functions,
    parse_response,
    plain_chat_text,
)
from training.policy.rollouts import Rollout
from warehouse.model import Action, ActionType, Screen, UIElement

#: Failure reason (counted like a parse failure) when the endpoint did not answer.
ENDPOINT_ERROR = "endpoint_error"
#: The answer format's closing tag: generation stops once it is written.
STOP_STRING = "</action>"
#: MiniWoB++'s episode clock when an LLM is in the step (acting, judging, reflecting): the page's
#: timer runs while the model thinks (seconds to minutes a step on a CPU), and the benchmark's 10 s
#: would end an episode at its first or second action; ``max_steps`` still bounds the episode.
LLM_EPISODE_CLOCK_MS = 600_000
#: Positions a constrained answer may take besides its free text (prefix, call, closing, EOS).
_STRUCTURE_TOKENS = 64
#: Screen structures whose grammar (and its allowed sets) a policy keeps.
_KEPT_GRAMMARS = 8
#: A context that leaves fewer prompt tokens than this cannot hold the actor's prompt at all.
_MIN_PROMPT_TOKENS = 64


@dataclass(frozen=True)
class TurnRecord:
    """One step of an LLM policy as the learner needs it.

    ``logp[j]`` is log pi(response_ids[j] | prompt, response_ids[:j]) under the model that acted
    (at temperature 1: the policy's own distribution), from :func:`response_logprobs`. A
    constrained turn also has ``masks``: per response position the allowed token set, over which
    ``logp`` is renormalised (:func:`response_logprobs` with ``masks``); a one-token set is a
    forced position, with ``logp`` 0. ``masks`` is None for an unconstrained turn."""

    prompt_ids: np.ndarray  # (P,) int64
    response_ids: np.ndarray  # (R,) int64, R >= 1; ends with EOS when the model stopped by itself
    logp: np.ndarray  # (R,) float32
    format_ok: bool
    action_text: str  # the parsed call (e.g. 'CLICK(3)'), "" when the answer did not parse
    response_text: str
    failure: str | None = None  # ParseFailure.describe() when format_ok is False
    generate_s: float = 0.0
    masks: tuple[TokenSet, ...] | None = None  # (R,) allowed sets of a constrained turn

    @property
    def n_tokens(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def n_forced(self) -> int:
        """Response tokens that the constraint forced (probability 1; no gradient)."""
        return 0 if self.masks is None else sum(m.forced for m in self.masks)


@dataclass
class PolicyCounters:
    """What a policy did so far (thread-safe updates under the policy's lock)."""

    steps: int = 0
    format_failures: Counter[str] = field(default_factory=Counter)
    generated_tokens: int = 0
    prompt_tokens: int = 0
    truncated_prompts: int = 0
    seconds: float = 0.0
    forced_tokens: int = 0  # of generated_tokens: forced by the action grammar (constrained mode)
    sampled_tokens: int = 0  # of generated_tokens: chosen by the model (all of them when unconstrained)
    reused_prompt_tokens: int = 0  # of prompt_tokens: keys and values taken from the prefix cache

    @property
    def format_ok_rate(self) -> float:
        return 1.0 - sum(self.format_failures.values()) / self.steps if self.steps else 1.0


# -- log-probabilities -------------------------------------------------------------------------


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    # a DeepSpeed engine passes keyword arguments through to the wrapped model: ask that one
    forward = getattr(getattr(model, "module", model), "forward", None)
    try:
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[np.ndarray | Sequence[int]],
    response_ids: Sequence[np.ndarray | Sequence[int]],
    *,
    pad_id: int = 0,
    micro_batch: int = 4,
    masks: Sequence[Sequence[TokenSet] | None] | None = None,
) -> list[torch.Tensor]:
    """log pi(w_j | prompt, w_<j) of every response token, one (R_i,) float32 tensor per sequence.

    With ``masks`` (per sequence: None, or one :class:`~training.llm.action_grammar.TokenSet` per
    response token, as a constrained :class:`TurnRecord` holds them) the distribution at each
    position is renormalised over its allowed set, as the constrained policy sampled it; a forced
    position (one allowed token) is exactly 0 and carries no gradient.

    Sequences are right-padded (a causal LM's real tokens never see the padding after them), and
    only the positions that predict response tokens go through the LM head and the softmax
    (``logits_to_keep``), which for a 150k vocabulary is most of the memory. Differentiable when
    called with gradients enabled; the model's mode (train/eval) is left as it is."""
    device = next(model.parameters()).device
    keep_ok = _accepts_logits_to_keep(model)
    out: list[torch.Tensor] = []
    for start in range(0, len(prompt_ids), micro_batch):
        prompts = [np.asarray(p, dtype=np.int64) for p in prompt_ids[start : start + micro_batch]]
        responses = [np.asarray(r, dtype=np.int64) for r in response_ids[start : start + micro_batch]]
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        width = max(lengths)
        ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            ids[i, : lengths[i]] = np.concatenate([p, r])
            mask[i, : lengths[i]] = 1
        # the first position whose logits are needed: the one predicting the earliest response token
        first = min(len(p) for p in prompts) - 1
        kwargs: dict[str, Any] = {}
        if keep_ok:
            kwargs["logits_to_keep"] = width - first
        logits = model(
            input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(mask).to(device), **kwargs
        ).logits
        offset = width - logits.shape[1]  # logits[:, k] belongs to position offset + k
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            positions = torch.arange(len(p) - 1, len(p) + len(r) - 1, device=logits.device) - offset
            scores = logits[i, positions].float()
            sequence_masks = masks[start + i] if masks is not None else None
            targets = torch.from_numpy(r).to(logits.device)
            if sequence_masks is None:
                out.append(torch.log_softmax(scores, dim=-1).gather(1, targets[:, None]).squeeze(1))
                continue
            if len(sequence_masks) != len(r):
                raise ValueError(f"sequence {start + i}: {len(sequence_masks)} masks for {len(r)} response tokens")
            allowed = torch.from_numpy(masks_matrix(sequence_masks, scores.shape[-1])).to(logits.device)
            if not bool(allowed.gather(1, targets[:, None]).all()):
                raise ValueError(f"sequence {start + i}: a response token is outside its allowed set")
            rows = torch.log_softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            value = rows.gather(1, targets[:, None]).squeeze(1)
            forced = torch.tensor([m.forced for m in sequence_masks], device=logits.device)
            out.append(torch.where(forced, torch.zeros_like(value), value))
    return out


# -- prompts as tokens -------------------------------------------------------------------------


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat as the model reads it: the tokenizer's chat template when it has one, else
    :func:`training.llm.prompts.plain_chat_text`; both end where the answer starts."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if isinstance(text, str):
            return text
    return plain_chat_text(messages)


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> np.ndarray:
    """Token ids of the rendered prompt (the template carries its own special tokens)."""
    ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


# -- the local model -------------------------------------------------------------------------


class RecordingLLMPolicy:
    """What the two LLM policies share: each episode's turns kept under its id when ``record`` is
    set (the last attempt of an episode wins, as the pool keeps only a completed attempt), and the
    per-step format flags that reward sources read (GUI-Shepherd Eq. 3)."""

    turns: dict[str, list[Any]]
    record: bool
    lock: threading.Lock

    def _start_recording(self, context: EpisodeContext) -> tuple[str, list[Any] | None]:
        """The episode's key and the list its turns go to (None when not recording)."""
        key = context.episode_id or f"{context.task.task_id}:{context.seed}"
        recorded: list[Any] | None = [] if self.record else None
        if recorded is not None:
            with self.lock:
                self.turns[key] = recorded
        return key, recorded

    def format_ok(self, episode_id: str) -> tuple[bool, ...]:
        """Per step of a recorded episode: was the model's answer a well-formed action?"""
        return tuple(t.format_ok for t in self.turns.get(episode_id, ()))

    def rollout(self, record: EpisodeRecord) -> Rollout:
        """The episode with its format flags, as reward sources read it (GUI-Shepherd Eq. 3)."""
        return Rollout(record, format_ok=self.format_ok(record.episode_id))


@dataclass
class HFPolicy(RecordingLLMPolicy):
    """A local causal LM as an ``envs.protocol.Policy`` (see the module docstring).

    ``greedy`` picks the most likely token (evaluation); otherwise tokens are sampled from the
    model's distribution at ``temperature`` (1: on-policy for RL; other values make the recorded
    log-probabilities, which are always at temperature 1, those of a different policy). With
    ``record`` every episode's turns are kept in ``turns[episode_id]`` (the last attempt of an
    episode wins, as the pool keeps only a completed attempt).

    ``constrained`` (default) decodes under the action grammar: every answer parses, the format's
    fixed parts cost no sampling, and ``TurnRecord.masks`` says what was allowed where. ``think``
    lets the model write a thought of at most ``max_thought_tokens`` tokens first (default: the
    empty thought is forced, as in SFT targets); string arguments hold at most
    ``max_text_tokens`` tokens. ``prefix_cache_size`` prompts keep their keys and values for the
    next step (0: none); they are dropped when the weights change in place (an optimiser step). ``rescore``
    records log-probs from a separate forward pass (the learner's own function) instead of the
    decoding loop's logits (equal up to float rounding; one more forward pass per step).
    ``constrained=False`` is the free-text path of ``model.generate`` (answers may not parse;
    each such step is a counted format failure)."""

    model: Any  # a transformers PreTrainedModel with a language-modelling head
    tokenizer: Any
    policy_id: str = "llm"
    greedy: bool = False
    temperature: float = 1.0
    max_new_tokens: int = 256
    max_prompt_tokens: int = 3072
    max_elements: int = MAX_ELEMENTS
    record: bool = False
    seed: int = 0
    turns: dict[str, list[TurnRecord]] = field(default_factory=dict)
    counters: PolicyCounters = field(default_factory=PolicyCounters)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    constrained: bool = True
    think: bool = False
    max_text_tokens: int = 24
    max_thought_tokens: int = 48
    prefix_cache_size: int = 4
    rescore: bool = False
    _token_index: TokenIndex | None = field(default=None, init=False, repr=False)
    _grammars: dict[tuple[Any, ...], ActionGrammar] = field(default_factory=dict, init=False, repr=False)
    _prefix_cache: PrefixCache = field(default_factory=PrefixCache, init=False, repr=False)
    _weights_seen: int = field(default=-1, init=False, repr=False)

    def __post_init__(self) -> None:
        self._prefix_cache = PrefixCache(capacity=self.prefix_cache_size)
        if self.prompt_limit < _MIN_PROMPT_TOKENS:
            raise ValueError(
                f"the model's context of {self.context_tokens} positions leaves {self.prompt_limit} tokens for "
                f"the prompt after {self.response_budget} for the answer: lower max_new_tokens"
            )

    @property
    def context_tokens(self) -> int | None:
        """The model's context length (its position embeddings), None when it does not say."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(value) if isinstance(value, int) else None

    @property
    def response_budget(self) -> int:
        """Positions to leave for the answer: the free text plus, constrained, its structure."""
        return self.max_new_tokens + (_STRUCTURE_TOKENS if self.constrained else 0)

    @property
    def prompt_limit(self) -> int:
        """The longest prompt: ``max_prompt_tokens``, and no more than the context leaves after the answer."""
        context = self.context_tokens
        if context is None:
            return self.max_prompt_tokens
        return min(self.max_prompt_tokens, context - self.response_budget)

    def weights_changed(self) -> None:
        """Drop the kept prompt caches: they hold keys and values of the old weights. Updates in
        place (an optimiser step, ``load_state_dict``) are noticed without it (:meth:`_cache_for`);
        call it after changing weights some other way."""
        with self.lock:
            self._prefix_cache.clear()

    def _cache_for(self) -> PrefixCache | None:
        """The prompt cache, emptied first when a parameter changed since the last step: every
        in-place change of a tensor bumps its version counter, so a learner's update between two
        steps cannot leave keys and values of the old weights in use."""
        if self.prefix_cache_size <= 0:
            return None
        version = sum(p._version for p in self.model.parameters())
        if version != self._weights_seen:
            self._prefix_cache.clear()
            self._weights_seen = version
        return self._prefix_cache

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> HFPolicy:
        """Model and tokenizer from one folder (save_pretrained's layout)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        return cls(model, tokenizer, **kwargs)

    def start(self, context: EpisodeContext) -> Actor:
        key, recorded = self._start_recording(context)
        return _HFActor(self, context, key, recorded)

    # -- one step --------------------------------------------------------------------------------

    def _prompt(
        self, context: EpisodeContext, screen: Screen, history: Sequence[HistoryEntry]
    ) -> tuple[np.ndarray, list[UIElement], bool]:
        """(prompt ids, the numbered elements shown, whether the prompt had to be shortened).
        The limit is :attr:`prompt_limit` (``max_prompt_tokens``, within the model's context after
        room for the answer). Too long a prompt shows fewer elements first (the parser sees the
        same list); if even a handful are too many, the prompt keeps its last tokens."""
        limit = self.prompt_limit
        max_elements = self.max_elements
        while True:
            messages, elements = build_messages(
                context.instruction,
                screen,
                history,
                step_index=len(history),
                max_steps=context.max_steps,
                supported=context.supported_actions,
                max_elements=max_elements,
            )
            ids = encode_prompt(self.tokenizer, messages)
            if len(ids) <= limit:
                return ids, elements, max_elements < self.max_elements
            if len(elements) <= 8:
                return ids[-limit:], elements, True
            max_elements = len(elements) // 2

    def _generate(self, prompt_ids: np.ndarray, seed: int) -> np.ndarray:
        from transformers import GenerationConfig

        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=not self.greedy,
            temperature=None if self.greedy else self.temperature,
            top_k=None if self.greedy else 0,  # no top-k / top-p: sample from the policy itself
            top_p=None if self.greedy else 1.0,
            eos_token_id=eos,
            pad_token_id=pad,
            stop_strings=[STOP_STRING],
        )
        device = next(self.model.parameters()).device
        input_ids = torch.from_numpy(prompt_ids[None, :]).to(device)
        with torch.random.fork_rng(devices=[]):  # a per-step seed without disturbing the caller's RNG
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                tokenizer=self.tokenizer,
                # ZeRO-3 over several ranks: every rank must take part in every forward pass
                synced_gpus=torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1,
            )
        return out[0, len(prompt_ids) :].cpu().numpy().astype(np.int64)

    def _grammar(self, elements: Sequence[UIElement], context: EpisodeContext) -> ActionGrammar:
        """The action grammar of a screen; kept for screens of the same structure (element count,
        editable ones, offered functions), so the allowed sets of its states are computed once."""
        if self._token_index is None:
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            self._token_index = TokenIndex.build(self.tokenizer, vocab if isinstance(vocab, int) else None)
        functions = tuple(offered_functions(context.supported_actions))
        key = (len(elements), tuple(i for i, e in enumerate(elements) if e.editable), functions)
        grammar = self._grammars.pop(key, None)
        if grammar is None:
            grammar = ActionGrammar.for_screen(
                self._token_index,
                elements,
                functions,
                think=self.think,
                max_text_tokens=self.max_text_tokens,
                max_thought_tokens=self.max_thought_tokens,
            )
        self._grammars[key] = grammar  # most recent last
        while len(self._grammars) > _KEPT_GRAMMARS:
            del self._grammars[next(iter(self._grammars))]
        return grammar

    def decide(
        self, context: EpisodeContext, key: str, screen: Screen, history: Sequence[HistoryEntry]
    ) -> tuple[TurnRecord, ParsedAction | ParseFailure]:
        """One step: prompt, generate (constrained or not), log-probs, parse. The sampling seed is
        fixed by (seed, policy, episode, step), so a retried episode replays its answers."""
        started = time.perf_counter()
        seed = int.from_bytes(
            hashlib.sha256(f"{self.seed}|{self.policy_id}|{key}|{len(history)}".encode()).digest()[:4], "big"
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        masks: tuple[TokenSet, ...] | None = None
        forced = reused = 0
        # the tokenizer too: a Rust tokenizer shared by threads can refuse ("Already borrowed")
        with self.lock, torch.inference_mode():
            prompt_ids, elements, truncated = self._prompt(context, screen, history)
            if self.constrained:
                generation = constrained_generate(
                    self.model,
                    prompt_ids,
                    self._grammar(elements, context),
                    greedy=self.greedy,
                    temperature=self.temperature,
                    seed=seed,
                    max_new_tokens=self.max_new_tokens,
                    prefix_cache=self._cache_for(),
                )
                response_ids, masks, text = generation.response_ids, generation.masks, generation.text
                forced, reused = generation.n_forced, generation.reused_prompt_tokens
                logp = torch.from_numpy(generation.logp)
                if self.rescore:
                    logp = response_logprobs(self.model, [prompt_ids], [response_ids], pad_id=pad, masks=[masks])[0]
            else:
                response_ids = self._generate(prompt_ids, seed)
                logp = response_logprobs(self.model, [prompt_ids], [response_ids], pad_id=pad)[0]
                text = self.tokenizer.decode(response_ids.tolist(), skip_special_tokens=True)
        parsed = parse_response(text, elements, context.supported_actions)
        elapsed = time.perf_counter() - started
        turn = TurnRecord(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            logp=logp.cpu().numpy().astype(np.float32),
            format_ok=not isinstance(parsed, ParseFailure),
            action_text="" if isinstance(parsed, ParseFailure) else parsed.call,
            response_text=text,
            failure=parsed.describe() if isinstance(parsed, ParseFailure) else None,
            generate_s=elapsed,
            masks=masks,
        )
        with self.lock:
            c = self.counters
            c.steps += 1
            c.generated_tokens += int(response_ids.size)
            c.forced_tokens += forced
            c.sampled_tokens += int(response_ids.size) - forced
            c.prompt_tokens += int(prompt_ids.size)
            c.reused_prompt_tokens += reused
            c.truncated_prompts += int(truncated)
            c.seconds += elapsed
            if isinstance(parsed, ParseFailure):
                # constrained answers parse by construction: a failure here would be a bug, counted all the same
                c.format_failures[parsed.reason] += 1
        return turn, parsed


class _HFActor:
    def __init__(self, policy: HFPolicy, context: EpisodeContext, key: str, recorded: list[TurnRecord] | None) -> None:
        self.policy, self.context, self.key, self.recorded = policy, context, key, recorded
        self.history: list[HistoryEntry] = []

    def act(self, screen: Screen) -> Action:
        turn, parsed = self.policy.decide(self.context, self.key, screen, self.history)
        if self.recorded is not None:
            self.recorded.append(turn)
        return _next_action(self.history, parsed)

    def observe(self, action: Action, result: StepResult) -> None:
        _note_problem(self.history, result)


def _next_action(history: list[HistoryEntry], parsed: ParsedAction | ParseFailure) -> Action:
    """The action to take for an answer, noted in the history the next prompt shows: a failure
    becomes a wait, and the model is told why."""
    if isinstance(parsed, ParseFailure):
        action = Action(ActionType.NOTHING, detail=f"format: {parsed.reason}")
        history.append(HistoryEntry(action, format_failure=parsed.reason))
        return action
    history.append(HistoryEntry(parsed.action))
    return parsed.action


def _note_problem(history: list[HistoryEntry], result: StepResult) -> None:
    """An action the environment could not carry out is shown as failed in later prompts."""
    if history and result.problem is not None and history[-1].format_failure is None:
        history[-1] = HistoryEntry(history[-1].action, problem=result.problem)


# -- an OpenAI-compatible endpoint ---------------------------------------------------------------


@dataclass(frozen=True)
class EndpointTurn:
    """One step of an :class:`EndpointPolicy`: the answer, whether it parsed, and how long it took."""

    response_text: str
    format_ok: bool
    action_text: str
    failure: str | None
    seconds: float


@dataclass
class EndpointPolicy(RecordingLLMPolicy):
    """The actor prompt and parser over a chat endpoint, as an ``envs.protocol.Policy``.

    For evaluation and data collection: greedy by default (``temperature`` 0). A call that fails
    (down, too slow, an HTTP error, an answer that is not a chat completion) makes the step
    ``NOTHING`` with ``format_ok = False`` and is counted under ``endpoint_error``; the episode goes
    on. ``stop`` is sent as the request's stop strings (an endpoint drops the stop text itself,
    which the parser tolerates); empty by default, since not every server honours it."""

    client: ChatClient
    policy_id: str = "endpoint"
    temperature: float = 0.0
    max_tokens: int = 256
    max_elements: int = MAX_ELEMENTS
    stop: tuple[str, ...] = ()
    record: bool = True
    turns: dict[str, list[EndpointTurn]] = field(default_factory=dict)
    counters: PolicyCounters = field(default_factory=PolicyCounters)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self, context: EpisodeContext) -> Actor:
        _, recorded = self._start_recording(context)
        return _EndpointActor(self, context, recorded)

    def decide(
        self, context: EpisodeContext, screen: Screen, history: Sequence[HistoryEntry]
    ) -> tuple[EndpointTurn, ParsedAction | ParseFailure]:
        """One step: prompt, one chat call, parse; an endpoint failure is a ParseFailure with
        reason ``endpoint_error``."""
        messages, elements = build_messages(
            context.instruction,
            screen,
            history,
            step_index=len(history),
            max_steps=context.max_steps,
            supported=context.supported_actions,
            max_elements=self.max_elements,
        )
        started = time.perf_counter()
        parsed: ParsedAction | ParseFailure
        try:
            text = self.client.complete(
                messages, max_tokens=self.max_tokens, temperature=self.temperature, stop=list(self.stop) or None
            )
        except ChatEndpointError as exc:
            text = ""
            parsed = ParseFailure(ENDPOINT_ERROR, str(exc))
        else:
            parsed = parse_response(text, elements, context.supported_actions)
        elapsed = time.perf_counter() - started
        turn = EndpointTurn(
            response_text=text,
            format_ok=not isinstance(parsed, ParseFailure),
            action_text="" if isinstance(parsed, ParseFailure) else parsed.call,
            failure=parsed.describe() if isinstance(parsed, ParseFailure) else None,
            seconds=elapsed,
        )
        with self.lock:
            self.counters.steps += 1
            self.counters.seconds += elapsed
            if isinstance(parsed, ParseFailure):
                self.counters.format_failures[parsed.reason] += 1
        return turn, parsed


class _EndpointActor:
    def __init__(self, policy: EndpointPolicy, context: EpisodeContext, recorded: list[EndpointTurn] | None) -> None:
        self.policy, self.context, self.recorded = policy, context, recorded
        self.history: list[HistoryEntry] = []

    def act(self, screen: Screen) -> Action:
        turn, parsed = self.policy.decide(self.context, screen, self.history)
        if self.recorded is not None:
            self.recorded.append(turn)
        return _next_action(self.history, parsed)

    def observe(self, action: Action, result: StepResult) -> None:
        _note_problem(self.history, result)
