"""Benchmark: the real pretrained LLM (SmolLM2-135M-Instruct) acting in live MiniWoB++ on this CPU.

SmolLM2 with ProgRM Table 11's prompt (``training.llm.policy.HFPolicy``, greedy) runs held-out
seeds of short catalog tasks through the worker pool, next to the scripted expert on the same jobs
(the environment's own speed: no model in the loop), in several ways side by side (issue 25
item 2):

* ``free``: ``model.generate`` writes free text, then a forward pass scores it (the path before
  constrained decoding; answers may not parse);
* ``constrained``: decoding under the action grammar (``training.llm.action_grammar``), forced
  format tokens, the prompt's keys and values reused across steps;
* ``constrained, no KV reuse``: the same without the prompt cache (what the cache saves);
* ``constrained int8`` / ``bf16`` (``--precisions``): acting with a lower-precision copy
  (``training.llm.precision``); how far its greedy choices and log-probs are from float32 is
  measured on the float32 constrained row's own turns (teacher-forced: same states, same masks).

Per row: success, environment steps/s, seconds per step, generated tokens/s (all, and sampled
only), tokens per step (forced + sampled), prompt tokens per step (and how many came from the
cache), the share of answers that do not parse, and the process's peak resident memory so far
(rows run in order, so a row's figure includes the rows before it). This is SmolLM2 before any
fine-tuning: the starting point of SFT and RL (issue 25).

Run: ``.venv/bin/python benchmarks/bench_llm.py [--tasks click-option,enter-text] [--episodes 3]
[--max-steps 6] [--max-new-tokens 48] [--precisions int8,bf16]``; ``--smoke`` runs one episode of
one task with 3 steps of at most 24 new tokens and only the free and constrained rows (the test suite).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.policies import make_policy  # noqa: E402
from envs.pool import EnvPool  # noqa: E402
from envs.pool_jobs import PoolConfig, plan_jobs  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from training.base.pretrained import load_smollm2  # noqa: E402
from training.llm.policy import HFPolicy  # noqa: E402
from training.llm.precision import acting_copy, logp_drift  # noqa: E402

#: The page's episode clock for every row: an LLM on this CPU needs seconds per step, and the
#: benchmark's default 10 s would end its episodes before the second action.
EPISODE_CLOCK_MS = 600_000


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="click-option,enter-text", help="comma-separated catalog tasks")
    parser.add_argument("--episodes", type=int, default=3, help="held-out seeds per task")
    parser.add_argument("--max-steps", type=int, default=6, help="step budget per episode (all rows)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--precisions", default="int8,bf16", help="lower-precision acting rows: int8, bf16 or none")
    parser.add_argument("--home", default=None, help="where the dequantised copy is kept (default: STEPWISE_HOME)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one episode of one task, 3 steps of at most 24 new tokens, a temporary home; only the free and "
        "constrained rows",
    )
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.episodes, args.max_steps = args.tasks.split(",")[0], 1, 3
        args.max_new_tokens = min(args.max_new_tokens, 24)
        args.home = args.home or tempfile.mkdtemp(prefix="bench-llm-")
        args.precisions = "none" if "--precisions" not in sys.argv else args.precisions
    catalog = load_catalog("miniwob")
    tasks = [catalog[name] for name in args.tasks.split(",")]
    precisions = [p for p in args.precisions.split(",") if p and p != "none"]

    started = time.perf_counter()
    model, tokenizer = load_smollm2(args.home)
    load_s = time.perf_counter() - started
    print(
        f"SmolLM2-135M-Instruct loaded in {load_s:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        f"parameters, float32); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    # held-out seeds: a batch name no training set uses
    jobs = plan_jobs(
        tasks, batch="llm-heldout", batch_index=77, episodes_per_task=args.episodes, max_steps=args.max_steps
    )
    common = {"greedy": True, "record": True, "max_new_tokens": args.max_new_tokens}
    rows: list[tuple[str, object]] = [  # (name, policy, or the precision of a copy to act with)
        ("scripted expert (baseline)", make_policy("expert")),
        ("SmolLM2 greedy free", HFPolicy(model, tokenizer, policy_id="smollm2-free", constrained=False, **common)),
        ("SmolLM2 greedy constrained", HFPolicy(model, tokenizer, policy_id="smollm2-constrained", **common)),
    ]
    if not args.smoke:
        no_reuse = HFPolicy(model, tokenizer, policy_id="smollm2-nocache", prefix_cache_size=0, **common)
        rows.append(("SmolLM2 constrained, no KV reuse", no_reuse))
    # the copies are made just before their rows (made here, they would count in every row's peak RSS)
    for precision in precisions:
        rows.append((f"SmolLM2 constrained {precision}", precision))
    copies: dict[str, object] = {}
    print(
        "\n| policy | episodes | success | steps | env steps/s | s/step | tokens/s all (sampled) "
        "| tokens/step forced+sampled | prompt tokens/step (cached) | unparsed | peak RSS MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failures: dict[str, dict[str, int]] = {}
    ran: list[tuple[str, object]] = []
    with EnvPool(MiniWoBConfig(episode_max_time_ms=EPISODE_CLOCK_MS), PoolConfig(workers=1, spares=0)) as pool:
        for name, policy in rows:
            print(f"  load average {os.getloadavg()[0]:.1f} before: {name}", file=sys.stderr, flush=True)
            if isinstance(policy, str):  # a precision: act with a copy of the model in it
                copies[policy] = acting_copy(model, policy)
                policy = HFPolicy(copies[policy], tokenizer, policy_id=f"smollm2-{policy}", **common)
            ran.append((name, policy))
            t0 = time.perf_counter()
            result = pool.run(jobs, policy)  # type: ignore[arg-type]
            seconds = time.perf_counter() - t0
            success = result.successes / max(1, len(result.episodes))
            row = (
                f"| {name} | {len(result.episodes)} | {success:.0%} | {result.steps} "
                f"| {result.steps / seconds:.2f} | {seconds / max(1, result.steps):.2f} |"
            )
            if isinstance(policy, HFPolicy):
                c = policy.counters
                steps = max(1, c.steps)
                unparsed = sum(c.format_failures.values()) / steps
                gen_s = max(c.seconds, 1e-9)
                row += (
                    f" {c.generated_tokens / gen_s:.1f} ({c.sampled_tokens / gen_s:.1f}) "
                    f"| {c.forced_tokens / steps:.1f}+{c.sampled_tokens / steps:.1f} "
                    f"| {c.prompt_tokens / steps:.0f} ({c.reused_prompt_tokens / steps:.0f}) "
                    f"| {unparsed:.0%} |"
                )
                failures[name] = dict(c.format_failures)
            else:
                row += " - | - | - | - |"
            print(row + f" {_peak_rss_mb():.0f} |", flush=True)
    print(f"\nwhy answers did not parse: {({k: v for k, v in failures.items() if v}) or 'none'}")
    for name, policy in ran:
        if isinstance(policy, HFPolicy) and policy.constrained:
            calls = Counter(t.action_text.split("(")[0] for turns in policy.turns.values() for t in turns)
            print(f"actions of {name}: {dict(calls.most_common())}")
    reference_turns = [t for turns in rows[2][1].turns.values() for t in turns]  # type: ignore[attr-defined]
    for precision, copy in copies.items():
        drift = logp_drift(model, copy, reference_turns)
        print(
            f"{precision} vs float32 on the float32 constrained row's {len(reference_turns)} turns: greedy choice "
            f"agrees on {drift['token_agreement']:.0%} of chosen tokens, {drift['answer_agreement']:.0%} of answers; "
            f"mean |log-prob difference| {drift['mean_abs_logp_diff']:.3f}"
        )
    print(f"peak resident memory of this process: {_peak_rss_mb():.0f} MB")
    print(f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
