"""Task specs: loading, validation with clear errors, milestone evaluation on screens and actions."""

import math

import pytest

from envs.spec_evaluation import evaluate, track_milestones
from envs.tasks import (
    TaskSpecError,
    load_task_spec,
    load_task_specs,
    task_spec_from_mapping,
)
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.storage import REPO_ROOT

SPECS_DIR = REPO_ROOT / "envs" / "task_specs"


def screen(*elements):
    root = UIElement(ref="0", role="body", bounds=(0, 0, 160, 210))
    return Screen((root, *elements))


def field(ref, element_id, value, role="textbox"):
    return UIElement(
        ref=ref, role=role, element_id=element_id, value=value, editable=True, bounds=(5, 60, 120, 80), depth=1
    )


LOGIN = {
    "task_id": "login-user",
    "instruction": 'Enter the username "(?P<username>[^"]*)" and the password "(?P<password>[^"]*)"',
    "milestones": [
        {"name": "user", "when": {"field_value": {"element": {"element_id": "username"}, "equals": "{username}"}}},
        {"name": "pass", "when": {"field_value": {"element": {"element_id": "password"}, "equals": "{password}"}}},
        {"name": "login", "when": {"clicked": {"element_id": "subbtn"}}},
    ],
}


def test_shipped_specs_load_and_cover_the_demo_tasks():
    specs = load_task_specs(SPECS_DIR / "miniwob")
    assert len(specs) >= 8
    assert {
        "login-user",
        "enter-password",
        "click-tab-2-hard",
        "social-media",
        "email-inbox-nl-turk",
        "click-checkboxes-soft",
        "search-engine",
        "navigate-tree",
        "book-flight-nodelay",
    } <= set(specs)
    assert {s.extra.get("tuning") for s in specs.values()} >= {"dev", "held_out"}


def test_milestones_in_order_with_slots():
    spec = task_spec_from_mapping(LOGIN)
    instruction = 'Enter the username "Vanda" and the password "x1" into the text fields and press login.'
    s0 = screen(field("1", "username", ""), field("2", "password", ""))
    s1 = screen(field("1", "username", "vanda"), field("2", "password", ""))  # case-insensitive
    s2 = screen(field("1", "username", "vanda"), field("2", "password", "x1"))
    button = UIElement(ref="3", role="button", element_id="subbtn", text="Login")
    track = track_milestones(
        spec,
        instruction,
        [
            (s0, Action(ActionType.CLICK, target=s0.elements[1])),
            (s1, Action(ActionType.INPUT, s1.elements[1], "vanda")),
            (s2, Action(ActionType.INPUT, s2.elements[2], "x1")),
            (s2, Action(ActionType.CLICK, target=button)),
        ],
    )
    assert track.hits == ((), ("user",), ("pass",), ("login",)) and track.reached == 3 and track.key_steps == (1, 2, 3)
    # Out of order: the password alone does not count until the username is there.
    early = track_milestones(
        spec, instruction, [(screen(field("1", "username", ""), field("2", "password", "x1")), None)]
    )
    assert early.reached == 0


def test_visible_means_in_view_and_fields_come_from_the_recording():
    spec = task_spec_from_mapping(
        {
            "task_id": "email",
            "fields": ["by"],
            "milestones": [{"name": "seen", "when": {"visible": {"text": "{by}"}}}],
        }
    )
    off_screen = screen(UIElement(ref="1", role="div", text="Helen", bounds=(0, 300, 100, 320)))
    on_screen = screen(UIElement(ref="1", role="div", text="Helen", bounds=(0, 100, 100, 120)))
    assert track_milestones(spec, "delete Helen's mail", [(off_screen, None)], fields={"by": "Helen"}).reached == 0
    assert track_milestones(spec, "delete Helen's mail", [(on_screen, None)], fields={"by": "Helen"}).reached == 1


def test_combinators_and_episode_success():
    pred = {"all": [{"clicked": {"classes_contains": "like"}}, {"episode_success": True}]}
    like = Action(ActionType.CLICK, target=UIElement(ref="1", role="span", classes="like"))
    assert evaluate(pred, {}, screen(), like, success=True)
    assert not evaluate(pred, {}, screen(), like, success=False)
    assert evaluate({"not": {"visible": {"text": "x"}}}, {}, screen(), None)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.pop("milestones"), "'milestones' must be a non-empty list"),
        (lambda s: s["milestones"][0].update(when={"glows": {}}), "unknown predicate 'glows'"),
        (lambda s: s["milestones"][0].update(when={"visible": {"colour": "red"}}), "unknown selector key 'colour'"),
        (lambda s: s["milestones"][0].update(when={"visible": {"text": "{nope}"}}), "slot {nope}"),
        (lambda s: s["milestones"][0].update(when={"visible": {"text": math.nan}}), "not a finite number"),
        (lambda s: s["milestones"][1].update(name="user"), "duplicate milestone name"),
        (lambda s: s.update(instruction="(unclosed"), "not a valid regular expression"),
    ],
)
def test_invalid_specs_name_the_task_and_field(mutate, message):
    import copy

    raw = copy.deepcopy(LOGIN)
    mutate(raw)
    with pytest.raises(TaskSpecError, match=message.replace("{", r"\{").replace("}", r"\}")) as info:
        task_spec_from_mapping(raw, source="specs/login-user.yaml")
    assert "specs/login-user.yaml" in str(info.value)


def test_bad_yaml_file_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task_id: [unclosed")
    with pytest.raises(TaskSpecError, match="bad.yaml: invalid YAML"):
        load_task_spec(bad)


def test_instruction_that_does_not_fit_is_an_error():
    spec = task_spec_from_mapping(LOGIN)
    with pytest.raises(TaskSpecError, match="does not fit"):
        track_milestones(spec, "Click the red button", [])
