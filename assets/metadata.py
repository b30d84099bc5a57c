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
    multi_asset_check,
)

from assets.resources import WarehouseResource
from warehouse.checks import CheckOutcome, check_unique_key
from warehouse.figures import Markdown


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
