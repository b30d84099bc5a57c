"""A learned reward added to the exact outcome, in one of two declared forms (and a control).

Every learned source alone replaces the outcome, and an agent can be paid for what only looks
like success (a ProgRM model pays a never-submitted episode nearly what it pays a success). The
papers add their dense signal to the outcome instead; two ways of doing so are offered (and a
control for the first), named
``outcome+<source>:<form>`` (e.g. ``outcome+progrm_env:shaped``, ``outcome+prm:decay``):

* ``shaped``: potential-based shaping (Ng, Harada & Russell 1999, Thm. 1),
  ``r'_t = r_t + F_t`` with ``F_t = gamma * Phi(s_{t+1}) - Phi(s_t)``. The potential of a state is
  the model's score of it: ProgRM's progress estimate p_t (ProgRM Eq. 1) for the state after action
  ``a_t``, the ORM's P(success), a step judge's P(correct) of the action that led there (the state
  carries its history, ProgRM Eq. 6, so this too is a function of the state). ``Phi(s_0) = 0``
  (ProgRM Eq. 2's p_{-1} = 0) and the terminal potential is zeroed, so an episode's discounted
  shaping sums to ``-Phi(s_0) = 0`` whatever the agent does: the outcome decides what is optimal,
  and the model only moves credit between steps. ``gamma`` must be the learner's turn discount
  for the sum to telescope in the returns it computes.
* ``decay``: ADMIRE's additive bonus (Alg. 1, line 34), ``r'_t = r_t + lambda_0 * gamma_E^E * d_t``
  with ``d_t`` the source's own step reward (a progress gain, a PRM judgement with its format
  reward, ...) and ``E`` the training iteration: the dense term leads early and fades. ADMIRE's
  asymmetric credit is specific to milestones and stays with the ``admire`` source.
* ``shuffled``: a control for ``shaped``, not a reward to train with. The same model's step scores,
  permuted among all the states of the batch before they are made potentials, so the returns carry
  a ``-Phi`` term drawn from the same scores but with no information about the state it is paid in.
  Its pool holds every episode's last score too, which ``shaped`` never pays (the terminal potential
  is 0), so the values it pays are close to, not exactly, ``shaped``'s (stop 65's runs used this pool).
  REINFORCE++ normalises a batch's returns together, so shaping also changes the scale every other
  term of a batch is divided by; if ``shuffled`` helps as much as ``shaped``, that scale is what
  helped, not the model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from training.policy.rollouts import Rollout
from training.reward_models.scoring import TrajectoryScorer
from training.rl.estimators import discounted_returns
from training.rl.rewards.base import RewardBatch, RewardSource, text_trajectory
from training.rl.rewards.outcome import OutcomeReward
from warehouse.catalog import LineageInput

COMPOSITION_FORMS: tuple[str, ...] = ("shaped", "decay", "shuffled")
#: Forms that are experimental controls, not rewards to train with (the advice never recommends one).
CONTROL_FORMS: tuple[str, ...] = ("shuffled",)
#: The sources that compose with the outcome: the learned ones and the spec's exact milestones
#: (ADMIRE already adds its milestones to it).
COMPOSABLE_SOURCES: tuple[str, ...] = ("orm", "progrm_lcs", "progrm_env", "prm", "guidnav", "milestones")
#: ADMIRE App. A.1.2: the bonus's initial weight and its decay per training iteration.
DECAY_WEIGHT = 0.3
DECAY_RATE = 0.99


@dataclass(frozen=True)
class Composition:
    """A composed source's parts: the learned ``source`` and the ``form`` it is added in."""

    source: str
    form: str

    @property
    def name(self) -> str:
        return f"outcome+{self.source}:{self.form}"


#: Every composed source by name, ``outcome+<source>:<form>``.
COMPOSED_SOURCES: tuple[str, ...] = tuple(
    Composition(source, form).name for source in COMPOSABLE_SOURCES for form in COMPOSITION_FORMS
)


def parse_composition(name: str) -> Composition | None:
    """The parts of a composed source name (``outcome+progrm_env:shaped``), None for a plain
    source name (no ``+``); a malformed one raises a ValueError whose message names what is wrong."""
    if "+" not in name:
        return None
    base, _, rest = name.partition("+")
    source, colon, form = rest.partition(":")
    if base != "outcome":
        raise ValueError(f"reward {name!r}: a composed reward adds a learned source to the outcome: outcome+<source>")
    if not colon:
        raise ValueError(
            f"reward {name!r}: say how the source is added: "
            f"{name}:shaped or {name}:decay (or {name}:shuffled, a control)"
        )
    if source not in COMPOSABLE_SOURCES:
        raise ValueError(f"reward {name!r}: unknown source {source!r}; choose one of {', '.join(COMPOSABLE_SOURCES)}")
    if form not in COMPOSITION_FORMS:
        raise ValueError(f"reward {name!r}: unknown form {form!r}; choose one of {', '.join(COMPOSITION_FORMS)}")
    return Composition(source, form)


def is_control(name: str) -> bool:
    """Whether a reward source is an experimental control (a composed source in a :data:`CONTROL_FORMS` form)."""
    composition = parse_composition(name) if "+" in name else None
    return composition is not None and composition.form in CONTROL_FORMS


def shaping_rewards(potentials: Sequence[float] | np.ndarray, gamma: float) -> np.ndarray:
    """Potential-based shaping of one episode (Ng et al. 1999): ``F_t = gamma * Phi(s_{t+1}) - Phi(s_t)``
    for t = 0..T-1, from the potentials ``Phi(s_0), ..., Phi(s_T)`` (T + 1 values). The last state
    is terminal: its potential counts as 0 whatever is given, so ``sum_t gamma^t F_t = -Phi(s_0)``."""
    phi = np.asarray(potentials, dtype=np.float64)
    if phi.ndim != 1 or phi.size == 0:
        raise ValueError("shaping needs the potentials of the T + 1 states of an episode")
    if phi.size == 1:  # no step taken: nothing to shape
        return np.zeros(0)
    following = np.append(phi[1:-1], 0.0)  # Phi(s_1) .. Phi(s_{T-1}), then the terminal state's 0
    return gamma * following - phi[:-1]


def episode_potentials(step_scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Phi(s_0..s_T) from a model's per-step scores, ``scores[t]`` being its score of the state
    after action ``a_t``: ``Phi(s_0) = 0`` (ProgRM Eq. 2's p_{-1}), ``Phi(s_{t+1}) = scores[t]``."""
    return np.concatenate([[0.0], np.asarray(step_scores, dtype=np.float64)])


def shuffled_step_scores(step_scores: Sequence[Sequence[float] | np.ndarray], seed: Sequence[int]) -> list[np.ndarray]:
    """The ``shuffled`` control's step scores: the batch's scores pooled over its episodes, permuted
    by a generator seeded with ``seed``, and dealt back in the episodes' lengths. The multiset of
    scores (so the spread of the ``-Phi`` term in the returns) is kept; which state has which is not."""
    lengths = [len(s) for s in step_scores]
    pooled = np.concatenate([np.asarray(s, dtype=np.float64) for s in step_scores] or [np.zeros(0)])
    permuted = np.random.default_rng(list(seed)).permutation(pooled)
    return np.split(permuted, np.cumsum(lengths)[:-1]) if lengths else []


def decayed_weight(iteration: int, weight: float = DECAY_WEIGHT, rate: float = DECAY_RATE) -> float:
    """ADMIRE's curriculum coefficient ``lambda_0 * gamma^E`` at training iteration ``E`` (0-based)."""
    if iteration < 0:
        raise ValueError(f"iteration must be 0 or more, got {iteration}")
    return weight * rate**iteration


#: Each episode's per-step scores of a batch (``scores[t]``: the state after action ``a_t``), what
#: ``shaped`` makes potentials of: a reward model's (:func:`model_step_scores`) or the spec's
#: milestone progress (``training.rl.rewards.milestones``).
StepScores = Callable[[Sequence[Rollout]], list[np.ndarray]]


def model_step_scores(scorer: TrajectoryScorer) -> StepScores:
    """A reward model's step scores of a batch of rollouts (the episodes as models read them)."""

    def scores(rollouts: Sequence[Rollout]) -> list[np.ndarray]:
        scored = scorer.score([text_trajectory(r.record) for r in rollouts])
        return [np.asarray(s.scores, dtype=np.float64) for s in scored]

    return scores


class ComposedReward:
    """The outcome plus a learned source, shaped or with a decaying weight (module docstring)."""

    def __init__(
        self,
        composition: Composition,
        dense: RewardSource,
        step_scores: StepScores,
        *,
        gamma: float,
        weight: float = DECAY_WEIGHT,
        rate: float = DECAY_RATE,
    ) -> None:
        self.composition, self.dense, self.step_scores = composition, dense, step_scores
        self.gamma, self.weight, self.rate = gamma, weight, rate
        self.name = composition.name
        self.outcome = OutcomeReward()

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        base = self.outcome.rewards(rollouts, iteration)
        if self.composition.form in ("shaped", "shuffled"):
            scores = self.step_scores(rollouts)
            details = {"shaping_weight": 1.0, "mean_final_potential": _mean([s[-1] for s in scores if s.size])}
            if self.composition.form == "shuffled":
                scores = shuffled_step_scores(scores, _batch_seed(rollouts, iteration))
            extra = [shaping_rewards(episode_potentials(s), self.gamma) for s in scores]
        else:
            dense = self.dense.rewards(rollouts, iteration)
            coefficient = decayed_weight(iteration, self.weight, self.rate)
            extra = [coefficient * np.asarray(r, dtype=np.float64) for r in dense.rewards]
            details = {f"dense_{k}": v for k, v in dense.details.items()} | {"shaping_weight": coefficient}
        rewards = [b + e for b, e in zip(base.rewards, extra, strict=True)]
        # what the learned part adds to an episode's return as the learner discounts it (shaped: 0)
        dense_return = _mean([float(discounted_returns(e, self.gamma)[0]) for e in extra if e.size])
        return RewardBatch(rewards, base.details | details | {"mean_dense_return": dense_return})

    @property
    def scorer(self) -> TrajectoryScorer | None:
        """The dense part's reward model (None for the spec's milestones): the model the run records
        and a resumed run is pinned to (``training.rl.iterations.reward_model_of``)."""
        return getattr(self.dense, "scorer", None)

    def lineage(self) -> list[LineageInput]:
        return self.dense.lineage()


def _batch_seed(rollouts: Sequence[Rollout], iteration: int) -> list[int]:
    """The ``shuffled`` control's permutation seed: the iteration and the batch's episode ids, so the
    same batch is permuted the same way when it is scored again (a resumed run)."""
    digest = hashlib.sha256("\n".join(r.record.episode_id for r in rollouts).encode()).digest()
    return [iteration, int.from_bytes(digest[:8], "little")]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0
