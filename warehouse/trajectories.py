"""Episodes and steps from the warehouse as model objects (actions with their screens)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa

from warehouse.catalog import Warehouse
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.schema import EPISODES, STEPS, append_step


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


def screens_from_arrow(column: pa.ChunkedArray) -> list[Screen]:
    """The ``screen`` column (list of element structs) as Screens, converted field by field: far
    faster than turning every struct into a dict first."""
    screens: list[Screen] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_pylist()
        flat = chunk.values
        values = {name: flat.field(name).to_pylist() for name in _ELEMENT_FIELDS}
        values["bounds"] = [tuple(b) if b is not None else (0.0, 0.0, 0.0, 0.0) for b in values["bounds"]]
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
        f"SELECT e.episode_id, e.task_id, e.instruction, e.task_fields, e.source, e.success, e.parent_episode_id "
        f"FROM episodes e WHERE {where} ORDER BY e.episode_id",
        params,
    ).to_pylist()
    for start in range(0, len(episodes), batch_episodes):
        batch = episodes[start : start + batch_episodes]
        ids = [e["episode_id"] for e in batch]
        steps_table = warehouse.query(
            "SELECT episode_id, step_idx, action_type, action_text, target_ref, target_role, target_text, "
            "target_element_id, target_bounds, input_text, scroll_direction, milestones_hit"
            + (", screen" if with_screens else "")
            + " FROM steps WHERE list_contains(?, episode_id) ORDER BY episode_id, step_idx",
            [ids],
        )
        if with_screens:
            all_screens = screens_from_arrow(steps_table.column("screen"))
            steps_table = steps_table.drop_columns(["screen"])
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
            )


def trajectories_to_tables(
    trajectories: Iterable[Trajectory], *, created_at, run_id: str | None, env_backend: str | None = None
) -> tuple[pa.Table, pa.Table]:
    """Trajectories -> (episodes, steps) Arrow tables in the warehouse schemas."""
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
            )
    return pa.Table.from_pylist(episodes, schema=EPISODES), pa.Table.from_pydict(steps, schema=STEPS)
