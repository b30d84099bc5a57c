"""Plain results of the stage packages as Dagster metadata and check results."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from warehouse.checks import CheckOutcome
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
