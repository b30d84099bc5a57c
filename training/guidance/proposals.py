"""The N candidate actions a policy proposes at one step (GUI-Shepherd Alg. 2 line 1: A_c ~ pi_theta;
GuidNav Eq. 4: A_t = P(x, h_t, s_t)).

* The learned CPU policy (:class:`LearnedProposer`) enumerates every candidate of the screen and
  has a distribution over them; its N candidates are the N most probable (``sample=False``, the
  default: candidate 0 is then exactly what the greedy policy would do, so N = 1 *is* the base
  policy) or N drawn without replacement from the distribution (Gumbel top-k).
* The LLM policies (:class:`LLMProposer`, over ``training.llm.policy.HFPolicy`` or
  ``EndpointPolicy``) answer N times: the first answer greedy (the base policy's own), the others
  sampled at ``temperature``; answers that do not parse are dropped (and counted), duplicates merged.

A *ban* (reflect-and-retry, :mod:`training.guidance.reflection`) removes an action from the
candidates at the state where a failed attempt went wrong; the LLM policies read their
reflection in the prompt instead.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from envs.protocol import EpisodeContext, StepResult
from training.base.states import describe_action
from training.llm.policy import EndpointPolicy, HFPolicy
from training.llm.prompts import HistoryEntry, ParsedAction, ParseFailure
from training.policy.learned import PolicyModel, StepDecision
from warehouse.model import Action, ActionType, Screen


class GuidanceError(ValueError):
    """A guided agent cannot start: N < 1, an unknown verifier, a reward model of the wrong kind,
    no model where one is needed. Raised before any rollout."""


@dataclass(frozen=True)
class Proposal:
    """One candidate: the action, its text as reward models read it (canonical text plus the
    target's context, as ``training.rl.rewards.base.text_trajectory`` writes executed actions), the
    policy's log-probability of it (NaN where unknown) and its rank in the policy's own order."""

    action: Action
    description: str
    prior: float
    rank: int
    policy_text: str = ""  # how the policy itself wrote it (instruction-relative text, LLM call)


@dataclass(frozen=True)
class ProposalSet:
    """The candidates of one step and what proposing them cost."""

    proposals: tuple[Proposal, ...]
    seconds: float
    calls: int = 0  # model calls: one forward pass (learned policy), one answer each (LLM)
    failures: int = 0  # LLM answers that did not parse (dropped)


class EpisodeProposer(Protocol):
    """A policy's candidates within one episode; ``commit`` records the action executed."""

    def propose(self, screen: Screen, n: int, banned: Collection[str] = ()) -> ProposalSet: ...

    def commit(self, proposal: Proposal) -> None: ...

    def observe(self, action: Action, result: StepResult) -> None: ...


class Proposer(Protocol):
    """A policy as a source of candidates. ``reflection`` is the text of a reflection on earlier
    failed attempts, for policies that read text (the LLM policies)."""

    @property
    def policy_id(self) -> str: ...

    def start(self, context: EpisodeContext, reflection: str | None = None) -> EpisodeProposer: ...


def rank_candidates(
    logp: np.ndarray, n: int, *, banned: np.ndarray | None = None, gumbel: np.ndarray | None = None
) -> list[int]:
    """Indices of the N candidates to propose, best first.

    Without ``gumbel`` the N largest ``logp`` (ties keep the enumeration order). With standard
    Gumbel noise added, the top N of ``logp + gumbel`` is a sample of N *without replacement* from
    softmax(logp) (the Gumbel-top-k trick). ``banned`` candidates are left out unless every
    candidate is banned (then the ban is ignored: a step always has an action)."""
    if n < 1:
        raise GuidanceError(f"N must be at least 1, got {n}")
    keys = np.asarray(logp, dtype=np.float64).copy()
    if gumbel is not None:
        keys = keys + np.asarray(gumbel, dtype=np.float64)
    allowed = np.ones(keys.shape[0], dtype=bool) if banned is None else ~np.asarray(banned, dtype=bool)
    if not allowed.any():
        allowed[:] = True
    order = [int(i) for i in np.argsort(-keys, kind="stable") if allowed[i]]
    return order[:n]


# ---------------------------------------------------------------------------------------------
# The learned CPU policy
# ---------------------------------------------------------------------------------------------


@dataclass
class LearnedProposer:
    """The learned CPU policy's N most probable candidates (or N sampled without replacement)."""

    model: PolicyModel
    policy_id: str = "learned"
    sample: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        # A fresh or loaded PolicyModel is in train mode. Today's scorers have dropout 0.0, so nothing
        # changes, but a policy trained with dropout would otherwise propose noisily at inference.
        self.model.scorer.eval()

    def start(self, context: EpisodeContext, reflection: str | None = None) -> EpisodeProposer:
        # the learned policy cannot read text: a reflection reaches it only as bans (see module doc)
        key = context.episode_id or f"{context.task.task_id}:{context.seed}"
        digest = hashlib.sha256(f"{self.seed}|{self.policy_id}|{key}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
        return _LearnedEpisode(self, context, rng)


class _LearnedEpisode:
    def __init__(self, owner: LearnedProposer, context: EpisodeContext, rng: np.random.Generator) -> None:
        self.owner, self.context, self.rng = owner, context, rng
        self.history: list[Action] = []

    def propose(self, screen: Screen, n: int, banned: Collection[str] = ()) -> ProposalSet:
        started = time.perf_counter()
        model = self.owner.model
        with torch.inference_mode():
            candidates, instruction, history, rows = model.state_rows(
                screen, self.context, self.history, len(self.history)
            )
            if not candidates:
                wait = Action(ActionType.NOTHING)
                return ProposalSet((Proposal(wait, wait.canonical_text(), 0.0, 0),), time.perf_counter() - started, 1)
            features = np.array([c.features for c in candidates], dtype=np.float32)
            decision = StepDecision(instruction, history, rows, features, 0, 0.0)
            logp = model.state_log_probs(decision)
        mask = np.array([c.action.canonical_text() in banned for c in candidates]) if banned else None
        gumbel = self.rng.gumbel(size=logp.shape[0]) if self.owner.sample else None
        order = rank_candidates(logp, n, banned=mask, gumbel=gumbel)
        proposals = tuple(
            Proposal(
                candidates[i].action,
                describe_action(candidates[i].action, screen),
                float(logp[i]),
                rank,
                candidates[i].text,
            )
            for rank, i in enumerate(order)
        )
        return ProposalSet(proposals, time.perf_counter() - started, 1)

    def commit(self, proposal: Proposal) -> None:
        self.history.append(proposal.action)

    def observe(self, action: Action, result: StepResult) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# The LLM policies
# ---------------------------------------------------------------------------------------------


def with_reflection(context: EpisodeContext, reflection: str | None) -> EpisodeContext:
    """The context an LLM policy reads on a retry: the reflection follows the instruction in the
    prompt's task (GuidNav §3.3: "added to the next attempt's input, together with the original
    instruction")."""
    if not reflection:
        return context
    return replace(
        context, instruction=f"{context.instruction}\n\nReflection on your previous failed attempt: {reflection}"
    )


@dataclass
class LLMProposer:
    """N answers of an LLM policy: the first greedy, the others sampled at ``temperature``."""

    policy: HFPolicy | EndpointPolicy
    temperature: float = 1.0

    @property
    def policy_id(self) -> str:
        return self.policy.policy_id

    def start(self, context: EpisodeContext, reflection: str | None = None) -> EpisodeProposer:
        return _LLMEpisode(self, context, with_reflection(context, reflection))


class _LLMEpisode:
    def __init__(self, owner: LLMProposer, context: EpisodeContext, prompt_context: EpisodeContext) -> None:
        self.owner, self.context, self.prompt_context = owner, context, prompt_context
        self.key = context.episode_id or f"{context.task.task_id}:{context.seed}"
        self.history: list[HistoryEntry] = []

    def _answer(self, j: int, screen: Screen) -> tuple[ParsedAction | ParseFailure, float]:
        policy = self.owner.policy
        if isinstance(policy, HFPolicy):
            if j == 0:
                variant = replace(policy, greedy=True, record=False)
            else:
                t = self.owner.temperature
                variant = replace(policy, greedy=False, temperature=t, seed=policy.seed + j, record=False)
            turn, parsed = variant.decide(self.prompt_context, self.key, screen, self.history)
            return parsed, float(np.sum(turn.logp))
        endpoint = replace(policy, temperature=0.0 if j == 0 else self.owner.temperature, record=False)
        _, parsed = endpoint.decide(self.prompt_context, screen, self.history)
        return parsed, float("nan")

    def propose(self, screen: Screen, n: int, banned: Collection[str] = ()) -> ProposalSet:
        if n < 1:
            raise GuidanceError(f"N must be at least 1, got {n}")
        started = time.perf_counter()
        seen: dict[str, Proposal] = {}
        failures = 0
        reasons: list[str] = []
        for j in range(n):
            parsed, prior = self._answer(j, screen)
            if isinstance(parsed, ParseFailure):
                failures += 1
                reasons.append(parsed.reason)
                continue
            text = parsed.action.canonical_text()
            if text in seen or text in banned:
                continue
            seen[text] = Proposal(parsed.action, describe_action(parsed.action, screen), prior, len(seen), parsed.call)
        proposals = tuple(seen.values())
        if not proposals:  # no answer parsed: the step waits, as the plain LLM policy does
            wait = Action(ActionType.NOTHING, detail=f"format: {reasons[0] if reasons else 'banned'}")
            proposals = (Proposal(wait, "NOTHING", float("nan"), 0, ""),)
        return ProposalSet(proposals, time.perf_counter() - started, n, failures)

    def commit(self, proposal: Proposal) -> None:
        detail = proposal.action.detail or ""
        if detail.startswith("format: "):
            self.history.append(HistoryEntry(proposal.action, format_failure=detail[len("format: ") :]))
        else:
            self.history.append(HistoryEntry(proposal.action))

    def observe(self, action: Action, result: StepResult) -> None:
        last = self.history[-1] if self.history else None
        if last is not None and result.problem is not None and last.format_failure is None:
            self.history[-1] = HistoryEntry(last.action, problem=result.problem)


def proposal_texts(proposals: Sequence[Proposal]) -> list[str]:
    """The candidates as reward models read them, in the policy's order."""
    return [p.description for p in proposals]
