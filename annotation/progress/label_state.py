"""The recipe library kept between runs, and labelling new episodes against it (incremental labels).

A run of the labels stage leaves, per (task, LCS mode), a *library state*: the version of the
task's recipe library, the recipes' actions (serialised, so that Eq. 9 can compare new steps
with them), the target texts the improved mode keeps for the task, and how many successes it
was built from. New episodes of the task (an RL iteration's rollouts) are then labelled against
that library without rebuilding it (:func:`label_against_library`): Eq. (4) picks each new
episode's recipe of highest completion ratio among the stored ones, and its key steps and labels
follow as in a full run (§2.2 stages 2-3). Only the new episodes are read, cleaned, encoded and
aligned, so the cost is proportional to the batch.

A task's library is rebuilt only when its successes changed enough (:func:`needs_rebuild`):
then the whole task is relabelled, and its library gets the next version. Label rows name the
version that labelled them through their recipe id (``...@v<version>``, version 1 unmarked;
:func:`annotation.progress.labeling.recipe_id`); the state table says which materialization built it.

What differs from relabelling everything: a rebuild would regroup the task's successes with
the new ones (so recipes can change), and recount which target texts are rare; between
rebuilds, new episodes see the library and the rare-text rule as they were built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from annotation.progress.instruction_relative import ScreenStates, clean_trajectory
from annotation.progress.key_steps import TieBreak, assign_progress_labels
from annotation.progress.labeling import (
    RECIPE_SOURCES,
    LabelRun,
    LcsMethod,
    PreparedLcs,
    add_lcs_labels,
    generalise_rare_target_texts,
)
from annotation.progress.recipes import Episode, Recipe, TaskRecipes
from annotation.progress.soft_lcs import build_match_table_encoded
from annotation.progress.text_similarity import Embed
from warehouse.model import Action, ActionType, UIElement
from warehouse.trajectories import Trajectory


def action_to_json(action: Action) -> str:
    """An action (as the labeller compares it) as JSON: type, target element, text, direction."""
    return json.dumps(
        {
            "type": str(action.type.value if isinstance(action.type, ActionType) else action.type),
            "target": action.target.to_dict() if action.target is not None else None,
            "text": action.text,
            "direction": action.direction,
            "detail": action.detail,
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def action_from_json(text: str) -> Action:
    """The inverse of :func:`action_to_json`."""
    d = json.loads(text)
    target = UIElement.from_dict(d["target"]) if d["target"] is not None else None
    return Action(ActionType(d["type"]), target=target, text=d["text"], direction=d["direction"], detail=d["detail"])


@dataclass
class LibraryState:
    """One row of :data:`warehouse.schema.LIBRARY_STATE`, with its recipes as actions."""

    task_id: str
    method: str
    version: int
    n_successes: int
    n_episodes: int
    recipe_ids: list[str]
    recipes: list[tuple[Action, ...]]
    common_texts: frozenset[str] = field(default_factory=frozenset)
    reason: str | None = None
    label_family: str | None = None
    built_by: str | None = None

    @classmethod
    def from_row(cls, row: Mapping) -> LibraryState:
        return cls(
            task_id=row["task_id"],
            method=row["method"],
            version=int(row["version"]),
            n_successes=int(row["n_successes"] or 0),
            n_episodes=int(row["n_episodes"] or 0),
            recipe_ids=list(row["recipe_ids"] or []),
            recipes=[tuple(action_from_json(a) for a in json.loads(r)) for r in row["recipe_actions"] or []],
            common_texts=frozenset(row["common_texts"] or []),
            reason=row["reason"],
            label_family=row.get("label_family"),
            built_by=row.get("built_by"),
        )

    def row(self) -> dict:
        from annotation.progress.labeling import LABEL_VERSION

        return {
            "task_id": self.task_id,
            "method": self.method,
            "version": self.version,
            "label_family": self.label_family,
            "n_successes": self.n_successes,
            "n_episodes": self.n_episodes,
            "recipe_ids": self.recipe_ids,
            "recipe_actions": [json.dumps([action_to_json(a) for a in r], ensure_ascii=False) for r in self.recipes],
            "common_texts": sorted(self.common_texts),
            "reason": self.reason,
            "label_version": LABEL_VERSION,
            "built_by": self.built_by,
        }


def library_states(
    run: LabelRun,
    prepared: PreparedLcs,
    version_of: Mapping[str, int] | None = None,
    *,
    family_of: Mapping[str, str] | None = None,
    built_by: str | None = None,
) -> list[LibraryState]:
    """The library state of every task a run labelled (from its recipes and its prepared input)."""
    from annotation.progress.labeling import recipe_id

    states = []
    for task_id, library in run.recipes.items():
        version = (version_of or {}).get(task_id, 1)
        episodes = prepared.episodes_by_task.get(task_id, [])
        states.append(
            LibraryState(
                task_id=task_id,
                method=prepared.method,
                version=version,
                n_successes=library.n_successful,
                n_episodes=len(episodes),
                recipe_ids=[recipe_id(prepared.method, r.recipe_id, version) for r in library.recipes],
                recipes=[r.actions for r in library.recipes],
                common_texts=prepared.common_texts.get(task_id, frozenset()),
                reason=library.reason,
                label_family=(family_of or {}).get(task_id),
                built_by=built_by,
            )
        )
    return states


def needs_rebuild(state: LibraryState | None, new_successes: int, *, share: float = 0.1, at_least: int = 2) -> bool:
    """Whether a task's library should be rebuilt: it has none yet (a new task), or at least
    ``max(at_least, share x successes it was built from)`` recipe-eligible successes arrived."""
    if state is None:
        return True
    if not state.recipes and state.n_successes < 2:
        return state.n_successes + new_successes >= 2
    return new_successes >= max(at_least, share * state.n_successes)


def task_recipe_id(stored: str) -> str:
    """``<method>:<task>/recipe-<k>[@v<n>]`` -> ``<task>/recipe-<k>`` (the id within the library)."""
    base = stored.split(":", 1)[1] if ":" in stored else stored
    return re.sub(r"@v\d+$", "", base)


_MODE_OPTIONS: dict[str, dict] = {
    "paper": {"input_target_must_match": False, "tie_break": "earlier"},
    "improved": {"input_target_must_match": True, "tie_break": "more_matched"},
}


def label_against_library(
    trajectories: Sequence[Trajectory],
    states: Mapping[str, LibraryState],
    embed: Embed | None,
    method: LcsMethod,
    *,
    states_cache: ScreenStates | None = None,
) -> LabelRun:
    """LCS labels of new episodes against their tasks' stored libraries (no recipe rebuilt).

    Improved mode: each episode is cleaned and rewritten as in a full run, and target texts the
    library did not keep become ``<other>``. Episodes of a task whose library has no recipe are
    unlabelled with its reason. Cost: the new episodes (and the recipes) only.
    """
    run = LabelRun()
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.n_steps == 0:
            run.unlabelled[t.episode_id] = f"task {t.task_id}: empty trajectory (no steps)"
            continue
        by_task.setdefault(t.task_id, []).append(t)
    options = _MODE_OPTIONS[method]
    for task_id, episodes in by_task.items():
        state = states[task_id]
        if not state.recipes:
            for t in episodes:
                run.unlabelled[t.episode_id] = f"task {task_id} has no recipe: {state.reason}"
            continue
        cleaned = {}
        actions_of: dict[str, tuple[Action, ...]] = {}
        for t in episodes:
            if method == "improved":
                c = clean_trajectory(t.actions, t.screens, t.instruction, states_cache)
                cleaned[t.episode_id] = c
                actions_of[t.episode_id] = c.actions
            else:
                actions_of[t.episode_id] = t.actions
        if method == "improved":
            actions_of = generalise_rare_target_texts(
                actions_of, dict.fromkeys(actions_of, task_id), 0.0, {task_id: state.common_texts}
            )
        table, codes = build_match_table_encoded(
            [*state.recipes, *(actions_of[t.episode_id] for t in episodes)],
            embed,
            mode="soft",
            input_target_must_match=options["input_target_must_match"],
        )
        recipes = tuple(
            Recipe(
                recipe_id=task_recipe_id(rid),
                task_id=task_id,
                actions=actions,
                symbols=tuple(codes[k].tolist()),
                member_episode_ids=(),
                anchor_step_indices=(),
            )
            for k, (rid, actions) in enumerate(zip(state.recipe_ids, state.recipes, strict=True))
        )
        library = TaskRecipes(task_id, recipes, (), state.n_successes)
        new = [
            Episode(t.episode_id, actions_of[t.episode_id], t.success and t.source in RECIPE_SOURCES) for t in episodes
        ]
        tie_break: TieBreak = options["tie_break"]
        labels = assign_progress_labels(
            {task_id: new},
            {task_id: library},
            {task_id: table},
            codes_by_episode={e.episode_id: codes[len(recipes) + k] for k, e in enumerate(new)},
            tie_break=tie_break,
        )
        for e in new:
            add_lcs_labels(run.labels, labels[e.episode_id], method, cleaned.get(e.episode_id), state.version)
    return run
