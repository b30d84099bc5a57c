"""Run-config fields renamed for one meaning per name (issue 40 item 5): saved configs still work."""

import pytest
from dagster import Failure

from assets.config import renamed_field
from assets.guidance import GuidanceEvaluationConfig, _settings
from assets.rollouts import RolloutConfig


def test_a_saved_rollout_config_with_the_old_policy_field_still_chooses_the_exploration_policy():
    warnings: list[str] = []
    chosen = renamed_field(RolloutConfig(policy="random_walk"), "policy", "exploration_policy", warnings.append)
    assert chosen == "random_walk"
    assert len(warnings) == 1 and "'exploration_policy'" in warnings[0]
    assert (
        renamed_field(RolloutConfig(exploration_policy="random_walk"), "policy", "exploration_policy") == "random_walk"
    )
    assert renamed_field(RolloutConfig(), "policy", "exploration_policy") == "noisy_expert"
    # the same value under both names is one choice, not a conflict
    same = RolloutConfig(policy="random_walk", exploration_policy="random_walk")
    assert renamed_field(same, "policy", "exploration_policy") == "random_walk"


def test_a_config_that_sets_both_names_differently_is_refused_naming_both():
    both = RolloutConfig(policy="random_walk", exploration_policy="expert")
    with pytest.raises(Failure, match="both 'policy'.*'exploration_policy'"):
        renamed_field(both, "policy", "exploration_policy")


def test_the_guidance_policy_backend_reads_the_old_policy_field():
    old = GuidanceEvaluationConfig(policy="endpoint", policy_endpoint="http://127.0.0.1:9/v1", tasks=["click-option"])
    assert _settings(old).policy_backend == "endpoint"
    assert _settings(GuidanceEvaluationConfig()).policy_backend == "learned"
