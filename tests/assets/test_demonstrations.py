"""The demonstrations asset and its checks in Dagster."""

import pyarrow as pa
from dagster import DagsterInstance, materialize

from assets.demonstrations import (
    DEMONSTRATION_ASSETS,
    DEMONSTRATION_CHECKS,
    demonstrations_no_empty_episodes,
    demonstrations_success_and_failure,
)
from assets.resources import WarehouseResource
from warehouse.catalog import Materialization, Warehouse
from warehouse.schema import EPISODES, STEPS


def test_materialize_demonstrations_with_checks(small_demos, home):
    result = materialize(
        [*DEMONSTRATION_ASSETS, *DEMONSTRATION_CHECKS],
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={"ops": {"human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == dict.fromkeys(evaluations, True) and len(evaluations) == 8
    metadata = result.asset_materializations_for_node("human_demonstrations")[0].metadata
    assert metadata["files"].value == 23 and metadata["episodes"].value > 0
    lineage = Warehouse(home).query("SELECT run_id FROM lineage_materializations").to_pylist()
    assert lineage == [{"run_id": result.run_id}]


def test_checks_fail_on_bad_data(home):
    """The checks are not rubber stamps: an episode without steps is caught."""
    warehouse = Warehouse(home)
    m = Materialization(asset="test")
    row = {name: None for name in EPISODES.names} | {
        "episode_id": "e1",
        "task_id": "t",
        "source": "human_demo",
        "success": True,
        "n_steps": 0,
    }
    outputs = [
        warehouse.stage_table("episodes", "x", pa.Table.from_pylist([row], schema=EPISODES), m),
        warehouse.stage_table("steps", "x", STEPS.empty_table(), m),
    ]
    warehouse.publish(m, outputs)
    resource = WarehouseResource(home=str(home))
    assert not demonstrations_no_empty_episodes(warehouse=resource).passed
    assert not demonstrations_success_and_failure(warehouse=resource).passed
