"""Reward sources: outcome, ProgRM progress gains (a real trained model, in-process and over HTTP),
step judges' format reward, ADMIRE milestones, and the errors before any rollout."""

import random

import numpy as np
import pytest

from tests.training.policy.test_policy import _login_episode, record_of
from training.base.encoder import EmbeddingCache, EncoderConfig, SegmentEncoder
from training.policy.rollouts import Rollout
from training.reward_models.scoring import HTTPScorer, LocalScorer, RewardModelError, load_scorer
from training.reward_models.serving import score_trajectories
from training.reward_models.serving_app import serve_in_background
from training.rl.rewards import make_reward_source
from training.rl.rewards.admire import (
    AdmireReward,
    AdmireSettings,
    MilestoneStore,
    TrajectoryMilestones,
    action_descriptions,
    match_milestones,
    milestone_credit,
)
from training.rl.rewards.base import text_trajectory
from training.rl.rewards.orm import ORMReward
from training.rl.rewards.outcome import OutcomeReward
from training.rl.rewards.prm import format_rewards
from training.rl.rewards.progrm import ProgressReward
from warehouse.catalog import Warehouse
from warehouse.trajectories import Trajectory


def _rollout(outcome: str = "success", seed: int = 0, episode_id: str = "e0", extra_steps: int = 0) -> Rollout:
    task, instruction, screens, actions, success, _, _ = _login_episode(random.Random(seed), outcome)
    screens, actions = list(screens[: len(actions)]), list(actions)
    for _ in range(extra_steps):  # a detour: click the username field again
        screens.insert(1, screens[1])
        actions.insert(1, actions[0])
    t = Trajectory(episode_id, task, instruction, "rollout", success, tuple(actions), tuple(screens))
    return Rollout(record_of(t))


def test_outcome_pays_only_the_last_step_of_a_success():
    batch = OutcomeReward().rewards([_rollout("success"), _rollout("wrong_user", 1, "e1")], 0)
    assert batch.rewards[0].tolist() == [0, 0, 0, 1] and batch.rewards[1].tolist() == [0, 0, 0, 0]


def test_text_trajectories_carry_the_final_screen_and_target_context():
    trajectory = text_trajectory(_rollout().record)
    assert len(trajectory.steps) == 4 and trajectory.final_screen_lines
    assert trajectory.steps[1].action.startswith("INPUT(textbox#username")


@pytest.fixture(scope="module")
def progrm_scorer(trained_progrm):
    return LocalScorer(trained_progrm)


def test_progress_reward_is_the_gain_of_the_models_progress(progrm_scorer):
    rollouts = [_rollout("success"), _rollout("stopped", 2, "e2")]
    batch = ProgressReward(progrm_scorer, k=1).rewards(rollouts, 0)
    scores = score_trajectories(progrm_scorer.scorer, [text_trajectory(r.record) for r in rollouts])
    for rewards, s in zip(batch.rewards, scores, strict=True):
        p = np.asarray(s.scores)
        assert np.allclose(rewards, p - np.concatenate([[0.0], p[:-1]]))  # Eq. 2, k = 1, p_{-1} = 0
        assert np.isclose(rewards.sum(), p[-1])  # gains telescope to the final progress
    k2 = ProgressReward(progrm_scorer, k=2).rewards(rollouts[:1], 0).rewards[0]
    p = np.asarray(scores[0].scores)
    assert np.isclose(k2[3], p[3] - p[1])


def test_the_http_service_gives_the_same_rewards(progrm_scorer, tmp_path):
    server, _ = serve_in_background(progrm_scorer.scorer)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        remote = HTTPScorer(url, expect_kind="progrm_env")
        rollouts = [_rollout("success"), _rollout("wrong_user", 3, "e3")]
        local = ProgressReward(progrm_scorer).rewards(rollouts, 0).rewards
        over_http = ProgressReward(remote).rewards(rollouts, 0).rewards
        for a, b in zip(local, over_http, strict=True):
            assert np.allclose(a, b, atol=1e-6)
        with pytest.raises(RewardModelError, match="serves a progrm_env model, not the orm"):
            HTTPScorer(url, expect_kind="orm")
        # a pinned model must be the one the service serves: a pin is never silently ignored
        served = load_scorer(Warehouse(tmp_path / "home"), "progrm_env", endpoint=url, model_id=remote.model_id)
        assert served.model_id == progrm_scorer.model_id
        with pytest.raises(RewardModelError, match="not the pinned progrm_env-other"):
            load_scorer(Warehouse(tmp_path / "home"), "progrm_env", endpoint=url, model_id="progrm_env-other")
    finally:
        server.shutdown()
    with pytest.raises(RewardModelError, match="not reachable"):
        HTTPScorer(url)


def test_the_orm_pays_its_judgement_or_under_the_rare_positive_rule_its_probability(trained_orm):
    """ProgRM's ORM pays 1 at the last step when P(success) reaches the threshold; the sparse
    block's rule pays P(success) itself, so a batch the threshold judges all-failed still ranks."""
    scorer = LocalScorer(trained_orm)
    rollouts = [_rollout("success"), _rollout("wrong_user", 1, "e1"), _rollout("stopped", 2, "e2")]
    final = [s.scores[-1] for s in score_trajectories(scorer.scorer, [text_trajectory(r.record) for r in rollouts])]
    threshold = float(np.median(final))  # one episode above, one at, one below
    binary = ORMReward(scorer, threshold=threshold).rewards(rollouts, 0)
    soft = ORMReward(scorer, threshold=threshold, rule="probability").rewards(rollouts, 0)
    for rollout, b, p, f in zip(rollouts, binary.rewards, soft.rewards, final, strict=True):
        assert b[:-1].tolist() == [0.0] * (rollout.n_steps - 1) and p[:-1].tolist() == b[:-1].tolist()
        assert b[-1] == (1.0 if f >= threshold else 0.0)
        assert p[-1] == pytest.approx(f)
    assert sorted(b[-1] for b in binary.rewards) == [0.0, 1.0, 1.0]
    assert binary.details["judged_success"] == soft.details["judged_success"] == pytest.approx(2 / 3)
    assert soft.details["probability_rule"] == 1.0 and binary.details["probability_rule"] == 0.0
    # a threshold no episode reaches: the binary reward is all zero, the probability still ranks
    never = ORMReward(scorer, threshold=2.0).rewards(rollouts, 0)
    assert all(r[-1] == 0.0 for r in never.rewards)
    ranked = ORMReward(scorer, threshold=2.0, rule="probability").rewards(rollouts, 0)
    assert len({round(r[-1], 6) for r in ranked.rewards}) > 1
    with pytest.raises(ValueError, match="unknown ORM rule 'soft'"):
        ORMReward(scorer, rule="soft")


def test_a_reward_model_of_the_wrong_kind_or_none_fails_before_any_rollout(progrm_scorer, tmp_path):
    with pytest.raises(RewardModelError, match="needs an orm model"):
        ORMReward(progrm_scorer)
    empty = Warehouse(tmp_path / "home")
    with pytest.raises(RewardModelError, match="no trained orm reward model"):
        load_scorer(empty, "orm")
    with pytest.raises(ValueError, match="unknown reward source"):
        make_reward_source("bogus", empty, cache=None)  # type: ignore[arg-type]
    with pytest.raises(RewardModelError, match="checkpoint not found"):
        LocalScorer(tmp_path / "missing")


def test_format_reward_penalises_unparsable_steps():
    rollout = _rollout()
    flagged = Rollout(rollout.record, format_ok=(True, False, True, True))
    assert format_rewards(flagged).tolist() == [0, -1, 0, 0]
    assert format_rewards(rollout).tolist() == [0, 0, 0, 0]


def test_milestone_matching_is_in_order_and_credit_is_asymmetric():
    # actions x milestones similarity; delta 0.75
    sims = np.array([[0.9, 0.1], [0.95, 0.2], [0.2, 0.8], [0.1, 0.99]])
    reward, reached = match_milestones(sims, 0.75)
    assert reward.tolist() == [0.9, 0.0, 0.8, 0.0] and reached.tolist() == [1, 1, 2, 2]  # stops after the last
    # Eq. 10: a success keeps its matches; Eq. 11: a failure adds k/K (running) to zeta * match
    assert milestone_credit(reward, reached, 2, True, 0.5).tolist() == [0.9, 0.0, 0.8, 0.0]
    assert np.allclose(milestone_credit(reward, reached, 2, False, 0.5), [0.5 + 0.45, 0.5, 1.0 + 0.4, 1.0])
    assert milestone_credit(reward, reached, 0, False, 0.5).tolist() == [0, 0, 0, 0]  # no milestones yet


@pytest.fixture(scope="module")
def cache():
    return EmbeddingCache(SegmentEncoder(EncoderConfig()))


def test_milestones_come_from_the_first_success_and_are_refined_by_a_shorter_one(cache):
    store = MilestoneStore(TrajectoryMilestones())
    long_path = _rollout("success", 0, "long", extra_steps=2)
    assert store.update([long_path]) == ["login-user"]
    first = store.tasks["login-user"]
    # clicks that only focus a field change nothing on the screen: the essential steps are typing
    # the two values and logging in
    assert first.milestones == [
        'INPUT(textbox#username, "<username>")',
        'INPUT(password#password, "<password>")',
        'CLICK(button#subbtn "Login")',
    ]
    assert store.update([_rollout("wrong_user", 1, "fail")]) == []  # failures never make milestones
    assert store.update([_rollout("success", 4, "again")]) == []  # not more minimal: kept
    assert store.tasks["login-user"].version == 1


def test_admire_total_reward_decays_and_pays_failures_their_progress(cache):
    settings = AdmireSettings()
    source = AdmireReward(cache, settings=settings, outcome_every_step=False)
    success, failure = _rollout("success", 0, "ok"), _rollout("wrong_user", 1, "bad")
    early = source.rewards([success, failure], iteration=0)
    assert early.details["tasks_with_milestones"] == 1.0
    ok, bad = early.rewards
    lam, zeta = settings.lambda_0, settings.zeta
    # the success reaches its three milestones (identical texts, similarity 1); its first click is
    # not a milestone; the outcome comes at the end (Eq. 10 plus R_outcome)
    assert np.allclose(ok, [0.0, lam, lam, lam + 1.0], atol=1e-4)
    # the failure typed the wrong name; Sentence-BERT still finds it close enough to "type the
    # username" (above delta: the matching's known weakness, ADMIRE App. B.4.2 reports 81% accuracy),
    # then it reaches the rest in order: k/K + zeta * match at each step (Eq. 11)
    sim = source.similarities(action_descriptions(failure.record), source.store.tasks["login-user"].milestones)
    assert sim[1, 0] > settings.delta
    assert np.allclose(bad, [0.0, lam * (1 / 3 + zeta * sim[1, 0]), lam * (2 / 3 + zeta), lam * (1 + zeta)], atol=1e-4)
    later = source.rewards([success], iteration=50).rewards[0]
    assert later[1] == pytest.approx(lam * settings.gamma**50, abs=1e-4)  # lambda_0 * gamma^E
    every_step = AdmireReward(cache, store=source.store, outcome_every_step=True).rewards([success], 0).rewards[0]
    assert np.allclose(every_step - ok, [1, 1, 1, 0], atol=1e-6)  # GRPO's reading: the outcome at every step
    assert action_descriptions(success.record)[2] == 'INPUT(password#password, "<password>")'


def test_the_orm_judges_with_the_threshold_its_report_chose(tmp_path):
    import pyarrow as pa

    from training.reward_models.scoring import report_threshold
    from warehouse.catalog import Materialization
    from warehouse.tables_training import RM_METRICS

    warehouse = Warehouse(tmp_path / "home")
    assert report_threshold(warehouse, "orm-1") == 0.5  # never reported: the default
    m = Materialization(asset="reward_model_report")
    rows = [{"model_id": "orm-1", "kind": "orm", "split": "validation", "metric": "threshold", "value": 0.44}]
    warehouse.publish(
        m, [warehouse.stage_table("rm_metrics", "orm-1", pa.Table.from_pylist(rows, schema=RM_METRICS), m)]
    )
    assert report_threshold(warehouse, "orm-1") == pytest.approx(0.44)
    assert report_threshold(warehouse, "orm-2", default=0.6) == 0.6


def test_the_prm_pays_its_judgement_as_plus_or_minus_one_with_the_format_penalty(trained_prm):
    from training.rl.rewards.prm import StepJudgeReward

    scorer = LocalScorer(trained_prm)
    rollout = _rollout()
    flagged = Rollout(rollout.record, format_ok=(True, True, False, True))
    rewards = StepJudgeReward(scorer, kind="prm").rewards([flagged], 0).rewards[0]
    p = np.asarray(scorer.score([text_trajectory(rollout.record)])[0].scores)
    assert np.allclose(rewards, 2 * p - 1 + np.array([0, 0, -1, 0]))
    assert np.all(rewards[[0, 1, 3]] >= -1) and np.all(rewards[[0, 1, 3]] <= 1)
    with pytest.raises(RewardModelError, match="needs a guidnav model"):
        StepJudgeReward(scorer, kind="guidnav")


def test_a_reward_model_can_be_pinned_by_id(trained_progrm, tmp_path):
    """``model_id`` loads that registered model, not the newest of its kind; an unknown id, one of
    another kind or one this encoder cannot load fails with its name before any rollout."""
    import json
    import shutil
    from datetime import UTC, datetime

    import pyarrow as pa

    from warehouse.catalog import Materialization
    from warehouse.tables_training import MODELS

    warehouse = Warehouse(tmp_path / "home")
    stale = tmp_path / "stale"
    shutil.copytree(trained_progrm, stale)
    config_file = stale / "reward_model_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({k: v for k, v in config.items() if k != "encoder_fingerprint"}))
    for day, (model_id, checkpoint) in enumerate(
        [("progrm_env-old", trained_progrm), ("progrm_env-new", shutil.copytree(trained_progrm, tmp_path / "new"))]
        + [("progrm_env-stale", stale)],
        start=1,
    ):
        row = {"model_id": model_id, "kind": "progrm_env", "checkpoint_path": str(checkpoint)}
        row["created_at"] = datetime(2026, 1, day, tzinfo=UTC)
        m = Materialization(asset="test_models")
        warehouse.publish(m, [warehouse.stage_table("models", model_id, pa.Table.from_pylist([row], schema=MODELS), m)])
    assert isinstance(newest := load_scorer(warehouse, "progrm_env"), LocalScorer)
    assert newest.checkpoint == str(tmp_path / "new")  # the stale one is passed over
    pinned = load_scorer(warehouse, "progrm_env", model_id="progrm_env-old")
    assert isinstance(pinned, LocalScorer) and pinned.checkpoint == str(trained_progrm)
    cache = pinned.scorer.cache
    source = make_reward_source("progrm_env", warehouse, cache=cache, model_id="progrm_env-old")
    assert [i.path for i in source.lineage()] == [str(trained_progrm)]
    with pytest.raises(RewardModelError, match="no reward model 'progrm_env-gone'"):
        load_scorer(warehouse, "progrm_env", model_id="progrm_env-gone")
    with pytest.raises(RewardModelError, match="progrm_env-old is a progrm_env model, not a orm one"):
        load_scorer(warehouse, "orm", model_id="progrm_env-old")
    with pytest.raises(RewardModelError, match="progrm_env-stale cannot be loaded"):
        load_scorer(warehouse, "progrm_env", model_id="progrm_env-stale")
    with pytest.raises(ValueError, match="outcome reward uses no reward model"):
        make_reward_source("outcome", warehouse, cache=cache, model_id="progrm_env-old")
