"""A code location holding only the rollout stage, for the CLI and webserver tests (the project's
pipelines/definitions.py wires the same lists into the whole graph)."""

from dagster import Definitions

from assets.rollouts import ROLLOUT_ASSETS, ROLLOUT_CHECKS, ROLLOUT_JOBS, ROLLOUT_RESOURCES
from pipelines.resources import WarehouseResource

defs = Definitions(
    assets=ROLLOUT_ASSETS,
    asset_checks=ROLLOUT_CHECKS,
    jobs=ROLLOUT_JOBS,
    resources={**ROLLOUT_RESOURCES, "warehouse": WarehouseResource()},
)
