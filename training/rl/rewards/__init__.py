"""Reward sources for RL, one module each; :func:`make_reward_source` builds one by name."""

from __future__ import annotations

from training.base.encoder import EmbeddingCache
from training.policy.rollouts import Rollout
from training.reward_models.kinds import PROGRESS_KINDS
from training.reward_models.scoring import RewardModelError, load_scorer, report_threshold
from training.rl.estimators import GAMMA
from training.rl.rewards.admire import AdmireReward, AdmireSettings, LLMMilestones, MilestoneStore
from training.rl.rewards.base import RewardBatch, RewardSource
from training.rl.rewards.composed import (
    COMPOSABLE_SOURCES,
    COMPOSED_SOURCES,
    COMPOSITION_FORMS,
    DECAY_RATE,
    DECAY_WEIGHT,
    ComposedReward,
    Composition,
    StepScores,
    model_step_scores,
    parse_composition,
)
from training.rl.rewards.milestones import MilestoneReward
from training.rl.rewards.orm import ORM_RULES, ORMReward
from training.rl.rewards.outcome import OutcomeReward
from training.rl.rewards.prm import StepJudgeReward
from training.rl.rewards.progrm import ProgressReward
from warehouse.catalog import Warehouse

#: Each source alone (the papers' comparison), then each learned one added to the outcome.
SINGLE_SOURCES: tuple[str, ...] = (
    "outcome",
    "orm",
    "progrm_lcs",
    "progrm_env",
    "prm",
    "guidnav",
    "admire",
    "milestones",
)
REWARD_SOURCES: tuple[str, ...] = SINGLE_SOURCES + COMPOSED_SOURCES
#: The reward model each source needs (none for outcome and ADMIRE; a composed source its part's).
SOURCE_MODEL_KIND: dict[str, str | None] = {
    "outcome": None,
    "orm": "orm",
    "progrm_lcs": "progrm_lcs",
    "progrm_env": "progrm_env",
    "prm": "prm",
    "guidnav": "guidnav",
    "admire": None,
    "milestones": None,
}
SOURCE_MODEL_KIND |= {
    Composition(source, form).name: SOURCE_MODEL_KIND[source]
    for source in COMPOSABLE_SOURCES
    for form in COMPOSITION_FORMS
}


def check_reward_source(name: str) -> None:
    """Raise a one-line ValueError for a name that is no reward source (a malformed composed name
    says which part is wrong)."""
    if name not in REWARD_SOURCES:
        parse_composition(name)  # a malformed composed name: its own message
        raise ValueError(
            f"unknown reward source {name!r}; choose one of {', '.join(SINGLE_SOURCES)} or outcome+<source>:<form>"
        )


__all__ = [
    "ORM_RULES",
    "REWARD_SOURCES",
    "RewardBatch",
    "RewardModelError",
    "RewardSource",
    "Rollout",
    "check_reward_source",
    "make_reward_source",
]


def make_reward_source(
    name: str,
    warehouse: Warehouse,
    *,
    cache: EmbeddingCache,
    endpoint: str | None = None,
    progress_k: int = 1,
    orm_threshold: float | None = None,
    orm_rule: str = "threshold",
    outcome_every_step: bool = False,
    milestone_generator: LLMMilestones | None = None,
    admire: AdmireSettings | None = None,
    model_id: str | None = None,
    gamma: float = GAMMA,
    dense_weight: float = DECAY_WEIGHT,
    dense_decay: float = DECAY_RATE,
) -> RewardSource:
    """The reward source ``name``. Model-based sources load the latest trained model of their kind,
    or the registered model ``model_id`` when given (or use the HTTP service at ``endpoint``), now,
    so a missing or wrong model fails before any rollout. ``cache`` is the sentence-encoding cache
    ADMIRE matches milestones with; ``orm_rule`` is the ORM's rule (:data:`ORM_RULES`). A composed
    source (``outcome+<source>:<form>``) shapes with the learner's turn discount ``gamma`` or adds
    its part with weight ``dense_weight * dense_decay^iteration``."""
    check_reward_source(name)
    if model_id is not None and SOURCE_MODEL_KIND[name] is None:
        raise ValueError(f"the {name} reward uses no reward model; {model_id} cannot be pinned to it")
    if (composition := parse_composition(name)) is not None:
        dense = make_reward_source(
            composition.source,
            warehouse,
            cache=cache,
            endpoint=endpoint,
            progress_k=progress_k,
            orm_threshold=orm_threshold,
            orm_rule=orm_rule,
            model_id=model_id,
        )
        scores: StepScores
        if isinstance(dense, MilestoneReward):
            scores = dense.step_scores
        else:
            assert isinstance(dense, ORMReward | ProgressReward | StepJudgeReward)  # the composable models
            scores = model_step_scores(dense.scorer)
        return ComposedReward(composition, dense, scores, gamma=gamma, weight=dense_weight, rate=dense_decay)
    if name == "outcome":
        return OutcomeReward()
    if name == "milestones":
        return MilestoneReward()
    if name == "admire":
        store = MilestoneStore(milestone_generator) if milestone_generator is not None else MilestoneStore()
        return AdmireReward(cache, settings=admire, store=store, outcome_every_step=outcome_every_step)
    kind = SOURCE_MODEL_KIND[name]
    assert kind is not None
    scorer = load_scorer(warehouse, kind, endpoint=endpoint, model_id=model_id)
    if name == "orm":
        # the threshold the evaluation report chose on the validation split, unless one is given
        threshold = orm_threshold if orm_threshold is not None else report_threshold(warehouse, scorer.model_id)
        return ORMReward(scorer, threshold=threshold, rule=orm_rule)
    if name in PROGRESS_KINDS:
        return ProgressReward(scorer, k=progress_k, name=name)
    return StepJudgeReward(scorer, kind=name)
