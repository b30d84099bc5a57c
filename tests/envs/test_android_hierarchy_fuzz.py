"""Fuzz (e): arbitrary XML-ish text -> parse_hierarchy gives a Screen or a ValueError naming the problem.

Generated inputs: plain text, real device dumps mutated (cut, characters inserted, attributes
replaced), hierarchies built from random nodes and attributes, and entity / nesting tricks.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envs.android.hierarchy import parse_hierarchy
from tests.envs.conftest import DUMPS_DIR
from tests.envs.fuzzing import fuzz_settings
from warehouse.model import Screen

REAL_DUMPS = sorted(DUMPS_DIR.glob("*.xml"))[:4]
_ATTRS = ["bounds", "class", "text", "resource-id", "content-desc", "checkable", "checked", "password", "hint"]
_ATTRS += ["visible-to-user", "enabled", "clickable", "focused", "package"]
_VALUES = st.sampled_from(["[0,0][10,10]", "[0,0][-5,3]", "[1,2]", "true", "false", "android.widget.EditText", ""])
_VALUES |= st.text(max_size=12)


def _xml_text(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")


@st.composite
def _node(draw, depth: int = 0) -> str:
    attrs = draw(st.dictionaries(st.sampled_from(_ATTRS), _VALUES, max_size=5))
    escape = draw(st.booleans())
    text = " ".join(f'{k}="{_xml_text(v) if escape else v}"' for k, v in attrs.items())
    children = draw(st.lists(_node(depth + 1), max_size=3)) if depth < 3 else []
    tag = draw(st.sampled_from(["node", "node", "node", "view", ""]))
    return f"<{tag} {text}>{''.join(children)}</{tag}>" if children else f"<{tag} {text}/>"


@st.composite
def _documents(draw) -> str | bytes:
    kind = draw(st.sampled_from(["text", "built", "mutated-dump", "tricks", "bytes"]))
    if kind == "text":
        return draw(st.text(max_size=300))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "built":
        root = draw(st.sampled_from(["hierarchy", "hierarchy", "node", "Hierarchy"]))
        body = "".join(draw(st.lists(_node(), max_size=4)))
        prolog = draw(st.sampled_from(["", "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>\n"]))
        return f'{prolog}<{root} rotation="0">{body}</{root}>'
    if kind == "tricks":
        depth = draw(st.integers(1, 20_000))
        return draw(
            st.sampled_from(
                [
                    "<hierarchy>" + '<node bounds="[0,0][9,9]">' * depth + "</node>" * depth + "</hierarchy>",
                    '<!DOCTYPE h [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
                    '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
                    '<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">]>'
                    '<hierarchy><node text="&f;&f;&f;&f;" bounds="[0,0][9,9]"/></hierarchy>',
                    '<!DOCTYPE h [<!ENTITY x SYSTEM "file:///etc/passwd">]><hierarchy><node text="&x;"/></hierarchy>',
                    "<hierarchy>\udcff\ud800</hierarchy>",
                    '<hierarchy><node bounds="[0,0][1' + "0" * depth + ',9]"/></hierarchy>',
                ]
            )
        )
    dump = draw(st.sampled_from(REAL_DUMPS)).read_text(encoding="utf-8")
    position = draw(st.integers(0, len(dump)))
    insert = draw(st.sampled_from(["<", ">", '"', "&", "&amp;", "<node>", "</node>", 'bounds="x"', "\x00", "\ud800"]))
    return dump[:position] + insert + dump[position + draw(st.integers(0, 40)) :]


@pytest.mark.fuzz
@fuzz_settings(300)
@given(document=_documents())
def test_fuzz_parse_hierarchy_returns_a_screen_or_a_value_error(document):
    try:
        screen = parse_hierarchy(document)  # bytes too: what a device may return
    except ValueError as exc:
        assert str(exc).strip()
        assert "not a view hierarchy" in str(exc) or "node " in str(exc), str(exc)
    else:
        assert isinstance(screen, Screen)
        assert all(e.bounds[2] > e.bounds[0] and e.bounds[3] > e.bounds[1] for e in screen.elements)
