"""The milestone language's structural parts: ``labelled`` and ``within`` selectors, ``count`` over
a list slot, their load-time validation (errors name the file and field), and what an unfilled slot
does. Screens here are built the way ``envs.miniwob.dom`` builds them (document order, depth),
after real MiniWoB++ pages (click-checkboxes, login-user, social-media)."""

from __future__ import annotations

import copy

import pytest

from envs.spec_evaluation import (
    ScreenTree,
    element_matches,
    evaluate,
    list_items,
    synonym_alternatives,
    track_milestones,
)
from envs.tasks import TaskSpecError, task_spec_from_mapping
from warehouse.model import Action, ActionType, Screen, UIElement


def el(ref, role, depth, text="", *, element_id="", classes="", checked=None, value=None, bounds=(0, 0, 50, 10)):
    return UIElement(
        ref=str(ref),
        role=role,
        text=text,
        element_id=element_id,
        classes=classes,
        checked=checked,
        value=value,
        editable=role in ("textbox", "password"),
        bounds=bounds,
        depth=depth,
    )


def boxes(ticked=()):
    """click-checkboxes: <div id=boxes><label><input type=checkbox id=chN> word</label>...</div>."""
    words = ["ex", "qERtfw0", "jwynIC", "0YECb"]
    elements = [el(9, "body", 0, bounds=(0, 0, 160, 210)), el(12, "div", 1, element_id="boxes")]
    for i, word in enumerate(words):
        elements += [
            el(2 * i + 1, "label", 2, word),
            el(2 * i + 2, "checkbox", 3, element_id=f"ch{i}", checked=word in ticked),
        ]
    elements.append(el(21, "button", 1, "Submit", element_id="subbtn"))
    return Screen(tuple(elements))


def login_form():
    """login-user: <label>Username</label><input id=username> <label>Password</label><input id=password>."""
    return Screen(
        (
            el(1, "body", 0, bounds=(0, 0, 160, 210)),
            el(2, "div", 1, element_id="form"),
            el(3, "label", 2, "Username"),
            el(4, "textbox", 2, element_id="username", value="vanda"),
            el(5, "label", 2, "Password"),
            el(6, "password", 2, element_id="password", value=""),
            el(7, "button", 2, "Login", element_id="subbtn"),
        )
    )


def posts(open_menu_of=None):
    """social-media: div.media > (div.details > span.username) (div.controls > span.retweet, span > ul > li)."""
    elements = [el(1, "body", 0, bounds=(0, 0, 160, 210)), el(2, "div", 1, element_id="area")]
    for k, user in enumerate(["@vel", "@keli", "@vel"]):
        base = 100 * (k + 1)
        elements += [
            el(base, "div", 2, classes="media"),
            el(base + 1, "div", 3, classes="details"),
            el(base + 2, "span", 4, user, classes="username"),
            el(base + 3, "div", 3, "post body", classes="body"),
            el(base + 4, "div", 3, classes="controls"),
            el(base + 5, "span", 4, classes="retweet"),
            el(base + 6, "span", 4),
            el(base + 7, "span", 5, classes="more"),
        ]
        if open_menu_of == k:
            elements += [
                el(base + 8, "ul", 5),
                el(base + 9, "li", 6, "Share via DM", classes="share"),
                el(base + 10, "li", 6, f"Block {user}", classes="block-user"),
            ]
    return Screen(tuple(elements))


def click(screen, **where):
    target = next(e for e in screen.elements if all(getattr(e, k) == v for k, v in where.items()))
    return Action(ActionType.CLICK, target=target)


# -- labelled --------------------------------------------------------------------------------


def test_labelled_finds_a_checkbox_by_its_wrapping_label():
    screen = boxes(ticked=("jwynIC",))
    assert evaluate({"checked": {"labelled": "jwynic"}}, {}, screen, None)  # case-insensitive
    assert not evaluate({"checked": {"labelled": "ex"}}, {}, screen, None)
    assert evaluate({"unchecked": {"labelled": "ex"}}, {}, screen, None)
    # a click on the word (the label) or on the box itself is a click on the box
    for target in (click(screen, text="jwynIC"), click(screen, element_id="ch2")):
        assert evaluate({"clicked": {"labelled": "{w}"}}, {"w": "jwynIC"}, screen, target)
        assert not evaluate({"clicked": {"labelled": "ex"}}, {}, screen, target)
    # role narrows it to the box
    assert not evaluate(
        {"clicked": {"role": "checkbox", "labelled": "jwynIC"}}, {}, screen, click(screen, text="jwynIC")
    )
    assert evaluate(
        {"clicked": {"role": "checkbox", "labelled": "jwynIC"}}, {}, screen, click(screen, element_id="ch2")
    )


def test_labelled_finds_a_field_by_the_label_before_it():
    screen = login_form()
    assert evaluate({"field_value": {"element": {"labelled": "Username"}, "equals": "vanda"}}, {}, screen, None)
    assert not evaluate({"field_value": {"element": {"labelled": "Password"}, "equals": "vanda"}}, {}, screen, None)
    tree = ScreenTree(screen)
    assert tree.label_of() == {3: 2, 5: 4}  # username <- "Username", password <- "Password"; the button has none
    typed = Action(ActionType.INPUT, target=screen.elements[5], text="x1")
    assert evaluate({"typed": {"element": {"labelled": "password"}, "equals": "x1"}}, {}, screen, typed)


def test_a_label_names_no_field_across_another_label_or_outside_its_container():
    screen = Screen(
        (
            el(1, "body", 0),
            el(2, "div", 1),
            el(3, "label", 2, "Orphan"),  # its container holds no field
            el(4, "div", 1),
            el(5, "label", 2, "First"),
            el(6, "label", 2, "Second"),
            el(7, "textbox", 2, element_id="t"),
        )
    )
    assert ScreenTree(screen).label_of() == {6: 5}
    assert element_matches(screen.elements[6], {"labelled": "Second"}, {}, screen)
    assert not element_matches(screen.elements[6], {"labelled": "First"}, {}, screen)
    assert not element_matches(screen.elements[2], {"labelled": "Orphan"}, {}, screen)  # labels nothing


def test_structural_keys_need_the_screen():
    screen = boxes()
    box = screen.elements[3]
    assert element_matches(box, {"labelled": "ex"}, {}, screen)
    assert not element_matches(box, {"labelled": "ex"}, {})  # no screen: structural keys match nothing
    assert element_matches(box, {"element_id": "ch0"}, {})
    # a clicked element that is gone from the screen after the step matches no structural key
    gone = Action(ActionType.CLICK, target=UIElement(ref="999", role="checkbox", element_id="ch0"))
    assert not evaluate({"clicked": {"labelled": "ex"}}, {}, screen, gone)


def test_structure_comes_from_depth_not_refs_which_may_repeat():
    # A real recorded page: the body and a post's controls div share ref 86.
    screen = Screen(
        (
            el(86, "body", 0, bounds=(0, 0, 160, 210)),
            el(79, "div", 1, classes="media"),
            el(82, "span", 2, "@keli", classes="username"),
            el(86, "div", 2, classes="controls"),
            el(88, "span", 3, classes="retweet"),
        )
    )
    tree = ScreenTree(screen)
    assert tree.parents == (-1, 0, 1, 1, 3) and tree.ends == (5, 5, 3, 5, 5)
    assert (
        tree.locate(screen.elements[3]) == 3 and tree.locate(UIElement(ref="86", role="div", classes="controls")) == 3
    )


# -- within ----------------------------------------------------------------------------------


USER = {"classes_contains": "username", "text": "@{user}"}


def test_within_ties_a_button_to_the_post_of_the_user():
    screen = posts()
    retweet = [e for e in screen.elements if e.classes == "retweet"]
    slots = {"user": "keli"}
    assert [element_matches(e, {"classes_contains": "retweet", "within": USER}, slots, screen) for e in retweet] == [
        False,
        True,
        False,
    ]
    # any post of the user counts (the task checks the author's name): @vel wrote two
    assert [
        element_matches(e, {"classes_contains": "retweet", "within": USER}, {"user": "vel"}, screen) for e in retweet
    ] == [True, False, True]
    pred = {"clicked": {"classes_contains": "retweet", "within": USER}}
    assert evaluate(pred, slots, screen, Action(ActionType.CLICK, target=retweet[1]))
    assert not evaluate(pred, slots, screen, Action(ActionType.CLICK, target=retweet[0]))


def test_within_uses_the_nearest_container_holding_the_kind_not_any_that_holds_a_match():
    # The only open menu is in @vel's post: its items are not within @keli's post, although the
    # page (a container too) holds @keli's username.
    screen = posts(open_menu_of=0)
    assert not evaluate({"visible": {"role": "li", "within": USER}}, {"user": "keli"}, screen, None)
    assert evaluate({"visible": {"role": "li", "within": USER}}, {"user": "vel"}, screen, None)
    share = click(screen, classes="share")
    assert not evaluate({"clicked": {"text_contains": "Share via DM", "within": USER}}, {"user": "keli"}, screen, share)
    assert evaluate({"clicked": {"text_contains": "Share via DM", "within": USER}}, {"user": "vel"}, screen, share)
    # the element itself is the first container: a post "within" the user's username is that post
    media = [e for e in screen.elements if e.classes == "media"]
    assert [
        element_matches(m, {"classes_contains": "media", "within": USER}, {"user": "keli"}, screen) for m in media
    ] == [
        False,
        True,
        False,
    ]


# -- count -----------------------------------------------------------------------------------


def each_ticked(**options):
    return {"count": {"slot": "words", "each": {"checked": {"labelled": "{item}"}}, **options}}


def test_count_all_and_at_least_over_a_list_slot():
    slots = {"words": "qERtfw0, jwynIC, 0YECb"}
    none, one, two, three = (
        boxes(),
        boxes(("jwynIC",)),
        boxes(("jwynIC", "0YECb")),
        boxes(("qERtfw0", "jwynIC", "0YECb")),
    )
    assert [evaluate(each_ticked(), slots, s, None) for s in (none, one, two, three)] == [False, False, False, True]
    assert [evaluate(each_ticked(at_least=1), slots, s, None) for s in (none, one, two, three)] == [
        False,
        True,
        True,
        True,
    ]
    assert [evaluate(each_ticked(at_least=2), slots, s, None) for s in (none, one, two, three)] == [
        False,
        False,
        True,
        True,
    ]
    # strict: a list of three items never has four
    assert not evaluate(each_ticked(at_least=4), slots, three, None)
    # an unfilled list slot is the empty list: "all" of it holds, "at least 1" does not
    assert evaluate(each_ticked(), {}, none, None) and not evaluate(each_ticked(at_least=1), {}, three, None)


def test_list_items_split_on_commas_and_and():
    assert list_items("foo, bar and baz") == ["foo", "bar", "baz"]
    assert list_items("foo, bar, and baz") == ["foo", "bar", "baz"]
    assert list_items("Sandy, Andrew") == ["Sandy", "Andrew"]  # "and" only as a word
    assert list_items("a; b;c", r"\s*;\s*") == ["a", "b", "c"]
    assert list_items(None) == [] and list_items("{words}") == [] and list_items(" , ") == []


def test_count_with_synonyms_finds_the_box_of_a_similar_word():
    groups = [["angry", "mad", "furious"], ["hate", "despise"], ["water"]]
    assert synonym_alternatives(groups, "Mad") == ("Mad", "angry", "furious")
    assert synonym_alternatives(groups, "unknown") == ("unknown",)
    screen = Screen(
        (
            el(0, "body", 0),
            el(1, "label", 1, "furious"),
            el(2, "checkbox", 2, checked=True),
            el(3, "label", 1, "despise"),
            el(4, "checkbox", 2, checked=False),
        )
    )
    pred = each_ticked(synonyms=groups)
    assert evaluate(pred, {"words": "mad"}, screen, None)
    assert not evaluate(pred, {"words": "mad, hate"}, screen, None)
    assert evaluate(each_ticked(synonyms=groups, at_least=1), {"words": "mad, hate"}, screen, None)
    assert not evaluate(each_ticked(), {"words": "mad"}, screen, None)  # without synonyms: the word itself


def test_milestones_with_count_over_a_trajectory():
    spec = task_spec_from_mapping(
        {
            "task_id": "click-checkboxes-transfer",
            "instruction": "Select (?:nothing|(?P<words>[^,]+?(?:, [^,]+?)*)) and click Submit",
            "milestones": [
                {"name": "a box", "when": {"any": [each_ticked(at_least=1), {"episode_success": True}]}},
                {"name": "every box", "when": each_ticked()},
                {"name": "submitted", "when": {"clicked": {"element_id": "subbtn"}}},
            ],
        }
    )
    after = [boxes(("jwynIC",)), boxes(("jwynIC", "ex")), boxes(("jwynIC", "ex"))]
    actions = [click(after[0], element_id="ch2"), click(after[1], text="ex"), click(after[2], element_id="subbtn")]
    track = track_milestones(
        spec, "Select ex, jwynIC and click Submit.", zip(after, actions, strict=True), success=True
    )
    assert track.hits == (("a box",), ("every box",), ("submitted",))
    # "Select nothing": the first milestone waits for the successful submit, then all come at once
    nothing = track_milestones(spec, "Select nothing and click Submit.", [(boxes(), actions[2])], success=True)
    assert nothing.hits == (("a box", "every box", "submitted"),)


# -- unfilled slots ----------------------------------------------------------------------------


def test_an_unfilled_slot_stays_literal_and_matches_nothing():
    spec = task_spec_from_mapping(
        {
            "task_id": "t",
            "instruction": 'Click "(?P<link>[^"]+)"(?: then "(?P<second>[^"]+)")?',
            "milestones": [
                {"name": "second", "when": {"visible": {"text": "{second}"}}},
            ],
        }
    )
    literal = Screen((el(0, "body", 0, bounds=(0, 0, 100, 100)), el(1, "span", 1, "{second}")))
    plain = Screen((el(0, "body", 0, bounds=(0, 0, 100, 100)), el(1, "span", 1, "b")))
    assert spec.slots('Click "a"') == {"link": "a"}  # the optional group did not take part
    assert track_milestones(spec, 'Click "a"', [(plain, None)]).reached == 0
    assert track_milestones(spec, 'Click "a"', [(literal, None)]).reached == 1  # the literal text itself
    assert evaluate({"not": {"visible": {"text": "{second}"}}}, {"link": "a"}, plain, None)  # so `not` holds
    assert track_milestones(spec, 'Click "a" then "b"', [(plain, None)]).reached == 1


# -- validation --------------------------------------------------------------------------------

BASE = {
    "task_id": "click-checkboxes",
    "instruction": "Select (?P<words>.+?) and click Submit",
    "milestones": [
        {"name": "ticked", "when": each_ticked()},
        {"name": "social", "when": {"clicked": {"classes_contains": "retweet", "within": {"classes_contains": "x"}}}},
    ],
}


@pytest.mark.parametrize(
    "mutate, field, message",
    [
        (lambda s: s["milestones"][0]["when"]["count"].pop("each"), "milestones[0].when.count", "needs 'slot'"),
        (lambda s: s["milestones"][0]["when"]["count"].update(slot="nope"), "count.slot", "'nope' is neither"),
        (lambda s: s["milestones"][0]["when"]["count"].update(of=1), "count", "unknown key 'of'"),
        (lambda s: s["milestones"][0]["when"]["count"].update(at_least=0), "count.at_least", "whole number >= 1"),
        (lambda s: s["milestones"][0]["when"]["count"].update(at_least=True), "count.at_least", "whole number"),
        (lambda s: s["milestones"][0]["when"]["count"].update(at_least="most"), "count.at_least", "or 'all'"),
        (lambda s: s["milestones"][0]["when"]["count"].update(split="(,"), "count.split", "not a valid regular"),
        (lambda s: s["milestones"][0]["when"]["count"].update(split=",?"), "count.split", "must not match the empty"),
        (lambda s: s["milestones"][0]["when"]["count"].update(split="x" * 201), "count.split", "MAX_SPLIT_CHARS"),
        (lambda s: s["milestones"][0]["when"]["count"].update(synonyms=["a"]), "count.synonyms", "word groups"),
        (lambda s: s["milestones"][0]["when"]["count"].update(synonyms=[[None]]), "count.synonyms[0][0]", "a word"),
        (
            lambda s: s["milestones"][0]["when"]["count"].update(each={"checked": {"labelled": "{nope}"}}),
            "count.each.checked.labelled",
            "slot {nope}",
        ),
        (lambda s: s["milestones"][1].update(when={"visible": {"text": "{item}"}}), "visible.text", "slot {item}"),
        (
            lambda s: s["milestones"][1]["when"]["clicked"].update(within={"text": "@x"}),
            "clicked.within",
            "needs one of ['role', 'element_id', 'classes_contains']",
        ),
        (lambda s: s["milestones"][1]["when"]["clicked"].update(within="x"), "clicked.within", "non-empty mapping"),
        (lambda s: s["milestones"][1]["when"]["clicked"].update(labelled=None), "clicked.labelled", "string or number"),
    ],
)
def test_invalid_new_forms_name_the_file_and_field(mutate, field, message):
    raw = copy.deepcopy(BASE)
    task_spec_from_mapping(raw)  # the base is valid
    mutate(raw)
    with pytest.raises(TaskSpecError) as info:
        task_spec_from_mapping(raw, source="specs/click-checkboxes.yaml")
    text = str(info.value)
    assert "specs/click-checkboxes.yaml" in text and field in text and message in text, text
    assert len(text.splitlines()) == 1
