"""Composed rewards (issue 41, item 1): the outcome plus a learned source, shaped (potential-based,
Ng et al. 1999) or with ADMIRE's decaying weight; hand-checked sums, real trained models, and the
one-line errors of a malformed name."""

import numpy as np
import pytest

from tests.training.rl.test_rl_rewards import _rollout
from training.reward_models.scoring import LocalScorer
from training.rl.estimators import discounted_returns
from training.rl.iterations import reward_model_of
from training.rl.rewards import REWARD_SOURCES, SOURCE_MODEL_KIND, check_reward_source
from training.rl.rewards.base import text_trajectory
from training.rl.rewards.composed import (
    COMPOSED_SOURCES,
    ComposedReward,
    Composition,
    decayed_weight,
    episode_potentials,
    model_step_scores,
    parse_composition,
    shaping_rewards,
    shuffled_step_scores,
)
from training.rl.rewards.outcome import OutcomeReward
from training.rl.rewards.prm import StepJudgeReward
from training.rl.rewards.progrm import ProgressReward
from training.rl.runs import RL_CODE_VERSION, RUN_VARIANTS, RLSettings, rl_settings_for


def test_shaping_by_hand_telescopes_to_minus_the_first_potential():
    # Phi(s_0..s_3) = 0, .2, .5, .9; the last state is terminal, so its .9 counts as 0
    assert np.allclose(shaping_rewards([0, 0.2, 0.5, 0.9], gamma=1.0), [0.2, 0.3, -0.5])
    assert np.allclose(shaping_rewards([0, 0.2, 0.5, 0.9], gamma=0.9), [0.18, 0.25, -0.5])
    # discounted with the same gamma: .18 + .9 * .25 - .81 * .5 = 0 = -Phi(s_0)
    assert discounted_returns(shaping_rewards([0, 0.2, 0.5, 0.9], 0.9), 0.9)[0] == pytest.approx(0.0, abs=1e-12)
    assert discounted_returns(shaping_rewards([0.3, 0.2, 0.5, 0.9], 0.9), 0.9)[0] == pytest.approx(-0.3)
    assert shaping_rewards([0.4], 0.9).size == 0  # no step, nothing to shape


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_whatever_the_agent_does_an_episodes_shaping_sums_to_minus_phi_s0(gamma):
    """Random potentials with a large final one: a shaping that kept the terminal potential
    would sum to gamma^T * Phi(s_T) - Phi(s_0) and fail here."""
    rng = np.random.default_rng(0)
    for length in range(1, 12):
        phi = rng.random(length + 1)
        phi[-1] = 5.0
        returns = discounted_returns(shaping_rewards(phi, gamma), gamma)
        assert returns[0] == pytest.approx(-phi[0], abs=1e-12)
        # from any step on, the shaping's return is -Phi(s_t): a baseline of the state, not a payment
        assert np.allclose(returns, -phi[:-1], atol=1e-12)


def test_the_potentials_start_at_zero_and_follow_the_step_scores():
    assert episode_potentials([0.2, 0.7]).tolist() == [0.0, 0.2, 0.7]


def test_the_decaying_weight_is_admires_lambda_0_gamma_to_the_iteration():
    assert decayed_weight(0) == pytest.approx(0.3)
    assert decayed_weight(1) == pytest.approx(0.3 * 0.99)
    assert decayed_weight(10, weight=0.5, rate=0.8) == pytest.approx(0.5 * 0.8**10)
    weights = [decayed_weight(e) for e in range(20)]
    assert all(a > b for a, b in zip(weights, weights[1:], strict=False))
    with pytest.raises(ValueError, match="iteration"):
        decayed_weight(-1)


def test_names_parse_and_a_malformed_one_says_what_is_wrong():
    assert parse_composition("progrm_env") is None
    assert parse_composition("outcome+progrm_env:shaped") == Composition("progrm_env", "shaped")
    assert parse_composition("outcome+prm:decay").name == "outcome+prm:decay"
    for name, message in [
        ("outcome+progrm_env", "say how the source is added"),
        ("outcome+foo:shaped", "unknown source 'foo'"),
        ("outcome+prm:linear", "unknown form 'linear'"),
        ("orm+prm:decay", "adds a learned source to the outcome"),
    ]:
        with pytest.raises(ValueError, match=message) as error:
            check_reward_source(name)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="unknown reward source 'nonsense'"):
        check_reward_source("nonsense")
    with pytest.raises(ValueError, match="unknown form"):
        RLSettings("outcome+orm:sometimes")
    assert set(COMPOSED_SOURCES) <= set(REWARD_SOURCES) and set(COMPOSED_SOURCES) <= set(RUN_VARIANTS)
    assert SOURCE_MODEL_KIND["outcome+prm:decay"] == "prm"


def test_a_composed_run_has_its_own_key_and_old_keys_stand():
    plain = RLSettings("progrm_env").run_key("sft-x")
    # dense_weight and dense_decay are not in a plain source's key: these are the keys of code version
    # rl-6 with or without composed sources (rl-5 gave ...8ca31a and ...6075aa; a new code version is
    # a new run, as its episodes are sampled differently)
    assert RL_CODE_VERSION == "rl-6"
    assert plain == "progrm_env-reinforce_pp-s0-dc2259"
    assert RLSettings("orm", block="sparse").run_key("sft-x") == "orm-reinforce_pp-s0-8e3e40"
    shaped = RLSettings("outcome+progrm_env:shaped").run_key("sft-x")
    decay = RLSettings("outcome+progrm_env:decay").run_key("sft-x")
    assert shaped.startswith("outcome+progrm_env:shaped-reinforce_pp-s0-") and len({plain, shaped, decay}) == 3
    assert RLSettings("outcome+progrm_env:decay", dense_weight=0.5).run_key("sft-x") != decay
    assert RLSettings("outcome+progrm_env:shaped", dense_weight=0.5).run_key("sft-x") == shaped  # unused there
    # the same reward with the KL kept apart: its own run (estimator in the key), its settings from the name
    apart = rl_settings_for("outcome+progrm_env:shaped_kl_apart", "sparse-s3")
    assert (apart.reward_source, apart.estimator, apart.learner.estimator) == (
        "outcome+progrm_env:shaped",
        "reinforce_pp_kl_apart",
        "reinforce_pp_kl_apart",
    )
    assert (apart.block, apart.rl_seed) == ("sparse", 3)
    assert apart.run_key("sft-x").startswith("outcome+progrm_env:shaped-reinforce_pp_kl_apart-s3-")
    assert all(f"{source}_kl_apart" in RUN_VARIANTS for source in REWARD_SOURCES)
    assert RLSettings("outcome+orm:decay").orm_rule == "threshold" and RLSettings("outcome+prm:decay").orm_rule is None


def test_shaped_progress_pays_the_outcome_and_moves_credit_between_steps(trained_progrm):
    """A real trained ProgRM-Env model: every episode's shaped rewards, discounted, return exactly
    the outcome's return (the model cannot add or take away what an episode earns)."""
    scorer = LocalScorer(trained_progrm)
    rollouts = [_rollout("success"), _rollout("stopped", 2, "e2"), _rollout("wrong_user", 1, "e1")]
    gamma = 0.9
    scores = model_step_scores(scorer)
    source = ComposedReward(Composition("progrm_env", "shaped"), ProgressReward(scorer), scores, gamma=gamma)
    batch = source.rewards(rollouts, iteration=3)
    outcome = OutcomeReward().rewards(rollouts, 3).rewards
    scores = scorer.score([text_trajectory(r.record) for r in rollouts])
    for shaped, plain, s in zip(batch.rewards, outcome, scores, strict=True):
        p = np.asarray(s.scores)
        assert np.allclose(shaped - plain, np.append(gamma * p[:-1], 0.0) - np.concatenate([[0.0], p[:-1]]))
        assert discounted_returns(shaped, gamma)[0] == pytest.approx(discounted_returns(plain, gamma)[0], abs=1e-9)
    assert batch.details["mean_dense_return"] == pytest.approx(0.0, abs=1e-9)  # discounted as the learner does
    assert source.lineage() == ProgressReward(scorer).lineage()
    # the run records, and a resumed run is pinned to, the model of its learned part
    scorer.model_id = "progrm_env-0123456789abcdef"  # as a registered model has (the fixture's is not)
    assert reward_model_of(source) == "progrm_env-0123456789abcdef"


def test_decayed_prm_adds_its_judgement_with_a_weight_that_fades(trained_prm):
    scorer = LocalScorer(trained_prm)
    rollouts = [_rollout("success"), _rollout("wrong_user", 1, "e1")]
    judge = StepJudgeReward(scorer, kind="prm")
    scores = model_step_scores(scorer)
    source = ComposedReward(Composition("prm", "decay"), judge, scores, gamma=0.9, weight=0.3, rate=0.5)
    outcome = OutcomeReward().rewards(rollouts, 0).rewards
    dense = judge.rewards(rollouts, 0).rewards
    for iteration in (0, 2):
        batch = source.rewards(rollouts, iteration)
        for total, plain, d in zip(batch.rewards, outcome, dense, strict=True):
            assert np.allclose(total, plain + 0.3 * 0.5**iteration * d)
        assert batch.details["shaping_weight"] == pytest.approx(0.3 * 0.5**iteration)


def test_the_shuffled_control_keeps_the_batchs_scores_and_lengths_and_breaks_which_state_has_which():
    scores = [[0.1, 0.2, 0.3], [0.9], [], [0.4, 0.5, 0.6, 0.7, 0.8]]
    shuffled = shuffled_step_scores(scores, [3, 7])
    assert [len(s) for s in shuffled] == [3, 1, 0, 5]
    assert sorted(np.concatenate(shuffled).tolist()) == sorted(sum(scores, []))
    assert [s.tolist() for s in shuffled_step_scores(scores, [3, 7])] == [s.tolist() for s in shuffled]
    moved = [shuffled_step_scores(scores, [3, seed]) for seed in range(20)]
    assert any(np.concatenate(m).tolist() != sum(scores, []) for m in moved)  # a permutation, not the identity
    assert len({tuple(np.concatenate(m).tolist()) for m in moved}) > 1  # the seed decides it
    assert shuffled_step_scores([], [0]) == []


def test_shuffled_shaping_still_pays_only_the_outcome_and_is_the_same_when_scored_again(trained_progrm):
    """The control with a real model: each episode's shaping still telescopes to 0 (the outcome decides),
    its potentials are the batch's scores in another order, and a second scoring of the same batch
    (a resumed run) gives the same rewards; other iterations permute differently, and it is not the
    shaped form under another name."""
    scorer = LocalScorer(trained_progrm)
    rollouts = [_rollout("success"), _rollout("stopped", 2, "e2"), _rollout("wrong_user", 1, "e1")]
    gamma = 0.9
    step_scores = model_step_scores(scorer)
    source = ComposedReward(Composition("progrm_env", "shuffled"), ProgressReward(scorer), step_scores, gamma=gamma)
    batch = source.rewards(rollouts, iteration=3)
    outcome = OutcomeReward().rewards(rollouts, 3).rewards
    for shuffled, plain in zip(batch.rewards, outcome, strict=True):
        assert discounted_returns(shuffled, gamma)[0] == pytest.approx(discounted_returns(plain, gamma)[0], abs=1e-9)
    scores = np.concatenate([s.scores for s in scorer.score([text_trajectory(r.record) for r in rollouts])])
    # the potentials the control used, recovered from its shaping (Phi(s_0) = 0, Phi(s_{t+1}) =
    # (F_t + Phi(s_t)) / gamma; the terminal one is 0): each is one of the batch's scores
    used = []
    for shuffled, plain in zip(batch.rewards, outcome, strict=True):
        phi = 0.0
        for f in (shuffled - plain)[:-1]:
            phi = (f + phi) / gamma
            used.append(phi)
    assert used and all(np.isclose(scores, u, atol=1e-9).any() for u in used)
    again = source.rewards(rollouts, iteration=3)
    assert all(np.array_equal(a, b) for a, b in zip(batch.rewards, again.rewards, strict=True))

    def same(a, b):
        return all(np.allclose(x, y) for x, y in zip(a.rewards, b.rewards, strict=True))

    shaped = ComposedReward(Composition("progrm_env", "shaped"), ProgressReward(scorer), step_scores, gamma=gamma)
    # not the shaped form under another name: over a few iterations some permutation moves a potential
    assert not all(same(source.rewards(rollouts, i), shaped.rewards(rollouts, i)) for i in range(6))
    assert not all(same(source.rewards(rollouts, i), batch) for i in range(4, 10))  # the iteration reseeds it
    # what it reports of the potentials is the model's own (unshuffled) last score
    assert batch.details["mean_final_potential"] == shaped.rewards(rollouts, 3).details["mean_final_potential"]
    assert check_reward_source("outcome+progrm_env:shuffled") is None
