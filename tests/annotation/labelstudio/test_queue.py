"""Queue items without a warehouse: pre-annotations, step items, histories and views, milestone items."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from annotation.labelstudio.interfaces import parse_result
from annotation.labelstudio.queue import (
    action_histories,
    match_episodes,
    match_items,
    match_pairs,
    milestone_sets_from_rows,
    milestone_sets_from_specs,
    queued_step_keys,
    review_choices,
    review_items,
    step_items,
    step_prediction,
    step_views,
)
from annotation.labelstudio.render import StepView
from annotation.labelstudio.selection import select_match_pairs
from warehouse.model import Screen, UIElement
from warehouse.schema import STEPS, element_records

SCREEN = Screen(
    (
        UIElement(ref="1", role="body", bounds=(0, 0, 160, 210)),
        UIElement(ref="2", role="button", text="Submit", element_id="subbtn", bounds=(5, 5, 60, 25), clickable=True),
    )
)


def view(episode: str, step: int) -> StepView:
    return StepView(episode, step, "t", "Click Submit.", SCREEN, "CLICK", "CLICK(button#subbtn)", target_ref="2")


def test_pre_annotations_from_a_progress_model_or_a_step_judge():
    row = {"model_id": "m", "model_progress": 0.75, "model_previous_progress": 0.5}
    progress = step_prediction("step_progress", row)
    assert progress["model_version"] == "m" and parse_result("step_progress", progress["result"]).value == 0.75
    rising = step_prediction("step_correctness", row)
    assert parse_result("step_correctness", rising["result"]).label == "positive" and rising["score"] == 0.75
    falling = step_prediction("step_correctness", row | {"model_previous_progress": 0.9})
    assert parse_result("step_correctness", falling["result"]).label == "negative"
    first = step_prediction("step_correctness", row | {"model_previous_progress": None})  # step 0: from nothing
    assert first["score"] == 1.0
    judge = {"model_id": "prm-1", "model_progress": None}
    judged = step_prediction("step_correctness", judge, 0.2)
    assert parse_result("step_correctness", judged["result"]).label == "negative" and judged["score"] == 0.8
    assert step_prediction("step_progress", judge, 0.2) is None  # a judge says nothing about progress
    assert step_prediction("step_correctness", judge) is None
    assert step_prediction("step_correctness", {"model_id": None, "model_progress": 0.5}) is None


def test_step_items_for_each_interface_render_lazily_and_share_the_html():
    candidates = [
        {"episode_id": "e", "step_idx": 1, "reason": "no_signal", "model_id": "m", "model_progress": 0.4},
        {"episode_id": "gone", "step_idx": 0, "reason": "no_signal"},  # no view: left out
        {"episode_id": "j", "step_idx": 0, "reason": "spot_check", "model_id": "prm", "model_progress": None},
    ]
    views = {("e", 1): view("e", 1), ("j", 0): view("j", 0)}
    items = step_items(candidates, views, ["step_correctness", "step_progress", "milestone_review"], {("j", 0): 0.9})
    assert set(items) == {"step_correctness", "step_progress"}
    correctness = {i.item_key: i for i in items["step_correctness"]}
    assert set(correctness) == {"step:e:1", "step:j:0"}
    assert correctness["step:j:0"].fields["prediction_label"] == "positive"  # from the judge's probability
    assert correctness["step:e:1"].fields["prediction_value"] is None
    progress = {i.item_key: i for i in items["step_progress"]}
    assert progress["step:e:1"].fields["prediction_value"] == pytest.approx(0.4)
    assert progress["step:j:0"].prediction is None
    assert callable(correctness["step:e:1"].data)  # rendered only when pushed
    data = correctness["step:e:1"].task_data()
    assert data["interface_version"] == "step_correctness@1" and data["reason"] == "no_signal"
    assert progress["step:e:1"].task_data()["interface_version"] == "step_progress@1"
    assert data["screen_html"] == progress["step:e:1"].task_data()["screen_html"]


def test_queued_steps_and_histories():
    queue = [
        {"interface": "step_correctness", "episode_id": "e", "step_idx": 2},
        {"interface": "milestone_match", "episode_id": "e", "step_idx": 3},
        {"interface": "step_progress", "episode_id": None, "step_idx": None},
    ]
    assert queued_step_keys(queue) == {("e", 2)}
    actions = [{"episode_id": e, "step_idx": i, "action_text": f"{e}{i}"} for e in "ab" for i in range(3)]
    assert action_histories(actions, {("a", 0), ("a", 2), ("b", 1)}) == {
        ("a", 0): (),
        ("a", 2): ("a0", "a1"),
        ("b", 1): ("b0",),
    }


def test_step_views_from_an_arrow_table(tmp_path):
    (tmp_path / "shot.png").write_bytes(b"\x89PNG")
    row = {name: None for name in STEPS.names} | {
        "episode_id": "e",
        "step_idx": 1,
        "action_type": "CLICK",
        "action_text": "CLICK(button#subbtn)",
        "target_ref": "2",
        "screen": element_records(SCREEN),
        "screenshot_path": "shot.png",
    }
    table = pa.Table.from_pylist([row], schema=STEPS).append_column("task_id", pa.array(["t"]))
    table = table.append_column("instruction", pa.array([None], pa.string()))
    views = step_views(table, {("e", 1): ("CLICK(x)",)}, home=tmp_path, local_root=None)
    got = views[("e", 1)]
    assert got.screen.by_ref("2").text == "Submit" and got.history == ("CLICK(x)",) and got.instruction == ""
    assert got.screenshot_url.startswith("data:image/png;base64,")


def test_milestone_sets_from_a_table_or_specs(tmp_path):
    rows = [
        {"task_id": "t", "set_id": "v1", "text": "second", "ord": 1},
        {"task_id": "t", "set_id": "v1", "text": "first", "ord": 0},
        {"task_id": "t", "set_id": None, "text": "only", "ord": None},
    ]
    sets = milestone_sets_from_rows(rows)
    assert {s["milestone_set_id"]: s["milestones"] for s in sets} == {"t:v0": ["only"], "t:v1": ["first", "second"]}
    (tmp_path / "t.yaml").write_text(
        "task_id: t\nbackend: miniwob\nmilestones:\n  - name: clicked\n    when: {clicked: {element_id: subbtn}}\n"
    )
    assert milestone_sets_from_specs(tmp_path) == [
        {"milestone_set_id": "t:spec", "task_id": "t", "source": "task_spec", "milestones": ["clicked"]}
    ]


EPISODES = {
    "t": [
        {"episode_id": f"e{i}", "task_id": "t", "success": i % 2 == 0, "instruction": f"do {i}", "n_steps": 3 + i}
        for i in range(6)
    ]
}
SETS = [{"milestone_set_id": "t:spec", "task_id": "t", "source": "task_spec", "milestones": ["typed", "clicked"]}]


def test_review_items_show_a_typical_successful_episode():
    choices = review_choices(SETS, EPISODES, set(), room=5)
    assert [(s["milestone_set_id"], ref["episode_id"]) for s, ref in choices] == [("t:spec", "e2")]  # median success
    assert review_choices(SETS, EPISODES, {"milestones:t:spec"}, room=5) == []
    assert review_choices(SETS, EPISODES, set(), room=-1) == []
    items = review_items(choices, EPISODES, {("e2", 0): view("e2", 0)}, {"e2": ["CLICK(a)"]})
    data = items[0].task_data()
    assert items[0].item_key == "milestones:t:spec" and data["instruction"] == "do 2" and data["n_milestones"] == 2
    no_reference = review_items([(SETS[0], None)], {}, {}, {})[0].task_data()
    assert "no successful episode yet" in no_reference["reference_html"] and no_reference["instruction"] == "t"


def test_match_items_near_the_threshold_with_the_matchers_verdict():
    episodes = match_episodes(["t"], EPISODES)
    assert len(episodes) == 6 and {e["success"] for e in episodes} == {True, False}
    actions = {e["episode_id"]: [(0, "type name"), (1, "click submit")] for e in episodes}

    def similarity(milestones, texts):
        return np.array([[0.9 if m[0] == t[0] else 0.2 for t in texts] for m in milestones])

    pairs = match_pairs(SETS, episodes, actions, similarity)
    assert len(pairs) == 6 * 2 * 2 and {p.similarity for p in pairs} == {0.9, 0.2}
    chosen = select_match_pairs(pairs, 4, threshold=0.75)
    views = {(p.episode_id, p.step_idx): view(p.episode_id, p.step_idx) for p, _ in chosen}
    items = match_items(chosen, views, SETS, threshold=0.75, embedder="hashing")
    assert len(items) == 4 and all(i.prediction["model_version"] == "matcher:hashing@0.75" for i in items)
    for item in items:
        expected = "yes" if item.fields["prediction_value"] >= 0.75 else "no"
        assert item.fields["prediction_label"] == expected
        assert item.task_data()["milestone"] in ("typed", "clicked")
