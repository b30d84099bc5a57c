"""The Stepwise Dagster code location: one Definitions for the whole asset graph."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from assets.ingest import INGEST_CHECKS, human_demonstrations
from assets.labels import LABEL_ASSETS, LABEL_CHECKS
from pipelines.resources import WarehouseResource

# Everything that exists so far, on embedded defaults: what `make demo` runs.
main_job = define_asset_job("stepwise_main", selection=AssetSelection.all(), description="The whole asset graph on embedded defaults.")

defs = Definitions(
    assets=[human_demonstrations, *LABEL_ASSETS],
    asset_checks=[*INGEST_CHECKS, *LABEL_CHECKS],
    jobs=[main_job],
    resources={"warehouse": WarehouseResource()},
)
