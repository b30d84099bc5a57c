"""Writing the labels stage's tables as they are produced, and where each task's rows live.

Labels are stored per *label family* (a dataset ``labels/<family>`` of each table: the task
families of the environment catalog, plus ``other`` for tasks outside it), so that one family
can be relabelled, or new episodes of it labelled, without rewriting the others: the SQL views
union every current dataset, so readers see one ``progress_labels`` table whatever wrote it.
"""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from envs.task_catalog import families, load_catalog, miniwob_family_of
from warehouse.catalog import Materialization, TableOutput, Warehouse
from warehouse.storage import REPO_ROOT, slug

OTHER_FAMILY = "other"
DEFAULT_SPECS_DIR = REPO_ROOT / "envs" / "task_specs"


def default_specs_dir() -> str:
    """The task specs' folder: ``$STEPWISE_TASK_SPECS``, else the repository's ``envs/task_specs``."""
    return os.environ.get("STEPWISE_TASK_SPECS", str(DEFAULT_SPECS_DIR))


@lru_cache(maxsize=1)
def android_families() -> dict[str, str]:
    try:
        return {task_id: task.family for task_id, task in load_catalog("android").items()}
    except Exception:  # noqa: BLE001 - no Android specs: no Android family
        return {}


def label_families() -> list[str]:
    """Every label family: the MiniWoB++ catalog's, the Android catalog's, and ``other``."""
    android = sorted(set(android_families().values()))
    return [*families("miniwob"), *android, OTHER_FAMILY]


def label_family(task_id: str) -> str:
    """The label family of a task (a pure function of its id)."""
    return miniwob_family_of(task_id) or android_families().get(task_id) or OTHER_FAMILY


def family_dataset(family: str) -> str:
    """The dataset of a label family's rows in each labels table."""
    return f"labels/{family}"


class TableWriter:
    """One version of one (table, dataset), written batch by batch through a Parquet writer to a
    temporary file, renamed into place on :meth:`close`; it becomes current when the
    materialization is published (:meth:`warehouse.catalog.Warehouse.publish`)."""

    def __init__(self, warehouse: Warehouse, table_name: str, dataset: str, schema: pa.Schema, m: Materialization):
        self.table_name = table_name
        self.dataset = dataset
        self.schema = schema
        self.path = warehouse.data_dir / table_name / slug(dataset) / f"{m.materialization_id}.parquet"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        self.writer: pq.ParquetWriter | None = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        assert self.writer is not None, "writer closed"
        if not table.schema.equals(self.schema, check_metadata=False):
            table = table.cast(self.schema)
        self.writer.write_table(table, row_group_size=64_000)
        self.rows += table.num_rows

    def close(self) -> TableOutput:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            os.replace(self.tmp, self.path)
        return TableOutput(self.table_name, self.dataset, self.path, self.rows)

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.tmp.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)
