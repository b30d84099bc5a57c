"""Benchmark: import all shared MiniWoB++ demonstrations, then time typical SQL over the steps.

Prints episodes/s and steps/s for the import with 2 worker processes next to the 1-process
baseline, and for three typical queries DuckDB's time next to the same query in polars (lazy scan
of the same Parquet files), median of 5 runs each. Run: `make bench` or
`.venv/bin/python benchmarks/bench_import.py [--demos DIR] [--skip-baseline]`; `--smoke` imports a
few recordings of four tasks instead (seconds; the test suite runs it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import polars as pl  # noqa: E402
from _smoke import small_demos, smoke_root  # noqa: E402

from envs.miniwob.demonstrations import import_demonstrations  # noqa: E402
from warehouse.catalog import Warehouse  # noqa: E402

DEFAULT_DEMOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "miniwob-demos"

QUERIES = {
    "success rate per task": (
        "SELECT task_id, avg(success::INT) AS success_rate, count(*) AS n FROM episodes "
        "GROUP BY task_id ORDER BY task_id",
        lambda ep, st: (
            ep.group_by("task_id")
            .agg(pl.col("success").cast(pl.Int32).mean().alias("success_rate"), pl.len().alias("n"))
            .sort("task_id")
        ),
    ),
    "action-type histogram per task": (
        "SELECT e.task_id, s.action_type, count(*) AS n FROM steps s JOIN episodes e USING (episode_id) "
        "GROUP BY ALL ORDER BY ALL",
        lambda ep, st: (
            st.select("episode_id", "action_type")
            .join(ep.select("episode_id", "task_id"), on="episode_id")
            .group_by("task_id", "action_type")
            .agg(pl.len().alias("n"))
            .sort("task_id", "action_type")
        ),
    ),
    "mean steps, success vs failure": (
        "SELECT e.success, avg(s.n) AS mean_steps FROM episodes e "
        "JOIN (SELECT episode_id, count(*) AS n FROM steps GROUP BY 1) s USING (episode_id) GROUP BY 1 ORDER BY 1",
        lambda ep, st: (
            st.group_by("episode_id")
            .agg(pl.len().alias("n"))
            .join(ep.select("episode_id", "success"), on="episode_id")
            .group_by("success")
            .agg(pl.col("n").mean().alias("mean_steps"))
            .sort("success")
        ),
    ),
}


def timed_import(demos: Path, workers: int) -> tuple[float, object, Warehouse]:
    home = Path(tempfile.mkdtemp(prefix=f"bench-import-{workers}w-"))
    warehouse = Warehouse(home)
    started = time.perf_counter()
    report = import_demonstrations(demos, warehouse, workers=workers)
    return time.perf_counter() - started, report, warehouse


def median_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--demos", type=Path, default=DEFAULT_DEMOS)
    parser.add_argument("--skip-baseline", action="store_true", help="skip the 1-process import baseline")
    parser.add_argument("--smoke", action="store_true", help="a few recordings of four tasks (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.demos = small_demos(smoke_root("import") / "demos", args.demos)

    runs = [] if args.skip_baseline else [1]
    runs.append(2)
    results = {}
    for workers in runs:
        seconds, report, warehouse = timed_import(args.demos, workers)
        results[workers] = (seconds, report, warehouse)
    print(f"\nImport of {args.demos} ({results[2][1].files} files)")
    print(f"{'workers':>8} {'seconds':>8} {'episodes/s':>11} {'steps/s':>9} {'files/s':>8}  episodes  steps")
    for workers, (seconds, report, _) in results.items():
        print(
            f"{workers:>8} {seconds:>8.1f} {report.episodes / seconds:>11.0f} {report.steps / seconds:>9.0f} "
            f"{report.files / seconds:>8.0f}  {report.episodes:>8}  {report.steps}"
        )

    warehouse = results[2][2]
    # Stored paths are relative to the home: polars reads them from wherever this script runs.
    episode_paths = [
        str(warehouse.resolve(r["path"]))
        for r in warehouse.query(
            "SELECT path FROM table_versions WHERE is_current AND table_name = 'episodes'"
        ).to_pylist()
    ]
    step_paths = [
        str(warehouse.resolve(r["path"]))
        for r in warehouse.query(
            "SELECT path FROM table_versions WHERE is_current AND table_name = 'steps'"
        ).to_pylist()
    ]
    print(f"\nQueries over {results[2][1].steps} steps (median of 5; polars lazy scan of the same Parquet as baseline)")
    print(f"{'query':<34} {'duckdb ms':>10} {'polars ms':>10}")
    with warehouse.connect(read_only=True) as con:
        for name, (sql, polars_query) in QUERIES.items():
            duck = median_ms(lambda sql=sql: con.sql(sql).fetchall())
            polars = median_ms(
                lambda polars_query=polars_query: polars_query(
                    pl.scan_parquet(episode_paths), pl.scan_parquet(step_paths)
                ).collect()
            )
            print(f"{name:<34} {duck:>10.1f} {polars:>10.1f}")
    for _, _, imported in results.values():
        shutil.rmtree(imported.home, ignore_errors=True)


if __name__ == "__main__":
    main()
