"""Train a reward model (ORM, ProgRM, PRM, GuidNav) with the Hugging Face Trainer, optionally under DeepSpeed.

The same script runs on this CPU machine and on GPUs:

    # CPU default (frozen MiniLM segments + trained fusion/head), plain Trainer:
    python -m training.reward_models.train --kind progrm_lcs --examples rm_examples.parquet --output_dir runs/progrm_lcs

    # CPU with DeepSpeed ZeRO-2 (gloo), as CI runs it:
    python -m training.reward_models.train --kind orm --examples ... --output_dir ... \
        --deepspeed training/ds_zero2_cpu.json

    # GPUs: full fine-tune of an LLM with ProgRM Table 5's hyper-parameters under ZeRO-2:
    deepspeed --num_gpus 8 --module training.reward_models.train --profile llm --kind progrm_env \
        --backbone /models/Qwen2.5-7B --encoder_mode full --examples ... --output_dir ... \
        --deepspeed training/ds_zero2.json

    # This CPU: ProgRM's design (LLM + MLP + sigmoid) with the packaged SmolLM2-135M as the LLM,
    # in float32 (the llm profile without CUDA), on a seeded slice of the examples:
    python -m training.reward_models.train --profile llm --backbone smollm2 --kind progrm_lcs \
        --home .stepwise --output_dir runs/progrm_lcs_smollm2 --max_train_examples 256

``--backbone`` takes a Hugging Face folder or hub id, ``smollm2`` (the packaged SmolLM2) or a
``.gguf`` file (both dequantised once per machine and linked into ``<home>/models/llm/``, ``training.base.pretrained``).
``--profile`` picks the defaults of every argument not given: ``llm`` = ProgRM Table 5 (lr 5e-5,
global batch 128, 3 epochs, cosine, warm-up 0.03, Adam betas 0.9/0.95, bf16, ZeRO-2); ``cpu`` =
sized for two cores (a larger learning rate for the freshly initialised fusion and head, same
batch, schedule and betas). Checkpoints (model, optimizer, scheduler, RNG, data position) are
written every ``--save_steps``; a run started again with the same ``--output_dir`` resumes from
the last one (``--resume auto``, the default), also after a kill.

The examples come from the ``rm_examples`` table (``training.rm_datasets``): Parquet files given
with ``--examples``, or the warehouse's current version read from ``--home``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from training.base.encoder import EmbeddingCache, SegmentEncoder, load_tokenizer
from training.base.pretrained import resolve_checkpoint
from training.reward_models.kinds import KINDS
from training.reward_models.models import (
    RewardModel,
    RewardModelConfig,
    build_reward_model,
    save_reward_model,
    segment_features,
)
from training.reward_models.train_data import (
    DataArguments,
    EpochLengthGroupedSampler,
    GroupedLengthSampler,
    IndexDataset,
    PromptCollator,
    SegmentCollator,
    SplitCollator,
    SplitExamples,
    episode_metrics,
    read_split_examples,
    resolve_selection,
)

if TYPE_CHECKING:
    from transformers import TrainerCallback

log = logging.getLogger("training.reward_models.train")

REPO_TRAINING_DIR = Path(__file__).resolve().parents[1]  # training/, where the DeepSpeed configs are
DS_ZERO2 = REPO_TRAINING_DIR / "ds_zero2.json"
DS_ZERO2_CPU = REPO_TRAINING_DIR / "ds_zero2_cpu.json"
SUMMARY_FILE = "training_summary.json"

#: ProgRM App. D, Table 5 (LLM scale; the Adam betas are from App. D's text).
TABLE5_DEFAULTS: dict = {
    "learning_rate": 5e-5,
    "global_batch_size": 128,
    "per_device_train_batch_size": 0,  # 0: from the backbone's size (per_device_batch_for); 4 for a 7B model
    "per_device_eval_batch_size": 8,
    "num_train_epochs": 3.0,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "weight_decay": 0.0,
    "bf16": True,
    "activation_checkpointing": True,
    "encoder_mode": "full",
    "quantize_encoder": False,
    "save_steps": 200,
    "logging_steps": 10,
}

#: Two CPU cores: the frozen-segment model; the fusion and head start from scratch, so a larger
#: learning rate; otherwise Table 5's schedule, batch and betas.
CPU_DEFAULTS: dict = {
    "learning_rate": 1e-3,
    "global_batch_size": 128,
    "per_device_train_batch_size": 128,
    "per_device_eval_batch_size": 512,
    "num_train_epochs": 3.0,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "weight_decay": 0.01,
    "use_cpu": True,
    "encoder_mode": "frozen_segments",
    "logging_steps": 25,
    "dataloader_num_workers": 0,
    # Every kind trains until its validation loss stops falling, within the same optimizer budget:
    # the ORM has one example per trajectory (10.6k here, 83 steps an epoch), ProgRM one per step
    # (43k, 335 steps an epoch), and either stopped after a fixed 3 epochs is far from converged,
    # which makes any comparison between them a comparison of training budgets.
    "min_optimizer_steps": 3000,
    "eval_strategy": "steps",
    "eval_steps": 200,
    "save_steps": 200,
    "early_stopping_patience": 3,
}

PROFILES = {"llm": TABLE5_DEFAULTS, "cpu": CPU_DEFAULTS}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Environment for DeepSpeed on one CPU process
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_arch_list_for_deepspeed(arch_list: str) -> str:
    """``TORCH_CUDA_ARCH_LIST`` as DeepSpeed 0.19's op builder parses it: GPU images set Hopper as
    ``9.0a`` (the arch-specific variant), which the builder cannot read; ``9.0`` builds the same ops.
    Separators (spaces or semicolons) and ``+PTX`` are kept."""
    import re

    return re.sub(r"(\d+\.\d+)a\b", r"\1", arch_list)


def prepare_deepspeed_environment() -> None:
    """Make a plain ``python`` start work with DeepSpeed: a one-process 'cluster' on 127.0.0.1
    (else DeepSpeed looks for MPI), a persistent cache for compiled ops, and on CPU with one
    process no shared-memory all-reduce op (it would be compiled, 35-65 s, to talk to nobody)."""
    if "RANK" not in os.environ:
        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
            }
        )
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "stepwise" / "torch_extensions"))
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list_for_deepspeed(arch)
    if not torch.cuda.is_available() and os.environ.get("WORLD_SIZE", "1") == "1":
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None):
    """(model config, data arguments, TrainingArguments) with the chosen profile's defaults."""
    from transformers import HfArgumentParser, TrainingArguments

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    pre.add_argument("--deepspeed", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.deepspeed:  # before TrainingArguments exist: they start the distributed state
        prepare_deepspeed_environment()
    # transformers types dataclass_types with a NewType over Any that no class satisfies
    parser = HfArgumentParser((RewardModelConfig, DataArguments, TrainingArguments))  # type: ignore[arg-type]
    defaults = {
        "report_to": "none",
        "save_total_limit": 2,
        "eval_strategy": "epoch",
        "save_strategy": "steps",
        "remove_unused_columns": False,
        "label_names": ["labels"],
        "logging_first_step": True,
        "seed": 13,
        # a resumed run continues early stopping's count instead of starting it again
        "restore_callback_states_from_checkpoint": True,
    }
    parser.set_defaults(**(defaults | profile_defaults(known.profile)))
    model_config, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    # "smollm2" or a .gguf file: the dequantised copy kept under the home (training.base.pretrained)
    model_config.backbone = resolve_checkpoint(model_config.backbone, data_args.home)
    if training_args.per_device_train_batch_size <= 0:  # "auto": what the backbone's size allows
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_device = per_device_batch_for(
            data_args.global_batch_size or 128, world, approximate_parameters(model_config.backbone)
        )
        training_args = replace(training_args, per_device_train_batch_size=per_device)
    if data_args.global_batch_size:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_step = training_args.per_device_train_batch_size * world
        # replace(), not assignment: __post_init__ fills DeepSpeed's "auto" batch values from it again
        training_args = replace(
            training_args, gradient_accumulation_steps=max(1, math.ceil(data_args.global_batch_size / per_step))
        )
    return model_config, data_args, with_best_model_selection(training_args, data_args.early_stopping_patience)


def profile_defaults(profile: str, *, cuda: bool | None = None) -> dict:
    """The profile's defaults for this machine. Table 5's bf16 is for GPUs: without CUDA the ``llm``
    profile trains in float32 on the CPU (bf16 autocast on a CPU without bf16 units is slower and
    less exact); anything given on the command line still wins."""
    defaults = dict(PROFILES[profile])
    if cuda is None:
        cuda = torch.cuda.is_available()
    if profile == "llm" and not cuda:
        defaults |= {"bf16": False, "use_cpu": True}
    return defaults


def approximate_parameters(backbone: str) -> int:
    """A transformer backbone's parameter count from its config alone (no weights loaded):
    12 h^2 L for the blocks plus the embeddings. 0 when the config cannot be read."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(backbone)
    except (OSError, ValueError):
        return 0
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    return 12 * hidden * hidden * layers + vocab * hidden


def per_device_batch_for(global_batch: int, world_size: int, n_parameters: int) -> int:
    """Examples per device per forward pass for a global batch, by backbone size (full fine-tune in
    bf16 with activation checkpointing under ZeRO-2, 80 GB devices). Table 5's 4 per device is what
    a 7B model fits; a small backbone at 4 per device leaves the GPU idle most of the time (11%
    utilisation measured on an H100 with a 189M model: 9.2 s a step at 4 per device against 2.2 s at
    32, for the same global batch of 128), so smaller models take larger micro-batches. The rest of
    the global batch is gradient accumulation."""
    if n_parameters >= 4_000_000_000:
        cap = 4
    elif n_parameters >= 1_000_000_000:
        cap = 16
    else:
        cap = 32
    share = max(1, global_batch // max(1, world_size))
    per_device = 1
    while per_device * 2 <= min(cap, share):
        per_device *= 2
    return per_device


def with_best_model_selection(args, patience: int):
    """``args`` with the Trainer's best-checkpoint selection on the validation loss turned on when
    early stopping is asked for and there are evaluations (``--eval_strategy no`` turns both off).
    The best checkpoint must be one the Trainer saved, so checkpoints fall on evaluations."""
    from transformers.trainer_utils import IntervalStrategy

    if patience <= 0 or args.eval_strategy == IntervalStrategy.NO:
        return args
    if args.eval_strategy == IntervalStrategy.STEPS and args.save_steps != args.eval_steps:
        # the Trainer can only return to an evaluated step it also saved
        raise ValueError(
            f"--early_stopping_patience {patience} keeps the checkpoint with the lowest validation loss, so "
            f"--save_steps ({args.save_steps:g}) must equal --eval_steps ({args.eval_steps:g}); "
            "or pass --early_stopping_patience 0"
        )
    # replace() runs TrainingArguments' own validation again with the new values
    return replace(args, load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=False)


def epochs_for_min_steps(n_examples: int, args, min_steps: int) -> float:
    """The epochs to train: ``args.num_train_epochs``, or more whole epochs where those give fewer
    than ``min_steps`` optimizer steps (batches of per-device size x world size, ``gradient
    accumulation`` batches a step). A run bounded by ``max_steps`` keeps its epochs."""
    if min_steps <= 0 or args.max_steps > 0 or n_examples <= 0:
        return args.num_train_epochs
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = math.ceil(n_examples / (args.per_device_train_batch_size * world))
    steps_per_epoch = max(1, batches // max(1, args.gradient_accumulation_steps))
    return max(args.num_train_epochs, float(math.ceil(min_steps / steps_per_epoch)))


def default_embedding_cache_dir(encoder_fingerprint: str, home: str | None = None) -> Path:
    """``<home>/cache/segment_embeddings/<encoder fingerprint>`` (home: --home or $STEPWISE_HOME)."""
    from training.base.encoder import segment_cache_dir
    from warehouse.storage import stepwise_home

    return segment_cache_dir(Path(home) if home else stepwise_home(), encoder_fingerprint)


@dataclass
class _ModelSetup:
    """The model to train, the collators of both splits, and what building them took."""

    model: RewardModel
    train_collator: SegmentCollator | PromptCollator
    eval_collator: SegmentCollator | PromptCollator
    tokenizer: object | None = None  # full mode only: exported with the model
    encode_seconds: float = 0.0  # frozen_segments mode: time spent encoding segments


#: The TrainingArguments recorded in the training summary.
_SUMMARY_TRAINING_ARGUMENTS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "lr_scheduler_type",
    "warmup_steps",
    "adam_beta1",
    "adam_beta2",
    "weight_decay",
    "bf16",
    "seed",
    "save_steps",
)


def train_reward_model(model_config: RewardModelConfig, data: DataArguments, args) -> dict:
    """Train one reward model and export it; returns the summary also written to
    ``<output_dir>/training_summary.json``."""
    from transformers import set_seed

    torch.set_num_threads(max(1, data.threads))
    # Seeded before the model is built: the Trainer seeds only in its own constructor, after the
    # head's weights are drawn, and torch's default generator starts from a random seed, so
    # without this two runs on the same examples trained two different models.
    set_seed(args.seed)
    started = time.time()
    kind = model_config.kind
    examples = read_split_examples(data, kind)
    # checked before any encoding: a bad --select_by fails in a moment, not after minutes of work
    selected_by = resolve_selection(data.select_by, examples.eval_episodes)
    if model_config.encoder_mode == "frozen_segments":
        setup = _frozen_segments_setup(model_config, data, examples)
    else:
        setup = _full_model_setup(model_config, args, examples)
    _settle_epochs_and_evaluation(args, data, kind, examples)
    if args.load_best_model_at_end and selected_by == "within_task_auc":
        # replace(), not assignment: TrainingArguments checks the pair again
        args = replace(args, metric_for_best_model="within_task_auc", greater_is_better=True)
    trainer = _make_trainer(setup, examples, data, args)
    resume_from, finished = _resume_point(data, args)
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=resume_from)
    train_seconds = time.time() - t0
    metrics = _final_eval_metrics(trainer) if len(examples.eval_states) else {}
    export_dir = Path(data.export_dir or Path(args.output_dir) / "final")
    summary = _training_summary(
        model_config,
        data,
        args,
        trainer,
        result,
        examples,
        metrics=metrics,
        export_dir=export_dir,
        resume_from=resume_from,
        finished=finished,
        started=started,
        encode_seconds=setup.encode_seconds,
        train_seconds=train_seconds,
    )
    if trainer.is_world_process_zero():
        _export(trainer, setup, export_dir, summary, args.output_dir)
    log.info(
        "trained %s: %d of %d steps in %.0fs (%s); exported step %d, validation %s",
        kind,
        summary["global_steps"],
        summary["max_steps"],
        train_seconds,
        "stopped early" if summary["stopped_early"] else "ran to the end",
        summary["exported_step"],
        summary["validation_metrics"],
    )
    return summary


def _frozen_segments_setup(
    model_config: RewardModelConfig, data: DataArguments, examples: SplitExamples
) -> _ModelSetup:
    """Encode every state's segments through the shared embedding cache and build the model over them."""
    encoder = SegmentEncoder(model_config.encoder_config())
    cache = EmbeddingCache(encoder, max_entries=10**8)
    cache_dir = (
        Path(data.embedding_cache_dir)
        if data.embedding_cache_dir
        else default_embedding_cache_dir(encoder.fingerprint, data.home)
    )
    loaded = cache.load(cache_dir)
    t0 = time.time()
    train_features = _features_with_progress(examples.train_states, cache, model_config, "train")
    eval_features = _features_with_progress(examples.eval_states, cache, model_config, "validation")
    encode_seconds = time.time() - t0
    log.info("segment cache: %d loaded, %d encoded in %.1fs", loaded, cache.misses, encode_seconds)
    if cache.misses and int(os.environ.get("RANK", "0")) == 0:
        cache.save(cache_dir)
    matrix = torch.from_numpy(cache.matrix.copy())
    model = build_reward_model(model_config, input_dim=encoder.hidden_size)
    return _ModelSetup(
        model,
        SegmentCollator(train_features, examples.train_labels, matrix, examples.train_groups, examples.train_weights),
        SegmentCollator(eval_features, examples.eval_labels, matrix, examples.eval_groups),
        encode_seconds=encode_seconds,
    )


def _full_model_setup(model_config: RewardModelConfig, args, examples: SplitExamples) -> _ModelSetup:
    """Load the tokenizer and the whole backbone, trained on the kind's tokenized prompts."""
    tokenizer = load_tokenizer(model_config.backbone)
    # Under DeepSpeed bf16 the weights may load in bf16 (DeepSpeed keeps fp32 master weights in
    # its partitioned optimizer); without it, fp32 weights and the Trainer's bf16 autocast.
    dtype = torch.bfloat16 if (args.bf16 and args.deepspeed) else None
    model = build_reward_model(model_config, torch_dtype=dtype)
    return _ModelSetup(
        model,
        PromptCollator(
            examples.train_states,
            examples.train_labels,
            tokenizer,
            model_config,
            examples.train_groups,
            examples.train_weights,
        ),
        PromptCollator(examples.eval_states, examples.eval_labels, tokenizer, model_config, examples.eval_groups),
        tokenizer=tokenizer,
    )


def _settle_epochs_and_evaluation(args, data: DataArguments, kind: str, examples: SplitExamples) -> None:
    """Raise the epochs to reach ``--min_optimizer_steps``, and turn evaluation off without validation data."""
    epochs = epochs_for_min_steps(len(examples.train_states), args, data.min_optimizer_steps)
    if epochs > args.num_train_epochs:
        log.info(
            "%s: %g epochs instead of %g, to reach %d optimizer steps",
            kind,
            epochs,
            args.num_train_epochs,
            data.min_optimizer_steps,
        )
        args.num_train_epochs = epochs
    if not len(examples.eval_states):
        args.eval_strategy = "no"
        args.load_best_model_at_end = False


def _make_trainer(setup: _ModelSetup, examples: SplitExamples, data: DataArguments, args):
    """A Trainer over both splits, batching by length, with early stopping when asked for."""
    from transformers import Trainer

    n_train, n_eval = len(examples.train_states), len(examples.eval_states)
    lengths = _example_lengths(setup.train_collator, n_train)
    eval_lengths = _example_lengths(setup.eval_collator, n_eval)
    # in order of length, a state's alternatives next to each other (the pairwise loss sees them together)
    eval_groups = examples.eval_groups.ids if examples.eval_groups.any else np.full(n_eval, -1)
    eval_order = np.lexsort((np.arange(n_eval), eval_groups, np.asarray(eval_lengths))).tolist()
    grouped = examples.train_groups.any

    class RewardTrainer(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            # Batches of similar length (little padding): the cost of the fusion transformer grows
            # with the longest state in a batch, and screens range from 5 to 100+ elements.
            size = self.args.per_device_train_batch_size
            if grouped:
                return GroupedLengthSampler(size, lengths, examples.train_groups.ids, seed=self.args.seed)
            return EpochLengthGroupedSampler(size, lengths, seed=self.args.seed)

        def _get_eval_sampler(self, eval_dataset):
            # the same reason: validation in order of length (predictions and labels stay paired)
            if eval_dataset is not None and len(eval_dataset) == len(eval_order):
                return eval_order
            return super()._get_eval_sampler(eval_dataset)

    callbacks: list[TrainerCallback] = []
    if args.load_best_model_at_end and data.early_stopping_patience > 0:
        from transformers import EarlyStoppingCallback

        callbacks.append(EarlyStoppingCallback(early_stopping_patience=data.early_stopping_patience))
    if data.max_train_seconds > 0:
        callbacks.append(time_budget_callback(data.max_train_seconds))
    return RewardTrainer(
        model=setup.model,
        args=args,
        train_dataset=IndexDataset(n_train, "train"),
        eval_dataset=IndexDataset(n_eval, "validation") if n_eval else None,
        data_collator=SplitCollator(train=setup.train_collator, validation=setup.eval_collator),
        compute_metrics=episode_metrics(examples.eval_episodes, eval_order, setup.model.rm_config.kind),
        callbacks=callbacks,
    )


def _callbacks(trainer) -> list:
    return list(getattr(getattr(trainer, "callback_handler", None), "callbacks", []))


def time_budget_callback(seconds: float) -> TrainerCallback:
    """Ends training after the first optimizer step past ``seconds`` from its start (the Trainer then
    saves and exports as after a finished schedule; the learning rate has not reached the schedule's
    end). Sets ``stopped_by_time_budget`` on itself for the summary."""
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def __init__(self) -> None:
            self.started: float | None = None
            self.stopped_by_time_budget = False

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if self.started is not None and time.monotonic() - self.started > seconds:
                self.stopped_by_time_budget = True
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


def _resume_point(data: DataArguments, args) -> tuple[str | None, EarlyStop | None]:
    """The checkpoint to resume from, and whether its run had stopped early (then only export again)."""
    resume_from: str | None = None
    if data.resume == "auto":
        resume_from = last_complete_checkpoint(args.output_dir)
    elif data.resume != "never":
        resume_from = data.resume
    finished = early_stop_of(resume_from) if resume_from else None
    if resume_from:
        log.info("resuming from %s", resume_from)
    if finished:
        # finished already: no more steps, only the export of its best checkpoint
        args.max_steps = finished.step
        log.info("%s stopped early at step %d; exporting again without training", resume_from, finished.step)
    return resume_from, finished


def _training_summary(
    model_config: RewardModelConfig,
    data: DataArguments,
    args,
    trainer,
    result,
    examples: SplitExamples,
    *,
    metrics: dict,
    export_dir: Path,
    resume_from: str | None,
    finished: EarlyStop | None,
    started: float,
    encode_seconds: float,
    train_seconds: float,
) -> dict:
    """The run's summary: what was trained on what, how far and how fast, with which settings."""
    return {
        "kind": model_config.kind,
        "model_config": model_config.to_dict(),
        "export_dir": str(export_dir),
        "output_dir": str(args.output_dir),
        "global_steps": int(trainer.state.global_step),
        "max_steps": finished.budget if finished else int(trainer.state.max_steps),
        "stopped_early": bool(finished) or int(trainer.state.global_step) < int(trainer.state.max_steps),
        "stopped_by_time_budget": any(getattr(c, "stopped_by_time_budget", False) for c in _callbacks(trainer)),
        # the exported weights: the checkpoint with the lowest validation loss, else the last step
        "exported_step": best_step(trainer) or int(trainer.state.global_step),
        "train_seconds": train_seconds,
        "encode_seconds": encode_seconds,
        "total_seconds": time.time() - started,
        "train_steps_per_second": float(result.metrics.get("train_steps_per_second", 0.0)),
        "train_loss": float(result.metrics.get("train_loss", float("nan"))),
        "n_train_examples": len(examples.train_states),
        "balanced_within_task": examples.balanced_within_task,
        # examples of episodes an RL run's reward misranked (issue 41 item 2), and their loss weight
        "exploit_examples": examples.train_exploit_examples,
        "exploit_weight": examples.exploit_weight,
        # what early stopping and the exported checkpoint were chosen by (loss | within_task_auc)
        "selected_by": args.metric_for_best_model if args.load_best_model_at_end else None,
        # whose validation episodes the within-task AUC ranks: the agent's own where they allow it
        "selection_episodes": examples.selection_episodes,
        "n_validation_examples": len(examples.eval_states),
        "validation_metrics": {k.removeprefix("eval_"): v for k, v in metrics.items()},
        "label_versions": examples.label_versions,
        "used_deepspeed": bool(args.deepspeed),
        # asked for, and in effect on the backbone the engine trained (full mode only)
        "activation_checkpointing": {
            "requested": bool(getattr(args, "activation_checkpointing", False)),
            "active": bool(getattr(trainer.model, "is_activation_checkpointing", False)),
        },
        # what the DeepSpeed engine was configured with (its "auto" values filled in by the Trainer)
        "deepspeed_batch": {
            k: args.hf_deepspeed_config.config.get(k)
            for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        }
        if args.deepspeed
        else None,
        "resumed_from": resume_from,
        "dataset_materialization_id": data.dataset_materialization_id,
        "training_arguments": {k: getattr(args, k) for k in _SUMMARY_TRAINING_ARGUMENTS},
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "peak_rss_mb": _peak_rss_mb(),
        # (step, training loss) and (step, validation loss) for the training-curve plot
        "loss_curve": [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e],
        "validation_loss_curve": [(e["step"], e["eval_loss"]) for e in trainer.state.log_history if "eval_loss" in e],
        "validation_within_task_auc_curve": [
            (e["step"], e["eval_within_task_auc"]) for e in trainer.state.log_history if "eval_within_task_auc" in e
        ],
    }


def _export(trainer, setup: _ModelSetup, export_dir: Path, summary: dict, output_dir: str) -> None:
    """Save the trained model with the summary as its metadata, and the summary file beside the checkpoints."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else setup.model
    save_reward_model(unwrapped, export_dir, tokenizer=setup.tokenizer, metadata=summary)
    (Path(output_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))


def best_step(trainer) -> int | None:
    """The step of the checkpoint the Trainer loaded as the best one (``load_best_model_at_end``)."""
    best = trainer.state.best_model_checkpoint
    if not (trainer.args.load_best_model_at_end and best):
        return None
    return int(Path(best).name.removeprefix("checkpoint-"))


def _final_eval_metrics(trainer) -> dict:
    """The validation metrics of the exported weights: from the log when they were evaluated during
    training (the best checkpoint, or the last step), else a fresh evaluation."""
    step = best_step(trainer) or trainer.state.global_step
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry and entry.get("step") == step:
            return {k: v for k, v in entry.items() if k.startswith("eval_")}
    return trainer.evaluate()


@dataclass(frozen=True)
class EarlyStop:
    step: int  # where training decided to stop
    budget: int  # the optimizer steps it had been given


def early_stop_of(checkpoint: str | Path) -> EarlyStop | None:
    """Where and within which budget training stopped, if it had decided to stop at ``checkpoint``
    (early stopping); None for a checkpoint of a run still under way."""
    try:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    control = state.get("stateful_callbacks", {}).get("TrainerControl", {})
    if not control.get("args", {}).get("should_training_stop"):
        return None
    return EarlyStop(step=int(state["global_step"]), budget=int(state["max_steps"]))


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` whose ``trainer_state.json`` (written last by the Trainer)
    exists and parses: a run killed while writing a checkpoint resumes from the one before."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    candidates = []
    for path in folder.glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if path.is_dir() and suffix.isdigit():
            candidates.append((int(suffix), path))
    for _, path in sorted(candidates, reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            log.warning("checkpoint %s is incomplete (killed while saving?); skipping it", path)
            continue
        return str(path)
    return None


def _example_lengths(collator, n: int) -> list[int]:
    """Per-example input length (segments or prompt characters), for length-grouped batches."""
    if isinstance(collator, SegmentCollator):
        return np.diff(collator.features.offsets).astype(int).tolist()
    return [len(s.screen_lines) + len(s.history) for s in collator.states[:n]]


def _features_with_progress(states, cache: EmbeddingCache, config: RewardModelConfig, name: str, chunk: int = 4096):
    """Segment features in chunks, logging progress (the first run encodes every distinct text)."""
    from training.reward_models.models import SegmentFeatures

    if not states:
        return segment_features([], cache, config)
    parts = []
    for start in range(0, len(states), chunk):
        parts.append(segment_features(states[start : start + chunk], cache, config))
        log.info(
            "%s: segments of %d/%d states (cache %d entries)",
            name,
            min(start + chunk, len(states)),
            len(states),
            len(cache),
        )
    offsets = [parts[0].offsets]
    for p in parts[1:]:
        offsets.append(p.offsets[1:] + offsets[-1][-1])
    return SegmentFeatures(
        rows=np.concatenate([p.rows for p in parts]),
        types=np.concatenate([p.types for p in parts]),
        positions=np.concatenate([p.positions for p in parts]),
        depths=np.concatenate([p.depths for p in parts]),
        offsets=np.concatenate(offsets),
        history_lengths=np.concatenate([p.history_lengths for p in parts]),
        match=np.concatenate([p.match for p in parts]),
    )


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_config, data_args, training_args = parse_args(argv)
    if model_config.kind not in KINDS:
        raise SystemExit(f"unknown kind {model_config.kind}")
    summary = train_reward_model(model_config, data_args, training_args)
    print(json.dumps({k: summary[k] for k in ("kind", "global_steps", "train_seconds", "export_dir")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
