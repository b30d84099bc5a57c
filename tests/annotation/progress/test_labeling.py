"""Improved-mode rewriting and cleaning, LCS and milestone labels, quality metrics, synthesis."""

import dataclasses
import random

import pytest

from annotation.progress.instruction_relative import (
    INSTRUCTION_PLACEHOLDER,
    clean_trajectory,
    garbage_mask,
    relative_action,
    relative_text,
)
from annotation.progress.label_runs import milestone_origins_line
from annotation.progress.labeling import (
    FROM_RECORD,
    FROM_UNVERSIONED_RECORD,
    KEPT_STALE,
    REPLAYED,
    REPLAYED_STALE,
    env_labels,
    label_quality,
    lcs_labels,
    milestone_hits,
    milestones_with_origin,
)
from annotation.progress.split import training_split
from annotation.progress.synthesis import (
    insert_noop,
    mismatched_instruction,
    random_walk,
    remove_noops,
    synthesize,
)
from annotation.progress.text_similarity import HashingTextEmbedder
from envs.tasks import task_spec_from_mapping
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.trajectories import Trajectory

ROOT = UIElement(ref="0", role="body", bounds=(0, 0, 160, 210))
BUTTON = UIElement(ref="3", role="button", element_id="subbtn", text="Login", bounds=(5, 170, 80, 200), depth=1)


def login_screen(user="", password=""):
    return Screen(
        (
            ROOT,
            UIElement(
                ref="1",
                role="textbox",
                element_id="username",
                value=user,
                editable=True,
                bounds=(5, 80, 120, 100),
                depth=1,
            ),
            UIElement(
                ref="2",
                role="password",
                element_id="password",
                value=password,
                editable=True,
                bounds=(5, 130, 120, 150),
                depth=1,
            ),
            BUTTON,
        )
    )


def login_trajectory(episode_id, user, password, *, detour=False, success=True, finish=True):
    instruction = f'Enter the username "{user}" and the password "{password}" into the text fields and press login.'
    s0, s1, s2 = login_screen(), login_screen(user), login_screen(user, password)
    steps = [
        (s0, Action(ActionType.CLICK, target=s0.elements[1])),
        (s0, Action(ActionType.INPUT, s0.elements[1], user)),
    ]
    if detour:  # scroll down and back up: garbage
        steps += [(s1, Action(ActionType.SCROLL, direction="DOWN")), (s1, Action(ActionType.SCROLL, direction="UP"))]
    steps += [(s1, Action(ActionType.INPUT, s1.elements[2], password))]
    if finish:
        steps += [(s2, Action(ActionType.CLICK, target=BUTTON))]
    return Trajectory(
        episode_id=episode_id,
        task_id="login-user",
        instruction=instruction,
        source="human_demo",
        success=success,
        actions=tuple(a for _, a in steps),
        screens=tuple(s for s, _ in steps),
    )


LOGIN_SPEC = task_spec_from_mapping(
    {
        "task_id": "login-user",
        "instruction": 'Enter the username "(?P<username>[^"]*)" and the password "(?P<password>[^"]*)"',
        "milestones": [
            {"name": "user", "when": {"field_value": {"element": {"element_id": "username"}, "equals": "{username}"}}},
            {"name": "pass", "when": {"field_value": {"element": {"element_id": "password"}, "equals": "{password}"}}},
            {"name": "login", "when": {"clicked": {"element_id": "subbtn"}}},
        ],
    }
)


def corpus():
    return [
        login_trajectory("a", "vanda", "x1"),
        login_trajectory("b", "rex", "qq", detour=True),
        login_trajectory("c", "lyda", "ESE"),
        login_trajectory("f", "annis", "zz", success=False, finish=False),
    ]


def test_relative_texts():
    instruction = 'For the user @morbi, click on the "Mute" button.'
    assert relative_text("Mute @morbi", instruction) == f"{INSTRUCTION_PLACEHOLDER} {INSTRUCTION_PLACEHOLDER}"
    assert (
        relative_text("Book flight for $349", "Book a flight")
        == f"{INSTRUCTION_PLACEHOLDER} {INSTRUCTION_PLACEHOLDER} for $#"
    )
    assert relative_text("morbid", instruction) == "morbid"  # whole words only
    like = UIElement(ref="9", role="span", classes="like ui-state-hover", element_id="ui-id-17")
    rewritten = relative_action(Action(ActionType.CLICK, target=like), None, 'click on the "Like" button')
    assert (rewritten.target.element_id, rewritten.target.classes) == ("", INSTRUCTION_PLACEHOLDER)


def test_garbage_is_what_comes_back_to_an_earlier_state():
    t = login_trajectory("b", "rex", "qq", detour=True)
    assert garbage_mask(t.screens, t.n_steps) == [True, False, True, True, False, False]
    cleaned = clean_trajectory(t.actions, t.screens, t.instruction)
    assert cleaned.kept_step_indices == (1, 4, 5) and cleaned.garbage_step_indices == (0, 2, 3)
    assert cleaned.actions[0].text == INSTRUCTION_PLACEHOLDER


def test_improved_labels_match_milestones_and_paper_mode_does_not():
    trajectories = corpus()
    embed = HashingTextEmbedder()
    env = env_labels(trajectories, {"login-user": LOGIN_SPEC})
    improved = lcs_labels(trajectories, embed, "improved")
    paper = lcs_labels(trajectories, embed, "paper")
    assert len(improved.recipe_rows) == 1 and improved.recipe_rows[0]["length"] == 3
    for run in (improved, paper, env):
        by_episode = {}
        for r in run.label_rows:
            by_episode.setdefault(r["episode_id"], []).append(r["progress"])
            assert 0.0 <= r["progress"] <= 1.0
        assert all(p == sorted(p) for p in by_episode.values())  # non-decreasing
    task_of = {t.episode_id: t.task_id for t in trajectories}
    quality = {
        q.method: q
        for q in label_quality(improved.label_rows + paper.label_rows, env.label_rows, task_of, {"login-user": "dev"})
    }
    assert quality["improved"].key_step_progress_error == 0.0
    assert quality["improved"].key_step_precision == quality["improved"].key_step_recall == 1.0
    # The paper's match compares raw usernames ("vanda" vs "rex"): its trajectories are too
    # dissimilar to group (Sim < 0.6), so it has no recipe and labels nothing, saying why.
    assert "paper" not in quality and paper.label_rows == []
    assert "no group" in paper.task_notes["login-user"]
    failed = [r["progress"] for r in improved.label_rows if r["episode_id"] == "f"]
    assert failed == pytest.approx([0, 1 / 3, 2 / 3])


def test_a_task_with_one_success_gets_no_labels_and_says_why():
    trajectories = [login_trajectory("a", "vanda", "x1"), login_trajectory("f", "rex", "q", success=False)]
    run = lcs_labels(trajectories, HashingTextEmbedder(), "improved")
    assert run.label_rows == [] and "only one successful" in run.task_notes["login-user"]
    assert set(run.unlabelled) == {"a", "f"}


def test_synthesis_kinds_and_parents():
    rng = random.Random(0)
    a, b = corpus()[0], corpus()[1]
    other = Trajectory("z", "enter-text", 'Enter "hi" into the text field', "human_demo", True, a.actions, a.screens)
    mismatched = mismatched_instruction(a, other)
    assert (mismatched.task_id, mismatched.success, mismatched.parent_episode_id) == ("enter-text", False, "a")
    walk = random_walk(a, rng)
    assert walk.source == "synthetic:random_walk" and not walk.success and walk.n_steps >= 1
    inserted = insert_noop(a, rng)
    assert inserted.success and inserted.n_steps in (a.n_steps + 1, a.n_steps + 2)
    rollout = dataclasses.replace(a, source="rollout", final_screen=a.screens[-1], spec_digest="0123456789abcdef")
    child = insert_noop(rollout, rng)  # its steps end elsewhere, and no spec recorded its milestones
    assert child.final_screen is None and child.spec_digest is None and child.milestones_hit is None
    removed = remove_noops(b)
    assert removed.success and removed.n_steps == 3 and removed.parent_episode_id == "b"
    assert remove_noops(login_trajectory("c", "lyda", "ESE")) is not None  # its focus click has no effect
    many = synthesize(corpus() * 5, seed=1)
    assert {t.source for t in many} <= {
        "synthetic:mismatched_instruction",
        "synthetic:random_walk",
        "synthetic:noop_inserted",
        "synthetic:noop_removed",
    }
    assert len({t.episode_id for t in many}) == len(many)


def test_training_split_balances_steps():
    trajectories = [login_trajectory(f"s{i}", f"u{i}", "p") for i in range(40)] + [
        login_trajectory(f"f{i}", f"v{i}", "p", success=False, detour=True, finish=False) for i in range(60)
    ]
    rows = training_split(trajectories, seed=0)
    assert {r.split for r in rows} == {"train", "validation", "test"}
    train = [r for r in rows if r.split == "train"]
    ok = sum(len(r.sampled_steps) for r in train if r.success)
    failed = sum(len(r.sampled_steps) for r in train if not r.success)
    assert 0.75 < ok / failed < 1.33
    again = training_split(trajectories, seed=0)
    assert again == rows  # deterministic


def test_empty_trajectories_and_unknown_action_types_are_reported_not_fatal():
    from warehouse.trajectories import action_from_row

    odd = action_from_row({"action_type": "TELEPORT", "action_text": "TELEPORT()"}, Screen(()))
    assert odd.type is ActionType.UNKNOWN and "TELEPORT" in odd.detail
    good = corpus()
    weird = login_trajectory("w", "zed", "pw")
    weird = Trajectory(**{**weird.__dict__, "actions": (odd, *weird.actions[1:])})
    empty = Trajectory("e", "login-user", "x", "human_demo", False, (), ())
    run = lcs_labels([*good, weird, empty], HashingTextEmbedder(), "improved")
    assert "empty trajectory" in run.unlabelled["e"] and "login-user" in run.unlabelled["e"]
    assert "unknown action type" in run.step_notes["w"]
    assert {r["episode_id"] for r in run.label_rows} >= {"a", "b", "c", "f", "w"}


def test_replayed_milestones_replace_those_recorded_under_an_older_spec():
    """A rollout recorded online under an older spec that knew only the username: its labels keep
    that record by default; with ``replay_milestones`` they follow the spec in hand. Without screens
    there is nothing to replay, and the record stays."""
    rollout = dataclasses.replace(
        login_trajectory("r", "vanda", "x1"), source="rollout", milestones_hit=((), ("user",), (), ())
    )

    def progress(run):
        return [r["progress"] for r in run.label_rows]

    specs = {"login-user": LOGIN_SPEC}
    assert progress(env_labels([rollout], specs)) == [0.0] + [pytest.approx(1 / 3)] * 3
    assert progress(env_labels([rollout], specs, replay_milestones=True)) == [
        0.0,
        pytest.approx(1 / 3),
        pytest.approx(2 / 3),
        1.0,
    ]
    blind = dataclasses.replace(rollout, screens=())
    assert milestone_hits(blind, LOGIN_SPEC, replay=True) == rollout.milestones_hit
    unfit = dataclasses.replace(rollout, instruction="Log in, please")  # the template does not fit it
    assert milestone_hits(unfit, LOGIN_SPEC, replay=True) == rollout.milestones_hit


#: An older version of LOGIN_SPEC, which knew only the username.
USER_ONLY_SPEC = task_spec_from_mapping(
    {
        "task_id": "login-user",
        "instruction": 'Enter the username "(?P<username>[^"]*)" and the password "(?P<password>[^"]*)"',
        "milestones": [
            {"name": "user", "when": {"field_value": {"element": {"element_id": "username"}, "equals": "{username}"}}}
        ],
    }
)


def test_milestones_recorded_under_another_version_of_the_spec_are_replayed_and_this_versions_kept():
    """A rollout stores the digest of the spec that recorded its milestones: the labels replay the
    spec in hand exactly where that digest is another's, without being asked to, and keep the
    record where it is the same spec's (the record is deliberately short of the replay here, so
    the test sees which one the labels used)."""
    recorded = ((), ("user",), (), ())
    rollout = dataclasses.replace(
        login_trajectory("r", "vanda", "x1"), source="rollout", milestones_hit=recorded, spec_digest=None
    )
    assert USER_ONLY_SPEC.milestone_digest != LOGIN_SPEC.milestone_digest
    stale = dataclasses.replace(rollout, spec_digest=USER_ONLY_SPEC.milestone_digest)
    current = dataclasses.replace(rollout, spec_digest=LOGIN_SPEC.milestone_digest)
    replayed = ((), ("user",), ("pass",), ("login",))
    assert milestone_hits(stale, LOGIN_SPEC) == replayed
    assert milestone_hits(current, LOGIN_SPEC) == recorded
    assert milestone_hits(rollout, LOGIN_SPEC) == recorded  # no digest stored: nothing says it is stale
    blind_stale = dataclasses.replace(stale, screens=())
    assert milestones_with_origin(blind_stale, LOGIN_SPEC) == (recorded, KEPT_STALE)  # nothing to replay
    # loaded without its screens (placeholders): kept as well, never replayed over blank screens
    unloaded = dataclasses.replace(
        stale, screens=tuple(Screen(()) for _ in stale.screens), final_screen=None, screens_loaded=False
    )
    assert milestones_with_origin(unloaded, LOGIN_SPEC) == (recorded, KEPT_STALE)
    with pytest.raises(ValueError, match="episode r: loaded without its screens"):
        milestone_hits(dataclasses.replace(unloaded, milestones_hit=None), LOGIN_SPEC)
    assert milestone_hits(current, LOGIN_SPEC, replay=True) == replayed
    run = env_labels([stale, dataclasses.replace(current, episode_id="k")], {"login-user": LOGIN_SPEC})
    by_episode: dict[str, list[float]] = {}
    for row in run.label_rows:
        by_episode.setdefault(row["episode_id"], []).append(row["progress"])
    assert by_episode["r"] == [0.0, pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0]
    assert by_episode["k"] == [0.0] + [pytest.approx(1 / 3)] * 3
    # a run counts where its milestones came from, and says what an unversioned record needs
    run = env_labels(
        [stale, current, dataclasses.replace(rollout, episode_id="u"), corpus()[0]], {"login-user": LOGIN_SPEC}
    )
    assert run.milestone_origins == {REPLAYED_STALE: 1, FROM_RECORD: 1, FROM_UNVERSIONED_RECORD: 1, REPLAYED: 1}
    line = milestone_origins_line(run.milestone_origins)
    assert "1 recorded online, 1 recorded online, spec version not stored, 1 replayed, " in line
    assert "the 1 without a stored spec version cannot be checked" in line and "--replay-milestones" in line
    assert "--replay-milestones" not in milestone_origins_line({FROM_RECORD: 3})


def test_the_replay_reads_the_final_screen_a_rollout_stored():
    """After the last step the replay reads the stored final screen, what the online tracker saw;
    without one, the last screen before the action stands in (it cannot show what a click opened)."""
    spec = task_spec_from_mapping(
        {
            "task_id": "login-user",
            "instruction": LOGIN_SPEC.instruction.pattern,
            "milestones": [{"name": "welcome", "when": {"visible": {"text": "Welcome"}}}],
        }
    )
    trajectory = dataclasses.replace(login_trajectory("w", "vanda", "x1"), source="rollout")
    welcome = Screen((ROOT, UIElement(ref="9", role="text", text="Welcome", bounds=(5, 20, 120, 40), depth=1)))
    assert milestone_hits(trajectory, spec) == ((), (), (), ())
    assert milestone_hits(dataclasses.replace(trajectory, final_screen=welcome), spec) == ((), (), (), ("welcome",))


def test_digests_follow_what_decides_the_milestones():
    """The digest changes with a milestone's name or predicate and with the instruction template, and
    not with the solution or the file the spec came from; the same spec loaded twice has the same one."""
    mapping = {
        "task_id": "login-user",
        "instruction": 'Enter the username "(?P<username>[^"]*)"',
        "milestones": [
            {"name": "user", "when": {"field_value": {"element": {"element_id": "username"}, "equals": "{username}"}}}
        ],
    }
    digest = task_spec_from_mapping(mapping).milestone_digest
    assert task_spec_from_mapping(dict(mapping)).milestone_digest == digest and len(digest) == 16
    assert task_spec_from_mapping(mapping, source="elsewhere.yaml").milestone_digest == digest
    with_solution = {**mapping, "solution": [{"click": {"element_id": "subbtn"}}]}
    assert task_spec_from_mapping(with_solution).milestone_digest == digest
    renamed = {**mapping, "milestones": [{**mapping["milestones"][0], "name": "username"}]}
    other_field = {
        **mapping,
        "milestones": [
            {"name": "user", "when": {"field_value": {"element": {"element_id": "user"}, "equals": "{username}"}}}
        ],
    }
    other_template = {**mapping, "instruction": 'Type the username "(?P<username>[^"]*)"'}
    others = {task_spec_from_mapping(m).milestone_digest for m in (renamed, other_field, other_template)}
    assert len(others) == 3 and digest not in others
    # a record is of another version exactly when it stored a digest and not this one
    spec = task_spec_from_mapping(mapping)
    assert not spec.is_other_version(digest) and not spec.is_other_version(None)
    assert all(spec.is_other_version(other) for other in others)


def test_a_new_meaning_of_the_predicates_makes_every_record_stale(monkeypatch):
    """Bumping the predicates' semantics version changes every spec's digest, so milestones recorded
    before count as recorded under another spec and are replayed."""
    import envs.tasks

    before = task_spec_from_mapping({"task_id": "t", "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}]})
    digest = before.milestone_digest
    monkeypatch.setattr(envs.tasks, "MILESTONE_SEMANTICS_VERSION", "next")
    after = task_spec_from_mapping({"task_id": "t", "milestones": [{"name": "m", "when": {"visible": {"text": "x"}}}]})
    assert after.milestone_digest != digest
