"""What a learned GUI policy can do on a screen: the candidate actions, described relative to the
instruction, with the scalar features its scorer reads.

At every step the policy enumerates: a click on every element a click can aim at, typing each of
the instruction's values (and each whole number of a small range it names, :func:`range_values`)
into every editable field, Enter, scrolling down and up, and waiting (``NOTHING``). The scorer
(:mod:`training.policy.network`) picks among them.

Texts are written *relative to the instruction* (as the improved LCS mode does): every value the
instruction names, a slot of the task's instruction template (``username``, ``target``, ...) or a
quoted phrase, is replaced by its slot name in angle brackets. "Enter the username "renda" ..." and
typing "renda" into ``textbox#username`` become "Enter the username <username> ..." and
``INPUT(textbox#username, "<username>")``: the same texts in every instance of a task, so the
policy generalises across instances and the sentence encodings are computed once per task.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from envs.policies import clickable_elements, editable_elements
from training.base.states import action_in_context, instruction_match, target_context
from warehouse.model import Action, ActionType, Screen, UIElement

#: Action types a candidate can have, in the order of the type features.
CANDIDATE_TYPES: tuple[ActionType, ...] = (
    ActionType.CLICK,
    ActionType.INPUT,
    ActionType.PRESS_KEY,
    ActionType.SCROLL,
    ActionType.NOTHING,
)
#: Element roles grouped into the role features (anything else is "other").
ROLE_GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("button", frozenset({"button", "submit", "reset"})),
    ("field", frozenset({"textbox", "password", "textarea", "searchbox", "combobox", "spinbutton", "input_text"})),
    ("checkbox", frozenset({"checkbox"})),
    ("radio", frozenset({"radio"})),
    ("link", frozenset({"link", "a"})),
    ("label", frozenset({"label"})),
    ("option", frozenset({"option", "listitem", "li", "menuitem", "treeitem"})),
    ("heading", frozenset({"heading", "h1", "h2", "h3", "h4", "tab"})),
)
FEATURE_NAMES: tuple[str, ...] = (
    *(f"type_{t.value.lower()}" for t in CANDIDATE_TYPES),
    *(f"role_{name}" for name, _ in ROLE_GROUPS),
    "role_other",
    "target_names_a_value",
    "match_segment_share",
    "match_instruction_share",
    "match_any_entity",
    "match_entity_share",
    "types_a_value",
    "value_fits_field",
    "field_already_holds_it",
    "field_empty",
    "repeats_in_history",
    "repeats_last_action",
    "target_focused",
    "target_checked",
    "target_unchecked",
    "document_position",
    "episode_progress",
    "clicks_a_field",
    "focused_field_filled",
)
N_FEATURES = len(FEATURE_NAMES)
SLOT_PATTERN = re.compile(r"<[a-z0-9_]+>")
_QUOTED = re.compile(r'"([^"]+)"')
_TOKEN = re.compile(r"[a-z0-9]+")
# "between 0-9", "between 1 and 5", "from 3 to 7": a range of whole numbers the instruction names
_NUMBER_RANGE = re.compile(r"\b(?:between|from)\s+(-?\d{1,4})\s*(?:-|to|and)\s*(-?\d{1,4})\b", re.IGNORECASE)
#: The most numbers :func:`range_values` offers (a wider range names none: typing every number of
#: 1-1000 is not a candidate set a scorer can choose from).
MAX_RANGE_VALUES = 20


@dataclass(frozen=True, slots=True)
class Candidate:
    """One action the policy may take: the action itself, its instruction-relative description (what
    the scorer's encoder reads) and its scalar features (:data:`FEATURE_NAMES`)."""

    action: Action
    text: str
    features: tuple[float, ...]


def instruction_values(instruction: str, slots: Mapping[str, str]) -> dict[str, str]:
    """The values an instruction names, by slot name: the task template's slots, then quoted
    phrases not already among them (``quoted``, ``quoted_2``, ...). Empty values are dropped."""
    values = {name: value for name, value in slots.items() if value and value.strip()}
    known = {v.casefold() for v in values.values()}
    for i, phrase in enumerate(_QUOTED.findall(instruction)):
        if phrase.strip() and phrase.casefold() not in known:
            values["quoted" if i == 0 else f"quoted_{i + 1}"] = phrase
            known.add(phrase.casefold())
    return values


@lru_cache(maxsize=4096)  # called at every step with the episode's one instruction
def range_values(instruction: str) -> tuple[str, ...]:
    """Every whole number of the small ranges the instruction names, in order ("Guess the number
    between 0-9": "0" ... "9"), for the typing candidates.

    guess-number asks for a number the instruction names only by its bounds, so without these the
    policy could type nothing there (docs/rl.md, "Task blocks"). A range of more than
    :data:`MAX_RANGE_VALUES` numbers gives none. These are not instruction values: texts keep them
    as they are, not as slot names."""
    numbers: dict[str, None] = {}
    for match in _NUMBER_RANGE.finditer(instruction):
        low, high = sorted((int(match.group(1)), int(match.group(2))))
        if high - low + 1 <= MAX_RANGE_VALUES:
            numbers.update(dict.fromkeys(str(n) for n in range(low, high + 1)))
    return tuple(numbers)


@lru_cache(maxsize=65536)
def _value_pattern(value: str) -> re.Pattern[str]:
    left = r"(?<!\w)" if value[:1].isalnum() else ""
    right = r"(?!\w)" if value[-1:].isalnum() else ""
    return re.compile(left + re.escape(value) + right, re.IGNORECASE)


def relative_text(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every instruction value replaced by ``<slot name>`` (longest values first, at
    word boundaries, case-insensitively)."""
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        text = _value_pattern(value).sub(f"<{name}>", text)
    return text


def _role_features(role: str | None) -> list[float]:
    if role is None:
        return [0.0] * (len(ROLE_GROUPS) + 1)
    flags = [1.0 if role in members else 0.0 for _, members in ROLE_GROUPS]
    return [*flags, 0.0 if any(flags) else 1.0]


def _tokens(text: str) -> set[str]:
    return set(_TOKEN.findall(text.casefold()))


def _field_identity(element: UIElement, screen_records: Sequence[Mapping]) -> set[str]:
    context = target_context(screen_records, element.ref) or ""
    return _tokens(" ".join([element.element_id, element.classes, element.description, context]))


def _still_there(action: Action, on_screen: Collection[str]) -> str | None:
    """The ref of a past action's target where that element is still on the screen, else None.

    Repeats (``repeats_in_history``, ``repeats_last_action``) are the same action text on the same
    element: several elements can share one text (click-shades' squares of one colour are all
    ``span "<color>"``) and a click on a second is not a repeat of the first. An element no longer
    on the screen (re-rendered under a new ref, or an action without a target) cannot be told from
    its successor, so any candidate of the same text repeats it."""
    if action.target is None or action.target.ref not in on_screen:
        return None
    return action.target.ref


def _names_a_value(text: str, values: Mapping[str, str]) -> bool:
    folded = text.casefold().strip()
    return bool(folded) and any(v.casefold() == folded or _value_pattern(v).search(text) for v in values.values())


def enumerate_candidates(
    screen: Screen,
    instruction: str,
    slots: Mapping[str, str],
    history: Sequence[Action],
    *,
    step_index: int,
    max_steps: int,
    max_candidates: int = 96,
) -> list[Candidate]:
    """Every candidate action on ``screen`` with its description and features (deterministic order:
    clicks in document order, typing, Enter, scrolls, waiting). ``history`` is the episode's actions
    so far; ``slots`` the task template's values (``envs.protocol.EpisodeContext.slots``)."""
    values = instruction_values(instruction, slots)
    records = [e.to_dict() for e in screen.elements]
    position = {e.ref: i / max(1, len(screen.elements) - 1) for i, e in enumerate(screen.elements)}
    focused = screen.focused()
    focused_filled = 1.0 if focused is not None and focused.editable and (focused.value or "") else 0.0
    on_screen = {e.ref for e in screen.elements}
    done_before: dict[str, list[str | None]] = {}
    for past in history:
        done_before.setdefault(past.canonical_text(), []).append(_still_there(past, on_screen))
    last = (history[-1].canonical_text(), _still_there(history[-1], on_screen)) if history else None
    progress = step_index / max(1, max_steps)

    actions: list[Action] = [Action(ActionType.CLICK, target=e) for e in clickable_elements(screen)]
    typed_values = list(dict.fromkeys([*values.values(), *range_values(instruction)]))
    for field in editable_elements(screen):
        actions += [Action(ActionType.INPUT, target=field, text=v) for v in typed_values]
    actions += [
        Action(ActionType.PRESS_KEY, text="Enter"),
        Action(ActionType.SCROLL, direction="DOWN"),
        Action(ActionType.SCROLL, direction="UP"),
        Action(ActionType.NOTHING),
    ]
    if len(actions) > max_candidates:  # keep the fixed tail (Enter, scrolls, waiting)
        actions = actions[: max_candidates - 4] + actions[-4:]
    out: list[Candidate] = []
    for action in actions:
        target = action.target
        canonical = action.canonical_text()
        described = action_in_context(canonical, target_context(records, target.ref)) if target else canonical
        target_text = (target.text or target.description) if target else ""
        match = instruction_match(instruction, target_text) if target_text else (0.0, 0.0, 0.0, 0.0)
        typed = action.text if action.type is ActionType.INPUT else None
        slot_name = next((n for n, v in values.items() if typed is not None and v == typed), None)
        fits = 0.0
        if target is not None and slot_name is not None:
            fits = 1.0 if _tokens(slot_name.replace("_", " ")) & _field_identity(target, records) else 0.0
        ref = target.ref if target is not None else None
        repeats = sum(past is None or past == ref for past in done_before.get(canonical, ()))
        features = [
            *(1.0 if action.type is t else 0.0 for t in CANDIDATE_TYPES),
            *_role_features(target.role if target else None),
            1.0 if target_text and _names_a_value(target_text, values) else 0.0,
            *match,
            1.0 if slot_name is not None else 0.0,
            fits,
            1.0 if target is not None and typed is not None and (target.value or "") == typed else 0.0,
            1.0 if target is not None and target.editable and not (target.value or "") else 0.0,
            min(repeats, 3) / 3,
            1.0 if last is not None and canonical == last[0] and (last[1] is None or last[1] == ref) else 0.0,
            1.0 if target is not None and target.focused else 0.0,
            1.0 if target is not None and target.checked is True else 0.0,
            1.0 if target is not None and target.checked is False else 0.0,
            position.get(target.ref, 0.0) if target else 0.0,
            progress,
            1.0 if action.type is ActionType.CLICK and target is not None and target.editable else 0.0,
            focused_filled,
        ]
        assert len(features) == N_FEATURES
        out.append(Candidate(action, relative_text(described, values), tuple(features)))
    return out


def history_text(history: Sequence[Action], instruction: str, slots: Mapping[str, str], keep: int = 3) -> str:
    """The last ``keep`` actions, oldest first, relative to the instruction ("" at the start)."""
    values = instruction_values(instruction, slots)
    return relative_text(" ; ".join(a.canonical_text() for a in history[-keep:]), values)


def relative_instruction(instruction: str, slots: Mapping[str, str]) -> str:
    """The instruction with its values replaced by slot names: one text per task template."""
    return relative_text(instruction, instruction_values(instruction, slots))
