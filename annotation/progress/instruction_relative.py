"""The improved LCS mode: steps compared by what they do relative to the instruction, garbage removed.

ProgRM (§2.2, Limitations) notes that its LCS labels trail environment-milestone labels and names
the soft match function and the cleaning of "garbage actions" as what to improve. Two changes,
both pure functions over the canonical data model:

1. **Instruction-relative actions.** Recipes are built per task *template*, across instances with
   different usernames, dates and targets. The paper's match compares raw texts, so typing "vanda"
   in one instance and "rex" in another do not match although both type "the username the
   instruction asks for". Here a step's texts are rewritten before matching: any text that the
   instruction names (at word boundaries, case-insensitively) becomes ``<instr>``; digits in other
   texts become ``#`` (prices, counters); ids that end in a number (generated or positional, like
   ``ui-id-1124`` or ``ch3``) and transient state classes (hover, focus, active) are dropped; an
   element without text takes its label's text (a checkbox is known by its label).
2. **Garbage removal.** A step is garbage when the trajectory comes back to a state it was in
   before: effectless clicks and waits, scroll-down/scroll-up pairs, toggling a checkbox twice,
   wandering to another tab and back. States are compared by a signature of the screen: what is
   in view, with its texts, values and checked states, ignoring exact geometry and focus (so a
   click that only focuses a field changes nothing, while scrolling a new element into view does). Garbage steps can
   never be key steps; they inherit the progress of the step before them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from warehouse.model import Action, ActionType, Screen, UIElement

INSTRUCTION_PLACEHOLDER = "<instr>"
_GENERATED_ID = re.compile(r"\d+$")
_TRANSIENT_CLASS = re.compile(r"(hover|focus|active|selected|highlight|disabled|visited)", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class CleanedTrajectory:
    """The kept steps, rewritten relative to the instruction, and where each came from."""

    actions: tuple[Action, ...]
    kept_step_indices: tuple[int, ...]
    n_steps: int

    @property
    def garbage_step_indices(self) -> tuple[int, ...]:
        kept = set(self.kept_step_indices)
        return tuple(i for i in range(self.n_steps) if i not in kept)


def _is_word_char(char: str) -> bool:
    """``re``'s ``\\w`` for one character of a str pattern: alphanumeric (Unicode) or underscore."""
    return char.isalnum() or char == "_"


@lru_cache(maxsize=65536)
def _normalised_instruction(instruction: str) -> str:
    return " ".join(instruction.split()).casefold()


@lru_cache(maxsize=262144)
def _named_in(wanted: str, haystack: str) -> bool:
    """Does ``wanted`` occur in ``haystack`` as a whole word? Word boundaries count only where
    ``wanted`` itself starts/ends with a word character ("$349" matches inside "for $349").

    The same decision as searching ``(?<!\\w)`` + escaped text + ``(?!\\w)`` with ``re`` (every
    start position is tried, overlapping ones included), without compiling a pattern per text."""
    check_left = _is_word_char(wanted[0])
    check_right = _is_word_char(wanted[-1])
    start = haystack.find(wanted)
    while start >= 0:
        end = start + len(wanted)
        if (not check_left or start == 0 or not _is_word_char(haystack[start - 1])) and (
            not check_right or end == len(haystack) or not _is_word_char(haystack[end])
        ):
            return True
        start = haystack.find(wanted, start + 1)
    return False


def named_by_instruction(text: str | None, instruction: str) -> bool:
    """Does the instruction name this text (case-insensitive, whole words)?"""
    if not text:
        return False
    wanted = " ".join(text.split()).casefold()
    if not wanted:
        return False
    return _named_in(wanted, _normalised_instruction(instruction))


@lru_cache(maxsize=262144)
def relative_text(text: str | None, instruction: str) -> str:
    """``<instr>`` if the instruction names the text; else the text with every word the
    instruction names as ``<instr>`` ("mute @dannie" -> "<instr> <instr>") and digit runs as ``#``."""
    if not text:
        return ""
    if named_by_instruction(text, instruction):
        return INSTRUCTION_PLACEHOLDER
    words = [
        INSTRUCTION_PLACEHOLDER if named_by_instruction(word, instruction) else _DIGITS.sub("#", word)
        for word in " ".join(text.split()).casefold().split(" ")
    ]
    return " ".join(words)


def stable_identity(element: UIElement, instruction: str = "") -> tuple[str, str]:
    """(element id, classes) without generated or positional ids and transient state classes; a
    class the instruction names (an icon ``span.like`` for "click on the Like button") is ``<instr>``."""
    element_id = "" if _GENERATED_ID.search(element.element_id or "") else element.element_id
    classes = " ".join(
        INSTRUCTION_PLACEHOLDER if named_by_instruction(c, instruction) else c
        for c in (element.classes or "").split()
        if not _TRANSIENT_CLASS.search(c)
    )
    return element_id, classes


def _label_text(element: UIElement, screen: Screen | None) -> str:
    if element.text or element.description or screen is None or element.parent_ref is None:
        return element.text or element.description
    parent = screen.by_ref(element.parent_ref)
    return parent.text if parent is not None and parent.role == "label" else ""


def relative_action(action: Action, screen: Screen | None, instruction: str) -> Action:
    """The action as it relates to the instruction (see the module docstring)."""
    target = None
    if action.target is not None:
        element_id, classes = stable_identity(action.target, instruction)
        target = UIElement(
            ref="",
            role=action.target.role,
            text=relative_text(_label_text(action.target, screen), instruction),
            element_id=element_id,
            classes=classes,
        )
    text = action.text
    if action.type in (ActionType.INPUT, ActionType.ANSWER):
        text = relative_text(action.text, instruction)
    return Action(action.type, target=target, text=text, direction=action.direction)


def screen_signature(screen: Screen) -> tuple:
    """What a screen shows, ignoring exact geometry and focus: the elements in view (non-empty and
    overlapping the root element) with their texts, values and checked states. Two screens with
    equal signatures are the same state of the task; scrolling something into view changes it."""
    if not screen.elements:
        return ()
    v_left, v_top, v_right, v_bottom = screen.elements[0].bounds
    shown = []
    for e in screen.elements:
        left, top, right, bottom = e.bounds
        if right > left and bottom > top and left < v_right and right > v_left and top < v_bottom and bottom > v_top:
            shown.append((e.role, e.element_id, e.text, e.value, e.checked))
    return tuple(shown)


class ScreenStates:
    """Screens -> small integers, equal iff their :func:`screen_signature` is equal.

    Signatures are computed once per distinct screen *object* (a corpus that shares screens
    between trajectories, as replayed or synthesised ones do, pays once) and interned, so the
    loop detection of :func:`garbage_mask` compares integers. Each cached screen is kept
    referenced, so its ``id`` cannot be reused while the cache lives; make one per batch of
    trajectories and drop it after.
    """

    def __init__(self) -> None:
        self._by_object: dict[int, tuple[Screen, int]] = {}
        self._by_signature: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self._by_object)

    def state(self, screen: Screen) -> int:
        """The interned state of ``screen``."""
        hit = self._by_object.get(id(screen))
        if hit is not None:
            return hit[1]
        signature = screen_signature(screen)
        state = self._by_signature.setdefault(signature, len(self._by_signature))
        self._by_object[id(screen)] = (screen, state)
        return state


def garbage_mask(screens_before: Sequence[Screen], n_steps: int, states: ScreenStates | None = None) -> list[bool]:
    """Which steps are garbage: those undone later or without effect (a loop back to an earlier state).

    ``screens_before[t]`` is the screen before step t; the state after step t is the screen before
    step t + 1. The state after the last step is unknown, so the last step is never garbage.
    ``states`` may carry signatures already computed for these screens (:class:`ScreenStates`).
    """
    garbage = [False] * n_steps
    if n_steps == 0:
        return garbage
    states = states if states is not None else ScreenStates()
    signatures = [states.state(s) for s in screens_before[:n_steps]]
    stack: list[tuple[int, int]] = [(signatures[0], -1)]  # (state, the step that led to it)
    for t in range(n_steps - 1):
        after = signatures[t + 1]
        loop_start = next((k for k in range(len(stack) - 1, -1, -1) if stack[k][0] == after), None)
        if loop_start is None:
            stack.append((after, t))
            continue
        for _, step in stack[loop_start + 1 :]:
            garbage[step] = True
        garbage[t] = True
        del stack[loop_start + 1 :]
    return garbage


def collapse_repeats(actions: Sequence[Action], kept: Sequence[int]) -> tuple[int, ...]:
    """Of a run of identical consecutive actions (scrolling down five times to find a post), keep
    the last: repeating a step is one step of the recipe, and the last repetition completes it."""
    out: list[int] = []
    previous = None
    for i in kept:
        text = actions[i].canonical_text()
        if out and previous == text:
            out[-1] = i
        else:
            out.append(i)
        previous = text
    return tuple(out)


def clean_trajectory(
    actions: Sequence[Action], screens_before: Sequence[Screen], instruction: str, states: ScreenStates | None = None
) -> CleanedTrajectory:
    """Drop garbage steps, collapse repeated ones, and rewrite the rest relative to the instruction
    (the improved mode). ``states``: a :class:`ScreenStates` shared by a batch of trajectories."""
    n = len(actions)
    garbage = garbage_mask(screens_before, n, states)
    kept = collapse_repeats(actions, [i for i in range(n) if not garbage[i]])
    rewritten = tuple(relative_action(actions[i], screens_before[i], instruction) for i in kept)
    return CleanedTrajectory(rewritten, kept, n)


def expand_to_all_steps(
    kept_progress: Sequence[float], kept_is_key: Sequence[bool], cleaned: CleanedTrajectory
) -> tuple[list[float], list[bool]]:
    """Labels of the kept steps -> labels of every step: garbage steps are never key steps and
    inherit the progress of the nearest preceding step (0 before the first), as in §2.2 stage 3."""
    progress = [0.0] * cleaned.n_steps
    is_key = [False] * cleaned.n_steps
    for value, key, step in zip(kept_progress, kept_is_key, cleaned.kept_step_indices, strict=True):
        progress[step] = value
        is_key[step] = key
    running = 0.0
    kept = set(cleaned.kept_step_indices)
    for t in range(cleaned.n_steps):
        if t in kept:
            running = max(running, progress[t])
        progress[t] = running
    return progress, is_key
