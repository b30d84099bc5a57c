"""A corpus at ProgRM's scale (App. C), derived from the real MiniWoB++ human demonstrations.

ProgRM labels 10,438 trajectories (5,729 successful, 4,709 failed) of 207,102 steps (79,718 in
successful ones, 127,384 in failed ones) over 577 WikiHow tasks. The shared demonstrations are
smaller (8,611 episodes, ~34k steps, 51 tasks, ~4 steps an episode), so the benchmark corpus is
derived from them, keeping every action, screen and instruction a real recording:

* **Tasks.** Each of the 51 real tasks is cloned into 11 or 12 *variants* (577 in all; the tasks
  with the most recordings get the 12th). Variant 0 is the task as recorded; in variant k > 0
  every word (maximal run of ASCII letters) of the instructions, of the acted-on elements' texts,
  ids, classes and descriptions, of typed texts, and of the screens' ``label`` elements, is
  replaced through a bijection of the corpus vocabulary drawn for that variant. The bijection
  maps a word to a word of the same length and keeps each letter's case, so texts keep their
  shape, tokens count and structure (what the instruction names is still named: the improved
  mode's instruction-relative rewriting sees the same relations), while variants share no
  vocabulary: every variant's typed texts are new strings for SBERT. Digits, punctuation,
  element roles and key names (PRESS_KEY) are kept; so are words that the improved mode treats
  specially (transient state classes such as ``hover``), which are also kept out of the range of
  the bijection, and ids ending in digits stay generated ids. Screens are only read through
  equality of their signatures (garbage detection) and through label texts (a checkbox is known
  by its label), so only their ``label`` elements are renamed; the renaming is a bijection on a
  content-determined set of elements, so every equality between screens is preserved.
* **Trajectories.** A trajectory is a run of consecutive recordings of its task (in episode-id
  order, from a random start, wrapping around), played back to back, with the instructions
  joined: one session doing several instances of the task in a row. The 10,438 trajectories are
  spread over the 577 tasks at random (multinomial), with per-task success rates drawn from a
  Beta distribution (so some tasks have zero or one success, as in a real corpus) and exactly
  5,729 successes in all.
* **Outcome.** A *successful* trajectory is a run of recordings that all succeeded
  (success = success of all parts). A *failed* trajectory is a run of recordings of any outcome
  whose last part is abandoned: cut before its final step (possibly before its first one, in
  which case its instruction is in the trajectory but none of its steps). Cutting lets failed
  trajectories have any length, so the step total is matched exactly.
* **Lengths.** Target lengths are drawn (gamma, shape 2) around the remaining budget per
  remaining trajectory of each outcome, so the corpus lands on the paper's means (13.9 steps for
  successes, 27.1 for failures): successes take the number of whole recordings that comes
  closest to their target, failures are cut to theirs exactly; the failures' budget absorbs the
  successes' rounding, so the corpus has exactly 207,102 steps.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.trajectories import Trajectory

PAPER_TASKS = 577
PAPER_TRAJECTORIES = 10_438
PAPER_SUCCESSES = 5_729
PAPER_STEPS = 207_102
PAPER_SUCCESS_STEPS = 79_718

DEMOS_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "miniwob-demos"
REAL_EPISODES = "e.source = 'human_demo' AND e.task_family = 'miniwob'"

_WORD = re.compile(r"[A-Za-z]+")
# Words the improved mode reads as state (instruction_relative._TRANSIENT_CLASS matches them
# anywhere in a class): kept as they are and never produced by the renaming.
_SPECIAL = re.compile(r"(hover|focus|active|selected|highlight|disabled|visited)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# The real demonstrations
# --------------------------------------------------------------------------------------------


def count_real_episodes(home: Path) -> int:
    """Imported MiniWoB++ demonstrations in the warehouse at ``home`` (0 if there is none)."""
    if not (home / "warehouse.duckdb").exists():
        return 0
    from warehouse.catalog import Warehouse

    try:
        rows = Warehouse(home).query(f"SELECT count(*) AS n FROM episodes e WHERE {REAL_EPISODES}").to_pylist()
    except Exception:  # no episodes table yet
        return 0
    return int(rows[0]["n"])


def load_real_trajectories(
    home: Path, demos: Path = DEMOS_DIR, log: Callable[[str], None] = print, *, workers: int | None = None
) -> tuple[list[Trajectory], str]:
    """The imported demonstrations of ``home``; if it has none, import ``demos`` into a temporary home first.

    Returns (trajectories, where they came from). The warehouse at ``home`` is only read.
    """
    from warehouse.catalog import Warehouse
    from warehouse.trajectories import load_trajectories

    if count_real_episodes(home) == 0:
        from envs.miniwob.demonstrations import import_demonstrations

        tmp = Path(tempfile.mkdtemp(prefix="stepwise-bench-labels-"))
        log(f"no imported demonstrations under {home}: importing {demos} into {tmp} ...")
        report = import_demonstrations(demos, Warehouse(tmp), workers=workers)
        log(f"imported {report.episodes:,} episodes ({report.steps:,} steps) in {report.seconds:.1f} s")
        trajectories = [t for t in load_trajectories(Warehouse(tmp), REAL_EPISODES) if t.n_steps > 0]
        shutil.rmtree(tmp, ignore_errors=True)  # everything needed is in memory now
        return trajectories, f"{demos}, imported into a temporary home (removed)"
    trajectories = [t for t in load_trajectories(Warehouse(home), REAL_EPISODES) if t.n_steps > 0]
    return trajectories, str(home)


# --------------------------------------------------------------------------------------------
# Renaming a task into a variant
# --------------------------------------------------------------------------------------------


def _vocabulary(trajectories: Sequence[Trajectory]) -> list[str]:
    words: set[str] = set()

    def add(text: str | None) -> None:
        if text:
            words.update(w.lower() for w in _WORD.findall(text))

    for t in trajectories:
        add(t.instruction)
        for action in t.actions:
            if action.type in (ActionType.INPUT, ActionType.ANSWER):
                add(action.text)
            if action.target is not None:
                e = action.target
                for text in (e.text, e.element_id, e.classes, e.description, e.value):
                    add(text)
        for screen in t.screens:
            for e in screen.elements:
                if e.role == "label":
                    add(e.text)
    return sorted(w for w in words if not _SPECIAL.search(w))


class Renamer:
    """Variant k of the vocabulary: a same-length bijection of words, applied to texts, elements, actions."""

    def __init__(self, vocabulary: Sequence[str], rng: np.random.Generator | None) -> None:
        self.mapping: dict[str, str] = {}
        if rng is not None:
            by_length: dict[int, list[str]] = defaultdict(list)
            for word in vocabulary:
                by_length[len(word)].append(word)
            for words in by_length.values():
                for word, index in zip(words, rng.permutation(len(words)).tolist(), strict=False):
                    self.mapping[word] = words[index]
        self._texts: dict[str, str] = {}
        self._elements: dict[int, UIElement] = {}
        self._screens: dict[int, Screen] = {}
        self._actions: dict[int, Action] = {}

    @property
    def active(self) -> bool:
        """Whether this renamer changes anything (variant 0 is the task as recorded)."""
        return bool(self.mapping)

    def _new_word(self, word: str) -> str | None:
        return self.mapping.get(word)

    def _word(self, match: re.Match[str]) -> str:
        word = match.group()
        new = self._new_word(word.lower())
        if new is None:
            return word
        return "".join(n.upper() if o.isupper() else n for o, n in zip(word, new, strict=False))

    def text(self, text: str | None) -> str | None:
        if not text or not self.active:
            return text
        out = self._texts.get(text)
        if out is None:
            out = self._texts[text] = _WORD.sub(self._word, text)
        return out

    def element(self, e: UIElement) -> UIElement:
        if not self.active:
            return e
        out = self._elements.get(id(e))
        if out is None:
            out = self._elements[id(e)] = UIElement(
                ref=e.ref,
                role=e.role,
                text=self.text(e.text),
                element_id=self.text(e.element_id),
                classes=self.text(e.classes),
                description=self.text(e.description),
                value=self.text(e.value),
                bounds=e.bounds,
                clickable=e.clickable,
                editable=e.editable,
                checked=e.checked,
                focused=e.focused,
                parent_ref=e.parent_ref,
                depth=e.depth,
            )
        return out

    def screen(self, screen: Screen, labels: tuple[int, ...]) -> Screen:
        """The screen with its ``label`` elements (at ``labels``) renamed; shared when it has none."""
        if not self.active or not labels:
            return screen
        out = self._screens.get(id(screen))
        if out is None:
            elements = list(screen.elements)
            for k in labels:
                elements[k] = self.element(elements[k])
            out = self._screens[id(screen)] = Screen(tuple(elements), screen.screenshot_path)
        return out

    def action(self, action: Action) -> Action:
        if not self.active:
            return action
        out = self._actions.get(id(action))
        if out is None:
            text = self.text(action.text) if action.type in (ActionType.INPUT, ActionType.ANSWER) else action.text
            target = self.element(action.target) if action.target is not None else None
            out = self._actions[id(action)] = Action(
                action.type, target=target, text=text, direction=action.direction, detail=action.detail
            )
        return out


# --------------------------------------------------------------------------------------------
# The paper-scale corpus
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusStats:
    tasks: int
    real_tasks: int
    trajectories: int
    successes: int
    steps: int
    success_steps: int
    parts: int  # recordings played back, in all
    real_episodes_used: int
    distinct_typed_texts: int
    tasks_with_fewer_than_two_successes: int

    @property
    def failures(self) -> int:
        return self.trajectories - self.successes

    @property
    def failure_steps(self) -> int:
        return self.steps - self.success_steps


def _target(rng: np.random.Generator, budget: int, remaining: int, shape: float = 2.0) -> int:
    mean = budget / max(remaining, 1)
    if remaining <= 1:
        return max(1, budget)
    return max(1, int(round(rng.gamma(shape, mean / shape))))


def _plan_recordings(
    pool: Sequence[Trajectory], start: int, target: int, outcome: bool
) -> tuple[list[tuple[Trajectory, int]], int]:
    """Recordings of ``pool`` from ``start`` on (wrapping) that make one trajectory of about ``target``
    steps, as (recording, steps kept), and its length. A success: whole recordings, stopping at the
    count that comes closest to the target. A failure: whole recordings, then the last one abandoned
    before its end (see the module docstring); at the target exactly, the next one is abandoned at once."""
    plan: list[tuple[Trajectory, int]] = []
    length = 0
    for k in range(10_000):
        part = pool[(start + k) % len(pool)]
        if outcome:
            if plan and abs(length + part.n_steps - target) >= abs(length - target):
                break
        elif target - length < part.n_steps:
            plan.append((part, target - length))
            return plan, target
        plan.append((part, part.n_steps))
        length += part.n_steps
    return plan, length


def derive_paper_corpus(
    real: Sequence[Trajectory],
    *,
    seed: int = 0,
    n_tasks: int = PAPER_TASKS,
    n_trajectories: int = PAPER_TRAJECTORIES,
    n_successes: int = PAPER_SUCCESSES,
    n_steps: int = PAPER_STEPS,
    n_success_steps: int = PAPER_SUCCESS_STEPS,
    success_concentration: float = 2.5,
) -> tuple[list[Trajectory], CorpusStats]:
    """The corpus described in the module docstring (deterministic for a given ``real`` and ``seed``)."""
    rng = np.random.default_rng(seed)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in sorted(real, key=lambda t: t.episode_id):
        if t.n_steps:
            by_task[t.task_id].append(t)
    real_tasks = sorted(by_task)
    if n_tasks < len(real_tasks):
        raise ValueError(f"{n_tasks} tasks asked for but the demonstrations have {len(real_tasks)}")
    # The tasks with the most recordings (the most varied ones) get the extra variants.
    base, extra = divmod(n_tasks, len(real_tasks))
    by_size = sorted(real_tasks, key=lambda task: (-len(by_task[task]), task))
    n_variants = {task: base + (rank < extra) for rank, task in enumerate(by_size)}
    derived = [(task, k) for task in real_tasks for k in range(n_variants[task])]

    vocabulary = _vocabulary(real)
    renamers: dict[tuple[str, int], Renamer] = {}
    label_positions: dict[int, tuple[int, ...]] = {
        id(s): tuple(k for k, e in enumerate(s.elements) if e.role == "label") for t in real for s in t.screens
    }

    # Trajectories per task, and which are successful: exactly n_successes, per-task rates ~ Beta.
    per_task = rng.multinomial(n_trajectories, np.full(len(derived), 1.0 / len(derived)))
    mean_rate = n_successes / n_trajectories
    rates = rng.beta(mean_rate * success_concentration, (1 - mean_rate) * success_concentration, size=len(derived))
    owner = np.repeat(np.arange(len(derived)), per_task)
    weights = np.maximum(rates[owner], 1e-9)
    success = np.zeros(n_trajectories, dtype=bool)
    success[rng.choice(n_trajectories, size=n_successes, replace=False, p=weights / weights.sum())] = True

    # Lengths: successes first (whole recordings), then failures (cut), which absorb the rounding.
    lengths = np.zeros(n_trajectories, dtype=np.int64)
    plans: list[list[tuple[Trajectory, int]]] = [[] for _ in range(n_trajectories)]  # (recording, steps kept)
    successes_of = {task: [t for t in eps if t.success] for task, eps in by_task.items()}
    for outcome in (True, False):
        slots = rng.permutation(np.flatnonzero(success == outcome))
        budget = n_success_steps if outcome else n_steps - int(lengths[success].sum())
        for remaining, slot in zip(range(len(slots), 0, -1), slots.tolist(), strict=False):
            task = derived[owner[slot]][0]
            pool = successes_of[task] if outcome else by_task[task]
            if not pool:
                raise ValueError(f"task {task} has no successful recording to build a successful trajectory from")
            target = _target(rng, budget, remaining)
            plan, length = _plan_recordings(pool, int(rng.integers(len(pool))), target, outcome)
            plans[slot] = plan
            lengths[slot] = length
            budget -= length

    trajectories: list[Trajectory] = []
    typed: set[str] = set()
    used: set[str] = set()
    index_in_task = defaultdict(int)
    for slot in range(n_trajectories):
        task, variant = derived[owner[slot]]
        renamer = renamers.get((task, variant))
        if renamer is None:
            variant_rng = np.random.default_rng([seed, real_tasks.index(task), variant]) if variant else None
            renamer = renamers[(task, variant)] = Renamer(vocabulary, variant_rng)
        actions: list[Action] = []
        screens: list[Screen] = []
        instructions: list[str] = []
        for part, keep in plans[slot]:
            used.add(part.episode_id)
            instructions.append(renamer.text(part.instruction) or "")
            actions.extend(renamer.action(a) for a in part.actions[:keep])
            screens.extend(renamer.screen(s, label_positions[id(s)]) for s in part.screens[:keep])
        typed.update(a.text for a in actions if a.type is ActionType.INPUT and a.text)
        task_id = f"{task}~v{variant:02d}"
        n = index_in_task[task_id]
        index_in_task[task_id] += 1
        trajectories.append(
            Trajectory(
                episode_id=f"paper-scale:{task_id}:{n:03d}",
                task_id=task_id,
                instruction=" ".join(i for i in instructions if i),
                source="human_demo",
                success=bool(success[slot]),
                actions=tuple(actions),
                screens=tuple(screens),
            )
        )
    successes_per_task = np.bincount(owner[success], minlength=len(derived))
    stats = CorpusStats(
        tasks=len(derived),
        real_tasks=len(real_tasks),
        trajectories=len(trajectories),
        successes=int(success.sum()),
        steps=int(lengths.sum()),
        success_steps=int(lengths[success].sum()),
        parts=sum(len(p) for p in plans),
        real_episodes_used=len(used),
        distinct_typed_texts=len(typed),
        tasks_with_fewer_than_two_successes=int((successes_per_task < 2).sum()),
    )
    return trajectories, stats


# --------------------------------------------------------------------------------------------
# Scaled corpora: more tasks, or more trajectories per task, generated one task at a time
# --------------------------------------------------------------------------------------------

#: ProgRM App. C per task: 10,438 trajectories over 577 tasks (18.09 a task), 54.9% successful,
#: 13.9 steps per successful and 27.1 per failed trajectory.
PAPER_PER_TASK = PAPER_TRAJECTORIES / PAPER_TASKS
PAPER_SUCCESS_LENGTH = PAPER_SUCCESS_STEPS / PAPER_SUCCESSES
PAPER_FAILURE_LENGTH = (PAPER_STEPS - PAPER_SUCCESS_STEPS) / (PAPER_TRAJECTORIES - PAPER_SUCCESSES)


class ShiftRenamer(Renamer):
    """A renaming by cyclic shifts: each word of ``domain`` (lowercase) moves ``offsets[len]``
    places within the domain's words of its length. A bijection of the domain, computed per word
    on demand, so a million renamers cost nothing to make (a random permutation of the whole
    vocabulary per renamer does)."""

    def __init__(self, domain: DomainIndex, rng: np.random.Generator) -> None:
        super().__init__((), None)
        self.domain = domain
        self.offsets = {length: int(rng.integers(1, max(2, len(words)))) for length, words in domain.by_length.items()}

    @property
    def active(self) -> bool:
        return True

    def _new_word(self, word: str) -> str | None:
        position = self.domain.position.get(word)
        if position is None:
            return None
        words = self.domain.by_length[len(word)]
        return words[(position + self.offsets[len(word)]) % len(words)]


@dataclass(frozen=True)
class DomainIndex:
    """Words grouped by length, with each word's place in its group (see :class:`ShiftRenamer`)."""

    by_length: dict[int, list[str]]
    position: dict[str, int]

    @classmethod
    def of(cls, words: Sequence[str]) -> DomainIndex:
        by_length: dict[int, list[str]] = defaultdict(list)
        for word in sorted(set(words)):
            by_length[len(word)].append(word)
        position = {w: k for group in by_length.values() for k, w in enumerate(group)}
        return cls(dict(by_length), position)


def _instance_words(episodes: Sequence[Trajectory]) -> set[str]:
    """Words of a task's instructions that are not its template: those in fewer than half of them."""
    counts: dict[str, int] = defaultdict(int)
    for t in episodes:
        for word in {w.lower() for w in _WORD.findall(t.instruction)}:
            counts[word] += 1
    return {w for w, c in counts.items() if c < 0.5 * len(episodes) and not _SPECIAL.search(w)}


@dataclass(frozen=True)
class ScaledCorpusSpec:
    """A corpus of ``n_tasks`` tasks with ``copies`` x ~18 trajectories each (ProgRM's per-task mean).

    Task i is real task ``i mod 51`` (in a seeded order); for i >= 51 its vocabulary is renamed
    (variant ``i // 51``, as in the paper-scale corpus). Each task has 18 or 19 *base*
    trajectories built like the paper-scale corpus's (runs of consecutive recordings; successes
    whole, failures abandoned; lengths around the paper's means; per-task success rate ~ Beta),
    and every base trajectory has ``copies - 1`` perturbed copies whose *instance words* (the
    words of the task's instructions that are not its template, e.g. the username to type) are
    renamed, wherever they appear (instruction, typed texts, targets, screen labels). Every step
    gets its own Screen object, as steps loaded from a warehouse have.
    """

    n_tasks: int
    copies: int = 1
    seed: int = 0

    @property
    def trajectories(self) -> int:
        return sum(self.base_count(i) for i in range(self.n_tasks)) * self.copies

    def base_count(self, i: int) -> int:
        return int(round((i + 1) * PAPER_PER_TASK) - round(i * PAPER_PER_TASK))


class ScaledCorpus:
    """Generates a :class:`ScaledCorpusSpec` one task at a time (memory: one task)."""

    def __init__(self, real: Sequence[Trajectory], spec: ScaledCorpusSpec) -> None:
        self.spec = spec
        by_task: dict[str, list[Trajectory]] = defaultdict(list)
        for t in sorted(real, key=lambda t: t.episode_id):
            if t.n_steps:
                by_task[t.task_id].append(t)
        order = np.random.default_rng(spec.seed).permutation(len(by_task))
        names = sorted(by_task)
        self.real_tasks = [names[k] for k in order.tolist()]
        self.by_task = by_task
        self.successes = {task: [t for t in eps if t.success] for task, eps in by_task.items()}
        self.vocabulary = DomainIndex.of(_vocabulary(real))
        self.label_positions: dict[int, tuple[int, ...]] = {
            id(s): tuple(k for k, e in enumerate(s.elements) if e.role == "label") for t in real for s in t.screens
        }
        instance = {task: _instance_words(eps) for task, eps in by_task.items()}
        everything = set().union(*instance.values())
        templates = {
            task: {w.lower() for t in eps for w in _WORD.findall(t.instruction)} - instance[task]
            for task, eps in by_task.items()
        }
        self.instance_domain = {task: DomainIndex.of(sorted(everything - templates[task])) for task in by_task}

    def task_ids(self) -> list[str]:
        n_real = len(self.real_tasks)
        return [f"{self.real_tasks[i % n_real]}~v{i // n_real:04d}" for i in range(self.spec.n_tasks)]

    def __iter__(self) -> Iterator[list[Trajectory]]:
        for i in range(self.spec.n_tasks):
            yield self.task(i)

    def task(self, i: int) -> list[Trajectory]:
        """The trajectories of task i (deterministic)."""
        spec = self.spec
        n_real = len(self.real_tasks)
        real_task, variant = self.real_tasks[i % n_real], i // n_real
        task_id = f"{real_task}~v{variant:04d}"
        rng = np.random.default_rng([spec.seed, 1, i])
        variant_renamer = ShiftRenamer(self.vocabulary, rng) if variant else Renamer((), None)
        mean_rate = PAPER_SUCCESSES / PAPER_TRAJECTORIES
        rate = rng.beta(mean_rate * 2.5, (1 - mean_rate) * 2.5)
        plans: list[tuple[bool, list[tuple[Trajectory, int]]]] = []
        for _ in range(spec.base_count(i)):
            outcome = bool(rng.random() < rate)
            pool = self.successes[real_task] if outcome else self.by_task[real_task]
            mean = PAPER_SUCCESS_LENGTH if outcome else PAPER_FAILURE_LENGTH
            target = max(1, int(round(rng.gamma(2.0, mean / 2.0))))
            plan, _ = _plan_recordings(pool, int(rng.integers(len(pool))), target, outcome)
            plans.append((outcome, plan))
        out: list[Trajectory] = []
        for copy in range(spec.copies):
            renamers = [variant_renamer]
            if copy:
                copy_rng = np.random.default_rng([spec.seed, 2, i, copy])
                renamers.append(ShiftRenamer(self.instance_domain[real_task], copy_rng))
            for b, (outcome, plan) in enumerate(plans):
                actions: list[Action] = []
                screens: list[Screen] = []
                instructions: list[str] = []
                for part, keep in plan:
                    instruction = part.instruction
                    for renamer in renamers:
                        instruction = renamer.text(instruction) or ""
                    instructions.append(instruction)
                    for action, screen in zip(part.actions[:keep], part.screens[:keep], strict=True):
                        labels = self.label_positions[id(screen)]
                        for renamer in renamers:
                            action = renamer.action(action)
                            screen = renamer.screen(screen, labels)
                        actions.append(action)
                        screens.append(Screen(screen.elements, screen.screenshot_path))
                out.append(
                    Trajectory(
                        episode_id=f"scaled:{task_id}:{b:02d}:{copy:04d}",
                        task_id=task_id,
                        instruction=" ".join(i for i in instructions if i),
                        source="human_demo",
                        success=outcome,
                        actions=tuple(actions),
                        screens=tuple(screens),
                    )
                )
        return out
