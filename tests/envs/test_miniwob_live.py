"""MiniWoB++ in real Chromium: screens, the action mapping, failed steps, milestones, the catalog."""

import contextlib
import dataclasses
import os
from pathlib import Path

import pytest

from envs.miniwob.live import dom_elements_to_screen, miniwob_key, to_miniwob_actions
from envs.policies import ScriptedPolicy, make_policy
from envs.protocol import InvalidAction, episode_slots, milestone_track_matches, run_episode
from envs.spec_evaluation import element_matches
from envs.task_catalog import load_catalog
from envs.tasks import TaskSpecError, task_spec_from_mapping
from warehouse.model import Action, ActionType, UIElement


def by_id(screen, element_id):
    return next(e for e in screen.elements if e.element_id == element_id)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(fresh=True)


def test_live_screens_look_like_the_demonstrations(miniwob_env, catalog):
    observation = miniwob_env.reset(catalog["login-user-popup"].spec, 3)
    assert observation.instruction.startswith('Enter the username "keneth"')
    screen = observation.screen
    roles = {e.element_id: e.role for e in screen.elements if e.element_id}
    assert roles["username"] == "textbox" and roles["password"] == "password" and roles["subbtn"] == "button"
    assert by_id(screen, "username").editable and by_id(screen, "username").value == ""
    labels = [e.text for e in screen.elements if e.role == "label"]
    assert labels == ["Username", "Password"]  # text nodes folded into their element, as in dom.py
    assert len({e.ref for e in screen.elements}) == len(screen.elements)


@pytest.mark.parametrize("task_id", ["click-option", "click-shades"])
def test_gym_observation_converts_to_the_same_screen(miniwob_env, catalog, task_id):
    """The flat ``dom_elements`` of miniwob's gymnasium env give the screen our env reads directly
    (click-shades: the swatches' colours, from ``bg_color`` there and ``bgColor`` here)."""
    from miniwob.environment import MiniWoBEnvironment

    gym_env = MiniWoBEnvironment(subdomain=task_id)
    try:
        observation, _ = gym_env.reset(seed=11, options={"record_screenshots": False})
        flat = dom_elements_to_screen(observation["dom_elements"])
    finally:
        gym_env.close()
    ours = miniwob_env.reset(catalog[task_id].spec, 11).screen
    if task_id == "click-shades":
        assert sorted({e.description for e in ours.elements if e.role == "span"}) == ["blue", "green", "red"]

    def key(e: UIElement):
        return (
            (e.role, e.text, e.element_id, e.classes, e.description, e.value, e.checked, e.depth),
            tuple(round(b) for b in e.bounds),
        )

    assert [key(e) for e in flat.elements] == [key(e) for e in ours.elements]


def test_actions_map_to_miniwob_action_types(miniwob_env, catalog):
    screen = miniwob_env.reset(catalog["login-user-popup"].spec, 3).screen
    username, login = by_id(screen, "username"), by_id(screen, "subbtn")
    assert [a.type.value for a in to_miniwob_actions(Action(ActionType.CLICK, login), screen)] == ["CLICK_ELEMENT"]
    (typed,) = to_miniwob_actions(Action(ActionType.INPUT, username, "ada"), screen)
    assert typed.type.value == "FOCUS_ELEMENT_AND_TYPE_TEXT" and typed.ref == int(username.ref) and typed.text == "ada"
    (scroll,) = to_miniwob_actions(Action(ActionType.SCROLL, direction="DOWN"), screen)
    assert scroll.type.value == "SCROLL_DOWN_COORDS"
    assert [a.key for a in to_miniwob_actions(Action(ActionType.PRESS_KEY, text="Ctrl+A Enter"), screen)] == [
        "C-a",
        "<Enter>",
    ]
    assert miniwob_key("Tab") == "<Tab>" and miniwob_key("x") == "x"
    for action, reason in [
        (Action(ActionType.GOBACK), "no GOBACK"),
        (Action(ActionType.SCROLL, direction="LEFT"), "only UP or DOWN"),
        (Action(ActionType.INPUT, login, "x"), "non-editable"),
        (Action(ActionType.PRESS_KEY, text="Hyper+Q"), "unknown modifier"),
    ]:
        with pytest.raises(InvalidAction, match=reason):
            to_miniwob_actions(action, screen)


def test_an_episode_with_failed_steps_records_them_and_goes_on(miniwob_env, catalog):
    spec = catalog["login-user-popup"].spec
    ghost = UIElement(ref="999", role="button", text="Ghost", element_id="ghost")
    script = [
        lambda s, c: Action(ActionType.INPUT, by_id(s, "username"), "wrong"),
        lambda s, c: Action(ActionType.INPUT, by_id(s, "username"), c.slots["username"]),  # replaces "wrong"
        lambda s, c: Action(ActionType.CLICK, ghost),  # a target not on the screen
        lambda s, c: Action(ActionType.INPUT, by_id(s, "subbtn"), "text"),  # into a button
        lambda s, c: Action(ActionType.GOBACK),  # MiniWoB++ has no back
        lambda s, c: Action(ActionType.PRESS_KEY, text="Tab"),  # focus moves to the password field
        lambda s, c: Action(ActionType.INPUT, by_id(s, "password"), c.slots["password"]),
        lambda s, c: Action(ActionType.CLICK, by_id(s, "subbtn")),
    ]
    record = run_episode(miniwob_env, ScriptedPolicy(script), spec, 3, episode_id="t", max_steps=12)
    problems = [s.problem for s in record.steps]
    assert problems[:2] == [None, None] and problems[5:] == [None, None, None]
    assert "not on the screen" in problems[2] and "non-editable" in problems[3] and "no GOBACK" in problems[4]
    assert by_id(record.steps[2].screen, "username").value == "keneth"  # INPUT replaced the value
    assert by_id(record.steps[6].screen, "password").focused  # after Tab
    assert record.success and record.end_reason == "success" and record.outcome_reward == 1.0
    assert [s.env_reward for s in record.steps] == [0.0] * 7 + [1.0] and record.steps[-1].done
    assert [s.milestones_hit for s in record.steps] == [
        (),
        ("username typed",),
        (),
        (),
        (),
        (),
        ("password typed",),
        ("login clicked",),
    ]
    assert 0 < record.decayed_reward < 1.0
    assert milestone_track_matches(record, spec)


@pytest.mark.parametrize("task_id, icon", [("email-inbox-delete", "trash"), ("email-inbox-important", "star")])
def test_an_inbox_rows_icon_reaches_every_milestone_and_another_rows_none(miniwob_env, catalog, task_id, icon):
    """The page accepts the icon of the sender's row in the inbox, without opening the e-mail (the
    learned agent's usual path); the specs once asked for the e-mail opened first, so those
    successes reached no milestone. The icon of another sender's row fails the episode and reaches none."""
    spec = catalog[task_id].spec

    def row_icon(sender_is_named: bool):
        def act(screen, context):
            rows = [
                e
                for e in screen.elements
                if icon in e.classes.split()
                and element_matches(e, {"within": {"classes_contains": "email-sender"}}, context.slots, screen)
                and element_matches(
                    e, {"within": {"classes_contains": "email-sender", "text": "{name}"}}, context.slots, screen
                )
                == sender_is_named
            ]
            return Action(ActionType.CLICK, rows[0])

        return act

    def wait(screen, context):  # the icons are images the first screen has not laid out yet
        return Action(ActionType.NOTHING)

    right = run_episode(miniwob_env, ScriptedPolicy([wait, row_icon(True)]), spec, 5, episode_id="r", max_steps=2)
    assert right.success and right.milestones_reached == right.n_milestones == 2
    assert right.steps[-1].milestones_hit == tuple(m.name for m in spec.milestones)
    assert milestone_track_matches(right, spec)
    wrong = run_episode(miniwob_env, ScriptedPolicy([wait, row_icon(False)]), spec, 5, episode_id="w", max_steps=2)
    assert not wrong.success and wrong.steps[-1].done and wrong.milestones_reached == 0


def test_a_folders_expander_and_a_reply_caption_reach_their_milestones(miniwob_env, catalog):
    """Clicks the pages take on a part of the element the specs once named (the learned agent's
    paths, which left its successes short of the last milestone): navigate-tree's folder expander
    succeeds as a click on the folder's row; email-inbox-nl-turk's "Reply" caption opens the reply
    form as the icon does."""
    tree = catalog["navigate-tree"].spec

    def expander_of(name_slot_is_target: bool):
        def act(screen, context):
            folders = [e for e in screen.elements if "folder" in e.classes.split()]
            rows = {e.parent_ref for e in folders if (e.text == context.slots["name"]) == name_slot_is_target}
            return Action(
                ActionType.CLICK, next(e for e in screen.elements if "hitarea" in e.classes and e.parent_ref in rows)
            )

        return act

    # seed 1: the target is a folder ("Truman") shown collapsed at the start
    right = run_episode(miniwob_env, ScriptedPolicy([expander_of(True)]), tree, 1, episode_id="t", max_steps=1)
    assert right.success and right.milestones_reached == 2 and milestone_track_matches(right, tree)
    other = run_episode(miniwob_env, ScriptedPolicy([expander_of(False)]), tree, 1, episode_id="o", max_steps=1)
    assert not other.success and other.milestones_reached < 2

    turk = catalog["email-inbox-nl-turk"].spec
    script = [
        lambda s, c: Action(ActionType.CLICK, next(e for e in s.elements if e.text == c.slots["by"])),
        lambda s, c: Action(ActionType.CLICK, next(e for e in s.elements if e.text == "Reply" and e.role == "div")),
        lambda s, c: Action(ActionType.INPUT, by_id(s, "reply-text"), c.slots["message"]),
        lambda s, c: Action(ActionType.CLICK, by_id(s, "send-reply")),
    ]
    reply = run_episode(miniwob_env, ScriptedPolicy(script), turk, 3, episode_id="r", max_steps=4)  # seed 3: a reply
    assert [s.milestones_hit for s in reply.steps] == [
        ("sender's email in view",),
        ("action chosen",),
        (),
        ("done",),
    ]
    assert reply.success and milestone_track_matches(reply, turk)


def test_a_stored_rollout_replays_to_its_online_milestones_where_only_the_final_screen_shows_them(
    miniwob_env, catalog, tmp_path
):
    """click-collapsible-2-nodelay, the expert stopped by the step budget right after the click that
    opens the link's section. Online the section is open at that step (the screen after it shows the
    link); the steps store the screens before each action, so only the stored final screen lets a
    replay from the warehouse see it, as it now does (without it, one milestone short)."""
    from envs.protocol import episode_tables
    from envs.spec_validation import replay_milestones
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.purposes import EpisodePurpose
    from warehouse.trajectories import load_trajectories

    spec = catalog["click-collapsible-2-nodelay"].spec
    expert = make_policy("expert")
    stopped = []
    for seed in (1, 2, 3):
        whole = run_episode(miniwob_env, expert, spec, seed, episode_id=f"whole-{seed}", max_steps=10)
        opened = next(t for t, s in enumerate(whole.steps) if s.milestones_hit)
        stopped.append(run_episode(miniwob_env, expert, spec, seed, episode_id=f"cut-{seed}", max_steps=opened + 1))
    for record in stopped:
        assert record.end_reason == "max_steps" and record.steps[-1].milestones_hit == ("section with the link open",)

    warehouse = Warehouse(tmp_path / "home")
    episodes, steps = episode_tables(stopped, purpose=EpisodePurpose.EXPLORATION)
    m = Materialization(asset="rollouts")
    warehouse.publish(
        m, [warehouse.stage_table("episodes", "t", episodes, m), warehouse.stage_table("steps", "t", steps, m)]
    )
    stored = list(load_trajectories(warehouse))
    assert len(stored) == 3
    for trajectory in stored:
        assert trajectory.spec_digest == spec.milestone_digest and trajectory.final_screen is not None
        assert replay_milestones(spec, trajectory).hits == trajectory.milestones_hit
        without = replay_milestones(spec, dataclasses.replace(trajectory, final_screen=None))
        assert without.reached == 0


def test_refs_stay_unique_when_an_episode_follows_a_finished_one(miniwob_env, catalog):
    """Regression: reading the DOM after an episode ended used to lend its refs to the next episode."""
    spec = catalog["click-option"].spec
    for seed in (1, 2, 3):
        record = run_episode(miniwob_env, make_policy("expert"), spec, seed, episode_id=f"r{seed}", max_steps=4)
        assert record.success and not any(s.problem for s in record.steps)
        first = record.steps[0].screen
        assert len({e.ref for e in first.elements}) == len(first.elements)


def test_an_instruction_that_does_not_fit_its_spec_is_refused(miniwob_env):
    spec = task_spec_from_mapping(
        {
            "task_id": "click-button-sequence",
            "instruction": "Never (?P<x>.*)",
            "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}],
        }
    )
    with pytest.raises(TaskSpecError, match="does not fit"):
        miniwob_env.reset(spec, 0)


def test_the_screen_after_typing_shows_what_the_typed_text_triggers(miniwob_env, catalog):
    """jQuery UI's autocomplete (delay 0) searches in a setTimeout after each key: the screen after
    INPUT must list the suggestions for the whole text, not for an earlier prefix of it."""
    spec = catalog["use-autocomplete-nodelay"].spec
    for seed in (202, 7, 31):
        observation = miniwob_env.reset(spec, seed)
        prefix = episode_slots(spec, observation.instruction, observation.fields)["prefix"]
        result = miniwob_env.step(Action(ActionType.INPUT, by_id(observation.screen, "tags"), prefix))
        suggestions = [e.text for e in result.screen.elements if "ui-menu-item-wrapper" in (e.classes or "")]
        assert suggestions, (seed, prefix)
        assert all(s.lower().startswith(prefix.lower()) for s in suggestions), (seed, prefix, suggestions)


@pytest.mark.e2e
def test_expert_solves_every_catalog_task_and_milestones_agree(miniwob_env, catalog):
    """Every catalog task with a solution: the noiseless expert succeeds, every milestone is hit,
    and the online milestones equal envs.spec_evaluation.track_milestones over the recorded trajectory."""
    expert = make_policy("expert")
    failures = []
    for task in (t for t in catalog.values() if t.has_solution):
        for seed in (101, 202):
            record = run_episode(
                miniwob_env, expert, task.spec, seed, episode_id=f"{task.task_id}:{seed}", max_steps=task.max_steps
            )
            if not (record.success and record.milestones_reached == record.n_milestones):
                failures.append(
                    (
                        task.task_id,
                        seed,
                        record.end_reason,
                        record.milestones_reached,
                        [s.action.canonical_text() for s in record.steps],
                    )
                )
            assert milestone_track_matches(record, task.spec), task.task_id
    assert not failures, failures


def test_a_live_episode_and_a_demonstration_name_the_instructions_values_alike(miniwob_env, catalog):
    """Every catalog task, one live instance: the slots of the live episode (the page's fields)
    and of a recording of the same instruction (``envs.miniwob.fields``, as the importer gives it)
    write the same instruction-relative text, the one the policy is trained and acts on. Before,
    recordings had no fields and 24 of 33 tasks read differently ("<link>" against "<target>")."""
    from envs.miniwob.fields import utterance_fields
    from training.policy.candidates import relative_instruction

    differ = {}
    for task_id, task in catalog.items():
        observation = miniwob_env.reset(task.spec, 7)
        # natural-language tasks (no instruction template) state their fields, and so do their recordings
        stated = observation.fields if task.spec.instruction is None else None
        recorded = utterance_fields(task_id, observation.instruction, stated)
        live = relative_instruction(
            observation.instruction, task.spec.slots(observation.instruction, observation.fields) or {}
        )
        demo = relative_instruction(observation.instruction, task.spec.slots(observation.instruction, recorded) or {})
        if live != demo:
            differ[task_id] = (live, demo)
    assert not differ


@pytest.mark.e2e
def test_random_walk_explores_without_crashing(miniwob_env, catalog):
    walker = make_policy("random_walk")
    for task_id in ("email-inbox-forward", "multi-orderings", "use-spinner"):
        task = catalog[task_id]
        record = run_episode(miniwob_env, walker, task.spec, 5, episode_id=task_id, max_steps=15)
        assert 1 <= record.n_steps <= 15 and record.steps[-1].done
        assert {s.action.type for s in record.steps} <= miniwob_env.supported_actions
        assert milestone_track_matches(record, task.spec)


def test_a_long_tmpdir_does_not_stop_the_browser(tmp_path, monkeypatch, catalog):
    """Chromium's singleton socket lives under $TMPDIR; past 107 bytes the browser exited at its
    start. The environment makes its folder (the browser's TMPDIR inside) under /tmp then, and
    removes it on close."""
    import shutil
    import tempfile

    from envs.miniwob.live import SOCKET_PATH_LIMIT, MiniWoBEnv, scratch_base

    long_dir = tmp_path / ("x" * 80)
    long_dir.mkdir()
    assert len(str(long_dir)) + 46 > SOCKET_PATH_LIMIT
    assert scratch_base(str(long_dir)) == "/tmp"
    short_tmpdir = tempfile.mkdtemp(dir="/tmp")
    try:  # a short TMPDIR is where the folder is made
        assert scratch_base(short_tmpdir) == short_tmpdir
    finally:
        shutil.rmtree(short_tmpdir)
    monkeypatch.setenv("TMPDIR", str(long_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the folder it chose
    env = MiniWoBEnv()
    try:
        (scratch,) = env.scratch_paths
        assert scratch.startswith("/tmp/stepwise-env-") and env._browser_tmpdir == f"{scratch}/tmp"
        observation = env.reset(catalog["click-option"].spec, 3)
        assert observation.screen.elements
    finally:
        env.close()
    assert not Path(scratch).exists()


def test_a_killed_browser_leaves_no_folder_behind(catalog):
    """Chromium makes a folder for its singleton socket under TMPDIR and removes it only on a clean
    exit: every browser killed with its worker left one in /tmp. The browser's TMPDIR and profile
    are now inside the environment's own folder (its scratch path, which the pool removes for a
    killed worker), so they go with it."""
    import glob
    import signal

    from envs.miniwob.live import MiniWoBEnv

    env = MiniWoBEnv()
    (scratch,) = env.scratch_paths
    try:
        assert env._browser_tmpdir == f"{scratch}/tmp" and env._profile_dir == f"{scratch}/profile"
        env.reset(catalog["click-option"].spec, 3)
        assert glob.glob(f"{scratch}/tmp/org.chromium.Chromium.*/SingletonSocket"), "the socket is in the env's folder"
        for pid in env.browser_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        env.close()
    assert not Path(scratch).exists()


def test_the_folder_of_an_environment_whose_process_died_is_removed_by_the_next_one():
    """A worker killed with its parent (a test run or CI job cut off) cannot remove its folder, nor
    can the pool: the next environment made on the machine removes it (its owner is gone)."""
    import signal
    import subprocess
    import sys

    from envs.miniwob.live import MiniWoBEnv

    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from envs.miniwob.live import MiniWoBEnv; e = MiniWoBEnv(); "
         "print(e.scratch_paths[0], flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        import select

        assert select.select([owner.stdout], [], [], 60)[0], "the child made no environment within 60 s"
        scratch = owner.stdout.readline().strip()
        # before the kill: after it, another test's new environment may rightly reap the folder
        assert Path(scratch, "profile").is_dir()
    finally:
        os.killpg(owner.pid, signal.SIGKILL)  # the process and its browser, as die_with_parent ends a worker
        owner.wait()
    with MiniWoBEnv() as env:
        assert not Path(scratch).exists()
        assert Path(env.scratch_paths[0]).exists()  # a live environment's folder is never taken


def test_an_environments_folder_without_a_browser(tmp_path, monkeypatch):
    """Its layout, owner and removal (no Chromium: the driver's start is replaced): the profile and
    the browser's TMPDIR in one owned folder, a profile the config names left where it is and out of
    the scratch paths, and the folder removed on close and when the browser cannot start."""
    import json

    from envs.miniwob import live
    from envs.scratch import OWNER_FILE

    monkeypatch.setattr(live._ChromiumInstance, "create_driver", lambda self: None)
    env = live.MiniWoBEnv()
    (scratch,) = env.scratch_paths
    assert Path(scratch).name.startswith(live.SCRATCH_PREFIX)
    assert sorted(p.name for p in Path(scratch).iterdir()) == sorted(["profile", "tmp", OWNER_FILE])
    assert json.loads(Path(scratch, OWNER_FILE).read_text())["pid"] == os.getpid()
    assert env._instance.tmpdir == f"{scratch}/tmp" and env._instance.profile_dir == f"{scratch}/profile"
    env.close()
    assert not Path(scratch).exists()

    mine = tmp_path / "my-profile"
    env = live.MiniWoBEnv(live.MiniWoBConfig(profile_dir=str(mine)))
    (scratch,) = env.scratch_paths
    assert env._instance.profile_dir == str(mine) and sorted(p.name for p in Path(scratch).iterdir()) == [
        OWNER_FILE,
        "tmp",
    ]
    env.close()
    assert mine.is_dir() and not Path(scratch).exists()

    made: list[str] = []

    def fails(self) -> None:
        made.append(self.tmpdir)
        raise RuntimeError("no browser")

    monkeypatch.setattr(live._ChromiumInstance, "create_driver", fails)
    with pytest.raises(RuntimeError, match="no browser"):
        live.MiniWoBEnv()
    assert made and not Path(made[0]).parent.exists()


def test_the_episode_clock_can_be_set_for_slow_policies(catalog):
    """MiniWoB++ ends an episode as failed when its clock (10 s) runs out: an LLM thinking 5-10 s a
    step on a CPU lost every episode to it. ``episode_max_time_ms`` sets the clock."""
    import time

    from envs.miniwob.live import MiniWoBConfig, MiniWoBEnv

    nothing = Action(ActionType.NOTHING)
    with MiniWoBEnv(MiniWoBConfig(episode_max_time_ms=1500)) as short, MiniWoBEnv(MiniWoBConfig()) as benchmark:
        for env in (short, benchmark):
            env.reset(catalog["click-option"].spec, 5)
        time.sleep(2.5)
        expired = short.step(nothing)
        assert expired.done and not expired.success and expired.info["raw_reward"] < 0
        assert not benchmark.step(nothing).done  # the benchmark's 10 s have not run out


def _both_states(driver):
    """The state as the state script's JSON text, and as WebDriver itself serialises it (the object,
    value by value: what the environment read before), from one synchronous script, so that the
    page cannot change between the two reads. Each DOM read numbers text nodes anew
    (core.nextTextRefCode counts down): both start from the same number."""
    from envs.miniwob.live import _STATE_JS, parse_state

    text, webdriver = driver.execute_script(
        _STATE_JS + "core.nextTextRefCode = -1; var text = __stepwiseState(); core.nextTextRefCode = -1;"
        " return [text, {done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,"
        " reason: WOB_REWARD_REASON, dom: core.getDOMInfo()}];"
    )
    state = parse_state(text)
    assert isinstance(state.pop("wheels"), int) and isinstance(state.pop("scrolls"), int)
    return state, webdriver


def test_the_state_as_json_text_is_what_webdriver_serialised(miniwob_env, catalog):
    """The state scripts return one JSON text (cheaper than WebDriver's value-by-value conversion on
    a large page): it must hold exactly what WebDriver's own serialisation held, on every catalog
    task's first screen, after an episode's end, and with SVG elements (whose
    className is an object)."""
    driver = miniwob_env._instance.driver
    for task in catalog.values():
        miniwob_env.reset(task.spec, 17)
        state, webdriver = _both_states(driver)
        assert state == webdriver, task.task_id
    expert = make_policy("expert")
    for task_id in ("email-inbox-forward-nl", "use-spinner", "login-user"):
        task = catalog[task_id]
        record = run_episode(miniwob_env, expert, task.spec, 23, episode_id=task_id, max_steps=task.max_steps)
        assert record.success
        state, webdriver = _both_states(driver)
        assert state["done"] and state == webdriver, task_id
    miniwob_env._instance.open_task("click-shape")  # not a catalog task: its shapes are SVG
    driver.execute_script("Math.seedrandom(5); core.startEpisodeReal();")
    svg, webdriver = _both_states(driver)
    assert svg == webdriver
    assert any(isinstance(node.get("classes"), dict) for node in _nodes(svg["dom"]))


def _nodes(node):
    yield node
    for child in node.get("children") or ():
        yield from _nodes(child)


def test_a_scroll_over_a_body_overflowing_its_fixed_height_expects_no_scroll(miniwob_env, catalog):
    """The forward form overflows the task's 210 px body, visibly, in a viewport with room for it:
    a wheel there scrolls nothing, and the scroll must say so a frame after its wheel, not wait
    for a scroll event that never comes (it did: 1 s a scroll, a third of the learned policy's step
    time on the sparse block)."""
    observation = miniwob_env.reset(catalog["email-inbox-forward-nl"].spec, 3)

    def element(screen, selector):  # a task spec's selector, as the expert reads it
        return next(e for e in screen.elements if element_matches(e, selector, observation.fields))

    sender = element(observation.screen, {"classes_contains": "email-sender", "text": "{by}"})
    opened = miniwob_env.step(Action(ActionType.CLICK, sender)).screen
    miniwob_env.step(Action(ActionType.CLICK, element(opened, {"classes_contains": "email-forward"})))
    form = miniwob_env._to_screen(miniwob_env._state())  # the form's icons come after the click's screen
    result = miniwob_env.step(Action(ActionType.SCROLL, by_id(form, "forward-text"), direction="DOWN"))
    driver = miniwob_env._instance.driver
    assert driver.execute_script("return document.body.scrollHeight > document.body.clientHeight")
    assert driver.execute_script("return window.__stepwiseScrollEnd") == "nothing to scroll"
    assert result.problem is None and result.screen == form


def test_a_scroll_shows_the_screens_that_waiting_out_the_wheel_showed(miniwob_env, catalog, monkeypatch):
    """A scroll no longer sleeps out the wheel action's 150 ms (miniwob's execute_scroll_coords):
    it returns once the page received the wheel event. The screens are those the old path gave,
    scroll by scroll, the screen 150 ms later is the same, and the scrolls took effect."""
    import time

    import envs.miniwob.live as live

    directions = ("DOWN", "UP", "DOWN", "DOWN", "UP")

    def scrolled(task_id, seed):
        miniwob_env._instance.subdomain = None  # a fresh page: scroll positions outlive an episode
        screens = [miniwob_env.reset(catalog[task_id].spec, seed).screen]
        for direction in directions:
            result = miniwob_env.step(Action(ActionType.SCROLL, direction=direction))
            assert result.problem is None
            screens.append(result.screen)
            time.sleep(0.15)
            if live._SCROLLS:  # our scroll: it waited for what the page could do, no longer
                ended = miniwob_env._instance.driver.execute_script("return window.__stepwiseScrollEnd")
                assert ended in ("scroll", "nothing to scroll"), (task_id, direction, ended)
            later = miniwob_env._to_screen(miniwob_env._state())
            # On a failure, say what moved after the scroll returned (which elements, where).
            pairs = zip(result.screen.elements, later.elements, strict=False)
            moved = [(a.ref, a.bounds, b.bounds) for a, b in pairs if a != b]
            assert later == result.screen, (task_id, direction, live._SCROLLS, moved[:5])
        return screens

    # Which scrolls move the page (either way): every one; the inbox's first only; none, where
    # nothing under the wheel scrolls (the scroll ends a frame after its wheel arrived).
    moving = {
        "social-media": [True] * 5,
        "email-inbox-nl-turk": [True] * 5,
        "email-inbox-forward-nl": [True] + [False] * 4,
        "use-spinner": [False] * 5,
    }
    for task_id, expected in moving.items():
        with monkeypatch.context() as patched:
            patched.setattr(live, "_SCROLLS", frozenset())  # miniwob's own scroll, with its 150 ms
            before = scrolled(task_id, 3)
        after = scrolled(task_id, 3)
        assert after == before, task_id
        assert [a != b for a, b in zip(after[:-1], after[1:], strict=True)] == expected, task_id
    # A scroll aimed at an element whose page has nothing to scroll there.
    observation = miniwob_env.reset(catalog["search-engine"].spec, 4)
    result = miniwob_env.step(Action(ActionType.SCROLL, observation.screen.elements[-1], direction="DOWN"))
    assert result.problem is None and result.screen == observation.screen
