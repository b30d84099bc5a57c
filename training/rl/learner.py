"""The policy update of one RL iteration: advantages by the chosen estimator, then clipped policy
gradient steps (ProgRM §2.4 / Table 6 for REINFORCE++, ADMIRE Eqs. 12-13 for step-level GRPO,
RLOO, GUI-Shepherd Eqs. 3-5 for PPO with a critic initialised from the PRM).

The estimators are the pure functions of :mod:`training.rl.estimators`; this module gathers a
batch's log-probabilities (the acting policy's, before the update, and the reference SFT
policy's), computes advantages, and runs a few epochs of minibatch updates of the scorer.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from training.base.states import StepState
from training.policy.learned import PolicyModel, StepDecision
from training.reward_models.models import RewardScorer, collate_segments, segment_features
from training.rl import estimators

ESTIMATORS = ("reinforce_pp", "reinforce_pp_kl_apart", "grpo", "rloo", "ppo")


@dataclass(frozen=True)
class LearnerSettings:
    """Update hyper-parameters. ProgRM Table 6 gives gamma 0.9, KL 0.01, clip 0.2 (kept) and a
    learning rate of 7e-5 for a 7B LLM; the small scorer here learns at 1e-3 (the SFT rate)."""

    estimator: str = "reinforce_pp"
    learning_rate: float = 1e-3
    epochs: int = 2  # passes over each batch
    minibatch_steps: int = 256
    clip: float = estimators.CLIP
    gamma: float = estimators.GAMMA
    kl_coef: float = estimators.KL_COEF
    gae_lambda: float = 0.95  # GUI-Shepherd states none; a common value
    critic_learning_rate: float = 1e-4
    critic_top_k: int = 8  # the policy's most likely actions the critic's V(s) averages over
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; choose one of {', '.join(ESTIMATORS)}")


@dataclass
class EpisodeExperience:
    """One episode as the learner needs it: its decisions, per-step rewards, the group it was
    sampled in (the same task instance, for GRPO and RLOO) and, for PPO, the critic's states."""

    decisions: list[StepDecision]
    rewards: np.ndarray
    group: str
    states: list[CriticState] = field(default_factory=list)


@dataclass(frozen=True)
class CriticState:
    """A state as the PPO critic reads it: the PRM's input without an action, and the policy's
    candidate actions there as the PRM reads actions (``describe_action``), in the order of the
    step's :class:`StepDecision` candidates."""

    state: StepState
    actions: tuple[str, ...]


@dataclass
class UpdateStats:
    """Figures of one update (logged per iteration)."""

    loss: float = 0.0
    kl_to_reference: float = 0.0
    entropy: float = 0.0
    clip_fraction: float = 0.0
    mean_advantage_abs: float = 0.0
    value_loss: float | None = None
    steps: int = 0
    advantages: list[np.ndarray] = field(default_factory=list)  # per episode, as used


class PRMCritic:
    """V(s) for PPO, initialised from the trained PRM (GUI-Shepherd §4.1, App. B.2).

    The PRM judges a state *with* a candidate action, P(correct | s, a); it never saw a state
    without one. So the critic reads only inputs of that kind: a copy of the PRM's network scores
    (s, a) for the policy's ``top_k`` most likely actions at s, and V(s) is their average weighted
    by the acting policy's probabilities (renormalised over the k), sum_a pi(a|s) f(s, a): a state
    value built from action judgements, as V(s) = E_pi[Q(s, a)]. Trained by regression of that
    average on the GAE value targets (GUI-Shepherd Eq. 5)."""

    def __init__(self, prm: RewardScorer, learning_rate: float = 1e-4, top_k: int = 8) -> None:
        if prm.cache is None:
            raise ValueError("the PPO critic needs a frozen-segments PRM (the CPU reward models)")
        if top_k < 1:
            raise ValueError(f"critic top_k must be at least 1, not {top_k}")
        self.model = copy.deepcopy(prm.model).train()
        self.cache = prm.cache
        self.config = prm.config
        self.top_k = top_k
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=learning_rate)

    def judged_pairs(
        self, states: Sequence[CriticState], policy_probs: Sequence[np.ndarray]
    ) -> tuple[list[StepState], np.ndarray, np.ndarray]:
        """The (state, action) inputs V(s) is built from, each pair's weight, and its state's index."""
        pairs: list[StepState] = []
        weights: list[float] = []
        owner: list[int] = []
        for i, (critic_state, probs) in enumerate(zip(states, policy_probs, strict=True)):
            if not critic_state.actions or len(critic_state.actions) != len(probs):
                raise ValueError(
                    f"critic state {i}: {len(critic_state.actions)} candidate actions but "
                    f"{len(probs)} policy probabilities"
                )
            top = np.argsort(-np.asarray(probs, dtype=np.float64), kind="stable")[: self.top_k]
            mass = float(np.sum(probs[top]))
            for j in top:
                pairs.append(replace(critic_state.state, action=critic_state.actions[j]))
                weights.append(float(probs[j]) / mass if mass > 0 else 1.0 / len(top))
                owner.append(i)
        return pairs, np.asarray(weights, dtype=np.float32), np.asarray(owner, dtype=np.int64)

    def _forward(self, states: Sequence[CriticState], policy_probs: Sequence[np.ndarray]) -> torch.Tensor:
        pairs, weights, owner = self.judged_pairs(states, policy_probs)
        features = segment_features(pairs, self.cache, self.config)
        batch = collate_segments(features, np.arange(len(pairs)), torch.from_numpy(self.cache.matrix))
        judged = self.model(**batch)["logits"].float()
        values = torch.zeros(len(states), dtype=judged.dtype)
        return values.index_add(0, torch.from_numpy(owner), judged * torch.from_numpy(weights))

    def values(self, states: Sequence[CriticState], policy_probs: Sequence[np.ndarray]) -> np.ndarray:
        if not states:
            return np.zeros(0)
        self.model.eval()
        with torch.inference_mode():
            out = np.concatenate(
                [self._forward(states[i : i + 64], policy_probs[i : i + 64]).numpy() for i in range(0, len(states), 64)]
            ).astype(np.float64)
        self.model.train()
        return out

    def fit(
        self,
        states: Sequence[CriticState],
        policy_probs: Sequence[np.ndarray],
        targets: np.ndarray,
        *,
        epochs: int,
        batch: int,
        rng: random.Random,
    ) -> float:
        losses = []
        for _ in range(epochs):
            order = list(range(len(states)))
            rng.shuffle(order)
            for start in range(0, len(order), batch):
                idx = order[start : start + batch]
                predicted = self._forward([states[i] for i in idx], [policy_probs[i] for i in idx])
                loss = estimators.value_loss(predicted, torch.tensor(targets[idx], dtype=torch.float32))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                losses.append(float(loss.detach()))
        return float(np.mean(losses)) if losses else 0.0


class Learner:
    """Updates ``model`` from batches of episodes; ``reference`` is the frozen SFT policy the KL
    penalty of REINFORCE++ measures against."""

    def __init__(
        self,
        model: PolicyModel,
        reference: PolicyModel,
        settings: LearnerSettings,
        *,
        critic: PRMCritic | None = None,
    ) -> None:
        if settings.estimator == "ppo" and critic is None:
            raise ValueError("PPO needs a critic (PRMCritic, initialised from a trained PRM)")
        self.model, self.reference, self.settings, self.critic = model, reference, settings, critic
        self.optimizer = torch.optim.Adam(model.scorer.parameters(), lr=settings.learning_rate)
        self.rng = random.Random(settings.seed)

    def advantages(
        self,
        episodes: Sequence[EpisodeExperience],
        logp_old: list[np.ndarray],
        logp_ref: list[np.ndarray],
        policy_probs: list[list[np.ndarray]] | None = None,
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Per-step advantages by the configured estimator (and PPO's value targets; PPO needs
        ``policy_probs``, the acting policy's distribution over each step's candidates)."""
        s = self.settings
        rewards = [e.rewards for e in episodes]
        if s.estimator == "reinforce_pp":
            return estimators.reinforce_pp_advantages(
                rewards, logp_old, logp_ref, gamma=s.gamma, kl_coef=s.kl_coef
            ), None
        if s.estimator == "reinforce_pp_kl_apart":
            return estimators.reinforce_pp_kl_apart_advantages(
                rewards, logp_old, logp_ref, gamma=s.gamma, kl_coef=s.kl_coef
            ), None
        if s.estimator == "grpo":
            out: list[np.ndarray] = [np.zeros(0)] * len(episodes)
            for members in _groups(episodes).values():
                for i, adv in zip(members, estimators.grpo_step_advantages([rewards[i] for i in members]), strict=True):
                    out[i] = adv
            return out, None
        if s.estimator == "rloo":
            out = [np.zeros(0)] * len(episodes)
            for members in _groups(episodes).values():
                returns = [
                    float(estimators.discounted_returns(rewards[i], s.gamma)[0]) if len(rewards[i]) else 0.0
                    for i in members
                ]
                for i, adv in zip(members, estimators.rloo_advantages(returns), strict=True):
                    out[i] = np.full(len(rewards[i]), adv)
            return out, None
        assert self.critic is not None and policy_probs is not None
        out, targets = [], []
        for e, probs in zip(episodes, policy_probs, strict=True):
            if len(e.states) != len(e.decisions):
                raise ValueError(f"{len(e.decisions)} decisions but {len(e.states)} critic states in one episode")
            values = self.critic.values(e.states, probs)
            adv, target = estimators.gae(e.rewards, values, gamma=s.gamma, lam=s.gae_lambda)
            out.append(adv)
            targets.append(target)
        return estimators.normalise_together(out), np.concatenate(targets) if targets else np.zeros(0)

    def update(self, episodes: Sequence[EpisodeExperience]) -> UpdateStats:
        """One iteration's update; returns its figures."""
        episodes = [e for e in episodes if e.decisions]
        for e in episodes:
            if len(e.decisions) != len(e.rewards):
                raise ValueError(f"{len(e.decisions)} decisions but {len(e.rewards)} rewards in one episode")
        decisions = [d for e in episodes for d in e.decisions]
        if not decisions:
            return UpdateStats()
        with torch.inference_mode():
            old = self.model.chosen_log_probs(decisions)[0].numpy().astype(np.float64)
            ref = self.reference.chosen_log_probs(decisions)[0].numpy().astype(np.float64)
        logp_old, logp_ref, start = [], [], 0
        for e in episodes:
            logp_old.append(old[start : start + len(e.decisions)])
            logp_ref.append(ref[start : start + len(e.decisions)])
            start += len(e.decisions)
        policy_probs = self.policy_probs(episodes) if self.critic is not None else None
        per_episode, value_targets = self.advantages(episodes, logp_old, logp_ref, policy_probs)
        advantages = np.concatenate(per_episode)
        stats = UpdateStats(
            advantages=per_episode,
            kl_to_reference=float(np.mean(old - ref)),
            mean_advantage_abs=float(np.abs(advantages).mean()),
            steps=len(decisions),
        )
        old_t = torch.tensor(old, dtype=torch.float32)
        adv_t = torch.tensor(advantages, dtype=torch.float32)
        losses, entropies, clipped = [], [], []
        self.model.scorer.train()
        for _ in range(self.settings.epochs):
            order = list(range(len(decisions)))
            self.rng.shuffle(order)
            for begin in range(0, len(order), self.settings.minibatch_steps):
                idx = order[begin : begin + self.settings.minibatch_steps]
                logp, entropy = self.model.chosen_log_probs([decisions[i] for i in idx])
                index = torch.tensor(idx)
                loss = estimators.ppo_clip_loss(logp, old_t[index], adv_t[index], self.settings.clip)
                if self.settings.entropy_coef:
                    loss = loss - self.settings.entropy_coef * entropy.mean()
                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.scorer.parameters(), self.settings.max_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.detach()))
                entropies.append(float(entropy.detach().mean()))
                clipped.append(estimators.clip_fraction(logp.detach(), old_t[index], self.settings.clip))
        self.model.scorer.eval()
        stats.loss, stats.entropy = float(np.mean(losses)), float(np.mean(entropies))
        stats.clip_fraction = float(np.mean(clipped))
        if self.critic is not None and value_targets is not None and policy_probs is not None:
            states = [s for e in episodes for s in e.states]
            probs = [p for episode_probs in policy_probs for p in episode_probs]
            stats.value_loss = self.critic.fit(
                states,
                probs,
                value_targets,
                epochs=self.settings.epochs,
                batch=self.settings.minibatch_steps,
                rng=self.rng,
            )
        return stats

    def policy_probs(self, episodes: Sequence[EpisodeExperience]) -> list[list[np.ndarray]]:
        """pi(. | s_t) over each step's candidates under the acting policy (before the update)."""
        out = []
        with torch.inference_mode():
            for e in episodes:
                logp = self.model.log_probs(self.model.batch(e.decisions)).numpy().astype(np.float64)
                bounds = np.cumsum([0, *(d.n_candidates for d in e.decisions)])
                out.append([np.exp(logp[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        return out

    def state_dict(self) -> dict:
        """What a checkpoint keeps besides the weights: the optimizer, the shuffling RNG, and a
        PPO critic's weights and optimizer (a resumed run goes on with the critic it had learned,
        not a fresh copy of the PRM)."""
        state: dict = {"optimizer": self.optimizer.state_dict(), "rng": self.rng.getstate()}
        if self.critic is not None:
            state["critic"] = self.critic.model.state_dict()
            state["critic_optimizer"] = self.critic.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        if self.critic is not None and "critic" in state:  # (checkpoints before the critic was kept: the PRM's copy)
            self.critic.model.load_state_dict(state["critic"])
            self.critic.optimizer.load_state_dict(state["critic_optimizer"])


def _groups(episodes: Sequence[EpisodeExperience]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        groups[e.group].append(i)
    return groups
