"""RL maths as small pure functions: returns, advantages and policy losses, one per estimator.

An episode is a sequence of *turns* (one agent step each). The learned CPU policy makes one
choice per turn (a candidate action), so a turn is one "token"; the LLM policy generates several
tokens per turn, and the token-level functions below spread a turn's reward over them.

* REINFORCE++ (ProgRM §2.4, Table 6; critic-free): per-step rewards minus a KL penalty to the
  reference (SFT) policy, discounted returns, advantages normalised over the whole batch, PPO's
  clipped surrogate. ProgRM's multi-turn variant (after Wen et al., its ref. [27]) discounts
  between turns with ``gamma_turn`` and within a turn with ``gamma_token``; the paper states
  gamma 0.9 without saying which, and we read it as the inter-turn discount.
* REINFORCE++ with the KL kept apart (``reinforce_pp_kl_apart``, ours, not a paper's): the same,
  except that only the rewards' returns are normalised and the KL penalty's returns are added at
  their coefficient's scale (see :func:`reinforce_pp_kl_apart_advantages` for why).
* Step-level GRPO (ADMIRE Eqs. 12-13): a step's advantage is its immediate total reward,
  z-scored over every step of the group of trajectories that share one instruction.
* RLOO: a trajectory's return minus the mean return of the other trajectories of its group.
* PPO with GAE (GUI-Shepherd Eqs. 4-5): advantages from a learned value function.

Every function takes and returns plain numbers or numpy arrays, except the losses, which take
torch tensors so that they can be differentiated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import torch

Numbers: TypeAlias = Sequence[float] | np.ndarray

#: ProgRM Table 6 defaults.
GAMMA = 0.9
KL_COEF = 0.01
CLIP = 0.2
EPS = 1e-8


def discounted_returns(rewards: Numbers, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1}, G_{T} = 0 (the reward-to-go of every step)."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def kl_penalty(logp_old: Numbers, logp_ref: Numbers) -> np.ndarray:
    """The per-step KL estimate of REINFORCE++: log pi_old(a|s) - log pi_ref(a|s) (the k1
    estimator; its expectation under pi_old is KL(pi_old || pi_ref))."""
    return np.asarray(logp_old, dtype=np.float64) - np.asarray(logp_ref, dtype=np.float64)


def normalise(values: np.ndarray, eps: float = EPS) -> np.ndarray:
    """(x - mean) / std over all values; all-equal values give zeros (no signal, no blow-up)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values
    std = values.std()
    if std < eps:
        return np.zeros_like(values)
    return (values - values.mean()) / (std + eps)


def normalise_together(per_episode: Sequence[Numbers], eps: float = EPS) -> list[np.ndarray]:
    """:func:`normalise` over the values of every episode at once (one mean, one spread for the
    batch or group), given back split as the episodes were."""
    arrays = [np.asarray(v, dtype=np.float64) for v in per_episode]
    flat = normalise(np.concatenate(arrays), eps) if arrays else np.zeros(0)
    return np.split(flat, np.cumsum([a.size for a in arrays])[:-1]) if arrays else []


def reinforce_pp_advantages(
    rewards: Sequence[Numbers],
    logp_old: Sequence[Numbers],
    logp_ref: Sequence[Numbers],
    *,
    gamma: float = GAMMA,
    kl_coef: float = KL_COEF,
) -> list[np.ndarray]:
    """REINFORCE++ advantages for a batch of episodes (ProgRM §2.4 with Table 6's values).

    Each step's reward is shaped by the KL penalty, r'_t = r_t - kl_coef * (log pi_old - log
    pi_ref), turned into discounted returns within its episode, and the returns of the whole batch
    are normalised together (REINFORCE++'s global-batch normalisation replaces a critic)."""
    returns = [
        discounted_returns(np.asarray(r, dtype=np.float64) - kl_coef * kl_penalty(lo, lr), gamma)
        for r, lo, lr in zip(rewards, logp_old, logp_ref, strict=True)
    ]
    return normalise_together(returns)


def reinforce_pp_kl_apart_advantages(
    rewards: Sequence[Numbers],
    logp_old: Sequence[Numbers],
    logp_ref: Sequence[Numbers],
    *,
    gamma: float = GAMMA,
    kl_coef: float = KL_COEF,
) -> list[np.ndarray]:
    """REINFORCE++ advantages with the KL penalty outside the batch normalisation: the rewards'
    discounted returns normalised over the batch, plus the discounted returns of
    ``-kl_coef * (log pi_old - log pi_ref)`` as they are.

    Why: :func:`reinforce_pp_advantages` normalises the sum. In a batch where every episode earns
    the same reward (a sparse task's usual batch: no success), the sum's spread is the KL term's
    alone, and normalising scales it to unit size, so each such batch takes a full step back
    towards the reference policy, however small the penalty is (kl_coef 0.01 x a KL of about 0.1 a
    step on use-spinner: about 1e-3). Here that batch moves only by the penalty itself. In a batch
    whose rewards differ, the rewards lead as before, and the penalty weighs kl_coef instead of
    kl_coef / std(returns): less than in REINFORCE++ wherever that spread is under 1."""
    reward_returns = [discounted_returns(np.asarray(r, dtype=np.float64), gamma) for r in rewards]
    kl_returns = [
        discounted_returns(-kl_coef * kl_penalty(lo, lr), gamma) for lo, lr in zip(logp_old, logp_ref, strict=True)
    ]
    if len(kl_returns) != len(reward_returns):
        raise ValueError(f"{len(reward_returns)} episodes' rewards but {len(kl_returns)} episodes' log-probabilities")
    return [g + kl for g, kl in zip(normalise_together(reward_returns), kl_returns, strict=True)]


def multi_turn_token_returns(
    turn_rewards: Numbers,
    token_kl: Sequence[Numbers],
    *,
    gamma_turn: float = GAMMA,
    gamma_token: float = 1.0,
    kl_coef: float = KL_COEF,
) -> list[np.ndarray]:
    """Token-level returns of one episode for a policy that writes several tokens per turn.

    Every token pays ``-kl_coef * KL``; a turn's reward arrives at its last token. Going back,
    G_{t,n_t} = r_{t,n_t} + gamma_turn * G_{t+1,1} between turns and G_{t,j} = r_{t,j} +
    gamma_token * G_{t,j+1} within a turn (the inter-/intra-turn discounts ProgRM takes from its
    ref. [27]). With one token per turn this is :func:`discounted_returns` of the shaped rewards."""
    if len(turn_rewards) != len(token_kl):
        raise ValueError(f"{len(turn_rewards)} turn rewards for {len(token_kl)} turns of tokens")
    out: list[np.ndarray] = [np.zeros(len(k)) for k in token_kl]
    next_turn_start = 0.0
    for t in range(len(turn_rewards) - 1, -1, -1):
        kl = np.asarray(token_kl[t], dtype=np.float64)
        if kl.size == 0:
            raise ValueError(f"turn {t} has no tokens")
        token_rewards = -kl_coef * kl
        token_rewards[-1] += float(turn_rewards[t])
        running = next_turn_start
        for j in range(kl.size - 1, -1, -1):
            discount = gamma_turn if j == kl.size - 1 else gamma_token
            running = token_rewards[j] + discount * running
            out[t][j] = running
        next_turn_start = out[t][0]
    return out


def grpo_step_advantages(group_rewards: Sequence[Numbers], eps: float = EPS) -> list[np.ndarray]:
    """Step-level GRPO (ADMIRE Eq. 13): A_t^i = (R_t^i - mean(R)) / std(R), R = every step's
    immediate total reward over all trajectories of one group (one instruction). No discount."""
    return normalise_together(group_rewards, eps)


def rloo_advantages(group_returns: Sequence[float]) -> np.ndarray:
    """RLOO: each trajectory's return minus the mean return of the *other* trajectories of its
    group (a baseline that does not include the sample itself). A group of one has no baseline."""
    returns = np.asarray(group_returns, dtype=np.float64)
    n = returns.size
    if n < 2:
        return np.zeros_like(returns)
    return returns - (returns.sum() - returns) / (n - 1)


def gae(
    rewards: Numbers, values: Numbers, *, gamma: float, lam: float, last_value: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (GUI-Shepherd Eq. 4):
    A_t = sum_k (gamma*lam)^k delta_{t+k}, delta_t = r_t + gamma V(s_{t+1}) - V(s_t); V after the
    last step is ``last_value`` (0 at a terminal state). Returns (advantages, value targets A + V)."""
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != v.shape:
        raise ValueError(f"{r.size} rewards for {v.size} values")
    advantages = np.zeros_like(r)
    running = 0.0
    for t in range(r.size - 1, -1, -1):
        next_value = v[t + 1] if t + 1 < v.size else last_value
        delta = r[t] + gamma * next_value - v[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, advantages + v


def ppo_clip_loss(
    logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip: float = CLIP
) -> torch.Tensor:
    """PPO's clipped surrogate (GUI-Shepherd Eq. 5, ADMIRE Eq. 12), negated to be minimised and
    averaged over samples: -mean(min(rho * A, clip(rho, 1 - eps, 1 + eps) * A))."""
    ratio = torch.exp(logp_new - logp_old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    return -torch.minimum(unclipped, clipped).mean()


def clip_fraction(logp_new: torch.Tensor, logp_old: torch.Tensor, clip: float = CLIP) -> float:
    """Share of samples whose probability ratio left [1 - clip, 1 + clip] (a health figure)."""
    ratio = torch.exp(logp_new - logp_old)
    return float(((ratio < 1.0 - clip) | (ratio > 1.0 + clip)).float().mean())


def value_loss(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The critic's regression loss: 0.5 * mean((V(s) - target)^2)."""
    return 0.5 * torch.mean((values - targets) ** 2)
