"""Rationales for human step labels (group ``human_labels``): GUI-Shepherd §3's LLM-written chain
of thought for each positive / negative ``step_correctness`` verdict from Label Studio, stored with
the label in ``label_rationales``. Stage logic: :mod:`training.llm.rationales`.

With no ``base_url`` configured, SmolLM2-135M-Instruct is served locally for the run
(:mod:`training.llm.endpoint`); otherwise any OpenAI-compatible endpoint, its key read from the
environment variable named by ``api_key_env`` (never stored).
"""

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from assets.metadata import to_metadata, unique_key_checks
from assets.resources import WarehouseResource
from training.base.pretrained import PretrainedModelError
from training.llm.chat_client import ChatClient
from training.llm.endpoint import EndpointStartError, chat_endpoint_or_local
from training.llm.rationales import (
    PROMPT_VERSION,
    RATIONALE_VERSION,
    RationaleEndpointError,
    RationaleOptions,
    generate_label_rationales,
    public_url,
)

GROUP = "human_labels"
_DEFAULTS = RationaleOptions()


class LabelRationalesConfig(Config):
    base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL (…/v1); none: serve SmolLM2 locally for the run"
    )
    model: str | None = Field(default=None, description="the model name the endpoint expects (or a folder to serve)")
    api_key_env: str = Field(default="OPENAI_API_KEY", description="environment variable holding the API key")
    timeout_s: float = Field(default=120.0, description="seconds one answer may take")
    max_labels: int | None = Field(default=None, description="at most this many labels per run (none: all)")
    max_tokens: int = Field(default=_DEFAULTS.max_tokens, description="answer budget in tokens")
    max_prompt_chars: int = Field(default=_DEFAULTS.max_prompt_chars, description="longer prompts cut the screen")


@asset(
    group_name=GROUP,
    code_version=RATIONALE_VERSION,
    kinds={"parquet"},
    deps=["human_labels"],
    description=(
        "GUI-Shepherd §3: an LLM writes the rationale of each positive / negative step-correctness label people gave "
        "in Label Studio, conditioned on their verdict (instruction, screen, action). One row per label revision, "
        "with the model, prompt version and endpoint (no credentials); failures counted and asked again next run. "
        "Table `label_rationales`."
    ),
)
def label_rationales(
    context: AssetExecutionContext, config: LabelRationalesConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    wh = warehouse.get()
    options = RationaleOptions(
        max_tokens=config.max_tokens, max_prompt_chars=config.max_prompt_chars, max_labels=config.max_labels
    )
    try:
        with chat_endpoint_or_local(
            config.base_url,
            config.model,
            api_key_env=config.api_key_env,
            timeout_s=config.timeout_s,
            home=wh.home,
            log_path=wh.home / "logs" / f"label_rationales-{context.run_id[:8]}.log",
        ) as endpoint:
            summary = generate_label_rationales(
                wh, ChatClient(endpoint), options, run_id=context.run_id, log=context.log.info
            )
            summary |= {"endpoint": public_url(endpoint.base_url), "model": endpoint.model}
    except (RationaleEndpointError, EndpointStartError, PretrainedModelError) as exc:
        raise Failure(str(exc)) from None
    return MaterializeResult(metadata=to_metadata(summary | {"prompt_version": PROMPT_VERSION}))


RATIONALE_ASSETS = [label_rationales]
RATIONALE_CHECKS = [unique_key_checks("label_rationales", {"label_rationales": None})]
