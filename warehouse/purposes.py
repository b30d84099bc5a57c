"""What an episode is for (``episodes.purpose``), and which purposes may feed training.

An episode's *source* says how it was made (a human demonstration, a rollout, a synthetic edit);
its *purpose* says why it exists, and so what it may be used for. The split matters because
rollouts serve both sides: the noisy experts' exploration and the policies' own sampled episodes
are training data for SFT, recipes, labels and reward models, while the greedy episodes that
measure a policy (selection and held-out seeds) or a guided agent must never be trained on, or
every later figure measured on those seeds is contaminated.

The purpose is set where an episode is made and written with it. Homes written before the column
existed get it inferred in the ``episodes`` view (:data:`LEGACY_PURPOSE_SQL`) from the source and
the episode-id prefixes every producer has always used, so nothing has to be re-imported.
"""

from __future__ import annotations

from enum import StrEnum


class EpisodePurpose(StrEnum):
    """Why an episode exists. Stored as its plain string value."""

    DEMONSTRATION = "demonstration"  # a human demonstration (imported)
    EXPLORATION = "exploration"  # the rollouts asset: scripted and noisy-expert episodes on live environments
    SYNTHETIC = "synthetic"  # an edit of a real episode (ProgRM App. B's negative synthesis)
    POLICY_ROLLOUT = "policy_rollout"  # a policy checkpoint sampled at temperature to collect training data
    RL_TRAINING = "rl_training"  # an RL iteration's sampled episodes (training seeds)
    EVALUATION = "evaluation"  # episodes that measure a policy: greedy (selection, held-out seeds), SAMPLED_SELECTION
    GUIDANCE_EVALUATION = "guidance_evaluation"  # a reward-guided agent on held-out seeds


#: Episodes of these purposes may enter SFT, recipes, progress labels, Label Studio and reward-model data.
TRAINING_PURPOSES: tuple[str, ...] = (
    EpisodePurpose.DEMONSTRATION.value,
    EpisodePurpose.EXPLORATION.value,
    EpisodePurpose.SYNTHETIC.value,
    EpisodePurpose.POLICY_ROLLOUT.value,
    EpisodePurpose.RL_TRAINING.value,
)
#: Episodes of these purposes measure something; no training table may hold them.
EVALUATION_PURPOSES: tuple[str, ...] = (
    EpisodePurpose.EVALUATION.value,
    EpisodePurpose.GUIDANCE_EVALUATION.value,
)
#: The agent's own episodes among the training purposes: what reward models must learn to judge.
AGENT_PURPOSES: tuple[str, ...] = (EpisodePurpose.POLICY_ROLLOUT.value, EpisodePurpose.RL_TRAINING.value)
#: What SFT imitates: expert behaviour only (a policy's own episodes would teach it its mistakes).
IMITATION_PURPOSES: tuple[str, ...] = (EpisodePurpose.DEMONSTRATION.value, EpisodePurpose.EXPLORATION.value)

#: ``episodes.purpose`` for rows written before the column existed, from what they always carried:
#: the source, and the id prefixes of the RL stage (``eval:``, ``rl:``) and of guidance (``guide:``).
LEGACY_PURPOSE_SQL = """CASE
    WHEN source = 'human_demo' THEN 'demonstration'
    WHEN source LIKE 'synthetic:%' THEN 'synthetic'
    WHEN episode_id LIKE 'eval:%' THEN 'evaluation'
    WHEN episode_id LIKE 'guide:%' THEN 'guidance_evaluation'
    WHEN episode_id LIKE 'rl:%' THEN 'rl_training'
    ELSE 'exploration' END"""


#: The evaluation name, and the episode-id part (``eval:<policy>:selection_sampled:<task>:<seed>``),
#: of an SFT policy's episodes *sampled* at temperature 1 on the long tasks' selection seeds: the
#: sparse rule's reading of what RL will see. They measure (purpose evaluation) but are not greedy;
#: what judges a policy's greedy behaviour leaves them out (:func:`greedy_evaluation_filter`).
SAMPLED_SELECTION = "selection_sampled"


def greedy_evaluation_filter(column: str = "e.episode_id") -> str:
    """A SQL condition leaving out the :data:`SAMPLED_SELECTION` episodes by their id."""
    return f"{column} NOT LIKE 'eval:%:{SAMPLED_SELECTION}:%'"


def purpose_filter(column: str = "e.purpose", purposes: tuple[str, ...] = TRAINING_PURPOSES) -> str:
    """A SQL condition keeping episodes of ``purposes`` (the values are fixed strings, not user input)."""
    allowed = {p.value for p in EpisodePurpose}
    unknown = [p for p in purposes if p not in allowed]
    if unknown or not purposes:
        raise ValueError(f"unknown episode purposes {unknown or '(none)'}; known: {sorted(allowed)}")
    return f"{column} IN ({', '.join(repr(p) for p in purposes)})"
