"""Training with the Hugging Face Trainer: profiles (ProgRM Table 5), a real run, DeepSpeed ZeRO-2
on CPU with kill-and-resume, and the full fine-tune path on an LLM-shaped backbone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from training.base.states import StepState
from training.reward_models.models import RewardScorer
from training.reward_models.train import (
    CPU_DEFAULTS,
    DS_ZERO2,
    DS_ZERO2_CPU,
    TABLE5_DEFAULTS,
    epochs_for_min_steps,
    last_complete_checkpoint,
    parse_args,
    profile_defaults,
)

REPO = Path(__file__).resolve().parents[3]


def test_llm_profile_is_progrm_table5(tmp_path):
    assert TABLE5_DEFAULTS["bf16"] and TABLE5_DEFAULTS["encoder_mode"] == "full"
    # bf16 needs a GPU: on this CPU machine the profile is parsed with bf16 off
    model_config, data, args = parse_args(
        [
            "--profile",
            "llm",
            "--kind",
            "progrm_env",
            "--output_dir",
            str(tmp_path),
            "--backbone",
            "Qwen/Qwen2.5-7B",
            "--bf16",
            "false",
            "--use_cpu",
            "true",
        ]
    )
    assert model_config.encoder_mode == "full" and args.activation_checkpointing
    assert args.learning_rate == 5e-5 and args.num_train_epochs == 3
    assert args.lr_scheduler_type.value == "cosine" and args.warmup_steps == 0.03
    assert (args.adam_beta1, args.adam_beta2) == (0.9, 0.95)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 128  # one process
    zero = json.loads(DS_ZERO2.read_text())
    assert zero["zero_optimization"]["stage"] == 2 and "scheduler" not in zero  # the Trainer's cosine schedule
    assert json.loads(DS_ZERO2_CPU.read_text())["optimizer"]["params"]["torch_adam"] is True


def test_cpu_profile_defaults(tmp_path):
    model_config, data, args = parse_args(["--kind", "orm", "--output_dir", str(tmp_path)])
    assert model_config.encoder_mode == "frozen_segments" and model_config.quantize_encoder
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 128
    assert args.num_train_epochs == 3 and (args.adam_beta1, args.adam_beta2) == (0.9, 0.95)
    assert args.use_cpu and args.save_steps == args.eval_steps == 200
    # every kind gets a budget of ~3,000 steps (the ORM's one example per trajectory: more epochs)
    # and stops when its validation loss has not fallen for 3 evaluations, keeping the best checkpoint
    assert data.min_optimizer_steps == 3000 and data.early_stopping_patience == 3
    assert args.load_best_model_at_end and args.metric_for_best_model == "loss" and not args.greater_is_better
    assert epochs_for_min_steps(10_584, args, data.min_optimizer_steps) == 37  # 83 steps an epoch
    assert epochs_for_min_steps(42_762, args, data.min_optimizer_steps) == 9  # 335 steps an epoch
    _, _, bounded = parse_args(["--kind", "orm", "--output_dir", str(tmp_path), "--max_steps", "5"])
    assert epochs_for_min_steps(10_584, bounded, 1000) == 3
    _, llm_data, llm_args = parse_args(
        ["--profile", "llm", "--kind", "orm", "--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    )
    assert llm_data.min_optimizer_steps == 0 and llm_data.early_stopping_patience == 0  # Table 5 as published
    assert not llm_args.load_best_model_at_end


def test_early_stopping_needs_evaluations_and_checkpoints_on_them(tmp_path):
    base = ["--kind", "orm", "--output_dir", str(tmp_path)]
    _, data, args = parse_args([*base, "--eval_strategy", "no"])
    assert data.early_stopping_patience == 3 and not args.load_best_model_at_end  # nothing to select on
    _, _, off = parse_args([*base, "--early_stopping_patience", "0"])
    assert not off.load_best_model_at_end
    for save_steps in ("150", "400"):  # 400: the Trainer could not go back to a best step it did not save
        with pytest.raises(ValueError, match=rf"--save_steps \({save_steps}\) must equal --eval_steps \(200\)"):
            parse_args([*base, "--save_steps", save_steps])
    _, _, every_100 = parse_args([*base, "--save_steps", "100", "--eval_steps", "100"])
    assert every_100.load_best_model_at_end and every_100.eval_steps == 100


def _evaluated_orm_argv(tiny_examples, tmp_path) -> list[str]:
    """An ORM on the tiny examples, evaluated and saved every 4 steps (the early-stopping tests')."""
    return [
        *("--kind", "orm", "--examples", str(tiny_examples["orm"]), "--output_dir", str(tmp_path / "trainer")),
        *("--embedding_cache_dir", str(tmp_path / "cache"), "--per_device_train_batch_size", "8"),
        *("--warmup_steps", "0", "--eval_steps", "4", "--save_steps", "4", "--logging_steps", "4"),
        *("--disable_tqdm", "true", "--threads", "1"),
    ]


def test_early_stopping_exports_the_checkpoint_with_the_lowest_validation_loss(tiny_examples, tmp_path):
    """A learning rate far too large for this tiny set: the validation loss turns up, training stops
    ``patience`` evaluations after its minimum, and the exported weights are that checkpoint's."""
    from safetensors.torch import load_file

    from training.reward_models.models import WEIGHTS_FILE
    from training.reward_models.train import train_reward_model

    argv = _evaluated_orm_argv(tiny_examples, tmp_path) + [
        "--num_train_epochs",
        "200",
        "--min_optimizer_steps",
        "0",
        "--learning_rate",
        "3e-2",
        "--early_stopping_patience",
        "2",
        "--select_by",
        "loss",
    ]
    summary = train_reward_model(*parse_args(argv))
    evals = [
        (e["step"], e["eval_loss"])
        for e in json.loads((Path(last_complete_checkpoint(tmp_path / "trainer")) / "trainer_state.json").read_text())[
            "log_history"
        ]
        if "eval_loss" in e
    ]
    best_step, best_loss = min(evals, key=lambda e: e[1])
    assert summary["stopped_early"] and summary["global_steps"] < summary["max_steps"]
    assert summary["exported_step"] == best_step and summary["global_steps"] == best_step + 2 * 4
    assert summary["validation_metrics"]["loss"] == pytest.approx(best_loss)
    assert [tuple(e) for e in summary["validation_loss_curve"]] == evals and summary["loss_curve"][-1][0] <= summary[
        "global_steps"
    ]
    exported = load_file(str(Path(summary["export_dir"]) / WEIGHTS_FILE))
    at_best = load_file(str(tmp_path / "trainer" / f"checkpoint-{best_step}" / "model.safetensors"))
    assert exported.keys() == at_best.keys() and all((exported[k] == at_best[k]).all() for k in exported)

    # the same command again (a retried asset run): the run had finished, so no more training
    again = train_reward_model(*parse_args(argv))
    assert again["resumed_from"].endswith(f"checkpoint-{summary['global_steps']}")
    assert again["global_steps"] == summary["global_steps"] and again["exported_step"] == best_step
    assert again["stopped_early"] and again["max_steps"] == summary["max_steps"]
    exported = load_file(str(Path(again["export_dir"]) / WEIGHTS_FILE))
    assert all((exported[k] == at_best[k]).all() for k in exported)


def test_same_examples_and_seed_train_the_same_model(tiny_examples, tmp_path):
    """Training is a function of its examples and ``--seed``, not of the process's random state:
    torch's default generator starts from a random seed, and the head used to be built before
    anything seeded it (``stepwise reward-models`` run twice gave two different models)."""
    from safetensors.torch import load_file

    from training.reward_models.models import WEIGHTS_FILE
    from training.reward_models.train import train_reward_model

    def train(folder: str, generator_state: int) -> dict:
        torch.manual_seed(generator_state)  # whatever ran before in this process
        argv = [
            "--kind",
            "orm",
            "--examples",
            str(tiny_examples["orm"]),
            "--output_dir",
            str(tmp_path / folder),
            "--embedding_cache_dir",
            str(tmp_path / folder / "cache"),
            "--max_steps",
            "6",
            "--per_device_train_batch_size",
            "8",
            "--eval_strategy",
            "no",
            "--disable_tqdm",
            "true",
            "--threads",
            "1",
        ]
        summary = train_reward_model(*parse_args(argv))
        return load_file(str(Path(summary["export_dir"]) / WEIGHTS_FILE))

    first, second = train("first", 1), train("second", 2)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_trained_model_learns_progress(trained_progrm, tiny_examples):
    summary = json.loads((trained_progrm.parent / "training_summary.json").read_text())
    assert summary["global_steps"] == 60 and summary["kind"] == "progrm_env" and not summary["used_deepspeed"]
    assert summary["label_versions"] == ["env-test-v1"]
    scorer = RewardScorer.from_checkpoint(trained_progrm)
    rows = pq.read_table(tiny_examples["progrm_env"]).to_pylist()
    states = [StepState(r["instruction"], tuple(r["history"]), tuple(r["screen_lines"])) for r in rows]
    scores = scorer.score_states(states)
    labels = np.array([r["label"] for r in rows])
    assert np.all((scores >= 0) & (scores <= 1))
    assert scores[labels == 1.0].mean() > scores[labels == 0.0].mean() + 0.3  # it learned the labels
    assert np.corrcoef(scores, labels)[0, 1] > 0.5


def _train_argv(kind: str, examples: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.reward_models.train",
        "--kind",
        kind,
        "--examples",
        str(examples),
        "--output_dir",
        str(out / "trainer"),
        "--embedding_cache_dir",
        str(out / "cache"),
        "--per_device_train_batch_size",
        "8",
        "--logging_steps",
        "20",
        "--eval_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--threads",
        "1",
        *extra,
    ]


def _env() -> dict:
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TORCH_EXTENSIONS_DIR": str(Path.home() / ".cache" / "stepwise" / "torch_extensions"),
    }


@pytest.mark.e2e
def test_deepspeed_zero2_on_cpu_kill_and_resume(tiny_examples, tmp_path):
    """Real DeepSpeed ZeRO-2 (gloo, one CPU process): killed (SIGKILL) after a checkpoint, started
    again with the same command, it resumes from that checkpoint and finishes."""
    argv = _train_argv(
        "progrm_lcs",
        tiny_examples["progrm_lcs"],
        tmp_path,
        "--deepspeed",
        str(DS_ZERO2_CPU),
        "--max_steps",
        "300",
        "--save_steps",
        "10",
        "--save_total_limit",
        "3",
        "--global_batch_size",
        "32",
    )  # 4 accumulation steps of 8
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and last_complete_checkpoint(tmp_path / "trainer") is None:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    killed_at = last_complete_checkpoint(tmp_path / "trainer")
    assert killed_at is not None, (tmp_path / "first.log").read_text()[-3000:]
    step_at_kill = int(Path(killed_at).name.split("-")[1])
    assert step_at_kill < 300 and not (tmp_path / "trainer" / "final").exists()
    ds_dirs = [p for p in Path(killed_at).iterdir() if p.name.startswith("global_step")]  # a DeepSpeed checkpoint
    assert ds_dirs and any(f.name.startswith("zero_pp_rank_0") for f in ds_dirs[0].iterdir())  # ZeRO optimizer shards

    second = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    summary = json.loads((tmp_path / "trainer" / "training_summary.json").read_text())
    assert summary["used_deepspeed"] and summary["global_steps"] == 300
    assert summary["resumed_from"] is not None and int(summary["resumed_from"].rsplit("-", 1)[1]) >= step_at_kill
    state = json.loads((tmp_path / "trainer" / "checkpoint-300" / "trainer_state.json").read_text())
    logged_steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert logged_steps == sorted(logged_steps) and logged_steps[-1] == 300  # one history, continued
    assert state["log_history"][0]["loss"] < 1.5  # a BCE averaged over accumulation steps, not summed
    assert summary["training_arguments"]["gradient_accumulation_steps"] == 4
    # DeepSpeed's engine accumulates as the Trainer does (it steps the optimizer itself)
    assert summary["deepspeed_batch"] == {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
    }
    scorer = RewardScorer.from_checkpoint(tmp_path / "trainer" / "final")
    assert 0 <= scorer.score_states([StepState("Click ok", (), ('button "ok"',))])[0] <= 1


@pytest.mark.e2e
def test_full_finetune_path_on_a_decoder(tiny_causal_lm_path, tiny_examples, tmp_path):
    """The GPU path (full fine-tune, last-token pooling) through the same script, on a tiny Qwen2
    whose tokenizer matches it: a prompt round-trips and fits the length budget (with MiniLM's BERT
    tokenizer beside a Qwen2 config every prompt was cut into single characters)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    prompt = 'Enter the username "renda" and press login\ntextbox#username [clickable, editable]'
    ids = tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(ids) == prompt and len(ids) < len(prompt) / 2
    argv = _train_argv(
        "orm",
        tiny_examples["orm"],
        tmp_path,
        "--backbone",
        tiny_causal_lm_path,
        "--encoder_mode",
        "full",
        "--max_length",
        "384",
        "--max_steps",
        "4",
        "--learning_rate",
        "1e-4",
        "--save_steps",
        "2",
        "--activation_checkpointing",
        "true",
        "--global_batch_size",
        "16",
    )
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    final = tmp_path / "trainer" / "final"
    assert (final / "backbone" / "config.json").exists() and (final / "backbone" / "tokenizer.json").exists()
    scorer = RewardScorer.from_checkpoint(final)
    assert scorer.config.encoder_mode == "full" and scorer.model.pooling == "last_token"
    score = scorer.score_states([StepState("Click ok", ('CLICK(button "ok")',), ('button "ok"',))])
    assert score.shape == (1,) and 0 < score[0] < 1


@pytest.mark.e2e
def test_activation_checkpointing_is_in_effect_under_deepspeed(tiny_causal_lm_path, tiny_examples, tmp_path):
    """Full mode under DeepSpeed ZeRO-2 with --activation_checkpointing: the backbone the engine
    trains checkpoints its layers (the summary reads it off the trained model, not the flag)."""
    argv = _train_argv(
        "orm",
        tiny_examples["orm"],
        tmp_path,
        "--backbone",
        tiny_causal_lm_path,
        "--encoder_mode",
        "full",
        "--max_length",
        "256",
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--deepspeed",
        str(DS_ZERO2_CPU),
        "--activation_checkpointing",
        "true",
    )
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "trainer" / "training_summary.json").read_text())
    assert summary["used_deepspeed"] and summary["activation_checkpointing"] == {"requested": True, "active": True}


def test_per_device_batch_follows_the_backbone_size():
    from training.reward_models.train import per_device_batch_for

    # a 7B model: Table 5's 4 per device; the rest of 128 is accumulation over 8 GPUs (4 x 8 x 4)
    assert per_device_batch_for(128, 8, 7_000_000_000) == 4
    assert per_device_batch_for(128, 1, 1_500_000_000) == 16
    assert per_device_batch_for(128, 1, 189_000_000) == 32  # small backbones are host-bound at 4
    assert per_device_batch_for(8, 4, 189_000_000) == 2  # never more than a device's share


def test_hopper_arch_list_is_made_readable_for_deepspeed():
    from training.reward_models.train import cuda_arch_list_for_deepspeed

    assert cuda_arch_list_for_deepspeed("9.0a") == "9.0"
    assert cuda_arch_list_for_deepspeed("8.0;9.0a+PTX") == "8.0;9.0+PTX"
    assert cuda_arch_list_for_deepspeed("7.5 8.6") == "7.5 8.6"


def test_llm_profile_trains_in_float32_on_a_machine_without_cuda():
    """Table 5's bf16 is for GPUs; without CUDA the llm profile trains on the CPU in float32."""
    assert profile_defaults("llm", cuda=True)["bf16"] and "use_cpu" not in profile_defaults("llm", cuda=True)
    on_cpu = profile_defaults("llm", cuda=False)
    assert not on_cpu["bf16"] and on_cpu["use_cpu"] and on_cpu["learning_rate"] == TABLE5_DEFAULTS["learning_rate"]
    assert profile_defaults("cpu", cuda=False) == CPU_DEFAULTS and TABLE5_DEFAULTS["bf16"]  # nothing else changes


@pytest.mark.e2e
def test_smollm2_as_the_backbone_of_a_progress_reward_model(tiny_examples, tmp_path):
    """ProgRM's design with a real pretrained LLM: ``--backbone smollm2`` resolves to the packaged
    SmolLM2-135M (dequantised once per machine, linked into the home), the whole model is fine-tuned a few steps in
    float32 on this CPU, and the exported model scores states in (0, 1), pooled at the last token."""
    home = tmp_path / "home"
    argv = _train_argv(
        "progrm_lcs",
        tiny_examples["progrm_lcs"],
        tmp_path,
        "--profile",
        "llm",
        "--backbone",
        "smollm2",
        "--home",
        str(home),
        "--max_length",
        "256",
        "--max_steps",
        "2",
        "--global_batch_size",
        "4",
        "--per_device_train_batch_size",
        "2",
        "--eval_strategy",
        "no",
        "--save_steps",
        "2",
    )
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (home / "models" / "llm" / "smollm2-135m-instruct" / "model.safetensors").is_file()
    summary = json.loads((tmp_path / "trainer" / "training_summary.json").read_text())
    assert summary["model_config"]["backbone"].endswith("smollm2-135m-instruct")
    assert summary["global_steps"] == 2 and not summary["training_arguments"]["bf16"]
    scorer = RewardScorer.from_checkpoint(tmp_path / "trainer" / "final")
    assert scorer.config.encoder_mode == "full" and scorer.model.pooling == "last_token"
    assert scorer.model.backbone.config.num_hidden_layers == 30  # SmolLM2-135M, not a tiny stand-in
    states = [StepState("Click ok", ('CLICK(button "ok")',), ('button "ok"',)), StepState("Type a", (), ())]
    scores = scorer.score_states(states)
    assert scores.shape == (2,) and np.all((scores > 0) & (scores < 1))
    assert np.array_equal(scorer.score_states(states[:1]), scores[:1])  # alone = batched


def test_selection_by_within_task_auc_exports_the_checkpoint_that_ranks_validation_episodes_best(
    tiny_examples, tmp_path
):
    """Issue 41 item 2: by default (``--select_by auto``, the tiny validation split has tasks with
    both outcomes) early stopping and the exported checkpoint follow the validation episodes'
    within-task AUC, and the training examples are balanced within tasks; both are in the summary."""
    from training.reward_models.train import train_reward_model

    argv = _evaluated_orm_argv(tiny_examples, tmp_path) + [
        "--max_steps",
        "24",
        "--learning_rate",
        "3e-3",
        "--early_stopping_patience",
        "10",
    ]
    summary = train_reward_model(*parse_args(argv))
    assert summary["selected_by"] == "within_task_auc" and summary["balanced_within_task"]
    curve = [tuple(e) for e in summary["validation_within_task_auc_curve"]]
    assert [step for step, _ in curve] == list(range(4, 25, 4))
    best = max(auc for _, auc in curve)
    assert summary["exported_step"] == next(step for step, auc in curve if auc == best)  # the first best
    assert summary["validation_metrics"]["within_task_auc"] == pytest.approx(best)
    with pytest.raises(ValueError, match="--select_by must be auto, loss or within_task_auc"):
        train_reward_model(*parse_args([*argv, "--select_by", "auc"]))
