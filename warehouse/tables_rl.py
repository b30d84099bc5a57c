"""Arrow schemas of the RL stage's tables: policies, iterations, per-step rewards, evaluations.

Registered into ``warehouse.schema.TABLE_SCHEMAS``; column names are part of the interface:

* ``policies``: one row per trained policy (SFT, or an RL run's final policy) with its checkpoint.
* ``rl_iterations``: one row per RL iteration: reward, success, KL to the SFT policy, entropy,
  loss, and the time split into rollout / reward / update.
* ``rl_step_rewards``: the reward and advantage every step of every RL episode got (joins
  ``steps`` on episode_id, step_idx); what an external trainer (OpenRLHF, verl) would read.
* ``agent_eval``: a policy's success rate and mean cumulative environment reward per task on
  held-out seeds (ProgRM Table 1's figures), and why its failures failed.
* ``agent_eval_episodes``: every evaluation episode, for paired comparisons between policies.
"""

from __future__ import annotations

import pyarrow as pa

from warehouse.keys import with_key

_TS = pa.timestamp("us", tz="UTC")

POLICIES = with_key(
    pa.schema(
        [
            pa.field("policy_id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),  # sft | rl | llm_base | llm_sft | llm_rl
            ("reward_source", pa.string()),  # outcome | orm | progrm_lcs | progrm_env | prm | guidnav | admire
            ("estimator", pa.string()),  # reinforce_pp | reinforce_pp_kl_apart | grpo | rloo | ppo
            ("rl_seed", pa.int32()),
            ("parent_policy_id", pa.string()),  # the SFT policy an RL run started from
            ("checkpoint_path", pa.string()),  # relative to the home
            ("tasks", pa.list_(pa.string())),
            ("env_steps", pa.int64()),  # environment steps spent training it (RL)
            ("parameters", pa.string()),  # JSON
            ("created_at", _TS),
            ("run_id", pa.string()),
        ]
    ),
    "policy_id",
)

RL_ITERATIONS = with_key(
    pa.schema(
        [
            pa.field("run_key", pa.string(), nullable=False),  # <source>-<estimator>-s<seed>
            pa.field("iteration", pa.int32(), nullable=False),
            ("policy_id", pa.string()),  # the policy that acted in this iteration
            ("reward_source", pa.string()),
            ("estimator", pa.string()),
            ("rl_seed", pa.int32()),
            ("episodes", pa.int32()),
            ("steps", pa.int32()),
            ("env_steps_total", pa.int64()),  # environment steps of the run up to and with this iteration
            ("success_rate", pa.float64()),
            ("mean_env_return", pa.float64()),  # the environment's cumulative reward per episode
            ("mean_reward", pa.float64()),  # the reward source's reward per episode (summed over steps)
            ("kl_to_reference", pa.float64()),
            ("entropy", pa.float64()),
            ("loss", pa.float64()),
            ("clip_fraction", pa.float64()),
            ("value_loss", pa.float64()),
            ("seconds_rollout", pa.float64()),
            ("seconds_reward", pa.float64()),
            ("seconds_update", pa.float64()),
            ("reward_details", pa.string()),  # JSON: the source's own figures
            ("created_at", _TS),
        ]
    ),
    "run_key",
    "iteration",
)

RL_STEP_REWARDS = with_key(
    pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("step_idx", pa.int32(), nullable=False),
            ("run_key", pa.string()),
            ("iteration", pa.int32()),
            ("reward_source", pa.string()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("logp", pa.float64()),  # log pi(a_t | s_t) of the acting policy
            ("n_candidates", pa.int32()),
        ]
    ),
    "episode_id",
    "step_idx",
)

AGENT_EVAL = with_key(
    pa.schema(
        [
            pa.field("policy_id", pa.string(), nullable=False),
            pa.field("evaluation", pa.string(), nullable=False),  # held_out | selection | selection_sampled
            pa.field("task_id", pa.string(), nullable=False),
            ("task_family", pa.string()),
            ("policy_label", pa.string()),  # sft | an RL run's reward source | llm_base | llm_sft | llm_rl:<source>
            ("rl_seed", pa.int32()),
            ("episodes", pa.int32()),
            ("successes", pa.int32()),
            ("success_rate", pa.float64()),
            ("mean_env_return", pa.float64()),
            ("mean_steps", pa.float64()),
            ("failure_modes", pa.string()),  # JSON: failure mode -> episodes
            ("created_at", _TS),
        ]
    ),
    "policy_id",
    "evaluation",
    "task_id",
)

AGENT_EVAL_EPISODES = with_key(
    pa.schema(
        [
            pa.field("policy_id", pa.string(), nullable=False),
            pa.field("evaluation", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            pa.field("seed", pa.int64(), nullable=False),
            ("episode_id", pa.string()),
            ("success", pa.bool_()),
            ("env_return", pa.float64()),
            ("n_steps", pa.int32()),
            ("failure_mode", pa.string()),  # null for a success
        ]
    ),
    "policy_id",
    "evaluation",
    "task_id",
    "seed",
)

RL_TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "policies": POLICIES,
    "rl_iterations": RL_ITERATIONS,
    "rl_step_rewards": RL_STEP_REWARDS,
    "agent_eval": AGENT_EVAL,
    "agent_eval_episodes": AGENT_EVAL_EPISODES,
}
