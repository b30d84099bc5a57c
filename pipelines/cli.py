"""The ``stepwise`` command: the pipeline's main job, imports and SQL for users outside Dagster."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from training.reward_models.kinds import SUCCESS_JUDGE_KINDS
from warehouse.storage import REPO_ROOT, stepwise_home


def prepare_dagster_home() -> Path:
    """$DAGSTER_HOME (default <STEPWISE_HOME>/dagster) holding the repo's dagster.yaml."""
    home = Path(os.environ.get("DAGSTER_HOME") or stepwise_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return home


def _print_table(table, max_rows: int = 50) -> None:
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
        _print_table(table, args.max_rows)
        return 0
    warehouse = Warehouse()
    if args.query is None:
        lines = None if sys.stdin.isatty() else sys.stdin.read().splitlines()
        return shell(warehouse, lambda table: _print_table(table, args.max_rows), lines)
    try:
        table = warehouse.query(args.query)
    except duckdb.Error as exc:
        print(f"stepwise sql: {error_hint(warehouse, exc)}", file=sys.stderr)
        return 2
    _print_table(table, args.max_rows)
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
    _print_table(table, args.max_rows)
    return 0


def cmd_import_demos(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from envs.miniwob.demonstrations import (
        DEMO_SUFFIXES,
        find_demo_files,
        import_demonstrations,
        validate_task_override,
    )
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
            warehouse, families, mode=args.mode, specs_dir=args.tasks, embedder=args.embedder, theta=args.theta
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

    _print_table(
        pa.Table.from_pylist(
            [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "specs_dir"} for r in rows]
        ),
        200,
    )
    return 0


def _print_report(report) -> None:
    print(
        f"{report.files} files from {report.import_root}: {report.episodes} episodes "
        f"({report.successes} successes, {report.failures} failures) over {report.tasks} tasks, {report.steps} steps; "
        f"{report.duplicates} duplicate files (links or identical recordings), {report.quarantined} quarantined"
        + (f" {report.quarantine_reasons}" if report.quarantine_reasons else "")
        + f"; untyped steps {report.untyped_share:.2%}; {report.seconds:.1f} s"
    )


#: What `stepwise demo` runs, reduced so that the whole graph runs in minutes on 2 cores: every
#: stage runs for real on a fixed sample (30 recordings per task, ~1,500 of the 10,466), and each
#: model trains briefly. The full import is `stepwise import-demos` (or human_demonstrations with
#: its default config); `make reward-models`, `make rl` and `make flywheel` run the full budgets.
DEMO_REWARD_MODELS: tuple[str, ...] = SUCCESS_JUDGE_KINDS
DEMO: dict[str, Any] = {
    "human_demonstrations": {"max_files_per_task": 30},
    "reward_model": {"train_steps": 40, "max_train_examples": 2000, "max_eval_examples": 400},
    "reward_model_report": {"latency_calls": 20, "max_trajectories": 100},
    "policy_sft": {"selection_seeds": 3, "held_out_seeds": 6, "max_tasks": 2, "epochs": 6, "max_episodes_per_task": 10},
    "runs": ("outcome", "progrm_env"),
    "rl_run": {"iterations": 2, "instances_per_task": 2, "group_size": 2},
    "agent_evaluation": {"held_out_seeds": 6},
    # alternatives proposed by the SFT policy: one state per task, 3 candidates, 2 continuations each
    "step_alternatives": {"states_per_task": 1, "top_k": 3, "continuations": 2},
}
DEMO_STAGES = ("rollouts", "labels", "reward_models", "rl", "flywheel")
#: One short flywheel round on the demo's policies (2 policies x 2 tasks x 4 = 16 episodes), brief retraining.
DEMO_FLYWHEEL_POLICIES = ("sft", "rl-progrm_env")
DEMO_FLYWHEEL_EPISODES_PER_TASK = 4
#: The kind the demo's round retrains: the PRM, on the alternatives the round makes (top-1 among
#: candidates); the others stay as stage 3 trained them (each retraining costs minutes here) and
#: are judged by the same report (AUC on agent episodes).
DEMO_FLYWHEEL_KINDS = ("prm",)


def cmd_demo(args: argparse.Namespace) -> int:
    """Materialize every stage of the asset graph (with its checks) into the local Dagster instance,
    on embedded defaults, reduced where a stage is long; prints which stage runs and how far."""
    prepare_dagster_home()
    from dagster import DagsterInstance, MultiPartitionKey

    from assets.labels import all_label_families_tags
    from envs.task_catalog import families
    from warehouse.catalog import Warehouse

    if args.demos_per_task < 0:
        print("stepwise demo: --demos-per-task must be 0 (all) or more", file=sys.stderr)
        return 2
    stages = DEMO_STAGES[: DEMO_STAGES.index(args.until) + 1]
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    checks: list = []  # asset-check evaluations of every run

    stage_started: dict[str, float] = {}  # stage name -> when it began (its time: until the next one began)

    def stage(number: int, name: str, detail: str) -> None:
        now = time.perf_counter()
        stage_started.setdefault(name, now)
        print(f"\n== [{number}/{len(stages)}] {name}: {detail} ({now - started:.0f} s so far)", flush=True)

    with DagsterInstance.get() as instance:
        run = _job_runner(instance, outcomes, checks)
        # A batch of live rollouts (Chromium) per MiniWoB++ family, so the labels stage below sees
        # human demonstrations and rollouts alike.
        stage(1, "rollouts", f"{args.episodes_per_task} live episodes per catalog task in Chromium")
        for family in families("miniwob"):
            run(
                "miniwob_rollouts_job",
                f"rollouts b00|{family}",
                MultiPartitionKey({"batch": "b00", "family": family}),
                {"rollouts": {"config": {"episodes_per_task": args.episodes_per_task}}},
            )
        stage(2, "demonstrations and labels", "import, synthesis, recipes, progress labels, split, label report")
        main_ok = run(
            "stepwise_main",
            "stepwise_main",
            config={
                "human_demonstrations": {"config": {"max_files_per_task": _demo_sample(args.demos_per_task)}},
                "recipes_and_progress_labels": {"config": {"mode": "full"}},
            },
            tags=all_label_families_tags(),
        )
        if "reward_models" in stages and main_ok:
            for i, kind in enumerate(DEMO_REWARD_MODELS):
                stage(3, "reward models", f"{kind} ({i + 1}/{len(DEMO_REWARD_MODELS)}), a short training")
                run("reward_models", f"reward_models[{kind}]", kind, {"reward_model": {"config": DEMO["reward_model"]}})
            stage(3, "reward models", "the evaluation report (ProgRM Tables 2-3) on a sample of the held-out split")
            run(
                "reward_model_evaluation",
                "reward_model_evaluation",
                None,
                {"reward_model_report": {"config": DEMO["reward_model_report"]}},
            )
        if "rl" in stages and all(ok for _, ok in outcomes):
            stage(4, "RL", "SFT policy, task choice and held-out evaluation")
            if run("policy_sft_job", "policy_sft", None, {"policy_sft": {"config": DEMO["policy_sft"]}}):
                for i, variant in enumerate(DEMO["runs"]):
                    stage(4, "RL", f"run {variant} ({i + 1}/{len(DEMO['runs'])}) and its evaluation")
                    run(
                        "rl_runs",
                        f"rl_runs[{variant}|s0]",
                        MultiPartitionKey({"run": variant, "seed": "s0"}),
                        {
                            "rl_run": {"config": DEMO["rl_run"]},
                            "agent_evaluation": {"config": DEMO["agent_evaluation"]},
                        },
                    )
                stage(4, "RL", "ProgRM Table 1")
                run("rl_report_job", "rl_report")
        if "flywheel" in stages and all(ok for _, ok in outcomes):
            from pipelines.flywheel import FlywheelSettings, run_flywheel

            stage(5, "flywheel", "the policies' own episodes, labelled; reward models retrained and judged on agents")
            settings = FlywheelSettings(
                policies=DEMO_FLYWHEEL_POLICIES,
                episodes_per_task=DEMO_FLYWHEEL_EPISODES_PER_TASK,
                kinds=DEMO_FLYWHEEL_KINDS,
                reward_model=DEMO["reward_model"],
                report=DEMO["reward_model_report"],
                alternatives=DEMO["step_alternatives"],
            )
            run_flywheel(Warehouse(), 1, settings, run, print)
    all_ok = all(ok for _, ok in outcomes)
    _print_demo_summary(all_ok, time.perf_counter() - started, stage_started, outcomes, checks, main_ok, stages)
    return 0 if all_ok else 1


def _print_demo_summary(
    all_ok: bool,
    seconds: float,
    stage_started: dict[str, float],
    outcomes: list[tuple[str, bool]],
    checks: list,
    main_ok: bool,
    stages: tuple[str, ...],
) -> None:
    """The demo's closing summary: verdict, stage times, each run, the data checks, the tables
    and where to look next."""
    from warehouse.catalog import Warehouse

    finished = time.perf_counter()
    warehouse = Warehouse()
    print()
    outcome = "succeeded" if all_ok else "FAILED"
    print(f"== Stepwise: {outcome} in {seconds:.0f} s")
    begins = [*stage_started.values(), finished]
    print(
        "   stage times: "
        + ", ".join(f"{name} {begins[i + 1] - begins[i]:.0f} s" for i, name in enumerate(stage_started))
    )
    for name, ok in outcomes:
        print(f"   {name}: {'ok' if ok else 'FAILED'}")
    _print_checks(checks)
    if main_ok:
        _demo_tables(warehouse, stages)
    views = "episodes, steps, progress_labels, recipes, label_quality, rm_metrics, agent_eval, rl_iterations, lineage"
    print(f"   warehouse: {warehouse.db_path} (views: {views}, ...)")
    print(f"   plots:     {warehouse.home / 'plots'}")
    print("   query:     .venv/bin/stepwise sql      (a SQL shell; .tables lists the views)")
    print("   UI:        make ui   (then open http://127.0.0.1:3000)")


def _demo_sample(per_task: int) -> int | None:
    """Recordings per task the demo imports: ``per_task`` (0: all), or as many as the home's
    import already holds of its largest task folder, when that is more (after ``make data``, or a
    larger sample): a demo run never shrinks the demonstrations a home holds. Samples grow by
    inclusion (:func:`envs.miniwob.demonstrations.sample_per_task`), so the larger one keeps them all."""
    import duckdb

    from warehouse.catalog import Warehouse

    if not per_task:
        return None
    try:
        held = (
            Warehouse()
            .query(
                "SELECT coalesce(max(n), 0) AS n FROM (SELECT regexp_extract(source_file, '([^/]+)/[^/]+$', 1) AS "
                "folder, count(*) AS n FROM source_files GROUP BY 1)"
            )
            .to_pylist()[0]["n"]
        )
    except duckdb.Error:  # a new home: nothing imported yet
        return per_task
    if held > per_task:
        print(f"   (the home's import holds up to {held} recordings per task: the demo keeps them all)")
    return max(per_task, int(held))


def _demo_tables(warehouse, stages: tuple[str, ...]) -> None:
    """The summary tables `stepwise demo` prints (also what docs/numbers come from)."""
    from training.base.registry import LATEST_REPORT_RUN

    _print_table(
        warehouse.query(
            "SELECT source, purpose, count(*) AS episodes, count(*) FILTER (WHERE success) AS successes, "
            "count(*) FILTER (WHERE NOT success) AS failures, sum(n_steps) AS steps, "
            "count(DISTINCT task_id) AS tasks "
            "FROM episodes GROUP BY source, purpose ORDER BY source, purpose"
        )
    )
    _print_table(warehouse.query("SELECT status, count(*) AS files FROM source_files GROUP BY status ORDER BY status"))
    _print_table(
        warehouse.query(
            "SELECT source, method, count(*) AS steps, count(DISTINCT episode_id) AS episodes, "
            "round(avg(progress), 3) AS mean_progress, "
            "round(avg(is_key_step::INT), 3) AS key_step_share FROM progress_labels GROUP BY ALL ORDER BY ALL"
        )
    )
    _print_table(
        warehouse.query(
            "SELECT method, task_set, episodes, round(key_step_precision, 3) AS precision, "
            "round(key_step_recall, 3) AS recall, round(key_step_progress_error, 3) AS key_step_error "
            "FROM label_quality WHERE task_set NOT IN (SELECT DISTINCT task_id FROM episodes) "
            "ORDER BY task_set, method"
        )
    )
    if "reward_models" in stages:
        _print_table(
            warehouse.query(
                "SELECT kind, metric, round(value, 4) AS value FROM rm_metrics WHERE split = 'test' AND metric IN "
                "('accuracy', 'key_step_progress_error', 'latency_ms_p50') "
                f"AND report_run_id = {LATEST_REPORT_RUN} "
                "ORDER BY metric, kind"
            )
        )
    if "rl" in stages:
        _print_table(
            warehouse.query(
                "WITH sft AS (SELECT policy_id FROM policies WHERE kind = 'sft' ORDER BY created_at DESC LIMIT 1) "
                "SELECT reward_source, count(*) AS tasks, sum(episodes) AS episodes, "
                "round(sum(successes) / sum(episodes), 3) AS success_rate, "
                "round(avg(mean_env_return), 3) AS env_return "
                "FROM agent_eval WHERE evaluation = 'held_out' AND (policy_id IN (SELECT policy_id FROM sft) OR "
                "policy_id IN (SELECT policy_id FROM policies WHERE parent_policy_id IN (SELECT policy_id FROM sft))) "
                "GROUP BY 1 ORDER BY 1"
            )
        )


def _backbone_name(warehouse, model_id: str) -> str | None:
    """The backbone a registered model was trained on, as a short name (its folder's name)."""
    rows = warehouse.query("SELECT backbone FROM models WHERE model_id = ?", [model_id]).to_pylist()
    return Path(rows[0]["backbone"]).name if rows and rows[0]["backbone"] else None


def cmd_reward_models(args: argparse.Namespace) -> int:
    """Dataset + model per kind (the ``reward_models`` job, one partition each), then the report."""
    prepare_dagster_home()
    from dagster import DagsterInstance

    from pipelines.definitions import defs
    from training.base.registry import latest_models
    from training.reward_models.kinds import REWARD_MODEL_KINDS
    from training.reward_models.runs import REPORT_REQUIRED_KINDS
    from warehouse.catalog import Warehouse

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(REWARD_MODEL_KINDS))
    if unknown:
        print(
            f"stepwise reward-models: unknown kind(s) {unknown}; choose from {list(REWARD_MODEL_KINDS)}",
            file=sys.stderr,
        )
        return 2
    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    training = {"train_steps": args.train_steps, "profile": args.profile, "backbone": args.backbone}
    training |= {"threads": args.threads} if args.threads else {}
    training |= {"max_train_examples": args.max_train_examples} if args.max_train_examples else {}
    report_config = {"max_trajectories": args.report_trajectories} if args.report_trajectories else {}
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    with DagsterInstance.get() as instance:
        job = defs.resolve_job_def("reward_models")
        for kind in kinds:
            run = job.execute_in_process(
                instance=instance,
                partition_key=kind,
                raise_on_error=False,
                run_config=quiet | {"ops": {"reward_model": {"config": training}}},
            )
            outcomes.append((f"reward_models[{kind}]", run.success))
        warehouse = Warehouse()
        trained = {m.kind for m in latest_models(warehouse, REPORT_REQUIRED_KINDS)}
        missing = [k for k in REPORT_REQUIRED_KINDS if k not in trained]
        if args.report and not missing:
            report = defs.resolve_job_def("reward_model_evaluation").execute_in_process(
                instance=instance,
                raise_on_error=False,
                run_config=quiet | {"ops": {"reward_model_report": {"config": report_config}}},
            )
            outcomes.append(("reward_model_report", report.success))
            _print_checks(report.get_asset_check_evaluations())
    all_ok = all(ok for _, ok in outcomes)
    print(
        f"\n== Stepwise reward models: {'succeeded' if all_ok else 'FAILED'} in {time.perf_counter() - started:.0f} s"
    )
    for name, ok in outcomes:
        print(f"   {name}: {'ok' if ok else 'FAILED'}")
    if args.report and missing:
        print(
            f"   report skipped: no trained model yet for {missing} (the report compares {list(REPORT_REQUIRED_KINDS)})"
        )
    elif args.report and all_ok:
        import pyarrow as pa

        from training.reward_models.runs import REPORT_REQUIRED_METRICS, latest_report_metrics

        shown = REPORT_REQUIRED_METRICS
        values = {
            (r["kind"], r["metric"]): r["value"] for r in latest_report_metrics(warehouse) if r["split"] == "test"
        }
        reported = sorted({kind for kind, _ in values})
        backbones = {m.kind: _backbone_name(warehouse, m.model_id) for m in latest_models(warehouse, reported)}
        rows = [
            {"kind": kind, "backbone": backbones.get(kind)}
            | {m: None if values.get((kind, m)) is None else round(values[(kind, m)], 4) for m in shown}
            for kind in sorted({kind for kind, _ in values})
        ]
        _print_table(pa.Table.from_pylist(rows))
        print(
            "   details: the reward_model_report asset in the UI (plots), or SELECT * FROM rm_metrics / rm_predictions"
        )
    return 0 if all_ok else 1


#: The reduced experiment CI runs end to end (a few tasks, a few iterations).
RL_REDUCED = {
    "sft": {"selection_seeds": 4, "held_out_seeds": 6, "max_tasks": 2, "epochs": 6},
    "run": {"iterations": 2, "instances_per_task": 2, "group_size": 2},
    "evaluation": {"held_out_seeds": 6},
}


def _flywheel_pins(round_: int | None, runs: list[str]) -> dict[str, str] | None:
    """Each run variant's reward model from flywheel round ``round_`` (empty without one); None
    after a one-line error (round 0, a source without a model, a kind the round did not train)."""
    from training.rl.rewards import SOURCE_MODEL_KIND
    from training.rl.runs import RUN_VARIANTS, flywheel_round_models
    from warehouse.catalog import Warehouse

    if round_ is None:
        return {}
    if round_ < 1:
        print("stepwise rl: --flywheel-round >= 1 (round 0 is today's models: leave the flag out)", file=sys.stderr)
        return None
    if no_model := [r for r in runs if SOURCE_MODEL_KIND[RUN_VARIANTS[r][0]] is None]:
        print(f"stepwise rl: --flywheel-round pins reward models; {no_model} use none", file=sys.stderr)
        return None
    round_models = flywheel_round_models(Warehouse(), round_)
    kinds = {r: str(SOURCE_MODEL_KIND[RUN_VARIANTS[r][0]]) for r in runs}
    if missing := sorted({k for k in kinds.values() if k not in round_models}):
        print(
            f"stepwise rl: flywheel round {round_} trained no {missing} model "
            f"(it has {sorted(round_models) or 'none'}; stepwise flywheel --kinds ...)",
            file=sys.stderr,
        )
        return None
    return {r: round_models[kinds[r]] for r in runs}


def _unknown_runs(runs: list[str]) -> str | None:
    """What is wrong with ``--runs`` (one line), or None: no run, a malformed composed name (which
    part), or a name that is no run variant."""
    from training.rl.rewards.composed import COMPOSABLE_SOURCES, COMPOSITION_FORMS, parse_composition
    from training.rl.runs import RUN_VARIANTS

    unknown = sorted(set(runs) - set(RUN_VARIANTS))
    for composed in (r for r in unknown if "+" in r):
        try:
            parse_composition(composed)
        except ValueError as exc:  # which part of the name is wrong
            return str(exc)
    if unknown or not runs:
        singles = [r for r in RUN_VARIANTS if "+" not in r]
        return (
            f"unknown run(s) {unknown}; choose from {singles} or a composed reward outcome+<source>:<form> "
            f"(source: {', '.join(COMPOSABLE_SOURCES)}; form: {', '.join(COMPOSITION_FORMS)})"
        )
    return None


def cmd_rl(args: argparse.Namespace) -> int:
    """The RL experiment: reward models it needs (trained briefly when missing), the SFT policy,
    one run per reward source and seed with its held-out evaluation, then ProgRM Table 1. With
    ``--policy llm``: the LLM agent instead (:func:`cmd_rl_llm`)."""
    if args.policy == "llm":
        return cmd_rl_llm(args)
    prepare_dagster_home()
    from dagster import DagsterInstance, MultiPartitionKey

    from pipelines.definitions import defs
    from training.base.registry import latest_models
    from training.rl.report import report_markdown
    from training.rl.rewards import SOURCE_MODEL_KIND
    from training.rl.runs import RL_SEEDS, RUN_VARIANTS, run_rl_report, seed_key
    from warehouse.catalog import Warehouse

    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if (error := _unknown_runs(runs)) is not None:
        print(f"stepwise rl: {error}", file=sys.stderr)
        return 2
    if not 1 <= args.seeds <= len(RL_SEEDS):
        print(f"stepwise rl: --seeds must be 1..{len(RL_SEEDS)}", file=sys.stderr)
        return 2
    seed_keys = [k.strip() for k in args.seed_keys.split(",") if k.strip()] or list(RL_SEEDS[: args.seeds])
    if bad_keys := sorted(set(seed_keys) - set(RL_SEEDS)):
        print(f"stepwise rl: --seed-keys {bad_keys} unknown; choose from {list(RL_SEEDS)}", file=sys.stderr)
        return 2
    pinned = _flywheel_pins(args.flywheel_round, runs)
    if pinned is None:
        return 2
    reduced = RL_REDUCED if args.reduced else {"sft": {}, "run": {}, "evaluation": {}}
    sft_config = reduced["sft"] | ({"tasks": args.tasks.split(",")} if args.tasks else {})
    run_config = reduced["run"] | ({"iterations": args.iterations} if args.iterations else {})
    # the block is in the partition: s0 (dense) or sparse-s0
    partition_seeds = [seed_key(args.block, int(k[1:])) for k in seed_keys]
    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    warehouse = Warehouse()
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    with DagsterInstance.get() as instance:
        needed = sorted({k for r in runs if (k := SOURCE_MODEL_KIND[RUN_VARIANTS[r][0]]) is not None and not pinned})
        if any(RUN_VARIANTS[r][1] == "ppo" for r in runs):
            needed = sorted(set(needed) | {"prm"})
        have = {m.kind for m in latest_models(warehouse, needed)}
        for kind in [k for k in needed if k not in have]:
            print(f"   reward model {kind}: none trained yet; training one with {args.rm_train_steps} steps")
            run = defs.resolve_job_def("reward_models").execute_in_process(
                instance=instance,
                partition_key=kind,
                raise_on_error=False,
                run_config=quiet | {"ops": {"reward_model": {"config": {"train_steps": args.rm_train_steps}}}},
            )
            outcomes.append((f"reward_models[{kind}]", run.success))
            if not run.success:
                return _summary("rl", started, outcomes)
        if not args.reuse_sft:
            run = defs.resolve_job_def("policy_sft_job").execute_in_process(
                instance=instance,
                raise_on_error=False,
                run_config=quiet | {"ops": {"policy_sft": {"config": sft_config}}},
            )
            outcomes.append(("policy_sft", run.success))
            if not run.success:
                return _summary("rl", started, outcomes)
        job = defs.resolve_job_def("rl_runs")
        for variant in runs:
            for seed in partition_seeds:
                run_started = time.perf_counter()
                run = job.execute_in_process(
                    instance=instance,
                    partition_key=MultiPartitionKey({"run": variant, "seed": seed}),
                    raise_on_error=False,
                    run_config=quiet
                    | {
                        "ops": {
                            "rl_run": {"config": run_config | ({"reward_model_id": pinned[variant]} if pinned else {})},
                            "agent_evaluation": {"config": reduced["evaluation"]},
                        }
                    },
                )
                label = f"rl_runs[{variant}|{seed}] ({time.perf_counter() - run_started:.0f} s)"
                print(f"   {label}: {'ok' if run.success else 'FAILED'}", flush=True)
                outcomes.append((label, run.success))
        report = defs.resolve_job_def("rl_report_job").execute_in_process(
            instance=instance, raise_on_error=False, run_config=quiet
        )
        outcomes.append(("rl_report", report.success))
        _print_checks(report.get_asset_check_evaluations())
    if report.success:
        print()
        print(report_markdown(run_rl_report(warehouse)))
        print(f"\n   plots: {warehouse.home / 'plots' / 'rl'}; SQL: SELECT * FROM agent_eval / rl_iterations")
    return _summary("rl", started, outcomes)


def _job_runner(instance, outcomes: list[tuple[str, bool]], checks: list | None = None):
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


def cmd_flywheel(args: argparse.Namespace) -> int:
    """Collect policy rollouts, label them, retrain the reward models, report: ``--rounds`` times."""
    prepare_dagster_home()
    from dagster import DagsterInstance

    from pipelines.flywheel import FlywheelSettings, run_flywheel
    from training.flywheel.alternatives import AlternativesError, AlternativesRequest
    from training.flywheel.collection import policy_keys
    from training.reward_models.kinds import REWARD_MODEL_KINDS
    from training.rl.rewards import REWARD_SOURCES
    from warehouse.catalog import Warehouse

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    proposers = tuple(p.strip() for p in args.alternative_policies.split(",") if p.strip())
    known_policies = policy_keys(REWARD_SOURCES)
    for flag, named in (("--policies", policies), ("--alternative-policies", proposers)):
        if (flag == "--policies" and not named) or set(named) - set(known_policies):
            print(f"stepwise flywheel: {flag} from {known_policies}", file=sys.stderr)
            return 2
    try:
        alternatives = {
            "states_per_task": args.alternative_states,
            "top_k": args.top_k,
            "continuations": args.continuations,
            "horizon": args.horizon,
        }
        AlternativesRequest("sft", "f", **alternatives)  # bad values: one line, before any run
    except AlternativesError as exc:
        print(f"stepwise flywheel: {exc}", file=sys.stderr)
        return 2
    unknown = sorted(set(kinds) - set(REWARD_MODEL_KINDS))
    if unknown or not kinds or args.rounds < 0 or args.episodes_per_task < 1:
        print(
            f"stepwise flywheel: kinds from {list(REWARD_MODEL_KINDS)} (unknown: {unknown}), --rounds >= 0, "
            "--episodes-per-task >= 1",
            file=sys.stderr,
        )
        return 2
    settings = FlywheelSettings(
        policies=policies,
        episodes_per_task=args.episodes_per_task,
        temperature=args.temperature,
        kinds=kinds,
        reward_model={"train_steps": args.train_steps}
        | ({"max_train_examples": args.max_train_examples} if args.max_train_examples else {}),
        report={"max_trajectories": args.report_trajectories} if args.report_trajectories else {},
        alternative_policies=proposers,
        alternatives=alternatives,
    )
    warehouse = Warehouse()
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    with DagsterInstance.get() as instance:
        if not run_flywheel(warehouse, args.rounds, settings, _job_runner(instance, outcomes), print) and all(
            ok for _, ok in outcomes
        ):
            outcomes.append(("flywheel (nothing to collect from)", False))
    rows = warehouse.query("SELECT * FROM flywheel_rounds ORDER BY round, kind").to_pylist()
    if rows:
        from training.flywheel.rounds import rounds_markdown

        print("\n" + rounds_markdown(rows))
        plot = warehouse.home / "plots" / "flywheel" / "auc_by_round.png"
        print(f"\n   plot: {plot}; SQL: SELECT * FROM flywheel_rounds")
    return _summary("flywheel", started, outcomes)


def cmd_rl_llm(args: argparse.Namespace) -> int:
    """``stepwise rl --policy llm``: the ``llm_agent`` asset (pretrained LLM -> SFT -> RL, each greedy
    on the same held-out seeds; training.rl.llm_runs), then its stages side by side."""
    prepare_dagster_home()
    from dagster import DagsterInstance

    from pipelines.definitions import defs
    from training.rl.rewards import REWARD_SOURCES

    sources = [r.strip() for r in args.runs.split(",") if r.strip()]
    if args.runs == RL_DEFAULT_RUNS:
        sources = ["outcome"]  # the CPU experiment's default list is not the LLM's
    if len(sources) != 1 or sources[0] not in REWARD_SOURCES:
        print(f"stepwise rl --policy llm: --runs takes one reward source of {list(REWARD_SOURCES)}", file=sys.stderr)
        return 2
    config: dict[str, Any] = {"reward_source": sources[0]}
    if args.tasks:
        config["tasks"] = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.iterations:
        config["iterations"] = args.iterations
    for name in ("sft_steps", "held_out_seeds"):
        if (value := getattr(args, f"llm_{name}")) is not None:
            config[name] = value
    if args.reduced:
        config |= {"sft_steps": 4, "iterations": 1, "instances_per_task": 1, "held_out_seeds": 1}
        config |= {"tasks": config.get("tasks", ["click-option"])[:1], "sft_examples_per_task": 20}
    started = time.perf_counter()
    with DagsterInstance.get() as instance:
        run = defs.resolve_job_def("llm_agent_job").execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_config={
                "loggers": {"console": {"config": {"log_level": "INFO"}}},
                "ops": {"llm_agent": {"config": config}},
            },
        )
    if run.success:
        for event in run.get_asset_materialization_events():
            stages = event.materialization.metadata.get("stages")
            if stages is not None:
                print()
                print(stages.value)
    return _summary("rl --policy llm", started, [("llm_agent", run.success)])


def cmd_rl_export(args: argparse.Namespace) -> int:
    """RL episodes and step rewards as OpenRLHF / verl datasets (training/rl/export.py)."""
    from training.rl.export import export_rl_data
    from warehouse.catalog import Warehouse

    try:
        summary = export_rl_data(Warehouse(), args.out, run_key=args.run)
    except ValueError as exc:
        print(f"stepwise rl-export: {exc}", file=sys.stderr)
        return 2
    print(
        f"{summary.episodes} episodes, {summary.steps} steps ({summary.steps_without_response} without a "
        f"writable action): {summary.steps_path}, {summary.trajectories_path}"
    )
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    """The README's tables from the warehouse, as markdown."""
    from pipelines.figures import SECTIONS, print_figures
    from warehouse.catalog import Warehouse

    if args.section and args.section not in SECTIONS:
        print(f"stepwise figures: unknown section {args.section!r}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
    return 0 if print_figures(Warehouse(), args.section) else 1


def cmd_annotate_push(args: argparse.Namespace) -> int:
    """Select the steps whose labels matter and push them to Label Studio (no Dagster needed)."""
    from dataclasses import replace

    from annotation.labelstudio.client import LabelStudioError
    from annotation.labelstudio.human_labels import (
        AnnotatePushOptions,
        PushOptions,
        SelectionOptions,
        parse_source_shares,
        push_from_cli,
    )
    from annotation.labelstudio.server import LabelStudioServerError
    from warehouse.catalog import Warehouse

    try:
        selection = SelectionOptions(budget=args.budget, source_shares=parse_source_shares(args.share))
        push = PushOptions()
        if args.interfaces:
            push = replace(push, interfaces=tuple(i.strip() for i in args.interfaces.split(",") if i.strip()))
        push_from_cli(Warehouse(), options=AnnotatePushOptions(selection, push, select=not args.no_select), log=print)
    except (ValueError, LabelStudioError, LabelStudioServerError) as exc:
        print(f"stepwise annotate push: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_annotate_rationales(args: argparse.Namespace) -> int:
    """GUI-Shepherd §3: an LLM writes the rationale of each human positive / negative step label
    that has none yet (``label_rationales``); with no ``--base-url``, SmolLM2 is served locally."""
    from training.base.pretrained import PretrainedModelError
    from training.llm.chat_client import ChatClient
    from training.llm.endpoint import EndpointStartError, chat_endpoint_or_local
    from training.llm.rationales import RationaleEndpointError, RationaleOptions, generate_label_rationales
    from warehouse.catalog import Warehouse

    warehouse = Warehouse()
    options = RationaleOptions(max_tokens=args.max_tokens, max_labels=args.max_labels)
    try:
        with chat_endpoint_or_local(
            args.base_url,
            args.model,
            api_key_env=args.api_key_env,
            timeout_s=args.timeout,
            home=warehouse.home,
            log_path=warehouse.home / "logs" / "label_rationales-cli.log",
        ) as endpoint:
            summary = generate_label_rationales(warehouse, ChatClient(endpoint), options, log=print)
    except (RationaleEndpointError, EndpointStartError, PretrainedModelError) as exc:
        print(f"stepwise annotate rationales: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


def cmd_specs_validate(args: argparse.Namespace) -> int:
    """Load a folder of task specs and replay the recorded episodes of each task against them."""
    from envs.spec_validation import format_report, validate_specs, warehouse_episodes
    from warehouse.catalog import Warehouse

    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"stepwise specs validate: not a folder: {folder}", file=sys.stderr)
        return 2
    load = None if args.no_replay else warehouse_episodes(Warehouse(), source=args.source)
    report = validate_specs(folder, load=load)
    print(format_report(report))
    return 1 if report.errors else 0


def _print_checks(evaluations) -> None:
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
    print(f"   data checks: {len(data) - failed} of {len(data)} passed in every run")
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


def _summary(name: str, started: float, outcomes: list[tuple[str, bool]]) -> int:
    all_ok = all(ok for _, ok in outcomes)
    print(f"\n== Stepwise {name}: {'succeeded' if all_ok else 'FAILED'} in {time.perf_counter() - started:.0f} s")
    for step, ok in outcomes:
        print(f"   {step}: {'ok' if ok else 'FAILED'}")
    return 0 if all_ok else 1


def cmd_ui(args: argparse.Namespace) -> int:
    prepare_dagster_home()
    exe = Path(sys.executable).with_name("dagster-webserver")
    print(f"Dagster UI on http://127.0.0.1:{args.port} (Ctrl-C to stop)")
    return subprocess.call(
        [str(exe), "-h", "127.0.0.1", "-p", str(args.port), "-w", str(REPO_ROOT / "workspace.yaml")], cwd=REPO_ROOT
    )


# the papers' comparison (each learned source alone, the learned ORM its baseline) and one composed
# source (issue 41: a dense reward added to the exact outcome), so `stepwise rl --reduced` shows both
RL_DEFAULT_RUNS = "outcome,orm,progrm_lcs,progrm_env,prm,admire,outcome+progrm_env:shaped"


# long: one declarative block per subcommand (flags, help, handler); splitting it would scatter the
# command line over functions that each add one parser.
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepwise", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="materialize the whole asset graph on embedded defaults and print a summary")
    p.add_argument("--episodes-per-task", type=int, default=2, help="live rollouts per catalog task (batch b00)")
    p.add_argument(
        "--until", choices=DEMO_STAGES, default=DEMO_STAGES[-1], help="the last stage to run (default: every stage)"
    )
    p.add_argument(
        "--demos-per-task",
        type=int,
        default=DEMO["human_demonstrations"]["max_files_per_task"],
        help="recordings imported per task (a fixed sample); 0: all 10,466 (what make data runs before the full "
        "experiments)",
    )
    p.set_defaults(func=cmd_demo)
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
    p.add_argument("--no-replay", action="store_true", help="only load the specs")
    p.set_defaults(func=cmd_specs_validate)
    p = sub.add_parser("annotate", help="human labels in Label Studio")
    annotate = p.add_subparsers(dest="annotate_command", required=True)
    p = annotate.add_parser("push", help="select the steps whose labels matter and push them to Label Studio")
    p.add_argument("--budget", type=int, default=500, help="steps to put in front of people this round")
    p.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="SOURCE=WEIGHT",
        help="the budget's share of an episode source (human_demo, rollout, synthetic, synthetic:<kind>, *); "
        "repeatable; =0 leaves a source out",
    )
    p.add_argument("--interfaces", default="", help="comma-separated interfaces to push (default: all)")
    p.add_argument("--no-select", action="store_true", help="push the current selection without selecting again")
    p.set_defaults(func=cmd_annotate_push)
    p = annotate.add_parser(
        "rationales", help="an LLM writes the rationale of each positive / negative step label (GUI-Shepherd §3)"
    )
    p.add_argument("--base-url", default=None, help="OpenAI-compatible base URL (…/v1); default: serve SmolLM2 here")
    p.add_argument("--model", default=None, help="the model name the endpoint expects (or a folder to serve)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one answer may take")
    p.add_argument("--max-labels", type=int, default=None, help="at most this many labels this run")
    p.add_argument("--max-tokens", type=int, default=160, help="answer budget in tokens")
    p.set_defaults(func=cmd_annotate_rationales)
    p = sub.add_parser("figures", help="the README's tables, printed from the warehouse as markdown")
    p.add_argument("--section", default=None, help="one section (demonstrations, label quality, ...)")
    p.set_defaults(func=cmd_figures)
    p = sub.add_parser("lineage", help="where an episode came from, down to the raw files")
    p.add_argument("episode_id")
    p.add_argument("--max-rows", type=int, default=100)
    p.set_defaults(func=cmd_lineage)
    p = sub.add_parser(
        "reward-models", help="train reward models (dataset + model per kind), then the evaluation report"
    )
    p.add_argument(
        "--kinds",
        default="orm,progrm_lcs,progrm_env",
        help="comma-separated: orm, progrm_lcs, progrm_env, prm, guidnav",
    )
    p.add_argument(
        "--train-steps",
        "--max-steps",  # the name before one meaning per name; kept for scripts that use it
        dest="train_steps",
        type=int,
        default=-1,
        help="optimizer steps per model (-1: the profile's; on CPU up to ~3,000, stopping early when the "
        "validation loss stops falling)",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads of each training process (0: the asset's default)"
    )
    p.add_argument(
        "--profile",
        choices=("cpu", "llm"),
        default="cpu",
        help="cpu: frozen MiniLM segments + a small fusion (default); llm: ProgRM's LLM + MLP + sigmoid, the "
        "whole backbone fine-tuned (Table 5; float32 on a machine without CUDA)",
    )
    p.add_argument(
        "--backbone",
        default="",
        help="the llm profile's LLM: smollm2 (the packaged SmolLM2-135M-Instruct), a .gguf file, or a Hugging "
        "Face folder (default: MiniLM)",
    )
    p.add_argument(
        "--max-train-examples", type=int, default=0, help="a seeded sample of each kind's training examples (0: all)"
    )
    p.add_argument(
        "--report-trajectories",
        type=int,
        default=0,
        help="the report on a fixed sample of this many trajectories per split (0: all; an LLM backbone scores "
        "a few steps a second on a CPU)",
    )
    p.add_argument("--no-report", dest="report", action="store_false", help="train only")
    p.set_defaults(func=cmd_reward_models)
    p = sub.add_parser("rl", help="the RL experiment: SFT, one run per reward source and seed, ProgRM Table 1")
    p.add_argument(
        "--runs",
        default=RL_DEFAULT_RUNS,
        help="comma-separated runs: a reward source (REINFORCE++) or a variant such as admire_grpo, prm_ppo "
        "(with --policy llm: one reward source, default outcome)",
    )
    p.add_argument(
        "--policy",
        choices=("learned", "llm"),
        default="learned",
        help="learned: the CPU candidate-scoring policy (Table 1); llm: SmolLM2-135M-Instruct, SFT then RL "
        "(the llm_agent asset)",
    )
    p.add_argument("--llm-sft-steps", dest="llm_sft_steps", type=int, default=None, help="--policy llm: SFT steps")
    p.add_argument(
        "--llm-held-out-seeds", dest="llm_held_out_seeds", type=int, default=None, help="--policy llm: held-out seeds"
    )
    p.add_argument("--seeds", type=int, default=3, help="RL seeds per run (1-5): the partitions s0 .. s<seeds-1>")
    p.add_argument(
        "--seed-keys",
        default="",
        help="comma-separated seed partitions instead of --seeds (s3,s4: add seeds, not re-evaluating the others)",
    )
    p.add_argument(
        "--flywheel-round",
        type=int,
        default=None,
        help="train against the reward models this flywheel round trained (runs of their own, compared in the "
        "report with the same sources on today's models)",
    )
    p.add_argument("--iterations", type=int, default=0, help="RL iterations per run (0: the asset's default)")
    p.add_argument("--tasks", default="", help="comma-separated candidate tasks (default: every catalog task)")
    p.add_argument(
        "--block",
        choices=("dense", "sparse"),
        default="dense",
        help="the task block the runs train on, as the SFT policy pre-registered it (dense: SFT success in "
        "(low, high); sparse: SFT success in (0, 15%%] and demonstrations of >= 5 steps)",
    )
    p.add_argument("--reduced", action="store_true", help="a small experiment (what CI runs end to end)")
    p.add_argument("--reuse-sft", action="store_true", help="keep the newest SFT policy instead of training one")
    p.add_argument(
        "--rm-train-steps",
        "--rm-max-steps",  # the name before one meaning per name
        dest="rm_train_steps",
        type=int,
        default=400,
        help="optimizer steps of a missing reward model trained first",
    )
    p.set_defaults(func=cmd_rl)
    p = sub.add_parser(
        "flywheel", help="reward models retrained on the agent's own episodes: collect, label, retrain, report"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds after the last recorded one (0: the baseline only)")
    p.add_argument(
        "--policies",
        default="sft,rl-outcome,rl-orm,rl-progrm_lcs,rl-progrm_env",
        help="checkpoints to collect from: sft, rl-<reward source> (the newest of each; the asset's partitions)",
    )
    p.add_argument("--episodes-per-task", type=int, default=16, help="episodes per task, policy and round")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the policies")
    p.add_argument("--kinds", default="orm,progrm_lcs,progrm_env,prm", help="reward-model kinds retrained each round")
    p.add_argument(
        "--alternative-policies",
        default="sft",
        help="policies whose top-k candidates are replayed at sampled states (step_alternatives); empty: none",
    )
    p.add_argument("--alternative-states", type=int, default=8, help="states per task and source (alternatives)")
    p.add_argument("--top-k", type=int, default=4, help="the policy's candidates replayed at each state")
    p.add_argument("--continuations", type=int, default=4, help="m: the policy's continuations after each candidate")
    p.add_argument("--horizon", type=int, default=0, help="steps of a continuation (0: the rest of the step budget)")
    p.add_argument("--train-steps", type=int, default=-1, help="optimizer steps per model (-1: the profile's)")
    p.add_argument("--max-train-examples", type=int, default=0, help="a fixed sample of the training examples")
    p.add_argument("--report-trajectories", type=int, default=0, help="a sample of the report's demonstration split")
    p.set_defaults(func=cmd_flywheel)
    p = sub.add_parser("rl-export", help="RL episodes with their step rewards as OpenRLHF / verl datasets")
    p.add_argument("out", help="folder for steps.parquet and trajectories.jsonl")
    p.add_argument("--run", default=None, help="one run key (rl_iterations.run_key); default: every run")
    p.set_defaults(func=cmd_rl_export)
    p = sub.add_parser("ui", help="start the Dagster UI on 127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
