"""How often live MiniWoB++ gives the same episode twice for the same seed and the same policy.

    python benchmarks/bench_determinism.py [--seeds 6] [--tasks login-user,click-tab-2]
    python benchmarks/bench_determinism.py --smoke      # two tasks, two seeds

Every catalog task is run twice on the same seeds, in Chromium, by deterministic policies: the
noisy scripted expert (its slips are seeded by task and seed) and the random walk (seeded the
same way). The agents' choices depend only on what they see, so where two runs of one (policy,
task, seed) differ (actions, screens, success), the page did: animations, timers, delays
(``-nodelay`` tasks exist because the originals have them). The table names those tasks and how
often; evaluation seeds on them are the part of a figure that cannot repeat exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.policies import NoisyExpertPolicy, RandomWalkPolicy  # noqa: E402
from envs.pool import EnvPool  # noqa: E402
from envs.pool_jobs import EpisodeJob, PoolConfig  # noqa: E402
from envs.protocol import EpisodeRecord  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402


def signature(record: EpisodeRecord) -> tuple[tuple[str, ...], str, bool]:
    """What a run did: its actions, a hash of every screen it saw, and its outcome."""
    screens = hashlib.sha256("\n\n".join(step.screen.to_text() for step in record.steps).encode()).hexdigest()
    return tuple(step.action.canonical_text() for step in record.steps), screens[:16], record.success


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=6, help="seeds per task and policy")
    parser.add_argument("--tasks", default=None, help="comma-separated catalog tasks (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="two tasks, two seeds")
    args = parser.parse_args(argv)
    catalog = load_catalog("miniwob")
    names = args.tasks.split(",") if args.tasks else list(catalog)
    seeds = range(7_300_000, 7_300_000 + args.seeds)
    if args.smoke:
        names, seeds = ["login-user", "click-tab-2"], range(7_300_000, 7_300_002)
    unknown = [n for n in names if n not in catalog]
    if unknown:
        print(f"bench_determinism: unknown task(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    expert = NoisyExpertPolicy(noise=0.2)
    policies = [("noisy expert", expert), ("random walk", RandomWalkPolicy())]
    runs: dict[tuple[str, str, int], list[tuple]] = defaultdict(list)
    started = time.perf_counter()
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=args.workers, spares=0)) as pool:
        for label, policy in policies:
            tasks = [catalog[n] for n in names if label != "noisy expert" or expert.supports(catalog[n].spec)]
            for repeat in range(2):
                jobs = [
                    EpisodeJob(f"det:{label}:{t.task_id}:{s}:{repeat}", t.spec, s, t.max_steps, t.family)
                    for t in tasks
                    for s in seeds
                ]
                result = pool.run(jobs, policy)
                for record in result.episodes:
                    runs[(label, record.task_id, record.seed)].append(signature(record))
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # pairs, same actions+screens, same outcome
    for (_, task, _), pair in runs.items():
        if len(pair) != 2:
            continue
        counts = per_task[task]
        counts[0] += 1
        counts[1] += pair[0] == pair[1]
        counts[2] += pair[0][2] == pair[1][2]
    total = [sum(c[i] for c in per_task.values()) for i in range(3)]
    print(
        f"{len(per_task)} tasks, {total[0]} (policy, task, seed) pairs run twice in "
        f"{time.perf_counter() - started:.0f} s; identical episodes {total[1]}/{total[0]}, "
        f"same outcome {total[2]}/{total[0]}"
    )
    print("\n| task | pairs | identical episodes | same outcome |\n|---|---:|---:|---:|")
    for task, (pairs, same, outcome) in sorted(per_task.items(), key=lambda kv: (kv[1][1] / kv[1][0], kv[0])):
        print(f"| {task} | {pairs} | {same} ({same / pairs:.0%}) | {outcome} ({outcome / pairs:.0%}) |")
    differing = sorted(t for t, c in per_task.items() if c[1] < c[0])
    print(f"\ntasks where a seed does not repeat: {', '.join(differing) if differing else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
