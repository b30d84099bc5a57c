"""What goes into Label Studio: steps as annotators see them, and the queue items of each interface.

Pure functions over plain rows and Arrow tables (the stage module, :mod:`annotation.labelstudio.human_labels`,
reads them from the warehouse):

* step interfaces (``step_correctness``, ``step_progress``): one item per selected step, with the
  current reward model's prediction as a pre-annotation;
* ``milestone_review``: one item per milestone set, next to a typical successful episode of its task;
* ``milestone_match``: milestone-action pairs near the automatic matcher's threshold (ADMIRE App. B.4.2).

An item's HTML is rendered lazily (``QueueItem.data`` is a function), so only items that are
actually pushed cost rendering.
"""

from __future__ import annotations

import base64
import functools
import mimetypes
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from annotation.labelstudio.interfaces import (
    INTERFACES,
    STEP_INTERFACES,
    Interface,
    correctness_prediction,
    match_prediction,
    progress_prediction,
)
from annotation.labelstudio.push import QueueItem, match_task_data, milestone_review_data, step_task_data
from annotation.labelstudio.render import StepView
from annotation.labelstudio.selection import (
    MatchPairCandidate,
    match_item_key,
    milestone_set_item_key,
    stable_hash,
    step_item_key,
)
from warehouse.trajectories import screens_from_arrow

StepKey = tuple[str, int]
MAX_INLINE_SCREENSHOT_BYTES = 400_000
#: Episodes per task and outcome whose steps are paired with milestones (keeps large corpora cheap).
MATCH_EPISODES_PER_STRATUM = 4


# -- steps as annotators see them ----------------------------------------------------------------


def screenshot_url(path: str | None, home: Path, local_root: Path | None) -> str | None:
    """A URL Label Studio can show for a screenshot (relative paths are under ``home``).

    On the project's own server (``local_root`` = STEPWISE_HOME, which every project has as a
    local-files storage) a file under it is served at ``/data/local-files/?d=<path relative to the
    server's document root, the parent of STEPWISE_HOME>``; anywhere else it is inlined as a data
    URI when small (<= 400 kB), else left out.
    """
    if not path:
        return None
    file = Path(path)
    if not file.is_absolute():
        file = home / file
    if not file.is_file():
        return None
    if local_root is not None:
        root = local_root.resolve()
        if file.resolve().is_relative_to(root):
            return f"/data/local-files/?d={file.resolve().relative_to(root.parent)}"
    if file.stat().st_size > MAX_INLINE_SCREENSHOT_BYTES:
        return None
    mime = mimetypes.guess_type(file.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(file.read_bytes()).decode()}"


def action_histories(actions: Iterable[Mapping[str, Any]], keys: set[StepKey]) -> dict[StepKey, tuple[str, ...]]:
    """The earlier actions of each step in ``keys``, from rows (episode_id, step_idx, action_text) in step order."""
    history: dict[StepKey, tuple[str, ...]] = {}
    current: str | None = None
    done: list[str] = []
    for row in actions:
        if row["episode_id"] != current:
            current, done = row["episode_id"], []
        key = (row["episode_id"], int(row["step_idx"]))
        if key in keys:
            history[key] = tuple(done)
        done.append(row["action_text"])
    return history


def step_views(
    table: pa.Table,
    histories: Mapping[StepKey, tuple[str, ...]],
    *,
    home: Path,
    local_root: Path | None,
) -> dict[StepKey, StepView]:
    """StepViews from steps joined with their episodes (the ``steps`` columns an annotator sees, plus
    task_id and instruction), converting the screens column-wise."""
    screens = screens_from_arrow(table.column("screen"))
    columns = {name: table.column(name).to_pylist() for name in table.column_names if name != "screen"}
    views: dict[StepKey, StepView] = {}
    for i, screen in enumerate(screens):
        key = (columns["episode_id"][i], int(columns["step_idx"][i]))
        views[key] = StepView(
            episode_id=key[0],
            step_idx=key[1],
            task_id=columns["task_id"][i],
            instruction=columns["instruction"][i] or "",
            screen=screen,
            action_type=columns["action_type"][i],
            action_text=columns["action_text"][i],
            target_ref=columns["target_ref"][i],
            input_text=columns["input_text"][i],
            scroll_direction=columns["scroll_direction"][i],
            history=histories.get(key, ()),
            screenshot_url=screenshot_url(columns["screenshot_path"][i], home, local_root),
        )
    return views


# -- step interfaces ------------------------------------------------------------------------------


def queued_step_keys(queue: Iterable[Mapping[str, Any]]) -> set[StepKey]:
    """The steps already queued for a step interface (``annotation_queue`` rows), on any server."""
    return {
        (r["episode_id"], int(r["step_idx"]))
        for r in queue
        if r["interface"] in STEP_INTERFACES and r["episode_id"] is not None
    }


def step_prediction(interface: str, row: Mapping[str, Any], step_prob: float | None = None) -> dict | None:
    """The pre-annotation for a step from the current model (None without one).

    A progress model predicts progress directly, and correctness as "progress rose"; a step
    judge's probability ``step_prob`` predicts correctness only.
    """
    model, value = row.get("model_id"), row.get("model_progress")
    if not model:
        return None
    if value is None:
        if step_prob is None or interface != "step_correctness":
            return None
        label = "positive" if step_prob > 0.5 else "negative"
        confidence = max(step_prob, 1.0 - step_prob)
        return {"model_version": model, "score": round(confidence, 4), "result": correctness_prediction(label)}
    if interface == "step_progress":
        return {"model_version": model, "score": 1.0, "result": progress_prediction(float(value))}
    previous = row.get("model_previous_progress")
    delta = float(value) - float(previous if previous is not None else 0.0)
    label = "positive" if delta > 0 else "negative"
    return {
        "model_version": model,
        "score": round(min(1.0, 0.5 + abs(delta)), 4),
        "result": correctness_prediction(label),
    }


def step_items(
    candidates: Sequence[Mapping[str, Any]],
    views: Mapping[StepKey, StepView],
    interfaces: Sequence[str],
    step_probs: Mapping[StepKey, float] | None = None,
) -> dict[str, list[QueueItem]]:
    """Queue items of the step interfaces for ``annotation_candidates`` rows (steps without a view are left out)."""
    names = [i for i in interfaces if i in STEP_INTERFACES]
    rendered: dict[str, dict] = {}  # the HTML of a step, shared by the step interfaces

    def render(view: StepView, interface: Interface, key: str, reason: str | None) -> dict:
        if key not in rendered:
            rendered[key] = step_task_data(view, interface=interface, item_key=key, extra={"reason": reason})
        data = rendered.pop(key) if len(names) == 1 else dict(rendered[key])
        data["interface_version"] = interface.version_key
        return data

    items: dict[str, list[QueueItem]] = defaultdict(list)
    for name in names:
        interface = INTERFACES[name]
        for c in candidates:
            step = (c["episode_id"], int(c["step_idx"]))
            view = views.get(step)
            if view is None:
                continue
            key = step_item_key(view.episode_id, view.step_idx)
            prediction = step_prediction(name, c, (step_probs or {}).get(step))
            fields = {
                k: c.get(k)
                for k in (
                    "success",
                    "stratum",
                    "reason",
                    "uncertainty",
                    "lcs_progress",
                    "env_progress",
                    "model_progress",
                )
            }
            if prediction:
                first = prediction["result"][0]["value"]
                fields["prediction_label"] = (first.get("choices") or [None])[0]
                fields["prediction_value"] = first.get("number") / 100 if first.get("number") is not None else None
            data = functools.partial(render, view, interface, key, c.get("reason"))
            items[name].append(QueueItem(name, key, data, prediction, fields))
    return items


# -- milestone sets ------------------------------------------------------------------------------------


def milestone_sets_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Milestone sets from rows (task_id, set_id, text, ord) of a ``milestones`` table.

    A set is {milestone_set_id, task_id, source, milestones: [text, ...]}, milestones in ``ord``
    order (row order where ``ord`` is null).
    """
    sets: dict[tuple, list] = defaultdict(list)
    for row in rows:
        members = sets[(row["task_id"], row["set_id"])]
        members.append((row["ord"] if row["ord"] is not None else len(members), row["text"]))
    return [
        {
            "milestone_set_id": f"{task}:{set_id or 'v0'}",
            "task_id": task,
            "source": "milestones",
            "milestones": [t for _, t in sorted(ms, key=lambda m: m[0])],
        }
        for (task, set_id), ms in sorted(sets.items(), key=str)
    ]


def milestone_sets_from_specs(folder: Path) -> list[dict]:
    """Milestone sets from the task specs under ``folder`` (and its sub-folders), one per task with milestones."""
    from envs.tasks import load_task_specs

    out = []
    for sub in sorted(p for p in [folder, *folder.glob("*")] if p.is_dir()):
        try:
            specs = load_task_specs(sub)
        except Exception:  # noqa: BLE001 - a folder without specs, or a spec another stage is still writing
            continue
        for task_id, spec in sorted(specs.items()):
            if spec.milestones:
                out.append(
                    {
                        "milestone_set_id": f"{task_id}:spec",
                        "task_id": task_id,
                        "source": "task_spec",
                        "milestones": [m.name for m in spec.milestones],
                    }
                )
    return list({s["milestone_set_id"]: s for s in out}.values())


def review_choices(
    sets: Sequence[dict], episodes_by_task: Mapping[str, Sequence[dict]], queued_keys: set[str], room: int
) -> list[tuple[dict, dict | None]]:
    """Up to ``room`` milestone sets not queued yet, each with a typical (median-length) successful
    episode of its task."""
    chosen = [s for s in sets if milestone_set_item_key(s["milestone_set_id"]) not in queued_keys][: max(0, room)]
    out = []
    for s in chosen:
        ok = sorted(
            (e for e in episodes_by_task.get(s["task_id"], []) if e["success"]),
            key=lambda e: (e["n_steps"], e["episode_id"]),
        )
        out.append((s, ok[len(ok) // 2] if ok else None))
    return out


def review_items(
    choices: Sequence[tuple[dict, dict | None]],
    episodes_by_task: Mapping[str, Sequence[dict]],
    reference_views: Mapping[StepKey, StepView],
    reference_actions: Mapping[str, list[str]],
) -> list[QueueItem]:
    """``milestone_review`` items: the milestones next to the reference episode's actions and first screen."""
    interface = INTERFACES["milestone_review"]
    items = []
    for s, ref in choices:
        fallback = (episodes_by_task.get(s["task_id"]) or [{"instruction": s["task_id"]}])[0]["instruction"]
        instruction = ref["instruction"] if ref else fallback
        key = milestone_set_item_key(s["milestone_set_id"])
        data = milestone_review_data(
            instruction=instruction or s["task_id"],
            task_id=s["task_id"],
            milestone_set_id=s["milestone_set_id"],
            milestones=s["milestones"],
            reference=reference_views.get((ref["episode_id"], 0)) if ref else None,
            reference_actions=reference_actions.get(ref["episode_id"], []) if ref else [],
            interface=interface,
            item_key=key,
        )
        fields = {
            "task_id": s["task_id"],
            "milestone_set_id": s["milestone_set_id"],
            "reason": "milestone_review",
            "stratum": f"{s['task_id']}|{s['source']}",
        }
        items.append(QueueItem("milestone_review", key, data, None, fields))
    return items


# -- milestone-action match pairs -------------------------------------------------------------------


def match_episodes(tasks: Iterable[str], episodes_by_task: Mapping[str, Sequence[dict]]) -> list[dict]:
    """A few episodes per task and outcome (a seeded sample), whose steps are paired with milestones."""
    sampled: list[dict] = []
    for task_id in tasks:
        for outcome in (True, False):
            pool = sorted(
                (e for e in episodes_by_task.get(task_id, []) if bool(e["success"]) == outcome),
                key=lambda e: stable_hash(e["episode_id"], seed=7),
            )
            sampled += pool[:MATCH_EPISODES_PER_STRATUM]
    return sampled


def match_pairs(
    sets: Sequence[dict],
    episodes: Sequence[dict],
    actions: Mapping[str, Sequence[tuple[int, str]]],
    similarity: Callable[[Sequence[str], Sequence[str]], np.ndarray],
) -> list[MatchPairCandidate]:
    """Every (milestone, step) of the episodes of the milestone's task, with the matcher's similarity.

    ``actions``: each episode's (step_idx, action_text); ``similarity(milestones, actions)`` a matrix.
    """
    info = {e["episode_id"]: e for e in episodes}
    pairs: list[MatchPairCandidate] = []
    for s in sets:
        for episode_id, steps in actions.items():
            episode = info.get(episode_id)
            if episode is None or episode["task_id"] != s["task_id"] or not steps:
                continue
            matrix = similarity(s["milestones"], [text for _, text in steps])
            for m_idx, milestone in enumerate(s["milestones"]):
                for j, (step_idx, _) in enumerate(steps):
                    pairs.append(
                        MatchPairCandidate(
                            s["milestone_set_id"],
                            m_idx,
                            milestone,
                            episode_id,
                            step_idx,
                            s["task_id"],
                            episode["success"],
                            float(matrix[m_idx, j]),
                        )
                    )
    return pairs


def match_items(
    chosen: Sequence[tuple[MatchPairCandidate, float]],
    views: Mapping[StepKey, StepView],
    sets: Sequence[dict],
    *,
    threshold: float,
    embedder: str,
) -> list[QueueItem]:
    """``milestone_match`` items, with the matcher's verdict (yes at or above ``threshold``) as the pre-annotation."""
    interface = INTERFACES["milestone_match"]
    n_by_set = {s["milestone_set_id"]: len(s["milestones"]) for s in sets}
    matcher = f"matcher:{embedder}@{threshold}"
    items = []
    for pair, score in chosen:
        view = views.get((pair.episode_id, pair.step_idx))
        if view is None:
            continue
        key = match_item_key(pair)
        data = match_task_data(
            view,
            milestone_set_id=pair.milestone_set_id,
            milestone_idx=pair.milestone_idx,
            n_milestones=n_by_set[pair.milestone_set_id],
            milestone=pair.milestone,
            interface=interface,
            item_key=key,
        )
        predicted = "yes" if pair.similarity >= threshold else "no"
        prediction = {
            "model_version": matcher,
            "score": round(pair.similarity, 4),
            "result": match_prediction(predicted),
        }
        fields = {
            "success": pair.success,
            "stratum": pair.stratum,
            "reason": "match_threshold",
            "uncertainty": score,
            "prediction_label": predicted,
            "prediction_value": pair.similarity,
        }
        items.append(QueueItem("milestone_match", key, data, prediction, fields))
    return items
