"""A task spec's predicates evaluated on a screen (:mod:`envs.tasks` defines the language and
loads the specs): element selectors over the screen's tree (labels, containers), the predicates
after a step, and the milestones reached in order over a trajectory (ProgRM §2.2: the
environment-milestone progress labels, online and on recorded demonstrations)."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from envs.tasks import (
    DEFAULT_LIST_SPLIT,
    FIELD_ROLES,
    ITEM_SLOT,
    KIND_SELECTOR_KEYS,
    LABEL_ROLE,
    SLOT_PATTERN,
    STRUCTURAL_SELECTOR_KEYS,
    VALUE_COMPARISONS,
    TaskSpec,
    TaskSpecError,
)
from warehouse.model import Action, ActionType, Screen, UIElement


def _render(value: Any, slots: Mapping[str, str]) -> str:
    return SLOT_PATTERN.sub(lambda m: slots.get(m.group(1), m.group(0)), str(value))


def _norm(text: str | None) -> str:
    return " ".join((text or "").split()).casefold()


def _compare(value: str, comparison: str, want: str) -> bool:
    if comparison == "equals":
        return value == want
    if comparison == "contains":
        return bool(want) and want in value
    if comparison == "starts_with":
        return bool(want) and value.startswith(want)
    return bool(want) and value.endswith(want)


def _in_view(element: UIElement, viewport: tuple[float, float, float, float]) -> bool:
    """On screen: non-empty and overlapping the root element (the page or the device screen)."""
    left, top, right, bottom = element.bounds
    return (
        right > left
        and bottom > top
        and left < viewport[2]
        and right > viewport[0]
        and top < viewport[3]
        and bottom > viewport[1]
    )


@lru_cache(maxsize=64)
def _separator(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def list_items(value: str | None, split: str | None = None) -> list[str]:
    """A list slot's items: ``value`` split by the regular expression ``split`` (default
    ``DEFAULT_LIST_SPLIT``: commas, "and", ", and"), each stripped, empty ones dropped.
    An unfilled slot (None, or still the literal ``{slot}``) is the empty list."""
    if value is None or SLOT_PATTERN.fullmatch(value.strip()):
        return []
    parts = _separator(split or DEFAULT_LIST_SPLIT).split(value)
    return [part.strip() for part in parts if part and part.strip()]


def is_form_field(element: UIElement) -> bool:
    """Can a <label> name this element? Checkboxes, radios, switches, text fields, selects, any
    editable element, and input types the DOM converter leaves unmapped (``input_range``, ...)."""
    return element.role in FIELD_ROLES or element.editable or element.role.startswith("input_")


class ScreenTree:
    """A screen's structure, read from document order and depth (as ``envs.miniwob.dom`` and
    ``envs.android.hierarchy`` write them; refs may repeat within a recorded page, so they are not
    used): each element's parent, its subtree, and which label names which form field."""

    def __init__(self, screen: Screen | Sequence[UIElement]) -> None:
        self.elements: Sequence[UIElement] = screen.elements if isinstance(screen, Screen) else tuple(screen)
        n = len(self.elements)
        parents = [-1] * n
        ends = [n] * n  # the subtree of i is elements[i:ends[i]]
        stack: list[int] = []
        for i, element in enumerate(self.elements):
            while stack and self.elements[stack[-1]].depth >= element.depth:
                ends[stack.pop()] = i
            parents[i] = stack[-1] if stack else -1
            stack.append(i)
        self.parents: tuple[int, ...] = tuple(parents)
        self.ends: tuple[int, ...] = tuple(ends)
        self._label_of: dict[int, int] | None = None
        self._labels_in_use: frozenset[int] = frozenset()
        self._label_texts: dict[int, str] = {}
        self._kind_cache: dict[tuple[str, ...], list[int]] = {}

    def ancestors_or_self(self, index: int) -> Iterator[int]:
        """``index``, its parent, and so on up to the root."""
        while index >= 0:
            yield index
            index = self.parents[index]

    def label_of(self) -> dict[int, int]:
        """Form field index -> the index of the label naming it (see the module docstring)."""
        if self._label_of is None:
            self._label_of = self._link_labels()
            self._labels_in_use = frozenset(self._label_of.values())
        return self._label_of

    def _link_labels(self) -> dict[int, int]:
        elements = self.elements
        links: dict[int, int] = {}
        for i, element in enumerate(elements):
            if is_form_field(element):
                wrapping = next(
                    (a for a in self.ancestors_or_self(self.parents[i]) if elements[a].role == LABEL_ROLE), None
                )
                if wrapping is not None:
                    links[i] = wrapping
        wrapping_labels = set(links.values())
        for i, element in enumerate(elements):
            if element.role != LABEL_ROLE or i in wrapping_labels:
                continue
            container_end = self.ends[self.parents[i]] if self.parents[i] >= 0 else len(elements)
            for j in range(self.ends[i], container_end):
                if elements[j].role == LABEL_ROLE:
                    break
                if is_form_field(elements[j]):
                    links.setdefault(j, i)
                    break
        return links

    def label_text(self, label: int) -> str:
        """A label's text: its own and its descendants', form fields' left out (normalised)."""
        if label not in self._label_texts:
            parts = [
                e.text
                for e in self.elements[label : self.ends[label]]
                if e.text and (e is self.elements[label] or not is_form_field(e))
            ]
            self._label_texts[label] = _norm(" ".join(parts))
        return self._label_texts[label]

    def is_labelled(self, index: int, want: str) -> bool:
        """The element is a form field whose label reads ``want`` (normalised), or that label."""
        label = self.label_of().get(index)
        if label is None and index in self._labels_in_use:
            label = index
        return label is not None and self.label_text(label) == want

    def of_kind(self, kind: Mapping[str, Any], slots: Mapping[str, str]) -> list[int]:
        """Indices (ascending) of the elements matching a selector made only of kind keys."""
        key = tuple(f"{k}={_norm(_render(v, slots))}" for k, v in sorted(kind.items()))
        if key not in self._kind_cache:
            wants = _wants(kind, slots)
            self._kind_cache[key] = [i for i, e in enumerate(self.elements) if _fits(e, wants)]
        return self._kind_cache[key]

    def locate(self, element: UIElement) -> int | None:
        """The index of ``element`` on this screen: the same object, else the element with its ref
        (and, where refs repeat, its role, id and classes)."""
        same_ref = [i for i, e in enumerate(self.elements) if e is element or e.ref == element.ref]
        for i in same_ref:
            if self.elements[i] is element:
                return i
        for i in same_ref:
            e = self.elements[i]
            if (e.role, e.element_id, e.classes) == (element.role, element.element_id, element.classes):
                return i
        return None


def _wants(selector: Mapping[str, Any], slots: Mapping[str, str]) -> list[tuple[str, str]]:
    """The selector's keys that look at the element alone, with their values rendered and normalised."""
    return [(k, _norm(_render(v, slots))) for k, v in selector.items() if k not in STRUCTURAL_SELECTOR_KEYS]


def _fits(element: UIElement, wants: Sequence[tuple[str, str]]) -> bool:
    for key, want in wants:
        if key == "role" and _norm(element.role) != want:
            return False
        if key == "text" and _norm(element.text) != want:
            return False
        if key == "text_contains" and want not in _norm(element.text):
            return False
        if key == "element_id" and _norm(element.element_id) != want:
            return False
        if key == "classes_contains" and want not in _norm(element.classes).split():
            return False
        if key == "description" and _norm(element.description) != want:
            return False
    return True


def _plain_matches(element: UIElement, selector: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
    """The selector's keys that look at the element alone (the structural ones are skipped)."""
    return _fits(element, _wants(selector, slots))


def _matches_at(tree: ScreenTree, index: int, selector: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
    """Does the element at ``index`` of the screen match the selector, structural keys included?"""
    if not _plain_matches(tree.elements[index], selector, slots):
        return False
    if "labelled" in selector and not tree.is_labelled(index, _norm(_render(selector["labelled"], slots))):
        return False
    if "within" in selector:
        inner = selector["within"]
        kind = {k: v for k, v in inner.items() if k in KIND_SELECTOR_KEYS}
        of_kind = tree.of_kind(kind, slots)
        for container in tree.ancestors_or_self(index):
            end = tree.ends[container]
            first = bisect_left(of_kind, container)
            if first < len(of_kind) and of_kind[first] < end:  # the nearest container holding the kind
                inside = of_kind[first : bisect_left(of_kind, end)]
                return any(_matches_at(tree, i, inner, slots) for i in inside)
        return False
    return True


def element_matches(
    element: UIElement, selector: Mapping[str, Any], slots: Mapping[str, str], screen: Screen | None = None
) -> bool:
    """Does ``element`` match the selector? ``labelled`` and ``within`` read the element's
    surroundings on ``screen`` (the element found there by ``ScreenTree.locate``); without a
    screen, or when the element is not on it, they match nothing."""
    if not any(k in selector for k in STRUCTURAL_SELECTOR_KEYS):
        return _plain_matches(element, selector, slots)
    if screen is None:
        return False
    tree = ScreenTree(screen)
    index = tree.locate(element)
    return index is not None and _matches_at(tree, index, selector, slots)


_SYNONYM_INDEXES: dict[int, tuple[Sequence[Sequence[Any]], dict[str, tuple[str, ...]]]] = {}


def synonym_alternatives(groups: Sequence[Sequence[Any]], item: str) -> tuple[str, ...]:
    """``count.synonyms``: the item, then every other word of the groups that hold it (compared
    case- and whitespace-insensitively)."""
    cached = _SYNONYM_INDEXES.get(id(groups))
    if cached is None or cached[0] is not groups:
        index: dict[str, list[str]] = {}
        for group in groups:
            words = [str(w) for w in group]
            for word in words:
                known = index.setdefault(_norm(word), [])
                known.extend(w for w in words if w not in known and _norm(w) != _norm(word))
        if len(_SYNONYM_INDEXES) >= 64:
            _SYNONYM_INDEXES.clear()
        cached = (groups, {k: tuple(v) for k, v in index.items()})
        _SYNONYM_INDEXES[id(groups)] = cached  # holds ``groups``, so its id is not reused meanwhile
    return (item, *cached[1].get(_norm(item), ()))


class _Evaluation:
    """One ``evaluate`` call: the screen's structure is built once, when a predicate needs it."""

    def __init__(self, screen: Screen | None, action: Action | None, success: bool) -> None:
        self.elements: Sequence[UIElement] = screen.elements if screen is not None else ()
        self.action = action
        self.success = success
        self._tree: ScreenTree | None = None

    @property
    def tree(self) -> ScreenTree:
        if self._tree is None:
            self._tree = ScreenTree(self.elements)
        return self._tree

    def on_screen(
        self, selector: Mapping[str, Any], slots: Mapping[str, str], keep: Callable[[UIElement], bool]
    ) -> bool:
        """Some element satisfying ``keep`` (cheap, checked first) matches the selector."""
        structural = any(k in selector for k in STRUCTURAL_SELECTOR_KEYS)
        wants = _wants(selector, slots)
        for i, e in enumerate(self.elements):
            if keep(e) and _fits(e, wants) and (not structural or _matches_at(self.tree, i, selector, slots)):
                return True
        return False

    def target_matches(self, selector: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
        """The action's target matches; structural keys read it on the screen after the step."""
        assert self.action is not None and self.action.target is not None
        target = self.action.target
        if not _plain_matches(target, selector, slots):
            return False
        if not any(k in selector for k in STRUCTURAL_SELECTOR_KEYS):
            return True
        index = self.tree.locate(target)
        return index is not None and _matches_at(self.tree, index, selector, slots)

    def holds(self, pred: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
        ((kind, arg),) = pred.items()
        if kind == "all":
            return all(self.holds(p, slots) for p in arg)
        if kind == "any":
            return any(self.holds(p, slots) for p in arg)
        if kind == "not":
            return not self.holds(arg, slots)
        if kind == "episode_success":
            return self.success
        if kind == "count":
            return self.count_holds(arg, slots)
        if kind == "visible":
            viewport = self.elements[0].bounds if self.elements else (0.0, 0.0, 0.0, 0.0)
            return self.on_screen(arg, slots, lambda e: _in_view(e, viewport))
        if kind in ("checked", "unchecked"):
            want_checked = kind == "checked"
            return self.on_screen(arg, slots, lambda e: e.checked is want_checked)
        if kind == "field_value":
            comparison = next(c for c in VALUE_COMPARISONS if c in arg)
            want = _norm(_render(arg[comparison], slots))
            return self.on_screen(
                arg["element"], slots, lambda e: e.editable and _compare(_norm(e.value), comparison, want)
            )
        action = self.action
        if kind == "clicked":
            return (
                action is not None
                and action.type in (ActionType.CLICK, ActionType.LONG_CLICK)
                and action.target is not None
                and self.target_matches(arg, slots)
            )
        if kind == "typed":
            return (
                action is not None
                and action.type is ActionType.INPUT
                and action.target is not None
                and _norm(action.text) == _norm(_render(arg["equals"], slots))
                and self.target_matches(arg["element"], slots)
            )
        raise TaskSpecError(f"unknown predicate {kind!r}")

    def count_holds(self, arg: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
        items = list_items(slots.get(str(arg["slot"])), arg.get("split"))
        at_least = arg.get("at_least", "all")
        need = len(items) if at_least == "all" else int(at_least)
        if need > len(items):
            return False
        groups = arg.get("synonyms")
        found = 0
        for k, item in enumerate(items):
            alternatives = synonym_alternatives(groups, item) if groups else (item,)
            if any(self.holds(arg["each"], {**slots, ITEM_SLOT: alt}) for alt in alternatives):
                found += 1
                if found >= need:
                    return True
            if found + len(items) - k - 1 < need:  # too few items left
                return False
        return found >= need


def evaluate(
    pred: Mapping[str, Any],
    slots: Mapping[str, str],
    screen: Screen | None,
    action: Action | None,
    success: bool = False,
) -> bool:
    """Does the predicate hold for the screen after a step and the step's action?"""
    return _Evaluation(screen, action, success).holds(pred, slots)


@dataclass(frozen=True)
class MilestoneTrack:
    """Milestones reached, in order, along a trajectory."""

    hits: tuple[tuple[str, ...], ...]  # per step: milestones first reached at that step
    reached: int  # how many of the task's milestones were reached

    @property
    def key_steps(self) -> tuple[int, ...]:
        return tuple(i for i, names in enumerate(self.hits) if names)


def track_milestones(
    spec: TaskSpec,
    instruction: str,
    steps: Iterable[tuple[Screen | None, Action | None]],
    success: bool = False,
    fields: Mapping[str, Any] | None = None,
) -> MilestoneTrack:
    """Walk a trajectory given as (screen after the step, action of the step) pairs.

    A milestone is reached at the first step where it holds and every earlier milestone has been
    reached (several may be reached at one step). ``success`` is the episode's outcome, visible to
    ``episode_success`` at the last step only. Raises TaskSpecError when the instruction does not
    fit the spec's template, so a mislabelled episode is never scored silently.
    """
    slots = spec.slots(instruction, fields)
    if slots is None:
        raise TaskSpecError(f"task {spec.task_id}: instruction does not fit the spec's template: {instruction!r}")
    steps = list(steps)
    pointer = 0
    hits: list[tuple[str, ...]] = []
    for i, (screen, action) in enumerate(steps):
        is_last = i == len(steps) - 1
        new: list[str] = []
        while pointer < len(spec.milestones) and evaluate(
            spec.milestones[pointer].when, slots, screen, action, success and is_last
        ):
            new.append(spec.milestones[pointer].name)
            pointer += 1
        hits.append(tuple(new))
    return MilestoneTrack(tuple(hits), pointer)
