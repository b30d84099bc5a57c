"""Benchmark of the CPU reward model (frozen MiniLM segments + trained fusion/head): scoring
throughput, single-call latency, training speed and peak memory.

    python benchmarks/bench_reward_models.py --checkpoint <model folder> [--home <STEPWISE_HOME>]
    python benchmarks/bench_reward_models.py --checkpoint ... --train-examples rm_examples.parquet --train-steps 60
    python benchmarks/bench_reward_models.py --smoke   # a tiny home and model of its own (the test suite)

Measured on the held-out (test) trajectories of the warehouse (``progress_split``), in this order:

1. cold batched scoring: a fresh scorer with an empty embedding cache scores every step of every
   test trajectory in batches (every distinct screen line, action and instruction is encoded once):
   first as the process's first scoring (kernels and thread pools start during it), then in a
   process past its first calls (a scorer warmed on made-up screens), beside the encoder before
   batch invariance (per-tensor int8) timed the same way;
2. warm batched scoring: the same steps again (every segment cached; the fusion/head's cost);
3. deployed batched scoring: a fresh scorer started from the training run's saved cache (the
   screens of the tasks it was trained on), then the test steps;
4. single-call latency: one state per call, trajectories in order (an RL loop calling the
   reward model after each step), cold and from the training cache;
5. training: optimizer steps per second of the Trainer on the real examples (segments cached),
   and the whole-run time from a training summary if given (``--training-summary``);
6. peak resident memory of this process (``ru_maxrss``);
7. the baseline, in the same run: the plain architecture (the same MiniLM reading the whole
   truncated prompt of every state, fp32, mean-pooled, then the head: what the GPU path does)
   on the first ``--baseline-steps`` states, batched and one call at a time.

Without ``--checkpoint`` the latest ProgRM-Env model of the warehouse's ``models`` table is used
(run ``make reward-models`` first). ``--smoke`` builds a temporary home first (a few real
demonstrations, labelled, a ProgRM-Env model trained for 10 steps: ``benchmarks/_smoke.py``), then
runs every part above on a few of its trajectories, training included (3 steps on its examples).

Goals (issue): >= 200 steps/s batched, <= 50 ms p50 per single call on 2 cores, the full
ProgRM-style training split in under 15 minutes. The machine is shared: the load average is
recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from training.reward_models.evaluate import measure_latency, predict_trajectories, trajectory_states  # noqa: E402
from training.reward_models.models import RewardScorer  # noqa: E402


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _batched(scorer: RewardScorer, trajectories) -> dict:
    misses_before = scorer.cache.misses if scorer.cache is not None else 0
    n_steps = sum(len(t) for t in trajectories)
    t0 = time.perf_counter()
    predict_trajectories(scorer, trajectories)
    seconds = time.perf_counter() - t0
    encoded = (scorer.cache.misses - misses_before) if scorer.cache is not None else None
    return {
        "steps": n_steps,
        "seconds": round(seconds, 3),
        "steps_per_second": round(n_steps / seconds, 1),
        "segments_encoded": encoded,
        "segments_encoded_per_step": round(encoded / n_steps, 2) if encoded is not None else None,
    }


def _warm_up(scorer: RewardScorer) -> None:
    """Start the encoder's kernels and thread pools on made-up screens of several lengths (none is a
    test step's text), as a scorer that has run before has them."""
    from training.base.states import StepState

    lines = [" ".join(f"warm-up line {i} word {j}" for j in range(n)) for i, n in enumerate((1, 3, 8, 20, 40))]
    scorer.score_states([StepState(instruction="warm up", history=(), screen_lines=tuple(lines), action="click")] * 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint", default=None, help="an exported reward model folder (default: the latest progrm_env model)"
    )
    parser.add_argument("--home", default=None, help="STEPWISE_HOME with the warehouse (default: $STEPWISE_HOME)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-trajectories", type=int, default=None)
    parser.add_argument(
        "--warm-cache",
        default=None,
        help="the training run's segment cache (default: <home>/cache/segment_embeddings/<fingerprint>)",
    )
    parser.add_argument("--latency-calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-examples", default=None, help="rm_examples Parquet: also time training steps")
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument(
        "--training-summary", default=None, help="training_summary.json of a full run, to report its time"
    )
    parser.add_argument(
        "--baseline-steps", type=int, default=512, help="states scored by the plain full-prompt baseline"
    )
    parser.add_argument("--out", default=None, help="JSON results file (default: <home>/benchmarks/reward_models.json)")
    parser.add_argument(
        "--smoke", action="store_true", help="a temporary home with a tiny trained model; every part at a tiny size"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from training.reward_models.readers import read_splits, read_trajectories
    from training.reward_models.train import default_embedding_cache_dir
    from warehouse.catalog import Warehouse

    if args.smoke:
        from _smoke import smoke_root, trained_home

        args.home = str(trained_home(smoke_root("reward-models") / "home"))
        args.max_trajectories = min(args.max_trajectories or 6, 6)
        args.latency_calls = min(args.latency_calls, 10)
        args.baseline_steps = min(args.baseline_steps, 16)
        args.train_steps = min(args.train_steps, 3)
    warehouse = Warehouse(args.home)
    if args.smoke and args.train_examples is None:
        current = warehouse.current_version("rm_examples", "progrm_env")
        args.train_examples = str(current[1]) if current else None
    if args.checkpoint is None:
        from training.base.registry import latest_models

        latest = latest_models(warehouse, ["progrm_env"])
        if not latest:
            print(
                "bench_reward_models: no trained progrm_env model in the warehouse; run `make reward-models` first "
                "or pass --checkpoint",
                file=sys.stderr,
            )
            return 0
        args.checkpoint = latest[0].checkpoint_path
    results: dict = {
        "threads": args.threads,
        "load_average_start": os.getloadavg(),
        "checkpoint": args.checkpoint,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    ids = [e for e, info in read_splits(warehouse).items() if info.split == args.split]
    trajectories = [t for _, t in sorted(read_trajectories(warehouse, ids).items()) if len(t)]
    if args.max_trajectories:
        trajectories = trajectories[: args.max_trajectories]
    results["trajectories"] = len(trajectories)
    results["steps"] = sum(len(t) for t in trajectories)
    print(
        f"{len(trajectories)} {args.split} trajectories, {results['steps']} steps; threads {args.threads}", flush=True
    )

    t0 = time.perf_counter()
    cold = RewardScorer.from_checkpoint(args.checkpoint)
    results["load_seconds"] = round(time.perf_counter() - t0, 2)
    kind = cold.kind
    results["kind"] = kind
    results["batched_cold_new_process"] = _batched(cold, trajectories)
    print("batched, cold cache, the process's first scoring:", results["batched_cold_new_process"], flush=True)
    results["batched_warm"] = _batched(cold, trajectories)
    print("batched, all cached:", results["batched_warm"], flush=True)
    # The cold figures below compare encoders in a process past its first calls (kernels and thread
    # pools started, as in any scorer that has run before; the shared encoder has just run twice,
    # the old one is warmed below): each scorer starts with an empty cache.
    results["batched_cold"] = _batched(RewardScorer.from_checkpoint(args.checkpoint), trajectories)
    print("batched, cold cache:", results["batched_cold"], flush=True)

    warm_dir = (
        Path(args.warm_cache)
        if args.warm_cache
        else (
            default_embedding_cache_dir(cold.encoder.fingerprint, str(warehouse.home))
            if cold.encoder is not None
            else None
        )
    )
    deployed = RewardScorer.from_checkpoint(
        args.checkpoint, warm_cache=warm_dir if warm_dir and warm_dir.exists() else None
    )
    results["warm_cache_entries"] = len(deployed.cache) if deployed.cache is not None else 0
    results["batched_deployed"] = _batched(deployed, trajectories)
    print(
        f"batched, started from the training cache ({results['warm_cache_entries']} entries):",
        results["batched_deployed"],
        flush=True,
    )

    states = [s for t in trajectories for s in trajectory_states(kind, t)]
    fresh = RewardScorer.from_checkpoint(args.checkpoint)
    results["single_call_cold"] = {
        k: round(v, 2) for k, v in measure_latency(fresh, states[: args.latency_calls]).items()
    }
    print("single call, cold cache:", results["single_call_cold"], flush=True)
    # What batch invariance cost: the same model, cold, with the encoder as it was before issue 21
    # (per-tensor int8, padded batches). Speed only: its embeddings are not those the model saw.
    if cold.encoder is not None:
        from bench_encoder import BaselineEncoder

        baseline_encoder = BaselineEncoder(cold.config.backbone, cold.config.segment_max_tokens)

        def with_old_encoder() -> RewardScorer:
            # the scorer's own cache calls the old encoder; the process's shared encoder is untouched
            scorer = RewardScorer.from_checkpoint(args.checkpoint)
            assert scorer.cache is not None
            scorer.cache.encoder = baseline_encoder  # type: ignore[assignment]
            return scorer

        _warm_up(with_old_encoder())
        results["batched_cold_old_encoder"] = _batched(with_old_encoder(), trajectories)
        old_single = with_old_encoder()
        results["single_call_cold_old_encoder"] = {
            k: round(v, 2) for k, v in measure_latency(old_single, states[: args.latency_calls]).items()
        }
        print("batched / single call, cold, the old encoder:", results["batched_cold_old_encoder"], flush=True)
    deployed_latency = RewardScorer.from_checkpoint(
        args.checkpoint, warm_cache=warm_dir if warm_dir and warm_dir.exists() else None
    )
    results["single_call_deployed"] = {
        k: round(v, 2) for k, v in measure_latency(deployed_latency, states[-args.latency_calls :]).items()
    }
    print("single call, from the training cache:", results["single_call_deployed"], flush=True)
    results["peak_rss_mb_scoring"] = round(_peak_rss_mb(), 1)

    # the baseline: the same backbone over the whole prompt of every state (no segments, no cache)
    from training.base.encoder import default_backbone, load_tokenizer
    from training.reward_models.models import RewardModelConfig, build_reward_model

    plain_config = RewardModelConfig(kind=kind, encoder_mode="full", max_length=512)
    plain = RewardScorer(build_reward_model(plain_config), tokenizer=load_tokenizer(default_backbone()))
    sample = states[: args.baseline_steps]
    t0 = time.perf_counter()
    plain.score_states(sample, batch_size=32)
    seconds = time.perf_counter() - t0
    results["baseline_full_prompt"] = {
        "steps": len(sample),
        "seconds": round(seconds, 3),
        "steps_per_second": round(len(sample) / seconds, 1),
        **{k: round(v, 2) for k, v in measure_latency(plain, sample[: min(len(sample), 60)]).items()},
    }
    print("baseline, MiniLM over the whole prompt (fp32, max 512 tokens):", results["baseline_full_prompt"], flush=True)
    del plain

    if args.train_examples:
        import tempfile

        from training.reward_models.train import parse_args, train_reward_model

        with tempfile.TemporaryDirectory() as tmp:
            model_config, data, training_args = parse_args(
                [
                    "--kind",
                    kind,
                    "--examples",
                    args.train_examples,
                    "--output_dir",
                    tmp,
                    "--max_steps",
                    str(args.train_steps),
                    "--eval_strategy",
                    "no",
                    "--save_steps",
                    "100000",
                    "--logging_steps",
                    "1000",
                    "--disable_tqdm",
                    "true",
                    "--threads",
                    str(args.threads),
                    *(["--embedding_cache_dir", str(warm_dir)] if warm_dir else []),
                ]
            )
            summary = train_reward_model(model_config, data, training_args)
        results["training"] = {
            "steps": summary["global_steps"],
            "seconds": round(summary["train_seconds"], 1),
            "steps_per_second": round(summary["global_steps"] / summary["train_seconds"], 3),
            "examples_per_second": round(summary["global_steps"] * 128 / summary["train_seconds"], 1),
            "encode_seconds": round(summary["encode_seconds"], 1),
            "n_train_examples": summary["n_train_examples"],
            "projected_3_epochs_minutes": round(
                3 * summary["n_train_examples"] / 128 / (summary["global_steps"] / summary["train_seconds"]) / 60, 1
            ),
        }
        print("training:", results["training"], flush=True)
    if args.training_summary:
        full = json.loads(Path(args.training_summary).read_text())
        results["full_training_run"] = {
            k: full.get(k)
            for k in (
                "kind",
                "global_steps",
                "train_seconds",
                "encode_seconds",
                "total_seconds",
                "train_steps_per_second",
                "n_train_examples",
                "peak_rss_mb",
                "used_deepspeed",
            )
        }
        print("full training run:", results["full_training_run"], flush=True)
    results["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    results["load_average_end"] = os.getloadavg()
    out = Path(args.out) if args.out else warehouse.home / "benchmarks" / "reward_models.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    base = results["baseline_full_prompt"]
    print("\n| scoring | batched steps/s | single call p50 ms | p95 ms |\n|---|---:|---:|---:|")
    print(
        f"| baseline: MiniLM over the whole prompt | {base['steps_per_second']} | {base['latency_ms_p50']} | "
        f"{base['latency_ms_p95']} |"
    )
    first = results["batched_cold_new_process"]["steps_per_second"]
    print(f"| segments + cache, cold, the first scoring of a new process | {first} | | |")
    for label, batched, single in (
        ("segments + cache, cold", "batched_cold", "single_call_cold"),
        (
            "the same, cold, encoder before issue 21 (not batch-invariant)",
            "batched_cold_old_encoder",
            "single_call_cold_old_encoder",
        ),
        ("segments + cache, from the training cache", "batched_deployed", "single_call_deployed"),
    ):
        if batched not in results:
            continue
        print(
            f"| {label} | {results[batched]['steps_per_second']} | {results[single]['latency_ms_p50']} | "
            f"{results[single]['latency_ms_p95']} |"
        )
    print(
        f"peak RSS {results['peak_rss_mb']} MB; load average {results['load_average_start']} -> "
        f"{results['load_average_end']}; written to {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
