"""Benchmark: the RL loop on live MiniWoB++ with the learned CPU policy, next to its baseline.

Measures, on the newest SFT policy of a warehouse (``make rl`` or ``stepwise rl --reduced`` makes
one) and its tasks:

* environment steps/s while RL samples episodes (the learned policy choosing among candidates at
  temperature 1, decisions recorded), with 1 and 2 workers, next to the same batch run by the
  scripted expert (the plain rollout benchmark's policy: no model in the loop);
* the time of one iteration split into rollout / reward / update, for the outcome reward and for
  ProgRM's progress reward (a trained progrm_env model, scored in-process);
* reward scoring of the same episodes in-process vs over the HTTP service (``training.reward_models.serving_app``);
* the same sampling with the pool's Ray backend on a loopback cluster of one and of two nodes
  (``--backends local ray1 ray2 ray1-ep ray2-ep``, the default): the browsers are actors; with
  ``ray1``/``ray2`` the policy stays here (one Ray round trip per step), with ``ray1-ep``/``ray2-ep``
  it goes to the actors (its weights through Ray's object store once per batch, rebuilt on each
  node with the node's own encoder and a cold encoding cache; whole episodes there, the recorded
  decisions coming back with their encodings). Every pool runs a warm-up batch first (one episode
  per task on other seeds; its steps/s is printed: page loads, and on the actors the policy's first
  rebuild), with a policy model of its own warmed from the home, so no pool rides on texts another
  pool's batch encoded.

The scripted expert runs only the tasks whose spec has a solution (the sparse block's book-flight-nodelay
has none: its jobs would be resets without a step, counted in the expert's wall clock); the table
says which tasks each row ran. Every run's step time is also split by action type (how many steps,
their mean latency as the driver sees it, their share of the step time): a scroll or a wait
(``NOTHING``, 100 ms) costs several clicks, so the policy's mix of actions moves the steps/s.

Run: ``.venv/bin/python benchmarks/bench_rl.py [--home .stepwise] [--episodes 48] [--workers 1 2]
[--block dense|sparse | --tasks a,b]`` (the SFT policy's pre-registered block, or tasks named);
``--smoke`` builds a temporary home first (a few demonstrations, reward models and an SFT policy
trained briefly: ``benchmarks/_smoke.py``) and runs 2 episodes per batch with 1 worker.
Goals: >= 25 environment steps/s with 2 workers on the dense block (RL issue); >= 45 on the sparse
block's long tasks (Table-1 issue); the update must not be the bottleneck.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from envs.miniwob.live import MiniWoBConfig  # noqa: E402
from envs.policies import make_policy  # noqa: E402
from envs.pool import EnvPool  # noqa: E402
from envs.pool_jobs import BatchResult, EpisodeJob, PoolConfig  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from training.policy.learned import LearnedPolicy, PolicyModel  # noqa: E402
from training.policy.rollouts import Rollout  # noqa: E402
from training.policy.store import keep_policy_cache, latest_policy, warm_policy_cache  # noqa: E402
from training.policy.task_blocks import task_blocks  # noqa: E402
from training.reward_models.scoring import HTTPScorer, LocalScorer, load_scorer  # noqa: E402
from training.reward_models.serving_app import serve_in_background  # noqa: E402
from training.rl.learner import EpisodeExperience, Learner, LearnerSettings  # noqa: E402
from training.rl.rewards import make_reward_source  # noqa: E402
from training.rl.rewards.progrm import ProgressReward  # noqa: E402
from warehouse.catalog import Warehouse  # noqa: E402

GOAL_STEPS_PER_S = {"dense": 25.0, "sparse": 45.0}


def _jobs(tasks, n: int, base: int) -> list[EpisodeJob]:
    per_task = max(1, n // len(tasks))
    return [
        EpisodeJob(f"bench:{t.task_id}:{base + i}:{k}", t.spec, base + i, t.max_steps, t.family)
        for t in tasks
        for i in range(per_task)
        for k in range(1)
    ]


RAY_BACKENDS = ("ray1", "ray2", "ray1-ep", "ray2-ep")  # one node or two; -ep: episodes on the actors


@contextlib.contextmanager
def _pool(backend: str, workers: int) -> Iterator[EnvPool]:
    """The local pool, or the pool's Ray backend on a fresh loopback cluster (``envs.ray_local``):
    ``ray1`` one node with 2 CPUs, ``ray2`` two with 1 each; the policy in the driver, or on the
    actors with ``-ep``."""
    if backend == "local":
        with EnvPool(MiniWoBConfig(), PoolConfig(workers=workers, spares=0)) as pool:
            yield pool
        return
    import ray

    from envs.ray_local import LocalRayCluster
    from envs.ray_pool import RayEnvPool

    with LocalRayCluster(cpus=(2,) if backend.startswith("ray1") else (1, 1)) as cluster:
        config = PoolConfig(
            workers=workers,
            spares=0,
            backend="ray",
            ray_address=cluster.address,
            ray_episodes_on_actors=backend.endswith("-ep"),
        )
        try:
            with RayEnvPool(MiniWoBConfig(), config) as pool:
                yield pool
        finally:
            ray.shutdown()


def _print_action_mix(mixes: list[tuple[str, str, int, BatchResult]]) -> None:
    """Where each run's step time went, by action type: steps, mean latency (the driver's view:
    IPC, the browser and any wait included) and share of the run's step time."""
    print("\n| policy | pool | workers | action | steps | share of steps | mean step ms | share of step time |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for name, backend, workers, result in mixes:
        by_type: dict[str, list[float]] = collections.defaultdict(list)
        for episode in result.episodes:
            for step in episode.steps:
                by_type[step.action.type.value].append(step.latency_ms)
        steps = sum(len(v) for v in by_type.values())
        total_ms = sum(sum(v) for v in by_type.values())
        for action, latencies in sorted(by_type.items(), key=lambda item: -sum(item[1])):
            n, spent = len(latencies), sum(latencies)
            print(
                f"| {name} | {backend} | {workers} | {action} | {n} | {n / max(1, steps):.0%} "
                f"| {spent / n:.1f} | {spent / max(1e-9, total_ms):.0%} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=os.environ.get("STEPWISE_HOME", ".stepwise"))
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--block", choices=tuple(GOAL_STEPS_PER_S), default="dense", help="the SFT policy's task block")
    parser.add_argument("--tasks", default="", help="comma-separated tasks instead of a block")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["local", *RAY_BACKENDS],
        choices=["local", *RAY_BACKENDS],
        help="the local pool, and Ray on a loopback cluster of one node (ray1) or two (ray2), the policy "
        "here (one round trip per step) or on the actors (-ep), with the most workers asked (bench_rollouts.py)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny trained home of its own, 2 episodes, 1 worker, local pool"
    )
    args = parser.parse_args()
    if args.smoke:
        from _smoke import smoke_root, trained_home

        args.home = str(trained_home(smoke_root("rl") / "home"))
        args.episodes, args.workers, args.backends = min(args.episodes, 2), [1], ["local"]
    warehouse = Warehouse(args.home)
    sft = latest_policy(warehouse, "sft")
    catalog = load_catalog("miniwob")
    names = args.tasks.split(",") if args.tasks else task_blocks(sft)[args.block]
    if not names:
        print(f"the SFT policy {sft['policy_id']} has no {args.block} block: name tasks with --tasks", file=sys.stderr)
        return 2
    unknown = [t for t in names if t not in catalog]
    if unknown:
        print(f"not MiniWoB++ catalog tasks: {unknown} (envs/task_specs/miniwob)", file=sys.stderr)
        return 2
    tasks = [catalog[t] for t in names]
    model = PolicyModel.load(sft["checkpoint"])
    warm = warm_policy_cache(model, warehouse.home)  # as RL runs do: the encodings earlier runs stored
    load = os.getloadavg()[0]
    print(f"SFT policy {sft['policy_id']} on {names}; load average {load:.1f} on {os.cpu_count()} cores")
    print(f"policy encodings stored by earlier runs: {warm:,} (0: every text is encoded as it is met)")

    # Each pool first runs a warm-up batch (one episode per task, other seeds: page loads, and on the
    # actors the policy's first rebuild, which loads the encoder there), then the measured batch.
    print("\n| policy | pool | workers | tasks | episodes | steps | steps/s | warm-up steps/s | load average |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    batches = {}
    mixes: list[tuple[str, str, int, BatchResult]] = []
    runs = [("local", w) for w in args.workers if "local" in args.backends]
    runs += [(b, max(args.workers)) for b in args.backends if b != "local"]
    expert = make_policy("expert")
    expert_tasks = [t for t in tasks if t.has_solution]  # the scripted expert needs a solution
    for backend, workers in runs:
        # A model of its own per pool, warmed as RL runs warm theirs: one pool's texts, encoded in
        # the driver's cache, must not speed up the next pool's measured batch.
        acting = PolicyModel.load(sft["checkpoint"], encoder=model.encoder)
        warm_policy_cache(acting, warehouse.home)
        with _pool(backend, workers) as pool:
            learned = LearnedPolicy(acting, policy_id=f"bench-{workers}", record=True)
            for name, policy, ran in (
                ("scripted expert (baseline)", expert, expert_tasks),
                ("learned policy, sampling (RL)", learned, tasks),
            ):
                if not ran:
                    print(f"| {name} | {backend} | {workers} | (no task with a solution) | 0 | 0 | - | - | - |")
                    continue
                warmup = _jobs(ran, len(ran), 6_000_000 + 1000 * workers)
                started = time.perf_counter()
                warm_steps = pool.run(warmup, policy).steps
                warm_s = time.perf_counter() - started
                # The same jobs on every pool (the expert's: those of its tasks).
                names = {t.task_id for t in ran}
                jobs = [j for j in _jobs(tasks, args.episodes, 7_000_000 + 1000 * workers) if j.task.task_id in names]
                load_before = os.getloadavg()[0]  # a shared machine: other work competes for the cores
                started = time.perf_counter()
                result = pool.run(jobs, policy)
                seconds = time.perf_counter() - started
                shown = "all" if len(ran) == len(tasks) else ", ".join(t.task_id for t in ran)
                print(
                    f"| {name} | {backend} | {workers} | {shown} | {len(result.episodes)} | {result.steps} "
                    f"| {result.steps / seconds:.1f} | {warm_steps / warm_s:.1f} | {load_before:.1f} |"
                )
                mixes.append((name, backend, workers, result))
                if isinstance(policy, LearnedPolicy) and backend == "local":
                    batches[workers] = (result, policy, seconds)
    _print_action_mix(mixes)

    result, policy, rollout_s = batches[max(batches)]
    model = policy.model  # the decisions' rows are rows of its cache
    keep_policy_cache(model, warehouse.home)
    kept = [r for r in result.episodes if len(policy.decisions.get(r.episode_id, [])) == r.n_steps]
    rollouts = [Rollout(r) for r in kept]
    print("\n| iteration part | outcome reward s | progrm_env reward s |")
    print("|---|---:|---:|")
    timings = {}
    for name in ("outcome", "progrm_env"):
        try:
            source = make_reward_source(name, warehouse, cache=model.cache)
        except Exception as exc:  # noqa: BLE001 - a benchmark reports what it cannot measure
            if args.smoke:  # built its own home: every figure must be there
                raise
            print(f"(no {name} figures: {exc})")
            continue
        started = time.perf_counter()
        batch = source.rewards(rollouts, 0)
        reward_s = time.perf_counter() - started
        learner = Learner(model.frozen_copy(), model.frozen_copy(), LearnerSettings())
        for p in learner.model.scorer.parameters():
            p.requires_grad_(True)
        experience = [
            EpisodeExperience(policy.decisions[r.episode_id], np.asarray(x), f"{r.task_id}:{r.seed}")
            for r, x in zip(kept, batch.rewards, strict=True)
        ]
        started = time.perf_counter()
        learner.update(experience)
        timings[name] = (rollout_s, reward_s, time.perf_counter() - started)
    if timings:
        for i, part in enumerate(("rollout", "reward", "update")):
            cells = [f"{timings[n][i]:.2f}" if n in timings else "-" for n in ("outcome", "progrm_env")]
            print(f"| {part} | {' | '.join(cells)} |")

    try:
        scorer = load_scorer(warehouse, "progrm_env")
    except Exception as exc:  # noqa: BLE001
        if args.smoke:
            raise
        print(f"\n(no scoring comparison: {exc})")
        return 0
    assert isinstance(scorer, LocalScorer)
    server, _ = serve_in_background(scorer.scorer)
    try:
        remote = HTTPScorer(f"http://127.0.0.1:{server.server_address[1]}")
        print("\n| progress reward scoring | episodes | steps | seconds | steps/s |")
        print("|---|---:|---:|---:|---:|")
        steps = sum(r.n_steps for r in rollouts)
        # The service wraps the same model object, so its encoding cache is shared: the first pass
        # pays the encoder for segments it has not seen, later passes of either path reuse them.
        # Comparing the later two isolates what HTTP adds.
        passes = (("in-process, first pass", scorer), ("in-process, again", scorer), ("HTTP service, after", remote))
        for name, source_scorer in passes:
            started = time.perf_counter()
            ProgressReward(source_scorer).rewards(rollouts, 0)
            seconds = time.perf_counter() - started
            print(f"| {name} | {len(rollouts)} | {steps} | {seconds:.2f} | {steps / seconds:.0f} |")
    finally:
        server.shutdown()
    goal = GOAL_STEPS_PER_S["dense" if args.tasks else args.block]
    where = "named tasks" if args.tasks else f"{args.block} block"
    print(f"\ngoal ({where}): >= {goal:.0f} environment steps/s with 2 workers while RL samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
