"""Progress labels for a corpus of trajectories: LCS (paper-faithful or improved) and milestones.

Pure functions over :class:`warehouse.trajectories.Trajectory`; assets and the CLI do the I/O.

* ``paper`` mode follows ProgRM §2.2 as written: raw actions, Eq. (9) soft match (SBERT on INPUT
  texts, epsilon for NOTHING, exact target identity otherwise), recipes from all successful
  trajectories of a task, labels kappa / |L|.
* ``improved`` mode first cleans garbage steps and rewrites actions relative to the instruction
  (:mod:`annotation.progress.instruction_relative`), then runs the same machinery.
* ``env`` labels come from environment milestones: recorded online (rollouts) or evaluated from
  a task spec over the recorded screens (demonstrations, and rollouts recorded under another
  version of the spec: :func:`milestone_hits`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Literal

import pyarrow as pa

from annotation.progress.instruction_relative import (
    INSTRUCTION_PLACEHOLDER,
    CleanedTrajectory,
    ScreenStates,
    clean_trajectory,
    expand_to_all_steps,
)
from annotation.progress.key_steps import TrajectoryLabels, label_corpus, milestone_progress
from annotation.progress.recipes import DEFAULT_THETA, Episode, Grouping, TaskRecipes
from annotation.progress.soft_lcs import SOFT_TEXT_TYPES
from annotation.progress.text_similarity import Embed, normalise_text
from envs.spec_validation import replay_milestones
from envs.tasks import TaskSpec, TaskSpecError, spec_for
from warehouse.model import Action, ActionType
from warehouse.trajectories import Trajectory

LcsMethod = Literal["paper", "improved"]
LCS_METHODS: tuple[LcsMethod, ...] = ("paper", "improved")
RECIPE_SOURCES = frozenset({"human_demo", "rollout"})  # synthetic trajectories never make recipes
# labels-2: milestones replayed where recorded under another spec version, with the stored final screen
# and without the actions of failed steps
LABEL_VERSION = "labels-2"


@dataclass
class LabelColumns:
    """``progress_labels`` rows held column by column: cheap to build per episode, to count, and to
    turn into Arrow (a dict per step costs more than the label itself at a million trajectories)."""

    episode_id: list[str] = field(default_factory=list)
    step_idx: list[int] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    method: list[str | None] = field(default_factory=list)
    progress: list[float] = field(default_factory=list)
    is_key_step: list[bool] = field(default_factory=list)
    recipe_id: list[str | None] = field(default_factory=list)
    completion_ratio: list[float | None] = field(default_factory=list)
    label_version: list[str] = field(default_factory=list)

    def add_episode(
        self,
        episode_id: str,
        source: str,
        method: str | None,
        progress: Sequence[float],
        is_key: Sequence[bool],
        recipe_id: str | None,
        completion_ratio: float | None,
    ) -> None:
        """One episode's labels (step t gets ``progress[t]``, ``is_key[t]``)."""
        n = len(progress)
        self.episode_id.extend([episode_id] * n)
        self.step_idx.extend(range(n))
        self.source.extend([source] * n)
        self.method.extend([method] * n)
        self.progress.extend(float(p) for p in progress)
        self.is_key_step.extend(bool(k) for k in is_key)
        self.recipe_id.extend([recipe_id] * n)
        self.completion_ratio.extend([completion_ratio] * n)
        self.label_version.extend([LABEL_VERSION] * n)

    def extend(self, other: LabelColumns) -> None:
        for name in LABEL_COLUMNS:
            getattr(self, name).extend(getattr(other, name))

    def __len__(self) -> int:
        return len(self.episode_id)

    def rows(self) -> list[dict]:
        """The rows as dicts, in order."""
        columns = [getattr(self, name) for name in LABEL_COLUMNS]
        return [dict(zip(LABEL_COLUMNS, values, strict=True)) for values in zip(*columns, strict=True)]

    def to_arrow(self, schema: pa.Schema) -> pa.Table:
        """The rows as an Arrow table of ``schema`` (the ``progress_labels`` schema)."""
        return pa.table({name: pa.array(getattr(self, name), type=schema.field(name).type) for name in LABEL_COLUMNS})


LABEL_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LabelColumns))


@dataclass
class LabelRun:
    """Rows for the ``progress_labels`` and ``recipes`` tables, and what could not be labelled."""

    labels: LabelColumns = field(default_factory=LabelColumns)
    recipe_rows: list[dict] = field(default_factory=list)
    unlabelled: dict[str, str] = field(default_factory=dict)  # episode id -> reason
    task_notes: dict[str, str] = field(default_factory=dict)  # task id -> why it has no recipe
    step_notes: dict[str, str] = field(default_factory=dict)  # episode id -> odd steps it holds
    recipes: dict[str, TaskRecipes] = field(default_factory=dict)  # the recipe libraries behind the rows
    milestone_origins: dict[str, int] = field(default_factory=dict)  # env labels: episodes by where they came from

    @property
    def label_rows(self) -> list[dict]:
        """The ``progress_labels`` rows as dicts (see :attr:`labels` for the columns)."""
        return self.labels.rows()


@dataclass
class PreparedLcs:
    """Trajectories as the LCS labeller needs them, screens no longer needed: per task, the
    episodes' (cleaned and rewritten, in improved mode) actions, and what each step became."""

    method: LcsMethod
    order: list[str] = field(default_factory=list)  # episode ids with steps, in input order
    episodes_by_task: dict[str, list[Episode]] = field(default_factory=dict)
    cleaned: dict[str, CleanedTrajectory] = field(default_factory=dict)  # improved mode: kept steps per episode
    common_texts: dict[str, frozenset[str]] = field(default_factory=dict)  # improved: target texts kept per task
    unlabelled: dict[str, str] = field(default_factory=dict)
    step_notes: dict[str, str] = field(default_factory=dict)

    @property
    def episodes(self) -> int:
        return len(self.order)

    def texts(self) -> set[str]:
        """The INPUT / ANSWER texts Eq. (9) compares (what a text embedder will be asked for)."""
        return {
            normalise_text(a.text)
            for episodes in self.episodes_by_task.values()
            for e in episodes
            for a in e.actions
            if a.type in SOFT_TEXT_TYPES
        }


def prepare_lcs(
    trajectories: Sequence[Trajectory],
    method: LcsMethod,
    *,
    rare_share: float = 0.02,
    states: ScreenStates | None = None,
) -> PreparedLcs:
    """The first half of :func:`lcs_labels`: every trajectory of the given tasks cleaned and
    rewritten (improved mode, :mod:`annotation.progress.instruction_relative`) and grouped by task. Every
    trajectory of a task must be in the same call (rare target texts are counted per task)."""
    prepared = PreparedLcs(method)
    actions_of: dict[str, tuple[Action, ...]] = {}
    for trajectory in trajectories:
        if trajectory.n_steps == 0:
            prepared.unlabelled[trajectory.episode_id] = f"task {trajectory.task_id}: empty trajectory (no steps)"
            continue
        odd = [
            i
            for i, a in enumerate(trajectory.actions)
            if a.type is ActionType.UNKNOWN and (a.detail or "").startswith("unknown action type")
        ]
        if odd:
            prepared.step_notes[trajectory.episode_id] = (
                f"task {trajectory.task_id}: steps {odd} have an unknown action type "
                f"({trajectory.actions[odd[0]].detail}); they never match a recipe"
            )
        if method == "improved":
            cleaned = clean_trajectory(trajectory.actions, trajectory.screens, trajectory.instruction, states)
            prepared.cleaned[trajectory.episode_id] = cleaned
            actions_of[trajectory.episode_id] = cleaned.actions
        else:
            actions_of[trajectory.episode_id] = trajectory.actions
    if method == "improved":
        task_of = {t.episode_id: t.task_id for t in trajectories}
        prepared.common_texts = common_target_texts(actions_of, task_of, rare_share)
        actions_of = generalise_rare_target_texts(actions_of, task_of, rare_share, prepared.common_texts)
    for trajectory in trajectories:
        if trajectory.episode_id not in actions_of:
            continue
        recipe_eligible = trajectory.success and trajectory.source in RECIPE_SOURCES
        prepared.order.append(trajectory.episode_id)
        prepared.episodes_by_task.setdefault(trajectory.task_id, []).append(
            Episode(trajectory.episode_id, actions_of[trajectory.episode_id], recipe_eligible)
        )
    return prepared


def label_prepared(
    prepared: PreparedLcs,
    embed: Embed | None,
    *,
    theta: float = DEFAULT_THETA,
    support: float = 0.5,
    grouping: Grouping = "prefiltered",
    version_of: Mapping[str, int] | None = None,
) -> LabelRun:
    """The second half of :func:`lcs_labels`: recipes (Eqs. 3, 10) and labels (Eq. 4, kappa / |L|).
    ``version_of`` gives the library version of rebuilt tasks (recipe ids: :func:`recipe_id`)."""
    method = prepared.method
    version_of = version_of or {}
    run = LabelRun(unlabelled=dict(prepared.unlabelled), step_notes=dict(prepared.step_notes))
    by_task = prepared.episodes_by_task
    if method == "improved":
        # Typing the right text into the wrong field is not the same step; noisy human groups
        # keep the steps most members share (consensus) instead of only what all share (Eq. 10).
        corpus = label_corpus(
            by_task,
            embed,
            theta=theta,
            mode="soft",
            input_target_must_match=True,
            recipe_rule="consensus",
            support=support,
            similarity_norm="mean",
            tie_break="more_matched",
            grouping=grouping,
        )
    else:
        corpus = label_corpus(by_task, embed, theta=theta, mode="soft", grouping=grouping)
    run.recipes = corpus.recipes
    for task_id, library in corpus.recipes.items():
        if not library.has_recipes:
            run.task_notes[task_id] = library.reason or "no recipe"
        run.recipe_rows.extend(recipe_rows(library, method, version_of.get(task_id, 1)))
    task_of = {e.episode_id: task for task, episodes in by_task.items() for e in episodes}
    for episode_id in prepared.order:
        labels = corpus.labels.get(episode_id)
        if labels is None:
            continue
        if not labels.labelled:
            run.unlabelled[episode_id] = labels.reason or "not labelled"
            continue
        add_lcs_labels(
            run.labels, labels, method, prepared.cleaned.get(episode_id), version_of.get(task_of[episode_id], 1)
        )
    return run


def recipe_rows(library: TaskRecipes, method: str, version: int = 1) -> list[dict]:
    """The ``recipes`` rows of one task's library (recipe ids: :func:`recipe_id`)."""
    return [
        {
            "recipe_id": recipe_id(method, recipe.recipe_id, version),
            "task_id": library.task_id,
            "method": method,
            "group_idx": group_idx,
            "length": len(recipe),
            "steps": [a.canonical_text() for a in recipe.actions],
            "n_members": len(recipe.member_episode_ids),
            "member_episode_ids": list(recipe.member_episode_ids),
            "label_version": LABEL_VERSION,
        }
        for group_idx, recipe in enumerate(library.recipes)
    ]


def recipe_id(method: str, task_recipe_id: str, version: int = 1) -> str:
    """``<method>:<task>/recipe-<k>``; a library rebuilt later (version v >= 2) adds ``@v<v>``, so a
    label row names the version of the recipe that labelled it (version 1 keeps the original ids)."""
    base = f"{method}:{task_recipe_id}"
    return base if version <= 1 else f"{base}@v{version}"


def add_lcs_labels(
    columns: LabelColumns,
    labels: TrajectoryLabels,
    method: str,
    cleaned: CleanedTrajectory | None,
    version: int = 1,
) -> None:
    """One episode's LCS labels as rows; in improved mode, garbage steps get theirs back
    (:func:`annotation.progress.instruction_relative.expand_to_all_steps`)."""
    progress: Sequence[float] = [s.progress for s in labels.steps]
    is_key: Sequence[bool] = [s.is_key_step for s in labels.steps]
    if cleaned is not None:
        progress, is_key = expand_to_all_steps(progress, is_key, cleaned)
    rid = recipe_id(method, labels.recipe_id, version) if labels.recipe_id else None
    columns.add_episode(labels.episode_id, "lcs", method, progress, is_key, rid, labels.completion_ratio)


def lcs_labels(
    trajectories: Sequence[Trajectory],
    embed: Embed | None,
    method: LcsMethod,
    *,
    theta: float = DEFAULT_THETA,
    support: float = 0.5,
    rare_share: float = 0.02,
    grouping: Grouping = "prefiltered",
) -> LabelRun:
    """LCS progress labels (ProgRM §2.2) of every trajectory, per task, in the given mode."""
    prepared = prepare_lcs(trajectories, method, rare_share=rare_share)
    return label_prepared(prepared, embed, theta=theta, support=support, grouping=grouping)


OTHER_TEXT = "<other>"


def common_target_texts(
    actions_of: Mapping[str, tuple[Action, ...]], task_of: Mapping[str, str], rare_share: float
) -> dict[str, frozenset[str]]:
    """Per task, the target texts clicked in at least ``rare_share`` of its episodes (and at least
    two): the texts :func:`generalise_rare_target_texts` keeps."""
    episodes_per_task: dict[str, int] = defaultdict(int)
    document_frequency: dict[tuple[str, str], int] = defaultdict(int)
    for episode_id, actions in actions_of.items():
        task = task_of[episode_id]
        episodes_per_task[task] += 1
        for text in {a.target.text for a in actions if a.target is not None and a.target.text}:
            document_frequency[(task, text)] += 1
    common: dict[str, set[str]] = {task: set() for task in episodes_per_task}
    for (task, text), count in document_frequency.items():
        if count >= max(2.0, rare_share * episodes_per_task[task]):
            common[task].add(text)
    return {task: frozenset(texts) for task, texts in common.items()}


def generalise_rare_target_texts(
    actions_of: Mapping[str, tuple[Action, ...]],
    task_of: Mapping[str, str],
    rare_share: float,
    common: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, tuple[Action, ...]]:
    """Improved mode: a target text that the instruction does not name and that few episodes of
    the task ever click (under ``rare_share`` of them) is instance-specific (a random word, a
    name): it says nothing about the step's role in the task, so it becomes ``<other>``. Texts
    common across instances ("Submit", "Reply", "More") keep their identity. ``common`` may give
    the texts kept per task (:func:`common_target_texts`, or a recipe library's, to label new
    episodes the way its recipes were built)."""
    if common is None:
        common = common_target_texts(actions_of, task_of, rare_share)
    out = {}
    for episode_id, actions in actions_of.items():
        kept = common.get(task_of[episode_id], frozenset())
        out[episode_id] = tuple(
            replace(a, target=replace(a.target, text=OTHER_TEXT))
            if a.target is not None
            and a.target.text
            and a.target.text != INSTRUCTION_PLACEHOLDER
            and a.target.text not in kept
            else a
            for a in actions
        )
    return out


#: Where an episode's milestone labels came from (:func:`milestones_with_origin`), as label runs count them.
FROM_RECORD = "recorded online"
FROM_UNVERSIONED_RECORD = "recorded online, spec version not stored"
REPLAYED_STALE = "replayed: recorded under another spec version"
KEPT_STALE = "recorded under another spec version, kept: nothing to replay"
REPLAYED = "replayed"


def milestone_hits(
    trajectory: Trajectory, spec: TaskSpec | None, *, replay: bool = False
) -> tuple[tuple[str, ...], ...] | None:
    """Milestones reached at each step: recorded online if the episode has them, else evaluated from
    the spec over the recorded screens (``envs.spec_validation.replay_milestones``: screen after a
    step = the next step's screen; after the last step, the stored final screen, else the last
    screen recorded).

    Recorded milestones are replaced by the replay when they are stale: the episode stored the
    digest of the spec that recorded them (``Trajectory.spec_digest``) and ``spec`` has another
    (the spec was fixed after the rollout). ``replay``: replay even where the record cannot be
    checked (rollouts stored before digests were). Either way only where there are screens to read;
    an instruction the spec's template no longer fits keeps its recorded milestones (without a
    record it raises TaskSpecError, as always)."""
    return milestones_with_origin(trajectory, spec, replay=replay)[0]


def milestones_with_origin(
    trajectory: Trajectory, spec: TaskSpec | None, *, replay: bool = False
) -> tuple[tuple[tuple[str, ...], ...] | None, str]:
    """:func:`milestone_hits` and where they came from (``FROM_RECORD``, ``FROM_UNVERSIONED_RECORD``,
    ``REPLAYED_STALE``, ``KEPT_STALE``: stale, without screens or with an instruction the template no
    longer fits, or ``REPLAYED``)."""
    recorded = trajectory.milestones_hit
    if recorded is None:
        return (_replayed_hits(trajectory, spec) if spec is not None else None), REPLAYED
    stale = spec is not None and spec.is_other_version(trajectory.spec_digest)
    kept = KEPT_STALE if stale else FROM_UNVERSIONED_RECORD if trajectory.spec_digest is None else FROM_RECORD
    if spec is None or not (trajectory.screens and trajectory.screens_loaded) or not (replay or stale):
        return recorded, kept
    try:
        return _replayed_hits(trajectory, spec), REPLAYED_STALE if stale else REPLAYED
    except TaskSpecError:
        return recorded, kept


def _replayed_hits(trajectory: Trajectory, spec: TaskSpec) -> tuple[tuple[str, ...], ...]:
    """The spec's milestones along the recorded screens (:func:`milestone_hits`)."""
    return replay_milestones(spec, trajectory).hits


def env_labels(
    trajectories: Iterable[Trajectory], specs: Mapping[str, TaskSpec], *, replay_milestones: bool = False
) -> LabelRun:
    """Environment-milestone labels (ProgRM §2.2 last paragraph): key steps reach a new milestone,
    progress rises evenly over the task's milestones. Milestones recorded online are used where the
    episode stored the version of the spec in hand, or none; the spec is replayed where it stored
    another. ``replay_milestones``: replayed on every episode with screens (:func:`milestone_hits`)."""
    run = LabelRun()
    for trajectory in trajectories:
        spec = spec_for(specs, trajectory.task_id, trajectory.fields)
        if spec is None and trajectory.milestones_hit is None:
            continue
        try:
            hits, origin = milestones_with_origin(trajectory, spec, replay=replay_milestones)
        except TaskSpecError as exc:
            run.unlabelled[trajectory.episode_id] = str(exc)
            continue
        assert hits is not None  # there is a spec or recorded hits (checked above)
        run.milestone_origins[origin] = run.milestone_origins.get(origin, 0) + 1
        ordered = [m.name for m in spec.milestones] if spec else _order_of_first_hits(hits)
        progress, is_key = milestone_progress(hits, ordered)
        n = trajectory.n_steps
        run.labels.add_episode(
            trajectory.episode_id,
            "env",
            None,
            progress[:n].tolist(),
            is_key[:n].tolist(),
            None,
            float(progress[-1]) if len(progress) else 0.0,
        )
    return run


def _order_of_first_hits(hits: Sequence[Sequence[str]]) -> list[str]:
    seen: list[str] = []
    for names in hits:
        seen.extend(n for n in names if n not in seen)
    return seen


# -- quality against milestone ground truth --------------------------------------------------


@dataclass(frozen=True)
class LabelQuality:
    method: str
    task_set: str
    tasks: int
    episodes: int
    key_step_precision: float
    key_step_recall: float
    key_step_progress_error: float  # mean |p_lcs - p_env| at ground-truth key steps (ProgRM Table 3)
    step_progress_error: float  # mean |p_lcs - p_env| over all steps


def label_quality(
    lcs_rows: Sequence[Mapping], env_rows: Sequence[Mapping], task_of: Mapping[str, str], task_set: Mapping[str, str]
) -> list[LabelQuality]:
    """Compare LCS labels with milestone ground truth per method and task set (e.g. dev / held-out).

    Only episodes with both an LCS label and a milestone label count. Key-step precision and recall
    compare the sets of key steps exactly; the progress error at ground-truth key steps is the
    metric of ProgRM Table 3.
    """
    env = {(r["episode_id"], r["step_idx"]): r for r in env_rows}
    grouped: dict[tuple[str, str], list[Mapping]] = defaultdict(list)
    for r in lcs_rows:
        task = task_of.get(r["episode_id"])
        if task is not None and task in task_set and (r["episode_id"], r["step_idx"]) in env:
            grouped[(r["method"], task_set[task])].append(r)
    results = []
    for (method, set_name), rows in sorted(grouped.items()):
        tp = fp = fn = 0
        key_errors: list[float] = []
        all_errors: list[float] = []
        episodes, tasks = set(), set()
        for r in rows:
            truth = env[(r["episode_id"], r["step_idx"])]
            episodes.add(r["episode_id"])
            tasks.add(task_of[r["episode_id"]])
            error = abs(r["progress"] - truth["progress"])
            all_errors.append(error)
            if truth["is_key_step"]:
                key_errors.append(error)
            tp += r["is_key_step"] and truth["is_key_step"]
            fp += r["is_key_step"] and not truth["is_key_step"]
            fn += truth["is_key_step"] and not r["is_key_step"]
        results.append(
            LabelQuality(
                method=method,
                task_set=set_name,
                tasks=len(tasks),
                episodes=len(episodes),
                key_step_precision=tp / (tp + fp) if tp + fp else 0.0,
                key_step_recall=tp / (tp + fn) if tp + fn else 0.0,
                key_step_progress_error=sum(key_errors) / len(key_errors) if key_errors else float("nan"),
                step_progress_error=sum(all_errors) / len(all_errors) if all_errors else float("nan"),
            )
        )
    return results
