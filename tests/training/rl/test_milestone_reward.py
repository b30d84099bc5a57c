"""The spec's milestones as a reward (training.rl.rewards.milestones): ProgRM-Env's labels paid
exactly, alone and composed with the outcome."""

from __future__ import annotations

import dataclasses

import pytest

from annotation.progress.key_steps import milestone_progress
from tests.training.rl.test_rl_rewards import _rollout
from training.policy.rollouts import Rollout
from training.rl.estimators import discounted_returns
from training.rl.iterations import reward_model_of
from training.rl.rewards import SOURCE_MODEL_KIND, make_reward_source
from training.rl.rewards.composed import ComposedReward, Composition, decayed_weight
from training.rl.rewards.milestones import MilestoneReward, episode_milestone_progress
from training.rl.rewards.outcome import OutcomeReward
from warehouse.catalog import Warehouse

SPEC_ORDER = ("username typed", "password typed", "logged in")


def _with_hits(rollout: Rollout, hits: list[tuple[str, ...]], n_milestones: int = 3, episode_id: str = "e0") -> Rollout:
    record = rollout.record
    steps = tuple(dataclasses.replace(s, milestones_hit=h) for s, h in zip(record.steps, hits, strict=True))
    return Rollout(dataclasses.replace(record, steps=steps, n_milestones=n_milestones, episode_id=episode_id))


def test_progress_is_the_share_of_milestones_reached_and_the_reward_its_gains():
    rollout = _with_hits(_rollout("success"), [(), ("username typed",), ("password typed", "logged in"), ()])
    assert episode_milestone_progress(rollout.record) == pytest.approx([0, 1 / 3, 1, 1])
    batch = MilestoneReward().rewards([rollout], 0)
    assert batch.rewards[0] == pytest.approx([0, 1 / 3, 2 / 3, 0])  # ProgRM Eq. 2, k = 1, p_{-1} = 0
    assert batch.details["mean_final_progress"] == pytest.approx(1.0)
    # the online tracker reports milestones in the spec's order, so the running count is the labels'
    hits = [h.milestones_hit for h in rollout.record.steps]
    labels, _ = milestone_progress(hits, SPEC_ORDER)
    assert episode_milestone_progress(rollout.record) == pytest.approx(labels)


def test_a_task_without_milestones_pays_nothing_and_an_impossible_count_is_named():
    bare = _with_hits(_rollout("success"), [(), (), (), ()], n_milestones=0)
    assert MilestoneReward().rewards([bare], 0).rewards[0].tolist() == [0, 0, 0, 0]
    broken = _with_hits(_rollout("success"), [("a",), ("b",), ("c",), ("d",)], episode_id="e9")
    with pytest.raises(ValueError, match=r"episode e9 \(login-user\) reports 4 milestones reached of 3"):
        MilestoneReward().rewards([broken], 0)


def test_composed_with_the_outcome_shaping_telescopes_and_the_bonus_decays():
    gamma = 0.9
    success = _with_hits(_rollout("success"), [("username typed",), ("password typed",), (), ("logged in",)])
    failure = _with_hits(_rollout("wrong_user", 1), [("username typed",), (), ("password typed",), ()], episode_id="e1")
    rollouts = [success, failure]
    source = MilestoneReward()
    outcome = OutcomeReward().rewards(rollouts, 0).rewards
    shaped = ComposedReward(Composition("milestones", "shaped"), source, source.step_scores, gamma=gamma).rewards(
        rollouts, 0
    )
    for paid, base in zip(shaped.rewards, outcome, strict=True):
        # the shaping's discounted sum is -Phi(s_0) = 0: the outcome alone decides the return from s_0
        extra = discounted_returns(paid - base, gamma)[0]
        assert extra == pytest.approx(0.0, abs=1e-12)
    # the failure reached 2 of 3 milestones: shaping moves credit towards those steps, pays none in total
    assert shaped.rewards[1][0] == pytest.approx(gamma / 3)
    decay = ComposedReward(Composition("milestones", "decay"), source, source.step_scores, gamma=gamma)
    for iteration in (0, 5):
        paid = decay.rewards(rollouts, iteration).rewards
        gains = source.rewards(rollouts, iteration).rewards
        for p, base, g in zip(paid, outcome, gains, strict=True):
            assert p == pytest.approx(base + decayed_weight(iteration) * g)


def test_the_sources_need_no_reward_model(tmp_path):
    warehouse = Warehouse(tmp_path / "home")  # no model of any kind
    assert SOURCE_MODEL_KIND["milestones"] is None and SOURCE_MODEL_KIND["outcome+milestones:shaped"] is None
    for name in ("milestones", "outcome+milestones:shaped", "outcome+milestones:decay"):
        source = make_reward_source(name, warehouse, cache=None)  # type: ignore[arg-type]
        assert source.name == name and source.lineage() == []
    with pytest.raises(ValueError, match="uses no reward model"):
        make_reward_source("outcome+milestones:decay", warehouse, cache=None, model_id="progrm_env-1")  # type: ignore[arg-type]
    composed = make_reward_source("outcome+milestones:shaped", warehouse, cache=None)  # type: ignore[arg-type]
    assert isinstance(composed, ComposedReward) and isinstance(composed.dense, MilestoneReward)
    assert reward_model_of(composed) is None  # nothing to record or pin
