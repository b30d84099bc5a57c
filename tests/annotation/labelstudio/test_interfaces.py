"""Labeling configs and task rendering: valid XML, every field the config reads is in the task, readable screens."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from annotation.labelstudio.interfaces import INTERFACES
from annotation.labelstudio.push import match_task_data, milestone_review_data, step_task_data
from annotation.labelstudio.render import StepView, describe_action, history_html, screen_html, screen_list_html
from warehouse.model import Screen, UIElement

SCREEN = Screen(
    (
        UIElement(ref="1", role="body", bounds=(0, 0, 160, 210)),
        UIElement(
            ref="2",
            role="textbox",
            element_id="username",
            bounds=(5, 60, 150, 80),
            clickable=True,
            editable=True,
            depth=1,
        ),
        UIElement(
            ref="3",
            role="button",
            element_id="subbtn",
            text='Login <script>alert("x")</script>',
            bounds=(5, 120, 80, 145),
            clickable=True,
            depth=1,
        ),
    )
)
VIEW = StepView(
    episode_id="e1",
    step_idx=1,
    task_id="login-user",
    instruction='Enter "alan" & log in',
    screen=SCREEN,
    action_type="INPUT",
    action_text='INPUT(textbox#username, "alan")',
    target_ref="2",
    input_text="alan",
    history=("CLICK(textbox#username)",),
)


def fields_read_by(config: str) -> set[str]:
    return set(re.findall(r'value="\$([a-z_]+)"', config))


@pytest.mark.parametrize("name", sorted(INTERFACES))
def test_configs_are_xml_with_hotkeys_and_the_task_provides_every_field(name):
    interface = INTERFACES[name]
    config = interface.label_config()
    root = ET.fromstring(config)
    assert root.tag == "View"
    assert "/* stepwise-style */" not in config and ".sw-el" in config  # the shared stylesheet is inlined
    choices = [c for c in root.iter("Choice")]
    assert all(c.get("hotkey") for c in choices), "every choice has a keyboard shortcut"
    assert len({c.get("hotkey") for c in choices}) == len(choices), "shortcuts do not collide"
    if name == "milestone_review":
        data = milestone_review_data(
            instruction="i",
            task_id="t",
            milestone_set_id="t:spec",
            milestones=["a", "b"],
            reference=VIEW,
            reference_actions=["CLICK(x)"],
            interface=interface,
            item_key="milestones:t:spec",
        )
    elif name == "milestone_match":
        data = match_task_data(
            VIEW,
            milestone_set_id="t:spec",
            milestone_idx=0,
            n_milestones=2,
            milestone="username typed",
            interface=interface,
            item_key="match:x",
        )
    else:
        data = step_task_data(VIEW, interface=interface, item_key="step:e1:1")
    assert fields_read_by(config) <= set(data), fields_read_by(config) - set(data)
    assert data["interface_version"] == f"{name}@1"


def test_step_correctness_offers_positive_negative_unsure_and_a_rationale():
    root = ET.fromstring(INTERFACES["step_correctness"].label_config())
    choices = {c.get("value"): c.get("hotkey") for c in root.iter("Choice")}
    assert choices == {"positive": "1", "negative": "2", "unsure": "3"}
    assert [t.get("name") for t in root.iter("TextArea")] == ["rationale"]
    number = next(ET.fromstring(INTERFACES["step_progress"].label_config()).iter("Number"))
    assert (number.get("min"), number.get("max")) == ("0", "100")
    review = ET.fromstring(INTERFACES["milestone_review"].label_config())
    assert {c.get("name") for c in review.iter("Choices")} == {"quality", "factuality", "order", "granularity"}
    assert sorted(c.get("alias") for c in next(review.iter("Choices")).iter("Choice")) == ["1", "2", "3", "4", "5"]


def test_screen_rendering_highlights_the_target_and_escapes_text():
    html = screen_html(SCREEN, "2")
    assert "<svg" in html and 'class="t"' in html  # the wireframe, target box filled
    assert '<li class="d1 t"><b>textbox</b> #username' in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert describe_action("INPUT", SCREEN.by_ref("2"), "alan") == "Type “alan” into textbox #username"
    assert describe_action("CLICK", SCREEN.by_ref("3")).startswith("Click button #subbtn “Login")


def test_long_screens_are_clipped_but_keep_the_target():
    elements = tuple(UIElement(ref=str(i), role="div", text=f"row {i}", bounds=(0, i, 10, i + 1)) for i in range(500))
    html = screen_list_html(Screen(elements), "450", max_elements=100)
    assert html.count("<li") == 101 and "row 450" in html and "399 more elements" in html


def test_history_numbers_earlier_actions():
    assert history_html(()).startswith('<p class="sw-none">')
    html = history_html([f"CLICK({i})" for i in range(40)], max_items=30)
    assert 'start="11"' in html and "10 earlier actions" in html


def test_screenshot_urls_local_route_or_inline(tmp_path):
    from annotation.labelstudio.queue import screenshot_url
    from tests.annotation.labelstudio.conftest import PNG

    shot = tmp_path / "home" / "shots" / "a.png"
    shot.parent.mkdir(parents=True)
    shot.write_bytes(PNG)
    assert screenshot_url(str(shot), tmp_path / "home", tmp_path / "home") == "/data/local-files/?d=home/shots/a.png"
    assert screenshot_url("shots/a.png", tmp_path / "home", None).startswith(
        "data:image/png;base64,"
    )  # a user's server
    assert screenshot_url(str(tmp_path / "missing.png"), tmp_path, tmp_path) is None
    big = tmp_path / "big.png"
    big.write_bytes(PNG + b"\0" * 500_000)
    assert screenshot_url(str(big), tmp_path, None) is None  # too big to inline
