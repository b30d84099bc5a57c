"""Dagster resources: thin wrappers that hand assets the outside systems they use."""

from __future__ import annotations

from dagster import ConfigurableResource

from warehouse.catalog import Warehouse


class WarehouseResource(ConfigurableResource):
    """The DuckDB catalog and Parquet store under ``home`` (default: $STEPWISE_HOME or ./.stepwise)."""

    home: str | None = None

    def get(self) -> Warehouse:
        return Warehouse(self.home)
