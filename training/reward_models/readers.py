"""Reading what the reward-model datasets need from the warehouse: splits, progress labels,
human verdicts and text trajectories."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa

from training.base.states import TextStep, TextTrajectory, action_in_context, screen_lines, target_context
from training.reward_models.examples import AlternativeLabel, EpisodeLabels, SplitInfo
from training.reward_models.exploits import PaidEpisode
from training.reward_models.kinds import Verdict
from training.reward_models.labels import human_step_verdicts
from warehouse.catalog import Warehouse
from warehouse.purposes import purpose_filter

log = logging.getLogger(__name__)


def read_splits(warehouse: Warehouse) -> dict[str, SplitInfo]:
    """``progress_split``: episode -> split (train / validation / test), goal, sampled steps."""
    table = warehouse.query("SELECT * FROM progress_split")
    has_list = "sampled_steps" in table.column_names
    return {
        r["episode_id"]: SplitInfo(
            r["split"],
            r.get("goal_key"),
            r.get("n_steps_sampled"),
            tuple(r["sampled_steps"]) if has_list and r["sampled_steps"] is not None else None,
        )
        for r in table.to_pylist()
    }


def read_progress_labels(warehouse: Warehouse, source: str, method: str | None = None) -> dict[str, EpisodeLabels]:
    """``progress_labels`` of one source (and LCS method) per episode, in step order.

    If several label versions are current for the same source and method, the latest
    ``label_version`` (lexicographic) wins, so one episode never mixes versions.
    """
    sql = "SELECT episode_id, step_idx, progress, is_key_step, label_version FROM progress_labels WHERE source = ?"
    params: list = [source]
    if method is not None:
        sql += " AND method = ?"
        params.append(method)
    table = warehouse.query(sql + " ORDER BY episode_id, label_version, step_idx", params)
    grouped: dict[tuple[str, str | None], list[tuple[int, float, bool]]] = defaultdict(list)
    for r in table.to_pylist():
        grouped[(r["episode_id"], r["label_version"])].append((r["step_idx"], r["progress"], r["is_key_step"]))
    result: dict[str, EpisodeLabels] = {}
    for (episode_id, version), steps in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        steps.sort()
        if [s[0] for s in steps] != list(range(len(steps))):
            continue  # gaps in step indices: not a usable label sequence
        result[episode_id] = EpisodeLabels(tuple(float(s[1]) for s in steps), tuple(bool(s[2]) for s in steps), version)
    return result


def read_human_verdicts(warehouse: Warehouse) -> tuple[dict[tuple[str, int], tuple[Verdict, int]], list[str]]:
    """Human step-correctness verdicts and the tables they came from (empty when there are none:
    the annotation stage may not have run, or its views may not exist yet).

    ``human_step_labels`` (the annotation stage's per-step aggregate: majority of usable votes,
    null on a tie) is read when it has rows; otherwise ``human_labels`` itself, keeping the
    ``step_correctness`` interface's active, not skipped answers, by majority vote here.
    A step whose only answers were ``unsure`` is ``unsure`` (filtered, GUI-Shepherd App. A.2).
    """
    if warehouse.has_table("human_step_labels"):
        table = warehouse.query("SELECT * FROM human_step_labels")
        if table.num_rows and {"episode_id", "step_idx", "correctness"} <= set(table.column_names):
            verdicts: dict[tuple[str, int], tuple[Verdict, int]] = {}
            for r in table.to_pylist():
                votes = int(r.get("correctness_votes") or 0) + int(r.get("unsure_votes") or 0)
                if r["correctness"] in ("positive", "negative"):
                    verdicts[(r["episode_id"], int(r["step_idx"]))] = (r["correctness"], votes)
                elif votes:
                    verdicts[(r["episode_id"], int(r["step_idx"]))] = ("unsure", votes)
            return verdicts, ["human_step_labels"]
    if not warehouse.has_table("human_labels"):
        return {}, []
    table = warehouse.query("SELECT * FROM human_labels")
    columns = set(table.column_names)
    if not table.num_rows or not {"episode_id", "step_idx", "label"} <= columns:
        return {}, []
    rows = [
        r
        for r in table.to_pylist()
        if r["episode_id"] is not None
        and r["step_idx"] is not None
        and r.get("interface", "step_correctness") in ("step_correctness", None)
        and r.get("status", "active") in ("active", None)
        and not r.get("was_cancelled")
    ]
    return human_step_verdicts(rows), ["human_labels"]


def read_alternatives(warehouse: Warehouse) -> list[AlternativeLabel]:
    """The alternatives (``step_alternatives``: replayed, or labelled from the recording where no replay
    reproduced the state) at states of training episodes only: those at states of evaluation
    episodes are the held-out set the report measures on, never trained on."""
    if not warehouse.has_table("step_alternatives"):
        return []
    rows = warehouse.query(
        "SELECT alternative_id, state_id, episode_id, step_idx, action_description, mc_value, ended, ended_success, "
        "milestones_hit, labelled_by, is_recorded, matches_plan, field_match "
        f"FROM step_alternatives WHERE {purpose_filter('purpose')} ORDER BY alternative_id"
    ).to_pylist()
    return [alternative_label(r) for r in rows]


def alternative_label(row: Mapping[str, Any]) -> AlternativeLabel:
    """A ``step_alternatives`` row as the step judges read it (:meth:`AlternativeLabel.verdict`)."""
    return AlternativeLabel(
        alternative_id=row["alternative_id"],
        state_id=row["state_id"],
        episode_id=row["episode_id"],
        step_idx=int(row["step_idx"]),
        description=row["action_description"] or "",
        mc_value=row["mc_value"],
        ended=bool(row["ended"]),
        ended_success=bool(row["ended_success"]),
        milestones_hit=tuple(row["milestones_hit"] or ()),
        labelled_by=row["labelled_by"],
        is_recorded=bool(row["is_recorded"]),
        matches_plan=row["matches_plan"],
        field_match=row["field_match"],
    )


def read_trajectories(
    warehouse: Warehouse,
    episode_ids: Iterable[str] | None = None,
    *,
    batch_rows: int = 4096,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, TextTrajectory]:
    """Episodes and their steps as :class:`TextTrajectory` objects (screens rendered to lines), with
    the screen after the last action where the episode stored one (rollouts: RL scores its episodes
    with it too, ``training.rl.rewards.base``, so a model is trained on what it is served).

    ``episode_ids`` restricts the read (e.g. one split); steps are converted in batches so the
    screens of the whole corpus never exist as Python objects at once.
    """
    where, params = "", []
    ids = sorted(set(episode_ids)) if episode_ids is not None else None
    if ids is not None:
        if not ids:
            return {}
        where, params = "WHERE e.episode_id IN (SELECT unnest(?))", [ids]
    episodes = {
        r["episode_id"]: r
        for r in warehouse.query(
            f"SELECT e.episode_id, e.task_id, e.instruction, e.success FROM episodes e {where}", params
        ).to_pylist()
    }
    steps_table = warehouse.query(
        f"SELECT s.episode_id, s.step_idx, s.action_text, s.target_ref, s.screen FROM steps s "
        f"JOIN episodes e USING (episode_id) {where} ORDER BY s.episode_id, s.step_idx",
        params,
    )
    from warehouse.trajectories import final_screens as stored_final_screens
    from warehouse.trajectories import screens_from_arrow

    final_screens = {
        episode_id: screen_lines(screen) for episode_id, screen in stored_final_screens(warehouse, ids).items()
    }
    steps: dict[str, list[TextStep]] = defaultdict(list)
    done = 0
    for batch in steps_table.to_batches(max_chunksize=batch_rows):
        # a batch is a slice of the query's table: rebase its list offsets first, else every batch
        # would convert the elements of the whole table
        screens = screens_from_arrow(pa.chunked_array([pa.concat_arrays([batch.column("screen")])]))
        for episode_id, action, target_ref, screen in zip(
            batch.column("episode_id").to_pylist(),
            batch.column("action_text").to_pylist(),
            batch.column("target_ref").to_pylist(),
            screens,
            strict=True,
        ):
            context = target_context(screen.elements, target_ref)
            steps[episode_id].append(TextStep(screen_lines(screen), action_in_context(action, context)))
        done += batch.num_rows
        if progress is not None:
            progress(done, steps_table.num_rows)
    return {
        episode_id: TextTrajectory(
            episode_id=episode_id,
            task_id=e["task_id"],
            instruction=e["instruction"] or "",
            steps=tuple(steps.get(episode_id, ())),
            success=e["success"],
            final_screen_lines=final_screens.get(episode_id),
        )
        for episode_id, e in episodes.items()
    }


def read_paid_episodes(warehouse: Warehouse) -> list[PaidEpisode]:
    """Every RL training episode with what its run paid it (``rl_step_rewards``' rewards summed
    over its steps), its task and success: what :func:`exploits.select_exploits` chooses from.
    Empty before any RL run."""
    if not warehouse.has_table("rl_step_rewards"):
        return []
    rows = warehouse.query(
        "SELECT episode_id, run_key, task_id, reward, success FROM rl_episode_rewards "
        "WHERE run_key IS NOT NULL AND reward IS NOT NULL ORDER BY episode_id"
    ).to_pylist()
    return [
        PaidEpisode(r["episode_id"], r["run_key"], r["task_id"], float(r["reward"]), bool(r["success"])) for r in rows
    ]
