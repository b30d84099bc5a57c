"""RL stage (group ``rl``): the SFT policy -> RL runs per reward source and seed -> their held-out
evaluation -> ProgRM Table 1.

``rl_run`` and ``agent_evaluation`` are partitioned by run (a reward source, with ProgRM's
REINFORCE++ or the source paper's own estimator) x RL seed on a task block (``s0``: dense,
``sparse-s0``: sparse); ``stepwise rl`` runs the experiment.

Stage logic: :mod:`training.rl.runs`.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    Failure,
    MaterializeResult,
    MultiPartitionKey,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    asset,
    asset_check,
    define_asset_job,
)
from pydantic import Field

from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import EnvPoolResource, WarehouseResource
from training.policy.episodes import PolicyStageError
from training.policy.sft_stage import SFT_CODE_VERSION, PolicySettings, check_sft_policy, run_policy_sft
from training.policy.store import PolicyNotFoundError
from training.rl.advice import advice_metadata
from training.rl.evaluation import run_agent_evaluation, run_rl_report
from training.rl.report import check_table_one, learning_curves_by_actor, report_markdown, report_plot
from training.rl.runs import (
    RL_CODE_VERSION,
    RL_SEED_KEYS,
    RUN_VARIANTS,
    check_rl_run,
    latest_rl_policy,
    rl_settings_for,
    run_rl,
)

GROUP = "rl"
RUN_PARTITIONS = MultiPartitionsDefinition(
    {"run": StaticPartitionsDefinition(list(RUN_VARIANTS)), "seed": StaticPartitionsDefinition(list(RL_SEED_KEYS))}
)


class PolicySFTConfig(Config):
    tasks: list[str] = Field(default=[], description="candidate tasks; empty: every catalog task with demonstrations")
    epochs: int = Field(default=12, description="SFT epochs (early stopping on validation loss)")
    sft_seed: int = Field(default=0, description="SFT's seed (init, shuffling): another seed, another SFT policy")
    selection_seeds: int = Field(
        default=40, description="greedy episodes per task to choose the RL tasks (the sparse rule's 15%: 6 of 40)"
    )
    sparse_selection_seeds: int = Field(
        default=100,
        description="selection episodes per long task (the sparse rule's candidates; greedy, and sampled with "
        "sparse_sampled), the first selection_seeds among them: rates near zero resolved (<= selection_seeds: none)",
    )
    held_out_seeds: int = Field(default=25, description="greedy held-out evaluation episodes per chosen task")
    max_tasks: int = Field(default=4, description="tasks of the experiment")
    low: float = Field(default=0.1, description="a task is chosen when SFT success is above this ...")
    high: float = Field(default=0.9, description="... and below this")
    sparse_fallback_unsolved: bool = Field(
        default=True,
        description="when no long task has SFT success in (0, 15%], the sparse block is the long tasks at 0 instead",
    )
    sparse_sampled: bool = Field(
        default=True,
        description="the sparse rule reads the long tasks' SFT success sampling at temperature 1 (as RL's first "
        "iteration) on their selection seeds before the greedy rates",
    )
    sparse_max_constant_share: float = Field(
        default=0.05, description="leave out of the sparse block tasks a fixed answer solves this often (>1: none)"
    )
    max_episodes_per_task: int = Field(default=400, description="successful trajectories per task used for SFT")
    workers: int = 2


class RLRunConfig(Config):
    iterations: int = Field(default=10, description="RL iterations (sampling, rewards, one update)")
    instances_per_task: int = Field(default=4, description="task instances (seeds) per task per iteration")
    group_size: int = Field(default=4, description="episodes per instance (GRPO / RLOO groups)")
    learning_rate: float = 1e-3
    epochs: int = Field(default=2, description="update passes over each iteration's batch")
    gamma: float = Field(default=0.9, description="discount between steps (ProgRM Table 6)")
    kl_coef: float = Field(default=0.01, description="KL penalty to the SFT policy (ProgRM Table 6)")
    clip: float = Field(default=0.2, description="PPO clip (ProgRM Table 6)")
    progress_k: int = Field(default=1, description="ProgRM Eq. 2's progress history k")
    reward_endpoint: str | None = Field(default=None, description="reward-model HTTP service instead of the checkpoint")
    milestone_endpoint: str | None = Field(default=None, description="OpenAI-compatible base URL for ADMIRE milestones")
    milestone_model: str = "default"
    block: str | None = Field(
        default=None,
        description="the SFT policy's pre-registered task block to train on; the partition's seed key names it "
        "(s0: dense, sparse-s0: sparse), and a block given here must agree",
    )
    reward_model_id: str | None = Field(
        default=None,
        description="a registered reward model to train against (e.g. a flywheel round's); default the newest "
        "of the source's kind (a run keeps the model it started with)",
    )
    orm_rule: str | None = Field(
        default=None,
        description="the ORM's reward: threshold (ProgRM's binary judgement) or probability; default the "
        "block's rule, fixed before any run (dense: threshold, sparse: probability)",
    )
    # false: each run draws its own samples (rl-5's keying), only to measure what common random numbers buy
    common_sampling: bool = Field(default=True, description="every source samples one stream per RL seed and iteration")
    sft_policy_id: str | None = Field(default=None, description="start from this SFT policy (default: the newest)")
    workers: int = 2


class AgentEvaluationConfig(Config):
    held_out_seeds: int = Field(default=25, description="greedy episodes per task on held-out seeds")
    sft_policy_id: str | None = Field(default=None, description="the run from this SFT policy (default: the newest)")
    workers: int = 2


#: The report's claims (``check_table_one``), each a warn-only asset check.
RL_REPORT_CHECKS = {
    "rl_improves_on_sft": "every RL run beats SFT on held-out",
    "progrm_beats_orm": "ProgRM's rewards beat the learned ORM (its Table 1)",
    "dense_beats_outcome_on_sparse": "on the sparse block, every dense reward beats the exact outcome (ADMIRE, "
    "GUI-Shepherd)",
    "no_reward_hacking_alarm": "no run's training return rose while its held-out success fell below SFT, and every "
    "reward ranks its own training episodes (within-task AUC >= 0.6)",
    "no_constant_answer": "no row's held-out successes on a task sit, run by run, on one instruction (a constant "
    "answer, not the task)",
}


class RLReportConfig(Config):
    sft_policy_id: str | None = Field(default=None, description="the runs from this SFT policy (default: newest)")


def _run_keys(context: AssetExecutionContext) -> tuple[str, str]:
    keys = context.partition_key
    if not isinstance(keys, MultiPartitionKey):
        raise Failure(f"rl partitions are run x seed, got {keys!r}")
    return keys.keys_by_dimension["run"], keys.keys_by_dimension["seed"]


def _settings(context: AssetExecutionContext, config: RLRunConfig):
    run, seed = _run_keys(context)
    overrides = config.model_dump(exclude={"epochs", "sft_policy_id"}) | {"epochs": config.epochs}
    try:
        return rl_settings_for(run, seed, **overrides)
    except ValueError as exc:
        raise Failure(str(exc)) from None


@asset(
    group_name=GROUP,
    deps=["human_demonstrations", "rollouts"],
    code_version=SFT_CODE_VERSION,
    kinds={"pytorch", "chromium", "parquet"},
    description="The learned CPU policy after SFT on successful trajectories; the experiment's tasks (SFT neither "
    "near 0 nor near 100% on selection seeds) and its held-out evaluation. Tables policies, agent_eval.",
)
def policy_sft(
    context: AssetExecutionContext, config: PolicySFTConfig, warehouse: WarehouseResource, env_pool: EnvPoolResource
) -> MaterializeResult:
    settings = PolicySettings.from_config(config.model_dump())
    wh = warehouse.get()
    try:
        result = run_policy_sft(
            wh,
            settings,
            lambda workers: env_pool.pool("miniwob", workers, log=context.log.warning),
            run_id=context.run_id,
            log=context.log.info,
        )
    except (PolicyStageError, PolicyNotFoundError) as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(metadata=to_metadata(result) | table_metadata(wh, "policies", also=("agent_eval",)))


@asset(
    group_name=GROUP,
    partitions_def=RUN_PARTITIONS,
    deps=["policy_sft", "reward_model"],
    check_specs=[AssetCheckSpec("every_iteration_recorded", asset="rl_run")],
    code_version=RL_CODE_VERSION,
    kinds={"pytorch", "chromium", "parquet"},
    description="One RL run from the SFT policy on live MiniWoB++: a reward source and estimator (partition) and "
    "an RL seed; every episode in episodes/steps, per-iteration figures in rl_iterations, step rewards in "
    "rl_step_rewards; a killed run resumes from its last checkpoint.",
)
def rl_run(
    context: AssetExecutionContext, config: RLRunConfig, warehouse: WarehouseResource, env_pool: EnvPoolResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    settings = _settings(context, config)
    wh = warehouse.get()
    try:
        result = run_rl(
            wh,
            settings,
            lambda workers: env_pool.pool("miniwob", workers, log=context.log.warning),
            run_id=context.run_id,
            sft_policy_id=config.sft_policy_id,
            log=context.log.info,
        )
    except (PolicyStageError, PolicyNotFoundError, ValueError) as exc:
        raise Failure(str(exc)) from None
    yield MaterializeResult(
        metadata=to_metadata(result) | table_metadata(wh, "rl_iterations", also=("rl_step_rewards",))
    )
    yield check_result(check_rl_run(wh, result["run_key"], settings.iterations), check_name="every_iteration_recorded")


@asset(
    group_name=GROUP,
    partitions_def=RUN_PARTITIONS,
    deps=["rl_run"],
    code_version=RL_CODE_VERSION,
    kinds={"chromium", "parquet"},
    description="The run's final policy, greedy, on held-out seeds of its tasks: success and cumulative environment "
    "reward per task, failure modes. Tables agent_eval, agent_eval_episodes.",
)
def agent_evaluation(
    context: AssetExecutionContext,
    config: AgentEvaluationConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
) -> MaterializeResult:
    run, seed = _run_keys(context)
    wh = warehouse.get()
    try:
        policy = latest_rl_policy(wh, run, seed, config.sft_policy_id)
        result = run_agent_evaluation(
            wh,
            policy["policy_id"],
            lambda workers: env_pool.pool("miniwob", workers, log=context.log.warning),
            held_out_seeds=config.held_out_seeds,
            workers=config.workers,
            run_id=context.run_id,
            log=context.log.info,
        )
    except (PolicyStageError, PolicyNotFoundError, ValueError) as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(
        metadata=to_metadata(result) | table_metadata(wh, "agent_eval", also=("agent_eval_episodes",))
    )


@asset(
    group_name=GROUP,
    deps=["policy_sft", "agent_evaluation"],
    check_specs=[AssetCheckSpec(name, asset="rl_report", description=d) for name, d in RL_REPORT_CHECKS.items()],
    code_version=RL_CODE_VERSION,
    kinds={"duckdb", "matplotlib"},
    description="Which reward to use here (per block, from the paired tests), then ProgRM Table 1 on live MiniWoB++: "
    "held-out success and environment reward per source (95% intervals over RL seeds and episodes), per task family, "
    "paired McNemar tests against SFT, the learned ORM and the outcome, failure modes.",
)
def rl_report(
    context: AssetExecutionContext, config: RLReportConfig, warehouse: WarehouseResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    wh = warehouse.get()
    try:
        report = run_rl_report(wh, sft_policy_id=config.sft_policy_id)
    except (PolicyStageError, PolicyNotFoundError) as exc:
        raise Failure(str(exc)) from None
    plots = {
        "success_plot": report_plot(report, wh.home / "plots" / "rl" / "table_one.png"),
        "learning_curves": learning_curves_by_actor(report["curves"], wh.home / "plots" / "rl" / "learning_curves.png"),
    }
    advice = advice_metadata(report["advice"])  # which reward to use, a line per block
    yield MaterializeResult(metadata=to_metadata({"table_one": report_markdown(report)} | advice | plots))
    for name, outcome in check_table_one(report).items():
        yield check_result(outcome, check_name=name, warn_only=True)


@asset_check(asset=policy_sft, description="the SFT policy chose tasks for RL and was evaluated on held-out seeds")
def sft_policy_is_ready(warehouse: WarehouseResource) -> AssetCheckResult:
    return check_result(check_sft_policy(warehouse.get()))


RL_ASSETS = [policy_sft, rl_run, agent_evaluation, rl_report]
RL_CHECKS = [
    sft_policy_is_ready,
    unique_key_checks("policy_sft", dict.fromkeys(("policies", "agent_eval", "agent_eval_episodes"))),
    unique_key_checks("rl_run", dict.fromkeys(("rl_iterations", "rl_step_rewards", "episodes", "steps"))),
]
RL_JOBS = [
    define_asset_job("policy_sft_job", selection=["policy_sft"], description="SFT, task choice, held-out evaluation"),
    define_asset_job(
        "rl_runs",
        selection=["rl_run", "agent_evaluation"],
        partitions_def=RUN_PARTITIONS,
        description="One RL run (reward source x seed) and its held-out evaluation",
    ),
    define_asset_job("rl_report_job", selection=["rl_report"], description="ProgRM Table 1 from the evaluations"),
]
