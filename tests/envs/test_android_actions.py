"""envs/android/actions.py on its own: canonical actions -> uiautomator2 calls, without a device."""

import pytest

from envs.android.actions import KEY_NAMES, DeviceCall, centre, scroll_region, swipe_for, to_device_calls
from envs.protocol import InvalidAction
from warehouse.model import Action, ActionType, Screen, UIElement

FIELD = UIElement(ref="0.1", role="textbox", text="", element_id="user", bounds=(0, 100, 200, 140), editable=True)
BUTTON = UIElement(ref="0.2", role="button", text="OK", bounds=(10, 200, 90, 240), clickable=True)
LIST = UIElement(ref="0.3", role="list", bounds=(0, 300, 400, 900))
SCREEN = Screen((FIELD, BUTTON, LIST))
WINDOW = (1080, 2400)


def test_centre_is_the_middle_of_the_bounds_in_whole_pixels():
    assert centre(BUTTON) == (50, 220)
    assert centre(UIElement(ref="x", role="button", bounds=(0, 0, 3, 3))) == (1, 1)


def test_scroll_region_prefers_target_then_largest_scrollable_then_window():
    assert scroll_region(SCREEN, BUTTON, WINDOW) == BUTTON.bounds
    assert scroll_region(SCREEN, None, WINDOW) == LIST.bounds
    assert scroll_region(Screen((FIELD,)), None, WINDOW) == (0.0, 0.0, 1080.0, 2400.0)


@pytest.mark.parametrize(
    ("direction", "moves"),
    [("DOWN", (0, -1)), ("UP", (0, 1)), ("RIGHT", (-1, 0)), ("LEFT", (1, 0))],
)
def test_swipes_drag_the_content_against_the_scroll_direction(direction, moves):
    x0, y0, x1, y1 = swipe_for(direction, (0, 0, 1000, 1000))
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    assert (sign(x1 - x0), sign(y1 - y0)) == moves
    with pytest.raises(InvalidAction, match="unknown scroll direction"):
        swipe_for("DIAGONAL", (0, 0, 10, 10))


def test_each_action_type_maps_to_its_calls():
    click = to_device_calls(Action(ActionType.CLICK, target=BUTTON), SCREEN, WINDOW)
    assert click == [DeviceCall("click", (50, 220))]
    typed = to_device_calls(Action(ActionType.INPUT, target=FIELD, text="ada"), SCREEN, WINDOW)
    assert [c.name for c in typed] == ["click", "send_keys"] and typed[1].args == ("ada",)
    assert to_device_calls(Action(ActionType.GOBACK), SCREEN, WINDOW) == [DeviceCall("press", ("back",))]
    keys = to_device_calls(Action(ActionType.PRESS_KEY, text="Enter Tab"), SCREEN, WINDOW)
    assert [c.args[0] for c in keys] == [KEY_NAMES["enter"], KEY_NAMES["tab"]]
    assert to_device_calls(Action(ActionType.NOTHING), SCREEN, WINDOW) == []
    (swipe,) = to_device_calls(Action(ActionType.SCROLL, direction="DOWN"), SCREEN, WINDOW)
    assert swipe.name == "swipe" and 300 <= swipe.args[1] <= 900


def test_impossible_actions_are_refused_with_the_reason():
    with pytest.raises(InvalidAction, match="non-editable"):
        to_device_calls(Action(ActionType.INPUT, target=BUTTON, text="x"), SCREEN, WINDOW)
    with pytest.raises(InvalidAction, match="no Android key event"):
        to_device_calls(Action(ActionType.PRESS_KEY, text="Hyper"), SCREEN, WINDOW)
    with pytest.raises(InvalidAction, match="not on the screen"):
        gone = UIElement(ref="9.9", role="button", text="Gone")
        to_device_calls(Action(ActionType.CLICK, target=gone), SCREEN, WINDOW)


def test_a_device_call_applies_itself_to_any_object_with_the_method():
    calls = []

    class FakeDevice:
        def send_keys(self, text, clear=False):
            calls.append((text, clear))

    DeviceCall("send_keys", ("hi",), (("clear", True),)).apply(FakeDevice())
    assert calls == [("hi", True)]
