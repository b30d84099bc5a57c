"""Plain results of the stage packages as Dagster metadata and check results."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    MetadataValue,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
    multi_asset_check,
)

from assets.resources import WarehouseResource
from warehouse.catalog import Warehouse
from warehouse.checks import CheckOutcome, check_unique_key
from warehouse.keys import table_key
from warehouse.plotting import Markdown
from warehouse.schema import TABLE_SCHEMAS


def metadata_value(value: Any) -> Any:
    """The Dagster metadata value for a plain one: markdown (tables, inline figures) renders,
    a Path is a path, containers are JSON, numbers and text stay as they are."""
    if isinstance(value, Markdown):
        return MetadataValue.md(str(value))
    if isinstance(value, Path):
        return MetadataValue.path(str(value))
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, Mapping | list | tuple):
        return MetadataValue.json(value)
    return value


def to_metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`metadata_value` over a mapping (None values are left out)."""
    return {key: metadata_value(value) for key, value in values.items() if value is not None}


def check_result(
    outcome: CheckOutcome, *, check_name: str | None = None, asset_key: str | None = None, warn_only: bool = False
) -> AssetCheckResult:
    """An asset-check result from a stage package's :class:`CheckOutcome`."""
    return AssetCheckResult(
        check_name=check_name,
        asset_key=asset_key,
        passed=outcome.passed,
        metadata=to_metadata(outcome.metadata),
        severity=AssetCheckSeverity.WARN if warn_only else AssetCheckSeverity.ERROR,
        description=outcome.description or None,
    )


def unique_key_checks(asset: str, tables: Mapping[str, pa.Schema | None]) -> AssetChecksDefinition:
    """One check per table an asset writes: no two rows share the table's declared key
    (``warehouse.schema.with_key``), over every current version of the table."""
    specs = [
        AssetCheckSpec(f"{table}_key_unique", asset=asset, description=f"no two rows of {table} share its key")
        for table in tables
    ]

    @multi_asset_check(specs=specs, name=f"{asset}_keys_unique", description=f"table keys of {asset} are unique")
    def keys_unique(warehouse: WarehouseResource) -> Iterator[AssetCheckResult]:
        store = warehouse.get()
        for table, schema in tables.items():
            yield check_result(
                check_unique_key(store, table, schema), check_name=f"{table}_key_unique", asset_key=asset
            )

    return keys_unique


def table_metadata(warehouse: Warehouse, table: str, *, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """Dagster's standard table metadata for the table an asset writes: its column schema (from the
    Arrow schema, with the declared key said in the description) and its row count as SQL users
    see it (the view over every current version), plus the row counts of ``also``."""
    schema = TABLE_SCHEMAS.get(table)
    out: dict[str, Any] = {}
    if schema is not None:
        key = set(table_key(schema))
        out["dagster/column_schema"] = TableSchema(
            columns=[
                TableColumn(
                    name=f.name,
                    type=str(f.type),
                    description="key" if f.name in key else None,
                    constraints=TableColumnConstraints(nullable=f.nullable),
                )
                for f in schema
            ]
        )
    for name in (table, *also):
        try:
            rows = int(warehouse.query(f"SELECT count(*) AS n FROM {name}").to_pylist()[0]["n"])
        except Exception:  # noqa: BLE001 - a table not written yet has no count to report
            continue
        out["dagster/row_count" if name == table else f"rows_{name}"] = rows
    return out
