"""The RL stage's evaluation and the data of its report: a run's final policy, greedy, on the
held-out seeds (:func:`run_agent_evaluation`), and ProgRM Table 1 read back from the warehouse
(:func:`run_rl_report`: the SFT policy's and its runs' held-out episodes, each run's training
episodes with what its reward paid them, learning curves, the flywheel's model tags), built by
:mod:`training.rl.report`."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from training.policy.episodes import (
    Log,
    PoolFactory,
    catalog_tasks,
    episode_outputs,
    evaluate_policy,
    evaluation_outputs,
)
from training.policy.evaluation import per_task_rows, sample_seeds
from training.policy.learned import PolicyModel
from training.policy.store import (
    HELD_OUT_SEED_BASE,
    keep_policy_cache,
    latest_policy,
    latest_sft_policy,
    warm_policy_cache,
)
from training.policy.task_blocks import DENSE_BLOCK, sparse_block_rule, sparse_left_out, task_blocks
from training.rl.advice import FLYWHEEL_TAG_PREFIX, reward_advice
from training.rl.report import (
    exploits_by_actor,
    reward_by_ending,
    reward_hacking_alarms,
    run_label,
    table_one,
    take_off_baselines,
    training_reward_auc,
)
from training.rl.runs import RL_CODE_VERSION, run_key_of_policy, run_reward_model
from training.rl.take_off import take_off_by_seed, take_off_rows
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.storage import git_revision


def run_agent_evaluation(
    warehouse: Warehouse,
    policy_id: str,
    pool_factory: PoolFactory,
    *,
    held_out_seeds: int = 25,
    workers: int = 2,
    run_id: str,
    log: Log = print,
) -> dict[str, Any]:
    """Greedy episodes of a trained policy on the held-out seeds of its tasks, published."""
    policy = latest_policy(warehouse, policy_id=policy_id)
    tasks = catalog_tasks(policy["tasks"] or [])
    model = PolicyModel.load(policy["checkpoint"])
    warm_policy_cache(model, warehouse.home)
    seeds = sample_seeds(HELD_OUT_SEED_BASE, held_out_seeds, "held_out")
    with pool_factory(workers) as pool:
        result, episodes = evaluate_policy(model, policy_id, tasks, seeds, pool, evaluation="held_out", log=log)
    keep_policy_cache(model, warehouse.home)
    m = Materialization(
        asset="agent_evaluation",
        run_id=run_id,
        partition_key=f"{policy['reward_source']}|s{policy['rl_seed']}",
        code_version=f"{RL_CODE_VERSION}+{git_revision()}",
        parameters={"policy_id": policy_id, "held_out_seeds": seeds},
        inputs=[LineageInput(kind="asset", input_asset="rl_run", path=policy["checkpoint_path"], version=policy_id)],
    )
    dataset = f"eval/{policy_id}/held_out"
    outputs = episode_outputs(warehouse, result, dataset, m, run_id, EpisodePurpose.EVALUATION) + evaluation_outputs(
        warehouse,
        episodes,
        "held_out",
        policy_label=policy["reward_source"] or "sft",
        rl_seed=policy["rl_seed"],
        dataset=dataset,
        m=m,
    )
    warehouse.publish(m, outputs)
    rows = per_task_rows(episodes)
    return {
        "policy_id": policy_id,
        "episodes": len(episodes),
        "success_rate": float(np.mean([e.success for e in episodes])) if episodes else float("nan"),
        "per_task": {r["task_id"]: r["success_rate"] for r in rows},
        "failure_modes": dict(Counter(e.failure_mode for e in episodes if e.failure_mode)),
    }


def run_rl_report(warehouse: Warehouse, *, sft_policy_id: str | None = None) -> dict[str, Any]:
    """ProgRM Table 1 from the held-out evaluations of the SFT policy and the RL runs from it."""
    sft = latest_sft_policy(warehouse, sft_policy_id)
    tags = reward_model_tags(warehouse)
    runs, key_tags = reported_runs(warehouse, sft["policy_id"], tags)
    by_policy = held_out_episodes(warehouse, [sft["policy_id"], *(r["policy_id"] for r in runs)])
    report = table_one(sft["policy_id"], runs, by_policy, task_blocks(sft))
    training = _training_episodes(warehouse, sft["policy_id"])
    for key in {e["run_key"] for e in training} - set(key_tags):  # runs not registered yet
        key_tags[key] = tags.get(run_reward_model(warehouse, key) or "")
    for e in training:
        e["reward_model_tag"] = key_tags[e["run_key"]]
    report["training_reward_auc"] = training_reward_auc(training)
    report["reward_by_ending"] = reward_by_ending(training)
    report["exploits"] = exploits_by_actor(training)
    report["sparse_rule"] = sparse_block_rule(sft)
    report["sparse_left_out"] = sparse_left_out(sft)
    report["curves"] = _report_curves(warehouse, runs)
    row_of = {r["run_key"]: {"actor": run_label(r), "rl_seed": r["rl_seed"]} for r in runs}
    reported = [e | row_of[e["run_key"]] for e in training if e["run_key"] in row_of]
    report["take_off"] = take_off_rows(take_off_by_seed(reported), take_off_baselines(runs))
    report["hacking_alarms"] = reward_hacking_alarms(report)
    report["advice"] = reward_advice(report)
    return report


def reported_runs(
    warehouse: Warehouse, sft_policy_id: str, tags: dict[str, str] | None = None
) -> tuple[list[dict], dict[str, str | None]]:
    """The RL runs Table 1 reports from an SFT policy: per reward source, estimator, RL seed, block,
    reward-model tag (``flywheel r<n>``, ``model <id>`` for a pinned one, None for today's models)
    and ORM rule, the newest run, with the ``iterations`` it ran (recorded in ``rl_iterations``, else
    its settings' budget); and every registered run's tag by run key. ``tags``: the
    flywheel's model tags (:func:`reward_model_tags`) where the caller has read them already."""
    runs = warehouse.query(
        "SELECT policy_id, reward_source, estimator, rl_seed, env_steps, "
        "json_extract_string(parameters, '$.reward_model') AS reward_model, "
        "json_extract_string(parameters, '$.reward_model_id') AS pinned, "
        "json_extract_string(parameters, '$.orm_rule') AS orm_rule, "
        "TRY_CAST(json_extract_string(parameters, '$.iterations') AS INTEGER) AS iterations, "
        "coalesce(json_extract_string(parameters, '$.block'), ?) AS block FROM policies "
        "WHERE kind = 'rl' AND parent_policy_id = ? ORDER BY created_at",
        [DENSE_BLOCK, sft_policy_id],
    ).to_pylist()
    tags = reward_model_tags(warehouse) if tags is None else tags
    latest: dict[tuple[str, str, int, str, str | None, str | None], dict] = {}
    key_tags: dict[str, str | None] = {}
    for r in runs:
        run_key = run_key_of_policy(r["policy_id"], sft_policy_id)
        model = r.pop("reward_model") or run_reward_model(warehouse, run_key) or ""
        pinned = r.pop("pinned")  # a pin to a model no flywheel round trained is still a run of its own
        r["run_key"] = run_key
        r["reward_model_tag"] = key_tags[run_key] = tags.get(model) or (f"model {pinned}" if pinned else None)
        key = (r["reward_source"], r["estimator"], r["rl_seed"], r["block"], r["reward_model_tag"], r["orm_rule"])
        latest[key] = r
    ran = _iterations_ran(warehouse)
    for r in latest.values():  # what ran, not the budget asked for: a rerun asking fewer trains nothing
        r["iterations"] = ran.get(r["run_key"], r["iterations"])
    return list(latest.values()), key_tags


def _iterations_ran(warehouse: Warehouse) -> dict[str, int]:
    """Each RL run's iterations recorded in ``rl_iterations``, by run key."""
    if not warehouse.has_table("rl_iterations"):
        return {}
    rows = warehouse.query("SELECT run_key, count(DISTINCT iteration) AS n FROM rl_iterations GROUP BY run_key")
    return {r["run_key"]: int(r["n"]) for r in rows.to_pylist()}


def held_out_episodes(warehouse: Warehouse, policy_ids: Sequence[str]) -> dict[str, list[dict]]:
    """Each policy's held-out evaluation episodes, by policy id, with its task's family and the
    instance's instruction (what the constant-answer test reads)."""
    episodes = warehouse.query(
        "SELECT e.*, a.task_family, ep.instruction FROM agent_eval_episodes e JOIN agent_eval a "
        "USING (policy_id, evaluation, task_id) LEFT JOIN episodes ep ON ep.episode_id = e.episode_id "
        "WHERE e.evaluation = 'held_out' AND list_contains(?, e.policy_id)",
        [list(policy_ids)],
    ).to_pylist()
    by_policy: dict[str, list[dict]] = defaultdict(list)
    for e in episodes:
        by_policy[e["policy_id"]].append(e)
    return by_policy


def _report_curves(warehouse: Warehouse, runs: Sequence[dict]) -> list[dict]:
    """Each reported run's training success, mean episode reward and KL to the reference (SFT) policy
    per iteration, labelled with its row."""
    keys = {r["run_key"]: r for r in runs}
    rows = warehouse.query(
        "SELECT run_key, iteration, success_rate, mean_reward, kl_to_reference FROM rl_iterations "
        "WHERE list_contains(?, run_key) ORDER BY run_key, iteration",
        [list(keys)],
    ).to_pylist()
    return [
        r
        | {
            "actor": run_label(keys[r["run_key"]]),
            "block": keys[r["run_key"]]["block"],
            "seed": keys[r["run_key"]]["rl_seed"],
        }
        for r in rows
    ]


def reward_model_tags(warehouse: Warehouse) -> dict[str, str]:
    """``flywheel r<n>`` for every reward model a flywheel round (n >= 1) trained, by model id:
    the report's name for runs on the agent's own episodes (round 0 is the models already there)."""
    if not warehouse.has_table("flywheel_rounds"):
        return {}
    # a round records every kind its report judged, retrained or carried over: a model is named
    # by the first round that lists it, and one round 0 lists is today's, not the flywheel's
    rows = warehouse.query(
        "SELECT model_id, min(round) AS round FROM flywheel_rounds GROUP BY model_id HAVING min(round) >= 1"
    ).to_pylist()
    return {r["model_id"]: f"{FLYWHEEL_TAG_PREFIX}{r['round']}" for r in rows}


def flywheel_round_models(warehouse: Warehouse, round_: int) -> dict[str, str]:
    """The reward model of each kind that flywheel round ``round_`` trained, by kind (not the
    models it only carried over from an earlier round)."""
    if not warehouse.has_table("flywheel_rounds"):
        return {}
    rows = warehouse.query(
        "SELECT kind, model_id FROM flywheel_rounds WHERE round = ? "
        "AND model_id NOT IN (SELECT model_id FROM flywheel_rounds WHERE round < ?)",
        [round_, round_],
    ).to_pylist()
    return {r["kind"]: r["model_id"] for r in rows}


def _training_episodes(warehouse: Warehouse, sft_policy_id: str) -> list[dict]:
    """Every RL training episode of the runs from an SFT policy: its run's source, estimator,
    block and ORM rule, its task, its reward summed over its steps, its success and raw
    environment reward."""
    return warehouse.query(
        "WITH runs AS (SELECT DISTINCT run_key, reward_source, estimator FROM rl_iterations "
        "WHERE policy_id LIKE 'rl:%:' || ? || ':i%') "
        "SELECT v.episode_id, v.run_key, runs.reward_source, runs.estimator, v.task_id, "
        "coalesce(json_extract_string(any_value(p.parameters), '$.block'), ?) AS block, "
        "json_extract_string(any_value(p.parameters), '$.orm_rule') AS orm_rule, "
        "v.iteration, v.reward, v.success, v.env_outcome "
        "FROM rl_episode_rewards v JOIN runs USING (run_key) "
        "LEFT JOIN policies p ON p.policy_id = 'rl-' || v.run_key || '-' || ? "
        "GROUP BY v.episode_id, v.run_key, runs.reward_source, runs.estimator, v.task_id, v.iteration, v.reward, "
        "v.success, v.env_outcome",
        [sft_policy_id, DENSE_BLOCK, sft_policy_id],
    ).to_pylist()
