"""Episodes and steps from the warehouse as model objects (actions with their screens)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa

from warehouse.catalog import Warehouse
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES, STEPS, append_step, element_records


@dataclass(frozen=True)
class Trajectory:
    episode_id: str
    task_id: str
    instruction: str
    source: str
    success: bool
    actions: tuple[Action, ...]
    screens: tuple[Screen, ...]  # the screen before each step
    milestones_hit: tuple[tuple[str, ...], ...] | None = None  # online milestone hits, when recorded
    fields: dict[str, Any] = field(default_factory=dict)
    parent_episode_id: str | None = None
    final_screen: Screen | None = None  # the screen after the last action, where the rollout stored it
    spec_digest: str | None = None  # the spec version that recorded ``milestones_hit`` (rollouts)
    # steps whose action the environment did not carry out (a rollout's ``steps.problem``; a
    # recording's problem is the importer's, and its action did happen)
    failed_steps: frozenset[int] = frozenset()
    # False when loaded without its screens (``load_trajectories(with_screens=False)``): each step's
    # screen is then an empty placeholder, which must not be read as what the page showed
    screens_loaded: bool = True

    @property
    def n_steps(self) -> int:
        return len(self.actions)

    def screens_after(self) -> list[Screen | None]:
        """The screen after each step: the next step's screen; unknown (None) after the last."""
        return [*self.screens[1:], None]


def action_from_row(row: dict[str, Any], screen: Screen) -> Action:
    """Rebuild a step's typed action; the target is the element of the step's screen it names."""
    target: UIElement | None = None
    if row.get("target_ref") is not None:
        target = screen.by_ref(row["target_ref"]) or UIElement(
            ref=row["target_ref"],
            role=row.get("target_role") or "",
            text=row.get("target_text") or "",
            element_id=row.get("target_element_id") or "",
            bounds=tuple(row.get("target_bounds") or (0, 0, 0, 0)),
        )
    try:
        kind = ActionType(row["action_type"])
    except ValueError:
        # Kept, never matched, and reported by the labellers: one odd step must not stop a corpus.
        return Action(ActionType.UNKNOWN, detail=f"unknown action type {row['action_type']!r}")
    text = row.get("input_text")
    if text is None and kind in (ActionType.PRESS_KEY, ActionType.ANSWER, ActionType.OPEN_APP):
        text = _text_argument(row["action_text"])
    return Action(kind, target=target, text=text, direction=row.get("scroll_direction"))


def _text_argument(action_text: str) -> str | None:
    """The quoted text argument at the end of a canonical action string, e.g. PRESS_KEY(..., "Enter")."""
    if not action_text.endswith('")'):
        return None
    start = action_text.rfind(', "')
    start = start + 2 if start >= 0 else action_text.find('("') + 1
    try:
        return json.loads(action_text[start:-1])
    except (json.JSONDecodeError, ValueError):
        return None


_ELEMENT_FIELDS = [f.name for f in fields(UIElement)]
#: ``episodes.source`` of live rollouts (``envs.protocol.episode_tables``): their ``steps.problem`` is a failed action.
ROLLOUT_SOURCE = "rollout"
#: ``steps.problem`` written back for a failed step by :func:`trajectories_to_tables` (the text is not kept).
FAILED_STEP_PROBLEM = "the action was not carried out"


def _python_values(array: pa.Array) -> list:
    """An Arrow column as Python values, strings deduplicated (far faster than ``to_pylist``:
    pyarrow's NumPy conversion builds each distinct string once)."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array.to_numpy(zero_copy_only=False).tolist()
    return array.to_pylist()


def _bounds(array: pa.Array) -> list[tuple[float, float, float, float]]:
    """The ``bounds`` column (lists of 4 floats) as tuples; a missing one is (0, 0, 0, 0)."""
    if array.null_count == 0 and len(array) and pa.types.is_list(array.type):
        offsets = array.offsets.to_numpy()
        if (np.diff(offsets) == 4).all():
            flat = array.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
            return list(map(tuple, flat.astype(np.float64).reshape(-1, 4).tolist()))
    return [tuple(b) if b is not None else (0.0, 0.0, 0.0, 0.0) for b in array.to_pylist()]


def screens_from_arrow(column: pa.ChunkedArray) -> list[Screen]:
    """The ``screen`` column (list of element structs) as Screens, converted field by field: far
    faster than turning every struct into a dict first."""
    screens: list[Screen] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_pylist()
        flat = chunk.values
        values = {name: _python_values(flat.field(name)) for name in _ELEMENT_FIELDS if name != "bounds"}
        values["bounds"] = _bounds(flat.field("bounds"))
        for text_field in ("text", "element_id", "classes", "description"):
            values[text_field] = [v or "" for v in values[text_field]]
        for flag in ("clickable", "editable", "focused"):
            values[flag] = [bool(v) for v in values[flag]]
        values["depth"] = [v or 0 for v in values["depth"]]
        elements = list(map(UIElement, *(values[name] for name in _ELEMENT_FIELDS)))
        valid = chunk.is_valid().to_pylist()
        for k in range(len(chunk)):
            screens.append(Screen(tuple(elements[offsets[k] : offsets[k + 1]]) if valid[k] else ()))
    return screens


_EPISODE_COLUMNS = (
    "e.episode_id, e.task_id, e.instruction, e.task_fields, e.source, e.success, e.parent_episode_id, e.n_steps, "
    "e.spec_digest"
)


def load_trajectories(
    warehouse: Warehouse,
    where: str = "TRUE",
    params: list | None = None,
    *,
    batch_episodes: int = 2000,
    with_screens: bool = True,
) -> Iterator[Trajectory]:
    """Trajectories of the episodes matching ``where`` (SQL over ``episodes e``), in episode order.

    ``with_screens=False`` skips the screens (the bulk of the data) for callers that only need
    the actions and outcomes; each step's screen is then empty."""
    episodes = warehouse.query(
        f"SELECT {_EPISODE_COLUMNS} FROM episodes e WHERE {where} ORDER BY e.episode_id", params
    ).to_pylist()
    for start in range(0, len(episodes), batch_episodes):
        yield from _trajectories(warehouse, episodes[start : start + batch_episodes], with_screens)


def _trajectories(warehouse: Warehouse, batch: list[dict], with_screens: bool) -> Iterator[Trajectory]:
    """The trajectories of these episode rows (one query for all their steps), in the rows' order."""
    ids = [e["episode_id"] for e in batch]
    steps_table = warehouse.query(
        "SELECT episode_id, step_idx, action_type, action_text, target_ref, target_role, target_text, "
        "target_element_id, target_bounds, input_text, scroll_direction, milestones_hit, problem"
        + (", screen" if with_screens else "")
        + " FROM steps WHERE list_contains(?, episode_id) ORDER BY episode_id, step_idx",
        [ids],
    )
    stored_finals: dict[str, Screen] = {}
    if with_screens:
        all_screens = screens_from_arrow(steps_table.column("screen"))
        steps_table = steps_table.drop_columns(["screen"])
        stored_finals = final_screens(warehouse, ids)
    else:
        all_screens = [Screen(())] * steps_table.num_rows
    rows = steps_table.to_pylist()
    by_episode: dict[str, list[tuple[dict, Screen]]] = {}
    for row, screen in zip(rows, all_screens, strict=False):
        by_episode.setdefault(row["episode_id"], []).append((row, screen))
    for e in batch:
        steps = by_episode.get(e["episode_id"], [])
        screens = tuple(screen for _, screen in steps)
        actions = tuple(action_from_row(r, screen) for r, screen in steps)
        recorded = [r["milestones_hit"] for r, _ in steps]
        milestones = tuple(tuple(m or ()) for m in recorded) if any(m is not None for m in recorded) else None
        yield Trajectory(
            episode_id=e["episode_id"],
            task_id=e["task_id"],
            instruction=e["instruction"] or "",
            source=e["source"],
            success=bool(e["success"]),
            actions=actions,
            screens=screens,
            milestones_hit=milestones,
            fields=json.loads(e["task_fields"]) if e.get("task_fields") else {},
            parent_episode_id=e.get("parent_episode_id"),
            final_screen=stored_finals.get(e["episode_id"]),
            spec_digest=e.get("spec_digest"),
            failed_steps=frozenset(i for i, (r, _) in enumerate(steps) if r["problem"] is not None)
            if e["source"] == ROLLOUT_SOURCE
            else frozenset(),
            screens_loaded=with_screens,
        )


def final_screens(warehouse: Warehouse, ids: list[str] | None = None) -> dict[str, Screen]:
    """Episode id -> the final screen stored with it, for these episodes (default: all); episodes
    without one are left out."""
    where, params = ("AND list_contains(?, episode_id)", [ids]) if ids is not None else ("", None)
    table = warehouse.query(
        f"SELECT episode_id, final_screen FROM episodes WHERE final_screen IS NOT NULL {where}", params
    )
    screens = screens_from_arrow(table.column("final_screen")) if table.num_rows else []
    return dict(zip(table.column("episode_id").to_pylist(), screens, strict=True))


def iter_task_batches(
    warehouse: Warehouse,
    where: str = "TRUE",
    params: list | None = None,
    *,
    max_episodes: int = 4000,
    with_screens: bool = True,
) -> Iterator[list[Trajectory]]:
    """The trajectories matching ``where``, a batch of whole tasks at a time: every episode of a
    task is in the same batch, tasks are added to a batch while it has fewer than
    ``max_episodes`` episodes (a bigger task is a batch of its own), and within a task episodes
    come in episode order, as :func:`load_trajectories` gives them. Memory: one batch."""
    episodes = warehouse.query(
        f"SELECT {_EPISODE_COLUMNS} FROM episodes e WHERE {where} ORDER BY e.task_id, e.episode_id", params
    ).to_pylist()
    batch: list[dict] = []
    for start, end in _task_spans(episodes):
        if batch and len(batch) + (end - start) > max_episodes:
            yield list(_trajectories(warehouse, batch, with_screens))
            batch = []
        batch.extend(episodes[start:end])
    if batch:
        yield list(_trajectories(warehouse, batch, with_screens))


def _task_spans(episodes: list[dict]) -> Iterator[tuple[int, int]]:
    """(start, end) of each task's run in rows ordered by task."""
    start = 0
    for k in range(1, len(episodes) + 1):
        if k == len(episodes) or episodes[k]["task_id"] != episodes[start]["task_id"]:
            yield start, k
            start = k


def task_batches(trajectories: Iterable[Trajectory], max_episodes: int = 4000) -> Iterator[list[Trajectory]]:
    """In-memory trajectories grouped like :func:`iter_task_batches` (tasks in order of first
    appearance, each task's episodes in their given order)."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t)
    batch: list[Trajectory] = []
    for episodes in by_task.values():
        if batch and len(batch) + len(episodes) > max_episodes:
            yield batch
            batch = []
        batch.extend(episodes)
    if batch:
        yield batch


def trajectories_to_tables(
    trajectories: Iterable[Trajectory],
    *,
    created_at,
    run_id: str | None,
    purpose: EpisodePurpose,
    env_backend: str | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Trajectories -> (episodes, steps) Arrow tables in the warehouse schemas, all of ``purpose``."""
    episodes: list[dict] = []
    steps: dict[str, list] = {name: [] for name in STEPS.names}
    for t in trajectories:
        episodes.append(
            {
                "episode_id": t.episode_id,
                "task_id": t.task_id,
                "task_family": "miniwob" if env_backend in (None, "miniwob") else env_backend,
                "instruction": t.instruction,
                "task_fields": json.dumps(t.fields, sort_keys=True) if t.fields else None,
                "source": t.source,
                "purpose": EpisodePurpose(purpose).value,
                "parent_episode_id": t.parent_episode_id,
                "policy_id": None,
                "env_backend": env_backend,
                "seed": None,
                "success": t.success,
                "outcome_reward": 1.0 if t.success else 0.0,
                "decayed_reward": None,
                "n_steps": t.n_steps,
                "duration_ms": None,
                "source_file": None,
                "source_sha256": None,
                "import_root": None,
                "created_at": created_at,
                "run_id": run_id,
                "final_screen": element_records(t.final_screen) if t.final_screen is not None else None,
                "spec_digest": t.spec_digest,
            }
        )
        for idx, (action, screen) in enumerate(zip(t.actions, t.screens, strict=False)):
            append_step(
                steps,
                t.episode_id,
                idx,
                action,
                screen,
                milestones_hit=list(t.milestones_hit[idx]) if t.milestones_hit else None,
                done=idx == t.n_steps - 1,
                problem=FAILED_STEP_PROBLEM if idx in t.failed_steps else None,
            )
    return pa.Table.from_pylist(episodes, schema=EPISODES), pa.Table.from_pydict(steps, schema=STEPS)
