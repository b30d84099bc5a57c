"""Arrow schemas of the warehouse tables.

Column names are part of the product's interface: people write SQL against them, so they are
plain and stable. Episodes and steps follow design.md "Data model".
"""

from __future__ import annotations

import pyarrow as pa

from warehouse.keys import with_key
from warehouse.tables_annotation import ANNOTATION_TABLE_SCHEMAS
from warehouse.tables_guidance import GUIDANCE_TABLE_SCHEMAS
from warehouse.tables_rl import RL_TABLE_SCHEMAS
from warehouse.tables_training import TRAINING_TABLE_SCHEMAS

ELEMENT_TYPE = pa.struct(
    [
        ("ref", pa.string()),
        ("role", pa.string()),
        ("text", pa.string()),
        ("element_id", pa.string()),
        ("classes", pa.string()),
        ("description", pa.string()),
        ("value", pa.string()),
        ("bounds", pa.list_(pa.float32())),
        ("clickable", pa.bool_()),
        ("editable", pa.bool_()),
        ("checked", pa.bool_()),
        ("focused", pa.bool_()),
        ("parent_ref", pa.string()),
        ("depth", pa.int16()),
    ]
)

EPISODES = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("task_family", pa.string()),
            ("instruction", pa.string()),
            ("task_fields", pa.string()),  # JSON of the instruction's slots when the source records them
            pa.field("source", pa.string(), nullable=False),  # human_demo | rollout | synthetic:<kind>
            ("purpose", pa.string()),  # what it may be used for: warehouse.purposes.EpisodePurpose
            ("parent_episode_id", pa.string()),
            ("policy_id", pa.string()),
            ("env_backend", pa.string()),
            ("seed", pa.int64()),
            pa.field("success", pa.bool_(), nullable=False),
            ("outcome_reward", pa.float64()),  # the environment's raw reward (MiniWoB++: 1 success, <= 0 failure)
            ("decayed_reward", pa.float64()),  # MiniWoB++'s time-decayed reward, where recorded
            pa.field("n_steps", pa.int32(), nullable=False),
            ("duration_ms", pa.int64()),
            ("source_file", pa.string()),  # path of the raw file, relative to the import root
            ("source_sha256", pa.string()),  # hash of the decompressed recording: identity of the raw data
            ("import_root", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
            ("run_id", pa.string()),
            # Rollouts: the screen after the last action (the steps hold the screen before each),
            # which the online milestones saw, and the spec version that recorded them
            # (envs.tasks.TaskSpec.milestone_digest); null for recordings and older rollouts.
            ("final_screen", pa.list_(ELEMENT_TYPE)),
            ("spec_digest", pa.string()),
        ]
    ),
    "episode_id",
)

STEPS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            pa.field("action_type", pa.string(), nullable=False),
            pa.field("action_text", pa.string(), nullable=False),  # canonical form, see Action.canonical_text
            ("target_ref", pa.string()),
            ("target_role", pa.string()),
            ("target_text", pa.string()),
            ("target_element_id", pa.string()),
            ("target_bounds", pa.list_(pa.float32())),
            ("input_text", pa.string()),
            ("scroll_direction", pa.string()),
            ("screen", pa.list_(ELEMENT_TYPE)),  # the screen before the action
            ("n_elements", pa.int32()),
            ("screenshot_path", pa.string()),
            ("env_reward", pa.float64()),
            ("milestones_hit", pa.list_(pa.string())),
            ("done", pa.bool_()),
            ("time_ms", pa.int64()),  # time of the action since the episode started
            ("raw_event_first", pa.int32()),  # index range of the raw events this step was built from
            ("raw_event_last", pa.int32()),
            ("problem", pa.string()),  # why the importer could not fully type this step, if so
        ]
    ),
    "episode_id",
    "step_idx",
)

# Every raw file an import saw, and what became of it: the bridge from outputs back to raw data.
SOURCE_FILES = with_key(
    pa.schema(
        [
            pa.field("source_file", pa.string(), nullable=False),
            ("import_root", pa.string()),
            ("file_sha256", pa.string()),  # hash of the bytes on disk
            ("recording_sha256", pa.string()),  # hash of the decompressed recording (equal for links)
            ("link_target", pa.string()),  # set when the file is a git-style link to another file
            pa.field("status", pa.string(), nullable=False),  # imported | duplicate | quarantined
            ("episode_id", pa.string()),
            ("n_steps", pa.int32()),
        ]
    ),
    "import_root",
    "source_file",
)

QUARANTINE = with_key(
    pa.schema(
        [
            pa.field("source_file", pa.string(), nullable=False),
            ("import_root", pa.string()),
            ("event_index", pa.int32()),  # null when the whole file is unreadable
            pa.field("severity", pa.string(), nullable=False),  # file (not imported) | event (step kept as UNKNOWN)
            pa.field("reason", pa.string(), nullable=False),
        ]
    ),
    "import_root",
    "source_file",
    "severity",
    "event_index",
)

# Progress labels per step (ProgRM §2.2): one row per (episode, step, source, method).
PROGRESS_LABELS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            pa.field("source", pa.string(), nullable=False),  # lcs | env | admire | human | model
            ("method", pa.string()),  # for lcs: paper (faithful to ProgRM) | improved
            pa.field("progress", pa.float64(), nullable=False),  # in [0, 1]
            pa.field("is_key_step", pa.bool_(), nullable=False),
            ("recipe_id", pa.string()),
            ("completion_ratio", pa.float64()),
            ("label_version", pa.string()),
        ]
    ),
    "episode_id",
    "step_idx",
    "source",
    "method",
)

# The recipe library (ProgRM §2.2, Eq. 10): one recipe per group of similar successful trajectories.
RECIPES = with_key(
    pa.schema(
        [
            pa.field("recipe_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("method", pa.string()),
            ("group_idx", pa.int32()),
            ("length", pa.int32()),
            ("steps", pa.list_(pa.string())),  # the recipe's action keys, in order
            ("n_members", pa.int32()),
            ("member_episode_ids", pa.list_(pa.string())),
            ("label_version", pa.string()),
        ]
    ),
    "recipe_id",
)

# The reward-model split (ProgRM App. C): split by task goal; failed steps sampled to ~1:1.
PROGRESS_SPLIT = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("goal_key", pa.string()),  # what "same goal" means: task plus instruction slots
            pa.field("split", pa.string(), nullable=False),  # train | validation | test
            ("success", pa.bool_()),
            ("n_steps", pa.int32()),
            ("n_steps_sampled", pa.int32()),  # steps kept by the success:failure balancing
            ("sampled_steps", pa.list_(pa.int32())),  # which step_idx those are
        ]
    ),
    "episode_id",
)

# Why a task has no recipe, or an episode no label (nothing is labelled falsely; the reason is said).
LABEL_NOTES = with_key(
    pa.schema(
        [
            pa.field("scope", pa.string(), nullable=False),  # task | episode | step
            pa.field("key", pa.string(), nullable=False),  # the task id or episode id
            ("method", pa.string()),
            pa.field("reason", pa.string(), nullable=False),
        ]
    ),
    "scope",
    "key",
    "method",
)

# LCS labels scored against milestone ground truth (the label-quality report).
LABEL_QUALITY = with_key(
    pa.schema(
        [
            pa.field("method", pa.string(), nullable=False),
            pa.field("task_set", pa.string(), nullable=False),  # dev | held_out | a task id
            ("tasks", pa.int32()),
            ("episodes", pa.int32()),
            ("key_step_precision", pa.float64()),
            ("key_step_recall", pa.float64()),
            ("key_step_progress_error", pa.float64()),
            ("step_progress_error", pa.float64()),
            ("specs_dir", pa.string()),
        ]
    ),
    "method",
    "task_set",
)

#: The recipe library of one (task, LCS mode), as the last run that built it left it.
LIBRARY_STATE = with_key(
    pa.schema(
        [
            pa.field("task_id", pa.string(), nullable=False),
            pa.field("method", pa.string(), nullable=False),
            pa.field("version", pa.int32(), nullable=False),  # 1 for a full run; +1 at each rebuild since
            ("label_family", pa.string()),
            ("n_successes", pa.int64()),  # recipe-eligible successes the library was built from
            ("n_episodes", pa.int64()),  # episodes of the task labelled with this version so far
            ("recipe_ids", pa.list_(pa.string())),  # as in recipes.recipe_id / progress_labels.recipe_id
            ("recipe_actions", pa.list_(pa.string())),  # per recipe: its actions as JSON
            ("common_texts", pa.list_(pa.string())),  # improved mode: target texts kept (others: <other>)
            ("reason", pa.string()),  # why the task has no recipe, if it has none
            ("built_by", pa.string()),  # materialization id of the run that built this version
            ("label_version", pa.string()),
        ]
    ),
    "task_id",
    "method",
)

#: Every episode the labels stage has handled (labelled, or noted as unlabelable), per family:
#: what an incremental run compares the warehouse with to find new episodes.
LABEL_LEDGER = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("label_family", pa.string()),
            ("success", pa.bool_()),
            ("recipe_eligible", pa.bool_()),
            ("library_versions", pa.string()),  # JSON {method: version} that labelled it
            ("labelled_by", pa.string()),  # materialization id
            # the milestone digest of the spec its env labels were made with ('' without a spec;
            # null: labelled before the ledger recorded it): an incremental run relabels a task whose
            # spec changed since
            ("spec_digest", pa.string()),
        ]
    ),
    "episode_id",
)

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "episodes": EPISODES,
    "steps": STEPS,
    "source_files": SOURCE_FILES,
    "quarantine": QUARANTINE,
    "progress_labels": PROGRESS_LABELS,
    "recipes": RECIPES,
    "progress_split": PROGRESS_SPLIT,
    "label_notes": LABEL_NOTES,
    "label_quality": LABEL_QUALITY,
    "recipe_library_state": LIBRARY_STATE,
    "label_ledger": LABEL_LEDGER,
}


def element_records(screen) -> list[dict]:
    """Screen -> list of dicts matching ELEMENT_TYPE (bounds as 4 floats)."""
    return [
        {
            "ref": e.ref,
            "role": e.role,
            "text": e.text,
            "element_id": e.element_id,
            "classes": e.classes,
            "description": e.description,
            "value": e.value,
            "bounds": list(e.bounds),
            "clickable": e.clickable,
            "editable": e.editable,
            "checked": e.checked,
            "focused": e.focused,
            "parent_ref": e.parent_ref,
            "depth": e.depth,
        }
        for e in screen.elements
    ]


def append_step(
    columns: dict[str, list],
    episode_id: str,
    step_idx: int,
    action,
    screen,
    *,
    env_reward: float | None = None,
    milestones_hit: list[str] | None = None,
    done: bool | None = None,
    time_ms: int | None = None,
    raw_event_first: int | None = None,
    raw_event_last: int | None = None,
    problem: str | None = None,
) -> None:
    """Append one step (its action and the screen before it) to column lists keyed by STEPS' names:
    the one place where a typed action becomes the ``steps`` table's target_* / input / scroll columns."""
    target = action.target
    row = {
        "episode_id": episode_id,
        "step_idx": step_idx,
        "action_type": action.type.value,
        "action_text": action.canonical_text(),
        "target_ref": target.ref if target else None,
        "target_role": target.role if target else None,
        "target_text": target.text if target else None,
        "target_element_id": target.element_id if target else None,
        "target_bounds": list(target.bounds) if target else None,
        "input_text": action.text if action.type.value == "INPUT" else None,
        "scroll_direction": action.direction,
        "screen": element_records(screen),
        "n_elements": len(screen.elements),
        "screenshot_path": screen.screenshot_path,
        "env_reward": env_reward,
        "milestones_hit": milestones_hit,
        "done": done,
        "time_ms": time_ms,
        "raw_event_first": raw_event_first,
        "raw_event_last": raw_event_last,
        "problem": problem,
    }
    for name in STEPS.names:
        columns[name].append(row[name])


def same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Type equality as SQL users see it: time zones compare by presence (DuckDB says Etc/UTC for UTC)."""
    if pa.types.is_timestamp(actual) and pa.types.is_timestamp(expected):
        return actual.unit == expected.unit and (actual.tz is None) == (expected.tz is None)
    return actual.equals(expected)


# Tables defined next to the stages that write them join the registry (views exist, typed,
# before the first write).
for _name, _schema in {
    **ANNOTATION_TABLE_SCHEMAS,
    **TRAINING_TABLE_SCHEMAS,
    **RL_TABLE_SCHEMAS,
    **GUIDANCE_TABLE_SCHEMAS,
}.items():
    TABLE_SCHEMAS.setdefault(_name, _schema)
