"""``stepwise`` commands over the data: importing demonstrations, labels and their report, SQL,
sharing the warehouse, task specs, the README figures and lineage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipelines.cli.common import print_table


def cmd_sql(args: argparse.Namespace) -> int:
    """One query, or (without one) the interactive shell; a query read from a pipe runs as a script."""
    import duckdb

    from pipelines.sql_shell import error_hint, shell
    from warehouse.catalog import Warehouse

    if args.store:
        from warehouse.object_store import connect

        try:
            con = connect(args.store)
            table = con.sql(args.query or "SHOW TABLES").to_arrow_table()
        except (duckdb.Error, OSError, ValueError) as exc:
            print(f"stepwise sql: {args.store}: {exc}", file=sys.stderr)
            return 2
        print_table(table, args.max_rows)
        return 0
    warehouse = Warehouse()
    if args.query is None:
        lines = None if sys.stdin.isatty() else sys.stdin.read().splitlines()
        return shell(warehouse, lambda table: print_table(table, args.max_rows), lines)
    try:
        table = warehouse.query(args.query)
    except duckdb.Error as exc:
        print(f"stepwise sql: {error_hint(warehouse, exc)}", file=sys.stderr)
        return 2
    print_table(table, args.max_rows)
    return 0


def cmd_warehouse(args: argparse.Namespace) -> int:
    """``stepwise warehouse push|pull URL``: the home and an object store, merged per dataset."""
    from warehouse.catalog import ConcurrentPublishError, Warehouse
    from warehouse.object_store import pull, push

    try:
        (push if args.warehouse_command == "push" else pull)(Warehouse(), args.url)
    except (ConcurrentPublishError, OSError, ValueError) as exc:
        print(f"stepwise warehouse {args.warehouse_command}: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    """Where an episode came from: the table version holding it and everything behind it."""
    from warehouse.catalog import Warehouse

    table = Warehouse().lineage_of(args.episode_id)
    if not table.num_rows:
        print(f"stepwise lineage: no current version holds episode {args.episode_id!r}", file=sys.stderr)
        return 2
    print_table(table, args.max_rows)
    return 0


def cmd_import_demos(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from envs.miniwob.demo_files import DEMO_SUFFIXES, find_demo_files, validate_task_override
    from envs.miniwob.demonstrations import import_demonstrations
    from warehouse.catalog import Warehouse

    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"stepwise import-demos: not a folder: {folder}", file=sys.stderr)
        return 2
    try:
        validate_task_override(args.task)
    except ValueError as exc:
        print(f"stepwise import-demos: --task: {exc}", file=sys.stderr)
        return 2
    if not find_demo_files(folder):
        print(f"stepwise import-demos: no recordings ({', '.join(DEMO_SUFFIXES)}) under {folder}", file=sys.stderr)
        return 2
    with Progress() as bar:
        task = bar.add_task(f"importing {folder}", total=None)
        report = import_demonstrations(
            folder,
            Warehouse(),
            workers=args.workers,
            task=args.task,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    _print_report(report)
    return 0


def _print_report(report) -> None:
    print(
        f"{report.files} files from {report.import_root}: {report.episodes} episodes "
        f"({report.successes} successes, {report.failures} failures) over {report.tasks} tasks, {report.steps} steps; "
        f"{report.duplicates} duplicate files (links or identical recordings), {report.quarantined} quarantined"
        + (f" {report.quarantine_reasons}" if report.quarantine_reasons else "")
        + f"; untyped steps {report.untyped_share:.2%}; {report.seconds:.1f} s"
    )


def cmd_label(args: argparse.Namespace) -> int:
    from annotation.progress.labels import label_families, run_label_partitions, run_split, run_synthesis
    from envs.tasks import TaskSpecError
    from warehouse.catalog import ConcurrentPublishError, Warehouse

    warehouse = Warehouse()
    families = label_families() if args.families is None else [f.strip() for f in args.families.split(",")]
    if not all(families):
        print(f"stepwise label: --families {args.families!r} names an empty family", file=sys.stderr)
        return 2
    try:
        if args.synthesize:
            run_synthesis(warehouse, seed=args.seed)
        summary = run_label_partitions(
            warehouse,
            families,
            mode=args.mode,
            specs_dir=args.tasks,
            embedder=args.embedder,
            theta=args.theta,
            replay_milestones=args.replay_milestones,
        )
        run_split(warehouse, by=args.split_by, seed=args.seed)
    except (TaskSpecError, ValueError, ConcurrentPublishError) as exc:
        print(f"stepwise label: {exc}", file=sys.stderr)
        return 2
    print(f"recipes: {summary.recipes}; step labels: {summary.label_rows}")
    for family, done in summary.incremental.items():
        print(
            f"  {family}: {done['new_episodes']} new episodes, {done['labelled_against_library']} against the "
            f"stored recipes, rebuilt {done['rebuilt_tasks'] or 'none'}"
        )
    for method, notes in summary.tasks_without_recipe.items():
        for task, reason in sorted(notes.items()):
            print(f"  no {method} recipe for {task}: {reason}")
    plots = (warehouse.home / "plots" / name for name in ("progress_curves.png", "label_distribution.png"))
    print(f"plots: {', '.join(str(p) for p in plots)}")
    return 0


def cmd_label_report(args: argparse.Namespace) -> int:
    from annotation.progress.labels import default_specs_dir, run_label_report
    from envs.tasks import TaskSpecError, load_task_specs
    from warehouse.catalog import Warehouse

    folder = Path(args.tasks or default_specs_dir())
    try:
        if not folder.is_dir() or not load_task_specs(folder):
            print(f"stepwise label-report: no task specs (*.yaml) in {folder}", file=sys.stderr)
            return 2
        rows = run_label_report(Warehouse(), specs_dir=args.tasks, publish=not args.no_save)
    except TaskSpecError as exc:
        print(f"stepwise label-report: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(
            "stepwise label-report: no labelled episodes of these tasks (run `stepwise label` first)", file=sys.stderr
        )
        return 1
    import pyarrow as pa

    print_table(
        pa.Table.from_pylist(
            [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "specs_dir"} for r in rows]
        ),
        200,
    )
    return 0


def cmd_specs_validate(args: argparse.Namespace) -> int:
    """Load a folder of task specs and replay the recorded episodes of each task against them."""
    from envs.spec_validation import format_report, validate_specs, warehouse_episodes
    from warehouse.catalog import Warehouse
    from warehouse.purposes import EpisodePurpose

    folder = Path(args.folder)
    purposes = [p.value for p in EpisodePurpose]
    problem = None
    if not folder.is_dir():
        problem = f"not a folder: {folder}"
    elif args.per_task is not None and args.per_task < 1:
        problem = f"--per-task must be at least 1, not {args.per_task}"
    elif args.purpose is not None and args.purpose not in purposes:
        problem = f"unknown --purpose {args.purpose!r}; known: {', '.join(purposes)}"
    if problem is not None:  # before the home is opened (and so created)
        print(f"stepwise specs validate: {problem}", file=sys.stderr)
        return 2
    load = (
        None
        if args.no_replay
        else warehouse_episodes(Warehouse(), source=args.source, purpose=args.purpose, per_task=args.per_task)
    )
    report = validate_specs(folder, load=load)
    print(format_report(report))
    return 1 if report.errors else 0


def cmd_figures(args: argparse.Namespace) -> int:
    """The README's tables from the warehouse, as markdown."""
    from pipelines.figures import SECTIONS, print_figures
    from warehouse.catalog import Warehouse

    if args.section and args.section not in SECTIONS:
        print(f"stepwise figures: unknown section {args.section!r}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
    warehouse = Warehouse()
    if args.sft:
        from pipelines.figures import RL_SECTION
        from training.policy.store import PolicyNotFoundError, latest_sft_policy

        if args.section and args.section != RL_SECTION:
            print(f"stepwise figures: --sft chooses the {RL_SECTION!r} section's runs", file=sys.stderr)
            return 2
        try:
            latest_sft_policy(warehouse, args.sft)
        except PolicyNotFoundError as exc:
            print(f"stepwise figures: --sft: {exc}", file=sys.stderr)
            return 2
    return 0 if print_figures(warehouse, args.section, sft_policy_id=args.sft) else 1


def add_commands(sub: Any) -> None:
    """The data commands: import-demos, label, label-report, sql, warehouse, specs, figures, lineage."""
    p = sub.add_parser("import-demos", help="import a folder of MiniWoB++-format demonstrations (*.json, *.json.gz)")
    p.add_argument("folder")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--task", default=None, help="task of recordings that name none (a MiniWoB++ task id)")
    p.set_defaults(func=cmd_import_demos)
    p = sub.add_parser(
        "label", help="(re)compute recipes, progress labels (LCS paper/improved, env milestones) and the RM split"
    )
    p.add_argument("--tasks", default=None, help="folder of task specs (YAML, one per task); default: envs/task_specs")
    p.add_argument("--embedder", default="minilm", choices=["minilm", "hashing"])
    p.add_argument("--theta", type=float, default=0.6)
    p.add_argument("--synthesize", action="store_true", help="also (re)generate the synthetic trajectories first")
    p.add_argument(
        "--families",
        default=None,
        help="comma-separated label families (default: all; `other` = tasks off the catalog)",
    )
    p.add_argument(
        "--mode",
        default="full",
        choices=["full", "incremental"],
        help="full: relabel from scratch (default); incremental: label only new episodes against the stored recipes",
    )
    p.add_argument(
        "--replay-milestones",
        action="store_true",
        help="replay the task specs' milestones on every episode instead of those recorded online (after a spec "
        "fix, for rollouts stored without spec versions; those that stored another version are replayed anyway)",
    )
    p.add_argument("--split-by", default="goal", choices=["goal", "task"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_label)
    p = sub.add_parser("label-report", help="score the LCS labels against the milestone specs in a folder")
    p.add_argument("--tasks", default=None, help="folder of task specs (YAML, one per task); default: envs/task_specs")
    p.add_argument("--no-save", action="store_true", help="print only; do not write the label_quality table")
    p.set_defaults(func=cmd_label_report)
    p = sub.add_parser("sql", help="run a SQL query against the warehouse (no query: an interactive shell)")
    p.add_argument("query", nargs="?", default=None, help="a query; without one, a shell (.tables, .schema VIEW)")
    p.add_argument("--max-rows", type=int, default=50)
    p.add_argument(
        "--store",
        default=None,
        help="query a warehouse pushed to an object store (s3://bucket/prefix); no query: list its tables",
    )
    p.set_defaults(func=cmd_sql)
    p = sub.add_parser("warehouse", help="share the warehouse through an object store (S3-compatible or a folder)")
    store = p.add_subparsers(dest="warehouse_command", required=True)
    for name, text in (
        ("push", "send this home's current table versions and lineage to the store, merged with what it holds"),
        ("pull", "make the store's current versions current in this home (files copied, lineage merged)"),
    ):
        p = store.add_parser(name, help=text)
        p.add_argument("url", help="s3://bucket/prefix (endpoint: AWS_ENDPOINT_URL) or a folder")
        p.set_defaults(func=cmd_warehouse, warehouse_command=name)
    p = sub.add_parser("specs", help="task specs (milestone ground truth)")
    specs = p.add_subparsers(dest="specs_command", required=True)
    p = specs.add_parser(
        "validate", help="load specs (errors by file and field) and replay the recorded episodes of each task"
    )
    p.add_argument("folder", help="a folder of task specs (YAML), e.g. envs/task_specs/miniwob")
    p.add_argument("--source", default="human_demo", help="episodes to replay (episodes.source)")
    p.add_argument(
        "--purpose",
        default=None,
        help="only episodes of this purpose, e.g. evaluation (the agent's held-out episodes: --source rollout)",
    )
    p.add_argument("--per-task", type=int, default=None, help="replay at most N episodes per task (a fixed sample)")
    p.add_argument("--no-replay", action="store_true", help="only load the specs")
    p.set_defaults(func=cmd_specs_validate)
    p = sub.add_parser("figures", help="the README's tables, printed from the warehouse as markdown")
    p.add_argument("--section", default=None, help="one section (demonstrations, label quality, ...)")
    p.add_argument("--sft", default=None, help="the RL section for the runs from this SFT policy (default: the newest)")
    p.set_defaults(func=cmd_figures)
    p = sub.add_parser("lineage", help="where an episode came from, down to the raw files")
    p.add_argument("episode_id")
    p.add_argument("--max-rows", type=int, default=100)
    p.set_defaults(func=cmd_lineage)
