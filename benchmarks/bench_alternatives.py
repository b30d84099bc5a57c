"""Benchmark: what one alternative at a state costs, next to one live step of the policy.

An alternative (``training.flywheel.alternatives``) is reached by deterministic replay: a reset with
the recorded seed, the recorded prefix a_0..a_{t-1} carried out with every screen checked, then the
candidate. The baseline is what the same pool spends on one live step of the learned policy
(choosing among the screen's candidates, then the environment's step), measured in the same run
on the same tasks: the episodes the replays start from are recorded first, by the policy itself.

    python benchmarks/bench_alternatives.py [--tasks login-user,click-tab-2-medium,...] [--episodes 6]
    python benchmarks/bench_alternatives.py --smoke      # two tasks, two episodes each

Prints the live step, the replay of one alternative by its prefix length t, and over every state
of the recorded episodes (states sampled uniformly, as the stage samples them), with the ratio.
Goal (flywheel issue): one alternative <= 2x one live step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.pool import EnvPool, EpisodeJob, PoolConfig  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from training.flywheel.replay import ReplayPlan, ReplayPolicy, replay_outcome, screen_signature  # noqa: E402
from training.policy.learned import LearnedPolicy, PolicyModel  # noqa: E402

GOAL = 2.0
DEFAULT_TASKS = "login-user,click-tab-2-medium,click-checkboxes-transfer,email-inbox-nl-turk,enter-text"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated catalog tasks")
    parser.add_argument("--episodes", type=int, default=6, help="recorded episodes per task")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="two tasks, two episodes each, one worker")
    args = parser.parse_args(argv)
    catalog = load_catalog("miniwob")
    names = args.tasks.split(",")
    if args.smoke:
        names, args.episodes, args.workers = ["login-user", "click-tab-2-medium"], 2, 1
    unknown = [n for n in names if n not in catalog]
    if unknown:
        print(f"bench_alternatives: unknown task(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    tasks = [catalog[n] for n in names]
    policy = LearnedPolicy(PolicyModel(), policy_id="bench", temperature=1.0)
    jobs = [
        EpisodeJob(f"bench:{t.task_id}:{s}", t.spec, 7_400_000 + s, t.max_steps, t.family)
        for t in tasks
        for s in range(args.episodes)
    ]
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=args.workers, spares=0)) as pool:
        pool.run(jobs[: args.workers], policy)  # browsers warm, pages loaded, encodings cached
        started = time.perf_counter()
        recorded = pool.run(jobs, policy)
        live_seconds = time.perf_counter() - started
        live_steps = recorded.steps
        per_step = [
            float(e.steps[i + 1].time_ms - e.steps[i].time_ms) for e in recorded.episodes for i in range(e.n_steps - 1)
        ]
        plans: dict[str, ReplayPlan] = {}
        replay_jobs: list[EpisodeJob] = []
        for e in recorded.episodes:
            task = catalog[e.task_id]
            screens = [s.screen for s in e.steps]
            actions = [s.action for s in e.steps]
            for t in range(e.n_steps):
                plan = ReplayPlan(
                    tuple(actions[:t]),
                    tuple(screen_signature(s) for s in screens[: t + 1]),
                    actions[t],
                    0,
                    e.instruction,
                )
                job_id = f"replay:{e.episode_id}:{t}"
                plans[job_id] = plan
                replay_jobs.append(EpisodeJob(job_id, task.spec, e.seed, plan.max_steps, task.family))
        started = time.perf_counter()
        replays = pool.run(replay_jobs, ReplayPolicy(plans))
        replay_seconds = time.perf_counter() - started
    by_depth: dict[int, list[float]] = defaultdict(list)
    every: list[float] = []
    for record in replays.episodes:
        outcome = replay_outcome(record, plans[record.episode_id])
        by_depth[plans[record.episode_id].step].append(outcome.replay_ms)
        every.append(outcome.replay_ms)
    live_ms = float(np.median(per_step)) if per_step else float("nan")
    print(
        f"{len(recorded.episodes)} episodes of {len(tasks)} tasks recorded by the policy ({live_steps} live steps, "
        f"{args.workers} worker(s)); {len(replays.episodes)} of {len(replay_jobs)} states replayed "
        f"({len(replays.lost)} not reproduced)"
    )
    print("\n| what | n | median ms | p90 ms | in live steps |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| baseline: one live step (policy + environment) | {len(per_step)} | {live_ms:.1f} | "
        f"{np.percentile(per_step, 90) if per_step else float('nan'):.1f} | 1.00 |"
    )
    for depth in sorted(by_depth):
        values = by_depth[depth]
        print(
            f"| one alternative at t = {depth} (reset + {depth} replayed + candidate) | {len(values)} | "
            f"{np.median(values):.1f} | {np.percentile(values, 90):.1f} | {np.median(values) / live_ms:.2f} |"
        )
    ratio = float(np.median(every)) / live_ms if every else float("nan")
    print(
        f"| one alternative, every state of the episodes | {len(every)} | {np.median(every):.1f} | "
        f"{np.percentile(every, 90):.1f} | {ratio:.2f} |"
    )
    print(
        f"\nthroughput: {live_steps / live_seconds:.1f} live steps/s; {len(replays.episodes) / replay_seconds:.1f} "
        f"alternatives/s (wall, {args.workers} worker(s))"
    )
    print(f"goal: one alternative <= {GOAL:g}x one live step: {'met' if ratio <= GOAL else 'NOT met'} ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
