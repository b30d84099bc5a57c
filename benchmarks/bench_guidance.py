"""Benchmark: the agent-side cost of one step of a reward-guided agent, next to the N = 1 baseline.

On recorded states (screens, instructions and histories of the newest SFT policy's held-out
evaluation episodes in a warehouse), measures the wall time of one agent step (the learned
policy proposing N candidates + the verifier scoring them), environment excluded:

* best-of-N with the PRM and with the ProgRM progress gain for N in {1, 3, 5, 8, 16}: the N
  candidates are scored in one batch, so N = 8 should cost far less than 8x N = 1; next to it the
  same N = 8 scored one candidate per call (what batching saves);
* the GUI-PRA judge per step (N = 8): calls and latency in local mode and, with ``--serve`` (a
  model folder for ``transformers serve``, e.g. the tests' tiny Qwen2) or ``--endpoint``, over an
  OpenAI-compatible endpoint.

Each state is measured cold (the encoders' caches emptied first: a new screen) and warm (again:
screens and history entries repeat within an episode and across episodes of a task).

Run: ``.venv/bin/python benchmarks/bench_guidance.py [--home .stepwise] [--states 60] [--serve DIR]``;
``--smoke`` builds a temporary home first (a few demonstrations, the PRM, a ProgRM-Env model and an
SFT policy trained briefly, its held-out episodes: ``benchmarks/_smoke.py``) and measures 4 states.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from envs.task_catalog import load_catalog  # noqa: E402
from training.base.encoder import EmbeddingCache  # noqa: E402
from training.base.states import describe_action, screen_lines
from training.guidance.judge import JudgeSettings  # noqa: E402
from training.guidance.proposals import LearnedProposer, Proposal  # noqa: E402
from training.guidance.registry import make_verifier  # noqa: E402
from training.guidance.verifiers import StepView, context_of  # noqa: E402
from training.policy.learned import PolicyModel  # noqa: E402
from training.policy.store import latest_policy  # noqa: E402
from warehouse.catalog import Warehouse  # noqa: E402
from warehouse.purposes import greedy_evaluation_filter
from warehouse.trajectories import load_trajectories  # noqa: E402

N_VALUES = (1, 3, 5, 8, 16)


def _states(warehouse: Warehouse, policy: dict, count: int) -> list[tuple]:
    catalog = load_catalog("miniwob")
    out = []
    for t in load_trajectories(
        warehouse,
        f"e.policy_id = ? AND e.task_id IN (SELECT unnest(?)) AND {greedy_evaluation_filter('e.episode_id')}",
        [f"eval:{policy['policy_id']}", policy["tasks"]],
    ):
        spec = catalog[t.task_id].spec
        slots = spec.slots(t.instruction, {k: str(v) for k, v in (t.fields or {}).items()}) or {}
        context = context_of(spec, t.instruction, slots, catalog[t.task_id].max_steps)
        for i in range(t.n_steps):
            out.append((context, t.screens[i], t.actions[:i], t.screens[i - 1] if i else None, t.screens[:i]))
            if len(out) >= count:
                return out
    return out


def _step(proposer, verifier, state, n: int) -> tuple[float, int]:
    context, screen, past, previous, screens = state
    episode = proposer.start(context)
    for action, shown in zip(past, screens, strict=True):
        episode.commit(Proposal(action, describe_action(action, shown), 0.0, 0))
    history = tuple(describe_action(a, s) for a, s in zip(past, screens, strict=True))
    view = StepView(context.instruction, len(past), screen, screen_lines(screen), history, tuple(past), (), previous)
    started = time.perf_counter()
    proposals = episode.propose(screen, n).proposals
    calls = 0
    if verifier is not None:
        verdict = verifier.start(context).score(view, proposals)
        calls = verdict.calls
    return time.perf_counter() - started, calls


def _one_by_one(proposer, verifier, state, n: int) -> float:
    context, screen, past, previous, screens = state
    episode = proposer.start(context)
    for action, shown in zip(past, screens, strict=True):
        episode.commit(Proposal(action, describe_action(action, shown), 0.0, 0))
    history = tuple(describe_action(a, s) for a, s in zip(past, screens, strict=True))
    view = StepView(context.instruction, len(past), screen, screen_lines(screen), history, tuple(past), (), previous)
    started = time.perf_counter()
    proposals = episode.propose(screen, n).proposals
    for p in proposals:
        verifier.start(context).score(view, [p])
    return time.perf_counter() - started


def _clear(*owners) -> None:
    """Fresh, empty encoder caches (a screen never seen, nothing pinned from training)."""
    for owner in owners:
        if getattr(owner, "cache", None) is not None:
            owner.cache = EmbeddingCache(owner.encoder, max_entries=owner.cache.max_entries)


def _measure(label, fn, states, caches) -> dict:
    cold, warm, calls = [], [], []
    for state in states:
        _clear(*caches)
        seconds, c = fn(state)
        cold.append(seconds)
        seconds, c = fn(state)
        warm.append(seconds)
        calls.append(c)
    return {
        "label": label,
        "cold_ms": 1000 * statistics.mean(cold),
        "warm_ms": 1000 * statistics.mean(warm),
        "warm_p50_ms": 1000 * statistics.median(warm),
        "calls": statistics.mean(calls),
    }


def _serve(folder: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    venv = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "transformers"
    server = subprocess.Popen(
        [str(venv), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", folder],
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.3)
    server.kill()
    raise SystemExit("transformers serve did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=os.environ.get("STEPWISE_HOME", ".stepwise"))
    parser.add_argument("--states", type=int, default=60)
    parser.add_argument("--judge-states", type=int, default=12)
    parser.add_argument("--serve", default=None, help="a model folder to serve with transformers serve")
    parser.add_argument("--endpoint", default=None, help="an OpenAI-compatible base URL instead")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a tiny trained home of its own, 4 states")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import smoke_root, trained_home

        args.home = str(trained_home(smoke_root("guidance") / "home"))
        args.states, args.judge_states = min(args.states, 4), min(args.judge_states, 2)
    torch.set_num_threads(args.threads)
    warehouse = Warehouse(args.home)
    policy = latest_policy(warehouse, "sft")
    model = PolicyModel.load(policy["checkpoint"])
    proposer = LearnedProposer(model, policy["policy_id"])
    states = _states(warehouse, policy, args.states)
    print(f"{len(states)} recorded states of {policy['policy_id']}'s held-out episodes ({', '.join(policy['tasks'])})")
    prm = make_verifier("prm", warehouse)
    progress = make_verifier("progrm_env", warehouse)
    caches = [model, prm.scorer.scorer, progress.scorer.scorer]  # type: ignore[attr-defined]
    rows = [_measure("policy alone (N=1, no verifier)", lambda s: _step(proposer, None, s, 1), states, caches)]
    for name, verifier in (("prm", prm), ("progrm_env", progress)):
        for n in N_VALUES:
            rows.append(
                _measure(f"{name} best-of-{n}", lambda s, v=verifier, n=n: _step(proposer, v, s, n), states, caches)
            )
    one_by_one = _measure(
        "prm best-of-8, one call per candidate", lambda s: (_one_by_one(proposer, prm, s, 8), 8), states, caches
    )
    rows.append(one_by_one)
    judge_states = states[: args.judge_states]
    local = make_verifier("judge", warehouse, judge=JudgeSettings())
    rows.append(_measure("judge (local) best-of-8", lambda s: _step(proposer, local, s, 8), judge_states, caches))
    server = None
    endpoint = args.endpoint
    try:
        if args.serve and not endpoint:
            server, endpoint = _serve(args.serve)
            args.model = args.serve
        if endpoint:
            remote = make_verifier(
                "judge",
                warehouse,
                judge=JudgeSettings(endpoint=endpoint, model=args.model, timeout_s=120, max_tokens=32),
            )
            rows.append(
                _measure("judge (endpoint) best-of-8", lambda s: _step(proposer, remote, s, 8), judge_states, caches)
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    base = rows[0]["warm_ms"]
    print("\n| agent step | cold ms | warm ms (mean) | warm p50 | x N=1 (warm) | model calls/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['cold_ms']:.1f} | {r['warm_ms']:.1f} | {r['warm_p50_ms']:.1f} | "
            f"{r['warm_ms'] / base:.1f}x | {r['calls']:.1f} |"
        )
    by = {r["label"]: r["warm_ms"] for r in rows}
    one = by["prm best-of-1"]
    eight = by["prm best-of-8"]
    print(f"\nPRM best-of-8 costs {eight / one:.2f}x best-of-1 (batched); one call per candidate: "
          f"{one_by_one['warm_ms'] / one:.2f}x.")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
