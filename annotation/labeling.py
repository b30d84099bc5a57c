"""Progress labels for a corpus of trajectories: LCS (paper-faithful or improved) and milestones.

Pure functions over :class:`warehouse.trajectories.Trajectory`; assets and the CLI do the I/O.

* ``paper`` mode follows ProgRM §2.2 as written: raw actions, Eq. (9) soft match (SBERT on INPUT
  texts, epsilon for NOTHING, exact target identity otherwise), recipes from all successful
  trajectories of a task, labels kappa / |L|.
* ``improved`` mode first cleans garbage steps and rewrites actions relative to the instruction
  (:mod:`annotation.instruction_relative`), then runs the same machinery.
* ``env`` labels come from environment milestones: recorded online (rollouts) or evaluated from
  a task spec over the recorded screens (demonstrations).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from annotation.instruction_relative import INSTRUCTION_PLACEHOLDER, clean_trajectory, expand_to_all_steps
from annotation.progress import label_corpus, milestone_progress
from annotation.recipes import DEFAULT_THETA, Episode
from annotation.text_similarity import Embed
from envs.tasks import TaskSpec, TaskSpecError, spec_for, track_milestones
from warehouse.model import Action, ActionType, Screen
from warehouse.trajectories import Trajectory

LcsMethod = Literal["paper", "improved"]
LCS_METHODS: tuple[LcsMethod, ...] = ("paper", "improved")
RECIPE_SOURCES = frozenset({"human_demo", "rollout"})  # synthetic trajectories never make recipes
LABEL_VERSION = "labels-1"


@dataclass
class LabelRun:
    """Rows for the ``progress_labels`` and ``recipes`` tables, and what could not be labelled."""

    label_rows: list[dict] = field(default_factory=list)
    recipe_rows: list[dict] = field(default_factory=list)
    unlabelled: dict[str, str] = field(default_factory=dict)  # episode id -> reason
    task_notes: dict[str, str] = field(default_factory=dict)  # task id -> why it has no recipe
    step_notes: dict[str, str] = field(default_factory=dict)  # episode id -> odd steps it holds


def lcs_labels(
    trajectories: Sequence[Trajectory],
    embed: Embed | None,
    method: LcsMethod,
    *,
    theta: float = DEFAULT_THETA,
    support: float = 0.5,
    rare_share: float = 0.02,
) -> LabelRun:
    """LCS progress labels (ProgRM §2.2) of every trajectory, per task, in the given mode."""
    run = LabelRun()
    by_task: dict[str, list[Episode]] = defaultdict(list)
    cleaned_by_episode = {}
    actions_of: dict[str, tuple[Action, ...]] = {}
    for trajectory in trajectories:
        if trajectory.n_steps == 0:
            run.unlabelled[trajectory.episode_id] = f"task {trajectory.task_id}: empty trajectory (no steps)"
            continue
        odd = [
            i
            for i, a in enumerate(trajectory.actions)
            if a.type is ActionType.UNKNOWN and (a.detail or "").startswith("unknown action type")
        ]
        if odd:
            run.step_notes[trajectory.episode_id] = (
                f"task {trajectory.task_id}: steps {odd} have an unknown action type "
                f"({trajectory.actions[odd[0]].detail}); they never match a recipe"
            )
        if method == "improved":
            cleaned = clean_trajectory(trajectory.actions, trajectory.screens, trajectory.instruction)
            cleaned_by_episode[trajectory.episode_id] = cleaned
            actions_of[trajectory.episode_id] = cleaned.actions
        else:
            actions_of[trajectory.episode_id] = trajectory.actions
    if method == "improved":
        actions_of = generalise_rare_target_texts(
            actions_of, {t.episode_id: t.task_id for t in trajectories}, rare_share
        )
    for trajectory in trajectories:
        if trajectory.episode_id not in actions_of:
            continue
        recipe_eligible = trajectory.success and trajectory.source in RECIPE_SOURCES
        by_task[trajectory.task_id].append(
            Episode(trajectory.episode_id, actions_of[trajectory.episode_id], recipe_eligible)
        )
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
        )
    else:
        corpus = label_corpus(by_task, embed, theta=theta, mode="soft")
    for task_id, library in corpus.recipes.items():
        if not library.has_recipes:
            run.task_notes[task_id] = library.reason or "no recipe"
        for group_idx, recipe in enumerate(library.recipes):
            run.recipe_rows.append(
                {
                    "recipe_id": f"{method}:{recipe.recipe_id}",
                    "task_id": task_id,
                    "method": method,
                    "group_idx": group_idx,
                    "length": len(recipe),
                    "steps": [a.canonical_text() for a in recipe.actions],
                    "n_members": len(recipe.member_episode_ids),
                    "member_episode_ids": list(recipe.member_episode_ids),
                    "label_version": LABEL_VERSION,
                }
            )
    for trajectory in trajectories:
        labels = corpus.labels.get(trajectory.episode_id)
        if labels is None:
            continue
        if not labels.labelled:
            run.unlabelled[trajectory.episode_id] = labels.reason or "not labelled"
            continue
        progress = [s.progress for s in labels.steps]
        is_key = [s.is_key_step for s in labels.steps]
        if method == "improved":
            progress, is_key = expand_to_all_steps(progress, is_key, cleaned_by_episode[trajectory.episode_id])
        recipe_id = f"{method}:{labels.recipe_id}" if labels.recipe_id else None
        for step_idx, (p, key) in enumerate(zip(progress, is_key, strict=True)):
            run.label_rows.append(
                {
                    "episode_id": trajectory.episode_id,
                    "step_idx": step_idx,
                    "source": "lcs",
                    "method": method,
                    "progress": float(p),
                    "is_key_step": bool(key),
                    "recipe_id": recipe_id,
                    "completion_ratio": labels.completion_ratio,
                    "label_version": LABEL_VERSION,
                }
            )
    return run


OTHER_TEXT = "<other>"


def generalise_rare_target_texts(
    actions_of: Mapping[str, tuple[Action, ...]], task_of: Mapping[str, str], rare_share: float
) -> dict[str, tuple[Action, ...]]:
    """Improved mode: a target text that the instruction does not name and that few episodes of
    the task ever click (under ``rare_share`` of them) is instance-specific (a random word, a
    name): it says nothing about the step's role in the task, so it becomes ``<other>``. Texts
    common across instances ("Submit", "Reply", "More") keep their identity."""
    episodes_per_task: dict[str, int] = defaultdict(int)
    document_frequency: dict[tuple[str, str], int] = defaultdict(int)
    for episode_id, actions in actions_of.items():
        task = task_of[episode_id]
        episodes_per_task[task] += 1
        for text in {a.target.text for a in actions if a.target is not None and a.target.text}:
            document_frequency[(task, text)] += 1
    out = {}
    for episode_id, actions in actions_of.items():
        task = task_of[episode_id]
        threshold = max(2.0, rare_share * episodes_per_task[task])
        out[episode_id] = tuple(
            replace(a, target=replace(a.target, text=OTHER_TEXT))
            if a.target is not None
            and a.target.text
            and a.target.text != INSTRUCTION_PLACEHOLDER
            and document_frequency[(task, a.target.text)] < threshold
            else a
            for a in actions
        )
    return out


def milestone_hits(trajectory: Trajectory, spec: TaskSpec | None) -> tuple[tuple[str, ...], ...] | None:
    """Milestones reached at each step: recorded online if the episode has them, else evaluated from
    the spec over the recorded screens (screen after a step = the next step's screen; after the
    last step, the last screen recorded)."""
    if trajectory.milestones_hit is not None:
        return trajectory.milestones_hit
    if spec is None:
        return None
    # After the last step the recording ends (MiniWoB++ resets the page): the last screen seen,
    # with the last action's own effect where it is known (typed text lands in its field), stands in.
    screens_after = (
        [*trajectory.screens[1:], _with_known_effect(trajectory.screens[-1], trajectory.actions[-1])]
        if trajectory.screens
        else []
    )
    track = track_milestones(
        spec,
        trajectory.instruction,
        zip(screens_after, trajectory.actions, strict=False),
        success=trajectory.success,
        fields=trajectory.fields,
    )
    return track.hits


def _with_known_effect(screen: Screen, action: Action) -> Screen:
    if action.type is not ActionType.INPUT or action.target is None:
        return screen
    return Screen(
        tuple(replace(e, value=action.text) if e.ref == action.target.ref else e for e in screen.elements),
        screen.screenshot_path,
    )


def env_labels(trajectories: Iterable[Trajectory], specs: Mapping[str, TaskSpec]) -> LabelRun:
    """Environment-milestone labels (ProgRM §2.2 last paragraph): key steps reach a new milestone,
    progress rises evenly over the task's milestones."""
    run = LabelRun()
    for trajectory in trajectories:
        spec = spec_for(specs, trajectory.task_id, trajectory.fields)
        if spec is None and trajectory.milestones_hit is None:
            continue
        try:
            hits = milestone_hits(trajectory, spec)
        except TaskSpecError as exc:
            run.unlabelled[trajectory.episode_id] = str(exc)
            continue
        assert hits is not None  # there is a spec or recorded hits (checked above)
        ordered = [m.name for m in spec.milestones] if spec else _order_of_first_hits(hits)
        progress, is_key = milestone_progress(hits, ordered)
        for step_idx in range(trajectory.n_steps):
            run.label_rows.append(
                {
                    "episode_id": trajectory.episode_id,
                    "step_idx": step_idx,
                    "source": "env",
                    "method": None,
                    "progress": float(progress[step_idx]),
                    "is_key_step": bool(is_key[step_idx]),
                    "recipe_id": None,
                    "completion_ratio": float(progress[-1]) if len(progress) else 0.0,
                    "label_version": LABEL_VERSION,
                }
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
