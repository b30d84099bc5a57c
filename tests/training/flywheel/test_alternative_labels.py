"""Labels of candidates from the recording, where no replay reproduces a state (issue 42 item 2):
which field a typed value belongs to, what the recorded action's continuation shows, and the
verdict each combination earns, as the reward models read it."""

from __future__ import annotations

import pytest

from tests.training.flywheel.test_alternatives import SLOTS, el, login_screen
from training.flywheel.alternative_labels import element_field, field_match, recorded_continuation, typed_field
from training.reward_models.examples import AlternativeLabel
from training.reward_models.labels import recording_verdict
from warehouse.model import Action, ActionType, UIElement
from warehouse.tables_training import LABELLED_BY_RECORDING


def _typed(element_id: str, text: str) -> Action:
    screen = login_screen(focused=element_id)
    return Action(ActionType.INPUT, el(screen, element_id), text=text)


def test_a_fields_value_typed_into_another_fields_box_is_told_apart_from_the_right_box():
    assert field_match(_typed("username", "ada"), SLOTS) is True
    assert field_match(_typed("password", "x1"), SLOTS) is True
    assert field_match(_typed("username", "x1"), SLOTS) is False  # the password in the username box
    assert field_match(_typed("password", "ada"), SLOTS) is False
    assert field_match(_typed("username", "someone else"), SLOTS) is None  # no field's value: cannot tell
    assert field_match(Action(ActionType.CLICK, el(login_screen(), "username")), SLOTS) is None
    assert typed_field(_typed("username", "  ada "), SLOTS) == "username"  # surrounding spaces ignored


def test_a_box_belongs_to_the_one_field_its_id_or_description_names_and_nested_names_resolve_to_the_longer():
    fields = {"name": "Ada", "username": "ada", "password": "x1"}
    assert element_field(UIElement(ref="1", role="textbox", element_id="username"), fields) == "username"
    assert element_field(UIElement(ref="2", role="textbox", element_id="name"), fields) == "name"
    assert element_field(UIElement(ref="3", role="textbox", description="Your Password"), fields) == "password"
    assert element_field(UIElement(ref="4", role="textbox", element_id="tt"), fields) is None
    assert element_field(UIElement(ref="5", role="textbox", element_id="name-password"), fields) is None  # two fit
    assert element_field(None, fields) is None
    same_value = {"first": "ada", "second": "ada"}  # a value two fields share names no field
    assert (
        typed_field(
            Action(ActionType.INPUT, UIElement(ref="6", role="textbox", element_id="first"), text="ada"), same_value
        )
        is None
    )


@pytest.mark.parametrize(
    ("success", "step_idx", "n_steps", "expected"),
    [
        (True, 4, 5, (True, True, 1.0)),  # the last step, and the episode succeeded there
        (False, 2, 3, (True, False, 0.0)),  # the last step of a failed episode
        (True, 1, 5, (False, False, 1.0)),  # the episode went on and succeeded
        (False, 0, 5, (False, False, 0.0)),
    ],
)
def test_the_recorded_action_is_valued_by_how_its_own_episode_went_on(success, step_idx, n_steps, expected):
    assert recorded_continuation(success, step_idx, n_steps) == expected


def test_the_verdict_takes_the_strongest_evidence_first():
    def verdict(**kw):
        args = {"is_recorded": False, "matches_plan": None, "field_match": None, "mc_value": None} | kw
        return recording_verdict(**args)

    assert verdict(field_match=False, matches_plan=True) == "negative"  # the wrong box, whatever the plan says
    assert verdict(matches_plan=True, is_recorded=True, mc_value=0.0) == "positive"  # the plan's step
    assert verdict(is_recorded=True, matches_plan=False, mc_value=1.0) == "positive"  # it went on to succeed
    assert verdict(is_recorded=True, mc_value=0.0) == "negative"
    assert verdict(matches_plan=False) == "negative"  # the plan wanted something else here
    assert verdict() == "unsure"  # no plan, not recorded, no field: nothing to go on (filtered)
    assert verdict(field_match=True) == "unsure"


def test_reward_models_read_a_recording_row_by_its_own_rule_and_a_replayed_row_by_its_replays():
    base = {"alternative_id": "s:1", "state_id": "s", "episode_id": "e", "step_idx": 1, "description": "d"}
    recorded = AlternativeLabel(**base, mc_value=None, labelled_by=LABELLED_BY_RECORDING, matches_plan=False)
    assert (recorded.verdict(), recorded.reward()) == ("negative", 0.0)
    unsure = AlternativeLabel(**base, mc_value=None, labelled_by=LABELLED_BY_RECORDING)
    assert (unsure.verdict(), unsure.reward()) == ("unsure", None)
    # the same facts on a replayed row: no continuation and no milestone, so the replays cannot tell
    replayed = AlternativeLabel(**base, mc_value=None, matches_plan=False)
    assert (replayed.verdict(), replayed.reward()) == ("unsure", None)
    assert AlternativeLabel(**base, mc_value=0.5).reward() == 0.5
