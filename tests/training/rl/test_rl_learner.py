"""The RL update: each estimator moves probability toward rewarded actions, with real gradients."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from envs.protocol import EpisodeContext
from tests.training.policy.test_policy import INSTRUCTION, LOGIN, SLOTS, _login_screen
from training.base.states import StepState, describe_action
from training.policy.learned import LearnedPolicy, PolicyModel
from training.reward_models.models import RewardScorer
from training.rl.learner import CriticState, EpisodeExperience, Learner, LearnerSettings, PRMCritic
from warehouse.model import ActionType

GOOD = 'INPUT(textbox#username, "<username>")'


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return PolicyModel()


def _sample(model: PolicyModel, n: int, seed: int):
    """n one-step episodes on the login screen, sampled by the policy; reward 1 for typing the
    username into its field."""
    policy = LearnedPolicy(model, policy_id=f"sampler-{seed}", record=True)
    screen = _login_screen(None, None, None)
    out = []
    for i in range(n):
        context = EpisodeContext(LOGIN.spec, INSTRUCTION, SLOTS, 0, "miniwob", frozenset(ActionType), 10, f"e{i}")
        policy.start(context).act(screen)
        decision = policy.decisions[f"e{i}"][0]
        reward = 1.0 if decision.action_texts[decision.chosen] == GOOD else 0.0
        out.append(EpisodeExperience([decision], np.array([reward]), group=f"g{i % 4}"))
    return out


def _p_good(model: PolicyModel, decision) -> float:
    with torch.inference_mode():
        logp = model.log_probs(model.batch([decision]))
    return float(torch.exp(logp[decision.action_texts.index(GOOD)]))


@pytest.mark.parametrize("estimator", ["reinforce_pp", "reinforce_pp_kl_apart", "grpo", "rloo"])
def test_each_estimator_raises_the_probability_of_the_rewarded_action(base, estimator):
    model = base.frozen_copy()
    for p in model.scorer.parameters():
        p.requires_grad_(True)
    reference = base.frozen_copy()
    learner = Learner(model, reference, LearnerSettings(estimator=estimator, learning_rate=3e-3, epochs=2, seed=1))
    probe = _sample(model, 1, 99)[0].decisions[0]
    before = _p_good(model, probe)
    for round_ in range(6):
        stats = learner.update(_sample(model, 32, round_))
    after = _p_good(model, probe)
    assert after > before + 0.05, (before, after)
    assert stats.kl_to_reference > 0 and stats.steps == 32 and len(stats.advantages) == 32


def test_update_refuses_misaligned_rewards(base):
    learner = Learner(base.frozen_copy(), base.frozen_copy(), LearnerSettings())
    episode = _sample(base, 1, 0)[0]
    with pytest.raises(ValueError, match="decisions but"):
        learner.update([EpisodeExperience(episode.decisions, np.zeros(2), "g")])
    with pytest.raises(ValueError, match="unknown estimator"):
        LearnerSettings(estimator="a2c")
    with pytest.raises(ValueError, match="PPO needs a critic"):
        Learner(base, base, LearnerSettings(estimator="ppo"))


def test_ppo_with_a_critic_initialised_from_a_reward_model(base, trained_progrm):
    """The critic starts as a copy of a trained frozen-segments reward model (GUI-Shepherd
    initialises it from the PRM; any such model has the same shape), reads only (state, action)
    pairs as the PRM does, and regresses the returns."""
    scorer = RewardScorer.from_checkpoint(trained_progrm)
    critic = PRMCritic(scorer, learning_rate=1e-3, top_k=2)
    episodes = _sample(base, 1, 0)
    state = _critic_state(episodes[0].decisions[0])
    probs = np.array([0.1] * (len(state.actions) - 2) + [0.3, 0.5])
    probs = probs / probs.sum()
    # V(s) is the policy-weighted judgement of its two most likely actions, renormalised
    top = [len(state.actions) - 1, len(state.actions) - 2]
    pairs = [replace(state.state, action=state.actions[j]) for j in top]
    judged = scorer.model(**_batch(scorer, pairs))["logits"].detach().numpy()
    expected = (probs[top] / probs[top].sum() * judged).sum()
    assert np.isclose(critic.values([state], [probs])[0], expected, atol=1e-4)
    assert all(p.action is not None for p in critic.judged_pairs([state], [probs])[0])
    with pytest.raises(ValueError, match="candidate actions but"):
        critic.values([state], [probs[:-1]])

    model = base.frozen_copy()
    for p in model.scorer.parameters():
        p.requires_grad_(True)
    learner = Learner(model, base.frozen_copy(), LearnerSettings(estimator="ppo", learning_rate=0.0), critic=critic)
    # the same episodes each round: their returns are fixed targets, so the value loss measures the
    # regression alone (fresh samples each round moved the targets); the policy stays still (its
    # learning rate 0), since V(s) weighs the PRM by the policy and a moving policy moves V too
    episodes = _sample(model, 16, 10)
    for e in episodes:
        e.states = [_critic_state(d) for d in e.decisions]
    losses = [learner.update(episodes).value_loss for _ in range(4)]
    assert losses[-1] < losses[0]
    # a checkpoint keeps the critic it learned: a learner restored from it judges as this one does
    fresh = Learner(
        model,
        base.frozen_copy(),
        LearnerSettings(estimator="ppo", learning_rate=0.0),
        critic=PRMCritic(scorer, learning_rate=1e-3, top_k=2),
    )
    assert not np.isclose(fresh.critic.values([state], [probs])[0], critic.values([state], [probs])[0])
    fresh.load_state_dict(learner.state_dict())
    assert np.isclose(fresh.critic.values([state], [probs])[0], critic.values([state], [probs])[0], atol=1e-6)
    e.states = []
    with pytest.raises(ValueError, match="critic states"):
        learner.update([e])


def _critic_state(decision) -> CriticState:
    screen = _login_screen(None, None, None)
    return CriticState(
        StepState(INSTRUCTION, (), tuple(screen.to_text().split("\n"))),
        tuple(describe_action(a, screen) for a in decision.actions),
    )


def _batch(scorer, states):
    from training.reward_models.models import collate_segments, segment_features

    features = segment_features(states, scorer.cache, scorer.config)
    return collate_segments(features, np.arange(len(states)), torch.from_numpy(scorer.cache.matrix))


def test_the_run_gives_the_critic_each_steps_candidates_as_the_prm_reads_actions(base):
    """runs._critic_states pairs every step's state with the candidates the policy chose among, in
    the decision's order, written as the PRM's training data writes the executed action."""
    from datetime import UTC, datetime

    from envs.protocol import EpisodeRecord, StepRecord
    from training.rl.rewards.base import text_trajectory
    from training.rl.runs import _critic_states

    policy = LearnedPolicy(base, policy_id="critic-states", record=True)
    context = EpisodeContext(LOGIN.spec, INSTRUCTION, SLOTS, 0, "miniwob", frozenset(ActionType), 10, "e0")
    actor = policy.start(context)
    screen = _login_screen(None, None, None)
    steps = tuple(StepRecord(t, screen, actor.act(screen), 0.0, (), t == 1, 0, 0.0) for t in range(2))
    record = EpisodeRecord(
        "e0", "login-user", "miniwob-forms", INSTRUCTION, 0, "critic-states", "miniwob", steps, screen, {}, SLOTS,
        False, 0.0, None, "max_steps", 0, 3, 0.0, 0, datetime.now(UTC),
    )  # fmt: skip
    decisions = policy.decisions["e0"]
    states = _critic_states(record, decisions)
    executed = text_trajectory(record).steps
    assert [len(s.actions) for s in states] == [d.n_candidates for d in decisions]
    assert [s.actions[d.chosen] for s, d in zip(states, decisions, strict=True)] == [s.action for s in executed]
    assert states[1].state.history == (executed[0].action,) and states[0].state.action is None
