"""ADMIRE's adaptive milestone reward (§3, Alg. 1; defaults from its App. A).

Phase 1, milestones per task (§3.1, Eqs. 6-7): the first successful trajectory of a task gives its
milestones; a later successful trajectory that reaches the goal along a more minimal path (fewer
essential steps) refines them; otherwise they stay. The paper distils milestones with an LLM
(prompts P_init / P_update); with an OpenAI-compatible endpoint configured we do the same, and
without one they are derived from the trajectory itself: its essential steps (garbage steps and
repeats removed, as the improved LCS mode does) written as instruction-relative action texts.

Phase 2, rewards (§3.2, Eqs. 8-11): each action description is compared with the next unreached
milestone by Sentence-BERT cosine similarity (MiniLM); above ``delta`` it counts as reached, pays
the similarity, and the pointer moves on (in order, no skipping). Successful episodes keep only
those matches (Eq. 10, denoising); failed ones also get the share of milestones reached so far at
every step, k/K, plus ``zeta`` times the match (Eq. 11, scaffolding; k is the running count, as in
Alg. 1). The step's total (Alg. 1, line 34) is

    R_total(t) = R_outcome + eta * R_format(t) + lambda_0 * gamma^E * R_mil(t)

with E the training iteration, so the dense term fades as training goes on. The paper leaves
open a task with no milestones yet (we pay no milestone reward) and pointers past the last
milestone (we stop matching there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from annotation.progress.instruction_relative import clean_trajectory
from envs.protocol import EpisodeRecord
from training.base.encoder import EmbeddingCache
from training.base.states import action_in_context, target_context
from training.llm.chat_client import ChatClient, ChatEndpointError
from training.policy.candidates import instruction_values, relative_instruction, relative_text
from training.policy.rollouts import Rollout
from training.rl.rewards.base import RewardBatch, outcome
from training.rl.rewards.prm import format_rewards
from warehouse.catalog import LineageInput


@dataclass(frozen=True)
class AdmireSettings:
    """ADMIRE App. A.1.2 values."""

    delta: float = 0.75  # Sentence-BERT match threshold (Eq. 9)
    zeta: float = 0.5  # weight of a match in a failed trajectory (Eq. 11)
    eta: float = 0.5  # weight of the format reward (Alg. 1, line 34)
    lambda_0: float = 0.3  # initial weight of the milestone reward
    gamma: float = 0.99  # its decay per training iteration: lambda = lambda_0 * gamma^E


def action_descriptions(record: EpisodeRecord) -> list[str]:
    """Each action as an instruction-relative text (what milestones are written in)."""
    values = instruction_values(record.instruction, record.slots)
    out = []
    for step in record.steps:
        records = [e.to_dict() for e in step.screen.elements]
        ref = step.action.target.ref if step.action.target is not None else None
        text = action_in_context(step.action.canonical_text(), target_context(records, ref))
        out.append(relative_text(text, values))
    return out


def essential_steps(record: EpisodeRecord) -> list[int]:
    """The steps of a trajectory that matter: garbage (undone or effectless) steps and repeats removed."""
    actions = [s.action for s in record.steps]
    screens = [s.screen for s in record.steps]
    return list(clean_trajectory(actions, screens, record.instruction).kept_step_indices)


class MilestoneGenerator(Protocol):
    """Φ of Eqs. 6-7: milestones from a successful trajectory, and their refinement."""

    source: str

    def initial(self, task: str, instruction: str, descriptions: Sequence[str]) -> list[str]: ...

    def refine(
        self, task: str, instruction: str, existing: Sequence[str], descriptions: Sequence[str]
    ) -> list[str]: ...


class TrajectoryMilestones:
    """Without an LLM: the essential steps' descriptions are the milestones; a refinement takes the
    new trajectory's when it has fewer of them (a more minimal path), else keeps the old."""

    source = "trajectory"

    def initial(self, task: str, instruction: str, descriptions: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(descriptions))

    def refine(self, task: str, instruction: str, existing: Sequence[str], descriptions: Sequence[str]) -> list[str]:
        proposed = list(dict.fromkeys(descriptions))
        return proposed if 0 < len(proposed) < len(existing) else list(existing)


_INIT_PROMPT = (
    "You will be given a successfully completed GUI task: its goal and the sequence of action "
    "descriptions that completed it (they may include redundant steps). Identify only the essential "
    "steps and distil them into a short list of milestones: logically distinct stages of progress, "
    "clear, non-overlapping, each starting with an action verb. Keep placeholders such as <username> "
    "as they are. Answer with a strict JSON array of strings and nothing else.\n"
    "Task: {task}\nInstruction: {instruction}\nAction descriptions: {actions}"
)
_UPDATE_PROMPT = (
    "You refine the milestones of a GUI task. Given the existing milestones and the action "
    "descriptions of a newly observed successful trajectory, keep the milestones unless the new "
    "trajectory clearly shows a more minimal or precise path; then return the improved milestones. "
    "Keep placeholders such as <username>. Answer with a strict JSON array of strings and nothing else.\n"
    "Task: {task}\nInstruction: {instruction}\nExisting milestones: {milestones}\nAction descriptions: {actions}"
)


def parse_milestones(text: str) -> list[str] | None:
    """The milestones in an answer to P_init / P_update: the first JSON list of non-empty strings
    in the text (stripped; prose or code fences around it are ignored), else None (the caller
    falls back, §3.1)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\[", text):
        try:
            items, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(items, list) and items and all(isinstance(i, str) and i.strip() for i in items):
            return [i.strip() for i in items]
    return None


class LLMMilestones:
    """Φ as the paper has it: an LLM distils (Eq. 6) and refines (Eq. 7) milestones, with prompts
    after ADMIRE's P_init / P_update. An answer that is not a JSON list of strings, or a failing
    endpoint, falls back to :class:`TrajectoryMilestones` (counted in ``fallbacks``; the last raw
    answer is kept in ``last_answer``, None after an endpoint failure)."""

    source = "llm"

    def __init__(self, client: ChatClient, max_tokens: int = 400) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.fallback = TrajectoryMilestones()
        self.fallbacks = 0
        self.last_answer: str | None = None

    def check(self) -> None:
        """One tiny completion, before any rollout: raises ``ChatEndpointError`` (one line) when the
        endpoint is down or refuses, which would otherwise only show as fallbacks."""
        self.client.complete([{"role": "user", "content": "Say OK."}], max_tokens=2)

    def _ask(self, prompt: str) -> list[str] | None:
        self.last_answer = None
        try:
            self.last_answer = self.client.complete([{"role": "user", "content": prompt}], max_tokens=self.max_tokens)
        except ChatEndpointError:
            return None
        return parse_milestones(self.last_answer)

    def initial(self, task: str, instruction: str, descriptions: Sequence[str]) -> list[str]:
        prompt = _INIT_PROMPT.format(task=task, instruction=instruction, actions=json.dumps(list(descriptions)))
        found = self._ask(prompt)
        if found is None:
            self.fallbacks += 1
            return self.fallback.initial(task, instruction, descriptions)
        return found

    def refine(self, task: str, instruction: str, existing: Sequence[str], descriptions: Sequence[str]) -> list[str]:
        prompt = _UPDATE_PROMPT.format(
            task=task,
            instruction=instruction,
            milestones=json.dumps(list(existing)),
            actions=json.dumps(list(descriptions)),
        )
        found = self._ask(prompt)
        if found is None:
            self.fallbacks += 1
            return self.fallback.refine(task, instruction, existing, descriptions)
        return found


@dataclass
class TaskMilestones:
    """One task's milestones and the trajectory they came from."""

    milestones: list[str]
    exemplar: str  # episode id
    exemplar_steps: int  # essential steps of the exemplar
    version: int = 1


@dataclass
class MilestoneStore:
    """Milestones per task, updated from each batch's successes before its rewards (Alg. 1, Phase 1)."""

    generator: MilestoneGenerator = field(default_factory=TrajectoryMilestones)
    tasks: dict[str, TaskMilestones] = field(default_factory=dict)

    def update(self, rollouts: Sequence[Rollout]) -> list[str]:
        """Initialise or refine the milestones of every task with a success in the batch; returns the
        tasks whose milestones changed. The superior trajectory of a task is its success with the
        fewest essential steps (the paper does not say how it picks one)."""
        best: dict[str, tuple[int, EpisodeRecord, list[int]]] = {}
        for r in rollouts:
            if not r.record.success:
                continue
            kept = essential_steps(r.record)
            current = best.get(r.record.task_id)
            if kept and (current is None or len(kept) < current[0]):
                best[r.record.task_id] = (len(kept), r.record, kept)
        changed = []
        for task, (n, record, kept) in sorted(best.items()):
            descriptions = action_descriptions(record)
            essential = [descriptions[i] for i in kept]
            instruction = relative_instruction(record.instruction, record.slots)
            known = self.tasks.get(task)
            if known is None:
                milestones = self.generator.initial(task, instruction, essential)
                self.tasks[task] = TaskMilestones(milestones, record.episode_id, n)
                changed.append(task)
            elif n < known.exemplar_steps:
                milestones = self.generator.refine(task, instruction, known.milestones, essential)
                if milestones != known.milestones:
                    self.tasks[task] = TaskMilestones(milestones, record.episode_id, n, known.version + 1)
                    changed.append(task)
        return changed

    def to_json(self) -> dict:
        return {
            t: {"milestones": m.milestones, "exemplar": m.exemplar, "version": m.version} for t, m in self.tasks.items()
        }


def match_milestones(similarities: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 8-9 with the in-order pointer. ``similarities`` is (T, K): cosine of each action with each
    milestone. Returns (r_mil per step: the similarity when the step reaches the pointed-to milestone,
    else 0; the running count k of milestones reached after each step)."""
    n_steps, n_milestones = similarities.shape
    reward = np.zeros(n_steps)
    reached = np.zeros(n_steps, dtype=np.int64)
    pointer = 0
    for t in range(n_steps):
        if pointer < n_milestones and similarities[t, pointer] > delta:
            reward[t] = similarities[t, pointer]
            pointer += 1
        reached[t] = pointer
    return reward, reached


def milestone_credit(
    r_mil: np.ndarray, reached: np.ndarray, n_milestones: int, success: bool, zeta: float
) -> np.ndarray:
    """Asymmetric credit (Eqs. 10-11): a success keeps its matches only; a failure gets k/K at every
    step plus zeta times its matches."""
    if n_milestones == 0:
        return np.zeros_like(r_mil)
    if success:
        return r_mil.copy()
    return reached / n_milestones + zeta * r_mil


class AdmireReward:
    """ADMIRE's total step reward (Alg. 1); milestones live in ``store`` across iterations."""

    name = "admire"

    def __init__(
        self,
        cache: EmbeddingCache,
        *,
        settings: AdmireSettings | None = None,
        store: MilestoneStore | None = None,
        outcome_every_step: bool = True,
    ) -> None:
        self.cache = cache
        self.settings = settings or AdmireSettings()
        self.store = store or MilestoneStore()
        # ADMIRE's step-level GRPO pays the outcome at every step (its advantages read immediate
        # rewards); estimators that sum discounted returns take it once, at the last step.
        self.outcome_every_step = outcome_every_step

    def similarities(self, actions: Sequence[str], milestones: Sequence[str]) -> np.ndarray:
        """Cosine similarity (Eq. 8) of every action with every milestone, (T, K)."""
        if not actions or not milestones:
            return np.zeros((len(actions), len(milestones)))
        rows = self.cache.indices([*actions, *milestones])
        vectors = self.cache.matrix[rows]
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit = vectors / np.maximum(norms, 1e-12)
        return unit[: len(actions)] @ unit[len(actions) :].T

    def rewards(self, rollouts: Sequence[Rollout], iteration: int) -> RewardBatch:
        changed = self.store.update(rollouts)  # Phase 1 before Phase 2, as in Alg. 1
        s = self.settings
        weight = s.lambda_0 * s.gamma**iteration
        out, hits = [], []
        for r in rollouts:
            task = self.store.tasks.get(r.record.task_id)
            milestones = task.milestones if task is not None else []
            descriptions = list(r.descriptions) or action_descriptions(r.record)
            r_mil, reached = match_milestones(self.similarities(descriptions, milestones), s.delta)
            credit = milestone_credit(r_mil, reached, len(milestones), r.record.success, s.zeta)
            paid = np.full(r.n_steps, outcome(r.record))
            if not self.outcome_every_step and r.n_steps:
                paid[:-1] = 0.0
            out.append(paid + s.eta * format_rewards(r) + weight * credit)
            if milestones:
                hits.append(float(reached[-1]) / len(milestones) if len(reached) else 0.0)
        return RewardBatch(
            out,
            {
                "milestone_weight": weight,
                "tasks_with_milestones": float(len(self.store.tasks)),
                "milestones_changed": float(len(changed)),
                "milestone_fallbacks": float(getattr(self.store.generator, "fallbacks", 0)),
                "mean_milestones_reached": float(np.mean(hits)) if hits else 0.0,
            },
        )

    def lineage(self) -> list[LineageInput]:
        return []
