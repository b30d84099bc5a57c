"""Reward-model datasets: states (Eq. 6), prompts (Tables 7-8), truncation, labels, TRL export, lineage."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.training.conftest import build_tiny_warehouse
from training.base.states import StepState, TextStep, TextTrajectory, action_state, progress_state
from training.reward_models.dataset import build_reward_model_dataset
from training.reward_models.examples import DatasetOptions, build_examples, fallback_sources
from training.reward_models.labels import (
    derive_step_verdicts,
    human_step_verdicts,
    outcome_anchored_progress,
    progress_gains,
    sampled_steps,
)
from training.reward_models.prompts import TruncationBudget, render_prompt, truncate_state
from training.reward_models.readers import read_progress_labels, read_splits, read_trajectories
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Screen, UIElement


def _traj(n=3, final=None):
    return TextTrajectory(
        "e1",
        "t",
        "do it",
        tuple(TextStep((f"screen{t}",), f"A{t}") for t in range(n)),
        success=True,
        final_screen_lines=final,
    )


def test_progress_state_reads_the_screen_after_the_action():
    traj = _traj()
    s0 = progress_state(traj, 0)
    assert s0.history == ("A0",) and s0.screen_lines == ("screen1",) and s0.action is None
    last = progress_state(traj, 2)
    assert last.history == ("A0", "A1", "A2") and last.screen_lines == ("screen2",)  # o_T stands in
    assert progress_state(_traj(final=("after",)), 2).screen_lines == ("after",)
    judged = action_state(traj, 1)
    assert judged.history == ("A0",) and judged.screen_lines == ("screen1",) and judged.action == "A1"
    with pytest.raises(IndexError):
        progress_state(traj, 3)


def test_screen_lines_match_screen_to_text():
    from training.base.states import screen_lines_from_records
    from warehouse.schema import element_records

    screen = Screen(
        (UIElement("1", "body"), UIElement("2", "textbox", element_id="user", value="vanda", editable=True, depth=1))
    )
    assert "\n".join(screen_lines_from_records(element_records(screen))) == screen.to_text()


def test_truncation_keeps_instruction_latest_actions_and_screen_top():
    state = StepState(
        instruction="Enter the username vanda",
        history=tuple(f"CLICK(button#b{i})" for i in range(40)),
        screen_lines=tuple(f'button#x{i} "label {i}"' for i in range(200)),
    )
    budget = TruncationBudget(max_tokens=300, keep_recent_actions=3)
    kept = truncate_state(state, budget)
    assert kept.instruction == state.instruction
    assert kept.history[-3:] == state.history[-3:]  # the latest actions survive
    assert kept.n_history_omitted + len(kept.history) == 40
    assert kept.screen_lines == state.screen_lines[: len(kept.screen_lines)] and kept.n_screen_omitted > 0
    prompt = render_prompt("progrm_lcs", state, budget)
    assert len(prompt) // 4 <= 300 + 10  # within budget (approximate counter: 4 chars per token)
    assert "earlier actions omitted" in prompt and "more elements]" in prompt
    assert "40. CLICK(button#b39)" in prompt  # numbering is absolute
    # nothing to cut: everything kept
    small = StepState("x", ("a",), ("l1", "l2"))
    kept = truncate_state(small, TruncationBudget())
    assert kept.history == ("a",) and kept.screen_lines == ("l1", "l2") and not kept.n_screen_omitted


def test_prompts_follow_tables_7_and_8():
    state = StepState("Click ok", ('CLICK(button "ok")',), ('button "ok"',))
    progrm, orm = render_prompt("progrm_env", state), render_prompt("orm", state)
    assert "estimation of his progress" in progrm and "judgment about the success or failure" in orm
    for text in (progrm, orm):
        assert (
            "Instructions: Click ok" in text
            and "History Actions: \n1. CLICK" in text
            and "Current screen: \nbutton" in text
        )
    prm = render_prompt("prm", StepState("Click ok", (), ("button",), "CLICK(button)"))
    assert "Candidate action: CLICK(button)" in prm and "History Actions: None" in prm


def test_progress_gains_eq2():
    assert progress_gains([0.2, 0.5, 0.5, 1.0]).tolist() == pytest.approx([0.2, 0.3, 0.0, 0.5])
    assert progress_gains([0.2, 0.5, 0.5, 1.0], k=2).tolist() == pytest.approx([0.2, 0.5, 0.3, 0.5])


def test_outcome_anchoring_makes_the_final_label_agree_with_the_outcome():
    # a success whose milestones missed its path still ends at 1; earlier labels are kept
    assert outcome_anchored_progress([0.0, 0.5, 0.5], True).tolist() == [0.0, 0.5, 1.0]
    # a failure that matched the whole recipe: the step "completing" it gains nothing
    assert outcome_anchored_progress([0.25, 0.5, 1.0, 1.0], False).tolist() == [0.25, 0.5, 0.5, 0.5]
    assert outcome_anchored_progress([1.0, 1.0], False).tolist() == [0.0, 0.0]
    assert outcome_anchored_progress([0.2, 0.6], False).tolist() == [0.2, 0.6]  # nothing to change
    assert outcome_anchored_progress([], True).size == 0


def test_derived_verdicts_and_human_majority():
    assert derive_step_verdicts([0.2, 0.2, 0.6], True) == ["positive"] * 3
    # failed: gain -> positive; non-gain before the last gain -> unsure; after it -> negative
    assert derive_step_verdicts([0.25, 0.25, 0.5, 0.5, 0.5], False) == [
        "positive",
        "unsure",
        "positive",
        "negative",
        "negative",
    ]
    assert derive_step_verdicts([0.0, 0.0], False) == ["negative", "negative"]
    votes = human_step_verdicts(
        [
            {"episode_id": "e", "step_idx": 0, "label": "positive"},
            {"episode_id": "e", "step_idx": 0, "label": "negative"},
            {"episode_id": "e", "step_idx": 0, "label": "positive"},
            {"episode_id": "e", "step_idx": 1, "label": "unsure"},
            {"episode_id": "e", "step_idx": 2, "label": "positive"},
            {"episode_id": "e", "step_idx": 2, "label": "negative"},
        ]
    )
    assert votes[("e", 0)] == ("positive", 3) and votes[("e", 1)][0] == "unsure" and votes[("e", 2)][0] == "unsure"


def test_failed_step_sampling_is_deterministic():
    a, b = sampled_steps("ep", 10, 6), sampled_steps("ep", 10, 6)
    assert a == b and len(a) == 6 and a == sorted(a)
    assert sampled_steps("ep", 4, None) == [0, 1, 2, 3] and sampled_steps("ep", 4, 9) == [0, 1, 2, 3]


def test_datasets_from_the_warehouse(tiny_home):
    warehouse = Warehouse(tiny_home)
    trajectories = read_trajectories(warehouse)
    assert len(trajectories) == 70
    orm = build_reward_model_dataset(warehouse, "orm", trajectories=trajectories)
    assert orm.examples.num_rows == 70  # one per trajectory
    rows = orm.examples.to_pylist()
    assert all(r["label"] == float(r["episode_success"]) for r in rows)
    assert all(r["step_idx"] == r["n_steps"] - 1 and len(r["history"]) == r["n_steps"] for r in rows)
    assert "judgment about the success or failure" in rows[0]["prompt"]

    env = build_reward_model_dataset(
        warehouse, "progrm_env", trajectories=trajectories, options=DatasetOptions(anchor_outcome=False)
    )
    labels = read_progress_labels(warehouse, "env")
    for r in env.examples.to_pylist():
        assert r["label"] == labels[r["episode_id"]].progress[r["step_idx"]]
        assert r["label_version"] == "env-test-v1" and r["label_source"] == "env"
    anchored = build_reward_model_dataset(warehouse, "progrm_env", trajectories=trajectories)
    for r in anchored.examples.to_pylist():
        published = labels[r["episode_id"]].progress
        expected = outcome_anchored_progress(published, r["episode_success"])[r["step_idx"]]
        assert r["label"] == expected and r["label_source"] == "env+outcome"
        if r["step_idx"] == r["n_steps"] - 1:
            assert (r["label"] == 1.0) == r["episode_success"]
    # App. C: failed trajectories keep n_steps_sampled steps (here n - 1)
    assert env.stats.dropped["failed steps not sampled (App. C)"] > 0
    assert set(env.examples["split"].to_pylist()) == {"train", "validation", "test"}

    prm = build_reward_model_dataset(warehouse, "prm", trajectories=trajectories)
    assert set(prm.examples["label"].to_pylist()) <= {0.0, 1.0}
    assert all(r["action"] for r in prm.examples.to_pylist())
    assert prm.stats.label_sources and not prm.human_labels_present  # empty human tables: derived labels
    # lineage: the versions of every table read
    assets = {i.input_asset for i in prm.inputs}
    assert {"human_demonstrations", "progress_labels", "progress_split"} <= assets
    assert all(i.input_materialization_id for i in prm.inputs)
    # TRL stepwise export: one bool per completion, prompt = instruction + history
    trl = prm.trl_stepwise.to_pylist()
    assert trl and all(len(r["completions"]) == len(r["labels"]) for r in trl)
    assert all(isinstance(b, bool) for r in trl for b in r["labels"])
    assert all("Action: " in c for r in trl for c in r["completions"])

    guidnav = build_reward_model_dataset(warehouse, "guidnav", trajectories=trajectories)
    assert set(guidnav.examples["label"].to_pylist()) <= {0.0, 0.5, 1.0}


def test_human_labels_override_derived_and_unsure_is_filtered(tmp_path):
    warehouse = build_tiny_warehouse(tmp_path / "home", n_login=8, n_button=4)
    before = build_reward_model_dataset(warehouse, "prm")
    assert not before.human_labels_present  # no human answers yet: handled
    failed = next(r for r in before.examples.to_pylist() if r["episode_success"] is False and r["label"] == 0.0)
    success = next(r for r in before.examples.to_pylist() if r["episode_success"])
    from warehouse.tables_annotation import HUMAN_LABELS

    def answer(row, label, k, interface="step_correctness"):
        return {name: None for name in HUMAN_LABELS.names} | {
            "ls_server": "local",
            "annotation_id": k,
            "ls_project_id": 1,
            "ls_task_id": k,
            "interface": interface,
            "episode_id": row["episode_id"],
            "step_idx": row["step_idx"],
            "label": label,
            "status": "active",
            "was_cancelled": False,
            "ground_truth": False,
            "usable_for_training": label != "unsure",
            "revision": 1,
        }

    human = pa.Table.from_pylist(
        [
            answer(failed, "positive", 1),
            answer(success, "unsure", 2),
            answer(success, "unsure", 3),
            answer(success, "no", 4, interface="milestone_match"),  # not a step-correctness answer: ignored
        ],
        schema=HUMAN_LABELS,
    )
    m = Materialization(asset="human_labels")
    warehouse.publish(m, [warehouse.stage_table("human_labels", "ls", human, m)])
    after = build_reward_model_dataset(warehouse, "prm")
    assert after.human_labels_present
    rows = {(r["episode_id"], r["step_idx"]): r for r in after.examples.to_pylist()}
    overridden = rows[(failed["episode_id"], failed["step_idx"])]
    assert overridden["label"] == 1.0 and overridden["label_source"] == "human"
    # a step people were unsure about is dropped, whatever the derived label said (GUI-Shepherd A.2)
    assert (success["episode_id"], success["step_idx"]) not in rows
    assert after.stats.dropped["unsure (human)"] == 1
    assert any(i.input_asset == "human_labels" for i in after.inputs)
    # the annotation stage's per-step aggregate wins over raw answers when it has rows
    from warehouse.tables_annotation import HUMAN_STEP_LABELS

    aggregate = pa.Table.from_pylist(
        [
            {
                "episode_id": failed["episode_id"],
                "step_idx": failed["step_idx"],
                "task_id": None,
                "correctness": "negative",
                "correctness_votes": 2,
                "correctness_positive_share": 0.0,
                "unsure_votes": 0,
                "progress": None,
                "progress_votes": 0,
                "progress_std": None,
                "n_annotators": 2,
                "label_version": "h1",
            }
        ],
        schema=HUMAN_STEP_LABELS,
    )
    m2 = Materialization(asset="human_step_labels")
    warehouse.publish(m2, [warehouse.stage_table("human_step_labels", "human", aggregate, m2)])
    again = build_reward_model_dataset(warehouse, "prm")
    row = next(
        r
        for r in again.examples.to_pylist()
        if (r["episode_id"], r["step_idx"]) == (failed["episode_id"], failed["step_idx"])
    )
    assert row["label"] == 0.0 and row["label_source"] == "human"
    assert any(i.input_asset == "human_step_labels" for i in again.inputs)


def test_missing_split_is_an_error(tmp_path):
    warehouse = Warehouse(tmp_path / "empty")
    warehouse.ensure_catalog()
    with pytest.raises(ValueError, match="progress_split is empty"):
        build_reward_model_dataset(warehouse, "orm")


def test_lcs_method_selects_labels(tiny_home):
    warehouse = Warehouse(tiny_home)
    for method, version in (("paper", "lcs-test-v1"), ("improved", "lcs-improved-test-v1")):
        built = build_reward_model_dataset(warehouse, "progrm_lcs", DatasetOptions(lcs_method=method))
        assert set(built.examples["label_version"].to_pylist()) == {version}
        assert set(built.examples["label_source"].to_pylist()) == {f"lcs:{method}+outcome"}
    assert DatasetOptions().lcs_method == "improved"


def test_episodes_without_their_labels_fall_back_or_are_dropped(tiny_home):
    """ProgRM-Env: milestone labels, else LCS labels, else outcome-only; ProgRM-LCS: LCS, else outcome-only;
    unanchored (§2.2 as published): dropped."""
    warehouse = Warehouse(tiny_home)
    trajectories, splits = read_trajectories(warehouse), read_splits(warehouse)
    env, lcs = read_progress_labels(warehouse, "env"), read_progress_labels(warehouse, "lcs", "improved")
    ids = sorted(trajectories)
    no_env, unlabelled = set(ids[:10]), set(ids[10:15])
    labels = {
        "env": {e: v for e, v in env.items() if e not in no_env | unlabelled},
        "lcs": {e: v for e, v in lcs.items() if e not in unlabelled},
    }
    examples, _ = build_examples("progrm_env", trajectories, splits, progress_labels=labels)
    source_of = {r["episode_id"]: r["label_source"] for r in examples.to_pylist()}
    assert {source_of[e] for e in no_env} == {"lcs:improved+outcome"}
    assert {source_of[e] for e in unlabelled} == {"outcome"}
    assert {source_of[e] for e in set(ids) - no_env - unlabelled} == {"env+outcome"}
    for r in examples.to_pylist():
        if r["episode_id"] in no_env:
            expected = outcome_anchored_progress(lcs[r["episode_id"]].progress, r["episode_success"])[r["step_idx"]]
            assert r["label"] == expected
        elif r["episode_id"] in unlabelled:
            last = r["step_idx"] == r["n_steps"] - 1
            assert r["label"] == (1.0 if last and r["episode_success"] else 0.0)

    lcs_examples, _ = build_examples("progrm_lcs", trajectories, splits, progress_labels=labels)
    assert {r["label_source"] for r in lcs_examples.to_pylist() if r["episode_id"] in unlabelled} == {"outcome"}
    published, stats = build_examples(
        "progrm_env", trajectories, splits, progress_labels=labels, options=DatasetOptions(anchor_outcome=False)
    )
    assert not set(published["episode_id"].to_pylist()) & (no_env | unlabelled)
    assert stats.dropped["no env labels"] == len(no_env | unlabelled)
    assert fallback_sources("progrm_env", DatasetOptions()) == ("lcs", "outcome")
    assert fallback_sources("progrm_lcs", DatasetOptions()) == ("outcome",)


def test_target_context_names_which_of_identical_buttons():
    from training.base.states import action_in_context, target_context

    records = [
        {"ref": "1", "role": "body", "depth": 0},
        {"ref": "2", "role": "div", "depth": 1},
        {"ref": "3", "role": "div", "depth": 2, "parent_ref": "2"},
        {"ref": "4", "role": "span", "text": "@lacus", "depth": 3, "parent_ref": "3"},
        {"ref": "5", "role": "div", "depth": 3, "parent_ref": "3"},
        {"ref": "6", "role": "span", "classes": "retweet", "depth": 4, "parent_ref": "5"},
        {"ref": "7", "role": "div", "depth": 2, "parent_ref": "2"},
        {"ref": "8", "role": "span", "text": "@kanesha", "depth": 3, "parent_ref": "7"},
        {"ref": "9", "role": "button", "text": "Submit", "depth": 2, "parent_ref": "2"},
    ]
    assert target_context(records, "6") == '"@lacus"'  # climbs past the empty controls div
    assert target_context(records, "9") is None  # a button with its own text needs no context
    assert target_context(records, "missing") is None and target_context(records, None) is None
    assert action_in_context("CLICK(span.retweet)", '"@lacus"') == 'CLICK(span.retweet) within "@lacus"'
    assert target_context(records, "6", max_container_elements=2) is None  # too broad a container


def test_absent_views_read_as_no_human_labels(tmp_path, monkeypatch):
    """An older catalog without the annotation stage's views: no human labels, no error."""
    from training.reward_models import readers as datasets

    warehouse = build_tiny_warehouse(tmp_path / "home", n_login=4, n_button=2)
    assert not warehouse.has_table("no_such_view")
    monkeypatch.setattr(
        type(warehouse), "has_table", lambda wh, name: name not in ("human_labels", "human_step_labels")
    )
    assert datasets.read_human_verdicts(warehouse) == ({}, [])
    assert build_reward_model_dataset(warehouse, "prm").examples.num_rows > 0


def test_excluded_tasks_give_no_example_so_a_model_can_be_judged_on_tasks_it_never_saw(tiny_home):
    """Issue 42 item 3: a verifier judged on tasks no reward model trained on. ``excluded_tasks``
    removes every episode of those tasks (all splits, the TRL export too) and says how many."""
    warehouse = Warehouse(tiny_home)
    trajectories = read_trajectories(warehouse)
    tasks = sorted({t.task_id for t in trajectories.values()})
    assert len(tasks) >= 2
    left_out = tasks[0]
    full = build_reward_model_dataset(warehouse, "prm", trajectories=trajectories)
    without = build_reward_model_dataset(
        warehouse, "prm", trajectories=trajectories, options=DatasetOptions(excluded_tasks=(left_out,))
    )
    assert left_out in set(full.examples["task_id"].to_pylist())
    assert left_out not in set(without.examples["task_id"].to_pylist())
    kept = set(without.examples["task_id"].to_pylist())
    assert kept == set(full.examples["task_id"].to_pylist()) - {left_out}
    excluded_episodes = sum(1 for t in trajectories.values() if t.task_id == left_out)
    assert without.stats.dropped["episodes of excluded tasks"] == excluded_episodes > 0
    assert without.trl_stepwise.num_rows < full.trl_stepwise.num_rows
    assert DatasetOptions(excluded_tasks=("b", "a")).to_json()["excluded_tasks"] == ["a", "b"]
    with pytest.raises(ValueError, match=r"excluded_tasks: no episode of \['no-such-task'\]"):
        build_reward_model_dataset(
            warehouse, "prm", trajectories=trajectories, options=DatasetOptions(excluded_tasks=("no-such-task",))
        )
