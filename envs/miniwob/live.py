"""MiniWoB++ live, in Debian's Chromium, behind the environment protocol (``envs.protocol``).

Built on the Farama ``miniwob`` package: its task pages, its ``SeleniumInstance`` (episode start
with a seed, the benchmark's reward globals) and its action executor
(``execute_action_on_chromedriver``), with two changes:

* the browser is Debian's Chromium with our flags (``CHROMIUM_FLAGS``: a fresh profile, no
  outside lookups); miniwob hard-codes its own, so ``create_driver`` is overridden;
* one browser serves every task (a task switch loads another page), and WebDriver commands are
  few, since each costs the browser and chromedriver more CPU than the work it carries: a click
  and the state after it (the benchmark's reward globals and the DOM) are one script, other
  actions are the action plus that state script, an episode start is one script (miniwob's own
  path makes five commands per click and seven per reset, and builds numpy arrays we don't use);
  the state comes back as one JSON text, which chromedriver and Selenium pass on instead of
  converting the DOM tree value by value.

Canonical actions map to MiniWoB++ action types (``to_miniwob_actions``):

==============================  ============================================================
CLICK(target)                   CLICK_ELEMENT(ref), preceded by the mousedown / mouseup a pointer
                                sends at the element's centre (jQuery UI widgets act on
                                mousedown; a bare element.click() leaves a spinner unmoved)
INPUT(target, text)             FOCUS_ELEMENT_AND_TYPE_TEXT(ref, text); a non-empty field is
                                cleared first (CLICK_ELEMENT, PRESS_KEY C-a, TYPE_TEXT): INPUT
                                replaces the value, as on Android. A <select> takes the text
                                as type-ahead: the matching option is chosen.
SCROLL(UP|DOWN[, target])       SCROLL_UP_COORDS / SCROLL_DOWN_COORDS at the target's centre, else
                                the task area's; the screen is read once the page has received
                                the wheel and scrolled (miniwob sleeps out a 150 ms wheel action)
PRESS_KEY(keys)                 PRESS_KEY per key ("Enter", "Ctrl+A", "ArrowDown Tab", ...)
NOTHING                         NONE, then wait ``wait_ms`` (pages animate)
==============================  ============================================================

LONG_CLICK, GOBACK, ANSWER, OPEN_APP and horizontal scrolls have no MiniWoB++ counterpart: they
are failed steps, as are targets not on the screen and text into a non-editable element.

Success is the benchmark's own: raw reward 1 (partial credit is not success, as for the recorded
demonstrations). Milestones of the task spec are checked on every screen after an action.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.constants import TASK_HEIGHT, TASK_WIDTH, WEBDRIVER_SPECIAL_KEYS
from miniwob.selenium_actions import execute_action_on_chromedriver, execute_press_key
from miniwob.selenium_instance import HTML_DIR, SeleniumInstance
from selenium.webdriver.common.action_chains import ActionChains

from envs.miniwob.dom import _CLICKABLE_ROLES as CLICKABLE_ROLES
from envs.miniwob.dom import EDITABLE_ROLES, TEXT_NODE_TAGS, dom_to_screen, rgb_colour_name, role_of
from envs.miniwob.fields import utterance_fields
from envs.protocol import InvalidAction, MilestoneTracker, Observation, StepResult, resolve_target
from envs.scratch import make_owned_folder, reap_abandoned, reap_abandoned_chromium_profiles
from envs.tasks import TaskSpec, TaskSpecError
from warehouse.model import Action, ActionType, Screen, UIElement

logger = logging.getLogger(__name__)

BACKEND = "miniwob"
TASK_PAGES = HTML_DIR / "miniwob"
SUCCESS_RAW_REWARD = 1.0
# The task area (MiniWoB++ draws every task in the top-left 160 x 210 px); scrolls without a
# target land in the middle of its content, below the 50 px instruction bar.
TASK_AREA_CENTRE = (TASK_WIDTH / 2, 50 + (TASK_HEIGHT - 50) / 2)

CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--mute-audio",
)
NO_OUTSIDE_LOOKUPS = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"

SUPPORTED_ACTIONS = frozenset(
    {ActionType.CLICK, ActionType.INPUT, ActionType.SCROLL, ActionType.PRESS_KEY, ActionType.NOTHING}
)
_SELECT_ROLES = frozenset({"combobox"})
_SCROLLS = frozenset({ActionTypes.SCROLL_UP_COORDS, ActionTypes.SCROLL_DOWN_COORDS})

# The benchmark's reward globals and the DOM, read in the same script as the action where it can
# be: every WebDriver command costs the browser and chromedriver CPU, more than the work itself.
# The state travels as one JSON text (parsed by ``parse_state``): chromedriver and Selenium convert
# a returned object value by value, which on a large page (book-flight's results: ~120 nodes)
# costs more than the DOM read itself. The replacer keeps what WebDriver's own serialisation gives:
# undefined as null, and an SVG element's className (an SVGAnimatedString, whose fields JSON would
# drop) as its baseVal / animVal. ``wheels`` and ``scrolls`` count the wheel and scroll events the
# page has seen (passive listeners: they block no scroll), so that a scroll can wait for its own.
_STATE_JS = """
function __stepwiseJSON(key, value) {
  if (value === undefined) { return null; }
  if (key === 'classes' && value !== null && typeof value === 'object') {
    return {baseVal: value.baseVal, animVal: value.animVal};
  }
  return value;
}
function __stepwiseState() {
  if (window.__stepwiseWheels === undefined) {
    window.__stepwiseWheels = 0;
    window.__stepwiseScrolls = 0;
    var counting = {capture: true, passive: true};
    window.addEventListener('wheel', function () { window.__stepwiseWheels++; }, counting);
    window.addEventListener('scroll', function () { window.__stepwiseScrolls++; }, counting);
  }
  var dom = core.getDOMInfo();
  return JSON.stringify({done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
                         reason: WOB_REWARD_REASON, dom: dom, wheels: window.__stepwiseWheels,
                         scrolls: window.__stepwiseScrolls}, __stepwiseJSON);
}
"""
# The state once the timers already queued have run: typing schedules work with setTimeout(0)
# (jQuery UI's autocomplete searches that way with delay 0), and a synchronous read would see the
# suggestions for an earlier prefix of the typed text.
_SETTLED_STATE_SCRIPT = (
    _STATE_JS
    + """
var done = arguments[arguments.length - 1];
setTimeout(function () { done(__stepwiseState()); }, 0);
"""
)
# The state after a wheel event: WebDriver's wheel action with a duration sends the event and then
# sleeps out the duration (miniwob's scroll_time, 150 ms), and without one it returns before the
# event reached the page, which takes it at a later frame. So the wheel is sent without a duration
# and this script waits, frame by frame, until the page has received it (``wheels`` above
# arguments[0], the count on the last screen) and the scroll it causes has been applied: a scroll
# event (``scrolls`` above arguments[1]). The scroll is not the wheel's own doing: the browser
# process turns the wheel, once the page has handled it, into scroll gestures for the compositor,
# so under load the scroll event can come many frames after the wheel; where something under the
# wheel's point (arguments[2], [3]) can scroll its way (arguments[4]: down when positive), the wait
# is for that event, up to arguments[6] ms after the wheel arrived, not for a number of frames.
# Where nothing can, the wait ends one frame after the wheel arrived. Then queued timers run and
# the state is read: the screen the 150 ms wait showed (headless Chromium does not animate a
# wheel's scroll), in a frame or two. After arguments[5] ms the state is read whatever arrived.
_AFTER_WHEEL_SCRIPT = (
    _STATE_JS
    + """
var wheels = arguments[0], scrolls = arguments[1], x = arguments[2], y = arguments[3], down = arguments[4] > 0;
var limit = arguments[5], scrollWait = arguments[6], done = arguments[arguments.length - 1];
var over = false, since = null, arrived = null;
var NOT_USER_SCROLLABLE = {hidden: true, clip: true};
// Would a wheel at (x, y) scroll anything that way? When unsure (an iframe), yes: that only
// waits longer, up to the limit. Off the elements, only the viewport can.
function scrollable() {
  var rootOverflow = window.getComputedStyle(document.documentElement).overflowY;
  for (var el = document.elementFromPoint(x, y) || document.scrollingElement; el; el = el.parentElement) {
    if (el.tagName === 'IFRAME') { return true; }
    var room = down ? el.scrollHeight - el.clientHeight - el.scrollTop : el.scrollTop;
    if (room < 1) { continue; }
    if (el === document.scrollingElement) {
      // The viewport's overflow is the root's, or the body's where the root's is visible.
      var body = document.body, fromRoot = rootOverflow !== 'visible' || !body;
      var viewport = fromRoot ? rootOverflow : window.getComputedStyle(body).overflowY;
      return !NOT_USER_SCROLLABLE[viewport];
    }
    // A body whose overflow went to the viewport does not scroll itself: content overflowing a
    // body of fixed height (the task's 210 px) scrolls nothing while the viewport has room for it.
    if (el === document.body && rootOverflow === 'visible') { continue; }
    var overflow = window.getComputedStyle(el).overflowY;
    if (overflow !== 'visible' && !NOT_USER_SCROLLABLE[overflow]) { return true; }
  }
  return false;
}
var open = scrollable();
// How the wait ended, for tests and diagnosis: 'scroll', 'nothing to scroll', 'no scroll came'
// (one was expected: the check above was wrong, or the scroll came later than scrollWait) or
// 'limit' (the wheel itself never arrived).
function finish(how) {
  if (over) { return; }
  over = true;
  window.__stepwiseScrollEnd = how;
  setTimeout(function () { done(__stepwiseState()); }, 0);
}
function poll() {
  if (over) { return; }
  if (since === null && window.__stepwiseWheels > wheels) { since = 0; arrived = performance.now(); }
  if (since !== null && window.__stepwiseScrolls > scrolls) { finish('scroll'); return; }
  if (since !== null && !open && since >= 1) { finish('nothing to scroll'); return; }
  if (since !== null && open && performance.now() - arrived >= scrollWait) { finish('no scroll came'); return; }
  if (since !== null) { since++; }
  requestAnimationFrame(poll);
}
setTimeout(function () { finish('limit'); }, limit);
poll();
"""
)
# CLICK_ELEMENT as core.elementClick does it (click(), then focus()), preceded by the pointer
# events a real click sends first; then, if asked (arguments[1]), the state after the click.
_CLICK_SCRIPT = (
    _STATE_JS
    + """
var ref = arguments[0], element = core.previousDOMInfo[ref];
if (!element) { return {error: 'no element with ref ' + ref + ' on the last screen'}; }
var rect = element.getBoundingClientRect();
var init = {bubbles: true, cancelable: true, view: window, button: 0,
            clientX: rect.left + rect.width / 2, clientY: rect.top + rect.height / 2};
element.dispatchEvent(new MouseEvent('mousedown', init));
element.dispatchEvent(new MouseEvent('mouseup', init));
var outcome = core.elementClick(ref);
if (outcome !== true) { return {error: String(outcome)}; }
return arguments[1] ? {state: __stepwiseState()} : {};
"""
)
# An episode start in one script: what miniwob's force_stop + begin_task(seed) do (end the running
# episode, Math.seedrandom(seed), the data mode, core.startEpisodeReal), plus a fresh ref namespace
# (core.getDOMInfo keys refs by episode id, which endEpisode bumps only for a running episode: the
# DOM read after an episode's end would lend its refs to the next episode's elements), then the
# instruction with the fields some tasks state themselves, and the first state.
_RESET_SCRIPT = (
    _STATE_JS
    + """
core.endEpisode(0);
// A page element keeps focus from the worker's previous episode (a static form's button):
// blur it, so that a seed's first screen does not depend on what ran before in this browser.
if (document.activeElement && document.activeElement !== document.body) { document.activeElement.blur(); }
WOB_EPISODE_ID++;
Math.seedrandom(arguments[0]);
core.setDataMode(arguments[1]);
if (arguments[2]) { core.EPISODE_MAX_TIME = arguments[2]; }
core.startEpisodeReal();
if (!WOB_TASK_READY) { return {ready: false}; }
var u = core.getUtterance();
var fields = (typeof u === 'string') ? null : (u.fields || null);
return {ready: true, utterance: (typeof u === 'string') ? u : u.utterance, fields: fields,
        state: __stepwiseState()};
"""
)
_AFTER_READY_SCRIPT = (
    _STATE_JS
    + """
if (!WOB_TASK_READY) { return {ready: false}; }
var u = core.getUtterance();
return {ready: true, utterance: (typeof u === 'string') ? u : u.utterance,
        fields: (typeof u === 'string') ? null : (u.fields || null), state: __stepwiseState()};
"""
)
READY_POLL_S, READY_ATTEMPTS = 0.05, 40  # tasks that build their page asynchronously
WHEEL_WAIT_MS = 1000  # how long a scroll waits at most for its wheel event and its scroll
SCROLL_WAIT_MS = 300  # how long after its wheel arrived a scroll waits for the page to scroll, where it can

_ACTION_CONFIG = ActionSpaceConfig.get_preset("all_supported")
_ACTION_CONFIG.screen_width, _ACTION_CONFIG.screen_height = TASK_WIDTH, TASK_HEIGHT
_ACTION_INDEX = {t: i for i, t in enumerate(_ACTION_CONFIG.action_types)}
_MODIFIER_PREFIX = {"ctrl": "C-", "control": "C-", "shift": "S-", "alt": "A-", "meta": "M-", "cmd": "M-"}


def available_tasks() -> list[str]:
    """Every MiniWoB++ task the installed package ships (one HTML page each)."""
    return sorted(p.stem for p in TASK_PAGES.glob("*.html"))


# -- DOM -> screen ---------------------------------------------------------------------------


def _normalise_node(node: dict[str, Any]) -> dict[str, Any]:
    """SVG elements report className as an object; keep its string. Applied in place, recursively."""
    stack = [node]
    while stack:
        current = stack.pop()
        classes = current.get("classes")
        if isinstance(classes, Mapping):
            current["classes"] = str(classes.get("baseVal") or classes.get("animVal") or "")
        stack.extend(current.get("children") or ())
    return node


def live_dom_to_screen(dom: dict[str, Any], screenshot_path: str | None = None) -> Screen:
    """``core.getDOMInfo()``'s tree -> Screen: the recorded demonstrations' format, so ``dom_to_screen``
    applies unchanged and live screens look exactly like the demonstrations' screens."""
    return dom_to_screen(_normalise_node(dom), screenshot_path)


def dom_elements_to_screen(dom_elements: Sequence[Mapping[str, Any]], screenshot_path: str | None = None) -> Screen:
    """The gymnasium observation's ``dom_elements`` (a flat list in document order: ref, parent,
    left/top/width/height as 1-element arrays, tag, text, value, id, classes, colours, flags
    focused/tampered/targeted/is_leaf) -> Screen, with the roles and text folding of ``dom.py``.

    For users of ``gymnasium.make("miniwob/...")``; our environment reads the DOM tree directly.
    The flat list stringifies values, so a checkbox's state arrives as "True" / "".
    """

    def number(value: Any) -> float:
        try:
            return float(value[0])
        except (TypeError, IndexError):
            return float(value)

    by_ref: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    text_parts: dict[int, list[str]] = {}
    for raw in dom_elements:
        ref, parent = int(raw["ref"]), int(raw["parent"])
        tag = str(raw["tag"]).lower()
        if tag in TEXT_NODE_TAGS:  # text pseudo-element: fold into its parent's text
            if raw.get("text"):
                text_parts.setdefault(parent, []).append(str(raw["text"]))
            continue
        by_ref[ref] = dict(raw, tag=tag)
        order.append(ref)
        own = str(raw.get("text") or "")
        text_parts.setdefault(ref, [])
        if own:
            text_parts[ref].insert(0, own)
    depth: dict[int, int] = {}
    elements: list[UIElement] = []
    has_children = {int(by_ref[ref]["parent"]) for ref in order}
    for ref in order:
        raw = by_ref[ref]
        parent = int(raw["parent"])
        depth[ref] = depth[parent] + 1 if parent in depth else 0
        role = role_of(raw["tag"])
        value_text = str(raw.get("value") or "")
        checked = None
        value: str | None = value_text
        if role in ("checkbox", "radio"):
            checked, value = value_text == "True", None
        elif not raw["tag"].startswith("input") and raw["tag"] != "textarea":
            value = None
        left, top = number(raw["left"]), number(raw["top"])
        flags = raw.get("flags")
        focused = bool(flags[0]) if flags is not None and len(flags) else False
        text = " ".join(" ".join(text_parts[ref]).split())
        elements.append(
            UIElement(
                ref=str(ref),
                role=role,
                text=text,
                element_id=str(raw.get("id") or ""),
                classes=str(raw.get("classes") or ""),
                description="" if text or ref in has_children else _gym_colour_name(raw.get("bg_color")),
                value=value,
                bounds=(left, top, left + number(raw["width"]), top + number(raw["height"])),
                clickable=role in CLICKABLE_ROLES,
                editable=role in EDITABLE_ROLES,
                checked=checked,
                focused=focused,
                parent_ref=str(parent) if parent in by_ref else None,
                depth=depth[ref],
            )
        )
    return Screen(tuple(elements), screenshot_path)


def _gym_colour_name(rgba: Any) -> str:
    """``dom.colour_name`` of the gymnasium observation's ``bg_color`` (RGBA floats in [0, 1])."""
    try:
        red, green, blue, alpha = (float(v) for v in rgba)
    except (TypeError, ValueError):
        return ""
    return rgb_colour_name(red, green, blue) if alpha >= 1.0 else ""


def parse_state(text: str) -> dict[str, Any]:
    """A state script's JSON text -> the state: done, env_reward, raw_reward, reason, dom, wheels, scrolls."""
    state: dict[str, Any] = json.loads(text)
    return state


def _events_seen(state: Mapping[str, Any]) -> tuple[int, int]:
    return int(state["wheels"]), int(state["scrolls"])


# -- canonical action -> MiniWoB++ actions ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class NativeAction:
    """One MiniWoB++ action: its type and the fields that type reads (ref, text, key, coords)."""

    type: ActionTypes
    ref: int | None = None
    text: str | None = None
    key: str | None = None  # MiniWoB++ key syntax: "<Enter>", "C-a", "x"
    coords: tuple[float, float] | None = None

    def execute(
        self, driver: Any, *, read_state: bool = False, seen: tuple[int, int] = (0, 0)
    ) -> dict[str, Any] | None:
        """Carry it out with miniwob's own executors (CLICK_ELEMENT with pointer events first).

        With ``read_state``, a click returns the state after it from the same script (one round
        trip instead of two); other actions return None and the caller reads the state. A scroll
        waits until the page has received its wheel event and scrolled (``seen``: the wheel and
        scroll events counted on the last screen) and returns the state then, asked or not.
        """
        if self.type is ActionTypes.CLICK_ELEMENT:
            outcome = driver.execute_script(_CLICK_SCRIPT, self.ref, read_state)
            if "error" in outcome:
                raise InvalidAction(f"the click did not happen: {outcome['error']}")
            return parse_state(outcome["state"]) if "state" in outcome else None
        if self.type is ActionTypes.PRESS_KEY:
            # miniwob's executor reads keys by index into a fixed list that lacks combinations
            # such as "C-a"; its key function takes the syntax itself.
            execute_press_key(self.key or "", driver)
            return None
        if self.type in _SCROLLS:
            # miniwob's execute_scroll_coords, without the wheel's duration (_AFTER_WHEEL_SCRIPT).
            left, top = _ACTION_CONFIG.compute_raw_coords({"coords": self.coords})
            x, y = int(left), int(top)
            amount = _ACTION_CONFIG.scroll_amount
            delta = -amount if self.type is ActionTypes.SCROLL_UP_COORDS else amount
            chain = ActionChains(driver, duration=0)
            chain.w3c_actions.wheel_action.scroll(x=x, y=y, delta_y=delta)
            chain.w3c_actions.perform()
            state = driver.execute_async_script(_AFTER_WHEEL_SCRIPT, *seen, x, y, delta, WHEEL_WAIT_MS, SCROLL_WAIT_MS)
            return parse_state(state)
        fields: dict[str, Any] = {"action_type": _ACTION_INDEX[self.type]}
        if self.ref is not None:
            fields["ref"] = self.ref
        if self.text is not None:
            fields["text"] = self.text
        if self.coords is not None:
            fields["coords"] = self.coords
        execute_action_on_chromedriver(fields, (), _ACTION_CONFIG, driver)
        return None


def miniwob_key(name: str) -> str:
    """A canonical key name ("Enter", "Ctrl+A", "a") -> MiniWoB++'s key syntax ("<Enter>", "C-a", "a")."""
    *modifiers, key = name.split("+") if len(name) > 1 else [name]
    prefix = ""
    for modifier in modifiers:
        try:
            prefix += _MODIFIER_PREFIX[modifier.strip().lower()]
        except KeyError:
            raise InvalidAction(f"unknown modifier {modifier!r} in key {name!r}") from None
    if len(key) == 1:
        key = key.lower() if prefix else key
    elif f"<{key}>" in WEBDRIVER_SPECIAL_KEYS:
        key = f"<{key}>"
    else:
        raise InvalidAction(f"key {name!r} is not one MiniWoB++ can press")
    return prefix + key


def to_miniwob_actions(action: Action, screen: Screen) -> list[NativeAction]:
    """The MiniWoB++ actions that carry out a canonical action on ``screen``, in order.

    Raises InvalidAction when it cannot be carried out; nothing has been done then.
    """
    kind = action.type
    if kind is ActionType.NOTHING:
        return [NativeAction(ActionTypes.NONE)]
    if kind is ActionType.CLICK:
        element = resolve_target(screen, action.target)
        return [NativeAction(ActionTypes.CLICK_ELEMENT, ref=int(element.ref))]
    if kind is ActionType.INPUT:
        element = resolve_target(screen, action.target)
        if not (element.editable or element.role in _SELECT_ROLES):
            raise InvalidAction(f"text into a non-editable element: {element.describe()}")
        text = action.text or ""
        ref = int(element.ref)
        if element.role in _SELECT_ROLES or not element.value:
            return [NativeAction(ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT, ref=ref, text=text)]
        # INPUT replaces the value: select what is there, then type over it (or delete it).
        clear = [NativeAction(ActionTypes.CLICK_ELEMENT, ref=ref), NativeAction(ActionTypes.PRESS_KEY, key="C-a")]
        if text:
            return [*clear, NativeAction(ActionTypes.TYPE_TEXT, text=text)]
        return [*clear, NativeAction(ActionTypes.PRESS_KEY, key="<Backspace>")]
    if kind is ActionType.SCROLL:
        if action.direction not in ("UP", "DOWN"):
            raise InvalidAction(f"MiniWoB++ scrolls only UP or DOWN, not {action.direction}")
        if action.target is not None:
            element = resolve_target(screen, action.target)
            left, top, right, bottom = element.bounds
            x, y = (left + right) / 2, (top + bottom) / 2
        else:
            x, y = TASK_AREA_CENTRE
        native = ActionTypes.SCROLL_UP_COORDS if action.direction == "UP" else ActionTypes.SCROLL_DOWN_COORDS
        return [NativeAction(native, coords=(x, y))]
    if kind is ActionType.PRESS_KEY:
        names = (action.text or "").split()
        if not names:
            raise InvalidAction("PRESS_KEY needs the key(s) to press")
        return [NativeAction(ActionTypes.PRESS_KEY, key=miniwob_key(name)) for name in names]
    raise InvalidAction(f"MiniWoB++ has no {kind.value} action")


# -- the browser ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniWoBConfig:
    """How to start a MiniWoB++ environment; picklable, so a pool worker process can build one."""

    chromium_binary: str = os.environ.get("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
    chromedriver: str = os.environ.get("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")
    headless: bool = True
    block_outside_lookups: bool = True
    wait_ms: int = 100  # how long NOTHING waits
    settle_ms: int = 0  # pause after every action before observing (0: observe at once)
    screenshot_dir: str | None = None  # save a PNG per screen there (slow; off by default)
    extra_flags: tuple[str, ...] = ()
    profile_dir: str | None = None  # Chromium's user-data-dir; a fresh temporary one when None
    # The task page's episode clock (core.EPISODE_MAX_TIME; its reward decays over it and the episode
    # fails when it runs out). None keeps the benchmark's 10 s; an LLM thinking 5-10 s a step on a
    # CPU needs longer, or its episodes end before its second action.
    episode_max_time_ms: int | None = None

    def create(self) -> MiniWoBEnv:
        return MiniWoBEnv(self)


#: Chromium puts its singleton socket at ``$TMPDIR/.org.chromium.Chromium.XXXXXX/SingletonSocket``;
#: a unix socket path may not exceed 107 bytes, so a longer TMPDIR stops the browser at its start
#: ("Chrome instance exited", which says nothing of why).
SOCKET_PATH_LIMIT = 107
_SINGLETON_SOCKET_SUFFIX = "/.org.chromium.Chromium.XXXXXX/SingletonSocket"


#: An environment's folder: ``<base>/stepwise-env-XXXXXXXX`` holding the browser's profile
#: (``profile``, unless the config names one) and its TMPDIR (``tmp``), owned by the process that
#: made the environment (a pool's worker, or the caller's own; envs.scratch): one folder for the
#: pool to remove when it kills a worker, and for the next environment to remove when its owner
#: died without removing it.
SCRATCH_PREFIX = "stepwise-env-"
_BROWSER_TMPDIR = f"/{SCRATCH_PREFIX}XXXXXXXX/tmp"


def scratch_base(tmpdir: str | None = None) -> str:
    """Where an environment makes its folder: ``tmpdir`` (default: the process's temporary folder)
    when Chromium's singleton socket under the folder's ``tmp`` stays within
    :data:`SOCKET_PATH_LIMIT`, else ``/tmp``.

    Chromium keeps that socket (and, with ``--disable-dev-shm-usage``, its shared memory) in a
    folder it makes under TMPDIR and removes only when it exits cleanly: a browser killed with its
    worker left one in /tmp each time (459 here by 2026-12-01) until the browser's TMPDIR became a
    folder of the environment's own."""
    tmpdir = tmpdir or tempfile.gettempdir()
    needed = len(os.fsencode(tmpdir)) + len(_BROWSER_TMPDIR) + len(_SINGLETON_SOCKET_SUFFIX)
    return tmpdir if needed <= SOCKET_PATH_LIMIT else "/tmp"


def reap_abandoned_environments() -> list[Path]:
    """Remove the folders of environments whose owner process is gone (envs.scratch) under this
    process's temporary folder and under /tmp (where environments made with another TMPDIR are
    not seen), and the ``stepwise-chromium-*`` profiles whose browser is gone."""
    bases = dict.fromkeys([scratch_base(), "/tmp"])
    reaped = [folder for base in bases for folder in reap_abandoned(f"{SCRATCH_PREFIX}*", base)]
    return reaped + [folder for base in bases for folder in reap_abandoned_chromium_profiles(base)]


class _ChromiumInstance(SeleniumInstance):
    """miniwob's SeleniumInstance on Debian's Chromium with our flags; one browser for every task."""

    def __init__(self, config: MiniWoBConfig, profile_dir: str, tmpdir: str | None = None) -> None:
        super().__init__(index=0, subdomain="click-test", headless=config.headless)
        self.config = config
        self.profile_dir = profile_dir
        self.tmpdir = tmpdir  # the browser's own TMPDIR, in the environment's folder (scratch_base)
        self.subdomain: str | None = None

    def create_driver(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as ChromeService

        options = webdriver.ChromeOptions()
        options.binary_location = self.config.chromium_binary
        for flag in CHROMIUM_FLAGS if self.config.headless else CHROMIUM_FLAGS[1:]:
            options.add_argument(flag)
        if self.config.block_outside_lookups:
            options.add_argument(NO_OUTSIDE_LOOKUPS)
        options.add_argument(f"--user-data-dir={self.profile_dir}")
        for flag in self.config.extra_flags:
            options.add_argument(flag)
        env = None if self.tmpdir is None else {**os.environ, "TMPDIR": self.tmpdir}
        service = ChromeService(executable_path=self.config.chromedriver, log_output=subprocess.DEVNULL, env=env)
        self.driver = webdriver.Chrome(service=service, options=options)

    def open_task(self, subdomain: str) -> None:
        """Load a task's page and wait for its start cover (the page is ready for an episode)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.wait import WebDriverWait

        self.url = urllib.parse.urljoin(f"file://{TASK_PAGES}/", f"{subdomain}.html")
        self.driver.get(self.url)
        WebDriverWait(self.driver, 10).until(EC.presence_of_element_located((By.ID, self.SYNC_SCREEN_ID)))
        self.inner_width, self.inner_height = self.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];"
        )
        self.subdomain = subdomain


class MiniWoBEnv:
    """A MiniWoB++ environment in one Chromium; see the module docstring for the action mapping."""

    backend = BACKEND
    supported_actions = SUPPORTED_ACTIONS

    def __init__(self, config: MiniWoBConfig | None = None) -> None:
        self.config = config or MiniWoBConfig()
        try:
            reap_abandoned_environments()
        except Exception as exc:  # noqa: BLE001 - another's leftovers must not stop this browser
            logger.warning("could not look for abandoned environment folders: %s", exc)
        base = scratch_base()
        try:
            self._scratch = make_owned_folder(SCRATCH_PREFIX, base)
        except OSError as exc:
            raise OSError(f"no folder for the browser could be made under {base}: {exc}") from exc
        self._profile_dir = self.config.profile_dir or str(self._scratch / "profile")
        self._browser_tmpdir = str(self._scratch / "tmp")
        try:
            for folder in (self._profile_dir, self._browser_tmpdir):
                os.makedirs(folder, exist_ok=True)
            self._instance = _ChromiumInstance(self.config, self._profile_dir, self._browser_tmpdir)
            self._instance.create_driver()
        except BaseException:
            self._remove_scratch()
            raise
        self._task: TaskSpec | None = None
        self._tracker: MilestoneTracker | None = None
        self._screen: Screen | None = None
        self._done = True
        self._seen = (0, 0)  # the page's wheel and scroll events so far, as the last state read them
        self._episode = 0
        self._step = 0
        self._closed = False

    # -- protocol ------------------------------------------------------------------------
    def reset(self, task: TaskSpec, seed: int) -> Observation:
        """Start an episode of ``task`` (a MiniWoB++ task id with its spec) with ``seed``."""
        if task.backend != BACKEND:
            raise TaskSpecError(f"task {task.task_id} is for backend {task.backend!r}, not {BACKEND!r}")
        if not (TASK_PAGES / f"{task.task_id}.html").is_file():
            raise TaskSpecError(f"task {task.task_id}: the miniwob package has no such task page")
        instance = self._instance
        if instance.subdomain != task.task_id:
            instance.open_task(task.task_id)
        # Math.seedrandom(seed): the same seed, the same task instance (see _RESET_SCRIPT).
        started = instance.driver.execute_script(
            _RESET_SCRIPT, int(seed), instance.mode, self.config.episode_max_time_ms or 0
        )
        for _ in range(READY_ATTEMPTS):
            if started["ready"]:
                break
            time.sleep(READY_POLL_S)
            started = instance.driver.execute_script(_AFTER_READY_SCRIPT)
        else:
            raise RuntimeError(f"task {task.task_id} did not become ready")
        instance.start_time = time.time()
        instruction = " ".join(str(started["utterance"]).split())
        fields = utterance_fields(task.task_id, instruction, started.get("fields"))
        self._tracker = MilestoneTracker(task, instruction, fields)  # raises when the instruction does not fit
        self._task = task
        self._episode += 1
        self._step = 0
        state = parse_state(started["state"])
        self._seen = _events_seen(state)
        self._screen = self._to_screen(state)
        self._done = bool(state["done"])
        return Observation(self._screen, instruction, task.task_id, fields, {"seed": int(seed)})

    def step(self, action: Action) -> StepResult:
        if self._screen is None or self._tracker is None:
            raise RuntimeError("step() before reset()")
        if self._done:
            return StepResult(self._screen, done=True, problem="the episode has already ended")
        try:
            natives = to_miniwob_actions(action, self._screen)
            problem = None
        except InvalidAction as exc:
            natives, problem = [], str(exc)
        driver = self._instance.driver
        pause_ms = self.config.wait_ms if action.type is ActionType.NOTHING else self.config.settle_ms
        state = None
        try:
            for i, native in enumerate(natives):
                last = i == len(natives) - 1
                state = native.execute(
                    driver, read_state=last and not pause_ms and not self.config.screenshot_dir, seen=self._seen
                )
                if state is not None:
                    self._seen = _events_seen(state)
                    if not last or pause_ms or self.config.screenshot_dir:  # a scroll's; the screen comes later
                        state = None
        except InvalidAction as exc:
            problem, state = str(exc), None
        if pause_ms:
            time.sleep(pause_ms / 1000)
        self._step += 1
        if state is None:
            state = self._state()
            self._seen = _events_seen(state)
        screen = self._to_screen(state)
        done = bool(state["done"])
        raw = float(state["raw_reward"] or 0.0) if done else 0.0
        success = done and raw >= SUCCESS_RAW_REWARD
        started = time.perf_counter()
        hit = self._tracker.update(screen, None if problem else action, success_at_end=success)
        milestone_ms = (time.perf_counter() - started) * 1000
        self._screen, self._done = screen, done
        info: dict[str, Any] = {"milestone_ms": milestone_ms}
        if done:
            info.update(
                raw_reward=raw,
                decayed_reward=float(state["env_reward"] or 0.0),
                reason=None if state["reason"] is None else str(state["reason"]),
            )
        return StepResult(screen, raw, hit, done, success, problem, info)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._instance.driver.quit()
        except Exception:  # the browser may already be gone; the profile still has to go
            pass
        self._remove_scratch()

    @property
    def scratch_paths(self) -> tuple[str, ...]:
        """Folders this environment created and removes on close (the pool removes them when it
        has to kill the worker instead)."""
        return (str(self._scratch),)

    def healthy(self) -> bool:
        try:
            return self._instance.driver.execute_script("return 1;") == 1
        except Exception:
            return False

    # -- helpers -------------------------------------------------------------------------
    def browser_pids(self) -> list[int]:
        """Process ids of chromedriver and the Chromium processes it started (for fault injection)."""
        import psutil

        try:
            driver_process = psutil.Process(self._instance.driver.service.process.pid)
            return [driver_process.pid, *(p.pid for p in driver_process.children(recursive=True))]
        except (psutil.Error, AttributeError):
            return []

    @property
    def task(self) -> TaskSpec | None:
        return self._task

    def _state(self) -> dict[str, Any]:
        return parse_state(self._instance.driver.execute_async_script(_SETTLED_STATE_SCRIPT))

    def _to_screen(self, state: dict[str, Any]) -> Screen:
        path = None
        if self.config.screenshot_dir:
            folder = Path(self.config.screenshot_dir)
            folder.mkdir(parents=True, exist_ok=True)
            path = str(folder / f"{os.getpid()}-{self._episode:05d}-{self._step:03d}.png")
            self._instance.driver.save_screenshot(path)
        return live_dom_to_screen(state["dom"], path)

    def _remove_scratch(self) -> None:
        """Remove the folder this environment made: the browser's profile (unless the config named
        one) and its TMPDIR."""
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> MiniWoBEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
