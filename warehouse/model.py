"""The canonical data model: UI elements, screens and typed actions.

Every backend (recorded MiniWoB++ demonstrations, live MiniWoB++ in Chromium, Android through
uiautomator2) maps its native screens and actions to these types, so trajectories look alike in
the warehouse whatever produced them.

The action space is ProgRM's (App. G: CLICK, INPUT, SCROLL, GOBACK, ANSWER, NOTHING) widened to
what AndroidWorld uses (LONG_CLICK, PRESS_KEY, OPEN_APP). ``UNKNOWN`` marks a recorded event the
importer could not type; it is kept (never silently dropped) so its share can be measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum


class ActionType(StrEnum):
    CLICK = "CLICK"
    LONG_CLICK = "LONG_CLICK"
    INPUT = "INPUT"
    SCROLL = "SCROLL"
    GOBACK = "GOBACK"
    ANSWER = "ANSWER"
    NOTHING = "NOTHING"
    PRESS_KEY = "PRESS_KEY"
    OPEN_APP = "OPEN_APP"
    UNKNOWN = "UNKNOWN"


KNOWN_ACTION_TYPES: frozenset[str] = frozenset(t.value for t in ActionType if t is not ActionType.UNKNOWN)
TARGETED_ACTION_TYPES: frozenset[ActionType] = frozenset({ActionType.CLICK, ActionType.LONG_CLICK, ActionType.INPUT})
SCROLL_DIRECTIONS: tuple[str, ...] = ("UP", "DOWN", "LEFT", "RIGHT")


@dataclass(frozen=True, slots=True)
class UIElement:
    """One element of a screen, described semantically so the same element matches across episodes.

    ``ref`` is the backend's handle for the element within one episode (a DOM ref, an Android
    hierarchy path); ``element_id`` is the page's own identity (DOM id, Android resource-id).
    Bounds are (left, top, right, bottom) in screen pixels.
    """

    ref: str
    role: str
    text: str = ""
    element_id: str = ""
    classes: str = ""
    description: str = ""
    value: str | None = None
    bounds: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    clickable: bool = False
    editable: bool = False
    checked: bool | None = None
    focused: bool = False
    parent_ref: str | None = None
    depth: int = 0

    def contains(self, x: float, y: float) -> bool:
        left, top, right, bottom = self.bounds
        return left <= x < right and top <= y < bottom

    @property
    def area(self) -> float:
        left, top, right, bottom = self.bounds
        return max(0.0, right - left) * max(0.0, bottom - top)

    def describe(self) -> str:
        """Short semantic description used in canonical action strings: role#id "text"."""
        label = self.role
        if self.element_id:
            label += f"#{self.element_id}"
        elif self.classes:
            label += "." + ".".join(self.classes.split())
        shown = self.text or self.description
        if shown:
            shown = " ".join(shown.split())
            if len(shown) > 60:
                shown = shown[:57] + "..."
            label += f" {json.dumps(shown, ensure_ascii=False)}"
        return label

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bounds"] = list(self.bounds)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> UIElement:
        kwargs = dict(d)
        kwargs["bounds"] = tuple(float(b) for b in kwargs.get("bounds") or (0, 0, 0, 0))
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Screen:
    """What the agent sees before acting: the UI elements in document order, and an optional screenshot."""

    elements: tuple[UIElement, ...]
    screenshot_path: str | None = None

    def by_ref(self, ref: str) -> UIElement | None:
        for element in self.elements:
            if element.ref == ref:
                return element
        return None

    def element_at(self, x: float, y: float) -> UIElement | None:
        """The innermost element whose bounds contain (x, y): the one a pointer event lands on.

        Later elements in document order are drawn on top, so among equally deep hits the last wins.
        """
        best: UIElement | None = None
        for element in self.elements:
            if element.contains(x, y) and (best is None or element.depth >= best.depth):
                best = element
        return best

    def focused(self) -> UIElement | None:
        focused = [e for e in self.elements if e.focused]
        return focused[-1] if focused else None

    def to_text(self, max_elements: int | None = None) -> str:
        """The screen as text, one element per line, for prompts and human review."""
        lines = []
        for element in self.elements[:max_elements]:
            flags = [
                name
                for name, on in (
                    ("clickable", element.clickable),
                    ("editable", element.editable),
                    ("checked", element.checked),
                    ("focused", element.focused),
                )
                if on
            ]
            value = f" value={json.dumps(element.value)}" if element.value not in (None, "") else ""
            flag_text = f" [{', '.join(flags)}]" if flags else ""
            lines.append(f"{'  ' * element.depth}{element.describe()}{value}{flag_text}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Action:
    """A typed GUI action: its type, the semantic target element, typed text and scroll direction."""

    type: ActionType
    target: UIElement | None = None
    text: str | None = None
    direction: str | None = None
    detail: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.direction is not None and self.direction not in SCROLL_DIRECTIONS:
            raise ValueError(f"scroll direction must be one of {SCROLL_DIRECTIONS}, got {self.direction!r}")

    def canonical_text(self) -> str:
        """The canonical string form, e.g. ``CLICK(button#subbtn "Submit")``, ``INPUT(input_text#username, "vanda")``.

        Two actions with the same canonical text do the same thing to the same semantic element.
        """
        args: list[str] = []
        if self.target is not None:
            args.append(self.target.describe())
        if self.direction is not None:
            args.append(self.direction)
        if self.text is not None:
            args.append(json.dumps(self.text, ensure_ascii=False))
        return f"{self.type.value}({', '.join(args)})"


def screen_to_json(screen: Screen) -> str:
    return json.dumps([e.to_dict() for e in screen.elements], ensure_ascii=False, separators=(",", ":"))


def screen_from_records(records: list[dict] | None) -> Screen:
    return Screen(tuple(UIElement.from_dict(r) for r in records or ()))
