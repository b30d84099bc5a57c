"""envs/android/hierarchy.py on its own: uiautomator view-hierarchy XML -> canonical screens."""

import pytest

from envs.android.hierarchy import package_of, parse_bounds, parse_hierarchy, role_of_class

DUMP = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy rotation="0">
  <node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="com.example"
        content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false"
        focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
        bounds="[0,0][1080,2400]">
    <node index="0" text="Name" resource-id="com.example:id/name" class="android.widget.EditText"
          package="com.example" content-desc="" checkable="false" checked="false" clickable="true" enabled="true"
          focusable="true" focused="true" scrollable="false" long-clickable="true" password="false"
          selected="false" bounds="[40,200][1040,320]" />
    <node index="1" text="" resource-id="com.example:id/pin" class="android.widget.EditText" package="com.example"
          content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="true"
          focused="false" scrollable="false" long-clickable="true" password="true" selected="false"
          bounds="[40,340][1040,460]" />
    <node index="2" text="Remember me" resource-id="" class="android.widget.CheckBox" package="com.example"
          content-desc="" checkable="true" checked="true" clickable="true" enabled="true" focusable="true"
          focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
          bounds="[40,480][600,560]" />
  </node>
</hierarchy>"""


def test_bounds_parse_and_malformed_bounds_are_named():
    assert parse_bounds("[0,10][20,30]") == (0.0, 10.0, 20.0, 30.0)
    with pytest.raises(ValueError, match="malformed bounds"):
        parse_bounds("0,10,20,30")


def test_roles_come_from_the_widget_class():
    assert role_of_class("android.widget.EditText") == "textbox"
    assert role_of_class("android.widget.EditText", password=True) == "password"
    assert role_of_class("android.widget.CheckBox") == "checkbox"
    assert role_of_class("android.view.View") == "view"


def test_a_dump_becomes_a_screen_in_document_order_with_flags():
    screen = parse_hierarchy(DUMP, screenshot_path="shot.png")
    assert screen.screenshot_path == "shot.png"
    roles = [e.role for e in screen.elements]
    assert roles[1:] == ["textbox", "password", "checkbox"]
    name, pin, remember = screen.elements[1:]
    assert name.text == "Name" and name.editable and name.focused and name.bounds == (40, 200, 1040, 320)
    assert pin.editable and not pin.focused
    assert remember.checked is True and remember.text == "Remember me"
    assert {e.depth for e in screen.elements[1:]} == {1} and screen.elements[0].depth == 0
    assert package_of(DUMP) == {"com.example"}
