"""The Android backend without a device: real hierarchy dumps, and recorded interactions replayed.

What runs here: parsing of the 16 real device dumps in ../shared/data/android-hierarchy, the
mapping of canonical actions to uiautomator2 calls on those screens, whole episodes through
``AndroidEnv`` against a replayed recording (strict: every device call must be the recorded one),
the record -> replay round trip, the worker pool with Android workers, and uiautomator2's own
connect failing cleanly. What cannot run here: anything on a real device or emulator.
"""

import inspect
import time

import pytest

from envs.android import (
    AndroidConfig,
    AndroidEnv,
    DeviceCall,
    RecordingDevice,
    ReplayDevice,
    ReplayMismatch,
    parse_bounds,
    parse_hierarchy,
    role_of_class,
    to_device_calls,
)
from envs.android.device import DEVICE_METHODS
from envs.android.env import check_android_spec, instruction_for
from envs.policies import NoisyExpertPolicy, ScriptedPolicy, expand_solution, find_target, make_policy
from envs.protocol import InvalidAction, milestone_track_matches, run_episode
from envs.task_catalog import load_catalog
from envs.tasks import TaskSpecError, task_spec_from_mapping
from tests.envs.conftest import read_dump
from warehouse.model import Action, ActionType

CALCULATOR = "com.google.android.calculator"


def by_id(screen, resource_id):
    return next(e for e in screen.elements if e.element_id == resource_id)


# -- parsing ---------------------------------------------------------------------------------


def test_every_real_dump_parses_into_a_consistent_screen(dumps_dir):
    import xml.etree.ElementTree as ET

    for path in sorted(dumps_dir.glob("*.xml")):
        xml = path.read_text(encoding="utf-8")
        screen = parse_hierarchy(xml)
        nodes = list(ET.fromstring(xml.encode()).iter("node"))
        assert 0 < len(screen.elements) <= len(nodes), path.name
        refs = [e.ref for e in screen.elements]
        assert len(refs) == len(set(refs)), path.name
        known = set(refs)
        for element in screen.elements:
            assert element.parent_ref is None or element.parent_ref in known
            left, top, right, bottom = element.bounds
            assert right > left and bottom > top
            assert element.editable == (element.role in ("textbox", "password") and element.editable)


def test_dump_facts_survive_parsing():
    quick = parse_hierarchy(read_dump("quick-settings"))
    assert sum(e.checked is True for e in quick.elements) == 3  # Wi-Fi, Bluetooth, Auto-rotate on
    permission = parse_hierarchy(read_dump("permission-dialog"))
    radios = [e for e in permission.elements if e.role == "radio"]
    assert radios and [e.checked for e in radios].count(True) == 1
    gmail = parse_hierarchy(read_dump("gmail"))
    search = by_id(gmail, "com.google.android.gm:id/open_search")
    assert search.role == "textbox" and search.editable and search.value == ""  # text is only the hint
    safeum = parse_hierarchy(read_dump("safeum"))
    assert by_id(safeum, "com.safeum.android:id/et_password").role == "password"
    assert by_id(safeum, "com.safeum.android:id/login_button").role == "button"
    train = parse_hierarchy(read_dump("whereismytrain"))
    assert not any(e.editable for e in train.elements)  # its EditTexts are enabled="false"
    tasks = parse_hierarchy(read_dump("google-tasks"))  # CRLF line endings
    assert any(e.text == "Task 17" for e in tasks.elements)
    calculator = parse_hierarchy(read_dump("calculator"))
    digit = by_id(calculator, f"{CALCULATOR}:id/digit_7")
    assert digit.clickable and digit.text == "7" and digit.depth > 0


def test_roles_and_bounds():
    assert role_of_class("android.widget.EditText") == "textbox"
    assert role_of_class("android.widget.EditText", password=True) == "password"
    assert role_of_class("androidx.appcompat.widget.SwitchCompat") == "switch"
    assert role_of_class("com.google.android.material.floatingactionbutton.FloatingActionButton") == "button"
    assert role_of_class("android.widget.CheckBox") == "checkbox"
    assert role_of_class("androidx.recyclerview.widget.RecyclerView") == "list"
    assert role_of_class("android.widget.FrameLayout") == "group"
    assert role_of_class("ib") == "ib"
    assert parse_bounds("[0,136][1344,2920]") == (0.0, 136.0, 1344.0, 2920.0)
    with pytest.raises(ValueError, match="malformed bounds"):
        parse_bounds("[0,136][1344]")
    with pytest.raises(ValueError, match="not a view hierarchy"):
        parse_hierarchy("<html/>")


# -- action mapping --------------------------------------------------------------------------


def test_actions_map_to_uiautomator2_calls_on_real_screens():
    calculator = parse_hierarchy(read_dump("calculator"))
    window = (1440, 2392)
    seven = by_id(calculator, f"{CALCULATOR}:id/digit_7")
    left, top, right, bottom = seven.bounds
    centre = (int((left + right) / 2), int((top + bottom) / 2))
    assert to_device_calls(Action(ActionType.CLICK, seven), calculator, window) == [DeviceCall("click", centre)]
    assert to_device_calls(Action(ActionType.LONG_CLICK, seven), calculator, window)[0].name == "long_click"
    assert to_device_calls(Action(ActionType.GOBACK), calculator, window) == [DeviceCall("press", ("back",))]
    assert to_device_calls(Action(ActionType.PRESS_KEY, text="Enter"), calculator, window) == [
        DeviceCall("press", ("enter",))
    ]
    assert to_device_calls(Action(ActionType.OPEN_APP, text=CALCULATOR), calculator, window) == [
        DeviceCall("app_start", (CALCULATOR,))
    ]
    assert to_device_calls(Action(ActionType.NOTHING), calculator, window) == []

    gmail = parse_hierarchy(read_dump("gmail"))
    search = by_id(gmail, "com.google.android.gm:id/open_search")
    calls = to_device_calls(Action(ActionType.INPUT, search, "invoice"), gmail, (1080, 2400))
    assert [c.name for c in calls] == ["click", "send_keys"]
    assert calls[1].args == ("invoice",) and dict(calls[1].kwargs) == {"clear": True}  # input with clear

    tasks = parse_hierarchy(read_dump("google-tasks"))
    task_list = by_id(tasks, "com.google.android.apps.tasks:id/tasks_list")
    (swipe,) = to_device_calls(Action(ActionType.SCROLL, direction="DOWN"), tasks, (1600, 2560))
    fx, fy, tx, ty, _ = swipe.args
    assert fx == tx and fy > ty  # the finger moves up to show what is below
    assert task_list.bounds[1] <= ty < fy <= task_list.bounds[3]  # inside the scrollable list
    (swipe,) = to_device_calls(Action(ActionType.SCROLL, direction="RIGHT"), tasks, (1600, 2560))
    assert swipe.args[0] > swipe.args[2]


def test_invalid_actions_are_refused_before_touching_the_device():
    calculator = parse_hierarchy(read_dump("calculator"))
    seven = by_id(calculator, f"{CALCULATOR}:id/digit_7")
    with pytest.raises(InvalidAction, match="non-editable"):
        to_device_calls(Action(ActionType.INPUT, seven, "7"), calculator, (1440, 2392))
    gmail = parse_hierarchy(read_dump("gmail"))
    compose = by_id(gmail, "com.google.android.gm:id/compose_button")
    with pytest.raises(InvalidAction, match="not on the screen"):
        to_device_calls(Action(ActionType.CLICK, compose), calculator, (1440, 2392))
    with pytest.raises(InvalidAction, match="no Android key"):
        to_device_calls(Action(ActionType.PRESS_KEY, text="F13"), calculator, (1440, 2392))


# -- specs against the real dumps ------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_id", "dump", "instruction", "steps"),
    [
        ("android-calculator-add", "calculator", "Add 7 and 8 with the calculator", [0, 1, 2, 3]),
        ("android-gmail-search", "gmail", 'Search your mail for "invoice"', [0]),
        ("android-tasks-star", "google-tasks", 'Star the task "Task 17"', [1]),
        ("android-safeum-login", "safeum", "Log in to SafeUM as alice with the password s3cret", [0, 1, 2]),
    ],
)
def test_android_specs_resolve_on_their_apps_real_screens(task_id, dump, instruction, steps):
    spec = load_catalog("android")[task_id].spec
    check_android_spec(spec)
    slots = spec.slots(instruction)
    assert slots is not None, "the spec's template must fit its own goals"
    assert all(spec.slots(goal) is not None for goal in spec.extra["goals"])
    screen = parse_hierarchy(read_dump(dump))
    plan = expand_solution(spec, slots)
    for index in steps:
        target = find_target(screen, plan[index])
        assert target is not None, f"{task_id}: solution step {index} finds nothing on the {dump} dump"
    if task_id == "android-tasks-star":  # the star of the named row, not the first star
        star = find_target(screen, plan[1])
        name = next(e for e in screen.elements if e.text == "Task 17")
        assert star.parent_ref == name.parent_ref or star.bounds[1] >= name.bounds[1] - 40


def test_android_spec_rules():
    base = {"task_id": "t", "backend": "android", "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}]}
    with pytest.raises(TaskSpecError, match="needs 'app'"):
        check_android_spec(task_spec_from_mapping(base))
    with pytest.raises(TaskSpecError, match="episode_success"):
        check_android_spec(
            task_spec_from_mapping(
                {**base, "app": "a.b", "milestones": [{"name": "m", "when": {"episode_success": True}}]}
            )
        )
    with pytest.raises(TaskSpecError, match="goals"):
        instruction_for(task_spec_from_mapping({**base, "app": "a.b"}), 0)
    spec = load_catalog("android")["android-calculator-add"].spec
    assert instruction_for(spec, 3) == instruction_for(spec, 3) and instruction_for(spec, 3) in spec.extra["goals"]


# -- whole episodes against a recorded interaction -------------------------------------------


def calculator_recording(a: str, b: str) -> list[tuple]:
    """What a device does for 'Add a and b': launch, then four keypad taps (the real keypad dump)."""
    xml = read_dump("calculator")
    screen = parse_hierarchy(xml)

    def tap(key):
        left, top, right, bottom = by_id(screen, f"{CALCULATOR}:id/{key}").bounds
        return ("click", [int((left + right) / 2), int((top + bottom) / 2)], {}, None)

    steps = [
        ("window_size", [], {}, [1440, 2392]),
        ("app_stop", [CALCULATOR], {}, None),
        ("app_start", [CALCULATOR, None], {}, None),
        ("app_wait", [CALCULATOR], {"timeout": 15.0, "front": True}, 4242),
        ("dump_hierarchy", [], {}, xml),
    ]
    for key in (f"digit_{a}", "op_add", f"digit_{b}", "eq"):
        steps += [tap(key), ("dump_hierarchy", [], {}, xml)]
    return steps


def test_expert_episode_against_a_replayed_device_issues_exactly_the_recorded_calls():
    spec = load_catalog("android")["android-calculator-add"].spec
    instruction = instruction_for(spec, 0)
    a, b = spec.slots(instruction)["a"], spec.slots(instruction)["b"]
    device = ReplayDevice.from_steps(calculator_recording(a, b))
    env = AndroidEnv(device, AndroidConfig(settle_s=0, wait_s=0))
    record = run_episode(env, make_policy("expert"), spec, 0, episode_id="android:0", max_steps=10)
    assert device.finished, "every recorded call was made, in order"
    assert record.success and record.end_reason == "success" and record.outcome_reward == 1.0
    assert [s.milestones_hit for s in record.steps] == [(m.name,) for m in spec.milestones]
    assert record.steps[-1].done and record.steps[-1].env_reward == 1.0
    assert milestone_track_matches(record, spec)


def test_failed_steps_on_android_send_nothing_to_the_device():
    spec = load_catalog("android")["android-calculator-add"].spec
    instruction = instruction_for(spec, 0)
    a, b = spec.slots(instruction)["a"], spec.slots(instruction)["b"]
    recording = calculator_recording(a, b)
    device = ReplayDevice.from_steps(recording[:5] + [("dump_hierarchy", [], {}, recording[4][3])] * 2)

    def type_into_a_key(screen, context):
        return Action(ActionType.INPUT, by_id(screen, f"{CALCULATOR}:id/digit_1"), "1")

    def click_a_ghost(screen, context):
        gmail = parse_hierarchy(read_dump("gmail"))
        return Action(ActionType.CLICK, by_id(gmail, "com.google.android.gm:id/compose_button"))

    env = AndroidEnv(device, AndroidConfig(settle_s=0, wait_s=0))
    record = run_episode(env, ScriptedPolicy([type_into_a_key, click_a_ghost]), spec, 0, episode_id="x", max_steps=2)
    assert [s.problem is not None for s in record.steps] == [True, True]
    assert "non-editable" in record.steps[0].problem and "not on the screen" in record.steps[1].problem
    assert device.finished and [c[0] for c in device.calls].count("click") == 0
    assert not record.success and record.end_reason == "max_steps"


def test_replay_refuses_an_interaction_that_departs_from_the_recording():
    device = ReplayDevice.from_steps([("click", [10, 20], {}, None)])
    with pytest.raises(ReplayMismatch, match="expected click"):
        device.press("back")
    lenient = ReplayDevice.from_steps([("dump_hierarchy", [], {}, "<hierarchy/>")], strict=False)
    assert lenient.press("back") is None and lenient.dump_hierarchy() == "<hierarchy/>"


def test_record_then_replay_round_trip(tmp_path):
    spec = load_catalog("android")["android-calculator-add"].spec
    slots = spec.slots(instruction_for(spec, 0))
    source = ReplayDevice.from_steps(calculator_recording(slots["a"], slots["b"]))  # stands in for a device
    recorder = RecordingDevice(source, tmp_path / "session.jsonl", label="emulator-5554")
    run_episode(
        AndroidEnv(recorder, AndroidConfig(settle_s=0)),
        NoisyExpertPolicy(noise=0, skip=0, typo=0),
        spec,
        0,
        episode_id="rec",
        max_steps=10,
    )
    recorder.close()
    replay = ReplayDevice.from_file(tmp_path / "session.jsonl")
    record = run_episode(
        AndroidEnv(replay, AndroidConfig(settle_s=0)), make_policy("expert"), spec, 0, episode_id="replay", max_steps=10
    )
    assert replay.finished and record.success


def test_android_workers_in_the_pool(tmp_path):
    """The pool's worker processes build Android environments from a picklable config."""
    from envs.pool import EnvPool
    from envs.pool_jobs import PoolConfig, plan_jobs
    from envs.task_catalog import CatalogTask

    spec = load_catalog("android")["android-calculator-add"].spec
    slots = spec.slots(instruction_for(spec, 0))
    source = ReplayDevice.from_steps(calculator_recording(slots["a"], slots["b"]))
    recorder = RecordingDevice(source, tmp_path / "calc.jsonl")
    for name, args, kwargs, _ in calculator_recording(slots["a"], slots["b"]):  # write the recording file
        getattr(recorder, name)(*args, **kwargs)
    recorder.close()
    config = AndroidConfig(replay=str(tmp_path / "calc.jsonl"), settle_s=0)
    task = CatalogTask(spec.task_id, spec.family, "android", spec, 10)
    jobs = plan_jobs([task], batch="t", seeds=[0])
    with EnvPool([config], PoolConfig(workers=1, spares=0)) as pool:
        result = pool.run(jobs, make_policy("expert"))
    assert not result.lost, result.lost
    assert [e.success for e in result.episodes] == [True]


# -- uiautomator2 itself ---------------------------------------------------------------------


def test_the_device_protocol_is_uiautomator2s_own_api():
    """Every call the backend makes exists on uiautomator2.Device with the parameters we pass."""
    import uiautomator2

    for name in DEVICE_METHODS:
        method = getattr(uiautomator2.Device, name)
        parameters = inspect.signature(method).parameters
        if name == "app_wait":
            assert {"package_name", "timeout", "front"} <= set(parameters)
        if name == "send_keys":
            assert "clear" in parameters
        if name == "app_start":
            assert list(parameters)[1:3] == ["package_name", "activity"]
    assert isinstance(inspect.getattr_static(uiautomator2.Device, "info"), property)  # the health check


@pytest.mark.e2e  # ~15 s: uiautomator2 retries `adb connect` before giving up
def test_connecting_without_a_device_fails_cleanly():
    import adbutils

    from envs.android.device import connect
    from envs.protocol import EnvironmentFailure

    started = time.perf_counter()
    try:
        with pytest.raises(EnvironmentFailure, match="no Android device"):
            connect("127.0.0.1:5", attempts=1)
    finally:
        try:
            adbutils.AdbClient().server_kill()  # uiautomator2 started adbutils' adb server: stop it
        except Exception:
            pass
    assert time.perf_counter() - started < 30
