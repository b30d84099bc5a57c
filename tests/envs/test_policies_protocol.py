"""Policies, solutions, milestones and warehouse rows: pure code, no browser."""

import random

import pyarrow as pa
import pytest

from envs.policies import (
    NoisyExpertPolicy,
    RandomWalkPolicy,
    SolutionError,
    clickable_elements,
    expand_solution,
    find_target,
    make_policy,
    typo,
)
from envs.pool_jobs import plan_jobs
from envs.protocol import (
    EpisodeContext,
    EpisodeRecord,
    InvalidAction,
    MilestoneTracker,
    StepRecord,
    episode_tables,
    resolve_target,
)
from envs.spec_evaluation import track_milestones
from envs.task_catalog import MINIWOB_FAMILIES, load_catalog, tasks_of_family
from envs.tasks import TaskSpecError, task_spec_from_mapping
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES, STEPS


def element(ref, role, text="", element_id="", value=None, parent=None, depth=1, top=0.0, **kw):
    return UIElement(
        ref=ref,
        role=role,
        text=text,
        element_id=element_id,
        value=value,
        parent_ref=parent,
        depth=depth,
        bounds=(0.0, top, 100.0, top + 20.0),
        clickable=role in ("button", "label", "textbox"),
        editable=role == "textbox",
        **kw,
    )


LOGIN = task_spec_from_mapping(
    {
        "task_id": "login-like",
        "instruction": 'Log in as "(?P<user>[^"]+)"',
        "milestones": [
            {"name": "user typed", "when": {"field_value": {"element": {"element_id": "u"}, "equals": "{user}"}}},
            {"name": "submitted", "when": {"clicked": {"element_id": "go"}}},
        ],
        "solution": [
            {"action": "CLICK", "target": {"element_id": "u"}},
            {"action": "INPUT", "target": {"element_id": "u"}, "text": "{user}"},
            {"action": "CLICK", "target": {"element_id": "go"}},
        ],
    }
)


def login_screen(value=""):
    return Screen(
        (
            element("1", "body", depth=0),
            element("2", "textbox", element_id="u", value=value, parent="1"),
            element("3", "button", "Go", element_id="go", parent="1", top=30),
        )
    )


def context(spec=LOGIN, instruction='Log in as "ada"', supported=frozenset(ActionType), seed=0):
    return EpisodeContext(spec, instruction, spec.slots(instruction), seed, "test", supported, 10)


def test_tracker_matches_track_milestones_step_by_step():
    screens = [login_screen(""), login_screen("ada"), login_screen("ada")]
    actions = [
        Action(ActionType.CLICK, screens[0].elements[1]),
        Action(ActionType.INPUT, screens[0].elements[1], "ada"),
        Action(ActionType.CLICK, screens[0].elements[2]),
    ]
    tracker = MilestoneTracker(LOGIN, 'Log in as "ada"')
    online = [tracker.update(s, a) for s, a in zip(screens, actions, strict=False)]
    offline = track_milestones(LOGIN, 'Log in as "ada"', list(zip(screens, actions, strict=False)))
    assert tuple(online) == offline.hits == ((), ("user typed",), ("submitted",)) and tracker.complete
    with pytest.raises(TaskSpecError, match="does not fit"):
        MilestoneTracker(LOGIN, "something else")
    fields = MilestoneTracker(task_spec_from_mapping({**LOGIN_RAW_NO_TEMPLATE}), "free text", {"user": "ada"})
    assert fields.slots == {"user": "ada"}


LOGIN_RAW_NO_TEMPLATE = {
    "task_id": "nl",
    "fields": ["user"],
    "milestones": [{"name": "m", "when": {"visible": {"text": "{user}"}}}],
}


def test_resolve_target_needs_the_same_element_on_this_screen():
    screen = login_screen()
    assert resolve_target(screen, screen.elements[1]) is screen.elements[1]
    with pytest.raises(InvalidAction, match="not on the screen"):
        resolve_target(screen, element("99", "button", "Ghost"))
    with pytest.raises(InvalidAction, match="is now"):
        resolve_target(screen, element("3", "textbox", element_id="other"))
    with pytest.raises(InvalidAction, match="needs a target"):
        resolve_target(screen, None)


def test_solution_features_expand_as_documented():
    spec = task_spec_from_mapping(
        {
            "task_id": "features",
            "instruction": "Select (?P<words>[^.]*?) then (?:-(?P<down>\\d+)|(?P<up>\\d+)) "
            "pick (?P<n>\\d)(?:st|nd|rd|th)(?: and (?P<extra>\\w+))?",
            "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}],
            "solution": [
                {"action": "CLICK", "target": {"text": "{item}"}, "for_each": {"slot": "words", "split": ","}},
                {"action": "CLICK", "target": {"text": "down"}, "repeat": "{down}"},
                {"action": "CLICK", "target": {"text": "up"}, "repeat": "{up}"},
                {"action": "CLICK", "target": {"role": "radio"}, "ordinal": "{n}"},
                {"action": "CLICK", "target": {"text": "{extra}"}, "if_slot": "extra"},
                {"action": "CLICK", "target": {"text": "none"}, "unless_slot": "extra"},
            ],
        }
    )
    plan = expand_solution(spec, spec.slots("Select a, b, c then -2 pick 3rd"))
    assert [(s.target.get("text"), s.slots.get("item")) for s in plan[:3]] == [
        ("{item}", "a"),
        ("{item}", "b"),
        ("{item}", "c"),
    ]
    assert [s.target.get("text") for s in plan[3:]] == ["down", "down", None, "none"]
    assert plan[5].nth == 2
    radios = Screen(tuple(element(str(i), "radio", top=i * 20.0) for i in range(4)))
    assert find_target(radios, plan[5]).ref == "2"
    with pytest.raises(SolutionError, match="unknown action"):
        expand_solution(task_spec_from_mapping({**LOGIN_RAW_NO_TEMPLATE, "solution": [{"action": "FLY"}]}), {})


def test_after_picks_the_element_following_its_anchor():
    screen = Screen(
        (element("1", "th", "Director"), element("2", "textbox"), element("3", "th", "Genre"), element("4", "textbox"))
    )
    spec = task_spec_from_mapping(
        {
            **LOGIN_RAW_NO_TEMPLATE,
            "solution": [
                {
                    "action": "INPUT",
                    "target": {"role": "textbox"},
                    "after": {"role": "th", "text": "Genre"},
                    "text": "x",
                }
            ],
        }
    )
    (step,) = expand_solution(spec, {})
    assert find_target(screen, step).ref == "4"


def test_before_with_nth_minus_one_picks_the_element_its_anchor_follows():
    """multi-layouts' layout 5 puts each header after its textbox: the textbox before "Genre" is the
    one right before it, not the first on the page; an absent anchor finds nothing."""
    director, genre = element("2", "div", "Director"), element("4", "div", "Genre")
    screen = Screen((element("1", "textbox"), director, element("3", "textbox"), genre))
    raw_step = {"action": "INPUT", "target": {"role": "textbox"}, "before": {"text": "Genre"}, "text": "x"}
    spec = task_spec_from_mapping({**LOGIN_RAW_NO_TEMPLATE, "solution": [{**raw_step, "nth": -1}, raw_step]})
    nearest, first = expand_solution(spec, {})
    assert find_target(screen, nearest).ref == "3"
    assert find_target(screen, first).ref == "1"
    assert find_target(Screen(screen.elements[:3]), nearest) is None


def test_expert_without_noise_follows_the_solution():
    actor = make_policy("expert").start(context())
    screen = login_screen()
    assert actor.act(screen).canonical_text() == "CLICK(textbox#u)"
    assert actor.act(screen).canonical_text() == 'INPUT(textbox#u, "ada")'
    assert actor.act(login_screen("ada")).canonical_text() == 'CLICK(button#go "Go")'
    assert actor.act(login_screen("ada")).type in (
        ActionType.CLICK,
        ActionType.SCROLL,
        ActionType.NOTHING,
        ActionType.INPUT,
        ActionType.GOBACK,
    )  # past the plan: wanders


def test_expert_waits_for_an_absent_target_then_moves_on():
    actor = NoisyExpertPolicy(noise=0, skip=0, typo=0, patience=2).start(context())
    empty = Screen((element("1", "body", depth=0),))
    assert [actor.act(empty).type for _ in range(2)] == [ActionType.NOTHING, ActionType.NOTHING]
    # patience spent: the click on u is given up; the INPUT's target is absent too, so it waits
    assert actor.act(empty).type is ActionType.NOTHING
    assert actor.act(login_screen()).canonical_text() == 'INPUT(textbox#u, "ada")'


def test_noisy_expert_is_reproducible_and_noisy():
    policy = NoisyExpertPolicy(noise=0.5, skip=0.0, typo=0.0)
    runs = []
    for _ in range(2):
        actor = policy.start(context(seed=7))
        runs.append([actor.act(login_screen()).canonical_text() for _ in range(8)])
    assert runs[0] == runs[1]
    assert any(not a.startswith(("CLICK(textbox#u)", 'INPUT(textbox#u, "ada")')) for a in runs[0])
    other = policy.start(context(seed=8))
    assert [other.act(login_screen()).canonical_text() for _ in range(8)] != runs[0]
    assert policy.policy_id == "noisy_expert(noise=0.5,skip=0,typo=0)" and make_policy("expert").policy_id == "expert"


def test_a_leaf_named_only_by_its_id_is_a_click_target():
    """The forward form's send icon is a span with an id and nothing else: the demonstrations click
    it to finish, so a policy that is not offered it can neither learn nor do the task."""

    def leaf(ref: str, **kw) -> UIElement:
        return UIElement(ref=ref, role="span", bounds=(0.0, 0.0, 12.0, 12.0), parent_ref="2", depth=2, **kw)

    screen = Screen(
        (
            UIElement(ref="1", role="body", bounds=(0.0, 0.0, 160.0, 210.0)),
            UIElement(ref="2", role="div", element_id="forward", bounds=(0, 50, 160, 210), parent_ref="1", depth=1),
            leaf("3", element_id="send-forward"),
            leaf("4"),  # shows nothing a policy could name
            UIElement(ref="5", role="span", element_id="hidden", bounds=(0.0, 0.0, 0.0, 0.0), parent_ref="2", depth=2),
        )
    )
    assert [e.ref for e in clickable_elements(screen)] == ["3"]


def test_random_walk_only_uses_supported_actions():
    supported = frozenset({ActionType.CLICK, ActionType.NOTHING})
    actor = RandomWalkPolicy().start(context(supported=supported))
    kinds = {actor.act(login_screen()).type for _ in range(100)}
    assert kinds == supported
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("teleport")


def test_typo_changes_text_by_one_slip():
    rng = random.Random(1)
    for word in ("keneth", "91YP", "a"):
        slipped = typo(word, rng)
        assert slipped != word or len(set(word)) == 1
        assert abs(len(slipped) - len(word)) <= 1


def test_plan_jobs_seeds_ids_and_budgets():
    catalog = load_catalog()
    tasks = tasks_of_family("miniwob-choice", catalog, ["click-option", "click-button-sequence"])
    jobs = plan_jobs(tasks, batch="b03", batch_index=3, episodes_per_task=2, base_seed=5)
    assert [j.seed for j in jobs] == [30005, 30006, 30005, 30006]
    assert jobs[0].task.task_id == jobs[1].task.task_id != jobs[2].task.task_id
    assert jobs[0].episode_id == f"rollout:{jobs[0].task.task_id}:b03:30005"
    assert len({j.episode_id for j in jobs}) == 4 and all(j.max_steps > 0 for j in jobs)
    explicit = plan_jobs(tasks[:1], batch="b00", seeds=[4, 4, 9], max_steps=3)
    assert [(j.seed, j.max_steps) for j in explicit] == [(4, 3), (9, 3)]
    with pytest.raises(KeyError, match="not in the catalog"):
        tasks_of_family("miniwob-choice", catalog, ["no-such-task"])


def test_catalog_has_at_least_15_multistep_tasks_with_solutions_and_milestones():
    catalog = load_catalog(fresh=True)
    runnable = [t for t in catalog.values() if t.has_solution]
    assert len(runnable) >= 15
    for task in runnable:
        assert len(task.spec.solution) >= 2, f"{task.task_id} is not multi-step"
        assert task.spec.milestones and task.family in MINIWOB_FAMILIES
        if task.spec.family != "miniwob":  # a spec naming its family must agree with the catalog
            assert task.spec.family == task.family
    assert {t.family for t in runnable} == set(MINIWOB_FAMILIES)


def test_episode_tables_fit_the_warehouse_schema():
    screen = login_screen()
    steps = (
        StepRecord(0, screen, Action(ActionType.INPUT, screen.elements[1], "ada"), 0.0, ("user typed",), False, 5, 3.0),
        StepRecord(
            1,
            screen,
            Action(ActionType.CLICK, element("9", "button")),
            0.0,
            (),
            False,
            9,
            1.0,
            "target not on the screen",
        ),
        StepRecord(2, screen, Action(ActionType.CLICK, screen.elements[2]), 1.0, ("submitted",), True, 12, 2.0),
    )
    from datetime import UTC, datetime

    record = EpisodeRecord(
        "e1",
        "login-like",
        "fam",
        'Log in as "ada"',
        0,
        "expert",
        "test",
        steps,
        screen,
        {},
        {"user": "ada"},
        True,
        1.0,
        0.9,
        "success",
        2,
        2,
        50.0,
        12,
        datetime.now(UTC),
        spec_digest="5f1d0c9e2b7a4d36",
    )
    episodes, step_table = episode_tables([record], run_id="r1", purpose=EpisodePurpose.EXPLORATION)
    assert episodes.schema.equals(EPISODES) and step_table.schema.equals(STEPS)
    row = episodes.to_pylist()[0]
    assert row["spec_digest"] == "5f1d0c9e2b7a4d36"
    assert [e["ref"] for e in row["final_screen"]] == [e.ref for e in screen.elements]
    assert row["source"] == "rollout" and row["n_steps"] == 3 and row["task_fields"] == '{"user": "ada"}'
    rows = step_table.to_pylist()
    assert [r["milestones_hit"] for r in rows] == [["user typed"], [], ["submitted"]]
    assert [r["env_reward"] for r in rows] == [0.0, 0.0, 1.0] and rows[1]["problem"] == "target not on the screen"
    assert rows[0]["input_text"] == "ada" and rows[0]["action_text"] == 'INPUT(textbox#u, "ada")'
    assert pa.Table.from_pylist(rows, schema=STEPS).num_rows == 3
