"""The action grammar as a token-level constraint: an answer can only be one well-formed action.

ProgRM Table 11's answer format is ``<think>...</think><action>CALL</action>``; :mod:`training.llm.
prompts` parses it. Here the same language is written as a character automaton built per screen
from the numbered elements and the offered functions, and every vocabulary token is allowed or
not by walking its text through the automaton (so any tokenisation that spells a valid answer is
allowed, in particular the tokenizer's own, which SFT targets use):

* the response prefix ``<think>\\n\\n</think>\\n<action>\\n`` (empty thought: what SFT targets hold
  by default) is forced; with ``think=True`` only ``<think>\\n`` is, then a free thought of at most
  ``max_thought_tokens`` tokens (any text without ``<``) that the model closes by writing
  ``</think>`` (the rest of the closing is forced) or that is closed for it at the bound;
* the call: ``CLICK(i)`` / ``LONG_CLICK(i)`` for every numbered element, ``INPUT(i, "...")`` for the
  editable ones, ``SCROLL(UP|DOWN|LEFT|RIGHT)``, ``PRESS_KEY("<key>")`` for the keys of
  :data:`CONSTRAINED_KEYS`, ``ANSWER("...")``, ``GOBACK()``, ``DO_NOTHING()``: only the functions
  offered (``prompts.offered_functions``), written as ``prompts.format_call`` writes them;
* a string argument (INPUT's text, ANSWER's) is free text of at most ``max_text_tokens`` tokens
  without ``"``, ``\\`` or control characters (so the quotes need no escaping), closed by ``"``;
* once the rest of the answer is determined (``)\\n</action>`` and EOS after a call), it is forced.

Where the remaining text is a fixed literal it is forced in the tokenizer's canonical tokenisation
(one token sequence: the policy's support at those positions is that sequence, probability 1). At
every other position the allowed set is recorded as a :class:`TokenSet`, so the learner can
renormalise over exactly the same set (``training.llm.policy.response_logprobs(masks=...)``).

The grammar assumes a byte-level BPE whose tokens decode on their own (SmolLM2, Qwen, GPT-2);
:class:`TokenIndex` checks that on a sample answer and refuses other tokenizers in one line.
Tokens that decode to a partial UTF-8 character are never allowed (their text is not a string).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.llm.prompts import PARAMETERS, format_call
from warehouse.model import SCROLL_DIRECTIONS, UIElement

#: The keys a constrained PRESS_KEY may name (those MiniWoB++ tasks need, and the prompt's examples).
CONSTRAINED_KEYS: tuple[str, ...] = (
    "Enter",
    "Tab",
    "Escape",
    "Backspace",
    "Delete",
    "Space",
    "ArrowUp",
    "ArrowDown",
    "ArrowLeft",
    "ArrowRight",
    "Ctrl+A",
    "Ctrl+C",
    "Ctrl+V",
)
#: The forced response prefix without a thought: ``format_response(call, "")`` starts so.
EMPTY_THOUGHT_PREFIX = "<think>\n\n</think>\n<action>\n"
THOUGHT_OPEN = "<think>\n"
#: What closes a thought once the model writes ``<`` (or is forced at the bound, after a newline).
THOUGHT_CLOSE = "</think>\n<action>\n"
#: What follows a complete call.
CALL_END = "\n</action>"
#: Free-text kinds: a string argument (closed by ``"``) and a thought (closed by ``<``).
ARGUMENT, THOUGHT = "argument", "thought"
_CLOSERS = {ARGUMENT: '"', THOUGHT: "<"}


def _argument_char(ch: str) -> bool:
    return ch not in '"\\' and ch.isprintable()


def _thought_char(ch: str) -> bool:
    return ch != "<" and (ch.isprintable() or ch in "\n\t")


_CONTENT = {ARGUMENT: _argument_char, THOUGHT: _thought_char}


# -- allowed sets ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TokenSet:
    """The tokens allowed at one response position, compactly: ``ids`` themselves, or with
    ``complement`` every id of the vocabulary (``vocab_size`` wide) except ``ids``. One token
    (not complemented) is a forced position: probability 1 under the constraint, log-prob 0."""

    ids: np.ndarray  # (k,) int32, sorted, unique
    complement: bool = False

    @property
    def forced(self) -> bool:
        return not self.complement and self.ids.size == 1

    def to_mask(self, vocab_size: int) -> np.ndarray:
        """A (vocab_size,) boolean mask of the allowed ids."""
        mask = np.full(vocab_size, self.complement, dtype=bool)
        mask[self.ids[self.ids < vocab_size]] = not self.complement
        return mask

    def size(self, vocab_size: int) -> int:
        return vocab_size - int(self.ids.size) if self.complement else int(self.ids.size)

    def __contains__(self, token: object) -> bool:
        found = bool(np.isin(np.asarray([token]), self.ids)[0])
        return found != self.complement

    @classmethod
    def of(cls, ids: Sequence[int] | np.ndarray, vocab_size: int) -> TokenSet:
        """The compact form of an allowed set: explicit ids, or the complement when shorter."""
        ids = np.unique(np.asarray(ids, dtype=np.int32))
        if 2 * ids.size > vocab_size:
            return cls(np.setdiff1d(np.arange(vocab_size, dtype=np.int32), ids), complement=True)
        return cls(ids)


def masks_matrix(masks: Sequence[TokenSet], vocab_size: int) -> np.ndarray:
    """(R, vocab_size) booleans: row j is the allowed set of response position j."""
    out = np.empty((len(masks), vocab_size), dtype=bool)
    for j, token_set in enumerate(masks):
        out[j] = token_set.to_mask(vocab_size)
    return out


# -- the tokenizer's vocabulary as text ----------------------------------------------------------


class TokenizerNotSupportedError(ValueError):
    """A tokenizer whose tokens do not decode on their own (the grammar cannot walk them)."""


@dataclass
class TokenIndex:
    """Every token's text, indexed for the grammar: by first character, the tokens that are pure
    free-text content of each kind, and those that contain a closing character. Built once per
    tokenizer (about 0.3 s for SmolLM2's 49,152 tokens)."""

    strings: list[str]  # per id; "" where a token is unusable (special, partial UTF-8, beyond the tokenizer)
    vocab_size: int
    eos_id: int
    tokenizer: Any = field(repr=False)
    by_first_char: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    content: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # kind -> ids of pure content
    closers: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # kind -> ids containing its closer
    _canonical: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, tokenizer: Any, vocab_size: int | None = None) -> TokenIndex:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise TokenizerNotSupportedError("constrained decoding needs a tokenizer with an EOS token")
        width = int(vocab_size if vocab_size is not None else len(tokenizer))
        n = min(width, len(tokenizer))
        decoded = tokenizer.batch_decode([[i] for i in range(n)])
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        strings = ["" if i in special or "\ufffd" in text else text for i, text in enumerate(decoded)]
        strings += [""] * (width - n)
        index = cls(strings, width, int(eos), tokenizer)
        sample = EMPTY_THOUGHT_PREFIX + 'INPUT(3, "blue scooter")' + CALL_END
        pieces = tokenizer(sample, add_special_tokens=False)["input_ids"]
        if "".join(index.strings[i] for i in pieces) != sample:
            raise TokenizerNotSupportedError(
                f"constrained decoding needs a byte-level BPE tokenizer whose tokens decode on their own "
                f"({type(tokenizer).__name__} does not)"
            )
        first: dict[str, list[int]] = {}
        for i, text in enumerate(strings):
            if text:
                first.setdefault(text[0], []).append(i)
        index.by_first_char = {ch: np.asarray(ids, dtype=np.int32) for ch, ids in first.items()}
        for kind, is_content in _CONTENT.items():
            closer = _CLOSERS[kind]
            index.content[kind] = np.asarray(
                [i for i, t in enumerate(strings) if t and all(is_content(ch) for ch in t)], dtype=np.int32
            )
            index.closers[kind] = np.asarray([i for i, t in enumerate(strings) if closer in t], dtype=np.int32)
        return index

    def canonical(self, text: str) -> tuple[int, ...]:
        """The tokenizer's own tokenisation of a literal (checked to spell it exactly)."""
        if text not in self._canonical:
            ids = tuple(int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if "".join(self.strings[i] for i in ids) != text:
                raise TokenizerNotSupportedError(f"the tokenizer does not spell {text!r} with usable tokens")
            self._canonical[text] = ids
        return self._canonical[text]


# -- the character automaton ---------------------------------------------------------------------


class _Node:
    """A node of the call trie; a leaf has ``after``: the state its last character leads to."""

    __slots__ = ("after", "children")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.after: State | None = None


@dataclass(frozen=True, eq=False)
class Trie:
    node: _Node


@dataclass(frozen=True)
class Literal:
    """Fixed text still to write (from ``pos``), then ``then``."""

    text: str
    pos: int
    then: State

    @property
    def rest(self) -> str:
        return self.text[self.pos :]


@dataclass(frozen=True, eq=False)
class Text:
    """Free text of one kind; its closing character leads to ``after_close``."""

    kind: str
    after_close: State


@dataclass(frozen=True)
class End:
    """The answer is complete: only EOS."""


State = Trie | Literal | Text | End
_END = End()


def _step(state: State, ch: str) -> State | None:
    """One character through the automaton (None: the character is not allowed there)."""
    if isinstance(state, Trie):
        child = state.node.children.get(ch)
        if child is None:
            return None
        return child.after if child.after is not None else Trie(child)
    if isinstance(state, Literal):
        if state.text[state.pos] != ch:
            return None
        return state.then if state.pos + 1 == len(state.text) else Literal(state.text, state.pos + 1, state.then)
    if isinstance(state, Text):
        if ch == _CLOSERS[state.kind]:
            return state.after_close
        return state if _CONTENT[state.kind](ch) else None
    return None


def walk(state: State, text: str) -> State | None:
    """A token's text through the automaton: the state after it, or None where it is not allowed."""
    current: State | None = state
    for ch in text:
        current = _step(current, ch) if current is not None else None
        if current is None:
            return None
    return current


def _literal(text: str, then: State) -> State:
    return Literal(text, 0, then) if text else then


def call_strings(
    elements: Sequence[UIElement], functions: Sequence[str], keys: Sequence[str] = CONSTRAINED_KEYS
) -> tuple[list[str], list[str]]:
    """(complete calls, heads of calls that end in a free-text argument) on this screen: every call
    that ``parse_response`` accepts with these elements and functions, in ``format_call``'s spelling
    (PRESS_KEY restricted to ``keys``)."""
    complete: list[str] = []
    heads: list[str] = []
    editable = [i for i, e in enumerate(elements) if e.editable]
    for name in functions:
        if name in ("CLICK", "LONG_CLICK"):
            complete += [format_call(name, i) for i in range(len(elements))]
        elif name == "INPUT":
            heads += [format_call(name, i, "")[:-2] for i in editable]  # 'INPUT(3, "'
        elif name == "SCROLL":
            complete += [format_call(name, d) for d in SCROLL_DIRECTIONS]
        elif name == "PRESS_KEY":
            complete += [format_call(name, key) for key in keys]
        elif name == "ANSWER":
            heads.append(format_call(name, "")[:-2])  # 'ANSWER("'
        elif not PARAMETERS[name]:  # GOBACK, DO_NOTHING
            complete.append(f"{name}()")
    return complete, heads


@dataclass
class ActionGrammar:
    """The answers allowed on one screen (see the module docstring), with the allowed token sets
    of the states visited so far cached (a grammar serves one step, or steps with the same screen
    structure: the policy keeps the last few)."""

    index: TokenIndex
    root: State  # the state after the forced prefix: where the call starts (or the thought)
    prefix: str
    max_text_tokens: int = 24
    max_thought_tokens: int = 48
    # allowed sets by trie node or Text state (both live as long as the grammar: their ids are stable)
    _cache: dict[int, TokenSet] = field(default_factory=dict, repr=False)

    @classmethod
    def for_screen(
        cls,
        index: TokenIndex,
        elements: Sequence[UIElement],
        functions: Sequence[str],
        *,
        think: bool = False,
        max_text_tokens: int = 24,
        max_thought_tokens: int = 48,
        keys: Sequence[str] = CONSTRAINED_KEYS,
    ) -> ActionGrammar:
        if max_text_tokens < 0 or max_thought_tokens < 0:
            raise ValueError("token bounds must be >= 0")
        call_end = _literal(CALL_END, _END)
        # one argument state for every head: its allowed set is computed once per grammar
        argument = Text(ARGUMENT, _literal(")" + CALL_END, _END))
        root = _Node()
        complete, heads = call_strings(elements, functions, keys)
        for text, after in [(c, call_end) for c in complete] + [(h, argument) for h in heads]:
            node = root
            for ch in text:
                node = node.children.setdefault(ch, _Node())
            node.after = after
        calls: State = Trie(root)
        if think:
            thought = Text(THOUGHT, _literal(THOUGHT_CLOSE[1:], calls))
            return cls(index, thought, THOUGHT_OPEN, max_text_tokens, max_thought_tokens)
        return cls(index, calls, EMPTY_THOUGHT_PREFIX, max_text_tokens, max_thought_tokens)

    def allowed(self, state: State) -> TokenSet:
        """The tokens that keep the answer valid from ``state`` (not for Literal or End states,
        which are forced)."""
        key = id(state.node) if isinstance(state, Trie) else id(state)
        if key in self._cache:
            return self._cache[key]
        strings = self.index.strings
        if isinstance(state, Trie):
            candidates = np.concatenate(
                [self.index.by_first_char.get(ch, np.zeros(0, np.int32)) for ch in state.node.children]
                or [np.zeros(0, np.int32)]
            )
            ids = [int(i) for i in candidates if walk(state, strings[i]) is not None]
        elif isinstance(state, Text):
            closing = [int(i) for i in self.index.closers[state.kind] if walk(state, strings[i]) is not None]
            ids = np.concatenate([self.index.content[state.kind], np.asarray(closing, dtype=np.int32)]).tolist()
        else:
            raise TypeError(f"{type(state).__name__} states are forced, not chosen")
        if not ids:
            raise RuntimeError("the action grammar has a dead end (no token continues a valid answer)")
        token_set = TokenSet.of(ids, self.index.vocab_size)
        self._cache[key] = token_set
        return token_set

    def forced_close(self, state: Text) -> str:
        """The text that closes free text at its bound: the argument's quote and the rest of the
        answer, or a thought's closing (after a newline)."""
        return '")' + CALL_END if state.kind == ARGUMENT else "\n" + THOUGHT_CLOSE

    def bound(self, state: Text) -> int:
        return self.max_text_tokens if state.kind == ARGUMENT else self.max_thought_tokens
