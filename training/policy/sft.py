"""Supervised fine-tuning of the learned policy on successful trajectories (ProgRM §3.1: the actor
is SFT-initialised on samples from successful trajectories before RL).

Every step of a successful human demonstration or rollout becomes a decision: the candidates the
policy would enumerate on the recorded screen, and which of them the demonstrator took. A step
whose action is not among the candidates (a click on an element the policy does not consider
clickable, text the instruction does not name) is left out and counted by reason. Training
minimises the cross-entropy of the demonstrated candidate (``-log pi(a_t | s_t)``) with Adam;
the weights with the lowest loss on held-out episodes are kept.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from envs.protocol import EpisodeContext
from envs.tasks import TaskSpec, spec_for
from training.policy.candidates import Candidate
from training.policy.learned import PolicyModel, StepDecision
from warehouse.model import Action, ActionType
from warehouse.trajectories import Trajectory

Log = Callable[[str], None]


@dataclass(frozen=True)
class SFTSettings:
    """How SFT runs (defaults sized for this 2-core CPU)."""

    epochs: int = 12
    learning_rate: float = 1e-3
    batch_size: int = 64
    validation_share: float = 0.1
    patience: int = 3  # epochs without a lower validation loss before stopping
    seed: int = 0
    threads: int = 2


@dataclass
class SFTData:
    """Decisions of the demonstrations, split by episode, and what could not be used."""

    train: list[StepDecision] = field(default_factory=list)
    validation: list[StepDecision] = field(default_factory=list)
    episodes: int = 0
    steps: int = 0
    unmatched: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)

    @property
    def matched_share(self) -> float:
        used = len(self.train) + len(self.validation)
        return used / self.steps if self.steps else 0.0


@dataclass
class SFTResult:
    """Per-epoch figures and the epoch whose weights were kept."""

    train_loss: list[float] = field(default_factory=list)
    validation_loss: list[float] = field(default_factory=list)
    validation_accuracy: list[float] = field(default_factory=list)
    best_epoch: int = -1
    seconds: float = 0.0


def matching_candidate(action: Action, candidates: Sequence[Candidate]) -> int | None:
    """The index of the candidate that does what ``action`` did, or None."""
    for i, candidate in enumerate(candidates):
        c = candidate.action
        if c.type is not action.type:
            continue
        if action.type in (ActionType.CLICK, ActionType.INPUT):
            if c.target is None or action.target is None or c.target.ref != action.target.ref:
                continue
            if action.type is ActionType.INPUT and (c.text or "") != (action.text or ""):
                continue
            return i
        if action.type is ActionType.PRESS_KEY and (c.text or "").casefold() == (action.text or "").casefold():
            return i
        if action.type is ActionType.SCROLL and c.direction == action.direction:
            return i
        if action.type is ActionType.NOTHING:
            return i
    return None


def _unmatched_reason(action: Action) -> str:
    if action.type is ActionType.INPUT:
        return "INPUT of text the instruction does not name, or into a field not offered"
    if action.type in (ActionType.CLICK, ActionType.LONG_CLICK):
        return f"{action.type.value} on an element not offered as clickable"
    return f"{action.type.value} is not a candidate action"


def _validation_episode(episode_id: str, share: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}|{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def demonstration_decisions(
    model: PolicyModel,
    trajectories: Iterable[Trajectory],
    specs: Mapping[str, TaskSpec],
    step_budgets: Mapping[str, int],
    *,
    validation_share: float = 0.1,
    seed: int = 0,
    log: Log | None = None,
    log_every_s: float = 30.0,
) -> SFTData:
    """The decisions of successful ``trajectories`` of tasks with a spec (instruction slots come
    from the spec's template), split into train and validation by episode; ``step_budgets`` holds each
    task's episode step budget (a task without one: 12 or its length). ``log`` hears how far
    it is every ``log_every_s`` seconds (a terminal also gets a progress bar)."""
    data = SFTData()
    trajectories = list(trajectories)
    last_said = time.monotonic()
    # minutes on a cold encoder cache (every screen's candidates are encoded): show it, also in
    # Dagster's log, where stderr is no terminal and tqdm stays silent
    for done, t in enumerate(tqdm(trajectories, desc="SFT decisions", unit="episode", disable=None)):
        if log is not None and done and time.monotonic() - last_said >= log_every_s:
            log(f"SFT decisions: {done}/{len(trajectories)} episodes, {data.steps} steps encoded")
            last_said = time.monotonic()
        spec = spec_for(specs, t.task_id, t.fields)
        if spec is None or not t.success:
            continue
        slots = spec.slots(t.instruction, t.fields) or {}
        context = EpisodeContext(
            task=spec,
            instruction=t.instruction,
            slots=slots,
            seed=0,
            backend=spec.backend,
            supported_actions=frozenset(ActionType),
            max_steps=step_budgets.get(t.task_id, max(12, t.n_steps)),
            episode_id=t.episode_id,
        )
        data.episodes += 1
        target = data.validation if _validation_episode(t.episode_id, validation_share, seed) else data.train
        for i, (screen, action) in enumerate(zip(t.screens, t.actions, strict=True)):
            data.steps += 1
            candidates, instruction, history, rows = model.state_rows(screen, context, t.actions[:i], i)
            chosen = matching_candidate(action, candidates)
            if chosen is None:
                data.unmatched[_unmatched_reason(action)] += 1
                continue
            features = np.array([c.features for c in candidates], dtype=np.float32)
            target.append(StepDecision(instruction, history, rows, features, chosen, 0.0))
            data.tasks[t.task_id] += 1
    return data


def _mean_loss(model: PolicyModel, decisions: Sequence[StepDecision], batch_size: int) -> tuple[float, float]:
    """(mean -log pi of the demonstrated actions, share where it is the top candidate)."""
    if not decisions:
        return float("nan"), float("nan")
    losses, correct = [], 0
    with torch.inference_mode():
        for start in range(0, len(decisions), batch_size * 4):
            chunk = decisions[start : start + batch_size * 4]
            batch = model.batch(chunk)
            logp = model.log_probs(batch)
            losses.append(-logp[batch.chosen].sum().item())
            best = torch.full((batch.n_states,), float("-inf")).scatter_reduce(
                0, batch.state_index, logp, reduce="amax", include_self=True
            )
            correct += int((logp[batch.chosen] >= best - 1e-6).sum())
    return sum(losses) / len(decisions), correct / len(decisions)


def train_sft(model: PolicyModel, data: SFTData, settings: SFTSettings, log: Log = print) -> SFTResult:
    """Cross-entropy training of the scorer on ``data.train``; keeps the weights of the epoch with
    the lowest validation loss (early stopping after ``patience`` epochs without improvement)."""
    if not data.train:
        raise ValueError("no demonstrated step matches a candidate action: nothing to train on")
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    optimizer = torch.optim.Adam(model.scorer.parameters(), lr=settings.learning_rate)
    result = SFTResult()
    best_loss, best_state, waited = float("inf"), None, 0
    started = time.perf_counter()
    for epoch in range(settings.epochs):
        model.scorer.train()
        order = list(range(len(data.train)))
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), settings.batch_size):
            chunk = [data.train[i] for i in order[start : start + settings.batch_size]]
            batch = model.batch(chunk)
            loss = -model.log_probs(batch)[batch.chosen].mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(chunk)
        model.scorer.eval()
        validation = data.validation or data.train
        val_loss, val_acc = _mean_loss(model, validation, settings.batch_size)
        result.train_loss.append(total / len(data.train))
        result.validation_loss.append(val_loss)
        result.validation_accuracy.append(val_acc)
        log(
            f"SFT epoch {epoch + 1}/{settings.epochs}: train loss {total / len(data.train):.4f}, "
            f"validation loss {val_loss:.4f}, validation accuracy {val_acc:.3f}"
        )
        if val_loss < best_loss - 1e-6:
            best_loss, waited, result.best_epoch = val_loss, 0, epoch
            best_state = {k: v.detach().clone() for k, v in model.scorer.state_dict().items()}
        else:
            waited += 1
            if waited >= settings.patience:
                log(f"SFT: validation loss has not fallen for {waited} epochs; stopping")
                break
    if best_state is not None:
        model.scorer.load_state_dict(best_state)
    model.scorer.eval()
    result.seconds = time.perf_counter() - started
    return result
