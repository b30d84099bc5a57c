"""A code location holding only the rollout stage, for the CLI and webserver tests (the project's
pipelines/definitions.py wires the same lists into the whole graph)."""

from dagster import Definitions

from assets.resources import EnvPoolResource, WarehouseResource
from assets.rollouts import ROLLOUT_ASSETS, ROLLOUT_CHECKS, ROLLOUT_JOBS

defs = Definitions(
    assets=ROLLOUT_ASSETS,
    asset_checks=ROLLOUT_CHECKS,
    jobs=ROLLOUT_JOBS,
    resources={"env_pool": EnvPoolResource(), "warehouse": WarehouseResource()},
)
