"""Raw MiniWoB++ event streams -> agent-level steps, on hand-made and real recordings."""

from pathlib import Path

import pytest

from envs.miniwob.dom import colour_name, dom_to_screen
from envs.miniwob.recordings import (
    RecordingError,
    events_to_steps,
    parse_action_literal,
    parse_recording_json,
    read_recording_bytes,
    recording_to_episode,
)
from envs.task_catalog import load_catalog
from warehouse.model import ActionType


def node(tag, ref, left, top, width, height, children=(), **extra):
    return {
        "tag": tag,
        "ref": ref,
        "left": left,
        "top": top,
        "width": width,
        "height": height,
        "id": extra.pop("id", ""),
        "classes": "",
        "children": list(children),
        **extra,
    }


def login_dom(username_value="", focused=None):
    return node(
        "BODY",
        1,
        0,
        0,
        160,
        210,
        [
            node(
                "DIV",
                2,
                0,
                0,
                160,
                210,
                [
                    node(
                        "INPUT_text",
                        3,
                        5,
                        80,
                        120,
                        20,
                        id="username",
                        value=username_value,
                        text="",
                        focused=focused == 3,
                    ),
                    node(
                        "LABEL",
                        4,
                        5,
                        110,
                        80,
                        15,
                        [
                            node("INPUT_checkbox", 5, 6, 110, 12, 12, value=False),
                            node("t", -1, 20, 110, 40, 12, text="remember"),
                        ],
                    ),
                    node("BUTTON", 6, 5, 170, 80, 30, id="subbtn", text="Login"),
                ],
                id="wrap",
            ),
        ],
        focused=focused is None,
    )


def event(time, action, dom):
    return {"time": str(time), "action": action, "dom": dom}


def twice(time, kind, dom_before, dom_after=None, **params):
    """A raw event as recorded: once before the page handled it (timing 1), once after (timing 3)."""
    body = ", ".join(f"'{k}': {v!r}" for k, v in params.items())
    sep = ", " if body else ""
    return [
        event(time, f"{{'type': '{kind}'{sep}{body}, 'timing': 1}}", dom_before),
        event(time, f"{{'type': '{kind}'{sep}{body}, 'timing': 3}}", dom_after or dom_before),
    ]


def test_dom_to_screen_folds_text_nodes_and_reads_flags():
    screen = dom_to_screen(login_dom("ab", focused=3))
    roles = [e.role for e in screen.elements]
    assert roles == ["body", "div", "textbox", "label", "checkbox", "button"]
    label = screen.elements[3]
    assert label.text == "remember"  # the text node became the label's text
    textbox = screen.by_ref("3")
    assert textbox.editable and textbox.focused and textbox.value == "ab"
    assert screen.by_ref("5").checked is False
    assert screen.element_at(10, 85).ref == "3"
    assert screen.element_at(500, 500) is None


def test_dom_missing_geometry_is_a_clear_error():
    with pytest.raises(ValueError, match="missing field 'width'"):
        dom_to_screen({"tag": "BODY", "ref": 1, "left": 0, "top": 0, "height": 3})


def test_click_then_typing_becomes_click_and_one_input():
    blank, focused = login_dom(), login_dom(focused=3)
    typed = [login_dom("r", 3), login_dom("re", 3), login_dom("rex", 3)]
    states = [event(0, None, blank)]
    states += twice(100, "mousedown", blank, focused, x=10, y=85)
    states += twice(150, "mouseup", focused, x=10, y=85)
    states += twice(151, "click", focused, x=10, y=85)
    before = focused
    for t, (char, after) in enumerate(zip("rex", typed, strict=False)):
        states += twice(300 + t * 50, "keydown", before, before, keyCode=ord(char.upper()), charCode=0)
        states += twice(301 + t * 50, "keypress", before, after, keyCode=ord(char), charCode=ord(char))
        states += twice(302 + t * 50, "keyup", after, after, keyCode=ord(char.upper()), charCode=0)
        before = after
    states += twice(900, "mousedown", before, x=20, y=180)
    states += twice(950, "mouseup", before, x=20, y=180)
    states += twice(951, "click", before, x=20, y=180)
    steps, problems = events_to_steps(states)
    assert problems == []
    assert [s.action.canonical_text() for s in steps] == [
        "CLICK(textbox#username)",
        'INPUT(textbox#username, "rex")',
        'CLICK(button#subbtn "Login")',
    ]
    assert steps[1].screen.by_ref("3").value == ""  # the screen is the one before the action
    assert steps[0].time_ms == 100 and steps[2].raw_event_first == states.index(states[-6])


def test_key_run_without_value_change_is_press_key_and_enter_is_separate():
    focused = login_dom("rex", 3)
    states = [event(0, None, focused)]
    states += twice(10, "keydown", focused, keyCode=91, charCode=0)
    states += twice(20, "keydown", focused, keyCode=67, charCode=0)  # Meta+C: copy, no change
    steps, _ = events_to_steps(states)
    assert [(s.action.type, s.action.text) for s in steps] == [(ActionType.PRESS_KEY, "Meta+C")]

    after = login_dom("rexa", 3)
    states = [event(0, None, focused)]
    states += twice(10, "keydown", focused, after, keyCode=65, charCode=0)
    states += twice(20, "keydown", after, after, keyCode=13, charCode=0)
    steps, _ = events_to_steps(states)
    assert [s.action.canonical_text() for s in steps] == [
        'INPUT(textbox#username, "rexa")',
        'PRESS_KEY(textbox#username, "Enter")',
    ]


def test_click_on_nothing_is_kept_as_unknown_with_the_event_index():
    dom = login_dom()
    states = [event(0, None, dom)] + twice(5, "mousedown", dom, x=400, y=400) + twice(6, "mouseup", dom, x=400, y=400)
    steps, problems = events_to_steps(states)
    assert [s.action.type for s in steps] == [ActionType.UNKNOWN]
    assert problems[0].event_index == 1 and "no element" in problems[0].reason


def test_unknown_event_type_is_reported_not_dropped():
    dom = login_dom()
    states = [event(0, None, dom)] + twice(5, "contextmenu", dom, x=10, y=85)
    steps, problems = events_to_steps(states)
    assert steps[0].action.type is ActionType.UNKNOWN
    assert problems[0].event_index == 1 and "unknown event type 'contextmenu'" in problems[0].reason


def test_scroll_direction_is_read_from_content_movement():
    top = node("BODY", 1, 0, 0, 160, 210, [node("DIV", 2, 0, 50, 160, 400, [node("SPAN", 3, 0, 60, 50, 10, text="a")])])
    scrolled = node(
        "BODY", 1, 0, 0, 160, 210, [node("DIV", 2, 0, -30, 160, 400, [node("SPAN", 3, 0, -20, 50, 10, text="a")])]
    )
    states = [event(0, None, top)] + twice(5, "scroll", top, scrolled) + twice(6, "scroll", scrolled, scrolled)
    steps, _ = events_to_steps(states)
    assert [s.action.canonical_text() for s in steps] == ["SCROLL(DOWN)"]


def test_action_literals_parse_fast_and_slow_paths():
    assert parse_action_literal("{'type': 'click', 'x': 3, 'y': 4, 'timing': 1}")["x"] == 3
    assert parse_action_literal("{'type': 'keypress', 'key': \"'\", 'timing': 1}")["key"] == "'"
    with pytest.raises((ValueError, SyntaxError)):
        parse_action_literal("{'no type': 1}")


def test_bad_files_raise_recording_errors(tmp_path):
    corrupt = tmp_path / "a.json.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(RecordingError, match="corrupted gzip"):
        read_recording_bytes(corrupt)
    with pytest.raises(RecordingError, match="malformed JSON at line 1"):
        parse_recording_json(b'{"utterance": "x", ')
    with pytest.raises(RecordingError, match="missing field 'rawReward'"):
        parse_recording_json(b'{"utterance": "x", "states": [1]}')
    with pytest.raises(RecordingError, match="no states"):
        parse_recording_json(b'{"utterance": "x", "states": [], "rawReward": 1}')
    dangling = tmp_path / "b.json.gz"
    dangling.write_text("../missing/file.json.gz")
    with pytest.raises(RecordingError, match="missing file"):
        read_recording_bytes(dangling)


def test_real_login_demo(demos_dir: Path):
    path = sorted((demos_dir / "2017-10-16_second-turk" / "login-user").glob("*.json.gz"))[0]
    data, link = read_recording_bytes(path)
    episode = recording_to_episode(parse_recording_json(data), "login-user")
    assert link is None and episode.success
    texts = [s.action.canonical_text() for s in episode.steps]
    # The user typed the username and the password the instruction names, then clicked Login.
    inputs = [s.action.text for s in episode.steps if s.action.type is ActionType.INPUT]
    username = episode.instruction.split('"')[1]
    password = episode.instruction.split('"')[3]
    assert username in inputs and password in inputs
    assert texts[-1] == 'CLICK(button#subbtn "Login")'


def test_label_click_echo_is_one_step():
    """Clicking a <label> makes the browser click its checkbox too, at the same point: one action."""
    dom = login_dom()
    states = [event(0, None, dom)]
    states += twice(100, "mousedown", dom, x=30, y=115)
    states += twice(180, "mouseup", dom, x=30, y=115)
    states += twice(180, "click", dom, x=30, y=115)
    states += twice(190, "click", dom, x=30, y=115)  # the echo on the checkbox
    states += twice(900, "mousedown", dom, x=30, y=115)
    states += twice(950, "mouseup", dom, x=30, y=115)
    states += twice(951, "click", dom, x=30, y=115)
    steps, _ = events_to_steps(states)
    assert [s.action.canonical_text() for s in steps] == ['CLICK(label "remember")'] * 2
    assert [s.time_ms for s in steps] == [100, 900]


@pytest.mark.parametrize(
    ("css", "name"),
    [
        ("rgb(35, 138, 35)", "green"),  # click-shades' recorded squares, hsl(120 / 0 / 240, 30-90%, 30-90%)
        ("rgb(206, 206, 248)", "blue"),
        ("rgb(238, 114, 114)", "red"),
        ("rgb(147, 77, 77)", "red"),
        ("rgba(255, 165, 0, 1)", "orange"),
        ("rgb(255, 255, 0)", "yellow"),
        ("rgb(0, 200, 200)", "cyan"),
        ("rgb(128, 0, 128)", "purple"),
        ("rgb(255, 105, 180)", "pink"),
        ("rgb(250, 5, 40)", "red"),  # hue 352: red wraps past 345
        ("rgb(221, 221, 221)", ""),  # a grey button
        ("rgb(85, 85, 85)", ""),
        ("rgb(250, 245, 245)", ""),  # near white, however tinted
        ("rgb(10, 0, 0)", ""),  # near black
        ("rgba(0, 0, 0, 0)", ""),  # transparent
        ("rgba(0, 128, 0, 0.5)", ""),  # not opaque: what shows depends on what is behind
        ("", ""),
        (None, ""),
        ("green", ""),  # a name, not what a computed style gives
        ("rgb(1, 2)", ""),
        ("rgb(a, b, c)", ""),
    ],
)
def test_colour_name_names_saturated_opaque_colours_by_hue(css, name):
    assert colour_name(css) == name


def test_a_text_less_leaf_is_described_by_its_background_colour():
    root = {
        "tag": "DIV",
        "ref": 1,
        "left": 0,
        "top": 0,
        "width": 160,
        "height": 210,
        "bgColor": "rgb(0, 128, 0)",  # has children: not a swatch
        "children": [
            {"tag": "SPAN", "ref": 2, "left": 0, "top": 0, "width": 12, "height": 12, "bgColor": "rgb(35, 138, 35)"},
            {
                "tag": "SPAN",
                "ref": 3,
                "left": 0,
                "top": 0,
                "width": 12,
                "height": 12,
                "bgColor": "rgb(15, 15, 183)",
                "text": "Go",
            },  # has text: the text describes it
            {
                "tag": "BUTTON",
                "ref": 4,
                "left": 0,
                "top": 0,
                "width": 12,
                "height": 12,
                "bgColor": "rgb(221, 221, 221)",
            },
            {"tag": "SPAN", "ref": 5, "left": 0, "top": 0, "width": 12, "height": 12},  # no colour recorded
        ],
    }
    screen = dom_to_screen(root)
    assert [(e.ref, e.description) for e in screen.elements] == [
        ("1", ""),
        ("2", "green"),
        ("3", ""),
        ("4", ""),
        ("5", ""),
    ]


def test_a_recording_gets_the_fields_a_live_episode_of_its_task_gets(demos_dir: Path):
    """The recordings of most tasks carry no fields; a live episode gets miniwob's (click-tab-2:
    ``target``, the link). Without them the policy read the same instruction as "<link>" in SFT's
    demonstrations and as "<target>" live. A recording that states its fields keeps them."""

    def first(batch, task):
        data, _ = read_recording_bytes(sorted((demos_dir / batch / task).glob("*.json.gz"))[0])
        return recording_to_episode(parse_recording_json(data), task)

    tab = first("2017-10-16_second-turk", "click-tab-2")
    link = tab.instruction.split('"')[1]
    assert tab.fields == {"target": link}
    spec = load_catalog("miniwob")["click-tab-2"].spec
    live = {"target": link}  # what envs.miniwob.live records for this instance
    assert (
        spec.slots(tab.instruction, tab.fields) == spec.slots(tab.instruction, live) == {"target": link, "link": link}
    )
    forward = first("2017-10-16_second-turk", "email-inbox-forward-nl")
    assert set(forward.fields or {}) == {"by", "to"}  # stated by the page, as recorded
    assert spec.slots("x", {"b": "1", "a": "2"}) is not None and list(spec.slots("x", {"b": "1", "a": "2"})) == [
        "a",
        "b",
    ]
