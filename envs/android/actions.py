"""Canonical actions -> uiautomator2 calls, as data (pure: a screen in, calls out).

=================================  ===========================================================
CLICK(target)                      click(x, y) at the centre of the target's bounds
LONG_CLICK(target)                 long_click(x, y, duration)
INPUT(target, text)                click(x, y) to focus, then send_keys(text, clear=True):
                                   the field's text is replaced (GUI-Shepherd App. B.1's
                                   "input with clear"); only into an editable element
SCROLL(direction[, target])        swipe across the middle of the target (else the largest
                                   scrollable element, else the screen): SCROLL(DOWN) shows what
                                   is below, so the finger moves up
GOBACK                             press("back")
PRESS_KEY(key)                     press(name): Enter, Backspace, Home, Tab, arrows, ...
OPEN_APP(package)                  app_start(package)
NOTHING / ANSWER(text)             no call (NOTHING waits; ANSWER ends the episode)
=================================  ===========================================================

A target must be an element of the current screen (``envs.protocol.resolve_target``); anything
else raises InvalidAction, and the step is recorded as failed with nothing sent to the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.protocol import InvalidAction, resolve_target
from warehouse.model import Action, ActionType, Screen, UIElement

LONG_CLICK_S = 0.8
SWIPE_S = 0.25
SWIPE_SPAN = 0.5  # the finger travels half the scrolled region
KEY_NAMES = {
    "enter": "enter",
    "backspace": "delete",
    "delete": "delete",
    "del": "delete",
    "home": "home",
    "back": "back",
    "tab": "tab",
    "menu": "menu",
    "search": "search",
    "recent": "recent",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "up": "up",
    "down": "down",
    "left": "left",
    "right": "right",
    "volume_up": "volume_up",
    "volume_down": "volume_down",
}
SUPPORTED_ACTIONS = frozenset(
    {
        ActionType.CLICK,
        ActionType.LONG_CLICK,
        ActionType.INPUT,
        ActionType.SCROLL,
        ActionType.GOBACK,
        ActionType.PRESS_KEY,
        ActionType.OPEN_APP,
        ActionType.NOTHING,
        ActionType.ANSWER,
    }
)


@dataclass(frozen=True, slots=True)
class DeviceCall:
    """One uiautomator2 ``Device`` method call: ``getattr(device, name)(*args, **kwargs)``."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    def apply(self, device: Any) -> Any:
        return getattr(device, self.name)(*self.args, **dict(self.kwargs))


def centre(element: UIElement) -> tuple[int, int]:
    left, top, right, bottom = element.bounds
    return int((left + right) / 2), int((top + bottom) / 2)


def scroll_region(
    screen: Screen, target: UIElement | None, window: tuple[int, int]
) -> tuple[float, float, float, float]:
    """Where a scroll swipes: the target, else the largest scrollable container, else the window."""
    if target is not None:
        return target.bounds
    scrollables = [e for e in screen.elements if e.role in ("list", "scroll", "pager", "webview") and e.area > 0]
    if scrollables:
        return max(scrollables, key=lambda e: e.area).bounds
    width, height = window
    return 0.0, 0.0, float(width), float(height)


def swipe_for(direction: str, region: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    """(from x, from y, to x, to y) of the swipe that scrolls ``region`` in ``direction``."""
    left, top, right, bottom = region
    cx, cy = (left + right) / 2, (top + bottom) / 2
    dx, dy = (right - left) * SWIPE_SPAN / 2, (bottom - top) * SWIPE_SPAN / 2
    if direction == "DOWN":  # show what is below: drag the content up
        points = (cx, cy + dy, cx, cy - dy)
    elif direction == "UP":
        points = (cx, cy - dy, cx, cy + dy)
    elif direction == "RIGHT":  # show what is to the right: drag the content left
        points = (cx + dx, cy, cx - dx, cy)
    elif direction == "LEFT":
        points = (cx - dx, cy, cx + dx, cy)
    else:
        raise InvalidAction(f"unknown scroll direction {direction!r}")
    x0, y0, x1, y1 = points
    return int(x0), int(y0), int(x1), int(y1)


def to_device_calls(action: Action, screen: Screen, window: tuple[int, int]) -> list[DeviceCall]:
    """The uiautomator2 calls that carry out ``action`` on ``screen`` (window: width, height in px)."""
    kind = action.type
    if kind in (ActionType.NOTHING, ActionType.ANSWER):
        return []
    if kind is ActionType.CLICK:
        return [DeviceCall("click", centre(resolve_target(screen, action.target)))]
    if kind is ActionType.LONG_CLICK:
        return [DeviceCall("long_click", (*centre(resolve_target(screen, action.target)), LONG_CLICK_S))]
    if kind is ActionType.INPUT:
        element = resolve_target(screen, action.target)
        if not element.editable:
            raise InvalidAction(f"text into a non-editable element: {element.describe()}")
        return [DeviceCall("click", centre(element)), DeviceCall("send_keys", (action.text or "",), (("clear", True),))]
    if kind is ActionType.SCROLL:
        target = resolve_target(screen, action.target) if action.target is not None else None
        region = scroll_region(screen, target, window)
        return [DeviceCall("swipe", (*swipe_for(action.direction or "DOWN", region), SWIPE_S))]
    if kind is ActionType.GOBACK:
        return [DeviceCall("press", ("back",))]
    if kind is ActionType.PRESS_KEY:
        names = (action.text or "").split()
        if not names:
            raise InvalidAction("PRESS_KEY needs the key(s) to press")
        calls = []
        for name in names:
            key = KEY_NAMES.get(name.lower())
            if key is None:
                raise InvalidAction(f"key {name!r} has no Android key event here (known: {sorted(KEY_NAMES)})")
            calls.append(DeviceCall("press", (key,)))
        return calls
    if kind is ActionType.OPEN_APP:
        if not action.text:
            raise InvalidAction("OPEN_APP needs the app's package name")
        return [DeviceCall("app_start", (action.text,))]
    raise InvalidAction(f"Android has no {kind.value} action")
