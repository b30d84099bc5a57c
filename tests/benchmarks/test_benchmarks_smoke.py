"""Benchmarks that cannot rot (issue 21): every script in benchmarks/ runs in its ``--smoke`` mode.

A smoke run takes the benchmark's own code paths on tiny inputs it makes itself
(``benchmarks/_smoke.py``: a few real recordings, a home trained briefly for real), prints its
figures as the full run does, and exits non-zero on an error. Each runs here as a subprocess, as
``make bench`` runs them; a new ``benchmarks/bench_*.py`` without an entry below fails the suite.
Those that start real processes (Chromium, Label Studio, HTTP servers, Dagster runs) or train
models are marked ``e2e`` like the suite's other end-to-end tests (``make test-fast`` skips them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"
TIMEOUT_S = 900  # a hung browser or server fails the test instead of the whole session


@dataclass(frozen=True)
class Smoke:
    """What a benchmark's smoke run must print (its table headers and key lines), and whether it is e2e."""

    expects: tuple[str, ...]
    e2e: bool = False


SMOKE: dict[str, Smoke] = {
    "bench_import": Smoke(("workers  seconds  episodes/s", "duckdb ms  polars ms", "success rate per task")),
    "bench_labels": Smoke(
        (
            "derived corpus",
            "paper: lcs_labels, end to end (SBERT included)",
            "improved: lcs_labels, end to end (SBERT included)",
            "match tables (Eq. 9) + symbol encoding, besides embeddings",
            "grouping (Eq. 3) + recipes (Eq. 10)",
            "DP implementation (CPU time)",
            "fast: lcs_labels' DP, paper, all",
            "agree on every one",
            "goal: full corpus",
        )
    ),
    "bench_scale": Smoke(
        (
            "== Eq. (3) grouping on the real tasks",
            "== Scaling:",
            "growth exponent of CPU time in trajectories, old",
            "growth exponent of CPU time in trajectories, new",
            "== Incremental:",
        )
    ),
    "bench_encoder": Smoke(
        (
            "| encoder | bulk texts/s |",
            "baseline: int8 per-tensor",
            "padded forward",
            "packed (default)",
            "fp32, widths padded to",
        )
    ),
    "bench_determinism": Smoke(
        (
            "(policy, task, seed) pairs run twice",
            "| task | pairs | identical episodes | same outcome |",
            "| login-user |",
            "tasks where a seed does not repeat:",
        ),
        e2e=True,
    ),
    "bench_llm": Smoke(
        (
            "SmolLM2-135M-Instruct loaded in",
            "| policy | episodes | success | steps | env steps/s | s/step | tokens/s all (sampled) |",
            "| scripted expert (baseline) |",
            "| SmolLM2 greedy free |",
            "| SmolLM2 greedy constrained | 1 |",
            "why answers did not parse:",
            "peak resident memory",
        ),
        e2e=True,
    ),
    "bench_rollouts": Smoke(
        (
            "workers  steps/s",
            "goal >= 30 steps/s with 2 workers",
            "CPU cost:",
            "Ray ray1 (the policy here, per step) vs local pool, 2 workers:",
            "Ray ray2-ep (whole episodes on the actors) vs local pool, 2 workers:",
            "127.0.0.3",
            "pool start and close, 2 workers",
            "baseline: spawn",
            "fork server (default)",
        ),
        e2e=True,
    ),
    "bench_annotation": Smoke(
        ("push_s", "ingest_s", "unchanged_tick_s", "goal (push and ingest each under 60 s)"), e2e=True
    ),
    "bench_serving": Smoke(
        (
            "| server | requests | answered 200 |",
            "| server | clients | req/s |",
            "| FastAPI/uvicorn + micro-batching | 4 |",
            "| baseline: stdlib ThreadingHTTPServer | 4 |",
        ),
        e2e=True,
    ),
    "bench_reward_models": Smoke(
        (
            "batched, cold cache:",
            "single call, from the training cache:",
            "training: {'steps': 3",
            "| scoring | batched steps/s |",
            "| baseline: MiniLM over the whole prompt |",
            "| segments + cache, from the training cache |",
        ),
        e2e=True,
    ),
    "bench_rl": Smoke(
        (
            "| scripted expert (baseline) | local | 1 |",
            "| learned policy, sampling (RL) | local | 1 |",
            "| update |",
            "| HTTP service, after |",
            "goal (dense block): >= 25 environment steps/s",
        ),
        e2e=True,
    ),
    "bench_guidance": Smoke(
        (
            "| agent step | cold ms |",
            "| policy alone (N=1, no verifier) |",
            "| progrm_env best-of-16 |",
            "| prm best-of-8, one call per candidate |",
            "| judge (local) best-of-8 |",
            "PRM best-of-8 costs",
        ),
        e2e=True,
    ),
    "bench_alternatives": Smoke(
        (
            "| one live step of the policy (its choice + the environment) |",
            "| baseline: prefix played from the parent, every state |",
            "| restore in the worker, every state |",
            "| restore in the worker, t = 0 |",
            "goal: one alternative <= 2x one live step",
        ),
        e2e=True,
    ),
    "bench_smollm2_writers": Smoke(
        (
            "endpoint up in",
            "| task | essential steps | milestones parsed | milestones | s/milestone call | rationales | s/rationale |",
            "| login-user |",
            "milestone answers parsed:",
            "rationales produced:",
        ),
        e2e=True,
    ),
    "bench_partitions": Smoke(
        ("sequential s  parallel s  same labels", "all families (wall)", "every family in one run", "same labels: yes"),
        e2e=True,
    ),
}


def test_every_benchmark_has_a_smoke_run():
    """A new benchmark gets a ``--smoke`` mode and an entry in SMOKE (or this fails)."""
    scripts = {path.stem: path for path in BENCHMARKS_DIR.glob("bench_*.py")}
    assert sorted(scripts) == sorted(SMOKE), "benchmarks/bench_*.py and this module's SMOKE must name the same scripts"
    for name, path in scripts.items():
        assert '"--smoke"' in path.read_text(), f"{name} has no --smoke flag"


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """Where benchmarks/_smoke.py keeps what it trains, so the benchmarks that need it share one build.

    Under pytest-xdist each worker has a base folder of its own, inside one folder of the run
    (``pytest-N/popen-gw0``): the cache goes in that shared parent, so one build serves both
    workers (``_smoke.trained_home`` builds under a file lock and the other waits for it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "benchmark-smoke-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("benchmark-smoke-cache")


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.e2e] if s.e2e else []) for name, s in sorted(SMOKE.items())]
)
def test_benchmark_smoke_run(name, tmp_path, smoke_cache):
    script = BENCHMARKS_DIR / f"{name}.py"
    if not script.exists():
        pytest.fail(f"{script} is missing (remove it from SMOKE if it was retired)")
    home = tmp_path / "stepwise-home"
    # A short TMPDIR of the test's own: Chromium puts its singleton socket in
    # $TMPDIR/.org.chromium.Chromium.XXXXXX/, and a unix socket path may not exceed 107 bytes; under
    # pytest's tmp_path ("/tmp/pytest-of-root/pytest-77/test_benchmark_smoke_run_bench10") it did,
    # and Chromium exited at start ("session not created") for the 11th benchmark onwards.
    scratch = Path(tempfile.mkdtemp(prefix="smoke-", dir="/tmp"))
    env = os.environ | {
        "STEPWISE_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "STEPWISE_SMOKE_CACHE": str(smoke_cache),
        "TMPDIR": str(scratch),  # whatever the benchmark leaves behind is removed with it
    }
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--smoke"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    print(f"{name} --smoke: exit {done.returncode} in {seconds:.1f} s")
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode}:\n{output[-6000:]}"
    missing = [line for line in SMOKE[name].expects if line not in done.stdout]
    assert not missing, f"{name} --smoke did not print {missing}:\n{done.stdout[-6000:]}"
