"""Reward-model prompts (ProgRM Tables 7-8) and the rule that truncates a state to a token budget."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from training.base.states import StepState
from training.reward_models.kinds import kind_spec

log = logging.getLogger(__name__)


#: ProgRM's system prompt (Table 7/8) with its WikiHow-specific sentences made interface-neutral.
SYSTEM_PROMPT = (
    "You are an expert of GUI use, on web pages and in mobile apps. You know well how people can "
    "search for things, fill in forms, pick options from lists, menus and tabs, and check what the "
    "screen shows. So you can accurately assess how efficient the people are finishing a particular "
    "task on this interface.\n"
    "Now you will be given a trajectory of other's operation, including\n"
    "* instructions describing the task goal\n"
    "* history actions leading to current state\n"
    "* screen representation reflecting the current state"
)
CANDIDATE_BULLET = "\n* a candidate action to take in the current state"

#: Counts tokens of several texts at once (a tokenizer's batch length, or an approximation).
TokenCounter = Callable[[Sequence[str]], Sequence[int]]


def approx_token_count(texts: Sequence[str]) -> list[int]:
    """About 4 characters per token (GPT/BERT-style tokenizers on English and markup); +1 per text."""
    return [len(t) // 4 + 1 for t in texts]


@dataclass(frozen=True)
class TruncationBudget:
    """How many tokens a prompt may take, and what is protected.

    The rule (:func:`truncate_state`): the instruction is always kept (cut only if it alone
    exceeds ``max_instruction_share`` of the budget); the ``keep_recent_actions`` latest actions
    and the candidate action are kept; the screen gets what remains and is cut from the end
    (document order: the page's top first); older actions fill any budget left, newest first.
    Omitted parts are marked ("[k earlier actions omitted]", "[n more elements]").
    """

    max_tokens: int = 2048
    keep_recent_actions: int = 3
    max_instruction_share: float = 0.25
    min_screen_tokens: int = 64


@dataclass(frozen=True, slots=True)
class TruncatedState:
    """What of a state fits the budget."""

    instruction: str
    history: tuple[str, ...]  # the kept (latest) actions
    n_history_omitted: int
    screen_lines: tuple[str, ...]
    n_screen_omitted: int
    action: str | None


def truncate_state(
    state: StepState,
    budget: TruncationBudget,
    count_tokens: TokenCounter = approx_token_count,
    overhead_tokens: int = 0,
) -> TruncatedState:
    """Apply the truncation rule of :class:`TruncationBudget` to one state.

    ``overhead_tokens`` is what the fixed prompt text costs. Tokens are counted per piece (one
    per action and per screen line, +1 each for the newline), which slightly over-counts.
    """
    pieces = [state.instruction, state.action or "", *state.history, *state.screen_lines]
    counts = [int(c) + 1 for c in count_tokens(pieces)]
    n_hist = len(state.history)
    instr_tokens, action_tokens = counts[0], counts[1] if state.action else 0
    hist_tokens = counts[2 : 2 + n_hist]
    line_tokens = counts[2 + n_hist :]

    available = budget.max_tokens - overhead_tokens
    instruction = state.instruction
    max_instr = max(16, int(budget.max_instruction_share * budget.max_tokens))
    if instr_tokens > max_instr:  # keep the start of a pathological instruction
        keep_chars = max(1, int(len(instruction) * max_instr / instr_tokens))
        instruction = instruction[:keep_chars] + " [...]"
        instr_tokens = max_instr
    available -= instr_tokens + action_tokens

    recent = min(budget.keep_recent_actions, n_hist)
    recent_tokens = sum(hist_tokens[n_hist - recent :])
    screen_allowance = max(budget.min_screen_tokens, available - recent_tokens)
    kept_lines = 0
    used = 0
    for tokens in line_tokens:
        if used + tokens > screen_allowance:
            break
        used += tokens
        kept_lines += 1
    available -= used + recent_tokens

    kept_history = recent
    for tokens in reversed(hist_tokens[: n_hist - recent]):
        if tokens > available:
            break
        available -= tokens
        kept_history += 1
    return TruncatedState(
        instruction=instruction,
        history=tuple(state.history[n_hist - kept_history :]),
        n_history_omitted=n_hist - kept_history,
        screen_lines=tuple(state.screen_lines[:kept_lines]),
        n_screen_omitted=len(state.screen_lines) - kept_lines,
        action=state.action,
    )


def _format_history(kept: TruncatedState) -> str:
    if not kept.history and not kept.n_history_omitted:
        return "None"
    lines = [f"[{kept.n_history_omitted} earlier actions omitted]"] if kept.n_history_omitted else []
    lines += [f"{kept.n_history_omitted + i + 1}. {a}" for i, a in enumerate(kept.history)]
    return "\n" + "\n".join(lines)


def _format_screen(kept: TruncatedState) -> str:
    lines = list(kept.screen_lines)
    if kept.n_screen_omitted:
        lines.append(f"[{kept.n_screen_omitted} more elements]")
    return "\n" + "\n".join(lines) if lines else "(empty)"


def prompt_parts(kind: str) -> tuple[str, str]:
    """(system prompt, question) of a kind: Table 7 for ProgRM, Table 8 for the ORM, and the same
    frame with a candidate action for step judges."""
    spec = kind_spec(kind)
    system = SYSTEM_PROMPT + (CANDIDATE_BULLET if spec.state == "before_action" else "")
    return system, spec.question


def render_user_message(kind: str, kept: TruncatedState) -> str:
    """The user turn of Tables 7/8: question, instructions, history actions, current screen."""
    _, question = prompt_parts(kind)
    text = (
        f"{question}\nInstructions: {kept.instruction}\nHistory Actions: {_format_history(kept)}\n"
        f"Current screen: {_format_screen(kept)}"
    )
    if kept.action is not None:
        text += f"\nCandidate action: {kept.action}"
    return text


def render_prompt(
    kind: str,
    state: StepState,
    budget: TruncationBudget = TruncationBudget(),
    count_tokens: TokenCounter = approx_token_count,
) -> str:
    """The whole prompt as plain text ("System: ...\\nUser: ..."), truncated to ``budget``.

    Models with a chat template render the same two messages with it instead (see
    ``training.reward_models.models``); the truncation rule is the same.
    """
    system, question = prompt_parts(kind)
    frame = (
        f"System: {system}\nUser: {question}\nInstructions: \nHistory Actions: \nCurrent screen: \nCandidate action: "
    )
    overhead = int(count_tokens([frame])[0]) + 8
    kept = truncate_state(state, budget, count_tokens, overhead_tokens=overhead)
    return f"System: {system}\nUser: {render_user_message(kind, kept)}"
