"""How far one fixed answer gets on a task: a solved instance's actions carried out, unchanged, on
other instances of the same task.

An RL run can leave a sparse task's floor without learning it, by repeating one constant answer
that some instances ask for (use-spinner: the arrow clicked a fixed number of times, then Submit;
the RL report's constant-answer alarm finds it afterwards). How often a constant solves the task
is a property of the task, measurable before any run: take the scripted expert's solution of a
*source* instance and carry it out on *target* instances. Each action's element is found on the
target's screen by its description (role, id or classes, and text: ``UIElement.describe``), the
element a policy that ignores the instruction would pick; typed text is typed unchanged. An action
whose element is not on the screen ends the attempt (the answer does not fit this instance).

The *constant-answer rate* of a task is the best source's share of targets solved (the constant an
RL run could settle on), with the mean over sources beside it (a constant picked at random).
``scripts/constant_answers.py --write`` records it per task in :data:`CONSTANT_ANSWERS_FILE`, which
the sparse block's rule reads (``training.policy.task_blocks``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envs.pool_jobs import EpisodeJob
from envs.protocol import Actor, EpisodeContext, EpisodeRecord, StatelessSnapshot, StepResult
from warehouse.model import Action, ActionType, Screen
from warehouse.storage import write_atomic

#: The measured constant-answer rates of the MiniWoB++ tasks, beside their specs (not in them: a
#: spec's digest versions its labels, and a measurement is not part of the task).
CONSTANT_ANSWERS_FILE = Path(__file__).parent / "task_specs" / "miniwob" / "constant_answers.json"


def transplant(action: Action, screen: Screen) -> Action | None:
    """``action`` on ``screen``: its target replaced by the first element there with the same
    description (None: no such element, the answer does not fit); untargeted actions unchanged."""
    if action.target is None:
        return action
    wanted = action.target.describe()
    for element in screen.elements:
        if element.describe() == wanted:
            return replace(action, target=element)
    return None


def fixed_answer_jobs(source: EpisodeJob, answer_length: int, targets: Sequence[EpisodeJob]) -> list[EpisodeJob]:
    """The target instances as jobs of their own for one source's answer: ids naming the source,
    and a step budget of the answer's length plus one (an answer that did not end the episode has
    failed; the extra step lets a last action's effect be seen)."""
    return [
        replace(
            target,
            episode_id=f"fixed-answer:{source.task.task_id}:{source.seed}:{target.seed}",
            max_steps=answer_length + 1,
        )
        for target in targets
        if target.seed != source.seed
    ]


def fixed_answer_batch(
    solved: Sequence[tuple[EpisodeJob, EpisodeRecord]], targets: Sequence[EpisodeJob]
) -> tuple[list[EpisodeJob], dict[str, tuple[Action, ...]], dict[str, tuple[EpisodeJob, EpisodeRecord]]]:
    """Every solved source's answer on the targets of its task: the jobs (:func:`fixed_answer_jobs`),
    each job's answer (what :class:`FixedAnswerPolicy` carries out) and each job's source (its job
    and solved episode), by job id."""
    jobs: list[EpisodeJob] = []
    answers: dict[str, tuple[Action, ...]] = {}
    sources: dict[str, tuple[EpisodeJob, EpisodeRecord]] = {}
    for source, record in solved:
        answer = tuple(step.action for step in record.steps)
        mine = fixed_answer_jobs(source, len(answer), [t for t in targets if t.task.task_id == source.task.task_id])
        answers |= dict.fromkeys((j.episode_id for j in mine), answer)
        sources |= dict.fromkeys((j.episode_id for j in mine), (source, record))
        jobs += mine
    return jobs, answers, sources


@dataclass(frozen=True)
class FixedAnswerPolicy:
    """Carries out each episode's assigned answer (:func:`transplant`), then does nothing."""

    answers: Mapping[str, tuple[Action, ...]]
    policy_id: str = "fixed-answer"

    def start(self, context: EpisodeContext) -> Actor:
        return _FixedAnswer(self.answers[context.episode_id])

    def portable(self) -> StatelessSnapshot:  # the answers are plain data: episodes can run whole on a node
        return StatelessSnapshot(self)

    def absorb(self, episode_id: str, output: Any) -> None:
        pass


class _FixedAnswer:
    def __init__(self, answer: tuple[Action, ...]) -> None:
        self.answer, self.index, self.stuck = answer, 0, False

    def act(self, screen: Screen) -> Action:
        if self.stuck or self.index >= len(self.answer):
            return Action(ActionType.NOTHING)
        action = transplant(self.answer[self.index], screen)
        self.index += 1
        if action is None:
            self.stuck = True
            return Action(ActionType.NOTHING, detail="the fixed answer's element is not on this screen")
        return action

    def observe(self, action: Action, result: StepResult) -> None:
        pass


def constant_answer_rate(solved: Mapping[int, Sequence[bool]]) -> dict[str, Any]:
    """Per source seed the targets its answer solved: the best source's share (the constant an RL
    run could settle on), the mean share over sources, and the best source."""
    shares = {source: sum(outcomes) / len(outcomes) for source, outcomes in solved.items() if outcomes}
    if not shares:
        return {"best": None, "mean": None, "best_source": None, "sources": 0, "targets": 0}
    best = max(sorted(shares), key=lambda s: shares[s])
    return {
        "best": shares[best],
        "mean": sum(shares.values()) / len(shares),
        "best_source": best,
        "sources": len(shares),
        "targets": max(len(o) for o in solved.values()),
    }


def load_constant_answer_rates(path: Path = CONSTANT_ANSWERS_FILE) -> dict[str, float]:
    """Each measured task's best fixed answer's share of instances solved; tasks the measurement
    could not rate (no scripted solution, or the expert solved no source) are left out, as is
    everything without the file. A malformed file is a ValueError naming it and the task."""
    if not path.exists():
        return {}
    try:
        tasks = json.loads(path.read_text())["tasks"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a constant-answer file ({exc})") from None
    if not isinstance(tasks, dict):
        raise ValueError(f"{path}: 'tasks' must map task ids to their measurements, got {type(tasks).__name__}")
    rates = {}
    for task_id, entry in tasks.items():
        if not isinstance(entry, dict) or "best" not in entry:
            raise ValueError(f"{path}: task {task_id!r}: no 'best' (null where it could not be measured)")
        best = entry["best"]
        if best is None:
            continue
        if isinstance(best, bool) or not isinstance(best, int | float) or not 0.0 <= best <= 1.0:
            raise ValueError(f"{path}: task {task_id!r}: 'best' must be a share in [0, 1], got {best!r}")
        rates[task_id] = float(best)
    return rates


def write_constant_answer_rates(measured: Mapping[str, Mapping[str, Any]], path: Path = CONSTANT_ANSWERS_FILE) -> Path:
    """Merge ``measured`` (per task: best, mean, sources, targets, ...) into the file, atomically:
    tasks measured before and not now keep their entries."""
    existing = json.loads(path.read_text())["tasks"] if path.exists() else {}
    document = {
        "about": "The best fixed answer's share of a task's instances solved (envs.fixed_answer; "
        "written by scripts/constant_answers.py --write). The sparse block leaves out tasks at or above "
        "training.policy.task_blocks.MAX_CONSTANT_SHARE; best null: not measurable (no scripted solution, "
        "or the expert solved no source).",
        "tasks": dict(sorted((existing | dict(measured)).items())),
    }
    return write_atomic(path, json.dumps(document, indent=1) + "\n")
