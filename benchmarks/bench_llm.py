"""Benchmark: the real pretrained LLM (SmolLM2-135M-Instruct) acting in live MiniWoB++ on this CPU.

SmolLM2 with ProgRM Table 11's prompt (``training.llm.policy.HFPolicy``, greedy) runs held-out
seeds of short catalog tasks through the worker pool, next to the scripted expert on the same jobs
(the environment's own speed: no model in the loop). Prints, per policy: success, environment
steps/s, and for the LLM generated tokens/s, prompt tokens per step, the share of answers that do
not parse (each a format failure and a NOTHING step), and the process's peak resident memory.
This is SmolLM2 before any fine-tuning: the starting point of SFT and RL (issue 25).

Run: ``.venv/bin/python benchmarks/bench_llm.py [--tasks click-option,enter-text] [--episodes 6]
[--max-new-tokens 48]``; ``--smoke`` runs one episode of one task (the test suite).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.policies import make_policy  # noqa: E402
from envs.pool import EnvPool, PoolConfig, plan_jobs  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from training.llm.policy import HFPolicy  # noqa: E402
from training.llm.pretrained import load_smollm2  # noqa: E402


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="click-option,enter-text", help="comma-separated catalog tasks")
    parser.add_argument("--episodes", type=int, default=6, help="held-out seeds per task")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--home", default=None, help="where the dequantised copy is kept (default: STEPWISE_HOME)")
    parser.add_argument("--smoke", action="store_true", help="one episode of one task, a temporary home")
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.episodes = args.tasks.split(",")[0], 1
        args.home = args.home or tempfile.mkdtemp(prefix="bench-llm-")
    catalog = load_catalog("miniwob")
    tasks = [catalog[name] for name in args.tasks.split(",")]

    started = time.perf_counter()
    model, tokenizer = load_smollm2(args.home)
    load_s = time.perf_counter() - started
    print(
        f"SmolLM2-135M-Instruct loaded in {load_s:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        f"parameters, float32); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    # held-out seeds: a batch name no training set uses
    jobs = plan_jobs(tasks, batch="llm-heldout", batch_index=77, episodes_per_task=args.episodes)
    llm = HFPolicy(model, tokenizer, policy_id="smollm2", greedy=True, record=True, max_new_tokens=args.max_new_tokens)
    print("\n| policy | episodes | success | steps | env steps/s | tokens/s | prompt tokens/step | unparsed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=1, spares=0)) as pool:
        for name, policy in (("scripted expert (baseline)", make_policy("expert")), ("SmolLM2 greedy", llm)):
            t0 = time.perf_counter()
            result = pool.run(jobs, policy)
            seconds = time.perf_counter() - t0
            success = result.successes / max(1, len(result.episodes))
            row = f"| {name} | {len(result.episodes)} | {success:.0%} | {result.steps} | {result.steps / seconds:.2f} |"
            if policy is llm:
                c = llm.counters
                unparsed = sum(c.format_failures.values()) / max(1, c.steps)
                row += (
                    f" {c.generated_tokens / max(c.seconds, 1e-9):.1f} | {c.prompt_tokens / max(1, c.steps):.0f} "
                    f"| {unparsed:.0%} |"
                )
            else:
                row += " - | - | - |"
            print(row)
    reasons = dict(llm.counters.format_failures)
    print(f"\nwhy answers did not parse: {reasons or 'none'}")
    print(f"peak resident memory of this process: {_peak_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
