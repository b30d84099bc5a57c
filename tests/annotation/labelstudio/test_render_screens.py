"""The wireframe an annotator sees always shows the action's target: on real MiniWoB++ screens (the
demonstrations, imported into a warehouse and read back as the push reads them, and recordings of the
e-mail tasks, whose icon targets carry no text) and on screens with targets of zero or unknown size."""

from __future__ import annotations

import re

import pytest

from annotation.labelstudio.reads import read_step_views
from annotation.labelstudio.render import StepView, known_bounds, screen_boxes_svg, screen_html
from envs.miniwob.demonstrations import import_demonstrations
from envs.miniwob.recordings import parse_recording_json, read_recording_bytes, recording_to_episode
from warehouse.catalog import Warehouse
from warehouse.model import Screen, UIElement

NUMBER = r"(-?[\d.]+)"
VIEWBOX = re.compile(rf'viewBox="{NUMBER} {NUMBER} {NUMBER} {NUMBER}"')
TARGET_RECT = re.compile(rf'<rect class="t" x="{NUMBER}" y="{NUMBER}" width="{NUMBER}" height="{NUMBER}"/>')


def target_inside(svg: str, target: UIElement) -> bool:
    """The target is drawn (its red box), and both the box and the element's bounds lie inside the viewBox."""
    box, rect = VIEWBOX.search(svg), TARGET_RECT.search(svg)
    if box is None or rect is None:
        return False
    left, top, width, height = map(float, box.groups())
    x, y, w, h = map(float, rect.groups())
    x0, y0, x1, y1 = target.bounds
    return (
        left <= min(x, x0) and top <= min(y, y0) and max(x + w, x1) <= left + width and max(y + h, y1) <= top + height
    )


def outside_the_content(screen: Screen, target: UIElement) -> bool:
    """Whether the target lies outside the union of the elements that carry content (the old viewBox)."""
    content = [e.bounds for e in screen.elements if e.area > 0 and (e.text or e.value or e.clickable or e.editable)]
    if not content:
        return True
    x0, y0, x1, y1 = target.bounds
    return (
        x0 < min(b[0] for b in content)
        or y0 < min(b[1] for b in content)
        or x1 > max(b[2] for b in content)
        or y1 > max(b[3] for b in content)
    )


@pytest.fixture(scope="module")
def demo_warehouse(small_demos, tmp_path_factory) -> Warehouse:
    warehouse = Warehouse(tmp_path_factory.mktemp("render") / "stepwise")
    import_demonstrations(small_demos, warehouse, workers=1)
    return warehouse


def test_every_click_and_input_target_of_the_demonstrations_is_inside_the_viewbox(demo_warehouse):
    keys = {
        (r["episode_id"], r["step_idx"])
        for r in demo_warehouse.query(
            "SELECT episode_id, step_idx FROM steps WHERE action_type IN ('CLICK', 'INPUT') AND target_ref IS NOT NULL"
        ).to_pylist()
    }
    views = read_step_views(demo_warehouse, keys, None)  # as the push reads them
    assert len(views) == len(keys) > 80
    targets = {key: view.screen.by_ref(view.target_ref) for key, view in views.items()}
    assert all(t is not None and known_bounds(t) for t in targets.values())
    # the screens include the case that used to fall outside: a target beside everything that carries content
    assert any(outside_the_content(views[key].screen, t) for key, t in targets.items())
    outside = [
        key for key, view in views.items() if not target_inside(screen_html(view.screen, view.target_ref), targets[key])
    ]
    assert not outside, f"{len(outside)} of {len(views)} targets outside the wireframe, e.g. {outside[:3]}"


def test_e_mail_icons_are_drawn_inside_the_viewbox(demos_dir):
    files = sorted((demos_dir / "2017-10-26_third-turk" / "email-inbox-nl-turk").glob("*.json.gz"))[:12]
    files += sorted((demos_dir / "2017-09-29_first-turk" / "email-inbox").glob("*.json.gz"))[:6]
    assert files
    checked = icons = 0
    for path in files:
        episode = recording_to_episode(parse_recording_json(read_recording_bytes(path)[0]), path.parent.name)
        for step in episode.steps:
            target = step.action.target
            if step.action.type.value not in ("CLICK", "INPUT") or target is None:
                continue
            svg = screen_boxes_svg(step.screen, target.ref)
            assert target_inside(svg, step.screen.by_ref(target.ref) or target), (path.name, target)
            checked += 1
            icons += outside_the_content(step.screen, target)
    assert checked > 50 and icons > 0  # reply / forward / star / trash icons, the targets that were cut off


def test_targets_of_zero_or_unknown_size_and_targets_beside_the_content():
    body = UIElement(ref="1", role="body", bounds=(0, 0, 780, 210))
    text = UIElement(ref="2", role="div", text="Reply to Kim", bounds=(2, 80, 158, 100), depth=1)
    icon = UIElement(ref="3", role="span", element_id="reply", bounds=(141, 55, 155, 69), depth=1)  # no text, above
    point = UIElement(ref="4", role="span", bounds=(170, 150, 170, 150), depth=1)  # a point
    line = UIElement(ref="5", role="span", bounds=(10, 120, 10, 140), depth=1)  # zero width
    unknown = UIElement(ref="6", role="span", element_id="lost", depth=1)  # bounds never recorded
    screen = Screen((body, text, icon, point, line, unknown))
    for target in (icon, point, line):
        svg = screen_boxes_svg(screen, target.ref)
        assert target_inside(svg, target), (target, svg)
        x, y, w, h = map(float, TARGET_RECT.search(svg).groups())
        assert w >= 6 and h >= 6  # a point or a line is drawn as a visible square
    assert 'class="t"' not in screen_boxes_svg(screen, None)
    unplaced = screen_boxes_svg(screen, "6")
    assert 'class="t"' not in unplaced and "no recorded position" in unplaced and "<svg" in unplaced
    html = screen_html(screen, "6")
    assert '<li class="d1 t">' in html  # the list still marks it
    lonely = Screen((UIElement(ref="1", role="span", depth=0),))
    assert "no recorded position" in screen_boxes_svg(lonely, "1") and "<svg" not in screen_boxes_svg(lonely, "1")
    assert screen_boxes_svg(Screen(()), None) == ""
    nan = UIElement(ref="7", role="span", bounds=(float("nan"), 0, 10, 10))
    assert not known_bounds(nan) and not known_bounds(unknown) and known_bounds(point)
    view = StepView("e", 0, "t", "Reply", screen, "CLICK", "CLICK(span#reply)", target_ref="3")
    assert target_inside(screen_html(view.screen, view.target_ref), icon)
