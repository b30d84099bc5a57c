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
* ``count: {slot: NAME, each: PREDICATE, at_least: N | all}`` - a list slot (below): at least N
  of its items (``all``, the default: every item) satisfy ``each``, in which ``{item}`` stands
  for the item. Strict: N items must exist (a list of 2 never satisfies ``at_least: 3``); ``all``
  of an empty list holds. Optional ``split`` (a regular expression; default: commas and the word
  "and") and ``synonyms`` (a list of word groups: an item also stands for every word of a group
  holding it, and ``each`` holds for the item when it holds for one of them);
* ``all: [...]``, ``any: [...]``, ``not: PREDICATE`` - combinations.

A SELECTOR is a mapping of ``role``, ``text`` (exact), ``text_contains``, ``element_id``,
``classes_contains``, ``description``, ``labelled``, ``within``; every key given must match.
Two keys look at the elements around the element (document order and depth of the screen):

* ``labelled: TEXT`` - a form field (checkbox, radio, switch, text field, select, any editable
  element) whose label reads TEXT, or that label itself (a click on a label is a click on its
  field, as in a browser; add ``role: checkbox`` for the field only). A field's label is its
  nearest enclosing ``label`` element (``<label><input> furious</label>``: MiniWoB++'s checkboxes
  and radios); else the nearest ``label`` before it in the same container with no other label
  between (``<label>Password</label><input>``: the login forms); a label after its field is not
  recognised (the recorded DOM has no ``for`` attribute). Its text: its own and its descendants'.
* ``within: SELECTOR`` - the element lies in the same container as an element matching the inner
  selector: going up from the element (itself included), the first container holding an element
  of the inner selector's *kind* (its ``role``, ``element_id`` and ``classes_contains`` keys,
  one of which it must have) must hold one that matches the inner selector entirely. E.g.
  ``{classes_contains: retweet, within: {classes_contains: username, text: "@keli"}}``: from the
  retweet icon up, the first container holding a ``.username`` is its post; that post's username
  must read @keli.

For ``clicked`` and ``typed`` these two keys read the clicked element's surroundings on the screen
after the step (the same element by ref; an element that is gone there does not match them).
``envs.spec_evaluation.element_matches`` without a screen matches neither.

Values may name instruction slots as ``{slot}``: the named groups of ``instruction``, and the
fields the environment recorded with the episode (``episodes.task_fields``; a slot named in a
predicate must be one of the groups unless the spec lists it under ``fields:``). **A slot the
instruction leaves unfilled** (an optional group that did not take part in the match, a field not
recorded) **stays as the literal text** ``{slot}``: a selector or comparison naming it matches
nothing but that literal text (so ``not`` of it holds), and a ``count`` over it sees an empty
list. Specs may rely on this for optional parts of an instruction; ``envs.spec_validation`` warns
where it happens on recorded episodes. Milestones are reached in order: a milestone counts once
every milestone before it has been reached.

Loading is bounded (a spec is outside data): a file over ``MAX_SPEC_BYTES``, YAML nested deeper than
``MAX_YAML_DEPTH`` or whose aliases expand to more than ``MAX_YAML_NODES`` nodes (an alias bomb: nine
anchors of nine aliases each are 387 million nodes, a few hundred bytes), and an instruction over
``MAX_INSTRUCTION_CHARS`` are refused with a one-line TaskSpecError naming the file and the field,
before anything is built from them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

SELECTOR_KEYS = frozenset(
    {"role", "text", "text_contains", "element_id", "classes_contains", "description", "labelled", "within"}
)
# Selector keys that look at the elements around the element (they need the screen).
STRUCTURAL_SELECTOR_KEYS = frozenset({"labelled", "within"})
# The keys that say what kind of element a selector finds (``within`` finds its container by them).
KIND_SELECTOR_KEYS = ("role", "element_id", "classes_contains")
PREDICATE_KINDS = frozenset(
    {
        "visible",
        "field_value",
        "checked",
        "unchecked",
        "clicked",
        "typed",
        "episode_success",
        "count",
        "all",
        "any",
        "not",
    }
)
VALUE_COMPARISONS = ("equals", "contains", "starts_with", "ends_with")
COUNT_KEYS = frozenset({"slot", "each", "at_least", "split", "synonyms"})
ITEM_SLOT = "item"  # in ``count.each``: the list item being checked
# A list slot's default separators: commas, "and", ", and" ("foo, bar and baz" -> 3 items).
DEFAULT_LIST_SPLIT = r"\s*,\s*(?:and\s+)?|\s+and\s+"
SLOT_PATTERN = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
LABEL_ROLE = "label"
# Roles of form fields a <label> can name (plus any editable element and unmapped input_* tags).
FIELD_ROLES = frozenset({"checkbox", "radio", "switch", "textbox", "password", "number", "date", "time", "combobox"})

# Bounds on a spec file (docs/environments.md, "Bounds on outside data"). The shipped specs are far
# inside them: at most 2.2 KB, 600 YAML nodes (click-checkboxes-soft: its synonym table, used twice
# through an alias), 9 levels, an instruction of 154 characters.
MAX_SPEC_BYTES = 64 * 1024
MAX_YAML_NODES = 10_000  # after alias expansion: what building the spec would walk
MAX_YAML_DEPTH = 32
MAX_INSTRUCTION_CHARS = 1_000  # the instruction template (a regular expression)
MAX_TASK_ID_CHARS = 200
MAX_SPLIT_CHARS = 200  # a count's ``split`` (a regular expression)


# Keys of ``episodes.task_fields`` that describe the episode, not its instruction: never slots.
# ``task_variant``: the known task the folder of a demonstration names when it differs from the
# task the recording names (envs.miniwob.demonstrations), e.g. email-inbox-nl-turk for recordings
# that call themselves email-inbox.
TASK_VARIANT_FIELD = "task_variant"
EPISODE_METADATA_FIELDS = frozenset({TASK_VARIANT_FIELD})


class TaskSpecError(ValueError):
    """A task spec is invalid; the message, one line, names the file and the field."""

    def __init__(self, message: object) -> None:
        # One line whatever went in (YAML errors span several, a file name may hold a newline):
        # callers print it as one line of a report.
        super().__init__(" ".join(part.strip() for part in str(message).splitlines() if part.strip()))


#: What the milestone predicates mean (``envs.spec_evaluation``), part of every
#: :attr:`TaskSpec.milestone_digest`: bump it when a change there makes a spec reach other milestones
#: on the same screens, so the milestones rollouts recorded before count as recorded under another spec.
MILESTONE_SEMANTICS_VERSION = "1"


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

    @cached_property
    def milestone_digest(self) -> str:
        """A short hash of what decides the milestones reached (the instruction template, the
        milestones' names and predicates, and :data:`MILESTONE_SEMANTICS_VERSION`; not the solution,
        app or file name): a rollout stores it
        with the milestones it recorded online, so labels can tell which episodes were recorded
        under another version of the spec and replay those (``annotation.progress.labeling``)."""
        content = {
            "semantics": MILESTONE_SEMANTICS_VERSION,
            "instruction": self.instruction.pattern if self.instruction is not None else None,
            "milestones": [[m.name, m.when] for m in self.milestones],
        }
        canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def is_other_version(self, digest: str | None) -> bool:
        """Were milestones stored with ``digest`` recorded under another version of this spec (its
        :attr:`milestone_digest` has changed since)? False where no digest was stored (recordings;
        rollouts stored before digests were), as such a record cannot be checked."""
        return digest is not None and digest != self.milestone_digest

    def slots(self, instruction: str, fields: Mapping[str, Any] | None = None) -> dict[str, str] | None:
        """The instruction's slot values: the template's named groups, plus the fields the
        environment recorded with the episode (MiniWoB++ records them for natural-language tasks).
        None when the instruction fits neither."""
        # in name order: where two slots hold one value, the first names it in the policy's texts
        # (training.policy.candidates.relative_text), whatever order the fields were recorded in
        recorded = {
            str(k): str(v)
            for k, v in sorted((fields or {}).items(), key=lambda item: str(item[0]))
            if v is not None and k not in EPISODE_METADATA_FIELDS
        }
        if self.instruction is None:
            return recorded
        match = self.instruction.search(instruction)
        if match is None:
            return recorded or None
        return recorded | {k: v for k, v in match.groupdict().items() if v is not None}


# -- loading ----------------------------------------------------------------------------------


class _SpecTooBig(Exception):
    """A bound of the YAML loader was exceeded (``where``: the field being read)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that, while composing, counts the nodes the document stands for with
    every alias expanded, and tracks the depth: over a bound it stops at once (aliases are never
    expanded to count them: each anchored node's size is remembered)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size
        self._open: list[int] = []  # expanded size so far of each collection being composed
        self._path: list[str] = []  # the field being composed, for messages

    def _where(self) -> str:
        return "".join(p if p.startswith("[") else f".{p}" for p in self._path).lstrip(".") or "(document)"

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        pushed = False
        if isinstance(index, yaml.ScalarNode):  # composing the value of this mapping key
            self._path.append(str(index.value)[:80])
            pushed = True
        elif isinstance(index, int) and not isinstance(index, bool):
            self._path.append(f"[{index}]")
            pushed = True
        try:
            if self.check_event(yaml.AliasEvent):
                anchor = self.peek_event().anchor
                node = super().compose_node(parent, index)
                size = self._sizes.get(id(node))
                if size is None:
                    raise _SpecTooBig(self._where(), f"alias *{anchor} refers to a node that contains it")
            else:
                if len(self._open) >= MAX_YAML_DEPTH:
                    raise _SpecTooBig(
                        self._where(), f"YAML nested deeper than {MAX_YAML_DEPTH} levels (MAX_YAML_DEPTH)"
                    )
                self._open.append(0)
                node = super().compose_node(parent, index)
                size = 1 + self._open.pop()
                self._sizes[id(node)] = size
            if self._open:
                self._open[-1] += size
            if size > MAX_YAML_NODES or (self._open and self._open[-1] > MAX_YAML_NODES):
                raise _SpecTooBig(
                    self._where(), f"YAML expands to more than {MAX_YAML_NODES} nodes (MAX_YAML_NODES; aliases counted)"
                )
            return node
        finally:
            if pushed:
                self._path.pop()


def shown_path(path: Path | str) -> str:
    """A path for a message: readable, storable (bytes that are not UTF-8 as \\xHH)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def load_spec_yaml(path: Path | str) -> Any:
    """A spec file's YAML, read within the bounds (MAX_SPEC_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES);
    TaskSpecError naming the file (and the field, for a bound) otherwise."""
    path = Path(path)
    shown = shown_path(path)
    try:
        if not path.is_file():
            raise TaskSpecError(f"{shown}: cannot read: not a regular file")
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise TaskSpecError(f"{shown}: the file is over {MAX_SPEC_BYTES} bytes (MAX_SPEC_BYTES)")
        text = data.decode("utf-8")
    except OSError as exc:
        raise TaskSpecError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskSpecError(f"{shown}: cannot read: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader already refuses some characters here
        return loader.get_single_data()
    except _SpecTooBig as exc:
        raise TaskSpecError(f"{shown}: field {exc.where!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise TaskSpecError(f"{shown}: invalid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # PyYAML's constructors raise these for some malformed scalars (a date like 2001-02-30,
        # an integer of more digits than Python converts).
        raise TaskSpecError(f"{shown}: invalid YAML value: {type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_task_spec(path: Path | str) -> TaskSpec:
    """One spec file -> TaskSpec; TaskSpecError (one line, naming the file and field) when invalid.

    A file read before with the same bytes at the same path gives the TaskSpec parsed then (a
    TaskSpec is immutable): a run reads the catalog's 34 files many times (16 times in the RL
    end-to-end test, 5 s of YAML parsing), and reading a file is cheap where parsing is not."""
    try:
        with open(path, "rb") as handle:
            key: tuple[str, str] | None = (
                os.fsdecode(path),
                hashlib.sha1(handle.read(MAX_SPEC_BYTES + 1), usedforsecurity=False).hexdigest(),
            )
    except OSError:
        key = None  # load_spec_yaml says what is wrong, naming the file
    if key is not None and (known := _PARSED_SPECS.get(key)) is not None:
        return known
    spec = task_spec_from_mapping(load_spec_yaml(path), source=shown_path(Path(path)))
    if key is not None:
        _PARSED_SPECS[key] = spec
    return spec


#: (path as given, SHA-1 of the file's bytes) -> the TaskSpec parsed from them (:func:`load_task_spec`).
_PARSED_SPECS: dict[tuple[str, str], TaskSpec] = {}


def task_spec_from_mapping(raw: Any, source: str = "<spec>") -> TaskSpec:
    """A spec's mapping (the YAML document) -> TaskSpec, validated; TaskSpecError names ``source``."""
    if not isinstance(raw, Mapping):
        raise TaskSpecError(f"{source}: a task spec must be a mapping, got {type(raw).__name__}")
    task_id = raw.get("task_id")
    if not isinstance(task_id, str) or not task_id.strip():
        raise TaskSpecError(f"{source}: field 'task_id' must be a non-empty string")
    if len(task_id) > MAX_TASK_ID_CHARS or not task_id.isprintable():
        raise TaskSpecError(
            f"{source}: field 'task_id' must be printable and at most {MAX_TASK_ID_CHARS} characters: {task_id[:80]!r}"
        )
    where = f"{source} (task {task_id})"
    pattern = None
    if raw.get("instruction") is not None:
        instruction = raw["instruction"]
        if not isinstance(instruction, str):
            raise TaskSpecError(
                f"{where}: field 'instruction' must be a string (a regular expression), "
                f"got {type(instruction).__name__}"
            )
        if len(instruction) > MAX_INSTRUCTION_CHARS:
            raise TaskSpecError(
                f"{where}: field 'instruction' is {len(instruction)} characters, "
                f"over the limit of {MAX_INSTRUCTION_CHARS} (MAX_INSTRUCTION_CHARS)"
            )
        try:
            pattern = re.compile(instruction, re.IGNORECASE | re.DOTALL)
        except (re.error, OverflowError, RecursionError, ValueError) as exc:
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
    for name in ("backend", "family", "app"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise TaskSpecError(f"{where}: field {name!r} must be a string")
    solution = raw.get("solution")
    if solution is not None and not isinstance(solution, list):
        raise TaskSpecError(f"{where}: field 'solution' must be a list of steps")
    known = {"task_id", "instruction", "milestones", "backend", "family", "app", "solution", "fields"}
    return TaskSpec(
        task_id=task_id,
        milestones=tuple(milestones),
        instruction=pattern,
        backend=str(raw.get("backend") or "miniwob"),
        family=str(raw.get("family") or raw.get("backend") or "miniwob"),
        app=raw.get("app"),
        solution=tuple(solution or ()),
        extra={k: v for k, v in raw.items() if k not in known},
        path=source,
    )


def spec_files(folder: Path | str) -> list[Path]:
    """The spec files of a folder: every ``*.yaml`` / ``*.yml`` in it, recursively, sorted;
    TaskSpecError when the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskSpecError(f"task spec folder not found: {shown_path(folder)}")
    return sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")])


def load_task_specs(folder: Path | str, errors: list[str] | None = None) -> dict[str, TaskSpec]:
    """Every ``*.yaml`` / ``*.yml`` spec in ``folder`` (recursively), keyed by task id.

    A bad spec raises TaskSpecError, unless ``errors`` is given: then its message is appended
    there and the other specs load (a missing folder always raises)."""
    specs: dict[str, TaskSpec] = {}
    for path in spec_files(folder):
        try:
            spec = load_task_spec(path)
            if spec.task_id in specs:
                raise TaskSpecError(
                    f"{shown_path(path)}: task {spec.task_id!r} is already defined in {specs[spec.task_id].path}"
                )
        except TaskSpecError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        specs[spec.task_id] = spec
    return specs


def spec_for(specs: Mapping[str, TaskSpec], task_id: str, fields: Mapping[str, Any] | None = None) -> TaskSpec | None:
    """The spec of an episode: its variant's when there is one (``task_fields.task_variant``), else
    its task's. So a spec can target a variant (email-inbox-nl-turk) or the base task (email-inbox)."""
    variant = (fields or {}).get(TASK_VARIANT_FIELD)
    if isinstance(variant, str) and variant in specs:
        return specs[variant]
    return specs.get(task_id)


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
    elif kind == "count":
        _validate_count(arg, f"{at}.count", slots)
    elif kind in ("field_value", "typed"):
        comparisons = VALUE_COMPARISONS if kind == "field_value" else ("equals",)
        given = [c for c in comparisons if isinstance(arg, Mapping) and c in arg]
        if not isinstance(arg, Mapping) or "element" not in arg or len(given) != 1:
            raise TaskSpecError(f"{at}.{kind} needs 'element' (selector) and one of {list(comparisons)}")
        _validate_selector(arg["element"], f"{at}.{kind}.element", slots)
        _validate_value(arg[given[0]], f"{at}.{kind}.{given[0]}", slots)
    else:
        _validate_selector(arg, f"{at}.{kind}", slots)


def _validate_count(arg: Any, at: str, slots: set[str]) -> None:
    if not isinstance(arg, Mapping) or "slot" not in arg or "each" not in arg:
        raise TaskSpecError(f"{at} needs 'slot' (a list slot) and 'each' (a predicate using {{{ITEM_SLOT}}})")
    unknown = sorted(str(k) for k in arg if k not in COUNT_KEYS)
    if unknown:
        raise TaskSpecError(f"{at}: unknown key {unknown[0]!r} (known: {sorted(COUNT_KEYS)})")
    slot = arg["slot"]
    if not isinstance(slot, str) or slot not in slots:
        raise TaskSpecError(
            f"{at}.slot: {slot!r} is neither a named group of 'instruction' nor in 'fields' (has {sorted(slots)})"
        )
    at_least = arg.get("at_least", "all")
    if at_least != "all" and (isinstance(at_least, bool) or not isinstance(at_least, int) or at_least < 1):
        raise TaskSpecError(f"{at}.at_least must be a whole number >= 1 or 'all', got {at_least!r}")
    if "split" in arg:
        split = arg["split"]
        if not isinstance(split, str) or not split or len(split) > MAX_SPLIT_CHARS:
            raise TaskSpecError(
                f"{at}.split must be a regular expression of 1 to {MAX_SPLIT_CHARS} characters (MAX_SPLIT_CHARS)"
            )
        try:
            separator = re.compile(split, re.IGNORECASE)
        except (re.error, OverflowError, RecursionError, ValueError) as exc:
            raise TaskSpecError(f"{at}.split is not a valid regular expression: {exc}") from None
        if separator.fullmatch(""):
            raise TaskSpecError(f"{at}.split must not match the empty text")
    if "synonyms" in arg:
        groups = arg["synonyms"]
        if not isinstance(groups, list) or not all(isinstance(g, list) and g for g in groups):
            raise TaskSpecError(f"{at}.synonyms must be a list of word groups (non-empty lists)")
        for i, group in enumerate(groups):
            for j, word in enumerate(group):
                if isinstance(word, bool) or not isinstance(word, (str, int, float)):
                    raise TaskSpecError(f"{at}.synonyms[{i}][{j}]: expected a word, got {word!r}")
    _validate_predicate(arg["each"], f"{at}.each", slots | {ITEM_SLOT})


def _validate_selector(selector: Any, at: str, slots: set[str]) -> None:
    if not isinstance(selector, Mapping) or not selector:
        raise TaskSpecError(f"{at}: a selector is a non-empty mapping of {sorted(SELECTOR_KEYS)}")
    for key, value in selector.items():
        if key not in SELECTOR_KEYS:
            raise TaskSpecError(f"{at}: unknown selector key {key!r} (known: {sorted(SELECTOR_KEYS)})")
        if key == "within":
            _validate_selector(value, f"{at}.within", slots)
            if not any(k in value for k in KIND_SELECTOR_KEYS):
                raise TaskSpecError(
                    f"{at}.within needs one of {list(KIND_SELECTOR_KEYS)}: they find the container "
                    "(text keys only pick which element of that kind)"
                )
        else:
            _validate_value(value, f"{at}.{key}", slots)


def _validate_value(value: Any, at: str, slots: set[str]) -> None:
    if isinstance(value, bool) or value is None:
        raise TaskSpecError(f"{at}: expected a string or number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise TaskSpecError(f"{at}: {value!r} is not a finite number")
    if not isinstance(value, (str, int, float)):
        raise TaskSpecError(f"{at}: expected a string or number, got {type(value).__name__}")
    if isinstance(value, int) and value.bit_length() > 64:  # e.g. a 0x literal of thousands of digits
        raise TaskSpecError(f"{at}: the number is too large to compare as text")
    for slot in SLOT_PATTERN.findall(str(value)):
        if slot not in slots:
            raise TaskSpecError(
                f"{at}: slot {{{slot}}} is neither a named group of 'instruction' nor in 'fields' (has {sorted(slots)})"
            )


def slot_names(template: str) -> list[str]:
    """The slots ``{name}`` a template names, in order."""
    return SLOT_PATTERN.findall(template)
