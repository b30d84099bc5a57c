"""The learned policy's scorer: a small network over cached sentence encodings.

For one state (instruction, recent actions, screen) and each of its candidate actions
(:mod:`training.policy.candidates`) the scorer reads the frozen MiniLM encodings of the
instruction-relative instruction ``u``, the recent actions ``h`` and the candidate ``c`` (the reward
models' int8 encoder and its cache), plus the candidate's scalar features ``f``, and returns a logit:

    logit = MLP([u * c, h * c, c, h, f])

The policy is the softmax of the logits over the state's candidates. Products of encodings let a
two-layer MLP compare the candidate with the instruction and with what was just done; the scalar
features carry what encodings blur (exact values, repetition, field contents).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from training.policy.candidates import N_FEATURES


@dataclass(frozen=True)
class ScorerConfig:
    """The scorer's shape (saved with its weights)."""

    embed_dim: int = 384
    n_features: int = N_FEATURES
    hidden: int = 128
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class CandidateScorer(nn.Module):
    """logit(state, candidate) for every candidate of a batch of states."""

    def __init__(self, config: ScorerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.embed_dim
        self.mlp = nn.Sequential(
            nn.Linear(4 * d + config.n_features, config.hidden),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, config.hidden),
            nn.GELU(),
            nn.Linear(config.hidden, 1),
        )

    def forward(
        self,
        instruction: torch.Tensor,
        history: torch.Tensor,
        candidates: torch.Tensor,
        features: torch.Tensor,
        state_index: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (N,) of N candidates; ``state_index`` (N,) names each candidate's state, a row of
        ``instruction`` and ``history`` (S, D). ``candidates`` is (N, D), ``features`` (N, F)."""
        u = instruction[state_index]
        h = history[state_index]
        x = torch.cat([u * candidates, h * candidates, candidates, h, features], dim=-1)
        return self.mlp(x).squeeze(-1)


def grouped_log_softmax(logits: torch.Tensor, state_index: torch.Tensor, n_states: int) -> torch.Tensor:
    """log-softmax of ``logits`` within each state's group of candidates (a vectorised
    ``log_softmax`` over ragged groups): log pi(c | s) for every candidate c."""
    floor = torch.full((n_states,), float("-inf"), dtype=logits.dtype, device=logits.device)
    peak = floor.scatter_reduce(0, state_index, logits.detach(), reduce="amax", include_self=True)
    shifted = logits - peak[state_index]
    totals = torch.zeros(n_states, dtype=logits.dtype, device=logits.device).index_add(
        0, state_index, torch.exp(shifted)
    )
    return shifted - torch.log(totals)[state_index]


def grouped_entropy(log_probs: torch.Tensor, state_index: torch.Tensor, n_states: int) -> torch.Tensor:
    """The policy's entropy at each state, -sum_c pi(c|s) log pi(c|s), shape (S,)."""
    return -torch.zeros(n_states, dtype=log_probs.dtype, device=log_probs.device).index_add(
        0, state_index, torch.exp(log_probs) * log_probs
    )
