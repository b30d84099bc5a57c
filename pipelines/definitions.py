"""The Stepwise Dagster code location: one Definitions for the whole asset graph."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from assets.demonstrations import DEMONSTRATION_ASSETS, DEMONSTRATION_CHECKS
from assets.flywheel import FLYWHEEL_ASSETS, FLYWHEEL_CHECKS, FLYWHEEL_JOBS
from assets.guidance import GUIDANCE_ASSETS, GUIDANCE_CHECKS, GUIDANCE_JOBS
from assets.human_labels import HUMAN_LABEL_ASSETS, HUMAN_LABEL_CHECKS, HUMAN_LABEL_JOBS, HUMAN_LABEL_SENSORS
from assets.labels import LABEL_ASSETS, LABEL_CHECKS, LABEL_JOBS, LABEL_SENSORS
from assets.llm import LLM_ASSETS, LLM_JOBS
from assets.rationales import RATIONALE_ASSETS, RATIONALE_CHECKS
from assets.resources import RESOURCES
from assets.reward_models import GROUP as REWARD_MODEL_GROUP
from assets.reward_models import REWARD_MODEL_ASSETS, REWARD_MODEL_CHECKS, REWARD_MODEL_JOBS
from assets.rl import RL_ASSETS, RL_CHECKS, RL_JOBS
from assets.rollouts import ROLLOUT_ASSETS, ROLLOUT_CHECKS, ROLLOUT_JOBS

# Everything offline on embedded defaults: what `make demo` runs after a batch of rollouts, as one
# run over every label family (recipes and progress labels are partitioned by label family; the
# other assets here are not). Rollouts are partitioned (task family x batch) and run by their own
# jobs; the annotation stage talks to people through Label Studio and runs by its own job and sensor.
main_job = define_asset_job(
    "stepwise_main",
    selection=AssetSelection.all()
    - AssetSelection.groups("rollouts")
    - AssetSelection.groups("human_labels")
    - AssetSelection.groups(REWARD_MODEL_GROUP)
    - AssetSelection.groups("rl")
    - AssetSelection.groups("llm")
    - AssetSelection.groups("guidance")
    - AssetSelection.groups("flywheel"),
    description="Import, synthesis, recipes and progress labels, split and label report on embedded defaults "
    "(no Label Studio); launch it over every label family (or a backfill of them) to relabel everything.",
)

defs = Definitions(
    assets=[
        *DEMONSTRATION_ASSETS,
        *ROLLOUT_ASSETS,
        *LABEL_ASSETS,
        *HUMAN_LABEL_ASSETS,
        *RATIONALE_ASSETS,
        *REWARD_MODEL_ASSETS,
        *RL_ASSETS,
        *LLM_ASSETS,
        *GUIDANCE_ASSETS,
        *FLYWHEEL_ASSETS,
    ],
    asset_checks=[
        *DEMONSTRATION_CHECKS,
        *ROLLOUT_CHECKS,
        *LABEL_CHECKS,
        *HUMAN_LABEL_CHECKS,
        *RATIONALE_CHECKS,
        *REWARD_MODEL_CHECKS,
        *RL_CHECKS,
        *GUIDANCE_CHECKS,
        *FLYWHEEL_CHECKS,
    ],
    jobs=[
        main_job,
        *LABEL_JOBS,
        *HUMAN_LABEL_JOBS,
        *REWARD_MODEL_JOBS,
        *ROLLOUT_JOBS,
        *RL_JOBS,
        *LLM_JOBS,
        *GUIDANCE_JOBS,
        *FLYWHEEL_JOBS,
    ],
    sensors=[*LABEL_SENSORS, *HUMAN_LABEL_SENSORS],
    resources=RESOURCES,
)
