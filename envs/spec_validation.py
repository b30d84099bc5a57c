"""Check a folder of task specs: load errors by file and field, and which milestones recorded
successful episodes reach when their screens and actions are replayed through the specs.

A spec that a successful human episode cannot satisfy is probably wrong (a selector naming the
wrong element, a template that misses a form of the instruction), and one that every failure
satisfies tells nothing apart. So, per task::

    report = validate_specs("envs/task_specs/miniwob", trajectories)                 # trajectories in hand
    report = validate_specs("envs/task_specs/miniwob", load=warehouse_episodes(wh))  # or task by task
    print(format_report(report))   # ERROR / WARNING lines, one per problem; NOTE lines; a table
    exit_code = 1 if report.errors else 0

Replaying follows the ground truth of the labels (``annotation.progress.labeling.milestone_hits``): the
screen after a step is the next step's screen; after the last step, the final screen where the
rollout stored it (``episodes.final_screen``: the replay then sees what the online tracker saw), else
the last screen recorded with the last action's own effect where it is known (typed text lands in
its field). Milestones recorded online (rollouts) are not used: the point is to check the specs in
hand.

Warnings: a milestone no successful episode reaches; every failure reaching the last milestone;
recorded instructions the template does not fit; a slot a milestone names that the instruction of
some recorded episode leaves unfilled (it then stays as the literal ``{slot}`` and matches nothing:
``envs.tasks``; a ``count`` over an unfilled list slot sees an empty list, by definition, so that
use is not warned about); rollouts whose recorded milestones carry names the spec no longer has.
Notes (``format_report``): milestones that some successes miss, with one to look at.

Pure functions over ``warehouse.trajectories.Trajectory``; no Dagster, and a warehouse only through
``warehouse_episodes``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from envs.spec_evaluation import MilestoneTrack, track_milestones
from envs.tasks import (
    ITEM_SLOT,
    TaskSpec,
    TaskSpecError,
    load_task_spec,
    shown_path,
    slot_names,
    spec_files,
    spec_for,
)
from warehouse.model import Action, ActionType, Screen
from warehouse.purposes import purpose_filter
from warehouse.statistics import roc_auc, within_group_auc
from warehouse.trajectories import Trajectory, load_trajectories

if TYPE_CHECKING:
    from warehouse.catalog import Warehouse

LoadEpisodes = Callable[[str], Iterable[Trajectory]]


@dataclass(frozen=True)
class SpecLoadError:
    """A spec file that did not load; ``message`` (one line) names the file and the field."""

    file: str
    message: str


@dataclass(frozen=True)
class MilestoneReach:
    """How many replayed episodes of a task reach one milestone (and every one before it)."""

    index: int
    name: str
    successes: int
    failures: int
    missed_by: str | None = None  # a successful episode that does not reach it, for a look


@dataclass(frozen=True)
class SlotGap:
    """A slot that milestones name and that some recorded instructions leave unfilled."""

    slot: str
    fields: tuple[str, ...]  # where the milestones name it, e.g. milestones[0].when.clicked.text
    episodes: int  # episodes whose instruction leaves it unfilled
    example: str  # one such instruction


#: How the spec version a record was made under relates to the spec in hand (``TaskSpec.is_other_version``).
THIS_VERSION, OTHER_VERSION, NO_VERSION = "this version", "another version", "no version stored"


@dataclass
class RecordComparison:
    """Milestones recorded online against the replay of the spec in hand, over a task's episodes."""

    recorded: int = 0  # replayed episodes that carry milestones recorded online (rollouts)
    other_version: int = 0  # ... recorded under another version of the spec (labels replay these)
    differ: list[tuple[str, str]] = field(default_factory=list)  # (episode id, version) where they differ

    def add(self, trajectory: Trajectory, spec: TaskSpec, track: MilestoneTrack) -> None:
        digest = trajectory.spec_digest
        version = NO_VERSION if digest is None else OTHER_VERSION if spec.is_other_version(digest) else THIS_VERSION
        self.recorded += 1
        self.other_version += version == OTHER_VERSION
        if track.hits != trajectory.milestones_hit:
            self.differ.append((trajectory.episode_id, version))

    def differing(self, version: str | None = None) -> list[str]:
        """The episodes whose record the replay does not reproduce (recorded under ``version``)."""
        return [episode for episode, v in self.differ if version is None or v == version]


@dataclass(frozen=True)
class TaskReport:
    """One spec against the recorded episodes of its task."""

    task_id: str
    file: str
    successes: int
    failures: int
    milestones: tuple[MilestoneReach, ...]
    unfit: int = 0  # episodes whose instruction the template does not fit (not replayed)
    unfit_example: str | None = None
    slot_gaps: tuple[SlotGap, ...] = ()
    stale_recorded: int = 0  # episodes whose milestones recorded online name none of the spec's
    stale_example: str | None = None
    records: RecordComparison = field(default_factory=RecordComparison)

    @property
    def episodes(self) -> int:
        return self.successes + self.failures

    def success_share(self, milestone: MilestoneReach) -> float:
        """The share of replayed successes that reach the milestone (nan without successes)."""
        return milestone.successes / self.successes if self.successes else float("nan")

    @property
    def unreached(self) -> tuple[MilestoneReach, ...]:
        """Milestones that no successful episode reaches (none when there is no success)."""
        return tuple(m for m in self.milestones if self.successes and m.successes == 0)

    @property
    def failures_all_complete(self) -> bool:
        """Every failure reaches the last milestone: the milestones do not tell failures apart."""
        return bool(self.failures and self.milestones and self.milestones[-1].failures == self.failures)

    def reached_histogram(self, success: bool) -> list[int]:
        """How many successful (or failed) episodes reach exactly k milestones, k = 0..n."""
        total = self.successes if success else self.failures
        at_least = [total, *(m.successes if success else m.failures for m in self.milestones), 0]
        return [at_least[k] - at_least[k + 1] for k in range(len(self.milestones) + 1)]

    @property
    def outcome_pairs(self) -> int:
        """(success, failure) pairs of this task: the weight of its AUC in :meth:`ValidationReport.within_task_auc`."""
        return self.successes * self.failures

    def reached_counts(self, success: bool) -> np.ndarray:
        """How many milestones each successful (or failed) episode reaches, one entry per episode."""
        histogram = self.reached_histogram(success)
        return np.repeat(np.arange(len(histogram)), histogram)

    @property
    def outcome_auc(self) -> float:
        """How well the milestones reached tell successes from failures: the probability that a
        success reaches more of them than a failure (ties half), nan without both. The number
        reached is what ProgRM's environment-milestone label says at an episode's last step
        (ProgRM §2.2: progress rises evenly over the milestones), so this is the AUC a perfect
        ProgRM-Env model would reach on these episodes."""
        successes, failures = self.reached_counts(True), self.reached_counts(False)
        is_success = np.concatenate([np.ones(len(successes), dtype=bool), np.zeros(len(failures), dtype=bool)])
        return roc_auc(np.concatenate([successes, failures]), is_success)


@dataclass(frozen=True)
class ValidationReport:
    """``validate_specs``' answer: load errors per file, and per task what the replays reach."""

    folder: str
    errors: tuple[SpecLoadError, ...]
    tasks: tuple[TaskReport, ...]

    @property
    def within_task_auc(self) -> float:
        """:meth:`TaskReport.outcome_auc` over every task with both outcomes, each weighted by its
        (success, failure) pairs: a success outranks a failure of its own task (nan without any)."""
        reached, success, tasks = [], [], []
        for task in self.tasks:
            for outcome in (True, False):
                counts = task.reached_counts(outcome)
                reached.append(counts)
                success.append(np.full(len(counts), outcome))
                tasks.append(np.full(len(counts), task.task_id, dtype=object))
        if not reached:
            return float("nan")
        return within_group_auc(np.concatenate(reached), np.concatenate(success), np.concatenate(tasks))

    def problems(self) -> list[str]:
        """Every problem, one line each: ``ERROR`` (a spec did not load) or ``WARNING``."""
        lines = [f"ERROR {e.message}" for e in self.errors]
        for task in self.tasks:
            at = f"{task.file} (task {task.task_id})"
            for m in task.unreached:
                lines.append(
                    f"WARNING {at}: milestones[{m.index}] {m.name!r} is reached by no successful episode "
                    f"(0 of {task.successes}; e.g. {m.missed_by})"
                )
            if task.failures_all_complete:
                lines.append(
                    f"WARNING {at}: all {task.failures} failed episodes reach the last milestone "
                    f"{task.milestones[-1].name!r}: the milestones do not tell failures from successes"
                )
            if task.unfit:
                lines.append(
                    f"WARNING {at}: field 'instruction' does not fit {task.unfit} recorded instruction(s), "
                    f"e.g. {task.unfit_example!r} (those episodes have no ground truth)"
                )
            if same_version := task.records.differing(THIS_VERSION):
                lines.append(
                    f"WARNING {at}: {len(same_version)} episode(s) recorded under this very spec "
                    f"have milestones recorded online that the replay does not reproduce (e.g. "
                    f"{same_version[0]}): the replay and the online tracker disagree"
                )
            if task.stale_recorded:
                lines.append(
                    f"WARNING {at}: {task.stale_recorded} episode(s) carry milestones recorded online under "
                    f"other milestone names (e.g. {task.stale_example}): recorded under an older spec, their "
                    "labels use those names; run their rollouts again"
                )
            for gap in task.slot_gaps:
                lines.append(
                    f"WARNING {at}: field {gap.fields[0]!r}"
                    + (f" (and {len(gap.fields) - 1} more)" if len(gap.fields) > 1 else "")
                    + f": slot {{{gap.slot}}} is unfilled for {gap.episodes} recorded instruction(s), "
                    f"e.g. {gap.example!r}; there it stays the literal text {{{gap.slot}}} and matches nothing"
                )
        return lines

    @property
    def ok(self) -> bool:
        """No load error and no warning."""
        return not self.problems()


# -- replay -----------------------------------------------------------------------------------


def replay_milestones(spec: TaskSpec, trajectory: Trajectory) -> MilestoneTrack:
    """The spec's milestones along a recorded trajectory, with the labels' replay semantics (module
    docstring). Raises TaskSpecError when the instruction does not fit the spec's template, and
    ValueError for a trajectory loaded without its screens (its placeholders would reach nothing)."""
    if not trajectory.screens_loaded:
        raise ValueError(
            f"episode {trajectory.episode_id}: loaded without its screens (with_screens=False): nothing to replay"
        )
    if not trajectory.screens:
        return track_milestones(spec, trajectory.instruction, [], trajectory.success, trajectory.fields)
    last: Screen | None
    if trajectory.final_screen is not None:  # what the online tracker saw
        last = trajectory.final_screen
    elif trajectory.actions:
        last = _with_known_effect(trajectory.screens[-1], trajectory.actions[-1])
    else:
        last = None
    screens_after: list[Screen | None] = [*trajectory.screens[1:], last]
    # a step whose action failed is checked without it, as the online tracker checks it
    actions = [None if i in trajectory.failed_steps else a for i, a in enumerate(trajectory.actions)]
    steps: list[tuple[Screen | None, Action | None]] = list(zip(screens_after, actions, strict=False))
    return track_milestones(spec, trajectory.instruction, steps, success=trajectory.success, fields=trajectory.fields)


def _with_known_effect(screen: Screen, action: Action) -> Screen:
    if action.type is not ActionType.INPUT or action.target is None:
        return screen
    ref = action.target.ref
    return Screen(
        tuple(replace(e, value=action.text) if e.ref == ref else e for e in screen.elements), screen.screenshot_path
    )


# -- slots the milestones name ----------------------------------------------------------------


def milestone_slot_uses(spec: TaskSpec) -> dict[str, list[str]]:
    """Slot -> the fields of the milestones that render it (``milestones[i].when....``). The item
    of a ``count`` and the list a ``count`` reads (an unfilled list is empty, by definition) are
    left out."""
    uses: dict[str, list[str]] = defaultdict(list)
    for i, milestone in enumerate(spec.milestones):
        _collect_slots(milestone.when, f"milestones[{i}].when", frozenset(), uses)
    return dict(uses)


def _collect_slots(node: Any, at: str, bound: frozenset[str], uses: dict[str, list[str]]) -> None:
    if isinstance(node, Mapping):
        if "count" in node and len(node) == 1 and isinstance(node["count"], Mapping):
            count = node["count"]
            _collect_slots(count.get("each"), f"{at}.count.each", bound | {ITEM_SLOT}, uses)
            return
        for key, value in node.items():
            _collect_slots(value, f"{at}.{key}", bound, uses)
    elif isinstance(node, list | tuple):
        for k, value in enumerate(node):
            _collect_slots(value, f"{at}[{k}]", bound, uses)
    elif isinstance(node, str):
        for slot in slot_names(node):
            if slot not in bound and at not in uses[slot]:
                uses[slot].append(at)


# -- the report -------------------------------------------------------------------------------


def validate_specs(
    folder: Path | str,
    trajectories: Iterable[Trajectory] = (),
    *,
    load: LoadEpisodes | None = None,
) -> ValidationReport:
    """Load every spec of ``folder`` (errors per file, the others go on) and replay the recorded
    episodes of each task through its spec.

    Episodes come from ``trajectories`` (each goes to the spec ``envs.tasks.spec_for`` picks, its
    variant's or its task's), and from ``load(task_id)`` for each spec when given (e.g.
    ``warehouse_episodes(warehouse)``). Every trajectory given is replayed: pass real episodes
    (synthetic ones have no environment behind them). Raises TaskSpecError only when the folder
    does not exist."""
    errors: list[SpecLoadError] = []
    specs: dict[str, TaskSpec] = {}
    for path in spec_files(folder):
        shown = shown_path(path)
        try:
            spec = load_task_spec(path)
        except TaskSpecError as exc:
            errors.append(SpecLoadError(shown, str(exc)))
            continue
        if spec.task_id in specs:
            errors.append(
                SpecLoadError(shown, f"{shown}: task {spec.task_id!r} is already defined in {specs[spec.task_id].path}")
            )
            continue
        specs[spec.task_id] = spec
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        routed = spec_for(specs, trajectory.task_id, trajectory.fields)
        if routed is not None:
            by_task[routed.task_id].append(trajectory)
    if load is not None:
        for task_id in specs:
            seen = {t.episode_id for t in by_task[task_id]}
            for trajectory in load(task_id):
                routed = spec_for(specs, trajectory.task_id, trajectory.fields)
                if routed is not None and routed.task_id == task_id and trajectory.episode_id not in seen:
                    seen.add(trajectory.episode_id)
                    by_task[task_id].append(trajectory)
    tasks = tuple(validate_task(specs[t], by_task.get(t, ())) for t in sorted(specs))
    return ValidationReport(shown_path(Path(folder)), tuple(errors), tasks)


def validate_task(spec: TaskSpec, trajectories: Iterable[Trajectory]) -> TaskReport:
    """One spec against recorded episodes of its task: milestone reach of successes and failures,
    instructions that do not fit, slots left unfilled."""
    uses = milestone_slot_uses(spec)
    successes = failures = unfit = 0
    unfit_example: str | None = None
    reached_s = [0] * len(spec.milestones)
    reached_f = [0] * len(spec.milestones)
    missed: list[str | None] = [None] * len(spec.milestones)
    gaps: dict[str, list[str]] = defaultdict(list)  # slot -> instructions leaving it unfilled
    names = {m.name for m in spec.milestones}
    stale: list[str] = []
    comparison = RecordComparison()
    for trajectory in trajectories:
        recorded = {n for hits in trajectory.milestones_hit or () for n in hits}
        if recorded - names:
            stale.append(trajectory.episode_id)
        slots = spec.slots(trajectory.instruction, trajectory.fields)
        if slots is None:
            unfit += 1
            unfit_example = unfit_example or trajectory.instruction
            continue
        for slot in uses:
            if slot not in slots:
                gaps[slot].append(trajectory.instruction)
        track = replay_milestones(spec, trajectory)
        if trajectory.milestones_hit is not None:
            comparison.add(trajectory, spec, track)
        counts = reached_s if trajectory.success else reached_f
        if trajectory.success:
            successes += 1
        else:
            failures += 1
        for k in range(len(spec.milestones)):
            if k < track.reached:
                counts[k] += 1
            elif trajectory.success and missed[k] is None:
                missed[k] = trajectory.episode_id
    return TaskReport(
        task_id=spec.task_id,
        file=spec.path or spec.task_id,
        successes=successes,
        failures=failures,
        milestones=tuple(
            MilestoneReach(k, m.name, reached_s[k], reached_f[k], missed[k]) for k, m in enumerate(spec.milestones)
        ),
        unfit=unfit,
        unfit_example=unfit_example,
        slot_gaps=tuple(SlotGap(s, tuple(uses[s]), len(v), v[0]) for s, v in sorted(gaps.items())),
        stale_recorded=len(stale),
        stale_example=stale[0] if stale else None,
        records=comparison,
    )


def warehouse_episodes(
    warehouse: Warehouse, source: str = "human_demo", *, purpose: str | None = None, per_task: int | None = None
) -> LoadEpisodes:
    """``load`` for ``validate_specs``: a task's recorded episodes of one source in the warehouse,
    by task id or by variant (``task_fields.task_variant``, e.g. email-inbox-nl-turk).

    ``purpose`` keeps one episode purpose (``evaluation``: the agent's held-out episodes, which
    take paths the demonstrations never took); ``per_task`` replays at most that many episodes of
    each task, a sample fixed by the episode ids (the same episodes on every run)."""
    where = "(e.task_id = ? OR json_extract_string(e.task_fields, '$.task_variant') = ?) AND e.source = ?"
    if purpose is not None:
        where += f" AND {purpose_filter('e.purpose', (purpose,))}"
    if per_task is not None:
        if per_task < 1:
            raise ValueError(f"per_task must be at least 1, not {per_task}")
        where = (
            f"e.episode_id IN (SELECT e.episode_id FROM episodes e WHERE {where} "
            f"ORDER BY md5(e.episode_id), e.episode_id LIMIT {int(per_task)})"
        )

    def load(task_id: str) -> Iterator[Trajectory]:
        return load_trajectories(warehouse, where, [task_id, task_id, source])

    return load


def format_report(report: ValidationReport) -> str:
    """The report as text: the problems, one line each, then one line per task with the share of
    successful episodes reaching each milestone."""
    lines = [f"task specs in {report.folder}: {len(report.tasks)} loaded, {len(report.errors)} with errors"]
    problems = report.problems()
    lines += problems or ["no problems"]
    for task in report.tasks:
        before = task.successes
        for m in task.milestones:
            if 0 < m.successes < before:  # some successes stop here (the later milestones miss them too)
                lines.append(
                    f"NOTE {task.file} (task {task.task_id}): milestones[{m.index}] {m.name!r} is reached by "
                    f"{m.successes} of {task.successes} successful episodes (e.g. missed by {m.missed_by})"
                )
            before = m.successes
    lines.append("")
    lines.append("milestones reached by recorded successes (failures), per task:")
    for task in report.tasks:
        if not task.episodes:
            lines.append(f"  {task.task_id}: no recorded episodes" + (f" ({task.unfit} unfit)" if task.unfit else ""))
            continue
        reach = ", ".join(
            f"{m.name} {_percent(task.success_share(m))} ({m.failures}/{task.failures})" for m in task.milestones
        )
        auc = f"; AUC {task.outcome_auc:.3f}" if task.outcome_pairs else ""
        lines.append(f"  {task.task_id}: {task.successes} successes, {task.failures} failures: {reach}{auc}")
    lines += _record_comparison_lines(report)
    if report.within_task_auc == report.within_task_auc:
        tasks = sum(1 for t in report.tasks if t.outcome_pairs)
        lines.append(
            f"milestones reached tell successes from failures within their task at AUC {report.within_task_auc:.3f} "
            f"({tasks} tasks with both; the AUC a perfect ProgRM-Env model would reach on these episodes)"
        )
    return "\n".join(lines)


def _record_comparison_lines(report: ValidationReport) -> list[str]:
    """Milestones recorded online against the replay: a line per task where they differ, one in all."""
    recorded = sum(t.records.recorded for t in report.tasks)
    if not recorded:
        return []
    lines = []
    for task in report.tasks:
        if differ := task.records.differing():
            by_version = ", ".join(
                f"{len(task.records.differing(v))} {label}"
                for v, label in (
                    (OTHER_VERSION, "recorded under another version of the spec"),
                    (NO_VERSION, "with no version stored"),
                    (THIS_VERSION, "under this one"),
                )
            )
            lines.append(
                f"  {task.task_id}: the replay differs from the milestones recorded online in {len(differ)} "
                f"of {task.records.recorded} episodes (e.g. {differ[0]}): {by_version}"
            )
    differ_total = sum(len(t.records.differ) for t in report.tasks)
    other = sum(t.records.other_version for t in report.tasks)
    lines.append(
        f"milestones recorded online: the replay reproduces them in {recorded - differ_total} of {recorded} episodes; "
        f"{other} were recorded under another version of their spec (labels replay those; "
        "`stepwise label --replay-milestones` replays the episodes with no version stored too)"
    )
    return lines


def _percent(share: float) -> str:
    return "-" if share != share else f"{100 * share:.0f}%"
