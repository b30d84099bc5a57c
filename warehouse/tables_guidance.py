"""Arrow schemas of the guidance stage's tables (reward-guided agents at inference time).

Registered into ``warehouse.schema.TABLE_SCHEMAS``; column names are part of the interface:

* ``guidance_eval``: one row per (policy, setting, task) and one per (policy, setting) over all
  tasks (``task_id = 'all'``): success rate with a 95% bootstrap interval, its paired difference
  to the base policy on the same seeds (with its interval and McNemar's p), steps, seconds and
  model calls per step. A setting is a method (``base``, ``best_of_n``, ``oracle``, ``judge``,
  ``retry``) with its verifier, N, judge variant or retries (``prm:N=8``, ``judge:no_memory:N=8``,
  ``retry:R=3``). ``verifier_model_id`` names the trained model(s) the verifier scored with
  (``''`` for none: the base policy, the oracle), so a sweep with another reward model adds rows
  beside the first sweep's instead of replacing them (homes written before it read it as NULL).
* ``guidance_episodes``: every evaluation episode (each attempt of a retry is a row), with its
  failure mode and, for retries, the reflection it was given.
* ``guidance_steps``: every guided step: candidates, the rank of the chosen one in the policy's
  order, scores, seconds proposing and verifying, calls, and the verifier's mode and note
  (``local``, ``endpoint``, ``fallback``, ``unjudged``, ...).
"""

from __future__ import annotations

import pyarrow as pa

from warehouse.keys import with_key

_TS = pa.timestamp("us", tz="UTC")

GUIDANCE_EVAL = with_key(
    pa.schema(
        [
            pa.field("policy_id", pa.string(), nullable=False),
            pa.field("setting", pa.string(), nullable=False),
            pa.field("verifier_model_id", pa.string(), nullable=False),  # '' without a trained verifier
            pa.field("task_id", pa.string(), nullable=False),  # 'all' for the row over every task
            ("method", pa.string()),  # base | best_of_n | oracle | judge | retry
            ("verifier", pa.string()),  # prm | guidnav | progrm_lcs | progrm_env | oracle | judge | null
            ("n", pa.int32()),  # candidates per step
            ("variant", pa.string()),  # judge: full | no_memory | no_perception; retry: R
            ("judge_mode", pa.string()),  # local | endpoint (the judge's configuration)
            ("episodes", pa.int32()),
            ("successes", pa.int32()),
            ("success_rate", pa.float64()),
            ("success_low", pa.float64()),  # 95% bootstrap interval over episodes
            ("success_high", pa.float64()),
            ("delta_vs_base", pa.float64()),  # paired, same task and seed
            ("delta_low", pa.float64()),
            ("delta_high", pa.float64()),
            ("only_setting", pa.int32()),  # episodes only this setting solved
            ("only_base", pa.int32()),
            ("mcnemar_p", pa.float64()),
            ("mean_steps", pa.float64()),
            ("seconds_per_step", pa.float64()),  # wall time of a step (proposing + verifying), agent side
            ("propose_ms", pa.float64()),
            ("verify_ms", pa.float64()),
            ("verifier_calls_per_step", pa.float64()),
            ("policy_calls_per_step", pa.float64()),
            ("changed_choice", pa.float64()),  # share of steps where the verifier overrode the policy
            ("fallback_steps", pa.float64()),  # share of steps where the endpoint failed (judge)
            ("unjudged_steps", pa.float64()),
            ("pass_at", pa.string()),  # retry: JSON {"1": .., "2": .., ...} (pass@k, k attempts)
            ("failure_modes", pa.string()),  # JSON: failure mode -> episodes
            ("created_at", _TS),
        ]
    ),
    "policy_id",
    "setting",
    "verifier_model_id",
    "task_id",
)

GUIDANCE_EPISODES = with_key(
    pa.schema(
        [
            pa.field("policy_id", pa.string(), nullable=False),
            pa.field("setting", pa.string(), nullable=False),
            pa.field("verifier_model_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            pa.field("seed", pa.int64(), nullable=False),
            pa.field("attempt", pa.int32(), nullable=False),  # 0, then 1..R for retries
            ("method", pa.string()),
            ("episode_id", pa.string()),  # joins episodes / steps / guidance_steps
            ("success", pa.bool_()),
            ("env_return", pa.float64()),
            ("n_steps", pa.int32()),
            ("failure_mode", pa.string()),
            ("seconds", pa.float64()),  # agent-side seconds (proposing + verifying) of the episode
            ("verifier_calls", pa.int32()),
            ("fallback_steps", pa.int32()),
            ("unjudged_steps", pa.int32()),
            ("reflection", pa.string()),  # the reflection this attempt was given (retries)
            ("reflection_source", pa.string()),  # endpoint | template
            ("banned_actions", pa.int32()),  # bans this attempt carried (learned policy)
        ]
    ),
    "policy_id",
    "setting",
    "verifier_model_id",
    "task_id",
    "seed",
    "attempt",
)

GUIDANCE_STEPS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            ("setting", pa.string()),
            ("n_candidates", pa.int32()),
            ("chosen_rank", pa.int32()),  # rank of the executed candidate in the policy's order
            ("chosen_score", pa.float64()),
            ("first_score", pa.float64()),  # score of the policy's own choice
            ("scores", pa.list_(pa.float64())),  # null entries: unjudged candidates
            ("propose_ms", pa.float64()),
            ("verify_ms", pa.float64()),
            ("policy_calls", pa.int32()),
            ("verifier_calls", pa.int32()),
            ("mode", pa.string()),
            ("note", pa.string()),
            ("banned", pa.int32()),
            ("details", pa.string()),  # JSON
        ]
    ),
    "episode_id",
    "step_idx",
)

GUIDANCE_TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "guidance_eval": GUIDANCE_EVAL,
    "guidance_episodes": GUIDANCE_EPISODES,
    "guidance_steps": GUIDANCE_STEPS,
}
