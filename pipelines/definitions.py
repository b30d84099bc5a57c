"""The Stepwise Dagster code location: one Definitions for the whole asset graph."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from assets.ingest import INGEST_CHECKS, human_demonstrations
from assets.labels import LABEL_ASSETS, LABEL_CHECKS
from assets.rollouts import ROLLOUT_ASSETS, ROLLOUT_CHECKS, ROLLOUT_JOBS, ROLLOUT_RESOURCES
from pipelines.resources import WarehouseResource

# Everything unpartitioned, on embedded defaults: what `make demo` runs after a batch of rollouts
# (rollouts are partitioned by task family x batch and run by their own jobs).
main_job = define_asset_job(
    "stepwise_main",
    selection=AssetSelection.all() - AssetSelection.groups("rollouts"),
    description="The whole unpartitioned asset graph on embedded defaults.",
)

defs = Definitions(
    assets=[human_demonstrations, *ROLLOUT_ASSETS, *LABEL_ASSETS],
    asset_checks=[*INGEST_CHECKS, *ROLLOUT_CHECKS, *LABEL_CHECKS],
    jobs=[main_job, *ROLLOUT_JOBS],
    resources={"warehouse": WarehouseResource(), **ROLLOUT_RESOURCES},
)
