"""Turn steps, screens and milestones into the HTML an annotator reads in Label Studio.

Pure functions, no I/O. The HTML is compact (the styles live once in each label config's
``<Style>``, see ``configs/style.css``; the HTML only names classes) because it is stored in every
task: ~5-8 kB per step for a MiniWoB++ screen.

A screen is shown two ways side by side:

* **boxes**: an SVG wireframe of the element bounds (clickable elements outlined blue, editable
  green, the action's target filled red), so layout and position read at a glance; its viewBox
  is computed from every box it draws, the target's included, so the target is never cut off;
* **list**: one element per line, indented by depth (role, #id, .classes, "text", value, flags),
  the target marked; containers without text are dimmed.

The screenshot is shown above them when the step has one (a URL Label Studio can load).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from warehouse.model import Screen, UIElement

MAX_LIST_ELEMENTS = 160
MAX_TEXT_CHARS = 90
MAX_DEPTH_CLASS = 15
MIN_MARGIN = 2.0  # px around the drawn elements in the wireframe's viewBox
MARGIN_SHARE = 0.02  # ... or this share of the larger side, whichever is more
MIN_TARGET_MARKER = 6.0  # px: the target is drawn at least this wide and high (a point or a line too)

Box = tuple[float, float, float, float]  # left, top, right, bottom


@dataclass(frozen=True)
class StepView:
    """Everything an annotator needs to judge one step."""

    episode_id: str
    step_idx: int
    task_id: str
    instruction: str
    screen: Screen
    action_type: str
    action_text: str
    target_ref: str | None = None
    input_text: str | None = None
    scroll_direction: str | None = None
    history: tuple[str, ...] = ()  # canonical texts of the earlier actions, in order
    screenshot_url: str | None = None


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str | None, limit: int = MAX_TEXT_CHARS) -> str:
    cleaned = " ".join((text or "").split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def _has_content(element: UIElement) -> bool:
    return bool(
        element.text
        or element.description
        or element.value
        or element.clickable
        or element.editable
        or element.checked is not None
    )


def element_label(element: UIElement) -> str:
    """One element as a line of HTML: <b>role</b>#id .classes "text" value="…" [flags]."""
    parts = [f"<b>{_esc(element.role or '?')}</b>"]
    if element.element_id:
        parts.append(f"#{_esc(_clip(element.element_id, 40))}")
    if element.classes:
        classes = element.classes.split()
        shown = ".".join(classes[:2]) + ("…" if len(classes) > 2 else "")
        parts.append(f"<i>.{_esc(shown)}</i>")
    shown_text = element.text or element.description
    if shown_text:
        parts.append(f"<q>{_esc(_clip(shown_text))}</q>")
    if element.value not in (None, ""):
        parts.append(f"value=<q>{_esc(_clip(element.value, 60))}</q>")
    flags = [
        name
        for name, on in (("clickable", element.clickable), ("editable", element.editable), ("focused", element.focused))
        if on
    ]
    if element.checked is not None:
        flags.append("checked" if element.checked else "unchecked")
    if flags:
        parts.append(f"<small>[{', '.join(flags)}]</small>")
    return " ".join(parts)


def known_bounds(element: UIElement) -> bool:
    """Whether an element has a position on the screen: finite bounds, not all zero (the default of
    an element whose bounds were never recorded), right >= left and bottom >= top."""
    x0, y0, x1, y1 = element.bounds
    return all(math.isfinite(v) for v in element.bounds) and any(element.bounds) and x1 >= x0 and y1 >= y0


def _drawn_box(element: UIElement, is_target: bool, marker: float) -> Box | None:
    """The box the wireframe draws for an element: its bounds, grown for the target to at least a
    ``marker``-sized square around its centre (a target that is a point, a line or a few pixels stays
    visible); None when the element is not drawn (no content, no area or no known position)."""
    if not known_bounds(element) or not (is_target or (element.area > 0 and _has_content(element))):
        return None
    x0, y0, x1, y1 = element.bounds
    if not is_target:
        return element.bounds
    cx, cy, half = (x0 + x1) / 2, (y0 + y1) / 2, marker / 2
    return (min(x0, cx - half), min(y0, cy - half), max(x1, cx + half), max(y1, cy + half))


def _px(value: float) -> str:
    """A coordinate, compactly: whole pixels without decimals, else one decimal."""
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def _union(boxes: Sequence[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def screen_viewport(screen: Screen, target_ref: str | None = None) -> tuple[int, int, int, int] | None:
    """The area the wireframe shows, in whole pixels (left, top, right, bottom): every drawn element
    (those that carry content, and the target) with a margin around them, so the target is always
    inside; None when nothing can be drawn."""
    boxes = _drawn_boxes(screen, target_ref)
    if not boxes:
        return None
    left, top, right, bottom = _union([box for _, box, _ in boxes])
    pad = max(MIN_MARGIN, MARGIN_SHARE * max(right - left, bottom - top))
    return (
        math.floor(left - pad),
        math.floor(top - pad),
        math.ceil(right + pad),
        math.ceil(bottom + pad),
    )


def _drawn_boxes(screen: Screen, target_ref: str | None) -> list[tuple[UIElement, Box, bool]]:
    """(element, its drawn box, whether it is the target) for every element the wireframe draws."""
    known = [e.bounds for e in screen.elements if known_bounds(e) and e.area > 0]
    span = _union(known) if known else (0.0, 0.0, 100.0, 100.0)
    marker = max(MIN_TARGET_MARKER, 0.03 * max(span[2] - span[0], span[3] - span[1]))
    out: list[tuple[UIElement, Box, bool]] = []
    for element in screen.elements:
        is_target = target_ref is not None and element.ref == target_ref
        box = _drawn_box(element, is_target, marker)
        if box is not None:
            out.append((element, box, is_target))
    return out


def screen_boxes_svg(screen: Screen, target_ref: str | None = None) -> str:
    """An SVG wireframe of the screen: elements as boxes, the target filled (drawn last, on top), short
    texts written in. The viewBox holds every box drawn (:func:`screen_viewport`). A target without a
    known position is said so under the wireframe (the element list still marks it)."""
    viewport = screen_viewport(screen, target_ref)
    target = screen.by_ref(target_ref) if target_ref is not None else None
    unplaced = (
        '<p class="sw-none">the target has no recorded position on the screen: see it marked in the list</p>'
        if target is not None and not known_bounds(target)
        else ""
    )
    if viewport is None:
        return unplaced
    left, top, right, bottom = viewport
    width, height = right - left, bottom - top
    font = max(5.0, min(width, height) / 26)
    shapes: list[str] = []
    target_shape = ""
    for element, (x0, y0, x1, y1), is_target in sorted(_drawn_boxes(screen, target_ref), key=lambda d: d[0].depth):
        kind = "t" if is_target else "e" if element.editable else "c" if element.clickable else "n"
        rect = f'<rect class="{kind}" x="{_px(x0)}" y="{_px(y0)}" width="{_px(x1 - x0)}" height="{_px(y1 - y0)}"/>'
        label = _clip(element.text or element.value or element.description or "", 24)
        if label and (y1 - y0) >= font * 0.9:
            rect += f'<text x="{x0 + 1:.0f}" y="{min(y1, y0 + font):.0f}">{_esc(label)}</text>'
        if is_target:
            target_shape = rect  # drawn last, on top
        else:
            shapes.append(rect)
    return (
        f'<svg class="sw-svg" viewBox="{left} {top} {width} {height}" '
        f'style="font-size:{font:.1f}px" preserveAspectRatio="xMinYMin meet">'
        + "".join(shapes)
        + target_shape
        + "</svg>"
        + unplaced
    )


def screen_list_html(screen: Screen, target_ref: str | None = None, max_elements: int = MAX_LIST_ELEMENTS) -> str:
    """The screen's elements as an indented list, the target marked (and always kept when clipping)."""
    elements = list(screen.elements)
    shown = elements[:max_elements]
    target = screen.by_ref(target_ref) if target_ref is not None else None
    if target is not None and target not in shown:
        shown.append(target)
    items = []
    for element in shown:
        classes = [f"d{min(element.depth, MAX_DEPTH_CLASS)}"]
        if target is not None and element.ref == target.ref:
            classes.append("t")
        elif not _has_content(element):
            classes.append("dim")
        items.append(f'<li class="{" ".join(classes)}">{element_label(element)}</li>')
    more = (
        f'<p class="sw-more">… {len(elements) - len(shown)} more elements not shown</p>'
        if len(elements) > len(shown)
        else ""
    )
    return f'<ol class="sw-el">{"".join(items)}</ol>{more}'


def screen_html(screen: Screen, target_ref: str | None = None, screenshot_url: str | None = None) -> str:
    """The whole screen panel: screenshot (if any), wireframe boxes and element list."""
    parts = ['<div class="sw-scr">']
    if screenshot_url:
        parts.append(f'<img class="sw-shot" src="{_esc(screenshot_url)}" alt="screenshot"/>')
    svg = screen_boxes_svg(screen, target_ref)
    if svg:
        parts.append(svg)
    parts.append(screen_list_html(screen, target_ref))
    parts.append("</div>")
    return "".join(parts)


def describe_action(
    action_type: str, target: UIElement | None, input_text: str | None = None, scroll_direction: str | None = None
) -> str:
    """A plain-language sentence for an action, e.g. 'Type “alan” into textbox #username'."""
    what = ""
    if target is not None:
        what = target.role or "element"
        if target.element_id:
            what += f" #{target.element_id}"
        shown = _clip(target.text or target.description, 50)
        if shown:
            what += f" “{shown}”"
    verb = {
        "CLICK": "Click",
        "LONG_CLICK": "Long-press",
        "INPUT": "Type",
        "SCROLL": "Scroll",
        "GOBACK": "Go back",
        "ANSWER": "Answer",
        "NOTHING": "Do nothing",
        "PRESS_KEY": "Press key",
        "OPEN_APP": "Open app",
    }.get(action_type, action_type.title())
    if action_type == "INPUT":
        sentence = f"Type “{_clip(input_text or '', 60)}”" + (f" into {what}" if what else "")
    elif action_type == "SCROLL":
        sentence = f"Scroll {(scroll_direction or '').lower()}".strip() + (f" in {what}" if what else "")
    elif action_type in ("ANSWER", "PRESS_KEY", "OPEN_APP"):
        sentence = f"{verb} “{_clip(input_text or '', 60)}”" if input_text else verb
    else:
        sentence = f"{verb} {what}".strip()
    return sentence


def action_html(view: StepView) -> str:
    """The action under review: a sentence and its canonical form."""
    target = view.screen.by_ref(view.target_ref) if view.target_ref is not None else None
    sentence = describe_action(view.action_type, target, view.input_text, view.scroll_direction)
    return (
        f'<div class="sw-act"><span class="sw-step">step {view.step_idx + 1}</span> '
        f"<b>{_esc(sentence)}</b><br/><code>{_esc(view.action_text)}</code></div>"
    )


def history_html(history: Sequence[str], max_items: int = 30) -> str:
    """The earlier actions of the episode, numbered (the oldest elided when there are many)."""
    if not history:
        return '<p class="sw-none">(first step: no earlier actions)</p>'
    start = max(0, len(history) - max_items)
    items = "".join(f"<li><code>{_esc(_clip(text, 120))}</code></li>" for text in history[start:])
    elided = f'<p class="sw-more">… {start} earlier actions</p>' if start else ""
    return f'{elided}<ol class="sw-hist" start="{start + 1}">{items}</ol>'


def milestones_html(milestones: Sequence[str]) -> str:
    """An ordered milestone list, as the ADMIRE milestone reviewer reads it."""
    items = "".join(f"<li>{_esc(_clip(m, 200))}</li>" for m in milestones)
    return f'<ol class="sw-ms">{items}</ol>'


def milestone_html(index: int, total: int, text: str) -> str:
    step = f'<span class="sw-step">milestone {index + 1} of {total}</span>'
    return f'<div class="sw-act">{step} <b>{_esc(_clip(text, 200))}</b></div>'
