"""Benchmark: label families as Dagster partitions, one run after another vs two runs at once.

Each label family (``recipe_library`` + ``progress_labels``, partitioned by family) is
materialized by its own ``dagster asset materialize --partition FAMILY`` process: one process per
run, as Dagster's default run launcher starts a backfill's runs (this script starts the processes
itself rather than through the daemon and ``dagster.yaml``'s queued run coordinator, which lets 2
runs go at once). Three copies of the same warehouse are labelled:

* **sequential**: one family's run after another (the baseline);
* **parallel**: at most ``--workers`` runs at once, each on its own family;
* **one run**: every family in a single run (``--partition-range``: the single-run backfill that
  ``make demo`` uses), which pays the run's start-up once.

Printed: wall seconds of each run and of the whole, the speed-up, and whether the two homes end
with identical labels (a digest of every ``progress_labels`` row per family). The warehouse is a
copy of ``--home`` (e.g. the home ``make demo`` leaves, 15k episodes) reduced to its episodes and
steps; with ``--demos`` the real demonstrations are imported into a fresh one instead.

    .venv/bin/python benchmarks/bench_partitions.py --home .stepwise
    .venv/bin/python benchmarks/bench_partitions.py --smoke   # a few recordings, one family (the test suite)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dagster import DagsterInstance  # noqa: E402

from annotation.progress.label_io import family_dataset, label_families  # noqa: E402
from warehouse.catalog import Materialization, Warehouse  # noqa: E402

DAGSTER = Path(sys.executable).with_name("dagster")


def trajectories_only(source: Path, target: Path) -> None:
    """A new home holding the current episodes and steps of ``source`` (one dataset each)."""
    src, dst = Warehouse(source), Warehouse(target)
    m = Materialization(asset="human_demonstrations", parameters={"copied_from": str(source)})
    outputs = [dst.stage_table(name, "copy", src.query(f"SELECT * FROM {name}"), m) for name in ("episodes", "steps")]
    dst.publish(m, outputs)


def materialize(
    home: Path, dagster_home: Path, family: str, embedder: str, in_process: bool = False
) -> subprocess.Popen:
    """One run of one family, or of a range ``first...last``; ``in_process``: the run's steps in its
    own process (Dagster's default executor starts a process per step)."""
    env = os.environ | {"STEPWISE_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    config: dict = {"ops": {"recipes_and_progress_labels": {"config": {"embedder": embedder, "mode": "full"}}}}
    if in_process:
        config["execution"] = {"config": {"in_process": {}}}
    return subprocess.Popen(
        [DAGSTER, "asset", "materialize", "-m", "pipelines.definitions", "--select", "recipe_library,progress_labels"]
        + ["--partition-range" if "..." in family else "--partition", family, "--config-json", json.dumps(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_all(
    home: Path, dagster_home: Path, families: list[str], workers: int, embedder: str, in_process: bool = False
) -> dict[str, float]:
    """Materialize every family, at most ``workers`` at once; wall seconds per family and ``total``."""
    pending, running, seconds = list(families), {}, {}
    started = time.perf_counter()
    while pending or running:
        while pending and len(running) < workers:
            family = pending.pop(0)
            running[family] = (materialize(home, dagster_home, family, embedder, in_process), time.perf_counter())
        for family, (proc, t0) in list(running.items()):
            if proc.poll() is not None:
                _, err = proc.communicate()
                if proc.returncode:
                    raise SystemExit(f"{family}: dagster exited {proc.returncode}\n{err[-3000:]}")
                seconds[family] = time.perf_counter() - t0
                del running[family]
        time.sleep(0.2)
    seconds["total"] = time.perf_counter() - started
    return seconds


def label_digest(home: Path, family: str) -> tuple[int, str]:
    """Rows and a digest of every progress_labels row of a family (order-free)."""
    warehouse = Warehouse(home)
    paths = [p for d, _, p in warehouse.current_versions("progress_labels") if d == family_dataset(family)]
    if not paths:
        return 0, ""
    rows = warehouse.query(
        "SELECT episode_id, step_idx, source, method, round(progress, 9) AS p, is_key_step, recipe_id "
        f"FROM read_parquet('{paths[0]}') ORDER BY ALL"
    ).to_pylist()
    return len(rows), hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, help="a Stepwise home whose episodes and steps are labelled")
    parser.add_argument("--demos", type=Path, help="import these demonstrations instead (a fresh home)")
    parser.add_argument("--embedder", default="hashing", choices=["hashing", "minilm"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--families", nargs="+", default=None, help="the first N families only (default: all); consecutive ones"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="each run's steps in the run's process (no process per step)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few recordings of four tasks (--demos), the first family only, --in-process (the test suite: the "
        "script's paths, three run processes instead of five; tests/assets/test_label_partitions.py runs two "
        "families at once for real)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_partitions_"))
    try:
        base = work / "base"
        if args.smoke:
            from _smoke import DEMOS_DIR, small_demos

            args.demos = small_demos(work / "demos", args.demos or DEMOS_DIR)
            args.families = args.families or label_families()[:1]
            args.in_process = True
        if args.demos:
            from envs.miniwob.demonstrations import import_demonstrations

            import_demonstrations(args.demos, Warehouse(base))
        else:
            trajectories_only(args.home or ROOT / ".stepwise", base)
        counts = Warehouse(base).query("SELECT count(*) AS episodes FROM episodes").to_pylist()[0]
        families = label_families()
        if args.families:
            unknown = sorted(set(args.families) - set(families))
            if unknown:
                raise SystemExit(f"unknown label families {unknown}; choose from {families}")
            # in the partitions' order, so that the single run's --partition-range covers exactly them
            families = [f for f in families if f in args.families]
        results = {}
        for name, workers, runs in (
            ("sequential", 1, families),
            ("parallel", args.workers, families),
            ("one run", 1, [f"{families[0]}...{families[-1]}"]),
        ):
            home, dagster_home = work / name, work / f"{name}-dagster"
            shutil.copytree(base, home)
            dagster_home.mkdir()
            shutil.copy(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
            os.environ["DAGSTER_HOME"] = str(dagster_home)  # dagster.yaml names its storage by this variable
            DagsterInstance.from_config(str(dagster_home)).dispose()  # created once, before two runs race to
            results[name] = run_all(home, dagster_home, runs, workers, args.embedder, args.in_process)
        load = os.getloadavg()[0]
        print(
            f"\n{counts['episodes']:,} episodes, {len(families)} label families, embedder {args.embedder}, "
            f"{os.cpu_count()} cores, load average {load:.1f}" + (", steps in process" if args.in_process else "")
        )
        print(f"{'family':<22} {'rows':>9} {'sequential s':>13} {'parallel s':>11}  same labels")
        for family in families:
            seq, par = label_digest(work / "sequential", family), label_digest(work / "parallel", family)
            print(
                f"{family:<22} {seq[0]:>9,} {results['sequential'][family]:>13.1f} {results['parallel'][family]:>11.1f}"
                f"  {'yes' if seq == par else 'NO'}"
            )
        seq_total, par_total = results["sequential"]["total"], results["parallel"]["total"]
        print(
            f"{'all families (wall)':<22} {'':>9} {seq_total:>13.1f} {par_total:>11.1f}  "
            f"speed-up {seq_total / par_total:.2f}x with {args.workers} runs at once"
        )
        one = results["one run"]["total"]
        same = all(label_digest(work / "one run", f) == label_digest(work / "sequential", f) for f in families)
        print(
            f"every family in one run (single-run backfill): {one:.1f} s wall, "
            f"{seq_total / one:.2f}x the sequential runs; same labels: {'yes' if same else 'NO'}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
