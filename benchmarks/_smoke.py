"""What the benchmarks' ``--smoke`` modes build for themselves: tiny inputs, made by the project's own code.

A smoke run takes the same code paths as the full benchmark on inputs small enough for seconds to
a minute (``tests/benchmarks/test_benchmarks_smoke.py`` runs every benchmark that way, so a
benchmark that no longer runs fails the suite). What a benchmark would otherwise read from a
populated STEPWISE_HOME is made here, the way the test suite makes it (``tests/conftest.py``'s
``small_demos``, ``tests/assets/test_rl.py``'s reduced stages):

* :func:`small_demos`: a handful of real MiniWoB++ recordings of a few tasks, in the
  demonstrations' folder layout (imports in seconds);
* :func:`trained_home`: a home with those demonstrations imported, labelled (hashing embedder),
  reward models trained briefly for real, and an SFT policy with its held-out episodes (live
  MiniWoB++ in Chromium), all through the Dagster assets of the pipeline.
"""

from __future__ import annotations

import atexit
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _corpus import DEMOS_DIR

#: (batch folder, task, recordings): the tasks of the test suite's ``small_demos``.
SMOKE_DEMOS = (
    ("2017-10-16_second-turk", "login-user", 8),
    ("2017-10-16_second-turk", "search-engine", 6),
    ("2017-10-16_second-turk", "click-checkboxes-soft", 6),
    ("2017-10-26_third-turk", "social-media", 6),
)


def smoke_root(prefix: str) -> Path:
    """A fresh temporary folder for one smoke run, removed when the process exits."""
    root = Path(tempfile.mkdtemp(prefix=f"stepwise-smoke-{prefix}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def use_home(home: Path) -> Path:
    """Point STEPWISE_HOME (and DAGSTER_HOME under it) at ``home`` for this process and its children."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ["STEPWISE_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    return home


def _reward(path: Path) -> float:
    try:
        return float(json.loads(gzip.decompress(path.read_bytes()))["rawReward"])
    except (OSError, ValueError, KeyError):
        return 0.0


def small_demos(
    dest: Path, demos: Path = DEMOS_DIR, tasks: Sequence[tuple[str, str, int]] = SMOKE_DEMOS, *, failures: int = 2
) -> Path:
    """A few real recordings per task (``failures`` of them failed ones, when the task has some)."""
    if not demos.is_dir():
        raise SystemExit(f"the shared demonstrations are missing: {demos}")
    for batch, task, count in tasks:
        candidates = sorted((demos / batch / task).glob("*.json.gz"))
        failed = [f for f in candidates[:200] if _reward(f) <= 0][:failures]
        files = [f for f in candidates[:count] if f not in failed][: count - len(failed)] + failed
        (dest / batch / task).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, dest / batch / task / f.name)
    return dest


#: What :func:`trained_home` builds by default: what bench_reward_models, bench_rl and bench_guidance
#: need between them, so that one build (cached, see :func:`trained_home`) serves all three.
TRAINED: dict[str, Any] = {
    "reward_models": ("progrm_env", "prm"),
    "rm_steps": 10,
    "sft_tasks": ("login-user",),
    "seeds": 1,
}
CACHE_ENV = "STEPWISE_SMOKE_CACHE"


def trained_home(home: Path, demos: Path = DEMOS_DIR, *, log: Callable[[str], None] = print, **recipe: Any) -> Path:
    """A home at ``home`` with a few demonstrations of :data:`SMOKE_DEMOS` imported and labelled
    (hashing embedder), reward models trained for a few steps (``reward_models``, ``rm_steps``) and,
    with ``sft_tasks``, an SFT policy evaluated on ``seeds`` held-out seeds per task (live MiniWoB++).
    ``recipe`` overrides :data:`TRAINED`.

    With ``$STEPWISE_SMOKE_CACHE`` set (the test suite sets it for its session), the home is built
    once per recipe under that folder and copied: the benchmarks that need one share the build.
    """
    recipe = TRAINED | recipe
    cache_root = os.environ.get(CACHE_ENV)
    if not cache_root:
        return _build_trained_home(home, demos, log=log, **recipe)
    key = hashlib.sha256(json.dumps([str(demos), recipe], sort_keys=True, default=list).encode()).hexdigest()[:12]
    cached = Path(cache_root) / f"trained-{key}"
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / f"trained-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per recipe, however many runs wait for it
        if not (cached / ".complete").exists():
            shutil.rmtree(cached, ignore_errors=True)
            _build_trained_home(cached, demos, log=log, **recipe)
            (cached / ".complete").touch()
        else:
            log(f"[smoke] trained home from the cache {cached}")
    shutil.copytree(cached, home, dirs_exist_ok=True)  # stored paths are relative to the home
    return use_home(home)


def _build_trained_home(
    home: Path,
    demos: Path,
    *,
    reward_models: Sequence[str],
    rm_steps: int,
    sft_tasks: Sequence[str],
    seeds: int,
    log: Callable[[str], None],
) -> Path:
    from dagster import DagsterInstance, materialize

    from assets.demonstrations import DEMONSTRATION_ASSETS
    from assets.labels import LABEL_ASSETS, all_label_families_tags
    from assets.resources import EnvPoolResource, WarehouseResource
    from assets.reward_models import reward_model, reward_model_datasets
    from assets.rl import policy_sft

    use_home(home)
    recordings = small_demos(home.parent / f"{home.name}-demos", demos)
    resources = {"warehouse": WarehouseResource(home=str(home)), "env_pool": EnvPoolResource(spares=0)}
    instance = DagsterInstance.ephemeral()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

    def run(what: str, assets: list, **kwargs: Any) -> None:
        started = time.perf_counter()
        result = materialize(assets, resources=resources, instance=instance, **kwargs)
        if not result.success:
            raise SystemExit(f"smoke set-up: {what} failed")
        log(f"[smoke] {what}: {time.perf_counter() - started:.1f} s")

    run(
        f"import {recordings} and label it",
        [*DEMONSTRATION_ASSETS, *LABEL_ASSETS],
        tags=all_label_families_tags(),
        run_config=quiet
        | {
            "ops": {
                "human_demonstrations": {"config": {"demos_dir": str(recordings), "workers": 1}},
                "recipes_and_progress_labels": {"config": {"embedder": "hashing"}},
            }
        },
    )
    shutil.rmtree(recordings, ignore_errors=True)
    for kind in reward_models:
        run(
            f"reward model {kind} ({rm_steps} steps)",
            [reward_model_datasets, reward_model],
            partition_key=kind,
            run_config=quiet | {"ops": {"reward_model": {"config": {"train_steps": rm_steps, "threads": 1}}}},
        )
    if sft_tasks:
        run(
            f"SFT policy on {', '.join(sft_tasks)}, {seeds} selection and held-out seed(s)",
            [policy_sft],
            run_config=quiet
            | {
                "ops": {
                    "policy_sft": {
                        "config": {
                            "tasks": list(sft_tasks),
                            "low": -1.0,
                            "high": 2.0,  # every task, whatever SFT's success on it
                            "selection_seeds": seeds,
                            "sparse_selection_seeds": 0,
                            "held_out_seeds": seeds,
                            "epochs": 2,
                            "workers": 1,
                        }
                    }
                }
            },
        )
    return home
