"""stepwise demo: every stage of the asset graph on embedded defaults, reduced to minutes, with a summary."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pipelines.cli.common import job_runner, prepare_dagster_home, print_checks, print_table
from training.reward_models.kinds import SUCCESS_JUDGE_KINDS

#: What `stepwise demo` runs, reduced so that the whole graph runs in minutes on 2 cores: every
#: stage runs for real on a fixed sample (30 recordings per task, ~1,500 of the 10,466), and each
#: model trains briefly. The full import is `stepwise import-demos` (or human_demonstrations with
#: its default config); `make reward-models`, `make rl` and `make flywheel` run the full budgets.
DEMO_REWARD_MODELS: tuple[str, ...] = SUCCESS_JUDGE_KINDS


DEMO: dict[str, Any] = {
    "human_demonstrations": {"max_files_per_task": 30},
    "reward_model": {"train_steps": 40, "max_train_examples": 2000, "max_eval_examples": 400},
    "reward_model_report": {"latency_calls": 20, "max_trajectories": 100},
    "policy_sft": {
        "selection_seeds": 3,
        "sparse_selection_seeds": 0,  # the demo's sparse block is chosen on its 3 seeds: minutes saved
        "held_out_seeds": 6,
        "max_tasks": 2,
        "epochs": 6,
        "max_episodes_per_task": 10,
    },
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
    advice: list[str] = []  # the RL report's "which reward to use here", one line per block

    stage_started: dict[str, float] = {}  # stage name -> when it began (its time: until the next one began)

    def stage(number: int, name: str, detail: str) -> None:
        now = time.perf_counter()
        stage_started.setdefault(name, now)
        print(f"\n== [{number}/{len(stages)}] {name}: {detail} ({now - started:.0f} s so far)", flush=True)

    with DagsterInstance.get() as instance:
        run = job_runner(instance, outcomes, checks)
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
                if run("rl_report_job", "rl_report"):
                    advice = _which_reward(instance)
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
    _print_demosummary(all_ok, time.perf_counter() - started, stage_started, outcomes, checks, main_ok, stages, advice)
    return 0 if all_ok else 1


def _which_reward(instance: Any) -> list[str]:
    """The ``which_reward_<block>`` lines of the latest ``rl_report`` materialization (the report's
    advice, ``training/rl/advice.py``), as ``<block> block: ...``."""
    from dagster import AssetKey

    from training.rl.advice import ADVICE_METADATA_PREFIX as prefix

    event = instance.get_latest_materialization_event(AssetKey("rl_report"))
    if event is None or event.asset_materialization is None:
        return []
    metadata = event.asset_materialization.metadata
    return [
        f"{key.removeprefix(prefix)} block: {value.value}" for key, value in metadata.items() if key.startswith(prefix)
    ]


def _print_demosummary(
    all_ok: bool,
    seconds: float,
    stage_started: dict[str, float],
    outcomes: list[tuple[str, bool]],
    checks: list,
    main_ok: bool,
    stages: tuple[str, ...],
    advice: list[str],
) -> None:
    """The demo's closing summary: verdict, stage times, each run, the data checks, the tables,
    which reward the RL report advises and where to look next."""
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
    print_checks(checks)
    if main_ok:
        _demo_tables(warehouse, stages)
    for line in advice:
        print(f"   which reward (rl_report), {line}")
    views = "episodes, steps, progress_labels, recipes, label_quality, rm_metrics, agent_eval, rl_iterations, lineage"
    print(f"   warehouse: {warehouse.db_path} (views: {views}, ...)")
    print(f"   plots:     {warehouse.home / 'plots'}")
    print("   query:     .venv/bin/stepwise sql      (a SQL shell; .tables lists the views)")
    print("   UI:        make ui   (then open http://127.0.0.1:3000)")


def _demo_sample(per_task: int) -> int | None:
    """Recordings per task the demo imports: ``per_task`` (0: all), or as many as the home's
    import already holds of its largest task folder, when that is more (after ``make data``, or a
    larger sample): a demo run never shrinks the demonstrations a home holds. Samples grow by
    inclusion (:func:`envs.miniwob.demo_files.sample_per_task`), so the larger one keeps them all."""
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

    print_table(
        warehouse.query(
            "SELECT source, purpose, count(*) AS episodes, count(*) FILTER (WHERE success) AS successes, "
            "count(*) FILTER (WHERE NOT success) AS failures, sum(n_steps) AS steps, "
            "count(DISTINCT task_id) AS tasks "
            "FROM episodes GROUP BY source, purpose ORDER BY source, purpose"
        )
    )
    print_table(warehouse.query("SELECT status, count(*) AS files FROM source_files GROUP BY status ORDER BY status"))
    print_table(
        warehouse.query(
            "SELECT source, method, count(*) AS steps, count(DISTINCT episode_id) AS episodes, "
            "round(avg(progress), 3) AS mean_progress, "
            "round(avg(is_key_step::INT), 3) AS key_step_share FROM progress_labels GROUP BY ALL ORDER BY ALL"
        )
    )
    print_table(
        warehouse.query(
            "SELECT method, task_set, episodes, round(key_step_precision, 3) AS precision, "
            "round(key_step_recall, 3) AS recall, round(key_step_progress_error, 3) AS key_step_error "
            "FROM label_quality WHERE task_set NOT IN (SELECT DISTINCT task_id FROM episodes) "
            "ORDER BY task_set, method"
        )
    )
    if "reward_models" in stages:
        print_table(
            warehouse.query(
                "SELECT kind, metric, round(value, 4) AS value FROM rm_metrics WHERE split = 'test' AND metric IN "
                "('accuracy', 'key_step_progress_error', 'latency_ms_p50') "
                f"AND report_run_id = {LATEST_REPORT_RUN} "
                "ORDER BY metric, kind"
            )
        )
    if "rl" in stages:
        print_table(
            warehouse.query(
                "WITH sft AS (SELECT policy_id FROM policies WHERE kind = 'sft' ORDER BY created_at DESC LIMIT 1) "
                "SELECT policy_label, count(*) AS tasks, sum(episodes) AS episodes, "
                "round(sum(successes) / sum(episodes), 3) AS success_rate, "
                "round(avg(mean_env_return), 3) AS env_return "
                "FROM agent_eval WHERE evaluation = 'held_out' AND (policy_id IN (SELECT policy_id FROM sft) OR "
                "policy_id IN (SELECT policy_id FROM policies WHERE parent_policy_id IN (SELECT policy_id FROM sft))) "
                "GROUP BY 1 ORDER BY 1"
            )
        )


def add_commands(sub: Any) -> None:
    """stepwise demo."""
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
