"""The LLM agent (group ``llm``): a pretrained causal LM (SmolLM2-135M-Instruct here) -> SFT on
demonstrations -> RL in live MiniWoB++, each stage evaluated greedily on the same held-out seeds.

``stepwise rl --policy llm`` materializes it. Stage logic: :mod:`training.rl.llm_runs`.
"""

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset, define_asset_job
from pydantic import Field

from assets.metadata import table_metadata, to_metadata
from assets.resources import EnvPoolResource, WarehouseResource
from training.base.pretrained import PretrainedModelError
from training.policy.episodes import PolicyStageError
from training.rl.llm_learner import LLMLearnerSettings
from training.rl.llm_runs import LLM_CODE_VERSION, LLMRunSettings, llm_report, run_llm_agent

GROUP = "llm"
_DEFAULTS = LLMRunSettings()


class LLMAgentConfig(Config):
    model: str = Field(
        default=_DEFAULTS.model, description="'smollm2' (the packaged model) or a save_pretrained folder"
    )
    tasks: list[str] = Field(default=list(_DEFAULTS.tasks), description="MiniWoB++ catalog tasks (short ones)")
    sft_steps: int = Field(default=_DEFAULTS.sft_steps, description="SFT optimiser steps (0: RL from the base model)")
    sft_batch: int = _DEFAULTS.sft_batch
    sft_learning_rate: float = _DEFAULTS.sft_learning_rate
    sft_examples_per_task: int = Field(default=_DEFAULTS.sft_examples_per_task, description="expert episodes per task")
    reward_source: str = Field(default=_DEFAULTS.reward_source, description="the RL reward (outcome, orm, prm, ...)")
    rl_seed: int = _DEFAULTS.rl_seed
    iterations: int = Field(default=_DEFAULTS.iterations, description="RL iterations (0: SFT only)")
    instances_per_task: int = _DEFAULTS.instances_per_task
    group_size: int = _DEFAULTS.group_size
    learning_rate: float = Field(default=_DEFAULTS.learner.learning_rate, description="RL learning rate")
    max_new_tokens: int = _DEFAULTS.max_new_tokens
    episode_max_time_ms: int = Field(
        default=_DEFAULTS.episode_max_time_ms,
        description="MiniWoB++'s episode clock (the benchmark's is 10 s: too short for an LLM on a CPU)",
    )
    held_out_seeds: int = Field(default=_DEFAULTS.held_out_seeds, description="greedy held-out episodes per task")
    workers: int = _DEFAULTS.workers


def llm_settings(config: LLMAgentConfig) -> LLMRunSettings:
    values = config.model_dump()
    learner = LLMLearnerSettings(
        learning_rate=values.pop("learning_rate"),
        batch_turns=_DEFAULTS.learner.batch_turns,
        micro_batch=_DEFAULTS.learner.micro_batch,
    )
    return LLMRunSettings(**(values | {"tasks": tuple(values["tasks"]), "learner": learner}))


@asset(
    group_name=GROUP,
    deps=["human_demonstrations", "rollouts", "reward_model"],
    code_version=LLM_CODE_VERSION,
    kinds={"pytorch", "chromium", "parquet"},
    description="An LLM agent: the pretrained model, SFT on the tasks' expert episodes, multi-turn REINFORCE++ "
    "(ProgRM §2.4) in live MiniWoB++; each stage greedy on the same held-out seeds. Tables policies (llm_base, "
    "llm_sft, llm_rl), agent_eval, rl_iterations, rl_step_rewards, episodes.",
)
def llm_agent(
    context: AssetExecutionContext, config: LLMAgentConfig, warehouse: WarehouseResource, env_pool: EnvPoolResource
) -> MaterializeResult:
    wh = warehouse.get()
    settings = llm_settings(config)
    try:
        result = run_llm_agent(
            wh,
            settings,
            lambda workers: env_pool.pool(
                "miniwob", workers, log=context.log.warning, episode_max_time_ms=settings.episode_max_time_ms
            ),
            run_id=context.run_id,
            log=context.log.info,
        )
    except (PolicyStageError, PretrainedModelError, ValueError) as exc:
        raise Failure(str(exc)) from None
    stages = result.pop("stages")
    return MaterializeResult(
        metadata=to_metadata(result | {"stages": llm_report(stages)})
        | table_metadata(wh, "agent_eval", also=("rl_iterations", "policies"))
    )


LLM_ASSETS = [llm_agent]
LLM_JOBS = [define_asset_job("llm_agent_job", selection=["llm_agent"], description="LLM agent: base, SFT, RL")]
