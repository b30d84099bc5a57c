"""``envs.spec_validation``: load errors by file and field, milestone reach of recorded successes
and failures, unfilled slots, instructions that do not fit, stale online milestones; the report as
text; episodes from a warehouse (by task or variant, one source)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from envs.spec_validation import (
    NO_VERSION,
    OTHER_VERSION,
    THIS_VERSION,
    format_report,
    milestone_slot_uses,
    replay_milestones,
    validate_specs,
    warehouse_episodes,
)
from envs.tasks import TaskSpecError, task_spec_from_mapping
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.purposes import EpisodePurpose
from warehouse.trajectories import Trajectory, trajectories_to_tables

LINKS = """\
task_id: click-link
instruction: 'Click the link "(?P<link>[^"]+)"(?: and then "(?P<then>[^"]+)")?'
milestones:
  - name: link in view
    when: {visible: {role: link, text: "{link}"}}
  - name: link clicked
    when: {clicked: {role: link, text: "{link}"}}
  - name: second link clicked
    when: {any: [{clicked: {role: link, text: "{then}"}}, {episode_success: true}]}
"""


def screen(*links: str) -> Screen:
    root = UIElement(ref="0", role="body", bounds=(0, 0, 160, 210))
    return Screen(
        (
            root,
            *(
                UIElement(ref=str(i + 1), role="link", text=t, bounds=(0, 10 * i, 50, 10 * i + 9), depth=1)
                for i, t in enumerate(links)
            ),
        )
    )


def episode(episode_id: str, instruction: str, clicks: list[str], success: bool, **extra) -> Trajectory:
    page = screen("a", "b", "c")
    actions = tuple(Action(ActionType.CLICK, target=next(e for e in page.elements if e.text == c)) for c in clicks)
    return Trajectory(
        episode_id=episode_id,
        task_id=extra.pop("task_id", "click-link"),
        instruction=instruction,
        source=extra.pop("source", "human_demo"),
        success=success,
        actions=actions,
        screens=(page,) * len(actions),
        **extra,
    )


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "click-link.yaml").write_text(LINKS)
    (tmp_path / "broken.yaml").write_text(
        LINKS.replace("task_id: click-link", "task_id: broken").replace("visible", "glows")
    )
    (tmp_path / "zz-again.yml").write_text(LINKS)  # the same task id twice, read last
    nested = tmp_path / "more"
    nested.mkdir()
    (nested / "bad-count.yaml").write_text(
        "task_id: boxes\ninstruction: 'Select (?P<words>.+)'\nmilestones:\n"
        "  - {name: all, when: {count: {slot: words, at_least: none, each: {checked: {labelled: '{item}'}}}}}\n"
    )
    return tmp_path


def test_load_errors_are_reported_per_file_and_field(folder):
    report = validate_specs(folder)
    errors = {e.file.rsplit("/", 1)[-1]: e.message for e in report.errors}
    assert set(errors) == {"broken.yaml", "zz-again.yml", "bad-count.yaml"}
    assert "milestones[0].when" in errors["broken.yaml"] and "unknown predicate 'glows'" in errors["broken.yaml"]
    assert "already defined in" in errors["zz-again.yml"]
    assert "milestones[0].when.count.at_least" in errors["bad-count.yaml"]
    assert [t.task_id for t in report.tasks] == ["click-link"]
    assert not report.ok
    with pytest.raises(TaskSpecError, match="not found"):
        validate_specs(folder / "missing")


def test_milestone_reach_and_its_warnings(folder):
    trajectories = [
        episode("s1", 'Click the link "a" and then "b"', ["a", "b"], True),
        episode("s2", 'Click the link "a"', ["c", "a", "c"], True),
        episode("f1", 'Click the link "a" and then "b"', ["a", "c"], False),
        episode("f2", 'Click the link "b"', ["c"], False),
        episode("x1", "Press the button", ["a"], True),  # the template does not fit
        episode("other", "whatever", ["a"], True, task_id="another-task"),  # no spec: left out
    ]
    report = validate_specs(folder, trajectories)
    (task,) = report.tasks
    assert (task.successes, task.failures, task.unfit, task.unfit_example) == (2, 2, 1, "Press the button")
    assert [(m.successes, m.failures) for m in task.milestones] == [(2, 2), (2, 1), (2, 0)]
    assert not task.unreached and not task.failures_all_complete
    # {then} is unfilled when the instruction names one link: stays literal, matches nothing
    (gap,) = task.slot_gaps
    assert (gap.slot, gap.episodes, gap.fields) == ("then", 2, ("milestones[2].when.any[0].clicked.text",))
    problems = report.problems()
    gap_line = next(p for p in problems if "{then}" in p)
    assert "click-link.yaml (task click-link)" in gap_line and "milestones[2].when.any[0].clicked.text" in gap_line
    assert "unfilled for 2 recorded instruction(s)" in gap_line and "literal text {then}" in gap_line
    assert any("field 'instruction' does not fit 1" in p for p in problems)
    assert all(len(p.splitlines()) == 1 for p in problems)


def test_unreached_milestones_and_indiscriminate_ones_are_flagged(tmp_path):
    (tmp_path / "t.yaml").write_text(
        LINKS.replace('{clicked: {role: link, text: "{link}"}}', "{clicked: {role: button}}")
    )
    trajectories = [
        episode("s1", 'Click the link "a"', ["a"], True),
        episode("f1", 'Click the link "a"', ["a"], False),
    ]
    (task,) = validate_specs(tmp_path, trajectories).tasks
    assert [m.name for m in task.unreached] == ["link clicked", "second link clicked"]
    assert task.milestones[1].missed_by == "s1"
    (tmp_path / "t.yaml").write_text(LINKS.replace("{episode_success: true}", "{visible: {role: body}}"))
    report = validate_specs(tmp_path, trajectories)
    assert report.tasks[0].failures_all_complete
    text = format_report(report)
    assert "all 1 failed episodes reach the last milestone" in text


def test_stale_online_milestones_are_flagged(folder):
    recorded = episode("r1", 'Click the link "a"', ["a"], True, source="rollout", milestones_hit=(("first link",),))
    (task,) = validate_specs(folder, [recorded]).tasks
    assert task.stale_recorded == 1 and task.stale_example == "r1"
    # the replay checks the spec in hand, not what was recorded online
    assert task.milestones[0].successes == 1


def test_count_lists_and_items_are_not_unfilled_slots():
    spec = task_spec_from_mapping(
        {
            "task_id": "boxes",
            "instruction": "Select (?:nothing|(?P<words>.+?)) and click Submit",
            "milestones": [
                {"name": "all", "when": {"count": {"slot": "words", "each": {"checked": {"labelled": "{item}"}}}}},
                {"name": "x", "when": {"not": {"visible": {"text": "{words}"}}}},
            ],
        }
    )
    assert milestone_slot_uses(spec) == {"words": ["milestones[1].when.not.visible.text"]}


def test_replay_uses_the_next_screen_and_the_typed_text_at_the_end():
    spec = task_spec_from_mapping(
        {
            "task_id": "enter-text",
            "instruction": 'Enter "(?P<text>[^"]*)"',
            "milestones": [
                {"name": "typed", "when": {"field_value": {"element": {"element_id": "tt"}, "equals": "{text}"}}}
            ],
        }
    )
    field = UIElement(ref="1", role="textbox", element_id="tt", value="", editable=True, depth=1)
    page = Screen((UIElement(ref="0", role="body", bounds=(0, 0, 100, 100)), field))
    typed = Trajectory(
        "e", "enter-text", 'Enter "hi"', "human_demo", True, (Action(ActionType.INPUT, field, "hi"),), (page,)
    )
    assert replay_milestones(spec, typed).hits == (("typed",),)


def test_episodes_from_a_warehouse_by_task_or_variant(home, tmp_path):
    (tmp_path / "click-link.yaml").write_text(LINKS)
    (tmp_path / "variant.yaml").write_text(LINKS.replace("task_id: click-link", "task_id: click-link-nl"))
    demos = [
        episode("demo:1", 'Click the link "a"', ["a"], True),
        episode("demo:2", 'Click the link "b"', ["b"], False),
        episode("demo:3", 'Click the link "a"', ["a"], True, fields={"task_variant": "click-link-nl"}),
        episode("roll:1", 'Click the link "a"', ["a"], True, source="rollout"),
    ]
    warehouse = Warehouse()
    episodes, steps = trajectories_to_tables(
        demos, created_at=datetime.now(UTC), run_id=None, purpose=EpisodePurpose.DEMONSTRATION
    )
    m = Materialization(asset="test")
    warehouse.publish(
        m, [warehouse.stage_table("episodes", "t", episodes, m), warehouse.stage_table("steps", "t", steps, m)]
    )
    load = warehouse_episodes(warehouse)
    assert sorted(t.episode_id for t in load("click-link")) == ["demo:1", "demo:2", "demo:3"]
    assert [t.episode_id for t in load("click-link-nl")] == ["demo:3"]
    assert [t.episode_id for t in warehouse_episodes(warehouse, "rollout")("click-link")] == ["roll:1"]
    assert not list(warehouse_episodes(warehouse, "rollout", purpose="evaluation")("click-link"))
    assert [t.episode_id for t in warehouse_episodes(warehouse, purpose="demonstration")("click-link-nl")] == ["demo:3"]
    sample = [t.episode_id for t in warehouse_episodes(warehouse, per_task=2)("click-link")]
    assert len(sample) == 2 and sample == [
        t.episode_id for t in warehouse_episodes(warehouse, per_task=2)("click-link")
    ]
    with pytest.raises(ValueError, match="unknown episode purposes"):
        warehouse_episodes(warehouse, purpose="holiday")
    report = validate_specs(tmp_path, [demos[0]], load=load)  # given and loaded: counted once
    by_task = {t.task_id: t for t in report.tasks}
    assert (by_task["click-link"].successes, by_task["click-link"].failures) == (1, 1)  # demo:3 is the variant's
    assert by_task["click-link-nl"].successes == 1
    text = format_report(report)
    assert "click-link: 1 successes, 1 failures: link in view 100% (1/1)" in text and "no problems" not in text


def test_outcome_auc_is_the_milestone_labels_ranking_of_successes_over_failures():
    """Successes reach 1, 2, 2 of two milestones and failures 1, 2: of the 6 (success, failure)
    pairs the success is ahead in 2 and level in 3, AUC (2 + 3 / 2) / 6; pooled with a task whose
    one success outranks its one failure, weighted by pairs: (3.5 + 1) / 7."""
    from envs.spec_validation import MilestoneReach, TaskReport, ValidationReport

    two = TaskReport("a", "a.yaml", 3, 2, (MilestoneReach(0, "m0", 3, 2), MilestoneReach(1, "m1", 2, 1)))
    assert two.reached_histogram(True) == [0, 1, 2] and two.reached_histogram(False) == [0, 1, 1]
    assert two.outcome_auc == pytest.approx(3.5 / 6)
    one = TaskReport("b", "b.yaml", 1, 1, (MilestoneReach(0, "m0", 1, 0),))
    only_successes = TaskReport("c", "c.yaml", 4, 0, (MilestoneReach(0, "m0", 2, 0),))
    assert one.outcome_auc == 1.0 and only_successes.outcome_auc != only_successes.outcome_auc  # nan
    report = ValidationReport("specs", (), (two, one, only_successes))
    assert report.within_task_auc == pytest.approx(4.5 / 7)
    assert "within their task at AUC 0.643 (2 tasks with both" in format_report(report)


def test_milestones_recorded_online_are_compared_with_the_replay_by_spec_version(folder):
    """Four rollouts of one task: a record the replay reproduces, and three it does not, recorded
    under another version of the spec (expected: the spec changed), with no version stored (older
    rollouts), and under this very spec (the replay and the online tracker disagree: warned)."""
    from envs.tasks import load_task_spec

    digest = load_task_spec(folder / "click-link.yaml").milestone_digest
    right = (("link in view", "link clicked"),)
    wrong = ((),)

    def rollout(episode_id: str, hits, spec_digest: str | None) -> Trajectory:
        return episode(
            episode_id,
            'Click the link "a"',
            ["a"],
            False,
            source="rollout",
            milestones_hit=hits,
            spec_digest=spec_digest,
        )

    episodes = [
        rollout("agree", right, digest),
        rollout("older-spec", wrong, "0" * 16),
        rollout("unversioned", wrong, None),
        rollout("same-spec", wrong, digest),
    ]
    report = validate_specs(folder, episodes)
    (task,) = [t for t in report.tasks if t.task_id == "click-link"]
    assert (task.records.recorded, task.records.other_version) == (4, 1)
    assert task.records.differing() == ["older-spec", "unversioned", "same-spec"]
    assert task.records.differing(THIS_VERSION) == ["same-spec"]
    assert task.records.differing(OTHER_VERSION) == ["older-spec"]
    assert task.records.differing(NO_VERSION) == ["unversioned"]
    problems = [p for p in report.problems() if "click-link.yaml" in p]
    assert any("1 episode(s) recorded under this very spec" in p and "e.g. same-spec" in p for p in problems)
    text = format_report(report)
    assert (
        "differs from the milestones recorded online in 3 of 4 episodes (e.g. older-spec): 1 recorded under "
        "another version of the spec, 1 with no version stored, 1 under this one" in text
    )
    assert "the replay reproduces them in 1 of 4 episodes; 1 were recorded under another version" in text
    agreeing = validate_specs(folder, [rollout("agree", right, digest)])
    assert not any("recorded online" in p for p in agreeing.problems())
    assert "the replay reproduces them in 1 of 1 episodes; 0 were recorded" in format_report(agreeing)


def test_a_failed_step_is_replayed_without_its_action_as_the_online_tracker_checks_it(folder):
    """A rollout whose click on the link did not happen (the environment refused it: a target not on
    the screen): online the step is checked without the action, so the click milestone is not
    reached, and the replay from the warehouse must not reach it either."""
    from envs.tasks import load_task_spec

    spec = load_task_spec(folder / "click-link.yaml")
    clicked = episode("f", 'Click the link "a"', ["a"], False, source="rollout")
    assert replay_milestones(spec, clicked).reached == 2
    failed = replace(clicked, failed_steps=frozenset({0}))
    assert replay_milestones(spec, failed).hits == (("link in view",),)
