"""Guidance stage (group ``guidance``): reward-guided agents at inference time, evaluated on held-out
seeds of the task catalog: best-of-N with a reward model (GUI-Shepherd Alg. 2, GuidNav Eqs. 4-6),
the oracle upper bound, the GUI-PRA judge and its ablations, reflect-and-retry (GuidNav §3.3).

``guidance_evaluation`` is partitioned by method (base, best_of_n, oracle, judge, retry); each
partition runs its sweep and replaces the rows of the (setting, model) pairs it measures again.
``guidance_report`` puts them side by side.

Stage logic: :mod:`training.guidance.runs` (the evaluation) and :mod:`training.guidance.report`.
"""

from collections.abc import Callable, Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    Failure,
    MaterializeResult,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.config import renamed_field
from assets.metadata import check_result, table_metadata, to_metadata, unique_key_checks
from assets.resources import EnvPoolResource, WarehouseResource
from training.guidance.report import check_best_of_n, report_markdown, report_plots, run_guidance_report
from training.guidance.runs import (
    GUIDANCE_CODE_VERSION,
    METHODS,
    GuidanceError,
    GuidanceSettings,
    run_guidance_evaluation,
)

GROUP = "guidance"
METHOD_PARTITIONS = StaticPartitionsDefinition(list(METHODS))


class GuidanceEvaluationConfig(Config):
    policy_backend: str = Field(
        default="learned", description="learned (a policies row) | endpoint | hf (a local causal LM)"
    )
    policy: str | None = Field(default=None, description="the old name of policy_backend (still accepted)")
    policy_id: str | None = Field(default=None, description="learned: this policy (default: the newest SFT policy)")
    policy_endpoint: str | None = Field(default=None, description="endpoint: an OpenAI-compatible base URL (.../v1)")
    policy_model: str = "default"
    policy_path: str | None = Field(default=None, description="hf: a save_pretrained folder")
    tasks: list[str] = Field(default=[], description="catalog tasks; empty: the learned policy's tasks")
    held_out_seeds: int = Field(default=25, description="held-out episodes per task")
    n_values: list[int] = Field(default=[1, 3, 5, 8, 16], description="best-of-N sweep (GUI-Shepherd Table 5)")
    verifiers: list[str] = Field(default=["prm", "progrm_env"], description="best_of_n's verifiers")
    with_prior: bool = Field(default=False, description="also select on log score + log pi(a|s) ('+prior')")
    with_abstention: bool = Field(
        default=False,
        description="also keep the policy's choice unless the verifier wins by a margin fitted on held-out states "
        "with alternatives outside the evaluated seeds ('+abstain')",
    )
    sample: bool = Field(default=False, description="N sampled without replacement instead of the N most probable")
    judge_n: int = Field(default=8, description="candidates per step for the judge (GUI-PRA: about 8)")
    judge_variants: list[str] = Field(default=["full", "no_memory", "no_perception"], description="GUI-PRA Table 2")
    endpoint: str | None = Field(default=None, description="OpenAI-compatible endpoint of the judge and reflections")
    endpoint_model: str = "default"
    endpoint_timeout_s: float = 30.0
    judge_local_kind: str = Field(default="prm", description="the judge's local step reward model (and fallback)")
    retries: int = Field(default=3, description="reflect-and-retry: retries after a failure (GuidNav: 3)")
    retry_verifier: str | None = Field(default=None, description="retry a guided agent (GuidNav + AR) instead")
    retry_n: int = 5
    workers: int = 2
    episode_max_time_ms: int | None = Field(
        default=None,
        description="MiniWoB++'s episode clock in ms; empty: the benchmark's 10 s, or 10 minutes when an LLM acts, "
        "judges or reflects (its timer runs while the model thinks)",
    )


def _settings(config: GuidanceEvaluationConfig, warn: Callable[[str], object] | None = None) -> GuidanceSettings:
    values = config.model_dump(exclude={"policy"})
    values["policy_backend"] = renamed_field(config, "policy", "policy_backend", warn)
    for name in ("tasks", "n_values", "verifiers", "judge_variants"):
        values[name] = tuple(values[name])
    return GuidanceSettings(**values)


@asset(
    group_name=GROUP,
    partitions_def=METHOD_PARTITIONS,
    deps=["policy_sft", "reward_model"],
    code_version=GUIDANCE_CODE_VERSION,
    kinds={"pytorch", "chromium", "parquet"},
    description="One inference-time method (partition) on held-out seeds in live MiniWoB++: the base policy, "
    "best-of-N per verifier and N, the oracle, the GUI-PRA judge and its ablations, reflect-and-retry. Tables "
    "guidance_eval, guidance_episodes, guidance_steps (and the trajectories in episodes/steps).",
)
def guidance_evaluation(
    context: AssetExecutionContext,
    config: GuidanceEvaluationConfig,
    warehouse: WarehouseResource,
    env_pool: EnvPoolResource,
) -> MaterializeResult:
    wh = warehouse.get()
    try:
        settings = _settings(config, context.log.warning)
        clock = settings.episode_clock_ms
        result = run_guidance_evaluation(
            wh,
            context.partition_key,
            settings,
            lambda workers: env_pool.pool("miniwob", workers, log=context.log.warning, episode_max_time_ms=clock),
            run_id=context.run_id,
            log=context.log.info,
        )
    except GuidanceError as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(
        metadata=to_metadata(result | {"episode_max_time_ms": clock or "the benchmark's 10 s"})
        | table_metadata(wh, "guidance_eval", also=("guidance_episodes", "guidance_steps"))
    )


@asset(
    group_name=GROUP,
    deps=["guidance_evaluation"],
    check_specs=[
        AssetCheckSpec(
            "prm_best_of_n_beats_base",
            asset="guidance_report",
            description="best-of-N with the trained PRM beats the base policy on held-out seeds (GUI-Shepherd)",
        )
    ],
    code_version=GUIDANCE_CODE_VERSION,
    kinds={"duckdb", "matplotlib"},
    description="Every method side by side: the N sweep (GUI-Shepherd Table 5) with paired differences to the "
    "base policy, the oracle, the judge's ablations (GUI-PRA Table 2), pass@k of reflect-and-retry, cost per step.",
)
def guidance_report(
    context: AssetExecutionContext, warehouse: WarehouseResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    wh = warehouse.get()
    try:
        report = run_guidance_report(wh)
    except GuidanceError as exc:
        raise Failure(str(exc)) from None
    plots = report_plots(report, wh.home / "plots" / "guidance")
    yield MaterializeResult(
        metadata=to_metadata({"policy_id": report["policy_id"], "report": report_markdown(report), **plots})
    )
    yield check_result(check_best_of_n(report), check_name="prm_best_of_n_beats_base", warn_only=True)


GUIDANCE_ASSETS = [guidance_evaluation, guidance_report]
GUIDANCE_CHECKS = [
    unique_key_checks(
        "guidance_evaluation",
        dict.fromkeys(("guidance_eval", "guidance_episodes", "guidance_steps", "episodes", "steps")),
    )
]
GUIDANCE_JOBS = [
    define_asset_job(
        "guidance_evaluations",
        selection=["guidance_evaluation"],
        partitions_def=METHOD_PARTITIONS,
        description="One inference-time method on held-out seeds",
    ),
    define_asset_job("guidance_report_job", selection=["guidance_report"], description="The guidance report"),
]
