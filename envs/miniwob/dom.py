"""MiniWoB++ DOM trees -> canonical screens.

Both the recorded human demonstrations and the live benchmark describe the page as a tree of
nodes with a tag, a stable ``ref``, geometry, id, classes, text and value. Text nodes (tag ``t``)
are folded into their parent's text, so a label reads "furious" rather than being an empty box
with an anonymous child.

A leaf with no text whose background is an opaque, saturated colour (a swatch: click-shades'
squares, click-color's buttons) is described by that colour's basic name (``colour_name``), what a
person or a screen-reading agent would see; the recordings and the live page carry it as
``bgColor``. Without it such a task cannot be told apart from its distractors in the screen.
"""

from __future__ import annotations

import colorsys
import re
from typing import Any

from warehouse.model import Screen, UIElement

_ROLE_BY_TAG = {
    "input_checkbox": "checkbox",
    "input_radio": "radio",
    "input_text": "textbox",
    "input_password": "password",
    "input_number": "number",
    "input_date": "date",
    "input_time": "time",
    "input_email": "textbox",
    "input_tel": "textbox",
    "input_search": "textbox",
    "input_url": "textbox",
    "input_button": "button",
    "input_submit": "button",
    "input_reset": "button",
    "textarea": "textbox",
    "a": "link",
    "select": "combobox",
}
EDITABLE_ROLES = frozenset({"textbox", "password", "number", "date", "time"})
_CLICKABLE_ROLES = frozenset(
    {
        "button",
        "link",
        "checkbox",
        "radio",
        "combobox",
        "option",
        "label",
        "li",
        "textbox",
        "password",
        "number",
        "date",
        "time",
    }
)
TEXT_NODE_TAGS = frozenset({"t"})
_RGB = re.compile(r"rgba?\(\s*([^)]*)\)")
# Basic colour names by hue (degrees): each name holds hues from its start up to the next start.
_HUE_NAMES: tuple[tuple[float, str], ...] = (
    (0.0, "red"),
    (15.0, "orange"),
    (45.0, "yellow"),
    (70.0, "green"),
    (165.0, "cyan"),
    (195.0, "blue"),
    (255.0, "purple"),
    (315.0, "pink"),
    (345.0, "red"),
)
MIN_SATURATION = 0.25  # below: a grey, named by no hue
LIGHTNESS_RANGE = (0.08, 0.92)  # outside: near black or near white, whatever the hue


def colour_name(css_colour: str | None) -> str:
    """The basic name (red, orange, yellow, green, cyan, blue, purple, pink) of a CSS ``rgb()`` /
    ``rgba()`` colour by its hue in HSL, or "" for a grey, a near-black or near-white, a colour that
    is not fully opaque, or text that is not such a colour."""
    match = _RGB.fullmatch((css_colour or "").strip())
    if match is None:
        return ""
    try:
        parts = [float(p) for p in match.group(1).split(",")]
    except ValueError:
        return ""
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] < 1.0):
        return ""
    red, green, blue = (p / 255.0 for p in parts[:3])
    return rgb_colour_name(red, green, blue)


def rgb_colour_name(red: float, green: float, blue: float) -> str:
    """``colour_name`` of an opaque colour given as RGB fractions in [0, 1] (clipped there)."""
    hue, lightness, saturation = colorsys.rgb_to_hls(*(min(max(c, 0.0), 1.0) for c in (red, green, blue)))
    if saturation < MIN_SATURATION or not LIGHTNESS_RANGE[0] <= lightness <= LIGHTNESS_RANGE[1]:
        return ""
    degrees = hue * 360.0
    return next(name for start, name in reversed(_HUE_NAMES) if degrees >= start)


def role_of(tag: str) -> str:
    lowered = tag.lower()
    return _ROLE_BY_TAG.get(lowered, lowered)


def dom_to_screen(root: dict[str, Any], screenshot_path: str | None = None) -> Screen:
    """Flatten a MiniWoB++ DOM tree (as recorded: tag, ref, left/top/width/height, ...) into a Screen.

    Raises ValueError naming the missing field when a node lacks tag, ref or geometry.
    """
    elements: list[UIElement] = []
    stack: list[tuple[dict[str, Any], str | None, int]] = [(root, None, 0)]
    # Depth-first, children in document order: push them reversed onto the stack.
    while stack:
        node, parent_ref, depth = stack.pop()
        try:
            tag = node["tag"]
            ref = str(node["ref"])
            left = float(node["left"])
            top = float(node["top"])
            width = float(node["width"])
            height = float(node["height"])
        except KeyError as exc:
            raise ValueError(f"DOM node missing field {exc.args[0]!r}: {_brief(node)}") from None
        except (TypeError, ValueError):
            raise ValueError(f"DOM node has non-numeric geometry: {_brief(node)}") from None
        children = node.get("children") or ()
        own_text = node.get("text") or ""
        text_parts = [own_text] if own_text else []
        element_children = []
        for child in children:
            if child.get("tag") in TEXT_NODE_TAGS:
                child_text = child.get("text") or ""
                if child_text:
                    text_parts.append(child_text)
            else:
                element_children.append(child)
        role = role_of(tag)
        raw_value = node.get("value")
        checked = bool(raw_value) if role in ("checkbox", "radio") and isinstance(raw_value, bool) else None
        value = None if raw_value is None or isinstance(raw_value, bool) else str(raw_value)
        text = " ".join(" ".join(text_parts).split())
        swatch = "" if text or element_children else colour_name(node.get("bgColor"))
        elements.append(
            UIElement(
                ref=ref,
                role=role,
                text=text,
                element_id=str(node.get("id") or ""),
                classes=str(node.get("classes") or ""),
                description=swatch,
                value=value,
                bounds=(left, top, left + width, top + height),
                clickable=role in _CLICKABLE_ROLES,
                editable=role in EDITABLE_ROLES,
                checked=checked,
                focused=bool(node.get("focused", False)),
                parent_ref=parent_ref,
                depth=depth,
            )
        )
        for child in reversed(element_children):
            stack.append((child, ref, depth + 1))
    return Screen(tuple(elements), screenshot_path)


def _brief(node: dict[str, Any]) -> str:
    shown = {k: node[k] for k in ("tag", "ref", "id") if k in node}
    return str(shown) if shown else "<node without tag/ref/id>"
