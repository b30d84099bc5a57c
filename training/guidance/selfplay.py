"""A step verifier trained the GuidNav way: demonstrated actions as positives, the policy's own
other candidates at the same states as negatives (GuidNav §3.1: human demonstrations with reward 1,
and "self-play" actions in a static environment labelled correct only when their type and
operation match the ground truth, App. A.1).

The project's ``prm`` learns from executed steps only (a successful episode's steps are positive,
the steps of a failed one after its last progress negative): it has seldom seen the alternatives a
policy weighs at one state, and so ranks them poorly (see docs/guidance.md). Here every
demonstrated state of a successful episode gives one positive, the demonstrated action, and up to
``negatives`` negatives: the candidates the policy ranks highest among those that do not do what
the demonstrator did (hard negatives; random ones without a policy). Alternative actions that would
also have been right (another order of ticking boxes) are labelled negative, as in GuidNav.

The rows have ``rm_examples``' schema (kind ``prm``), so ``training.train`` trains them as any PRM.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from envs.protocol import EpisodeContext
from envs.tasks import TaskSpec
from training.guidance.proposals import describe_action, rank_candidates
from training.guidance.verifiers import same_action
from training.policy.learned import PolicyModel, StepDecision
from training.rm_datasets import screen_lines
from warehouse.model import ActionType
from warehouse.trajectories import Trajectory


@dataclass
class SelfPlayStats:
    episodes: int = 0
    states: int = 0
    unmatched: int = 0  # demonstrated actions no candidate does (left out)
    positives: int = 0
    negatives: int = 0


def _split(episode_id: str, validation_share: float) -> str:
    digest = hashlib.sha256(f"selfplay|{episode_id}".encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "big") / 2**64 < validation_share else "train"


def selfplay_examples(
    trajectories: Iterable[Trajectory],
    specs: Mapping[str, TaskSpec],
    max_steps: Mapping[str, int],
    *,
    model: PolicyModel | None = None,
    negatives: int = 3,
    validation_share: float = 0.1,
    seed: int = 0,
) -> tuple[list[dict], SelfPlayStats]:
    """``rm_examples`` rows (kind ``prm``): per demonstrated state of a successful trajectory, the
    demonstrated action (label 1) and ``negatives`` other candidates (label 0), the policy's most
    probable ones when ``model`` is given."""
    rng = random.Random(seed)
    rows: list[dict] = []
    stats = SelfPlayStats()
    for t in trajectories:
        spec = specs.get(t.task_id)
        if spec is None or not t.success:
            continue
        slots = spec.slots(t.instruction, {k: str(v) for k, v in (t.fields or {}).items()})
        if slots is None:
            continue
        stats.episodes += 1
        context = EpisodeContext(
            spec,
            t.instruction,
            slots,
            0,
            spec.backend,
            frozenset(ActionType),
            max_steps.get(t.task_id, 12),
            t.episode_id,
        )
        split = _split(t.episode_id, validation_share)
        history: list[str] = []
        for i, (screen, action) in enumerate(zip(t.screens, t.actions, strict=True)):
            stats.states += 1
            described = describe_action(action, screen)
            if model is not None:
                with torch.inference_mode():
                    candidates, instruction, hist, cache_rows = model.state_rows(screen, context, t.actions[:i], i)
                    features = np.array([c.features for c in candidates], dtype=np.float32)
                    logp = model.log_probs(model.batch([StepDecision(instruction, hist, cache_rows, features, 0, 0.0)]))
                order = rank_candidates(logp.numpy(), len(candidates)) if candidates else []
            else:
                from training.policy.candidates import enumerate_candidates

                candidates = enumerate_candidates(
                    screen, t.instruction, slots, t.actions[:i], step_index=i, max_steps=context.max_steps
                )
                order = list(range(len(candidates)))
                rng.shuffle(order)
            if not any(same_action(c.action, action) for c in candidates):
                stats.unmatched += 1
                history.append(described)
                continue
            others = [candidates[j] for j in order if not same_action(candidates[j].action, action)][:negatives]
            lines = list(screen_lines(screen))
            for label, text in [(1.0, described), *((0.0, describe_action(c.action, screen)) for c in others)]:
                rows.append(
                    {
                        "example_id": f"selfplay:{t.episode_id}:{i}:{len(rows)}",
                        "kind": "prm",
                        "split": split,
                        "episode_id": t.episode_id,
                        "task_id": t.task_id,
                        "goal_key": None,
                        "step_idx": i,
                        "n_steps": t.n_steps,
                        "instruction": t.instruction,
                        "history": list(history),
                        "screen_lines": lines,
                        "action": text,
                        "prompt": None,
                        "label": label,
                        "label_source": "selfplay:demonstrated" if label else "selfplay:policy_candidate",
                        "label_version": "selfplay-1",
                        "is_key_step": None,
                        "episode_success": True,
                    }
                )
                stats.positives += int(label)
                stats.negatives += int(not label)
            history.append(described)
    return rows, stats
