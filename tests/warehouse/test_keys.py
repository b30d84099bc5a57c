"""Every table declares its key, the key check catches a repeated key, and running stages again
(or in another order) never repeats one."""

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from annotation.progress.labels import run_labeling, run_split, run_synthesis
from envs.pool_jobs import ROLLOUT_ATTEMPTS
from tests.training.conftest import build_tiny_warehouse
from warehouse.catalog import Materialization, Warehouse
from warehouse.checks import check_unique_key
from warehouse.keys import table_key, with_key
from warehouse.schema import EPISODES, TABLE_SCHEMAS


def test_every_table_declares_a_key_of_its_own_columns():
    for name, schema in {**TABLE_SCHEMAS, "rollout_attempts": ROLLOUT_ATTEMPTS}.items():
        key = table_key(schema)
        assert key, name
        assert set(key) <= set(schema.names), name
    with pytest.raises(ValueError, match="not in the schema"):
        with_key(pa.schema([("a", pa.int32())]), "b")


def _episode(episode_id: str) -> dict:
    fields = {"episode_id": episode_id, "task_id": "t", "source": "x", "success": True, "n_steps": 0}
    return {name: None for name in EPISODES.names} | fields


def test_the_key_check_fails_when_one_episode_is_in_two_datasets(tmp_path):
    warehouse = Warehouse(tmp_path)
    for dataset in ("first-import", "second-import"):
        m = Materialization(asset="test")
        rows = [_episode("same"), _episode(f"only-{dataset}")]
        warehouse.publish(
            m, [warehouse.stage_table("episodes", dataset, pa.Table.from_pylist(rows, schema=EPISODES), m)]
        )
    outcome = check_unique_key(warehouse, "episodes")
    assert not outcome.passed
    assert outcome.metadata["repeated_keys"] == 1 and outcome.metadata["examples"][0]["episode_id"] == "same"
    assert check_unique_key(warehouse, "steps").passed  # an empty table repeats nothing


@pytest.fixture(scope="module")
def tiny_home(tmp_path_factory):
    """The tiny training warehouse's episodes and steps only (the labels stage writes the rest)."""
    tiny = build_tiny_warehouse(tmp_path_factory.mktemp("keys") / "tiny", n_login=12, n_button=10)
    home = tmp_path_factory.mktemp("keys") / "home"
    warehouse = Warehouse(home)
    m = Materialization(asset="human_demonstrations")
    outputs = [
        warehouse.stage_table(name, "tiny", tiny.query(f"SELECT * FROM {name}"), m) for name in ("episodes", "steps")
    ]
    warehouse.publish(m, outputs)
    return home


OPERATIONS = st.lists(
    st.sampled_from(["synthesis", "labels", "split"]) | st.tuples(st.just("split"), st.integers(0, 3)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_label_stages_in_any_order_and_repeated_leave_every_key_unique(tiny_home, operations):
    warehouse = Warehouse(tiny_home)
    quiet = lambda _message: None  # noqa: E731
    for op in operations:
        if op == "synthesis":
            run_synthesis(warehouse, seed=1, log=quiet)
        elif op == "labels":
            run_labeling(warehouse, embedder="hashing", log=quiet)
        else:
            run_split(warehouse, seed=op[1] if isinstance(op, tuple) else 0, log=quiet)
    for table in TABLE_SCHEMAS:
        outcome = check_unique_key(warehouse, table)
        assert outcome.passed, (operations, outcome.metadata)
