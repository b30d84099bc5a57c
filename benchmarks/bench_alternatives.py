"""Benchmark: what one alternative at a state costs, next to one live step of the policy.

An alternative (``training.flywheel.alternatives``) is reached by deterministic replay: a reset with
the recorded seed, the recorded prefix a_0..a_{t-1} carried out, the state checked, then the
candidate. Two ways to reach the state, side by side on the same states:

* baseline: the prefix played from the parent process like a policy's actions, one pool round trip
  (pipe, screen sent back) per action;
* the replay as the stage runs it: ``EpisodeJob.start``, the worker reaches the state itself
  (``envs.protocol.restore``: every screen compared) in one round trip, then the candidate.

The unit is one live step of the learned policy (choosing among the screen's candidates, then the
environment's step), measured in the same run on the same tasks. The states are those of episodes
recorded first by the noisy scripted expert (as the rollouts asset makes them) and by the policy.

    python benchmarks/bench_alternatives.py [--home .stepwise] [--tasks ...] [--episodes 6]
    python benchmarks/bench_alternatives.py --smoke      # one task, two episodes

``--home``: the newest SFT policy of that home acts (else an untrained one: the same cost per
step, but it chooses oddly). Goal (flywheel issue): one alternative <= 2x one live step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.policies import NoisyExpertPolicy  # noqa: E402
from envs.pool import EnvPool  # noqa: E402
from envs.pool_jobs import EpisodeJob, PoolConfig  # noqa: E402
from envs.protocol import EpisodeRecord  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from training.flywheel.replay import ReplayPlan, ReplayPolicy, replay_outcome  # noqa: E402
from training.policy.learned import LearnedPolicy, PolicyModel  # noqa: E402

GOAL = 2.0
DEFAULT_TASKS = "login-user,click-tab-2-medium,click-checkboxes-transfer,email-inbox-nl-turk,enter-text,search-engine"


def _policy(home: str | None) -> tuple[LearnedPolicy, str]:
    if home is None:
        return LearnedPolicy(PolicyModel(), policy_id="bench", temperature=1.0), "an untrained policy"
    from training.policy.store import latest_policy
    from warehouse.catalog import Warehouse

    row = latest_policy(Warehouse(home), "sft")
    return LearnedPolicy(PolicyModel.load(row["checkpoint"]), policy_id="bench", temperature=1.0), row["policy_id"]


def _plans(episodes: list[EpisodeRecord], catalog) -> tuple[dict[str, ReplayPlan], list[EpisodeJob]]:
    """Every state of the episodes, with its recorded action as the candidate."""
    plans: dict[str, ReplayPlan] = {}
    jobs: list[EpisodeJob] = []
    for e in episodes:
        task = catalog[e.task_id]
        screens = tuple(s.screen for s in e.steps)
        actions = tuple(s.action for s in e.steps)
        for t in range(e.n_steps):
            reached = sum(len(s.milestones_hit) for s in e.steps[:t])
            plan = ReplayPlan(actions[:t], screens[: t + 1], actions[t], 0, e.instruction, reached)
            plans[f"replay:{e.episode_id}:{t}"] = plan
            jobs.append(plan.job(f"replay:{e.episode_id}:{t}", task.spec, e.seed, task.family))
    return plans, jobs


@dataclass
class PrefixFromParent:
    """The baseline: the recorded prefix and the candidate played as a policy's actions."""

    plans: dict[str, ReplayPlan]
    policy_id: str = "prefix-from-parent"

    def start(self, context):
        actions = iter((*self.plans[context.episode_id].prefix, self.plans[context.episode_id].candidate))

        class Actor:
            def act(self, screen):
                return next(actions)

            def observe(self, action, result):
                pass

        return Actor()


def _replay(workers: int, plans, jobs, *, from_parent: bool) -> tuple[dict[str, float], int, float]:
    """Replay every state in a pool of its own: ms per job id (reaching the state and carrying the
    candidate out), states not reproduced, wall seconds."""
    if from_parent:
        jobs = [replace(j, start=None, max_steps=plans[j.episode_id].step + 1) for j in jobs]
        policy = PrefixFromParent(plans)
    else:
        policy = ReplayPolicy(plans)
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=workers, spares=0)) as pool:
        pool.run(jobs[:workers], policy)  # browsers up, pages loaded
        started = time.perf_counter()
        result = pool.run(jobs, policy)
        seconds = time.perf_counter() - started
    if from_parent:  # the candidate is the last step: the time until its result
        times = {r.episode_id: r.reset_ms + r.steps[-1].time_ms + r.steps[-1].latency_ms for r in result.episodes}
    else:
        times = {r.episode_id: replay_outcome(r).replay_ms for r in result.episodes}
    return times, len(result.lost), seconds


def _row(label: str, values: list[float], unit: float) -> str:
    if not values:
        return f"| {label} | 0 | | | |"
    median = float(np.median(values))
    return f"| {label} | {len(values)} | {median:.1f} | {np.percentile(values, 90):.1f} | {median / unit:.2f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=None, help="act with this home's newest SFT policy")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated catalog tasks")
    parser.add_argument("--episodes", type=int, default=6, help="recorded episodes per task and policy")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one task, two episodes, one worker")
    args = parser.parse_args(argv)
    catalog = load_catalog("miniwob")
    names = args.tasks.split(",")
    if args.smoke:
        names, args.episodes, args.workers = ["login-user"], 2, 1
    unknown = [n for n in names if n not in catalog]
    if unknown:
        print(f"bench_alternatives: unknown task(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    tasks = [catalog[n] for n in names]
    policy, acting = _policy(args.home)
    jobs = [
        EpisodeJob(f"bench:{t.task_id}:{s}", t.spec, 7_400_000 + s, t.max_steps, t.family)
        for t in tasks
        for s in range(args.episodes)
    ]
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=args.workers, spares=0)) as pool:
        pool.run(jobs[: args.workers], policy)  # browsers warm, pages loaded, encodings cached
        started = time.perf_counter()
        by_policy = pool.run(jobs, policy)
        live_seconds = time.perf_counter() - started
        expert = NoisyExpertPolicy(noise=0.2)
        by_expert = pool.run(
            [replace(j, episode_id=f"{j.episode_id}:expert") for j in jobs if expert.supports(j.task)], expert
        )
    live = [
        float(e.steps[i + 1].time_ms - e.steps[i].time_ms) for e in by_policy.episodes for i in range(e.n_steps - 1)
    ]
    unit = float(np.median(live))
    plans, replay_jobs = _plans(by_expert.episodes + by_policy.episodes, catalog)
    source = {f"replay:{e.episode_id}:{t}": "expert" for e in by_expert.episodes for t in range(e.n_steps)}
    fast, fast_lost, fast_s = _replay(args.workers, plans, replay_jobs, from_parent=False)
    slow, _, slow_s = _replay(args.workers, plans, replay_jobs, from_parent=True)
    print(
        f"acting policy: {acting}; {len(tasks)} tasks; states of {len(by_expert.episodes)} noisy-expert and "
        f"{len(by_policy.episodes)} policy episodes: {len(replay_jobs)} ({fast_lost} not reproduced); "
        f"{args.workers} worker(s)"
    )
    print("\n| what | n | median ms | p90 ms | in live steps |")
    print("|---|---:|---:|---:|---:|")
    print(_row("one live step of the policy (its choice + the environment)", live, unit))
    for name, times in (("baseline: prefix played from the parent", slow), ("restore in the worker", fast)):
        print(_row(f"{name}, every state", list(times.values()), unit))
        for who in ("expert", "policy"):
            mine = [v for k, v in times.items() if source.get(k, "policy") == who]
            print(_row(f"{name}, states of {who} episodes", mine, unit))
        depths: dict[str, list[float]] = defaultdict(list)
        for job_id, ms in times.items():
            t = plans[job_id].step
            depths["t = 0" if t == 0 else "t = 1-3" if t <= 3 else "t >= 4"].append(ms)
        for band in ("t = 0", "t = 1-3", "t >= 4"):
            print(_row(f"{name}, {band}", depths[band], unit))
    ratio = float(np.median(list(fast.values()))) / unit if fast else float("nan")
    print(
        f"\nthroughput: {by_policy.steps / live_seconds:.1f} live steps/s; alternatives/s (wall): "
        f"{len(fast) / fast_s:.1f} restored in the worker, {len(slow) / slow_s:.1f} played from the parent"
    )
    print(f"goal: one alternative <= {GOAL:g}x one live step: {'met' if ratio <= GOAL else 'NOT met'} ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
