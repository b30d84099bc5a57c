"""Rationales for labels people gave in a real Label Studio (GUI-Shepherd §3), end to end: push,
annotate, sync into ``human_labels``, then the ``label_rationales`` asset with its default endpoint
(SmolLM2-135M-Instruct served locally for the run). An edited label is explained again."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, materialize

from annotation.labelstudio.interfaces import correctness_prediction
from assets.human_labels import human_labels
from assets.rationales import RATIONALE_CHECKS, label_rationales
from assets.resources import WarehouseResource
from tests.annotation.labelstudio.helpers import push, queued_tasks

pytestmark = pytest.mark.e2e


def _rationales(warehouse) -> list[dict]:
    return warehouse.query(
        "SELECT r.*, h.label AS human_label FROM label_rationales r JOIN human_labels h "
        "USING (ls_server, annotation_id, revision) ORDER BY annotation_id, revision"
    ).to_pylist()


def test_rationales_for_labels_given_in_label_studio(small_warehouse, ls_resource):
    instance = DagsterInstance.ephemeral()
    push(small_warehouse, ls_resource, budget=6, interfaces=("step_correctness",), instance=instance)
    client = ls_resource.client()
    tasks = queued_tasks(small_warehouse, "step_correctness")
    ids = [
        client.create_annotation(t["ls_task_id"], correctness_prediction(a))
        for t, a in zip(tasks, ["positive", "negative", "unsure"], strict=False)
    ]
    resources = {"warehouse": WarehouseResource(home=str(small_warehouse.home)), "label_studio": ls_resource}
    config = {"ops": {"label_rationales": {"config": {"max_tokens": 60}}}}

    def run() -> dict:
        assert materialize([human_labels], resources=resources, instance=instance).success
        result = materialize([label_rationales, *RATIONALE_CHECKS], resources=resources, run_config=config,
                             instance=instance)  # fmt: skip
        assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
        metadata = result.asset_materializations_for_node("label_rationales")[0].metadata
        return {k: v.value for k, v in metadata.items()}

    first = run()
    rows = _rationales(small_warehouse)
    assert [r["annotation_id"] for r in rows] == ids[:2]  # the unsure label has nothing to explain
    assert [r["label"] for r in rows] == [r["human_label"] for r in rows] == ["positive", "negative"]
    assert first["asked"] == 2 and first["rationales"] == sum(r["ok"] for r in rows)
    assert first["endpoint"].startswith("http://127.0.0.1:") and first["model"].endswith("smollm2-135m-instruct")
    assert all(r["ok"] == (r["rationale"] is not None) and r["seconds"] > 0 for r in rows)
    queued = {t["ls_task_id"]: t for t in tasks}
    labelled = small_warehouse.query("SELECT annotation_id, ls_task_id FROM human_labels").to_pylist()
    steps = {a["annotation_id"]: queued[a["ls_task_id"]] for a in labelled}
    assert all((r["episode_id"], r["step_idx"]) == (steps[r["annotation_id"]]["episode_id"],
                                                    steps[r["annotation_id"]]["step_idx"]) for r in rows)  # fmt: skip

    client.update_annotation(ids[0], correctness_prediction("negative"))  # the annotator changes their mind
    second = run()
    rows = _rationales(small_warehouse)
    revised = [r for r in rows if r["annotation_id"] == ids[0]]
    assert [(r["revision"], r["label"]) for r in revised] == [(2, "negative")]  # joined to the current revision
    assert second["pending"] == 1 + (2 - first["rationales"]) and second["asked"] == second["pending"]
