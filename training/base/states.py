"""What a model reads: text trajectories and the state at a step (ProgRM §2.3, Eq. 6).

The state is the task instruction ``g``, the action history and the current screen,
``ŝ_t = [a_1, ..., a_{t-1}, o_t]``. Indexing used by the reward models, the policies and the reward sources:

* ``steps[t]`` is what the warehouse stores: the screen ``o_t`` the agent saw *before* action
  ``a_t``, and the action.
* A progress label ``p*_t`` (``progress_labels.progress`` at ``step_idx = t``) is the progress
  reached *after* action ``a_t`` (§2.2: a key step's label is the recipe position it completes).
  The state that can show it is the one after the action: instruction, history ``a_0..a_t`` and
  the next screen ``o_{t+1}`` (:func:`progress_state`). The last action has no recorded next
  screen; the latest screen ``o_T`` stands in (or ``TextTrajectory.final_screen`` when known).
* A step-correctness judgement (GUI-Shepherd Eq. 1, GuidNav Eq. 2) looks at the state *before*
  the action plus the candidate action: history ``a_0..a_{t-1}``, screen ``o_t``, action ``a_t``
  (:func:`action_state`).

Actions appear as their canonical text (``steps.action_text``) plus, when the target has no
text of its own, the texts of its nearest container (:func:`target_context`): ``CLICK(span.retweet)
within "Christan" "@lacus" "6h ago"``. The canonical text alone cannot tell identical buttons apart.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warehouse.model import Action, Screen, UIElement

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TextStep:
    """One step as recorded: the screen before the action (one element per line) and the action."""

    screen_lines: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class TextTrajectory:
    """A trajectory as reward models see it. ``final_screen_lines``: the screen after the last
    action, when the recorder kept it (rollouts store it in the warehouse since views version 10;
    recordings and older rollouts do not; RL and serving callers may send it)."""

    episode_id: str
    task_id: str
    instruction: str
    steps: tuple[TextStep, ...]
    success: bool | None = None
    final_screen_lines: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(s.action for s in self.steps)


@dataclass(frozen=True, slots=True)
class StepState:
    """A reward model's input: instruction, action history (oldest first), screen, and for step
    judges the candidate action."""

    instruction: str
    history: tuple[str, ...]
    screen_lines: tuple[str, ...]
    action: str | None = None


def screen_lines(screen: Screen) -> tuple[str, ...]:
    """A screen as prompt lines: exactly ``Screen.to_text()`` split per element (indentation = depth)."""
    text = screen.to_text()
    return tuple(text.split("\n")) if text else ()


def screen_lines_from_records(records: Sequence[Mapping] | None) -> tuple[str, ...]:
    """Warehouse ``steps.screen`` records -> prompt lines (see :func:`screen_lines`)."""
    return screen_lines(Screen(tuple(UIElement.from_dict(dict(r)) for r in records or ())))


def _field(element, name: str):
    """A field of an element given as a mapping (warehouse record) or a ``UIElement``."""
    return element.get(name) if isinstance(element, Mapping) else getattr(element, name, None)


def _element_text(element) -> str:
    return " ".join(str(_field(element, "text") or _field(element, "description") or "").split())


def target_context(
    records: Sequence,
    target_ref: str | None,
    *,
    max_texts: int = 4,
    max_chars: int = 40,
    max_container_elements: int = 16,
) -> str | None:
    """The texts around an action's target that has no text of its own: those of the nearest
    enclosing element (below the page's top two levels) that has any, in document order.

    Canonical action texts name an element by role, id and text (``CLICK(span.retweet)``), which
    does not say *which* of several identical buttons was clicked: the one of user @lacus, or the
    one of the third e-mail. The texts of its closest container do (``"Christan" "@lacus"``).
    Containers of more than ``max_container_elements`` elements are too broad to say anything
    (a whole list or page). Returns None when the target has its own text, is not on the screen,
    or no small container with texts encloses it.
    """
    if target_ref is None:
        return None
    index = next((i for i, r in enumerate(records) if _field(r, "ref") == target_ref), None)
    if index is None or _element_text(records[index]):
        return None
    by_ref = {_field(r, "ref"): i for i, r in enumerate(records)}
    depths = [_field(r, "depth") or 0 for r in records]

    def parent_of(i: int) -> int | None:
        parent_ref = _field(records[i], "parent_ref")
        if parent_ref is not None and parent_ref in by_ref:
            return by_ref[parent_ref]
        for j in range(i - 1, -1, -1):  # document order: the nearest earlier, shallower element
            if depths[j] < depths[i]:
                return j
        return None

    node = parent_of(index)
    while node is not None and depths[node] >= 2:
        depth = depths[node]
        texts = []
        end = node + 1
        while end < len(records) and depths[end] > depth:
            end += 1
        if end - node > max_container_elements:
            return None
        for j in range(node, end):
            text = _element_text(records[j])
            if text and j != index:
                texts.append(text if len(text) <= max_chars else text[: max_chars - 3] + "...")
        if texts:
            return " ".join(json.dumps(t, ensure_ascii=False) for t in texts[:max_texts])
        node = parent_of(node)
    return None


def action_in_context(action_text: str, context: str | None) -> str:
    """An action as reward models read it: its canonical text, plus ``within <texts>`` when its
    target's own description cannot tell it apart (see :func:`target_context`)."""
    return f"{action_text} within {context}" if context else action_text


def describe_action(action: Action, screen: Screen) -> str:
    """An action as the reward models read it on ``screen`` (``action_in_context``)."""
    ref = action.target.ref if action.target is not None else None
    context = target_context([e.to_dict() for e in screen.elements], ref) if ref is not None else None
    return action_in_context(action.canonical_text(), context)


def progress_state(trajectory: TextTrajectory, t: int) -> StepState:
    """The state after action ``a_t``: ``[g, a_0..a_t, o_{t+1}]`` (Eq. 6 one step later), whose
    progress is the label p*_t. The last action's next screen is ``final_screen_lines`` if known,
    else the latest recorded screen ``o_t``."""
    steps = trajectory.steps
    if not 0 <= t < len(steps):
        raise IndexError(f"step {t} out of range for a trajectory of {len(steps)} steps")
    if t + 1 < len(steps):
        screen = steps[t + 1].screen_lines
    elif trajectory.final_screen_lines is not None:
        screen = trajectory.final_screen_lines
    else:
        screen = steps[t].screen_lines
    return StepState(trajectory.instruction, tuple(s.action for s in steps[: t + 1]), screen)


def action_state(trajectory: TextTrajectory, t: int) -> StepState:
    """The state before action ``a_t`` with ``a_t`` as the candidate: ``(g, a_0..a_{t-1}, o_t, a_t)``
    (GUI-Shepherd Eq. 1: r_t = PRM(I, s_t, a_t))."""
    steps = trajectory.steps
    if not 0 <= t < len(steps):
        raise IndexError(f"step {t} out of range for a trajectory of {len(steps)} steps")
    return StepState(trajectory.instruction, tuple(s.action for s in steps[:t]), steps[t].screen_lines, steps[t].action)


# ---------------------------------------------------------------------------------------------
# Lexical match of a text with the instruction (the reward models' segments, the policy's candidates)
# ---------------------------------------------------------------------------------------------

_WORD = re.compile(r"[@#]?\w+")
_ENTITY = re.compile(r'"([^"]+)"|(@\w+)|\b(\d[\d.,:/-]*)\b')
#: Words that say nothing about *which* thing an instruction or a screen element is about.
STOP_WORDS = frozenset(
    "a an the and or to of in on for with by at from into onto is are be this that it its as your you my me "
    "please then click clicks select enter type press choose button buttons field fields text box "
    "within input scroll up down left right nothing".split()
)
N_MATCH_FEATURES = 4


def _content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS and len(w) > 1)


def _entities(instruction: str) -> tuple[str, ...]:
    """What an instruction names exactly: quoted strings, @handles and numbers (lower case)."""
    found = []
    for quoted, handle, number in _ENTITY.findall(instruction):
        value = (quoted or handle or number).strip().lower()
        if value:
            found.append(value)
    return tuple(dict.fromkeys(found))


def instruction_match(instruction: str, text: str) -> tuple[float, float, float, float]:
    """Lexical match of a segment with the instruction, four numbers in [0, 1]: the share of the
    segment's content words that the instruction uses, the share of the instruction's content
    words that the segment uses, whether it contains any entity the instruction names exactly
    (a quoted string, an @handle, a number), and the share of those entities it contains.

    Frozen sentence embeddings blur exact strings ("@lacus" vs "@lucas", "vanda" typed vs
    "vandal"); these features let the fusion check them.
    """
    words, seg = _content_words(instruction), _content_words(text)
    common = len(words & seg)
    entities = _entities(instruction)
    lowered = text.lower()
    hits = sum(1 for e in entities if e in lowered)
    return (
        common / len(seg) if seg else 0.0,
        common / len(words) if words else 0.0,
        1.0 if hits else 0.0,
        hits / len(entities) if entities else 0.0,
    )
