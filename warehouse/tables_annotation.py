"""Arrow schemas of the human-annotation tables (Label Studio).

Registered into ``warehouse.schema.TABLE_SCHEMAS`` (see ``ANNOTATION_TABLE_SCHEMAS``) so the
catalog keeps one SQL view per table. Column names are part of the interface: plain, stable,
documented in docs/annotation.md.

Identities, so SQL can walk from a label back to what an annotator saw:

* ``ls_server`` names the Label Studio instance ("local" for the project's own server, else the
  host:port of the user's server; never a credential). ``(ls_server, annotation_id)`` identifies
  an annotation, ``(ls_server, ls_project_id, ls_task_id)`` a task.
* ``item_key`` names what was shown: ``step:<episode_id>:<step_idx>``,
  ``milestones:<milestone_set_id>`` or ``match:<milestone_set_id>:<milestone_idx>:<episode_id>:<step_idx>``.
* ``(ls_server, interface_version, item_key)`` is the queue's idempotency key: an item is never
  queued twice for the same version of an interface.
"""

from __future__ import annotations

import pyarrow as pa

from warehouse.keys import with_key

_TS = pa.timestamp("us", tz="UTC")

# Every item pushed to Label Studio, one row per (server, interface version, item): the queue.
ANNOTATION_QUEUE = with_key(
    pa.schema(
        [
            pa.field("ls_server", pa.string(), nullable=False),
            pa.field(
                "interface", pa.string(), nullable=False
            ),  # step_correctness | step_progress | milestone_review | milestone_match
            pa.field("interface_version", pa.string(), nullable=False),  # e.g. step_correctness@1
            pa.field("item_key", pa.string(), nullable=False),
            pa.field("ls_project_id", pa.int64(), nullable=False),
            pa.field("ls_task_id", pa.int64(), nullable=False),
            ("episode_id", pa.string()),
            ("step_idx", pa.int32()),
            ("task_id", pa.string()),  # the GUI task (e.g. MiniWoB++ login-user), not a Label Studio task
            ("success", pa.bool_()),  # the episode's outcome, for stratification
            ("milestone_set_id", pa.string()),
            ("milestone_idx", pa.int32()),
            ("stratum", pa.string()),  # task_id|success|failure: the selection stratum
            (
                "reason",
                pa.string(),
            ),  # label_disagreement | model_disagreement | no_signal | spot_check | milestone_review | match_threshold
            ("uncertainty", pa.float64()),  # in [0, 1]: how unsure the automatic labels are about this item
            ("lcs_progress", pa.float64()),
            ("env_progress", pa.float64()),
            ("model_progress", pa.float64()),
            ("prediction_model", pa.string()),  # the pre-annotation's model version, if one was attached
            ("prediction_label", pa.string()),
            ("prediction_value", pa.float64()),
            (
                "adopted",
                pa.bool_(),
            ),  # found in Label Studio without a queue row (a push interrupted before recording) and recorded then
            ("pushed_at", _TS),
            ("selection_materialization_id", pa.string()),  # the annotation_candidates version the item came from
        ]
    ),
    "ls_server",
    "interface_version",
    "item_key",
)

# Steps picked for people by active selection (the latest selection only).
ANNOTATION_CANDIDATES = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("success", pa.bool_()),
            ("stratum", pa.string()),
            ("reason", pa.string()),
            ("uncertainty", pa.float64()),
            ("rank_in_stratum", pa.int32()),
            ("lcs_progress", pa.float64()),
            ("env_progress", pa.float64()),
            ("lcs_key_step", pa.bool_()),
            ("env_key_step", pa.bool_()),
            ("model_progress", pa.float64()),
            ("model_previous_progress", pa.float64()),
            ("model_id", pa.string()),
        ]
    ),
    "episode_id",
    "step_idx",
)

# One row per Label Studio annotation ever seen: created, updated in place, or retracted.
HUMAN_LABELS = with_key(
    pa.schema(
        [
            pa.field("ls_server", pa.string(), nullable=False),
            pa.field("annotation_id", pa.int64(), nullable=False),
            pa.field("ls_project_id", pa.int64(), nullable=False),
            pa.field("ls_task_id", pa.int64(), nullable=False),
            ("ls_task_url", pa.string()),  # the labeling page of the task (no credentials)
            pa.field("interface", pa.string(), nullable=False),
            ("interface_version", pa.string()),
            ("item_key", pa.string()),
            ("episode_id", pa.string()),
            ("step_idx", pa.int32()),
            ("task_id", pa.string()),
            ("milestone_set_id", pa.string()),
            ("milestone_idx", pa.int32()),
            ("label", pa.string()),  # positive | negative | unsure (correctness); yes | no (match); null otherwise
            ("value", pa.float64()),  # progress in [0, 1] (step_progress); quality score 1-5 (milestone_review)
            ("quality_factuality", pa.string()),  # milestone_review: accurate | minor_issues | hallucinated
            ("quality_order", pa.string()),  # milestone_review: executable | partly | broken
            ("quality_granularity", pa.string()),  # milestone_review: appropriate | too_fine | too_coarse
            ("rationale", pa.string()),
            pa.field("status", pa.string(), nullable=False),  # active | retracted (deleted in Label Studio)
            pa.field("was_cancelled", pa.bool_(), nullable=False),  # the annotator skipped the task
            pa.field("ground_truth", pa.bool_(), nullable=False),
            pa.field("usable_for_training", pa.bool_(), nullable=False),  # active, not skipped, not unsure, has a value
            ("annotator_id", pa.string()),  # pseudonymous: HMAC of the Label Studio user id with a local secret
            ("lead_time_s", pa.float64()),  # seconds the annotator spent (Label Studio's lead_time)
            ("from_prediction", pa.bool_()),  # the annotation started from the pre-annotation
            ("created_at", _TS),
            ("updated_at", _TS),
            ("first_synced_at", _TS),
            ("last_synced_at", _TS),
            ("retracted_at", _TS),
            pa.field("revision", pa.int32(), nullable=False),  # 1 + the number of updates seen
            ("content_hash", pa.string()),  # hash of the annotation's result, to see updates
        ]
    ),
    "ls_server",
    "annotation_id",
)

# Human labels aggregated per step: what reward-model datasets read (unsure, skipped, retracted excluded).
HUMAN_STEP_LABELS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            ("task_id", pa.string()),
            ("correctness", pa.string()),  # positive | negative (majority of usable votes), null on a tie or none
            pa.field("correctness_votes", pa.int32(), nullable=False),
            ("correctness_positive_share", pa.float64()),
            pa.field("unsure_votes", pa.int32(), nullable=False),
            ("progress", pa.float64()),  # mean human progress in [0, 1]
            pa.field("progress_votes", pa.int32(), nullable=False),
            ("progress_std", pa.float64()),
            pa.field("n_annotators", pa.int32(), nullable=False),
            ("label_version", pa.string()),
        ]
    ),
    "episode_id",
    "step_idx",
)

# Per-annotator statistics, one row per (annotator, interface).
ANNOTATOR_STATS = with_key(
    pa.schema(
        [
            pa.field("annotator_id", pa.string(), nullable=False),
            pa.field("interface", pa.string(), nullable=False),
            pa.field("n_annotations", pa.int64(), nullable=False),
            pa.field("n_unsure", pa.int64(), nullable=False),
            pa.field("n_skipped", pa.int64(), nullable=False),
            ("unsure_share", pa.float64()),
            ("median_lead_time_s", pa.float64()),
            ("n_overlapping_tasks", pa.int64()),  # tasks this annotator shares with another annotator
            ("agreement_with_others", pa.float64()),  # share of overlapping tasks where the labels agree
            ("kappa_with_others", pa.float64()),  # Cohen's kappa, pairwise with the other annotators, pooled
        ]
    ),
    "annotator_id",
    "interface",
)

# Agreement between label sources on the same steps (human vs LCS vs environment vs model).
LABEL_SOURCE_AGREEMENT = with_key(
    pa.schema(
        [
            pa.field("source_a", pa.string(), nullable=False),
            pa.field("source_b", pa.string(), nullable=False),
            pa.field("quantity", pa.string(), nullable=False),  # correctness (binary) | progress
            pa.field("n_steps", pa.int64(), nullable=False),
            ("agreement", pa.float64()),  # share of steps with the same binary label
            ("cohen_kappa", pa.float64()),
            ("mean_abs_diff", pa.float64()),  # progress only
            ("pearson_r", pa.float64()),  # progress only
        ]
    ),
    "source_a",
    "source_b",
    "quantity",
)

# LLM-written rationales for human step-correctness labels (GUI-Shepherd §3: people give the binary
# verdict, an LLM explains it), stored with the label: one row per (annotation, revision) asked about.
LABEL_RATIONALES = with_key(
    pa.schema(
        [
            pa.field("ls_server", pa.string(), nullable=False),
            pa.field("annotation_id", pa.int64(), nullable=False),
            pa.field("revision", pa.int32(), nullable=False),  # the human_labels revision the rationale explains
            ("episode_id", pa.string()),
            ("step_idx", pa.int32()),
            ("task_id", pa.string()),
            ("label", pa.string()),  # the human verdict it was conditioned on: positive | negative
            ("rationale", pa.string()),  # the LLM's explanation; null when none was produced
            pa.field("ok", pa.bool_(), nullable=False),  # a rationale was produced and parsed
            ("failure", pa.string()),  # null | endpoint_error | empty | unparsed | prompt_too_long
            ("error", pa.string()),  # one line: why (never a credential)
            ("model", pa.string()),  # the model name the endpoint was asked for
            ("prompt_version", pa.string()),  # e.g. gui-shepherd-rationale@1
            ("endpoint", pa.string()),  # the endpoint's base URL without credentials or query
            ("prompt_chars", pa.int32()),
            ("seconds", pa.float64()),  # the endpoint call's wall time (null when none was made)
            ("created_at", _TS),
        ]
    ),
    "ls_server",
    "annotation_id",
    "revision",
)

ANNOTATION_TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "annotation_candidates": ANNOTATION_CANDIDATES,
    "annotation_queue": ANNOTATION_QUEUE,
    "human_labels": HUMAN_LABELS,
    "human_step_labels": HUMAN_STEP_LABELS,
    "annotator_stats": ANNOTATOR_STATS,
    "label_source_agreement": LABEL_SOURCE_AGREEMENT,
    "label_rationales": LABEL_RATIONALES,
}
