"""Arrow schemas of the reward-model tables: datasets, models, predictions and metrics.

Registered into ``warehouse.schema.TABLE_SCHEMAS`` (see ``TRAINING_TABLE_SCHEMAS``), so the catalog
keeps one typed SQL view per table, empty before the first write, and ``Warehouse.stage_table``
casts every write to these types.

Column names are part of the interface (people write SQL against them):

* ``rm_examples``: one training example per row, per reward-model kind (``dataset`` = kind).
  ``history``/``screen_lines``/``action`` are the structured state (ProgRM Eq. 6); ``prompt`` is
  the same state rendered with the kind's prompt (ProgRM Tables 7/8) under the truncation rule.
* ``rm_trl_stepwise``: the step-correctness labels in the stepwise-supervision format of Hugging
  Face TRL's PRM trainer (``prompt``, ``completions``, ``labels``), one row per run of labelled steps.
* ``models``: one row per trained reward model, with its checkpoint and what it was trained on.
* ``rm_predictions``: every score a model gave a held-out step (the report's raw material).
* ``rm_metrics``: the report's metrics, one row per (model, split, metric).
"""

from __future__ import annotations

import pyarrow as pa

from warehouse.keys import with_key

RM_EXAMPLES = with_key(
    pa.schema(
        [
            pa.field("example_id", pa.string(), nullable=False),  # <kind>:<episode_id>:<step_idx> | <kind>:alt:<alt id>
            pa.field("kind", pa.string(), nullable=False),  # orm | progrm_lcs | progrm_env | prm | guidnav
            pa.field("split", pa.string(), nullable=False),  # train | validation | test
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            ("goal_key", pa.string()),
            pa.field("step_idx", pa.int32(), nullable=False),  # the step the label belongs to (ORM: the last step)
            ("n_steps", pa.int32()),
            ("instruction", pa.string()),
            ("history", pa.list_(pa.string())),  # canonical action texts in the state, oldest first
            ("screen_lines", pa.list_(pa.string())),  # the state's screen, one element per line (Screen.to_text)
            ("action", pa.string()),  # the candidate action judged (prm, guidnav); null for progress/outcome models
            ("prompt", pa.string()),  # the rendered prompt (Table 7 / Table 8 / step-judgement variant), truncated
            pa.field("label", pa.float64(), nullable=False),  # in [0, 1]: progress, success, correctness or reward
            ("label_source", pa.string()),  # lcs:paper | lcs:improved | env | outcome | human | derived:<labels>
            ("label_version", pa.string()),  # the version of the labels the example was built from
            ("is_key_step", pa.bool_()),
            ("episode_success", pa.bool_()),
            # alternatives at one state (step judges): the examples of one state's candidates share
            # group_id, and rank_value (their Monte-Carlo value) orders them for the pairwise loss
            ("group_id", pa.string()),
            ("rank_value", pa.float64()),
            # the episode is one an RL run's reward misranked in its task (a failure paid at least as
            # much as a success, or a success paid no more than a failure): issue 41 item 2,
            # training.reward_models.exploits; its examples weigh more in training
            ("exploit", pa.bool_()),
            ("episode_purpose", pa.string()),  # episodes.purpose (warehouse.purposes) of the example's episode
        ]
    ),
    "example_id",
)

RM_TRL_STEPWISE = with_key(
    pa.schema(
        [
            pa.field("example_id", pa.string(), nullable=False),  # <episode_id>:<first step>
            pa.field("split", pa.string(), nullable=False),
            pa.field("episode_id", pa.string(), nullable=False),
            ("task_id", pa.string()),
            ("first_step_idx", pa.int32()),
            pa.field("prompt", pa.string(), nullable=False),
            pa.field("completions", pa.list_(pa.string()), nullable=False),
            pa.field("labels", pa.list_(pa.bool_()), nullable=False),
            ("label_sources", pa.list_(pa.string())),  # human | derived:<labels>, per completion
        ]
    ),
    "example_id",
)

MODELS = with_key(
    pa.schema(
        [
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            ("backbone", pa.string()),  # the Hugging Face checkpoint (path or hub id)
            ("encoder_mode", pa.string()),  # frozen_segments | full
            ("pooling", pa.string()),  # mean | last_token | cls
            ("loss", pa.string()),  # bce | mse
            (
                "checkpoint_path",
                pa.string(),
            ),  # the exported model folder (training.reward_models.models.load_reward_model)
            ("training_dir", pa.string()),  # Trainer checkpoints, for resuming
            ("dataset_materialization_id", pa.string()),  # the rm_examples version it was trained on
            ("label_versions", pa.list_(pa.string())),
            ("n_train_examples", pa.int64()),
            ("n_validation_examples", pa.int64()),
            ("global_steps", pa.int64()),
            ("train_seconds", pa.float64()),
            ("train_steps_per_second", pa.float64()),
            ("used_deepspeed", pa.bool_()),
            ("resumed_from", pa.string()),  # the checkpoint a run resumed from, if any
            ("parameters", pa.string()),  # JSON: model config and training arguments
            ("validation_metrics", pa.string()),  # JSON
            ("training_mix", pa.string()),  # JSON {episode purpose: training examples}: the data mix
            ("code_version", pa.string()),
            ("run_id", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    "model_id",
)

RM_PREDICTIONS = with_key(
    pa.schema(
        [
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            ("split", pa.string()),
            ("task_id", pa.string()),
            pa.field("score", pa.float64(), nullable=False),  # the model's output in [0, 1]
            ("progress_gain", pa.float64()),  # r_t = p_t - p_{t-1} (Eq. 2, k = 1)
            ("is_final_step", pa.bool_()),
            ("episode_success", pa.bool_()),
            ("label_lcs", pa.float64()),  # the LCS progress label of the step, if any
            ("label_env", pa.float64()),  # the milestone progress label of the step, if any
            ("is_env_key_step", pa.bool_()),
            ("step_verdict", pa.string()),  # positive | negative | unsure (human where present, else derived)
            ("report_run_id", pa.string()),
        ]
    ),
    "model_id",
    "episode_id",
    "step_idx",
)

RM_METRICS = with_key(
    pa.schema(
        [
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
            pa.field("metric", pa.string(), nullable=False),
            ("value", pa.float64()),
            ("report_run_id", pa.string()),
        ]
    ),
    "model_id",
    "split",
    "metric",
)

# Each reward model on held-out agent episodes (training.reward_models.agent_episodes): the AUC
# of its episode score against success, per task family and over all ("all"), with a 95% bootstrap interval.
RM_AGENT_AUC = with_key(
    pa.schema(
        [
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("episode_set", pa.string(), nullable=False),  # agent_evaluation
            pa.field("family", pa.string(), nullable=False),  # a task family, or "all"
            ("episodes", pa.int64()),
            ("successes", pa.int64()),
            ("policies", pa.int64()),  # distinct policies whose episodes were scored
            ("auc", pa.float64()),
            ("auc_low", pa.float64()),
            ("auc_high", pa.float64()),
            ("key_step_error", pa.float64()),  # progress kinds: ProgRM Table 3 on the episodes that reached milestones
            ("key_steps", pa.int64()),
            ("score_rule", pa.string()),  # how step scores become an episode score
            ("report_run_id", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    "model_id",
    "episode_set",
    "family",
)

# Each reward model choosing among alternatives at held-out states (training.reward_models.alternatives_metric):
# how often the candidate it scores highest has the best Monte-Carlo value, against the policy's own argmax.
RM_ALTERNATIVE_TOP1 = with_key(
    pa.schema(
        [
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("family", pa.string(), nullable=False),  # a task family, or "all"
            ("states", pa.int64()),  # informative held-out states (candidates of different values)
            ("top1", pa.float64()),  # share of states where the model's pick is a best candidate
            ("top1_low", pa.float64()),
            ("top1_high", pa.float64()),
            ("policy_top1", pa.float64()),  # the same for the policy's argmax (candidate 0)
            ("random_top1", pa.float64()),  # expected for a uniformly random pick
            ("gain", pa.float64()),  # top1 - policy_top1, with a paired bootstrap interval
            ("gain_low", pa.float64()),
            ("gain_high", pa.float64()),
            ("wins", pa.int64()),  # states only the model gets right
            ("losses", pa.int64()),  # states only the policy gets right
            ("mcnemar_p", pa.float64()),
            ("plan_states", pa.int64()),  # states whose candidates include the task plan's next step
            ("plan_top1", pa.float64()),  # how often the model picks it there
            ("policy_plan_top1", pa.float64()),
            ("report_run_id", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    "model_id",
    "family",
)

# One row per flywheel round and reward-model kind (training.flywheel.rounds): the model the
# round trained, what it was trained on, and its AUC on held-out agent episodes. Round 0 is the
# baseline (the models before any policy rollout was collected).
FLYWHEEL_ROUNDS = with_key(
    pa.schema(
        [
            pa.field("round", pa.int32(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            ("model_id", pa.string()),
            ("report_run_id", pa.string()),
            ("auc", pa.float64()),  # over all held-out agent episodes (rm_agent_auc, family 'all')
            ("auc_low", pa.float64()),
            ("auc_high", pa.float64()),
            ("agent_episodes", pa.int64()),  # the held-out agent episodes it was judged on
            ("training_examples", pa.int64()),
            ("agent_examples", pa.int64()),  # of which from the agent's own episodes (policy_rollout, rl_training)
            ("policy_rollout_episodes", pa.int64()),  # policy-rollout episodes in the warehouse at the time
            ("created_at", pa.timestamp("us", tz="UTC")),
            # choosing among alternatives at held-out states (rm_alternative_top1, family 'all'; step
            # judges and progress models): how often the model's pick is a best candidate, and the policy's
            ("top1", pa.float64()),
            ("top1_low", pa.float64()),
            ("top1_high", pa.float64()),
            ("policy_top1", pa.float64()),
            ("top1_states", pa.int64()),
            ("alternative_states", pa.int64()),  # training states with alternatives in the warehouse at the time
            # the same episodes ranked within their own task (rm_agent_auc, family 'all:within_task');
            # null in rounds recorded before it existed
            ("auc_within_task", pa.float64()),
            ("auc_within_task_low", pa.float64()),
            ("auc_within_task_high", pa.float64()),
        ]
    ),
    "round",
    "kind",
)

# Alternatives at one state (training.flywheel.alternatives): at a state of a recorded episode,
# the proposing policy's top-k candidates (plus the episode's own action), each carried out by
# deterministic replay (same seed, same recorded prefix) and labelled by (a) the task plan's next
# step, (b) what the candidate itself reached and (c) the success of m continuations by the policy
# (Math-Shepherd's Monte-Carlo estimate). Replays that did not reproduce the state are dropped.
#: How a ``step_alternatives`` row was labelled: its candidate carried out by replay, or, where no
#: replay reproduced the state, from the recorded episode alone (``training.flywheel.recording_labels``).
LABELLED_BY_REPLAY = "replay"
LABELLED_BY_RECORDING = "recording"

STEP_ALTERNATIVES = with_key(
    pa.schema(
        [
            pa.field("alternative_id", pa.string(), nullable=False),  # <state_id>:<candidate>
            pa.field("state_id", pa.string(), nullable=False),  # <proposer>|<episode_id>|<step_idx>
            pa.field("episode_id", pa.string(), nullable=False),  # the recorded episode of the state
            pa.field("step_idx", pa.int32(), nullable=False),  # t: the candidate replaces action a_t
            ("task_id", pa.string()),
            ("task_family", pa.string()),
            ("seed", pa.int64()),
            ("purpose", pa.string()),  # the recorded episode's: training data, or evaluation (never trained on)
            ("source_policy_id", pa.string()),  # who acted in the recorded episode
            ("proposer_policy_id", pa.string()),  # whose top-k candidates these are (and who continued)
            ("round", pa.int32()),
            pa.field("candidate", pa.int32(), nullable=False),  # index in the state's list; 0 = the policy's argmax
            ("policy_rank", pa.int32()),  # rank in the proposer's distribution over the screen's candidates
            ("policy_logp", pa.float64()),  # log pi(candidate | state)
            ("action_type", pa.string()),
            ("action_text", pa.string()),  # canonical text
            ("action_description", pa.string()),  # as reward models read it (with the target's context)
            ("is_recorded", pa.bool_()),  # the recorded episode's own action at this state
            ("planned_action", pa.string()),  # (a) the task plan's next step here, where the spec has one
            ("matches_plan", pa.bool_()),
            ("milestones_hit", pa.list_(pa.string())),  # (b) milestones the candidate's own step reached
            ("ended", pa.bool_()),  # the environment ended the episode at the candidate's step
            ("ended_success", pa.bool_()),
            ("step_problem", pa.string()),  # why the candidate could not be carried out, if it could not
            ("continuations", pa.int32()),  # (c) replays that reproduced the state and ran
            ("continuation_successes", pa.int32()),
            ("mc_value", pa.float64()),  # successes / continuations; the outcome itself where the step ended it
            ("repeatable", pa.bool_()),  # every replay of the candidate's step gave the same result
            ("replay_ms", pa.float64()),  # mean time to reach the state and carry the candidate out
            ("labelled_by", pa.string()),  # 'replay', or 'recording' where no replay reproduced the state
            ("field_match", pa.bool_()),  # an INPUT of a field's value into that field's box (False: another's)
            ("run_id", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    "alternative_id",
)

TRAINING_TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "rm_examples": RM_EXAMPLES,
    "rm_trl_stepwise": RM_TRL_STEPWISE,
    "models": MODELS,
    "rm_predictions": RM_PREDICTIONS,
    "rm_metrics": RM_METRICS,
    "rm_agent_auc": RM_AGENT_AUC,
    "flywheel_rounds": FLYWHEEL_ROUNDS,
    "step_alternatives": STEP_ALTERNATIVES,
    "rm_alternative_top1": RM_ALTERNATIVE_TOP1,
}
