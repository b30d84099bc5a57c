"""The sensor against the real server: new, updated, deleted annotations; agreement; downstream labels."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, SensorResult, materialize

from annotation.labelstudio.interfaces import correctness_prediction, progress_prediction
from annotation.labelstudio.sync_state import SyncState
from assets.human_labels import (
    HUMAN_LABEL_CHECKS,
    annotation_agreement,
    build_label_studio_sensor,
    human_labels,
    human_step_labels,
    label_source_comparison,
)
from assets.resources import WarehouseResource
from tests.annotation.labelstudio.helpers import labels, push, queued_tasks, tick

pytestmark = pytest.mark.e2e


def _second_annotator(client) -> int:
    email = "second-annotator@stepwise.local"
    users = client._raw("GET", "api/users/", what="list users")
    for user in users:
        if user["email"] == email:
            return user["id"]
    return client._raw(
        "POST",
        "api/users/",
        json_body={"email": email, "password": "Second-pw-12345", "username": "second"},
        what="create user",
    )["id"]


def test_sensor_pulls_new_updated_and_deleted_annotations(small_warehouse, ls_resource):
    instance = DagsterInstance.ephemeral()
    push(small_warehouse, ls_resource, budget=10, instance=instance)
    client = ls_resource.client()
    correctness = queued_tasks(small_warehouse, "step_correctness")
    progress = queued_tasks(small_warehouse, "step_progress")
    second = _second_annotator(client)
    answers = ["positive", "negative", "unsure", "positive", "negative", "positive"]
    ids = [
        client.create_annotation(t["ls_task_id"], correctness_prediction(a), lead_time=2.5)
        for t, a in zip(correctness, answers, strict=False)
    ]
    # a second annotator overlaps on four tasks (agrees on three): Cohen's kappa where tasks overlap
    overlap = [
        client.create_annotation(t["ls_task_id"], correctness_prediction(a), completed_by=second)
        for t, a in zip(correctness[:4], ["positive", "negative", "positive", "negative"], strict=True)
    ]
    skipped = client.create_annotation(correctness[7]["ls_task_id"], [], was_cancelled=True)
    progress_ids = [
        client.create_annotation(t["ls_task_id"], progress_prediction(v))
        for t, v in zip(progress, (0.25, 0.5, 1.0), strict=False)
    ]

    sensor = build_label_studio_sensor(name="sync_test_sensor")
    first = tick(sensor, small_warehouse, ls_resource, instance)
    assert isinstance(first, SensorResult) and len(first.asset_events) == 2  # correctness and progress projects
    assert first.run_requests and {k.to_user_string() for k in first.run_requests[0].asset_selection} == {
        "human_step_labels",
        "annotation_agreement",
        "label_source_comparison",
    }
    rows = {r["annotation_id"]: r for r in labels(small_warehouse)}
    assert set(rows) == set(ids + overlap + [skipped] + progress_ids)
    assert rows[ids[2]]["label"] == "unsure" and not rows[ids[2]]["usable_for_training"]
    assert rows[skipped]["was_cancelled"] and not rows[skipped]["usable_for_training"]
    assert rows[progress_ids[1]]["value"] == 0.5 and rows[ids[0]]["lead_time_s"] == 2.5
    assert rows[overlap[0]]["annotator_id"] != rows[ids[0]]["annotator_id"]
    assert all(r["annotator_id"].startswith("ann-") for r in rows.values())
    assert rows[ids[0]]["ls_task_url"] == client.task_url(correctness[0]["ls_project_id"], correctness[0]["ls_task_id"])
    assert rows[ids[0]]["episode_id"] == correctness[0]["episode_id"]

    # nothing changed: no export, no new version
    quiet = tick(sensor, small_warehouse, ls_resource, instance, first.cursor)
    assert quiet.skip_reason and "no annotation changes" in quiet.skip_reason.skip_message
    assert SyncState.from_json(quiet.cursor).consecutive_failures == 0

    client.update_annotation(ids[0], correctness_prediction("negative"))
    client.delete_annotation(ids[1])
    changed = tick(sensor, small_warehouse, ls_resource, instance, quiet.cursor)
    assert [e.metadata["updated"].value for e in changed.asset_events] == [1]
    assert [e.metadata["retracted"].value for e in changed.asset_events] == [1]
    rows = {r["annotation_id"]: r for r in labels(small_warehouse)}
    assert rows[ids[0]]["label"] == "negative" and rows[ids[0]]["revision"] == 2
    assert rows[ids[1]]["status"] == "retracted" and rows[ids[1]]["retracted_at"] is not None
    assert len(rows) == len(ids + overlap + [skipped] + progress_ids)  # nothing lost, nothing twice

    resources = {"warehouse": WarehouseResource(home=str(small_warehouse.home)), "label_studio": ls_resource}
    result = materialize(
        [human_labels, human_step_labels, annotation_agreement, label_source_comparison, *HUMAN_LABEL_CHECKS],
        resources=resources,
        instance=instance,
        selection=["human_step_labels", "annotation_agreement", "label_source_comparison", "human_labels"],
    )
    assert result.success
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks["human_labels_unique_annotations"] and checks["human_labels_unsure_excluded"]
    assert checks["annotation_tables_free_of_secrets"] and checks["human_labels_traced_to_queue"]
    step_labels = {
        (r["episode_id"], r["step_idx"]): r
        for r in small_warehouse.query("SELECT * FROM human_step_labels").to_pylist()
    }
    unsure_step = (correctness[2]["episode_id"], correctness[2]["step_idx"])
    assert step_labels[unsure_step]["unsure_votes"] == 1
    assert step_labels[unsure_step]["correctness"] == "positive"  # the other annotator's vote; unsure never votes
    human_progress = small_warehouse.query(
        "SELECT count(*) AS n FROM progress_labels WHERE source = 'human'"
    ).to_pylist()[0]["n"]
    assert human_progress == 3
    agreement = result.asset_materializations_for_node("annotation_agreement")[0].metadata
    kappa = agreement["cohen_kappa"].value["step_correctness"]
    # tasks 0 and 3 remain comparable (task 1's first answer was deleted, task 2's is unsure); both disagree now
    assert kappa["overlapping_pairs"] == 2
    assert "plot" in agreement
    stats = small_warehouse.query("SELECT * FROM annotator_stats WHERE interface = 'step_correctness'").to_pylist()
    assert len(stats) == 2 and all(s["n_overlapping_tasks"] == 2 and s["agreement_with_others"] == 0.0 for s in stats)
    comparison = small_warehouse.query("SELECT * FROM label_source_agreement").to_pylist()
    assert {(r["source_a"], r["source_b"]) for r in comparison} >= {("human", "lcs"), ("human", "model")}
    client.close()
