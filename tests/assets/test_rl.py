"""The RL stage in Dagster, reduced but end to end on live MiniWoB++: real demonstrations, labels,
a ProgRM model, SFT, RL runs with the outcome, ProgRM, ADMIRE and outcome + ProgRM (shaped)
rewards, held-out evaluation and Table 1 in SQL."""

import json

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.demonstrations import DEMONSTRATION_ASSETS
from assets.flywheel import policy_rollouts
from assets.labels import LABEL_ASSETS, all_label_families_tags
from assets.resources import EnvPoolResource, WarehouseResource
from assets.reward_models import reward_model, reward_model_datasets, reward_model_report
from assets.rl import RL_CHECKS, agent_evaluation, policy_sft, rl_report, rl_run
from pipelines.cli.common import job_runner
from pipelines.figures import reward_models_on_agents
from pipelines.flywheel import FlywheelSettings, run_flywheel
from training.policy.store import POLICY_ROLLOUT_SEED_BASE
from training.rl.evaluation import held_out_episodes, run_rl_report
from training.rl.export import export_rl_data
from warehouse.catalog import Warehouse
from warehouse.purposes import SAMPLED_SELECTION, greedy_evaluation_filter

pytestmark = pytest.mark.e2e

RUNS = ("outcome", "progrm_env", "admire", "outcome+progrm_env:shaped")


def test_sft_rl_runs_evaluation_and_report(small_demos, tmp_path, monkeypatch):
    home = tmp_path / "home"
    resources = {"warehouse": WarehouseResource(home=str(home)), "env_pool": EnvPoolResource(spares=0)}
    instance = DagsterInstance.ephemeral()
    upstream = materialize(
        [*DEMONSTRATION_ASSETS, *LABEL_ASSETS],
        resources=resources,
        instance=instance,
        tags=all_label_families_tags(),
        run_config={
            "ops": {
                "human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}},
                "recipes_and_progress_labels": {"config": {"embedder": "hashing"}},
            }
        },
    )
    assert upstream.success
    progrm = materialize(
        [reward_model_datasets, reward_model],
        partition_key="progrm_env",
        resources=resources,
        instance=instance,
        run_config={"ops": {"reward_model": {"config": {"train_steps": 20, "threads": 1}}}},
    )
    assert progrm.success

    sft = materialize(
        [policy_sft, *RL_CHECKS[:2]],
        resources=resources,
        instance=instance,
        selection=["policy_sft"],
        run_config={
            "ops": {
                "policy_sft": {
                    "config": {
                        "tasks": ["login-user", "search-engine"],
                        "low": -1.0,
                        "high": 2.0,  # both tasks, whatever SFT's success on them
                        "selection_seeds": 3,
                        "sparse_selection_seeds": 0,  # no extra seeds for long tasks (none is here)
                        "held_out_seeds": 4,
                        "epochs": 4,
                    }
                }
            }
        },
    )
    assert sft.success
    assert all(e.passed for e in sft.get_asset_check_evaluations())
    # runs named to their SFT policy (here the newest anyway): how `stepwise rl --sft` adds to an older one
    (named,) = Warehouse(home).query("SELECT policy_id FROM policies WHERE kind = 'sft'").to_pylist()
    from_sft = {"sft_policy_id": named["policy_id"]}
    for run in RUNS:
        partition = MultiPartitionKey({"run": run, "seed": "s0"})
        result = materialize(
            [rl_run, agent_evaluation],
            partition_key=partition,
            resources=resources,
            instance=instance,
            run_config={
                "ops": {
                    "rl_run": {"config": {"iterations": 2, "instances_per_task": 2, "group_size": 2} | from_sft},
                    "agent_evaluation": {"config": {"held_out_seeds": 4} | from_sft},
                }
            },
        )
        assert result.success, run
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert checks == {"every_iteration_recorded": True}
    report = materialize([rl_report], resources=resources, instance=instance)
    assert report.success
    named = {"ops": {"rl_report": {"config": {"sft_policy_id": "sft-0123456789"}}}}  # another SFT policy's runs
    missing = materialize([rl_report], resources=resources, instance=instance, run_config=named, raise_on_error=False)
    assert not missing.success
    table = report.asset_materializations_for_node("rl_report")[0].metadata["table_one"].value
    for actor in ("SFT", *RUNS):
        assert f"| {actor} |" in table
    # each run's reward judged on its own training episodes (AUC vs success), by code
    judged = {r["actor"]: r for r in run_rl_report(Warehouse(home))["training_reward_auc"]}
    rl_episodes = (
        Warehouse(home).query("SELECT count(DISTINCT episode_id) AS n FROM rl_step_rewards").to_pylist()[0]["n"]
    )
    assert set(judged) == set(RUNS) and sum(r["episodes"] for r in judged.values()) == rl_episodes
    assert "reward AUC vs success" in table
    # which reward to use, from these runs' own tests: one seed per run, so it says it is provisional
    assert table.startswith("**Which reward to use here (dense block)**") and "- provisional: 4 row(s)" in table
    which = report.asset_materializations_for_node("rl_report")[0].metadata["which_reward_dense"].value
    assert which.startswith("with the exact outcome: ") and which.endswith("(provisional: fewer than 5 RL seeds)")
    # the composed source (outcome + ProgRM-Env, shaped) is compared with its learned part alone
    versus = {(c["actor"], c["versus"]) for c in run_rl_report(Warehouse(home))["comparisons"]}
    assert {("outcome+progrm_env:shaped", "progrm_env"), ("outcome+progrm_env:shaped", "outcome")} <= versus
    # learning curves over seeds: every run's iterations, labelled as its row, plotted per block
    curves = run_rl_report(Warehouse(home))["curves"]
    # the report reads every held-out episode with its instance's instruction (the constant-answer test)
    policies = Warehouse(home).query("SELECT policy_id FROM policies").to_pylist()
    held_out = held_out_episodes(Warehouse(home), [p["policy_id"] for p in policies])
    assert held_out and all(e["instruction"] for episodes in held_out.values() for e in episodes)
    assert sorted((c["actor"], c["iteration"]) for c in curves) == sorted((r, i) for r in RUNS for i in (0, 1))
    assert report.asset_materializations_for_node("rl_report")[0].metadata["learning_curves"].value.count("![") == 1
    # how soon each run took off on each task, read back from its training episodes by hand
    take_off = {(r["actor"], r["task_id"]): r for r in run_rl_report(Warehouse(home))["take_off"]}
    shares = (
        Warehouse(home)
        .query(
            "SELECT reward_source, task_id, iteration, avg(success::INT) AS share FROM rl_episode_rewards "
            "GROUP BY ALL ORDER BY iteration"
        )
        .to_pylist()
    )
    by_hand: dict[tuple[str, str], int | None] = {}
    for s in shares:
        first = by_hand.get((s["reward_source"], s["task_id"]))
        by_hand[(s["reward_source"], s["task_id"])] = (
            first if first is not None else (s["iteration"] if s["share"] >= 0.5 else None)
        )
    assert {key: r["median_take_off"] for key, r in take_off.items()} == {
        key: None if first is None else float(first) for key, first in by_hand.items()
    }
    assert {r["versus"] for (actor, _), r in take_off.items() if actor != "outcome"} == {"outcome"}
    assert ("How soon runs take off" in table) == any(r["versus"] for r in take_off.values())
    # each row's budget is read back from its runs' recorded settings: all ran 2, so no warning
    rows = run_rl_report(Warehouse(home))["rows"]
    assert {r["actor"]: r["iterations"] for r in rows if r["reward_source"]} == {run: [2] for run in RUNS}
    assert "Budgets differ" not in table

    warehouse = Warehouse(home)
    iterations = warehouse.query(
        "SELECT reward_source, count(*) AS n, count(DISTINCT iteration) AS d FROM rl_iterations GROUP BY 1"
    ).to_pylist()
    assert {r["reward_source"]: (r["n"], r["d"]) for r in iterations} == {run: (2, 2) for run in RUNS}
    evaluated = warehouse.query("SELECT DISTINCT policy_label FROM agent_eval WHERE evaluation = 'held_out'")
    assert set(evaluated.column("policy_label").to_pylist()) == {"sft", *RUNS}
    # every RL episode is in the warehouse with its acting policy, and every step has its reward
    orphans = warehouse.query(
        "SELECT count(*) AS n FROM steps s JOIN episodes e USING (episode_id) WHERE e.policy_id LIKE 'rl:%' "
        "AND NOT EXISTS (SELECT 1 FROM rl_step_rewards r WHERE r.episode_id = s.episode_id AND r.step_idx = s.step_idx)"
    ).to_pylist()[0]["n"]
    assert orphans == 0
    # common random numbers (issue 41 item 4): in iteration 0 every run acts with the SFT weights in
    # the same sampling stream, so on each instance its first decision is the same draw
    first = warehouse.query(
        "SELECT run_key, episode_id, logp, n_candidates FROM rl_step_rewards WHERE iteration = 0 AND step_idx = 0"
    ).to_pylist()
    by_run: dict[str, set] = {}
    for r in first:
        by_run.setdefault(r["run_key"], set()).add(
            (r["episode_id"].split(":i000:", 1)[1], r["logp"], r["n_candidates"])
        )
    assert len(by_run) == len(RUNS) and all(v == next(iter(by_run.values())) for v in by_run.values())
    # the ProgRM run's episodes trace back to the reward model that scored them
    lineage = warehouse.query(
        "SELECT DISTINCT input_asset FROM lineage WHERE asset = 'rl_run' AND parameters::VARCHAR LIKE '%progrm_env%'"
    ).to_pylist()
    assert {"reward_model", "policy_sft"} <= {r["input_asset"] for r in lineage}

    # the episodes and step rewards as external trainers (OpenRLHF, verl) read them
    summary = export_rl_data(warehouse, tmp_path / "export")
    rl_steps = warehouse.query("SELECT count(*) AS n FROM rl_step_rewards").to_pylist()[0]["n"]
    assert summary.steps == rl_steps and summary.episodes > 0
    steps = pq.read_table(summary.steps_path).to_pylist()
    assert steps[0]["prompt"][0]["role"] == "system" and steps[0]["prompt"][1]["role"] == "user"
    assert sum(s["response"] is None for s in steps) == summary.steps_without_response < len(steps)
    first = json.loads(summary.trajectories_path.read_text().splitlines()[0])
    assert len(first["step_rewards"]) == sum(m["role"] == "assistant" for m in first["messages"])

    # The flywheel's first step: the SFT policy and the outcome-RL checkpoint sampled as data on
    # their own seeds, labelled by the labels stage like any training episode.
    def collect(policy: str) -> list[dict]:
        result = materialize(
            [policy_rollouts],
            partition_key=MultiPartitionKey({"family": "miniwob-forms", "policy": policy}),
            resources=resources,
            instance=instance,
            run_config={"ops": {"policy_rollouts": {"config": {"episodes_per_task": 3}}}},
        )
        assert result.success, policy
        return warehouse.query(
            "SELECT e.episode_id, e.policy_id, e.seed, e.purpose, e.success, "
            "list(s.action_text ORDER BY s.step_idx) AS actions "
            "FROM episodes e JOIN steps s USING (episode_id) WHERE e.purpose = 'policy_rollout' "
            "AND e.episode_id LIKE ? GROUP BY ALL ORDER BY e.episode_id",
            [f"policy:{'sft' if policy == 'sft' else 'rl'}%"],
        ).to_pylist()

    from_sft, from_rl = collect("sft"), collect("rl-outcome")
    assert len(from_sft) == len(from_rl) == 3  # login-user is the policies' only task in the family
    assert {r["policy_id"] for r in from_sft} == {
        warehouse.query("SELECT policy_id FROM policies WHERE kind = 'sft'")[0][0].as_py()
    }
    assert {r["policy_id"] for r in from_rl} == set(
        warehouse.query("SELECT policy_id FROM policies WHERE reward_source = 'outcome'").column(0).to_pylist()
    )
    assert [r["seed"] for r in from_sft] == [r["seed"] for r in from_rl]  # the same instances
    assert all(r["seed"] >= POLICY_ROLLOUT_SEED_BASE for r in from_sft)
    assert collect("sft") == from_sft  # seeded sampling: the same partition again gives the same episodes
    inputs = {
        r["input_asset"]
        for r in warehouse.query("SELECT input_asset FROM lineage WHERE asset = 'policy_rollouts'").to_pylist()
    }
    assert {"policy_sft", "rl_run"} <= inputs
    relabel = materialize(
        LABEL_ASSETS,
        tags=all_label_families_tags(),  # incremental: only the new episodes are labelled
        resources=resources,
        instance=instance,
        run_config={"ops": {"recipes_and_progress_labels": {"config": {"embedder": "hashing"}}}},
    )
    assert relabel.success
    collected = {r["episode_id"] for r in from_sft + from_rl}
    labelled = set(
        warehouse.query(
            "SELECT DISTINCT episode_id FROM progress_labels WHERE source = 'env' AND list_contains(?, episode_id)",
            [sorted(collected)],
        )
        .column(0)
        .to_pylist()
    )
    assert labelled == collected
    split = warehouse.query(
        "SELECT count(*) FROM progress_split WHERE list_contains(?, episode_id)", [sorted(collected)]
    )
    assert split[0][0].as_py() == len(collected)

    # The reward-model report judges the model on the agents' held-out evaluation episodes.
    report = materialize(
        [reward_model_report],
        resources=resources,
        instance=instance,
        run_config={"ops": {"reward_model_report": {"config": {"kinds": ["progrm_env"], "latency_calls": 3}}}},
    )
    assert report.success
    # every greedy evaluation episode; SFT's sampled selection episodes (on the long tasks) are not greedy
    evaluated_episodes = "SELECT count(*) FROM episodes e WHERE purpose = 'evaluation' AND n_steps > 0 AND "
    evaluation = warehouse.query(evaluated_episodes + greedy_evaluation_filter("e.episode_id"))[0][0]
    sampled = warehouse.query(evaluated_episodes + f"e.episode_id LIKE '%:{SAMPLED_SELECTION}:%'")[0][0]
    aucs = {r["family"]: r for r in warehouse.query("SELECT * FROM rm_agent_auc WHERE kind = 'progrm_env'").to_pylist()}
    assert {"all", "miniwob-forms", "miniwob-apps"} <= set(aucs)
    assert aucs["all"]["episodes"] == evaluation.as_py() and aucs["all"]["policies"] == 1 + len(RUNS)
    assert sampled.as_py() > 0  # there were some to leave out
    assert (
        "On held-out agent episodes"
        in report.asset_materializations_for_node("reward_model_report")[0].metadata["report"].value
    )
    figure = reward_models_on_agents(warehouse)  # what `stepwise figures` prints
    progrm_env_id = warehouse.query("SELECT model_id FROM models WHERE kind = 'progrm_env'")[0][0].as_py()
    assert f"| progrm_env | {progrm_env_id} | all |" in figure and "last step" in figure

    # One flywheel round as `stepwise flywheel` runs it: the baseline (round 0) and round 1 (collect,
    # label, retrain, report), recorded in flywheel_rounds.
    monkeypatch.setenv("STEPWISE_HOME", str(home))
    outcomes: list[tuple[str, bool]] = []
    settings = FlywheelSettings(
        policies=("sft", "rl-outcome", "rl-prm"),  # no prm run: skipped with a note
        episodes_per_task=2,
        kinds=("progrm_env", "prm"),
        reward_model={"train_steps": 10, "threads": 1},
        report={"latency_calls": 3},
        alternatives={"states_per_task": 4, "top_k": 2, "continuations": 1},
    )
    notes: list[str] = []
    assert run_flywheel(warehouse, 1, settings, job_runner(instance, outcomes), notes.append), outcomes
    assert any("rl-prm: skipped" in n for n in notes)
    rounds = warehouse.query(
        "SELECT round, kind, model_id, agent_examples, top1, policy_top1, top1_states, alternative_states "
        "FROM flywheel_rounds ORDER BY round, kind"
    ).to_pylist()
    assert [(r["round"], r["kind"]) for r in rounds] == [(0, "prm"), (0, "progrm_env"), (1, "prm"), (1, "progrm_env")]
    assert rounds[0]["model_id"] != rounds[2]["model_id"]  # round 1 retrained on the new mix
    assert rounds[3]["agent_examples"] > 0
    # Alternatives at one state: the SFT policy's candidates replayed at held-out states in round 0
    # (sampled once: the same states judge every round), at training states in round 1.
    alternatives = warehouse.query(
        "SELECT round, purpose, count(DISTINCT state_id) AS states, count(*) AS candidates, "
        "count(*) FILTER (WHERE candidate = 0 AND policy_rank = 0) AS argmax, "
        "count(*) FILTER (WHERE mc_value BETWEEN 0 AND 1) AS valued FROM step_alternatives GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    purposes = {(r["round"], r["purpose"]) for r in alternatives}
    assert (0, "evaluation") in purposes and any(r == 1 and p != "evaluation" for r, p in purposes), alternatives
    assert not any(r == 1 and p == "evaluation" for r, p in purposes)
    for r in alternatives:
        assert r["candidates"] >= 2 * r["states"] and r["argmax"] == r["states"] and r["valued"] == r["candidates"]
    prm_examples = warehouse.query(
        "SELECT count(*) FILTER (WHERE group_id IS NOT NULL) AS grouped, "
        "count(*) FILTER (WHERE group_id IN (SELECT state_id FROM step_alternatives WHERE purpose = 'evaluation')) "
        "AS leaked FROM rm_examples WHERE kind = 'prm'"
    ).to_pylist()[0]
    assert prm_examples["grouped"] > 0 and prm_examples["leaked"] == 0
    informative = warehouse.query(
        "SELECT count(*) FROM (SELECT state_id FROM step_alternatives WHERE purpose = 'evaluation' "
        "AND mc_value IS NOT NULL GROUP BY state_id "
        "HAVING count(DISTINCT mc_value) > 1 AND bool_or(candidate = 0))"
    )[0][0].as_py()
    choosing = warehouse.query(
        "SELECT kind, states FROM rm_alternative_top1 WHERE family = 'all' AND report_run_id = "
        "(SELECT run_id FROM lineage_materializations WHERE asset = 'reward_model_report' ORDER BY created_at DESC "
        "LIMIT 1)"
    ).to_pylist()
    assert {r["kind"] for r in choosing} == ({"prm", "progrm_env"} if informative else set())
    assert all(r["states"] == informative for r in choosing)
    assert rounds[0]["top1_states"] == rounds[2]["top1_states"]  # the same held-out states, before and after
    assert (home / "plots" / "flywheel" / "auc_by_round.png").stat().st_size > 0
    collected_r1 = warehouse.query("SELECT count(*) FROM episodes WHERE episode_id LIKE 'policy:%:r01:%'")[0][0]
    assert collected_r1.as_py() == 2 * 2 * 2  # sft and rl-outcome, 2 tasks, 2 episodes each
