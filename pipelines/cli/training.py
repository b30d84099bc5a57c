"""``stepwise`` commands that train: reward models, the RL experiment (CPU policy or LLM), the
flywheel, and the RL export."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.cli.common import job_runner, prepare_dagster_home, print_checks, print_table, summary


def _backbone_name(warehouse, model_id: str) -> str | None:
    """The backbone a registered model was trained on, as a short name (its folder's name)."""
    rows = warehouse.query("SELECT backbone FROM models WHERE model_id = ?", [model_id]).to_pylist()
    return Path(rows[0]["backbone"]).name if rows and rows[0]["backbone"] else None


def _unknown_compared_model(model_ids: list[str]) -> str | None:
    """Why one of ``model_ids`` cannot be compared (not registered, or not loadable by this code),
    or None when every one can."""
    from training.base.registry import model_by_id
    from warehouse.catalog import Warehouse

    warehouse = Warehouse()
    for model_id in model_ids:
        try:
            model_by_id(warehouse, model_id)
        except LookupError as refusal:
            return str(refusal)
    return None


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
    excluded = [t.strip() for t in args.excluded_tasks.split(",") if t.strip()]
    dataset_config = {"reward_model_datasets": {"config": {"excluded_tasks": excluded}}} if excluded else {}
    report_config: dict[str, Any] = {"max_trajectories": args.report_trajectories} if args.report_trajectories else {}
    compared = [m.strip() for m in args.compare_models.split(",") if m.strip()]
    report_config |= {"compare_models": compared} if compared else {}
    if compared and (refusal := _unknown_compared_model(compared)):
        print(f"stepwise reward-models: --compare-models: {refusal}", file=sys.stderr)
        return 2  # before any training: a typo must not cost a whole training run
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    checks: list = []  # every run's asset checks, printed together at the end
    with DagsterInstance.get() as instance:
        job = defs.resolve_job_def("reward_models")
        for kind in kinds:
            run = job.execute_in_process(
                instance=instance,
                partition_key=kind,
                raise_on_error=False,
                run_config=quiet | {"ops": {"reward_model": {"config": training}} | dataset_config},
            )
            outcomes.append((f"reward_models[{kind}]", run.success))
            checks += run.get_asset_check_evaluations()
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
            checks += report.get_asset_check_evaluations()
        print_checks(checks)
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
        print_table(pa.Table.from_pylist(rows))
        print(
            "   details: the reward_model_report asset in the UI (plots), or SELECT * FROM rm_metrics / rm_predictions"
        )
    return 0 if all_ok else 1


#: The reduced experiment CI runs end to end (a few tasks, a few iterations).
RL_REDUCED = {
    "sft": {"selection_seeds": 4, "sparse_selection_seeds": 0, "held_out_seeds": 6, "max_tasks": 2, "epochs": 6},
    "run": {"iterations": 2, "instances_per_task": 2, "group_size": 2},
    "evaluation": {"held_out_seeds": 6},
}


def _flywheel_pins(round_: int | None, runs: list[str]) -> dict[str, str] | None:
    """Each run variant's reward model from flywheel round ``round_`` (empty without one); None
    after a one-line error (round 0, a source without a model, a kind the round did not train)."""
    from training.rl.evaluation import flywheel_round_models
    from training.rl.rewards import SOURCE_MODEL_KIND
    from training.rl.runs import RUN_VARIANTS
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


def _reward_model_pins(model_id: str, runs: list[str]) -> dict[str, str] | None:
    """Every run pinned to the registered reward model ``model_id``; None after a one-line error (no
    such model, a run whose source uses no model or a model of another kind)."""
    from training.base.registry import model_by_id
    from training.rl.rewards import SOURCE_MODEL_KIND
    from training.rl.runs import RUN_VARIANTS
    from warehouse.catalog import Warehouse

    try:
        model = model_by_id(Warehouse(), model_id)
    except LookupError as exc:
        print(f"stepwise rl: --reward-model: {exc}", file=sys.stderr)
        return None
    if other := [r for r in runs if SOURCE_MODEL_KIND[RUN_VARIANTS[r][0]] != model.kind]:
        print(
            f"stepwise rl: --reward-model {model_id} is of kind {model.kind}; {other} do not score with that kind "
            f"(run them without --reward-model)",
            file=sys.stderr,
        )
        return None
    return dict.fromkeys(runs, model_id)


LLM_PIN_REFUSAL = (
    "--reward-model, --flywheel-round and --sft pin the learned policy's runs; the LLM agent trains against the "
    "newest model of its source's kind, from its own SFT"
)


def _pins(args: argparse.Namespace, runs: list[str]) -> dict[str, str] | None:
    """Each run's pinned reward model from ``--reward-model`` or ``--flywheel-round`` (empty with
    neither); None after a one-line error."""
    if args.reward_model and args.flywheel_round is not None:
        print("stepwise rl: --reward-model and --flywheel-round both pin reward models; give one", file=sys.stderr)
        return None
    if args.reward_model:
        return _reward_model_pins(args.reward_model, runs)
    return _flywheel_pins(args.flywheel_round, runs)


def _names_a_block(seed_key: str) -> bool:
    """Whether ``seed_key`` is a partition key with a block's prefix (``sparse-s5``, as
    ``training.rl.runs.split_seed_key`` parses them), rather than an RL seed."""
    from training.policy.task_blocks import DENSE_BLOCK
    from training.rl.runs import split_seed_key

    try:
        return split_seed_key(seed_key)[0] != DENSE_BLOCK
    except ValueError:
        return False


def _unknown_runs(runs: list[str]) -> str | None:
    """What is wrong with ``--runs`` (one line), or None: no run, a malformed composed name (which
    part), or a name that is no run variant."""
    from training.rl.rewards.composed import COMPOSABLE_SOURCES, COMPOSITION_FORMS, parse_composition
    from training.rl.runs import KL_APART_SUFFIX, RUN_VARIANTS

    unknown = sorted(set(runs) - set(RUN_VARIANTS))
    for composed in (r for r in unknown if "+" in r):
        try:
            parse_composition(composed.removesuffix(KL_APART_SUFFIX))
        except ValueError as exc:  # which part of the name is wrong
            return str(exc)
    if unknown or not runs:
        singles = [r for r in RUN_VARIANTS if "+" not in r and not r.endswith(KL_APART_SUFFIX)]
        return (
            f"unknown run(s) {unknown}; choose from {singles} or a composed reward outcome+<source>:<form> "
            f"(source: {', '.join(COMPOSABLE_SOURCES)}; form: {', '.join(COMPOSITION_FORMS)}), any of them "
            f"with {KL_APART_SUFFIX} for REINFORCE++ with its KL penalty kept out of the batch normalisation"
        )
    return None


def _rl_arguments(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, str]] | None:
    """``stepwise rl``'s runs, RL seed keys and reward-model pins (:func:`_pins`), checked before
    anything runs; None after a one-line error."""
    from training.rl.runs import RL_SEEDS

    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if (error := _unknown_runs(runs)) is not None:
        print(f"stepwise rl: {error}", file=sys.stderr)
        return None
    if not 1 <= args.seeds <= len(RL_SEEDS):
        print(f"stepwise rl: --seeds must be 1..{len(RL_SEEDS)}", file=sys.stderr)
        return None
    seed_keys = [k.strip() for k in args.seed_keys.split(",") if k.strip()] or list(RL_SEEDS[: args.seeds])
    if bad_keys := sorted(set(seed_keys) - set(RL_SEEDS)):
        # a partition key as the UI shows it (sparse-s5): the block comes from --block, not the key
        prefixed = any(_names_a_block(k) for k in bad_keys)
        hint = " (name the RL seed alone: --block adds the block's prefix to the partition)" if prefixed else ""
        print(f"stepwise rl: --seed-keys {bad_keys} unknown; choose from {list(RL_SEEDS)}{hint}", file=sys.stderr)
        return None
    if (pinned := _pins(args, runs)) is None:
        return None
    if args.sft_seed is not None and (args.reuse_sft or args.sft or args.sft_seed < 0):
        refusal = "--sft-seed (>= 0) trains a new SFT policy; --reuse-sft keeps the newest one, --sft names one"
        print(f"stepwise rl: {refusal}", file=sys.stderr)
        return None
    if args.sft and (named_refusal := _named_sft_refusal(args)):
        print(f"stepwise rl: --sft: {named_refusal}", file=sys.stderr)
        return None
    return runs, seed_keys, pinned


def _named_sft_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--sft`` cannot start these runs (None: it can): what would train a new SFT policy is
    ignored with it, and the named policy must be an SFT policy with tasks in the block."""
    from training.policy.store import PolicyNotFoundError, latest_sft_policy
    from training.policy.task_blocks import task_blocks
    from warehouse.catalog import Warehouse

    if args.tasks:
        return "--tasks chooses a new SFT policy's candidate tasks; the named one has chosen its own"
    try:
        sft = latest_sft_policy(Warehouse(), args.sft)
    except PolicyNotFoundError as exc:
        return str(exc)
    if not task_blocks(sft).get(args.block):
        return f"{args.sft} chose no tasks for its {args.block} block"
    return None


def cmd_rl(args: argparse.Namespace) -> int:
    """The RL experiment: reward models it needs (trained briefly when missing), the SFT policy,
    one run per reward source and seed with its held-out evaluation, then ProgRM Table 1. With
    ``--policy llm``: the LLM agent instead (:func:`cmd_rl_llm`)."""
    if args.policy == "llm":
        if args.reward_model or args.flywheel_round is not None or args.sft:
            print(f"stepwise rl: {LLM_PIN_REFUSAL}", file=sys.stderr)
            return 2
        return cmd_rl_llm(args)
    prepare_dagster_home()
    from dagster import DagsterInstance, MultiPartitionKey

    from pipelines.definitions import defs
    from training.base.registry import latest_models
    from training.rl.evaluation import run_rl_report
    from training.rl.report import report_markdown
    from training.rl.rewards import SOURCE_MODEL_KIND
    from training.rl.runs import RUN_VARIANTS, seed_key
    from warehouse.catalog import Warehouse

    if (checked := _rl_arguments(args)) is None:
        return 2
    runs, seed_keys, pinned = checked
    reduced = RL_REDUCED if args.reduced else {"sft": {}, "run": {}, "evaluation": {}}
    sft_config = reduced["sft"] | ({"tasks": args.tasks.split(",")} if args.tasks else {})
    sft_config |= {"sft_seed": args.sft_seed} if args.sft_seed is not None else {}
    run_config = reduced["run"] | ({"iterations": args.iterations} if args.iterations else {})
    run_config |= {"common_sampling": False} if args.per_run_sampling else {}
    named_sft = {"sft_policy_id": args.sft} if args.sft else {}  # runs from an SFT policy other than the newest
    run_config |= named_sft
    # the block is in the partition: s0 (dense) or sparse-s0
    partition_seeds = [seed_key(args.block, int(k[1:])) for k in seed_keys]
    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    warehouse = Warehouse()
    started = time.perf_counter()
    outcomes: list[tuple[str, bool]] = []
    checks: list = []  # every run's asset checks, printed together at the end
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
            checks += run.get_asset_check_evaluations()
            if not run.success:
                return summary("rl", started, outcomes)
        if not args.reuse_sft and not args.sft:
            run = defs.resolve_job_def("policy_sft_job").execute_in_process(
                instance=instance,
                raise_on_error=False,
                run_config=quiet | {"ops": {"policy_sft": {"config": sft_config}}},
            )
            outcomes.append(("policy_sft", run.success))
            checks += run.get_asset_check_evaluations()
            if not run.success:
                return summary("rl", started, outcomes)
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
                            "agent_evaluation": {"config": reduced["evaluation"] | named_sft},
                        }
                    },
                )
                label = f"rl_runs[{variant}|{seed}] ({time.perf_counter() - run_started:.0f} s)"
                print(f"   {label}: {'ok' if run.success else 'FAILED'}", flush=True)
                outcomes.append((label, run.success))
                checks += run.get_asset_check_evaluations()
        report = defs.resolve_job_def("rl_report_job").execute_in_process(
            instance=instance, raise_on_error=False, run_config=quiet | {"ops": {"rl_report": {"config": named_sft}}}
        )
        outcomes.append(("rl_report", report.success))
        print_checks([*checks, *report.get_asset_check_evaluations()])
    if report.success:
        print()
        print(report_markdown(run_rl_report(warehouse, sft_policy_id=args.sft)))
        print(f"\n   plots: {warehouse.home / 'plots' / 'rl'}; SQL: SELECT * FROM agent_eval / rl_iterations")
    return summary("rl", started, outcomes)


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
            "recording_labels": args.recording_labels,
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
        if not run_flywheel(warehouse, args.rounds, settings, job_runner(instance, outcomes), print) and all(
            ok for _, ok in outcomes
        ):
            outcomes.append(("flywheel (nothing to collect from)", False))
    rows = warehouse.query("SELECT * FROM flywheel_rounds ORDER BY round, kind").to_pylist()
    if rows:
        from training.flywheel.rounds import rounds_markdown

        print("\n" + rounds_markdown(rows))
        plot = warehouse.home / "plots" / "flywheel" / "auc_by_round.png"
        print(f"\n   plot: {plot}; SQL: SELECT * FROM flywheel_rounds")
    return summary("flywheel", started, outcomes)


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
    return summary("rl --policy llm", started, [("llm_agent", run.success)])


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


# the papers' comparison (each learned source alone, the learned ORM its baseline) and one composed
# source (issue 41: a dense reward added to the exact outcome), so `stepwise rl --reduced` shows both
RL_DEFAULT_RUNS = "outcome,orm,progrm_lcs,progrm_env,prm,admire,outcome+progrm_env:shaped"


def _add_reward_models(sub: Any) -> None:
    p = sub.add_parser(
        "reward-models", help="train reward models (dataset + model per kind), then the evaluation report"
    )
    p.add_argument(
        "--kinds",
        default="orm,progrm_lcs,progrm_env",
        help="comma-separated: orm, progrm_lcs, progrm_env, prm, guidnav ('' trains none: only the report)",
    )
    p.add_argument(
        "--compare-models",
        default="",
        help="comma-separated model ids the report puts beside the latest model of each kind, each its own "
        "row (<kind>@<model id>): e.g. a flywheel round's model against the demonstration-trained one",
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
    p.add_argument(
        "--excluded-tasks",
        default="",
        help="comma-separated tasks no example comes from (a model to judge on tasks it never saw)",
    )
    p.add_argument("--no-report", dest="report", action="store_false", help="train only")
    p.set_defaults(func=cmd_reward_models)


def _add_rl(sub: Any) -> None:
    p = sub.add_parser("rl", help="the RL experiment: SFT, one run per reward source and seed, ProgRM Table 1")
    p.add_argument(
        "--runs",
        default=RL_DEFAULT_RUNS,
        help="comma-separated runs: a reward source (REINFORCE++), the same with _kl_apart (REINFORCE++ with "
        "its KL penalty kept out of the batch normalisation: outcome_kl_apart, outcome+progrm_env:shaped_kl_apart) "
        "or a variant such as admire_grpo, prm_ppo (with --policy llm: one reward source, default outcome)",
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
    p.add_argument("--seeds", type=int, default=3, help="RL seeds per run (1-20): the partitions s0 .. s<seeds-1>")
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
    p.add_argument(
        "--reward-model",
        default="",
        help="train against this registered reward model (a models.model_id; every run's source must score with "
        "its kind): runs of their own, where without it a run trains against the newest model of its kind, or "
        "resumes against the one it started with",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=0,
        help="RL iterations per run (0: the asset's default); a run's key leaves its budget out, so more "
        "than an existing run trained resumes it, and fewer trains nothing (the report flags rows of "
        "different budgets)",
    )
    p.add_argument("--tasks", default="", help="comma-separated candidate tasks (default: every catalog task)")
    p.add_argument(
        "--block",
        choices=("dense", "sparse"),
        default="dense",
        help="the task block the runs train on, as the SFT policy pre-registered it (dense: SFT success in "
        "(low, high); sparse: SFT's sampled success in (0, 15%%] and a median successful demonstration, human or "
        "else the experts' rollouts, of >= 5 steps)",
    )
    p.add_argument(
        "--per-run-sampling",
        action="store_true",
        help="key each run's sampling by the run instead of sharing one stream per RL seed and iteration "
        "(runs of their own, only to measure what common random numbers buy: use a copy of the home, since "
        "the report shows the newest run of each source and seed and these would take the rows' place)",
    )
    p.add_argument("--reduced", action="store_true", help="a small experiment (what CI runs end to end)")
    p.add_argument("--reuse-sft", action="store_true", help="keep the newest SFT policy instead of training one")
    p.add_argument(
        "--sft",
        default="",
        help="start the runs from this SFT policy (a policies.policy_id) instead of the newest; nothing is trained "
        "before them, and the report is that policy's",
    )
    p.add_argument(
        "--sft-seed",
        dest="sft_seed",
        type=int,
        default=None,
        help="train the SFT policy with this seed (default 0): another SFT policy to replicate a finding on; its "
        "runs start from it (the newest SFT policy)",
    )
    p.add_argument(
        "--rm-train-steps",
        "--rm-max-steps",  # the name before one meaning per name
        dest="rm_train_steps",
        type=int,
        default=400,
        help="optimizer steps of a missing reward model trained first",
    )
    p.set_defaults(func=cmd_rl)


def _add_flywheel(sub: Any) -> None:
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
    p.add_argument(
        "--recording-labels",
        default="diverged",
        help="label candidates from the recording instead of by replay: diverged (states no replay reproduced), "
        "always (no replay), never",
    )
    p.add_argument("--train-steps", type=int, default=-1, help="optimizer steps per model (-1: the profile's)")
    p.add_argument("--max-train-examples", type=int, default=0, help="a fixed sample of the training examples")
    p.add_argument("--report-trajectories", type=int, default=0, help="a sample of the report's demonstration split")
    p.set_defaults(func=cmd_flywheel)


def _add_rl_export(sub: Any) -> None:
    p = sub.add_parser("rl-export", help="RL episodes with their step rewards as OpenRLHF / verl datasets")
    p.add_argument("out", help="folder for steps.parquet and trajectories.jsonl")
    p.add_argument("--run", default=None, help="one run key (rl_iterations.run_key); default: every run")
    p.set_defaults(func=cmd_rl_export)


def add_commands(sub: Any) -> None:
    """The training commands: reward-models, rl, flywheel, rl-export."""
    _add_reward_models(sub)
    _add_rl(sub)
    _add_flywheel(sub)
    _add_rl_export(sub)
