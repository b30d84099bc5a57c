"""What every ``stepwise`` command group shares: the Dagster home, printing tables, checks and a
run's outcome, and running a job in-process; and ``stepwise ui``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warehouse.storage import REPO_ROOT, stepwise_home


def prepare_dagster_home() -> Path:
    """$DAGSTER_HOME (default <STEPWISE_HOME>/dagster) holding the repo's dagster.yaml."""
    home = Path(os.environ.get("DAGSTER_HOME") or stepwise_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return home


def print_table(table, max_rows: int = 50) -> None:
    """A result table: boxed by rich on a terminal, plain aligned columns when piped."""
    rows = [["NULL" if v is None else str(v) for v in row.values()] for row in table.slice(0, max_rows).to_pylist()]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        shown = Table()
        for name in table.column_names:
            shown.add_column(name, overflow="fold")
        for row in rows:
            shown.add_row(*row)
        Console().print(shown)
    else:
        widths = [max([len(name), *(len(r[i]) for r in rows)]) for i, name in enumerate(table.column_names)]
        print("  ".join(name.ljust(w) for name, w in zip(table.column_names, widths, strict=True)))
        for row in rows:
            print("  ".join(value.ljust(w) for value, w in zip(row, widths, strict=True)))
    if table.num_rows > max_rows:
        print(f"... {table.num_rows - max_rows} more rows ({table.num_rows} in all)")


def print_checks(evaluations) -> None:
    """Data checks (ERROR severity: a failure means broken data) apart from findings (WARN: a
    research claim the run tested, such as ``progrm_beats_orm``, whose answer may be no). A check
    evaluated by several runs (one per partition, one per round) is one line: how many of its
    evaluations passed, so a failure in any run still shows."""
    from dagster import AssetCheckSeverity

    evaluations = list(evaluations)
    data: dict[tuple[str, str], list[bool]] = {}
    for e in evaluations:
        if e.severity != AssetCheckSeverity.WARN:
            data.setdefault((e.asset_key.to_user_string(), e.check_name), []).append(bool(e.passed))
    findings = [e for e in evaluations if e.severity == AssetCheckSeverity.WARN]
    failed = sum(not all(results) for results in data.values())
    if data:
        print(f"   data checks: {len(data) - failed} of {len(data)} passed in every run")
    else:
        print("   data checks: none ran")
    for (asset, name), results in data.items():
        runs = f", {len(results)} runs" if len(results) > 1 else ""
        if all(results):
            print(f"   check {name}: passed ({asset}{runs})")
        else:
            print(f"   check {name}: FAILED in {results.count(False)} of {len(results)} runs ({asset})")
    if findings:
        print("   findings (claims this run tested; 'no' is a result, not a failure):")
        for check in findings:
            print(f"     {check.check_name}: {'yes' if check.passed else 'no'}")


def summary(name: str, started: float, outcomes: list[tuple[str, bool]]) -> int:
    all_ok = all(ok for _, ok in outcomes)
    print(f"\n== Stepwise {name}: {'succeeded' if all_ok else 'FAILED'} in {time.perf_counter() - started:.0f} s")
    for step, ok in outcomes:
        print(f"   {step}: {'ok' if ok else 'FAILED'}")
    return 0 if all_ok else 1


def job_runner(instance, outcomes: list[tuple[str, bool]], checks: list | None = None):
    """A function that runs one Dagster job in-process and records its outcome (and checks)."""
    from pipelines.definitions import defs

    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}

    def run(job: str, label: str, partition=None, config: dict | None = None, tags: dict | None = None) -> bool:
        result = defs.resolve_job_def(job).execute_in_process(
            instance=instance,
            partition_key=partition,
            raise_on_error=False,
            run_config=quiet | {"ops": config or {}},
            tags=tags,
        )
        outcomes.append((label, result.success))
        if checks is not None:
            checks.extend(result.get_asset_check_evaluations())
        return result.success

    return run


def cmd_ui(args: argparse.Namespace) -> int:
    prepare_dagster_home()
    exe = Path(sys.executable).with_name("dagster-webserver")
    print(f"Dagster UI on http://127.0.0.1:{args.port} (Ctrl-C to stop)")
    return subprocess.call(
        [str(exe), "-h", "127.0.0.1", "-p", str(args.port), "-w", str(REPO_ROOT / "workspace.yaml")], cwd=REPO_ROOT
    )


def add_commands(sub: Any) -> None:
    """stepwise ui."""
    p = sub.add_parser("ui", help="start the Dagster UI on 127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(func=cmd_ui)
