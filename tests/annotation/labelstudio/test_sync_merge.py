"""The pure core of ingestion: reading an export, merging by annotation id, back-off, pseudonyms."""

from __future__ import annotations

from datetime import UTC, datetime

from annotation.labelstudio.interfaces import INTERFACES, correctness_prediction, parse_result, progress_prediction
from annotation.labelstudio.sync import annotation_rows, merge_labels, pseudonymous_annotator_id
from annotation.labelstudio.sync_state import SyncState, backoff_seconds

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def export(*annotations: dict, task_id: int = 7, **data) -> list[dict]:
    return [
        {
            "id": task_id,
            "data": {
                "item_key": "step:e1:2",
                "episode_id": "e1",
                "step_idx": 2,
                "task_id": "login-user",
                "interface_version": "step_correctness@1",
                **data,
            },
            "annotations": list(annotations),
        }
    ]


def annotation(
    annotation_id: int, label: str = "positive", *, user: int = 3, rationale: str | None = None, **extra
) -> dict:
    result = correctness_prediction(label)
    if rationale:
        result.append(
            {"from_name": "rationale", "to_name": "action", "type": "textarea", "value": {"text": [rationale]}}
        )
    return {
        "id": annotation_id,
        "result": result,
        "completed_by": user,
        "was_cancelled": False,
        "ground_truth": False,
        "created_at": "2026-01-01T10:00:00.000001Z",
        "updated_at": "2026-01-01T10:00:00.000001Z",
        "lead_time": 4.25,
        "parent_prediction": None,
        **extra,
    }


def rows(*annotations: dict) -> list[dict]:
    return annotation_rows(
        export(*annotations),
        interface=INTERFACES["step_correctness"],
        project_id=5,
        server_key="local",
        salt="s3cret-salt",
        task_url=lambda p, t: f"http://127.0.0.1:9/projects/{p}/data?task={t}",
    )


def test_rows_carry_lineage_answer_and_pseudonym():
    (row,) = rows(annotation(11, "negative", rationale="wrong field", parent_prediction=4))
    assert row["annotation_id"] == 11 and row["ls_project_id"] == 5 and row["ls_task_id"] == 7
    assert row["ls_task_url"].endswith("/projects/5/data?task=7")
    assert (row["episode_id"], row["step_idx"], row["item_key"]) == ("e1", 2, "step:e1:2")
    assert (row["label"], row["rationale"], row["lead_time_s"]) == ("negative", "wrong field", 4.25)
    assert row["from_prediction"] is True and row["usable_for_training"] is True
    assert row["annotator_id"].startswith("ann-") and "3" != row["annotator_id"][4:]
    assert row["created_at"] == datetime(2026, 1, 1, 10, 0, 0, 1, tzinfo=UTC)


def test_unsure_and_skipped_are_kept_but_not_for_training():
    unsure, skipped = rows(annotation(1, "unsure"), annotation(2, "positive", was_cancelled=True))
    assert unsure["label"] == "unsure" and unsure["usable_for_training"] is False
    assert skipped["was_cancelled"] is True and skipped["usable_for_training"] is False


def test_merge_is_idempotent_replaces_updates_and_retracts_deletions():
    first, diff = merge_labels([], rows(annotation(1), annotation(2)), T0)
    assert (diff.created, diff.updated, diff.retracted) == (2, 0, 0)
    again, diff = merge_labels(first, rows(annotation(1), annotation(2)), T1)
    assert not diff.changed and again == first  # the same snapshot twice changes nothing
    updated = annotation(1, "negative", updated_at="2026-01-02T09:00:00Z")
    second, diff = merge_labels(first, rows(updated), T1)  # 1 edited, 2 deleted
    assert (diff.created, diff.updated, diff.retracted) == (0, 1, 1)
    by_id = {r["annotation_id"]: r for r in second}
    assert by_id[1]["label"] == "negative" and by_id[1]["revision"] == 2 and by_id[1]["first_synced_at"] == T0
    assert by_id[2]["status"] == "retracted" and by_id[2]["retracted_at"] == T1 and not by_id[2]["usable_for_training"]
    assert len(second) == 2  # nothing lost, nothing counted twice
    third, diff = merge_labels(second, rows(updated), T1)
    assert not diff.changed
    restored, diff = merge_labels(third, rows(updated, annotation(2)), T1)
    assert diff.restored == 1 and {r["status"] for r in restored} == {"active"}


def test_parse_each_interface():
    assert parse_result("step_progress", progress_prediction(0.62)).value == 0.6
    review = [
        {"from_name": "quality", "type": "choices", "value": {"choices": ["4"]}},
        {"from_name": "factuality", "type": "choices", "value": {"choices": ["minor_issues"]}},
        {"from_name": "order", "type": "choices", "value": {"choices": ["executable"]}},
        {"from_name": "granularity", "type": "choices", "value": {"choices": ["too fine"]}},
    ]
    parsed = parse_result("milestone_review", review)
    assert (parsed.value, parsed.factuality, parsed.order, parsed.granularity) == (
        4.0,
        "minor_issues",
        "executable",
        "too_fine",
    )
    assert parse_result("milestone_match", [{"from_name": "match", "value": {"choices": ["yes"]}}]).label == "yes"
    assert not parse_result("step_correctness", []).has_answer


def test_backoff_doubles_and_caps():
    assert [backoff_seconds(n, base_s=30, max_s=900) for n in range(7)] == [0, 30, 60, 120, 240, 480, 900]


def test_pseudonyms_are_stable_and_salted():
    a = pseudonymous_annotator_id(3, "salt-a", "local")
    assert a == pseudonymous_annotator_id(3, "salt-a", "local") != pseudonymous_annotator_id(3, "salt-b", "local")
    assert a != pseudonymous_annotator_id(4, "salt-a", "local")
    assert pseudonymous_annotator_id({"id": 3, "email": "x@y"}, "salt-a", "local") == a


def test_sync_state_round_trips_and_holds_no_secret():
    state = SyncState()
    project = state.project("local", 3)
    project.pending_export_title, project.pending_export_id = "stepwise-sync-abc", 12
    state.consecutive_failures, state.retry_after = 2, 123.0
    again = SyncState.from_json(state.to_json())
    assert again.project("local", 3).pending_export_id == 12 and again.consecutive_failures == 2
    assert SyncState.from_json("not json").projects == {}
