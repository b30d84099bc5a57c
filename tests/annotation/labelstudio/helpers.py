"""Shared steps of the Label Studio end-to-end tests."""

from __future__ import annotations

from dagster import DagsterInstance, build_sensor_context, materialize

from assets.human_labels import annotation_candidates, annotation_queue
from assets.resources import LabelStudioResource, WarehouseResource
from warehouse.catalog import Warehouse


def push(
    warehouse: Warehouse,
    label_studio: LabelStudioResource,
    *,
    budget: int = 12,
    interfaces: tuple[str, ...] = ("step_correctness", "step_progress"),
    instance: DagsterInstance | None = None,
    selection: bool = True,
) -> dict:
    """Materialize the selection (optionally) and the push; the push's per-interface summary."""
    assets = [annotation_candidates, annotation_queue] if selection else [annotation_queue]
    run_config = {
        "ops": {
            "annotation_queue": {
                "config": {
                    "interfaces": list(interfaces),
                    "match_embedder": "hashing",
                    "match_budget": 6,
                    "milestone_review_budget": 2,
                }
            }
        }
    }
    if selection:
        run_config["ops"]["annotation_candidates"] = {"config": {"budget": budget, "spot_check_share": 0.25}}
    result = materialize(
        assets,
        resources={"warehouse": WarehouseResource(home=str(warehouse.home)), "label_studio": label_studio},
        run_config=run_config,
        instance=instance or DagsterInstance.ephemeral(),
    )
    assert result.success
    return result.asset_materializations_for_node("annotation_queue")[0].metadata["by_interface"].value


def queued_tasks(warehouse: Warehouse, interface: str) -> list[dict]:
    return warehouse.query(
        "SELECT ls_project_id, ls_task_id, item_key, episode_id, step_idx, prediction_model, prediction_label, "
        "prediction_value FROM annotation_queue WHERE interface = ? ORDER BY ls_task_id",
        [interface],
    ).to_pylist()


def tick(
    sensor,
    warehouse: Warehouse,
    label_studio: LabelStudioResource,
    instance: DagsterInstance,
    cursor: str | None = None,
):
    """One sensor evaluation, as the Dagster daemon would run it."""
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"warehouse": WarehouseResource(home=str(warehouse.home)), "label_studio": label_studio},
    ) as context:
        return sensor(context)


def labels(warehouse: Warehouse) -> list[dict]:
    return warehouse.query("SELECT * FROM human_labels ORDER BY annotation_id").to_pylist()
