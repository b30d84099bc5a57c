"""Data checks as plain results: stage modules compute them, ``assets/`` reports them to Dagster
as asset checks (so the checks run, and are testable, without Dagster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from warehouse.keys import table_key
from warehouse.schema import TABLE_SCHEMAS

if TYPE_CHECKING:
    from warehouse.catalog import Warehouse


@dataclass(frozen=True)
class CheckOutcome:
    """Whether a check passed, and the figures that show why (asset-check metadata)."""

    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def check_unique_key(warehouse: Warehouse, table_name: str, schema: pa.Schema | None = None) -> CheckOutcome:
    """No two rows of ``table_name`` (the view over every current version) share its declared key
    (``warehouse.schema.with_key``); NULLs count as values. Reports how many keys repeat, with
    examples."""
    schema = schema if schema is not None else TABLE_SCHEMAS.get(table_name)
    key = table_key(schema) if schema is not None else ()
    if not key:
        return CheckOutcome(False, {"problem": f"table {table_name} declares no key"})
    columns = ", ".join(key)
    try:
        rows = warehouse.query(
            f"SELECT {columns}, count(*) AS copies FROM {table_name} GROUP BY ALL HAVING count(*) > 1 "
            f"ORDER BY copies DESC LIMIT 1000"
        ).to_pylist()
    except duckdb.CatalogException:  # never written: nothing can repeat
        rows = []
    return CheckOutcome(
        not rows,
        {"table": table_name, "key": list(key), "repeated_keys": len(rows), "examples": rows[:5]},
        f"no two rows of {table_name} share ({columns})",
    )
