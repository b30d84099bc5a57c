"""The RL stage's checks say what is true: ``sft_policy_is_ready`` compares the SFT policy's held-out
evaluations with the tasks of both its blocks (dense and sparse), not with the dense block alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from training.policy.sft_stage import check_sft_policy
from warehouse.catalog import Materialization, Warehouse
from warehouse.tables_rl import AGENT_EVAL, POLICIES

DENSE = ["click-tab-2-medium", "login-user"]
SPARSE = ["book-flight-nodelay", "use-spinner"]


def _publish(wh: Warehouse, table: str, schema: pa.Schema, rows: list[dict]) -> None:
    base = dict.fromkeys(schema.names)
    m = Materialization(asset="policy_sft")
    wh.publish(m, [wh.stage_table(table, "sft", pa.Table.from_pylist([base | r for r in rows], schema=schema), m)])


def _sft(wh: Warehouse, evaluated: list[str]) -> None:
    _publish(
        wh,
        "policies",
        POLICIES,
        [
            {
                "policy_id": "sft-1",
                "kind": "sft",
                "tasks": DENSE,  # the dense block, as policy_sft records it
                "parameters": json.dumps({"task_blocks": {"dense": DENSE, "sparse": SPARSE}}),
                "created_at": datetime(2026, 11, 27, tzinfo=UTC),
            }
        ],
    )
    _publish(
        wh,
        "agent_eval",
        AGENT_EVAL,
        [{"policy_id": "sft-1", "evaluation": "held_out", "task_id": t, "episodes": 8} for t in evaluated],
    )


def test_an_sft_policy_evaluated_on_both_blocks_is_ready(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _sft(wh, DENSE + SPARSE)  # what policy_sft does: every RL run is paired with SFT on its tasks
    outcome = check_sft_policy(wh)
    assert outcome.passed, outcome.metadata
    assert outcome.metadata["tasks"] == 4 and outcome.metadata["evaluated"] == 4 and outcome.metadata["missing"] == []


def test_an_sft_policy_missing_a_sparse_task_is_not_ready(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _sft(wh, DENSE + SPARSE[:1])
    outcome = check_sft_policy(wh)
    assert not outcome.passed
    assert outcome.metadata["missing"] == ["use-spinner"]


def test_no_sft_policy_is_not_ready(tmp_path):
    assert not check_sft_policy(Warehouse(tmp_path / "home")).passed


def test_long_tasks_get_extra_selection_seeds_from_the_same_range(tmp_path):
    """Issue 41 item 3: the sparse rule's candidates (a median demonstrated solution of at least
    sparse_min_solution_steps) are judged on sparse_selection_seeds episodes, the first
    selection_seeds among them; a short task keeps selection_seeds."""
    from tests.training.conftest import build_tiny_warehouse
    from training.policy.episodes import catalog_tasks
    from training.policy.evaluation import sample_seeds
    from training.policy.sft_stage import PolicySettings, long_task_selection_seeds
    from training.policy.store import SELECTION_SEED_BASE

    warehouse = build_tiny_warehouse(tmp_path / "home", n_login=8, n_button=4)  # login-user: 4 steps
    tasks = catalog_tasks(["login-user", "enter-text"])
    first = sample_seeds(SELECTION_SEED_BASE, 4, "selection")
    settings = PolicySettings(selection_seeds=4, sparse_selection_seeds=10, sparse_min_solution_steps=3.0)
    extra = long_task_selection_seeds(warehouse, settings, tasks, first)
    assert list(extra) == ["login-user"]  # enter-text has no demonstration here: not a long task
    assert len(extra["login-user"]) == 6 and not set(extra["login-user"]) & set(first)
    assert sorted(first + extra["login-user"]) == sample_seeds(SELECTION_SEED_BASE, 10, "selection")
    shorter = PolicySettings(selection_seeds=4, sparse_selection_seeds=10, sparse_min_solution_steps=5.0)
    assert long_task_selection_seeds(warehouse, shorter, tasks, first) == {}  # 4 steps is not long
    none_extra = PolicySettings(selection_seeds=4, sparse_selection_seeds=0, sparse_min_solution_steps=3.0)
    assert long_task_selection_seeds(warehouse, none_extra, tasks, first) == {}
