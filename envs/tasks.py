"""Task specs: an instruction template and an ordered list of milestones, each a predicate.

One YAML file per task, in a folder (``envs/task_specs/`` ships ours; users bring their own). The
same specs give ground-truth key steps on recorded demonstrations and milestone rewards online in
the environments (ProgRM §2.2, last paragraph: environment-milestone progress labels).

```yaml
task_id: login-user
backend: miniwob                     # miniwob | android
app: null                            # android: the package to start
instruction: 'Enter the username "(?P<username>[^"]+)" and the password "(?P<password>[^"]+)" .*'
milestones:
  - name: username typed
    when: {field_value: {element: {element_id: username}, equals: "{username}"}}
  - name: password typed
    when: {field_value: {element: {element_id: password}, equals: "{password}"}}
  - name: login clicked
    when: {clicked: {role: button, text: Login}}
```

Predicates (``when``), over the screen after a step and the step's action:

* ``visible: SELECTOR`` - an element matching the selector is on the screen (non-empty and
  overlapping the root element, i.e. not scrolled out of view);
* ``field_value: {element: SELECTOR, equals: TEMPLATE}`` - an editable element holds the value
  (case- and whitespace-insensitive); ``contains``, ``starts_with`` or ``ends_with`` instead of
  ``equals`` compare part of it;
* ``checked: SELECTOR`` / ``unchecked: SELECTOR`` - a checkbox or radio button matching it is (not) checked;
* ``clicked: SELECTOR`` - the step's action clicked an element matching the selector;
* ``typed: {element: SELECTOR, equals: TEMPLATE}`` - the step's action typed that text there;
* ``episode_success: true`` - the environment reported success at this (final) step;
* ``all: [...]``, ``any: [...]``, ``not: PREDICATE`` - combinations.

A SELECTOR is a mapping of ``role``, ``text`` (exact), ``text_contains``, ``element_id``,
``classes_contains``, ``description``; every key given must match. Values may name instruction
slots as ``{slot}``: the named groups of ``instruction``, and the fields the environment recorded
with the episode (``episodes.task_fields``; a slot named in a predicate must be one of the groups
unless the spec lists it under ``fields:``). Milestones are reached in order: a
milestone counts once every milestone before it has been reached.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from warehouse.model import Action, ActionType, Screen, UIElement

SELECTOR_KEYS = frozenset({"role", "text", "text_contains", "element_id", "classes_contains", "description"})
PREDICATE_KINDS = frozenset(
    {"visible", "field_value", "checked", "unchecked", "clicked", "typed", "episode_success", "all", "any", "not"}
)
VALUE_COMPARISONS = ("equals", "contains", "starts_with", "ends_with")
_SLOT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TaskSpecError(ValueError):
    """A task spec is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class Milestone:
    name: str
    when: Mapping[str, Any]


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    milestones: tuple[Milestone, ...]
    instruction: re.Pattern[str] | None = None
    backend: str = "miniwob"
    family: str = "miniwob"
    app: str | None = None
    solution: tuple[Mapping[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None

    def slots(self, instruction: str, fields: Mapping[str, Any] | None = None) -> dict[str, str] | None:
        """The instruction's slot values: the template's named groups, plus the fields the
        environment recorded with the episode (MiniWoB++ records them for natural-language tasks).
        None when the instruction fits neither."""
        recorded = {str(k): str(v) for k, v in (fields or {}).items() if v is not None}
        if self.instruction is None:
            return recorded
        match = self.instruction.search(instruction)
        if match is None:
            return recorded or None
        return recorded | {k: v for k, v in match.groupdict().items() if v is not None}


# -- loading ----------------------------------------------------------------------------------


def load_task_spec(path: Path | str) -> TaskSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskSpecError(f"{path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise TaskSpecError(f"{path}: invalid YAML: {exc}") from None
    return task_spec_from_mapping(raw, source=str(path))


def task_spec_from_mapping(raw: Any, source: str = "<spec>") -> TaskSpec:
    if not isinstance(raw, Mapping):
        raise TaskSpecError(f"{source}: a task spec must be a mapping, got {type(raw).__name__}")
    task_id = raw.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise TaskSpecError(f"{source}: field 'task_id' must be a non-empty string")
    where = f"{source} (task {task_id})"
    pattern = None
    if raw.get("instruction") is not None:
        try:
            pattern = re.compile(str(raw["instruction"]), re.IGNORECASE | re.DOTALL)
        except re.error as exc:
            raise TaskSpecError(f"{where}: field 'instruction' is not a valid regular expression: {exc}") from None
    declared_fields = raw.get("fields") or []
    if not isinstance(declared_fields, list) or not all(isinstance(f, str) for f in declared_fields):
        raise TaskSpecError(f"{where}: field 'fields' must be a list of slot names")
    slots = (set(pattern.groupindex) if pattern else set()) | set(declared_fields)
    milestones_raw = raw.get("milestones")
    if not isinstance(milestones_raw, list) or not milestones_raw:
        raise TaskSpecError(f"{where}: field 'milestones' must be a non-empty list")
    milestones = []
    seen_names = set()
    for i, m in enumerate(milestones_raw):
        at = f"{where}: milestones[{i}]"
        if not isinstance(m, Mapping) or not isinstance(m.get("name"), str) or "when" not in m:
            raise TaskSpecError(f"{at} needs a 'name' (string) and a 'when' (predicate)")
        if m["name"] in seen_names:
            raise TaskSpecError(f"{at}: duplicate milestone name {m['name']!r}")
        seen_names.add(m["name"])
        _validate_predicate(m["when"], f"{at}.when", slots)
        milestones.append(Milestone(m["name"], m["when"]))
    known = {"task_id", "instruction", "milestones", "backend", "family", "app", "solution", "fields"}
    return TaskSpec(
        task_id=task_id,
        milestones=tuple(milestones),
        instruction=pattern,
        backend=str(raw.get("backend", "miniwob")),
        family=str(raw.get("family", raw.get("backend", "miniwob"))),
        app=raw.get("app"),
        solution=tuple(raw.get("solution") or ()),
        extra={k: v for k, v in raw.items() if k not in known},
        path=source,
    )


def load_task_specs(folder: Path | str) -> dict[str, TaskSpec]:
    """Every ``*.yaml`` / ``*.yml`` spec in ``folder`` (recursively), keyed by task id."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskSpecError(f"task spec folder not found: {folder}")
    specs: dict[str, TaskSpec] = {}
    for path in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
        spec = load_task_spec(path)
        if spec.task_id in specs:
            raise TaskSpecError(f"{path}: task {spec.task_id!r} is already defined in {specs[spec.task_id].path}")
        specs[spec.task_id] = spec
    return specs


def _validate_predicate(pred: Any, at: str, slots: set[str]) -> None:
    if not isinstance(pred, Mapping) or len(pred) != 1:
        raise TaskSpecError(f"{at}: a predicate is a mapping with exactly one of {sorted(PREDICATE_KINDS)}")
    ((kind, arg),) = pred.items()
    if kind not in PREDICATE_KINDS:
        raise TaskSpecError(f"{at}: unknown predicate {kind!r} (known: {sorted(PREDICATE_KINDS)})")
    if kind in ("all", "any"):
        if not isinstance(arg, list) or not arg:
            raise TaskSpecError(f"{at}.{kind} must be a non-empty list of predicates")
        for i, sub in enumerate(arg):
            _validate_predicate(sub, f"{at}.{kind}[{i}]", slots)
    elif kind == "not":
        _validate_predicate(arg, f"{at}.not", slots)
    elif kind == "episode_success":
        if arg is not True:
            raise TaskSpecError(f"{at}.episode_success must be true")
    elif kind in ("field_value", "typed"):
        comparisons = VALUE_COMPARISONS if kind == "field_value" else ("equals",)
        given = [c for c in comparisons if isinstance(arg, Mapping) and c in arg]
        if not isinstance(arg, Mapping) or "element" not in arg or len(given) != 1:
            raise TaskSpecError(f"{at}.{kind} needs 'element' (selector) and one of {list(comparisons)}")
        _validate_selector(arg["element"], f"{at}.{kind}.element", slots)
        _validate_value(arg[given[0]], f"{at}.{kind}.{given[0]}", slots)
    else:
        _validate_selector(arg, f"{at}.{kind}", slots)


def _validate_selector(selector: Any, at: str, slots: set[str]) -> None:
    if not isinstance(selector, Mapping) or not selector:
        raise TaskSpecError(f"{at}: a selector is a non-empty mapping of {sorted(SELECTOR_KEYS)}")
    for key, value in selector.items():
        if key not in SELECTOR_KEYS:
            raise TaskSpecError(f"{at}: unknown selector key {key!r} (known: {sorted(SELECTOR_KEYS)})")
        _validate_value(value, f"{at}.{key}", slots)


def _validate_value(value: Any, at: str, slots: set[str]) -> None:
    if isinstance(value, bool) or value is None:
        raise TaskSpecError(f"{at}: expected a string or number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise TaskSpecError(f"{at}: {value!r} is not a finite number")
    if not isinstance(value, (str, int, float)):
        raise TaskSpecError(f"{at}: expected a string or number, got {type(value).__name__}")
    for slot in _SLOT.findall(str(value)):
        if slot not in slots:
            raise TaskSpecError(
                f"{at}: slot {{{slot}}} is neither a named group of 'instruction' nor in 'fields' (has {sorted(slots)})"
            )


# -- evaluation -------------------------------------------------------------------------------


def _render(value: Any, slots: Mapping[str, str]) -> str:
    return _SLOT.sub(lambda m: slots.get(m.group(1), m.group(0)), str(value))


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


def element_matches(element: UIElement, selector: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
    for key, raw in selector.items():
        want = _norm(_render(raw, slots))
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


def evaluate(
    pred: Mapping[str, Any],
    slots: Mapping[str, str],
    screen: Screen | None,
    action: Action | None,
    success: bool = False,
) -> bool:
    """Does the predicate hold for the screen after a step and the step's action?"""
    ((kind, arg),) = pred.items()
    elements: Sequence[UIElement] = screen.elements if screen is not None else ()
    if kind == "all":
        return all(evaluate(p, slots, screen, action, success) for p in arg)
    if kind == "any":
        return any(evaluate(p, slots, screen, action, success) for p in arg)
    if kind == "not":
        return not evaluate(arg, slots, screen, action, success)
    if kind == "episode_success":
        return success
    if kind == "visible":
        viewport = elements[0].bounds if elements else (0.0, 0.0, 0.0, 0.0)
        return any(_in_view(e, viewport) and element_matches(e, arg, slots) for e in elements)
    if kind in ("checked", "unchecked"):
        want_checked = kind == "checked"
        return any(e.checked is want_checked and element_matches(e, arg, slots) for e in elements)
    if kind == "field_value":
        comparison = next(c for c in VALUE_COMPARISONS if c in arg)
        want = _norm(_render(arg[comparison], slots))
        return any(
            e.editable and _compare(_norm(e.value), comparison, want) and element_matches(e, arg["element"], slots)
            for e in elements
        )
    if kind == "clicked":
        return (
            action is not None
            and action.type in (ActionType.CLICK, ActionType.LONG_CLICK)
            and action.target is not None
            and element_matches(action.target, arg, slots)
        )
    if kind == "typed":
        return (
            action is not None
            and action.type is ActionType.INPUT
            and action.target is not None
            and _norm(action.text) == _norm(_render(arg["equals"], slots))
            and element_matches(action.target, arg["element"], slots)
        )
    raise TaskSpecError(f"unknown predicate {kind!r}")


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
