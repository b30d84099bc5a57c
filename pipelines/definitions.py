"""The Stepwise Dagster code location: one Definitions for the whole asset graph."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from assets.annotation import ANNOTATION_ASSETS, ANNOTATION_CHECKS, ANNOTATION_SENSORS
from assets.ingest import INGEST_CHECKS, human_demonstrations
from assets.labels import LABEL_ASSETS, LABEL_CHECKS
from assets.resources import RESOURCES
from assets.reward_models import GROUP as REWARD_MODEL_GROUP
from assets.reward_models import KIND_PARTITIONS, REWARD_MODEL_ASSETS, REWARD_MODEL_CHECKS
from assets.rollouts import ROLLOUT_ASSETS, ROLLOUT_CHECKS, ROLLOUT_JOBS

# Everything unpartitioned and offline, on embedded defaults: what `make demo` runs after a batch
# of rollouts. Rollouts are partitioned (task family x batch) and run by their own jobs; the
# annotation stage talks to people through Label Studio and runs by its own job and sensor.
main_job = define_asset_job(
    "stepwise_main",
    selection=AssetSelection.all()
    - AssetSelection.groups("rollouts")
    - AssetSelection.groups("annotation")
    - AssetSelection.groups(REWARD_MODEL_GROUP),
    description="The whole unpartitioned asset graph on embedded defaults (no Label Studio).",
)
reward_models_job = define_asset_job(
    "reward_models",
    selection=AssetSelection.assets("reward_model_datasets", "reward_model"),
    partitions_def=KIND_PARTITIONS,
    description="Dataset and model of one reward-model kind (partition).",
)
reward_model_report_job = define_asset_job(
    "reward_model_evaluation",
    selection=AssetSelection.assets("reward_model_report"),
    description="ORM vs ProgRM-LCS vs ProgRM-Env (and PRM) on the held-out split.",
)
annotation_job = define_asset_job(
    "annotation_push",
    selection=AssetSelection.assets("annotation_candidates", "annotation_queue"),
    description="Pick the least certain steps under a budget and push them to Label Studio.",
)

defs = Definitions(
    assets=[human_demonstrations, *ROLLOUT_ASSETS, *LABEL_ASSETS, *ANNOTATION_ASSETS, *REWARD_MODEL_ASSETS],
    asset_checks=[*INGEST_CHECKS, *ROLLOUT_CHECKS, *LABEL_CHECKS, *ANNOTATION_CHECKS, *REWARD_MODEL_CHECKS],
    jobs=[main_job, annotation_job, reward_models_job, reward_model_report_job, *ROLLOUT_JOBS],
    sensors=ANNOTATION_SENSORS,
    resources=RESOURCES,
)
