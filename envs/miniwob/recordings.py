"""Recorded MiniWoB++ human demonstrations -> step-level trajectories.

A recording (format: ``../shared/data/miniwob-demos/README.md``) is a stream of raw browser
events, each stored twice (``timing`` 1 before the page handled it, 3 after) with the DOM at that
moment. A GUI agent does not emit mousedown/mouseup/keypress events; it clicks elements and types
text. This module rebuilds those actions:

* mousedown ... mouseup ... click  -> CLICK on the element under the pointer at mousedown
  (a drag, e.g. selecting text to copy, is a CLICK on where it started, marked in ``detail``);
  a dblclick is folded into the click before it, and so is the click a browser dispatches itself
  at the same point right after (clicking a <label> clicks its checkbox too). A click on a number
  field that changed its value (its arrows step it; of the recordings, only guess-number's) is an
  INPUT(text = the value after), the step an agent takes to set a field: its screen after is the
  same, and a CLICK, which only focuses, would teach SFT to click the field without end.
* a run of key events on one focused element -> INPUT(text = the element's value after the run)
  when the value changed (typing, pasting, deleting), else PRESS_KEY(the keys pressed);
  a trailing Enter becomes its own PRESS_KEY("Enter").
* consecutive scroll events -> one SCROLL whose direction is read off how the content moved.

The screen of each step is the DOM before its first event. Anything that cannot be typed becomes
an UNKNOWN step with a ``problem`` and an ``EventProblem`` naming the event index: kept and
counted, never dropped silently.
"""

from __future__ import annotations

import ast
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from envs.miniwob.dom import EDITABLE_ROLES, dom_to_screen
from envs.miniwob.fields import utterance_fields
from envs.protocol import EpisodeRecord, StepRecord
from warehouse.model import Action, ActionType, Screen, UIElement

MOUSE_EVENTS = frozenset({"mousedown", "mouseup", "click", "dblclick"})
KEY_EVENTS = frozenset({"keydown", "keypress", "keyup"})
SCROLL_EVENTS = frozenset({"scroll", "wheel"})
KNOWN_EVENTS = MOUSE_EVENTS | KEY_EVENTS | SCROLL_EVENTS
DRAG_THRESHOLD_PX = 5.0
ENTER_KEY = 13

# Bounds on what one recording may be; beyond them the file is quarantined, never a crash
# (docs/environments.md, "Bounds on outside data"). The real recordings are far inside them:
# at most 0.62 MB on disk, 14.7 MB decompressed, JSON nested 25 levels deep, 1,333 states.
MAX_FILE_BYTES = 32 * 1024 * 1024  # on disk, before decompression
MAX_RECORDING_BYTES = 128 * 1024 * 1024  # decompressed (a gzip bomb stops here)
MAX_JSON_DEPTH = 256  # nesting of arrays and objects
MAX_LINK_HOPS = 4  # git-style link files followed in a row
MAX_ACTION_CHARS = 4096  # one recorded action literal (real ones are under 200 characters)
MAX_TASK_NAME_CHARS = 100
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

_KEY_NAMES = {
    8: "Backspace",
    9: "Tab",
    13: "Enter",
    16: "Shift",
    17: "Ctrl",
    18: "Alt",
    20: "CapsLock",
    27: "Escape",
    32: "Space",
    33: "PageUp",
    34: "PageDown",
    35: "End",
    36: "Home",
    37: "ArrowLeft",
    38: "ArrowUp",
    39: "ArrowRight",
    40: "ArrowDown",
    46: "Delete",
    91: "Meta",
    92: "Meta",
    93: "Meta",
    224: "Meta",
}
_MODIFIERS = frozenset({16, 17, 18, 91, 92, 93, 224})


class RecordingError(ValueError):
    """The whole recording cannot be imported (the file is quarantined with this reason)."""


@dataclass(frozen=True)
class EventProblem:
    event_index: int
    reason: str


@dataclass(frozen=True)
class DemoStep:
    action: Action
    screen: Screen
    time_ms: int
    raw_event_first: int
    raw_event_last: int
    problem: str | None = None


@dataclass
class DemoEpisode:
    task_id: str
    instruction: str
    raw_reward: float
    decayed_reward: float | None
    steps: list[DemoStep]
    duration_ms: int
    fields: dict[str, Any] | None = None
    problems: list[EventProblem] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """MiniWoB++'s raw reward is 1 on success; partial credit (0 < r < 1) is not success."""
        return self.raw_reward >= 1.0


@dataclass(frozen=True)
class _Event:
    index: int  # index of the state that carries the event (timing 1)
    time_ms: int
    type: str
    params: dict[str, Any]
    dom_before: dict[str, Any]
    dom_after: dict[str, Any]


# -- reading files ----------------------------------------------------------------------------


def read_recording_bytes(path: Path, max_link_hops: int = MAX_LINK_HOPS) -> tuple[bytes, Path | None]:
    """The decompressed recording behind ``path`` and, if ``path`` is a git-style link file
    (a tiny text file holding a relative path, as git writes symlinks on checkouts without them),
    the file it points to. Raises RecordingError for unreadable, corrupted or oversized files."""
    link_target: Path | None = None
    current = path
    for _ in range(max_link_hops + 1):
        try:
            size = current.stat().st_size
            if size > MAX_FILE_BYTES:
                raise RecordingError(f"file of {size} bytes is over the limit of {MAX_FILE_BYTES} (MAX_FILE_BYTES)")
            data = current.read_bytes()
        except OSError as exc:
            raise RecordingError(f"cannot read file: {exc.strerror or exc}") from None
        target = _link_target(current, data)
        if target is None:
            break
        try:
            exists = target.is_file()
        except (OSError, ValueError):
            exists = False
        if not exists:
            raise RecordingError(f"link file points to a missing file: {data.decode(errors='replace').strip()}")
        link_target = current = target
    else:
        raise RecordingError(f"too many link hops (more than {max_link_hops}, MAX_LINK_HOPS)")
    if data[:2] == b"\x1f\x8b":
        data = gunzip_bounded(data, MAX_RECORDING_BYTES)
    return data, link_target


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress gzip data (one or more members) without ever holding more than ``limit`` bytes
    of output: a small file that inflates to gigabytes is refused, not decompressed."""
    out: list[bytes] = []
    total = 0
    rest = data
    while rest:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            chunk = inflater.decompress(rest, limit - total + 1)
        except zlib.error as exc:
            raise RecordingError(f"corrupted gzip: {exc}") from None
        total += len(chunk)
        if total > limit:
            raise RecordingError(f"decompresses to more than {limit} bytes (MAX_RECORDING_BYTES)")
        out.append(chunk)
        if not inflater.eof:
            raise RecordingError("corrupted gzip: compressed file ended before the end-of-stream marker")
        rest = inflater.unused_data.lstrip(b"\x00")  # gzip allows zero padding between members
    return b"".join(out)


def _link_target(path: Path, data: bytes) -> Path | None:
    if len(data) > 1024 or data[:1] in (b"{", b"[", b"\x1f") or b"\n" in data.strip():
        return None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not text.endswith((".json", ".json.gz")) or text.startswith("/") or not text.isprintable():
        return None
    try:
        return Path(os.path.normpath(path.parent / text))
    except ValueError:
        return None


def parse_recording_json(data: bytes) -> dict[str, Any]:
    """Decode and check a recording's JSON (its top-level fields); RecordingError when it is not one."""
    depth = json_nesting_depth(data, MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise RecordingError(f"JSON nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)")
    try:
        recording = json.loads(data)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise RecordingError(f"not UTF-8 text: {exc.reason}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RecordingError(f"malformed JSON: {exc}") from None
    except RecursionError:  # the depth check discounts brackets inside strings; belt and braces
        raise RecordingError(f"JSON nested too deeply to parse (limit {MAX_JSON_DEPTH}, MAX_JSON_DEPTH)") from None
    if not isinstance(recording, dict):
        raise RecordingError(f"expected a JSON object, got {type(recording).__name__}")
    for key, kinds in (("utterance", str), ("states", list), ("rawReward", (int, float))):
        if key not in recording:
            raise RecordingError(f"missing field {key!r}")
        if not isinstance(recording[key], kinds) or isinstance(recording[key], bool):
            raise RecordingError(f"field {key!r} has the wrong type ({type(recording[key]).__name__})")
    if not recording["states"]:
        raise RecordingError("recording has no states (empty episode)")
    for i, state in enumerate(recording["states"]):
        if not isinstance(state, dict):
            raise RecordingError(f"states[{i}] is not an object ({type(state).__name__})")
    recorded_task_name(recording)  # a malformed taskName is the file's problem, said here
    return recording


def recorded_task_name(recording: dict[str, Any]) -> str | None:
    """The task the recording names itself (``taskName``), or None when it names none (the
    first MiniWoB++ batches do not record it). RecordingError when it is not a task id."""
    name = recording.get("taskName")
    if name is None or name == "":
        return None
    if not isinstance(name, str) or len(name) > MAX_TASK_NAME_CHARS or not TASK_NAME.fullmatch(name):
        raise RecordingError(f"field 'taskName' is not a task id: {str(name)[:80]!r}")
    return name


_BRACKETS_ONLY = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_nesting_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply the arrays and objects of a JSON text nest, without parsing it (so that a
    document too deep for the parser is refused, not a RecursionError). Exact up to ``limit``:
    a quick count over all brackets first; only when that exceeds ``limit`` are brackets inside
    strings discounted."""
    skeleton = data.translate(_BRACKET_STEPS, _BRACKETS_ONLY)
    if not skeleton:
        return 0
    quick = int(np.cumsum(np.frombuffer(skeleton, np.int8), dtype=np.int64).max())
    if quick <= limit:
        return max(quick, 0)
    return _exact_nesting_depth(data)


def _exact_nesting_depth(data: bytes) -> int:
    arr = np.frombuffer(data, np.uint8)
    special = np.flatnonzero((arr == 34) | (arr == 92) | (arr == 91) | (arr == 93) | (arr == 123) | (arr == 125))
    kinds = arr[special]
    index = np.arange(special.size)
    backslash = kinds == 92
    adjacent = np.zeros(special.size, bool)
    adjacent[1:] = special[1:] == special[:-1] + 1
    # Length of the run of backslashes ending at each position: a quote after an odd run is escaped.
    run_start = backslash & ~(np.concatenate(([False], backslash[:-1])) & adjacent)
    start_index = np.maximum.accumulate(np.where(run_start, index, 0))
    run_length = np.where(backslash, index - start_index + 1, 0)
    before = np.zeros(special.size, np.int64)
    before[1:] = np.where(adjacent[1:], run_length[:-1], 0)
    quote = (kinds == 34) & (before % 2 == 0)
    in_string = (np.cumsum(quote) % 2 == 1) | quote
    opening = (kinds == 91) | (kinds == 123)
    closing = (kinds == 93) | (kinds == 125)
    steps = np.where(in_string, 0, opening.astype(np.int64) - closing.astype(np.int64))
    return max(int(np.cumsum(steps).max()), 0) if steps.size else 0


# -- events -----------------------------------------------------------------------------------


def parse_action_literal(raw: Any) -> dict[str, Any]:
    """A recorded action: a dict, or a Python-literal string like ``{'type': 'click', 'x': 3}``."""
    if isinstance(raw, dict):
        if "type" not in raw:
            raise ValueError(f"action has no type: {str(raw)[:80]!r}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"action is neither a dict nor a string: {type(raw).__name__}")
    if len(raw) > MAX_ACTION_CHARS:
        raise ValueError(f"action literal of {len(raw)} characters, over the limit of {MAX_ACTION_CHARS}")
    try:  # fast path: plain quotes, no nested quotes
        parsed = json.loads(
            raw.replace("'", '"').replace("None", "null").replace("True", "true").replace("False", "false")
        )
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        try:
            parsed = ast.literal_eval(raw)
        except (RecursionError, MemoryError, TypeError) as exc:  # nested too deeply, or not a literal
            raise ValueError(f"unparseable action literal ({type(exc).__name__})") from None
    if not isinstance(parsed, dict) or "type" not in parsed:
        raise ValueError(f"action has no type: {raw[:80]!r}")
    return parsed


def _events(states: list[dict[str, Any]], problems: list[EventProblem]) -> list[_Event]:
    """One event per raw browser event: the timing-1 record, with the DOM after taken from its timing-3 twin."""
    events: list[_Event] = []
    n = len(states)
    i = 0
    while i < n:
        state = states[i]
        raw = state.get("action")
        if raw is None:
            i += 1
            continue
        try:
            action = parse_action_literal(raw)
        except (ValueError, SyntaxError) as exc:
            problems.append(EventProblem(i, f"unparseable action: {exc}"))
            i += 1
            continue
        dom_before = state.get("dom")
        if not isinstance(dom_before, dict):
            problems.append(EventProblem(i, "state has no DOM"))
            i += 1
            continue
        timing = action.get("timing")
        dom_after = dom_before
        consumed = 1
        if i + 1 < n:
            nxt = states[i + 1]
            try:
                twin = parse_action_literal(nxt["action"]) if nxt.get("action") is not None else None
            except (ValueError, SyntaxError):
                twin = None
            if twin is not None and twin.get("type") == action.get("type") and twin.get("timing") == 3 and timing == 1:
                nxt_dom = nxt.get("dom")
                dom_after = nxt_dom if isinstance(nxt_dom, dict) else dom_before
                consumed = 2
            elif timing in (1, None) and isinstance(nxt.get("dom"), dict):
                dom_after = nxt["dom"]
        time_ms = _time_ms(state.get("time"))
        events.append(_Event(i, time_ms, str(action["type"]), action, dom_before, dom_after))
        i += consumed
    return events


def _time_ms(raw: Any) -> int:
    """A state's ``time`` (ms since the start, a string or a number); 0 when unusable."""
    try:
        value = int(float(raw or 0))
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        return 0
    return value if abs(value) < 2**62 else 0  # fits the warehouse's int64


# -- steps ------------------------------------------------------------------------------------


class _ScreenCache:
    """DOM -> Screen conversions, done once per recorded state (many events share a DOM)."""

    def __init__(self) -> None:
        self._by_id: dict[int, Screen] = {}

    def get(self, dom: dict[str, Any]) -> Screen:
        key = id(dom)
        screen = self._by_id.get(key)
        if screen is None:
            screen = self._by_id[key] = dom_to_screen(dom)
        return screen


def events_to_steps(states: list[dict[str, Any]]) -> tuple[list[DemoStep], list[EventProblem]]:
    """Rebuild agent-level steps from a recording's raw states (see the module docstring)."""
    problems: list[EventProblem] = []
    events = _events(states, problems)
    screens = _ScreenCache()
    steps: list[DemoStep] = []
    i = 0
    while i < len(events):
        event = events[i]
        kind = event.type
        if kind == "mousedown":
            j = i + 1
            up = click = None
            while j < len(events) and events[j].type in ("mouseup", "click", "dblclick") and click is None:
                if events[j].type == "mouseup" and up is None:
                    up = events[j]
                elif events[j].type == "click":
                    click = events[j]
                j += 1
            while j < len(events) and (
                events[j].type == "dblclick" or (click is not None and _is_activation_echo(click, events[j]))
            ):
                j += 1  # part of this gesture
            steps.append(_pointer_step(event, up, events[j - 1], screens, problems))
            i = j
        elif kind in ("click", "mouseup", "dblclick"):
            # A click with no mousedown: synthesised by the page or the keyboard, or a recording
            # that started mid-gesture. With coordinates it is still a click on an element.
            j = i + 1
            while j < len(events) and events[j].type in ("mouseup", "click", "dblclick"):
                j += 1
            if kind == "click" and _has_point(event.params):
                steps.append(_pointer_step(event, None, events[j - 1], screens, problems))
            i = j
        elif kind in KEY_EVENTS:
            j = i
            while j < len(events) and events[j].type in KEY_EVENTS:
                j += 1
            steps.extend(_key_steps(events[i:j], screens))
            # A click right after Enter/Space on a focused button is the keyboard's activation.
            while j < len(events) and events[j].type == "click" and not _has_point(events[j].params):
                j += 1
            i = j
        elif kind in SCROLL_EVENTS:
            j = i
            while j < len(events) and events[j].type in SCROLL_EVENTS:
                j += 1
            steps.append(_scroll_step(events[i:j], screens, problems))
            i = j
        else:
            reason = f"unknown event type {kind!r}"
            problems.append(EventProblem(event.index, reason))
            steps.append(
                DemoStep(
                    Action(ActionType.UNKNOWN, detail=kind),
                    screens.get(event.dom_before),
                    event.time_ms,
                    event.index,
                    event.index,
                    reason,
                )
            )
            i += 1
    return steps, problems


ACTIVATION_ECHO_MS = 50


def _is_activation_echo(click: _Event, event: _Event) -> bool:
    """A click the browser dispatches itself right after a user's click at the same point, e.g. on
    the checkbox of a clicked <label>: not a second user action."""
    return (
        event.type == "click"
        and event.params.get("x") == click.params.get("x")
        and event.params.get("y") == click.params.get("y")
        and 0 <= event.time_ms - click.time_ms <= ACTIVATION_ECHO_MS
    )


def _has_point(params: dict[str, Any]) -> bool:
    x, y = params.get("x"), params.get("y")
    return isinstance(x, (int, float)) and isinstance(y, (int, float)) and (x, y) != (0, 0)


NUMBER_ROLE = "number"  # envs.miniwob.dom's role of <input type="number">
STEPPED_DETAIL = "set with the number field's arrows"


def _pointer_step(
    down: _Event, up: _Event | None, last: _Event, screens: _ScreenCache, problems: list[EventProblem]
) -> DemoStep:
    screen = screens.get(down.dom_before)
    x, y = down.params.get("x"), down.params.get("y")
    if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
        reason = f"{down.type} event without pointer coordinates"
        problems.append(EventProblem(down.index, reason))
        return DemoStep(
            Action(ActionType.UNKNOWN, detail=down.type), screen, down.time_ms, down.index, last.index, reason
        )
    target = screen.element_at(x, y)
    if target is None:
        reason = f"{down.type} at ({x}, {y}) is on no element of the page"
        problems.append(EventProblem(down.index, reason))
        return DemoStep(Action(ActionType.UNKNOWN, detail=reason), screen, down.time_ms, down.index, last.index, reason)
    detail = None
    if up is not None:
        ux, uy = up.params.get("x", x), up.params.get("y", y)
        if isinstance(ux, (int, float)) and isinstance(uy, (int, float)):
            if abs(ux - x) > DRAG_THRESHOLD_PX or abs(uy - y) > DRAG_THRESHOLD_PX:
                detail = f"drag to ({ux}, {uy})"
    if last.type == "dblclick":
        detail = "double click" if detail is None else f"{detail}, double click"
    if target.role == NUMBER_ROLE and detail is None:
        new_value = _value_after(target, last, screens)
        if new_value != (target.value or ""):
            return DemoStep(
                Action(ActionType.INPUT, target=target, text=new_value, detail=STEPPED_DETAIL),
                screen,
                down.time_ms,
                down.index,
                last.index,
            )
    return DemoStep(
        Action(ActionType.CLICK, target=target, detail=detail), screen, down.time_ms, down.index, last.index
    )


def _key_code(params: dict[str, Any], name: str) -> int:
    value = params.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _key_name(params: dict[str, Any]) -> str:
    code = _key_code(params, "keyCode")
    char = _key_code(params, "charCode")
    if code in _KEY_NAMES:
        return _KEY_NAMES[code]
    if 0 < char < 0x110000 and not 0xD800 <= char < 0xE000:  # a character (not a lone surrogate)
        return chr(char)
    if 48 <= code <= 90:
        return chr(code)
    return f"Key{code}"


def _key_steps(run: list[_Event], screens: _ScreenCache) -> list[DemoStep]:
    """A run of key events, split wherever the focused element changes (e.g. after Tab)."""
    steps: list[DemoStep] = []
    segment: list[_Event] = []
    segment_focus: str | None = None
    for event in run:
        focus = _focused_ref(screens.get(event.dom_before))
        if segment and focus != segment_focus:
            steps.extend(_key_segment_steps(segment, screens))
            segment = []
        segment_focus = focus
        segment.append(event)
    if segment:
        steps.extend(_key_segment_steps(segment, screens))
    return steps


def _value_after(element: UIElement, event: _Event, screens: _ScreenCache) -> str:
    """The value ``element`` holds once ``event`` was handled ("" when empty or gone)."""
    after = screens.get(event.dom_after).by_ref(element.ref)
    return (after.value if after is not None else None) or ""


def _focused_ref(screen: Screen) -> str | None:
    focused = screen.focused()
    return focused.ref if focused is not None else None


def _key_segment_steps(segment: list[_Event], screens: _ScreenCache) -> list[DemoStep]:
    first, last = segment[0], segment[-1]
    before = screens.get(first.dom_before)
    target = before.focused()
    downs = [e for e in segment if e.type == "keydown"] or [e for e in segment if e.type == "keypress"] or segment
    ends_with_enter = _key_code(downs[-1].params, "keyCode") == ENTER_KEY
    steps: list[DemoStep] = []
    if target is not None and target.role in EDITABLE_ROLES:
        old_value = target.value or ""
        new_value = _value_after(target, last, screens)
        if new_value != old_value:
            steps.append(
                DemoStep(
                    Action(ActionType.INPUT, target=target, text=new_value),
                    before,
                    first.time_ms,
                    first.index,
                    last.index,
                )
            )
            if ends_with_enter:
                enter = downs[-1]
                steps.append(
                    DemoStep(
                        Action(ActionType.PRESS_KEY, target=target, text="Enter"),
                        screens.get(enter.dom_before),
                        enter.time_ms,
                        enter.index,
                        last.index,
                    )
                )
            return steps
    keys = _pressed_keys(downs)
    return [
        DemoStep(Action(ActionType.PRESS_KEY, target=target, text=keys), before, first.time_ms, first.index, last.index)
    ]


def _pressed_keys(downs: list[_Event]) -> str:
    """Key presses as text: modifiers combine with the next key ("Meta+C"), others join by spaces."""
    parts: list[str] = []
    held: list[str] = []
    for event in downs:
        code = _key_code(event.params, "keyCode")
        name = _key_name(event.params)
        if event.type == "keydown" and code in _MODIFIERS:
            if name not in held:
                held.append(name)
            continue
        parts.append("+".join([*held, name]) if held else name)
        held = []
    if held and not parts:
        parts.append("+".join(held))
    return " ".join(parts)


def _scroll_step(run: list[_Event], screens: _ScreenCache, problems: list[EventProblem]) -> DemoStep:
    first, last = run[0], run[-1]
    before = screens.get(first.dom_before)
    after = screens.get(last.dom_after)
    direction = _scroll_direction(before, after)
    if direction is None:
        reason = "scroll with no visible movement"
        return DemoStep(Action(ActionType.SCROLL, detail=reason), before, first.time_ms, first.index, last.index)
    return DemoStep(Action(ActionType.SCROLL, direction=direction), before, first.time_ms, first.index, last.index)


def _scroll_direction(before: Screen, after: Screen) -> str | None:
    """Content moving up means the user scrolled DOWN (and so on): vote over elements present in both."""
    after_by_ref = {e.ref: e for e in after.elements}
    votes: dict[str, int] = {}
    for element in before.elements:
        moved = after_by_ref.get(element.ref)
        if moved is None:
            continue
        dx = moved.bounds[0] - element.bounds[0]
        dy = moved.bounds[1] - element.bounds[1]
        if abs(dy) >= 1 and abs(dy) >= abs(dx):
            direction = "DOWN" if dy < 0 else "UP"
        elif abs(dx) >= 1:
            direction = "RIGHT" if dx < 0 else "LEFT"
        else:
            continue
        votes[direction] = votes.get(direction, 0) + 1
    return max(votes, key=votes.__getitem__) if votes else None


# -- whole recordings -------------------------------------------------------------------------


def recording_to_episode(recording: dict[str, Any], task_hint: str) -> DemoEpisode:
    """A parsed recording (see ``parse_recording_json``) -> a DemoEpisode with agent-level steps.

    The task is the one the recording names (``taskName``), else ``task_hint`` (the importer
    passes the task its folder names, see ``envs.miniwob.demonstrations``). RecordingError when
    the recording's content cannot be read as a MiniWoB++ episode (e.g. a DOM node without geometry).
    """
    try:
        return _recording_to_episode(recording, task_hint)
    except RecordingError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        # Malformed content deep inside (a DOM node that is not an object, a key code that is a
        # list, ...): the recording is unusable as a whole, which is a reason, not a crash.
        raise RecordingError(f"malformed recording: {type(exc).__name__}: {str(exc)[:300]}") from None


def _recording_to_episode(recording: dict[str, Any], task_hint: str) -> DemoEpisode:
    states = recording["states"]
    steps, problems = events_to_steps(states)
    try:
        duration = int(float(states[-1].get("time") or 0))
    except (TypeError, ValueError, OverflowError):
        duration = steps[-1].time_ms if steps else 0
    if abs(duration) >= 2**62:  # fits the warehouse's int64
        duration = steps[-1].time_ms if steps else 0
    decayed = recording.get("reward")
    task_id = recorded_task_name(recording) or task_hint
    stated = recording.get("fields")
    # the fields a live episode of the task gets (envs.miniwob.fields), where the recording has none
    stated = stated if isinstance(stated, dict) else None
    fields = utterance_fields(task_id, recording["utterance"], stated) if task_id is not None else stated
    return DemoEpisode(
        task_id=task_id,
        instruction=recording["utterance"],
        raw_reward=float(recording["rawReward"]),
        decayed_reward=float(decayed) if isinstance(decayed, (int, float)) and not isinstance(decayed, bool) else None,
        steps=steps,
        duration_ms=duration,
        fields=fields or None,
        problems=problems,
    )


def demonstration_record(
    episode: DemoEpisode, episode_id: str, *, family: str = "miniwob", slots: dict[str, str] | None = None
) -> EpisodeRecord:
    """A recorded demonstration as an :class:`envs.protocol.EpisodeRecord` (what reward sources and
    milestone writers read of an episode): its steps with their screens and actions, its outcome,
    ``slots`` (the instruction's slot values, e.g. from ``envs.protocol.episode_slots``; none: {}).
    The screen after the last action is not recorded step-wise: the last step's screen stands in."""
    last = len(episode.steps) - 1
    steps = tuple(
        StepRecord(i, s.screen, s.action, 0.0, (), i == last, s.time_ms, 0.0, s.problem)
        for i, s in enumerate(episode.steps)
    )
    return EpisodeRecord(
        episode_id, episode.task_id, family, episode.instruction, -1, "human", "miniwob", steps,
        steps[-1].screen if steps else Screen(()), {k: str(v) for k, v in (episode.fields or {}).items()},
        dict(slots or {}), episode.success, episode.raw_reward, episode.decayed_reward, "demonstration", 0, 0, 0.0,
        episode.duration_ms, datetime.now(UTC),
    )  # fmt: skip
