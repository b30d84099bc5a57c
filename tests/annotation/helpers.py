"""Helpers shared by the labels tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tests.training.conftest import build_tiny_warehouse
from warehouse.catalog import Materialization, Warehouse


def publish_tiny_episodes(home: Path, dataset: str, prefix: str, seed: int, **sizes) -> None:
    """Publish the tiny training warehouse's episodes and steps into ``home`` as ``dataset``, every
    episode id prefixed (so each call adds new episodes: login-user and click-button ones)."""
    tiny = build_tiny_warehouse(home.parent / f"tiny-{dataset}", seed=seed, **sizes)
    warehouse = Warehouse(home)
    m = Materialization(asset="human_demonstrations")
    outputs = []
    for name in ("episodes", "steps"):
        table = tiny.query(f"SELECT * FROM {name}")
        ids = pa.array([prefix + e for e in table.column("episode_id").to_pylist()], pa.string())
        table = table.set_column(table.schema.get_field_index("episode_id"), "episode_id", ids)
        outputs.append(warehouse.stage_table(name, dataset, table, m))
    warehouse.publish(m, outputs)
