"""The whole code location, loaded as Dagster loads it: the asset graph (keys, groups, dependencies,
checks), the jobs, sensors and resources. A change to the graph shows up here as a diff."""

from dagster import AllPartitionMapping, AssetKey

from pipelines.definitions import defs

GROUPS = {
    "demonstrations": {"human_demonstrations"},
    "rollouts": {"rollouts", "android_rollouts"},
    "labels": {"synthetic_trajectories", "recipe_library", "progress_labels", "progress_split", "label_quality_report"},
    "human_labels": {
        "annotation_candidates",
        "annotation_queue",
        "human_labels",
        "human_step_labels",
        "annotation_agreement",
        "label_source_comparison",
        "label_rationales",
    },
    "reward_models": {"reward_model_datasets", "reward_model", "reward_model_report"},
    "rl": {"policy_sft", "rl_run", "agent_evaluation", "rl_report"},
    "llm": {"llm_agent"},
    "guidance": {"guidance_evaluation", "guidance_report"},
    "flywheel": {"policy_rollouts", "step_alternatives", "flywheel_round"},
}

DEPENDENCIES = {
    "synthetic_trajectories": {"human_demonstrations", "rollouts", "policy_rollouts"},
    "recipe_library": {"human_demonstrations", "rollouts", "policy_rollouts", "synthetic_trajectories"},
    "progress_labels": {"human_demonstrations", "rollouts", "policy_rollouts", "synthetic_trajectories"},
    "progress_split": {"progress_labels"},
    "label_quality_report": {"progress_labels"},
    "reward_model_datasets": {"progress_labels", "progress_split", "step_alternatives"},
    "reward_model": {"reward_model_datasets"},
    "reward_model_report": {"reward_model"},
    "policy_sft": {"human_demonstrations", "rollouts"},
    "rl_run": {"policy_sft", "reward_model"},
    "agent_evaluation": {"rl_run"},
    "rl_report": {"policy_sft", "agent_evaluation"},
    "llm_agent": {"human_demonstrations", "rollouts", "reward_model"},
    "guidance_evaluation": {"policy_sft", "reward_model"},
    "guidance_report": {"guidance_evaluation"},
    "policy_rollouts": {"policy_sft"},
    "step_alternatives": {"policy_rollouts"},
    "flywheel_round": {"reward_model_report"},
    "annotation_queue": {"annotation_candidates"},
    "human_labels": {"annotation_queue"},
    "human_step_labels": {"human_labels"},
    "annotation_agreement": {"human_labels"},
    "label_source_comparison": {"human_step_labels"},
    "label_rationales": {"human_labels"},
}

CHECKS = {
    "human_demonstrations": {
        "demonstrations_schema",
        "demonstrations_no_empty_episodes",
        "demonstrations_action_types_known",
        "demonstrations_success_and_failure",
    },
    "progress_labels": {"labels_in_unit_interval", "labels_non_decreasing", "every_episode_labelled_or_explained"},
    "label_quality_report": {"improved_beats_paper_on_held_out"},
    "reward_model_datasets": {"dataset_is_valid"},
    "reward_model": {"checkpoint_loads"},
    "reward_model_report": {"reward_model_report_metrics_present", "reward_model_report_progrm_beats_orm"},
    "rollouts": {
        f"rollouts_{name}"
        for name in (
            "whole_episodes",
            "attempts_accounted",
            "rewards_and_milestones",
            "success_and_failure",
            "attempts_schema",
        )
    },
    "guidance_report": {"prm_best_of_n_beats_base"},
    "step_alternatives": {
        "step_alternatives_key_unique",
        "step_alternatives_labels_in_range",
        "step_alternatives_replays_reproduce_states",
    },
}


def _graph():
    return defs.get_repository_def().asset_graph


def test_every_asset_is_in_its_stage_group():
    groups: dict[str, set[str]] = {}
    for node in _graph().asset_nodes:
        groups.setdefault(node.group_name, set()).add(node.key.to_user_string())
    assert groups == GROUPS


def test_dependencies_follow_the_pipeline():
    parents = {n.key.to_user_string(): {p.to_user_string() for p in n.parent_keys} for n in _graph().asset_nodes}
    for asset, expected in DEPENDENCIES.items():
        assert expected <= parents[asset], asset
    for source in ("human_demonstrations", "rollouts", "android_rollouts"):
        assert parents[source] == set()


def test_asset_checks_sit_next_to_their_assets():
    checks: dict[str, set[str]] = {}
    for key in _graph().asset_check_keys:
        checks.setdefault(key.asset_key.to_user_string(), set()).add(key.name)
    for asset, expected in CHECKS.items():
        assert expected <= checks.get(asset, set()), asset
    assert {"human_labels_unique_annotations", "annotation_queue_no_duplicates"} <= {
        name for names in checks.values() for name in names
    }


def test_jobs_sensors_and_resources():
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {
        "stepwise_main",
        "label_families",
        "annotation_push",
        "reward_models",
        "reward_model_evaluation",
        "miniwob_rollouts_job",
        "android_rollouts_job",
        "policy_sft_job",
        "rl_runs",
        "rl_report_job",
        "guidance_evaluations",
        "guidance_report_job",
        "policy_rollouts_job",
        "step_alternatives_job",
    } <= jobs
    assert {sensor.name for sensor in defs.sensors or []} == {"label_studio_sync", "new_episodes_to_label"}
    assert set(defs.resources or {}) == {"warehouse", "env_pool", "label_studio"}
    # The main job runs every unpartitioned offline stage and none that needs people or long training.
    main = defs.resolve_job_def("stepwise_main")
    selected = {k.to_user_string() for k in main.asset_layer.selected_asset_keys}
    assert GROUPS["labels"] | GROUPS["demonstrations"] <= selected
    assert not selected & (
        GROUPS["human_labels"] | GROUPS["reward_models"] | GROUPS["rollouts"] | GROUPS["rl"] | GROUPS["guidance"]
    )
    # Recipes and labels are partitioned by label family, so the main job is launched over a range of
    # families (the demo: all of them, one run); the family job runs one family at a time.
    assert main.partitions_def is not None and main.partitions_def.get_partition_keys()[-1] == "other"
    families = defs.resolve_job_def("label_families")
    assert {k.to_user_string() for k in families.asset_layer.selected_asset_keys} == {
        "recipe_library",
        "progress_labels",
    }


def test_every_reader_of_the_labels_reads_every_label_family():
    """Labels are partitioned by label family; an asset partitioned otherwise on either side
    (reward-model kinds below, rollouts' batch x family above) must map to all partitions, not to a
    same-named one (Dagster's default), or a backfill would wait for partitions that never exist."""
    graph = defs.resolve_asset_graph()
    for labels in ("progress_labels", "recipe_library"):
        node = graph.get(AssetKey(labels))
        edges = [(child, node.key) for child in node.child_keys] + [(node.key, parent) for parent in node.parent_keys]
        for child, parent in edges:
            if graph.get(parent).partitions_def not in (None, graph.get(child).partitions_def):
                mapping = graph.get_partition_mapping(child, parent)
                assert isinstance(mapping, AllPartitionMapping), (child, parent, mapping)
