"""The LLM actor's prompt (after ProgRM Table 11) and the parser of its answers.

The prompt is a system message that lists the actions the environment supports as Python-style
calls and asks for ``<think>...</think><action>...</action>``, and a user message with the
instruction, the current screen as *numbered* elements and the action history. The wording is
ours, in the spirit of Table 11 but not tied to WikiHow or to Android: the same text serves
MiniWoB++ web pages and Android screens. Table 11's "Completed instructions" slot (WikiHow tasks
chain several instructions) is left out: our tasks have one instruction each.

``element_id`` in a call is the index of an element in :func:`numbered_elements` (the screen's
actionable elements: what ``envs.policies`` can click or type into), *not* the page's DOM id, so
a model never has to copy an opaque id; the parser resolves the index back to the screen's
``UIElement`` with the same list. ``DO_NOTHING()`` is ``ActionType.NOTHING``; ``PRESS_KEY(key)``
is added to Table 11's list because MiniWoB++ tasks need Enter and Tab.

:func:`parse_response` never raises: an answer that is not one well-formed, supported action on
this screen is a :class:`ParseFailure` with a reason code (:data:`FAILURE_REASONS`). The caller
acts ``NOTHING`` and records ``format_ok = False``, which the GUI-Shepherd Eq. 3 format reward
(``training.rl.rewards.prm.format_rewards``) penalises.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envs.policies import clickable_elements, editable_elements
from warehouse.model import SCROLL_DIRECTIONS, Action, ActionType, Screen, UIElement

#: The functions of the prompt, in the order the system message lists them, with their action types.
FUNCTIONS: dict[str, ActionType] = {
    "INPUT": ActionType.INPUT,
    "CLICK": ActionType.CLICK,
    "LONG_CLICK": ActionType.LONG_CLICK,
    "SCROLL": ActionType.SCROLL,
    "PRESS_KEY": ActionType.PRESS_KEY,
    "ANSWER": ActionType.ANSWER,
    "GOBACK": ActionType.GOBACK,
    "DO_NOTHING": ActionType.NOTHING,
}
#: Spellings accepted besides the listed ones (models echo the history's canonical names).
ALIASES: dict[str, str] = {"NOTHING": "DO_NOTHING", "GO_BACK": "GOBACK", "BACK": "GOBACK", "TYPE": "INPUT"}
#: Argument names per function, in positional order (keyword arguments are accepted by these names).
PARAMETERS: dict[str, tuple[str, ...]] = {
    "INPUT": ("element_id", "text"),
    "CLICK": ("element_id",),
    "LONG_CLICK": ("element_id",),
    "SCROLL": ("direction",),
    "PRESS_KEY": ("key",),
    "ANSWER": ("text",),
    "GOBACK": (),
    "DO_NOTHING": (),
}
_DOCS: dict[str, str] = {
    "INPUT": "INPUT(element_id: int, text: str)  # type text into an editable element (its value is replaced)",
    "CLICK": "CLICK(element_id: int)  # click an element",
    "LONG_CLICK": "LONG_CLICK(element_id: int)  # press and hold an element",
    "SCROLL": "SCROLL(direction: UP | DOWN | LEFT | RIGHT)  # scroll to see more of a long or wide screen",
    "PRESS_KEY": 'PRESS_KEY(key: str)  # press a key or a combination, e.g. "Enter", "Tab", "Ctrl+A"',
    "ANSWER": "ANSWER(text: str)  # give the user an answer",
    "GOBACK": "GOBACK()  # go back to the previous screen",
    "DO_NOTHING": "DO_NOTHING()  # do nothing and wait one step",
}
_EXAMPLES: dict[str, str] = {
    "INPUT": 'INPUT(3, "blue scooter")',
    "CLICK": "CLICK(7)",
    "SCROLL": "SCROLL(DOWN)",
    "PRESS_KEY": 'PRESS_KEY("Enter")',
    "GOBACK": "GOBACK()",
}

# Parse-failure reason codes (ParseFailure.reason).
NO_ACTION_BLOCK = "no_action_block"  # no <action> tag at all
EMPTY_ACTION = "empty_action"  # <action></action> with nothing inside
NOT_A_CALL = "not_a_call"  # the block is not NAME(...)
SEVERAL_ACTIONS = "several_actions"  # more than one call in the block
UNKNOWN_FUNCTION = "unknown_function"  # NAME is not an action of the prompt
UNSUPPORTED_FUNCTION = "unsupported_function"  # a known action the environment lacks (not offered)
BAD_ARGUMENTS = "bad_arguments"  # wrong number or type of arguments, unknown keyword, bad direction
ELEMENT_OUT_OF_RANGE = "element_out_of_range"  # element_id is not a number of the screen's list
NOT_EDITABLE = "not_editable"  # INPUT into an element that is not editable
FAILURE_REASONS: tuple[str, ...] = (
    NO_ACTION_BLOCK,
    EMPTY_ACTION,
    NOT_A_CALL,
    SEVERAL_ACTIONS,
    UNKNOWN_FUNCTION,
    UNSUPPORTED_FUNCTION,
    BAD_ARGUMENTS,
    ELEMENT_OUT_OF_RANGE,
    NOT_EDITABLE,
)

#: How many elements and history entries a prompt shows at most (bounds the prompt's length).
MAX_ELEMENTS = 80
MAX_HISTORY = 20
_TEXT_LIMIT = 80

_ACTION_BLOCK = re.compile(r"<action>(.*?)(?:</action>|$)", re.IGNORECASE | re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>(.*?)(?:</think>|<action>|$)", re.IGNORECASE | re.DOTALL)
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*;?\s*$", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


# -- the screen as numbered elements ----------------------------------------------------------


def numbered_elements(screen: Screen, max_elements: int = MAX_ELEMENTS) -> list[UIElement]:
    """The screen's actionable elements in document order: what ``element_id`` numbers.

    Clickable targets and editable fields as ``envs.policies`` defines them (so the LLM sees the
    same choices as the CPU policy's candidates), at most ``max_elements`` (the first ones)."""
    keep = {e.ref for e in clickable_elements(screen)} | {e.ref for e in editable_elements(screen)}
    return [e for e in screen.elements if e.ref in keep][:max_elements]


def _short(text: str, limit: int = _TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def element_line(index: int, element: UIElement) -> str:
    """One numbered element: ``[3] textbox#username value="ada" [editable, focused]``."""
    label = element.role
    if element.element_id:
        label += f"#{element.element_id}"
    elif element.classes:
        label += "." + ".".join(element.classes.split()[:3])
    shown = element.text or element.description
    if shown:
        label += " " + json.dumps(_short(shown), ensure_ascii=False)
    if element.value not in (None, ""):
        label += " value=" + json.dumps(_short(element.value or ""), ensure_ascii=False)
    flags = [name for name, on in (("clickable", element.clickable), ("editable", element.editable)) if on]
    if element.checked is not None:
        flags.append("checked" if element.checked else "unchecked")
    if element.focused:
        flags.append("focused")
    return f"[{index}] {label}" + (f" [{', '.join(flags)}]" if flags else "")


def screen_text(elements: Sequence[UIElement], total: int | None = None) -> str:
    """The numbered elements, one per line; says how many were left out when the list was cut."""
    if not elements:
        return "(no actionable elements)"
    lines = [element_line(i, e) for i, e in enumerate(elements)]
    if total is not None and total > len(elements):
        lines.append(f"({total - len(elements)} more elements not shown)")
    return "\n".join(lines)


# -- the action history -----------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryEntry:
    """One past step as the prompt shows it: the action (semantically: numbers change between
    screens) and, where it went wrong, why (the model's output did not parse; the environment could
    not carry it out)."""

    action: Action
    format_failure: str | None = None
    problem: str | None = None

    def text(self) -> str:
        call = "DO_NOTHING()" if self.action.type is ActionType.NOTHING else self.action.canonical_text()
        if self.format_failure is not None:
            return f"{call}  (your answer was not a valid action: {self.format_failure})"
        if self.problem is not None:
            return f"{call}  (failed: {_short(self.problem, 120)})"
        return call


def history_text(history: Sequence[HistoryEntry], max_entries: int = MAX_HISTORY) -> str:
    """Numbered past actions, the latest ``max_entries`` of them."""
    if not history:
        return "(none yet)"
    start = max(0, len(history) - max_entries)
    lines = [f"{i + 1}. {entry.text()}" for i, entry in enumerate(history) if i >= start]
    if start:
        lines.insert(0, f"({start} earlier actions not shown)")
    return "\n".join(lines)


# -- messages ---------------------------------------------------------------------------------


def offered_functions(supported: frozenset[ActionType] | None = None) -> list[str]:
    """The functions the prompt lists: those whose action type the environment supports (all when
    ``supported`` is None). ``DO_NOTHING`` is always offered: it is also what a failure becomes."""
    return [
        name
        for name, action_type in FUNCTIONS.items()
        if supported is None or action_type in supported or action_type is ActionType.NOTHING
    ]


def system_prompt(max_steps: int, supported: frozenset[ActionType] | None = None) -> str:
    """The system message (ProgRM Table 11, paraphrased and made interface-neutral)."""
    functions = offered_functions(supported)
    listed = "\n".join(f"* {_DOCS[name]}" for name in functions)
    examples = "\n".join(_EXAMPLES[name] for name in functions if name in _EXAMPLES)
    return (
        "You are a skilled assistant that operates graphical user interfaces: web pages and mobile apps. "
        "At every step you are given a task, the current screen and the actions taken so far, and you "
        f"choose the next action so that the task is finished within {max_steps} steps. Write the action "
        "as a Python function call. The available actions are:\n\n"
        f"{listed}\n\n"
        "element_id is the number in square brackets in front of an element of the current screen.\n\n"
        f'Some examples of actions:\n"""\n{examples}\n"""\n\n'
        "First think about the task and the screen as an internal monologue, then give exactly one action. "
        "Answer in this format:\n"
        "<think>\n...\n</think>\n<action>\n...\n</action>\n\n"
        "For example:\n"
        "<think>\nThe search box is element 3, so I type the query into it.\n</think>\n"
        '<action>\nINPUT(3, "weather today")\n</action>\n\n'
        "The examples above only show how actions and answers are written; they have nothing to do "
        "with the task that follows."
    )


def user_prompt(
    instruction: str,
    elements: Sequence[UIElement],
    history: Sequence[HistoryEntry],
    *,
    step_index: int,
    max_steps: int,
    total_elements: int | None = None,
) -> str:
    """The user message: instruction, numbered screen, action history, and where in the budget we are."""
    return (
        f"Task:\n{instruction}\n\n"
        f"Current screen:\n{screen_text(elements, total_elements)}\n\n"
        f"Action history:\n{history_text(history)}\n\n"
        f"This is step {step_index + 1} of at most {max_steps}."
    )


def build_messages(
    instruction: str,
    screen: Screen,
    history: Sequence[HistoryEntry],
    *,
    step_index: int,
    max_steps: int,
    supported: frozenset[ActionType] | None = None,
    max_elements: int = MAX_ELEMENTS,
) -> tuple[list[dict[str, str]], list[UIElement]]:
    """(chat messages, the numbered elements they show): the parser needs the same elements."""
    everything = numbered_elements(screen, max_elements=len(screen.elements))
    elements = everything[:max_elements]
    messages = [
        {"role": "system", "content": system_prompt(max_steps, supported)},
        {
            "role": "user",
            "content": user_prompt(
                instruction,
                elements,
                history,
                step_index=step_index,
                max_steps=max_steps,
                total_elements=len(everything),
            ),
        },
    ]
    return messages, elements


def plain_chat_text(messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
    """A chat as plain text, for tokenizers without a chat template (Table 11's own layout:
    ``System: ...``, ``User: ...``), ending where the assistant's answer starts."""
    parts = [f"{m['role'].capitalize()}:\n{m['content']}" for m in messages]
    if add_generation_prompt:
        parts.append("Assistant:\n")
    return "\n\n".join(parts)


# -- answers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedAction:
    """A well-formed answer: the action on this screen, the call as written (normalised), the thought."""

    action: Action
    call: str
    thought: str = ""

    ok = True


@dataclass(frozen=True)
class ParseFailure:
    """An answer that is not a valid action: ``reason`` is one of :data:`FAILURE_REASONS`."""

    reason: str
    detail: str
    raw_action: str = ""

    ok = False

    def describe(self) -> str:
        return f"{self.reason}: {self.detail}"


def format_call(function: str, *args: int | str) -> str:
    """A call as the prompt writes it: numbers bare, directions bare, texts JSON-quoted."""
    rendered = [
        str(a) if isinstance(a, int) or (function == "SCROLL" and a in SCROLL_DIRECTIONS) else json.dumps(a)
        for a in args
    ]
    return f"{function}({', '.join(rendered)})"


def format_response(call: str, thought: str = "") -> str:
    """An answer in the prompt's format (what supervised warm-start targets look like)."""
    return f"<think>\n{thought}\n</think>\n<action>\n{call}\n</action>"


def action_to_call(action: Action, elements: Sequence[UIElement]) -> str | None:
    """The call that :func:`parse_response` reads back as ``action`` on these elements, or None when
    the action cannot be written in the prompt's language (its target is not among the numbered
    elements, an UNKNOWN or OPEN_APP action)."""
    index = None
    if action.target is not None:
        index = next((i for i, e in enumerate(elements) if e.ref == action.target.ref), None)
        if index is None:
            return None
    match action.type:
        case ActionType.CLICK | ActionType.LONG_CLICK:
            return format_call(action.type.value, index) if index is not None else None
        case ActionType.INPUT:
            return format_call("INPUT", index, action.text or "") if index is not None else None
        case ActionType.SCROLL:
            return format_call("SCROLL", action.direction) if action.direction else None
        case ActionType.PRESS_KEY:
            return format_call("PRESS_KEY", action.text) if action.text else None
        case ActionType.ANSWER:
            return format_call("ANSWER", action.text or "")
        case ActionType.GOBACK:
            return "GOBACK()"
        case ActionType.NOTHING:
            return "DO_NOTHING()"
    return None


def _action_block(text: str) -> tuple[str | None, str]:
    """(the last <action> block's content or None, the thought). The thought ends at </think> or,
    when a model forgets to close it, at <action>; an unclosed <action> runs to the end (a stop
    string or the token budget cut it)."""
    think = _THINK_BLOCK.search(text)
    thought = think.group(1).strip() if think else ""
    after_think = text
    close = re.search(r"</think>", text, re.IGNORECASE)
    if close is not None:
        after_think = text[close.end() :]
    blocks = _ACTION_BLOCK.findall(after_think) or _ACTION_BLOCK.findall(text)
    return (blocks[-1] if blocks else None), thought


def _literal(node: ast.expr) -> object:
    """A call argument as a Python value; bare names (DOWN, Enter) are their own text."""
    if isinstance(node, ast.Name):
        return node.id
    return ast.literal_eval(node)


def _split_call(call: str) -> tuple[str, list[object]] | ParseFailure:
    """NAME(args...) -> (NAME, arguments in PARAMETERS order), by Python's parser, with a lenient
    fallback for unescaped quotes inside a text argument (``INPUT(2, "say "hi"")``)."""
    match = _CALL.match(call)
    if match is None:
        return ParseFailure(NOT_A_CALL, f"not a function call: {call[:80]!r}", call)
    raw_name = match.group(1).upper()
    name = ALIASES.get(raw_name, raw_name)
    if name not in FUNCTIONS:
        return ParseFailure(UNKNOWN_FUNCTION, f"no action named {match.group(1)!r}", call)
    parameters = PARAMETERS[name]
    try:
        node = ast.parse(f"f({match.group(2)})", mode="eval").body
        assert isinstance(node, ast.Call)
        args = [_literal(a) for a in node.args]
        keywords = {k.arg: _literal(k.value) for k in node.keywords}
    except (SyntaxError, ValueError, TypeError, AssertionError):
        # Python cannot read it: the one repair worth trying is a text argument with inner quotes.
        inner = match.group(2).strip()
        if name in ("INPUT", "ANSWER", "PRESS_KEY"):
            head, _, tail = inner.partition(",") if name == "INPUT" else ("", "", inner)
            tail = tail.strip()
            if len(tail) >= 2 and tail[0] == tail[-1] and tail[0] in "\"'":
                args = ([head.strip()] if name == "INPUT" else []) + [tail[1:-1]]
                keywords = {}
            else:
                return ParseFailure(BAD_ARGUMENTS, f"cannot read the arguments of {name}: {inner[:80]!r}", call)
        else:
            return ParseFailure(BAD_ARGUMENTS, f"cannot read the arguments of {name}: {inner[:80]!r}", call)
    if any(k is None or k not in parameters for k in keywords):
        return ParseFailure(BAD_ARGUMENTS, f"{name} takes {', '.join(parameters) or 'no arguments'}", call)
    values = list(args)
    for position, parameter in enumerate(parameters):
        if parameter in keywords:
            if position < len(values):
                return ParseFailure(BAD_ARGUMENTS, f"{name}: {parameter} given twice", call)
            values.append(keywords[parameter])
    if len(values) != len(parameters):
        expected = f"{len(parameters)} argument{'s' if len(parameters) != 1 else ''}"
        return ParseFailure(
            BAD_ARGUMENTS, f"{name} takes {expected} ({', '.join(parameters)}), got {len(values)}", call
        )
    return name, values


def _element_index(value: object, elements: Sequence[UIElement], call: str) -> int | ParseFailure:
    if isinstance(value, list) and len(value) == 1:  # CLICK([3]): the number as the screen shows it
        value = value[0]
    if isinstance(value, str) and re.fullmatch(r"\s*\[?\s*-?\d+\s*\]?\s*", value):
        value = int(value.strip().strip("[]"))
    if isinstance(value, bool) or not isinstance(value, int):
        return ParseFailure(BAD_ARGUMENTS, f"element_id must be a number, got {value!r}", call)
    if not 0 <= value < len(elements):
        return ParseFailure(
            ELEMENT_OUT_OF_RANGE, f"element {value} is not on the screen (elements 0-{len(elements) - 1})", call
        )
    return value


def _text(value: object, what: str, call: str) -> str | ParseFailure:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return ParseFailure(BAD_ARGUMENTS, f"{what} must be text, got {value!r}", call)
    return str(value)


def parse_response(
    text: str, elements: Sequence[UIElement], supported: frozenset[ActionType] | None = None
) -> ParsedAction | ParseFailure:
    """A model's answer -> the action it names on this screen, or why it names none.

    Reads the last ``<action>`` block (after ``</think>`` when there is one), tolerant of
    whitespace, code fences, single or double quotes, keyword arguments, bare directions and keys,
    and lower-case names; ``elements`` are the numbered elements the prompt showed, ``supported``
    the action types it offered (None: all). Never raises."""
    block, thought = _action_block(text)
    if block is None:
        return ParseFailure(NO_ACTION_BLOCK, "the answer has no <action> block")
    call = _FENCE.sub("", block.strip()).strip().strip("`").strip()
    if not call:
        return ParseFailure(EMPTY_ACTION, "the <action> block is empty")
    lines = [line.strip() for line in call.splitlines() if line.strip()]
    if len(lines) > 1 and all(_CALL.match(line) for line in lines):
        return ParseFailure(SEVERAL_ACTIONS, f"{len(lines)} actions in one answer; give exactly one", call)
    split = _split_call(" ".join(lines))
    if isinstance(split, ParseFailure):
        return split
    name, values = split
    action_type = FUNCTIONS[name]
    if supported is not None and action_type not in supported and action_type is not ActionType.NOTHING:
        return ParseFailure(UNSUPPORTED_FUNCTION, f"{name} is not available here", call)
    action: Action
    match name:
        case "CLICK" | "LONG_CLICK":
            index = _element_index(values[0], elements, call)
            if isinstance(index, ParseFailure):
                return index
            action, normal = Action(action_type, elements[index]), format_call(name, index)
        case "INPUT":
            index = _element_index(values[0], elements, call)
            if isinstance(index, ParseFailure):
                return index
            typed = _text(values[1], "text", call)
            if isinstance(typed, ParseFailure):
                return typed
            target = elements[index]
            if not target.editable:
                return ParseFailure(NOT_EDITABLE, f"element {index} ({target.describe()}) is not editable", call)
            action, normal = Action(action_type, target, text=typed), format_call(name, index, typed)
        case "SCROLL":
            direction = str(values[0]).strip().upper() if isinstance(values[0], str) else ""
            if direction not in SCROLL_DIRECTIONS:
                return ParseFailure(BAD_ARGUMENTS, f"direction must be one of {', '.join(SCROLL_DIRECTIONS)}", call)
            action, normal = Action(action_type, direction=direction), format_call(name, direction)
        case "PRESS_KEY":
            key = _text(values[0], "key", call)
            if isinstance(key, ParseFailure):
                return key
            if not key.strip():
                return ParseFailure(BAD_ARGUMENTS, "PRESS_KEY needs a key", call)
            action, normal = Action(action_type, text=key.strip()), format_call(name, key.strip())
        case "ANSWER":
            answer = _text(values[0], "text", call)
            if isinstance(answer, ParseFailure):
                return answer
            action, normal = Action(action_type, text=answer), format_call(name, answer)
        case _:  # GOBACK, DO_NOTHING
            action, normal = Action(action_type), f"{name}()"
    return ParsedAction(action, normal, thought)
