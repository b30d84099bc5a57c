"""Android view hierarchy XML -> canonical Screen.

The XML is what ``uiautomator dump`` or uiautomator2's ``Device.dump_hierarchy()`` writes: a
``<hierarchy>`` of nested ``<node>`` elements with ``text``, ``resource-id``, ``class``,
``package``, ``content-desc``, boolean state flags and ``bounds="[x1,y1][x2,y2]"``; newer Android
versions add ``hint``, ``drawing-order``, ``visible-to-user`` and others, older ones lack them.

Mapping to ``UIElement``: ``ref`` is the node's path of child positions ("0.2.1"), ``element_id``
the resource-id, ``description`` the content-desc, ``classes`` the widget class, ``role`` a short
semantic name from the class (``role_of_class``; the web backend's names where they overlap:
button, checkbox, radio, textbox, password, combobox). An editable field's ``value`` is its text,
unless the text is only its hint (what an empty field shows). Nodes without area or marked not
visible to the user are left out (they cannot be touched), their subtrees with them.

A dump comes from a device, so it is outside data: it is bounded (``MAX_HIERARCHY_BYTES``, nodes
nested at most ``MAX_HIERARCHY_DEPTH`` deep) and may not declare a DTD (uiautomator never writes
one; entities declared there could expand a few hundred bytes into megabytes of text).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from warehouse.model import Screen, UIElement

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
# The real dumps in ../shared/data/android-hierarchy are at most 79 KB, 163 nodes, 20 levels deep.
MAX_HIERARCHY_BYTES = 16 * 1024 * 1024
MAX_HIERARCHY_DEPTH = 1000  # also keeps UIElement.depth within the steps table's int16

# Class simple names (the part after the last dot) -> role. Checked in order: first match wins.
_ROLE_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("EditText", "AutoCompleteTextView", "SearchAutoComplete"), "textbox"),
    (("RadioButton",), "radio"),
    (("CheckBox",), "checkbox"),
    (("Switch", "ToggleButton", "SwitchCompat", "SwitchMaterial"), "switch"),
    (("CheckedTextView",), "option"),
    (("Button", "FloatingActionButton", "Chip"), "button"),
    (("Spinner",), "combobox"),
    (("SeekBar", "Slider"), "slider"),
    (("ProgressBar",), "progressbar"),
    (("RecyclerView", "ListView", "GridView"), "list"),
    (("ScrollView",), "scroll"),
    (("ViewPager",), "pager"),
    (("TabLayout", "TabWidget"), "tabs"),
    (("WebView",), "webview"),
    (("TextView",), "text"),
    (("ImageView",), "image"),
    (("Layout", "ViewGroup", "ComposeView", "RadioGroup", "CardView", "Toolbar"), "group"),
)
EDITABLE_ROLES = frozenset({"textbox", "password"})


def role_of_class(class_name: str, *, password: bool = False) -> str:
    """A widget class ("android.widget.EditText", "androidx...SwitchMaterial") -> a short role."""
    simple = class_name.rsplit(".", 1)[-1].split("$")[-1]
    for needles, role in _ROLE_RULES:
        if any(simple.endswith(n) or n in simple for n in needles):
            if role == "textbox" and password:
                return "password"
            return role
    if simple == "View":
        return "view"
    return simple.lower() or "view"


def parse_bounds(text: str) -> tuple[float, float, float, float]:
    """``"[x1,y1][x2,y2]"`` -> (left, top, right, bottom); ValueError when malformed."""
    match = _BOUNDS.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"malformed bounds {text!r} (expected [x1,y1][x2,y2])")
    left, top, right, bottom = (float(v) for v in match.groups())
    return left, top, right, bottom


def _flag(node: ET.Element, name: str) -> bool:
    return node.get(name, "false") == "true"


def parse_hierarchy(xml_text: str, screenshot_path: str | None = None) -> Screen:
    """A view-hierarchy dump -> Screen (document order = depth-first, children in order).

    Raises ValueError naming the problem when the XML is not a hierarchy dump.
    """
    if isinstance(xml_text, str):
        try:
            data = xml_text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no XML parser can read it
            raise ValueError(f"not a view hierarchy: not valid Unicode text at character {exc.start}") from None
    else:
        data = xml_text
    if len(data) > MAX_HIERARCHY_BYTES:
        raise ValueError(f"not a view hierarchy: {len(data)} bytes, over the limit of {MAX_HIERARCHY_BYTES}")
    if b"<!DOCTYPE" in data.upper() or b"<!ENTITY" in data.upper():
        raise ValueError("not a view hierarchy: it declares a DTD (<!DOCTYPE or <!ENTITY), which dumps never do")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ValueError(f"not a view hierarchy: invalid XML ({exc})") from None
    if root.tag != "hierarchy":
        raise ValueError(f"not a view hierarchy: root element is <{root.tag}>, expected <hierarchy>")
    elements: list[UIElement] = []
    stack: list[tuple[ET.Element, str, str | None, int]] = [
        (child, str(i), None, 0) for i, child in reversed(list(enumerate(root.findall("node"))))
    ]
    while stack:
        node, ref, parent_ref, depth = stack.pop()
        if depth >= MAX_HIERARCHY_DEPTH:
            raise ValueError(f"node {ref[:40]}...: nested more than {MAX_HIERARCHY_DEPTH} levels deep")
        try:
            bounds = parse_bounds(node.get("bounds", ""))
        except ValueError as exc:
            raise ValueError(f"node {ref}: {exc}") from None
        left, top, right, bottom = bounds
        if right <= left or bottom <= top or node.get("visible-to-user") == "false":
            continue  # nothing to touch here, nor in its subtree
        class_name = node.get("class", "")
        password = _flag(node, "password")
        role = role_of_class(class_name, password=password)
        text = node.get("text", "") or ""
        hint = node.get("hint")
        editable = role in EDITABLE_ROLES and node.get("enabled", "true") == "true"
        value = None
        if role in EDITABLE_ROLES:
            value = "" if (hint and text == hint) else text
        elements.append(
            UIElement(
                ref=ref,
                role=role,
                text=" ".join(text.split()),
                element_id=node.get("resource-id", "") or "",
                classes=class_name,
                description=" ".join((node.get("content-desc", "") or "").split()),
                value=value,
                bounds=bounds,
                clickable=_flag(node, "clickable") or _flag(node, "long-clickable"),
                editable=editable,
                checked=_flag(node, "checked") if _flag(node, "checkable") else None,
                focused=_flag(node, "focused"),
                parent_ref=parent_ref,
                depth=depth,
            )
        )
        children = node.findall("node")
        for i in range(len(children) - 1, -1, -1):
            stack.append((children[i], f"{ref}.{i}", ref, depth + 1))
    return Screen(tuple(elements), screenshot_path)


def package_of(xml_text: str) -> set[str]:
    """The app packages a dump shows (the foreground app and system UI)."""
    root = ET.fromstring(xml_text.encode("utf-8"))
    return {n.get("package", "") for n in root.iter("node") if n.get("package")}
