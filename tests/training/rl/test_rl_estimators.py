"""The RL estimators against hand-computed examples."""

import math

import numpy as np
import pytest
import torch

from training.rl.estimators import (
    clip_fraction,
    discounted_returns,
    gae,
    grpo_step_advantages,
    kl_penalty,
    multi_turn_token_returns,
    normalise,
    ppo_clip_loss,
    reinforce_pp_advantages,
    reinforce_pp_kl_apart_advantages,
    rloo_advantages,
    value_loss,
)


def test_discounted_returns_by_hand():
    # G_2 = 1; G_1 = 0 + 0.9 * 1 = 0.9; G_0 = 0.5 + 0.9 * 0.9 = 1.31
    assert np.allclose(discounted_returns([0.5, 0.0, 1.0], 0.9), [1.31, 0.9, 1.0])
    assert discounted_returns([], 0.9).size == 0


def test_kl_penalty_is_the_log_ratio():
    assert np.allclose(kl_penalty([-1.0, -0.5], [-2.0, -0.5]), [1.0, 0.0])


def test_normalise_zero_mean_unit_std_and_constant_input():
    out = normalise(np.array([1.0, 2.0, 3.0]))
    assert np.isclose(out.mean(), 0) and np.isclose(out.std(), 1, atol=1e-6)
    assert np.all(normalise(np.array([4.0, 4.0])) == 0)


def test_reinforce_pp_by_hand():
    # One episode, two steps, gamma 0.5, KL coefficient 0.1.
    # shaped rewards: r0 = 0 - 0.1 * (-1 - -2) = -0.1; r1 = 1 - 0.1 * 0 = 1
    # returns: G1 = 1, G0 = -0.1 + 0.5 * 1 = 0.4; the second episode: one step, reward 0 -> G = 0
    # batch of returns [0.4, 1.0, 0.0]: mean 0.4667, std 0.4110
    adv = reinforce_pp_advantages(
        [[0.0, 1.0], [0.0]], [[-1.0, -0.5], [-0.3]], [[-2.0, -0.5], [-0.3]], gamma=0.5, kl_coef=0.1
    )
    returns = np.array([0.4, 1.0, 0.0])
    expected = (returns - returns.mean()) / returns.std()
    assert np.allclose(np.concatenate(adv), expected, atol=1e-6)
    assert [len(a) for a in adv] == [2, 1]


def test_reinforce_pp_with_the_kl_apart_by_hand():
    # The batch above: reward returns [0.5, 1.0, 0.0] (G0 = 0 + 0.5 * 1), normalised; the KL's own
    # returns [-0.1 + 0.5 * 0, 0, 0] = [-0.1, 0, 0] added as they are.
    adv = reinforce_pp_kl_apart_advantages(
        [[0.0, 1.0], [0.0]], [[-1.0, -0.5], [-0.3]], [[-2.0, -0.5], [-0.3]], gamma=0.5, kl_coef=0.1
    )
    returns = np.array([0.5, 1.0, 0.0])
    expected = (returns - returns.mean()) / returns.std() + np.array([-0.1, 0.0, 0.0])
    assert np.allclose(np.concatenate(adv), expected, atol=1e-6)
    assert [len(a) for a in adv] == [2, 1]


def test_a_batch_without_a_success_steps_by_the_kl_penalty_not_by_a_unit_step():
    """A sparse task's usual batch: every episode fails, the policy has moved from the reference.
    REINFORCE++ normalises the KL term alone to unit size; with the KL apart it stays at its size;
    with no KL (the first iteration) both take no step."""
    rng = np.random.default_rng(0)
    rewards = [np.zeros(n) for n in (3, 5, 2, 4)]
    logp_ref = [rng.normal(-1.0, 0.3, len(r)) for r in rewards]
    logp_old = [lr + rng.normal(0.0, 0.05, len(lr)) for lr in logp_ref]
    published = np.concatenate(reinforce_pp_advantages(rewards, logp_old, logp_ref, gamma=0.9, kl_coef=0.01))
    apart = np.concatenate(reinforce_pp_kl_apart_advantages(rewards, logp_old, logp_ref, gamma=0.9, kl_coef=0.01))
    assert published.std() == pytest.approx(1.0, abs=1e-3)  # the penalty blown up to a unit step
    assert np.abs(apart).max() < 0.01
    kl_only = np.concatenate(
        [discounted_returns(-0.01 * kl_penalty(o, r), 0.9) for o, r in zip(logp_old, logp_ref, strict=True)]
    )
    assert np.allclose(apart, kl_only)
    at_reference = reinforce_pp_kl_apart_advantages(rewards, logp_ref, logp_ref, gamma=0.9, kl_coef=0.01)
    assert all(np.all(a == 0) for a in at_reference)
    # with rewards that differ and no KL, the two are the same estimator
    rewards[1][-1] = 1.0
    same = reinforce_pp_kl_apart_advantages(rewards, logp_ref, logp_ref, gamma=0.9, kl_coef=0.01)
    ref = reinforce_pp_advantages(rewards, logp_ref, logp_ref, gamma=0.9, kl_coef=0.01)
    assert all(np.allclose(a, b) for a, b in zip(same, ref, strict=True))
    with pytest.raises(ValueError):
        reinforce_pp_kl_apart_advantages(rewards, logp_old[:2], logp_ref[:2])


def test_multi_turn_token_returns_by_hand():
    # Two turns of 2 and 1 tokens, no KL. Turn rewards 1 (turn 0) and 2 (turn 1).
    # turn 1, last token: 2 -> G = 2.   turn 0, last token: 1 + 0.9 * 2 = 2.8; first token: 0 + 1.0 * 2.8
    out = multi_turn_token_returns([1.0, 2.0], [[0.0, 0.0], [0.0]], gamma_turn=0.9, gamma_token=1.0, kl_coef=0.0)
    assert np.allclose(out[0], [2.8, 2.8]) and np.allclose(out[1], [2.0])
    # With one token per turn it is the discounted return of the KL-shaped rewards.
    one = multi_turn_token_returns([0.0, 1.0], [[1.0], [0.0]], gamma_turn=0.5, kl_coef=0.1)
    assert np.allclose(np.concatenate(one), discounted_returns([-0.1, 1.0], 0.5))
    with pytest.raises(ValueError):
        multi_turn_token_returns([1.0], [[0.0], [0.0]])


def test_grpo_normalises_over_every_step_of_the_group():
    # ADMIRE Eq. 13: R = {1, 0, 0, 1} -> mean 0.5, std 0.5 -> advantages +-1
    adv = grpo_step_advantages([[1.0, 0.0], [0.0, 1.0]])
    assert np.allclose(adv[0], [1.0, -1.0]) and np.allclose(adv[1], [-1.0, 1.0])
    assert all(np.all(a == 0) for a in grpo_step_advantages([[0.5], [0.5, 0.5]]))


def test_rloo_leave_one_out_by_hand():
    # returns 1, 0, 0: baselines 0, 0.5, 0.5
    assert np.allclose(rloo_advantages([1.0, 0.0, 0.0]), [1.0, -0.5, -0.5])
    assert np.allclose(rloo_advantages([3.0]), [0.0])


def test_gae_by_hand():
    # gamma 0.5, lambda 0.5, values [0.2, 0.4], rewards [0, 1], terminal after step 1.
    # delta1 = 1 + 0 - 0.4 = 0.6; delta0 = 0 + 0.5 * 0.4 - 0.2 = 0.0
    # A1 = 0.6; A0 = 0 + 0.25 * 0.6 = 0.15; targets = A + V = [0.35, 1.0]
    adv, targets = gae([0.0, 1.0], [0.2, 0.4], gamma=0.5, lam=0.5)
    assert np.allclose(adv, [0.15, 0.6]) and np.allclose(targets, [0.35, 1.0])
    # lambda 1 and gamma 1: advantages are returns minus values
    adv, _ = gae([1.0, 2.0], [0.5, 0.5], gamma=1.0, lam=1.0)
    assert np.allclose(adv, [2.5, 1.5])


def test_ppo_clip_by_hand():
    logp_old = torch.log(torch.tensor([0.5, 0.5]))
    # ratio 1.5 with A = +1 is clipped to 1.2; ratio 0.5 with A = -1 is clipped to 0.8 * -1
    logp_new = torch.log(torch.tensor([0.75, 0.25]))
    loss = ppo_clip_loss(logp_new, logp_old, torch.tensor([1.0, -1.0]), clip=0.2)
    assert math.isclose(float(loss), -(1.2 + -0.8) / 2, rel_tol=1e-6)
    assert clip_fraction(logp_new, logp_old, 0.2) == 1.0
    # Inside the trust region the surrogate is the plain ratio times the advantage, with a gradient.
    new = torch.log(torch.tensor([0.55], requires_grad=False)).requires_grad_()
    loss = ppo_clip_loss(new, torch.log(torch.tensor([0.5])), torch.tensor([2.0]))
    loss.backward()
    assert math.isclose(float(loss.detach()), -1.1 * 2.0, rel_tol=1e-5)
    assert new.grad is not None and float(new.grad.detach()) < 0


def test_value_loss_by_hand():
    assert math.isclose(float(value_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 3.0]))), 0.25)


def test_every_reward_source_trains_on_the_same_instances_within_an_rl_seed():
    """Common random numbers (Table-1 issue): the instances of an iteration depend on the RL seed,
    the SFT start and the iteration, never on the reward source or the estimator."""
    from training.policy.store import HELD_OUT_SEED_BASE, TRAIN_SEED_BASE
    from training.rl.runs import RLSettings, sampling_stream, training_seeds

    runs = [
        RLSettings("outcome"),
        RLSettings("orm"),
        RLSettings("progrm_env"),
        RLSettings("admire", estimator="grpo"),
        RLSettings("prm", estimator="ppo"),
    ]
    per_run = [[training_seeds(r, "sft-a", i) for i in range(3)] for r in runs]
    assert all(seeds == per_run[0] for seeds in per_run)
    assert per_run[0][0] != per_run[0][1]  # another iteration, other instances
    assert training_seeds(RLSettings("outcome", rl_seed=1), "sft-a", 0) != per_run[0][0]  # another RL seed
    assert training_seeds(RLSettings("outcome"), "sft-b", 0) != per_run[0][0]  # another SFT start
    assert all(TRAIN_SEED_BASE <= s < HELD_OUT_SEED_BASE for seeds in per_run[0] for s in seeds)
    assert RLSettings("outcome").run_key("sft-a") != RLSettings("orm").run_key("sft-a")  # runs stay apart
    # ... and act in the same sampling stream (issue 41 item 4), which the seed and iteration change
    streams = [[sampling_stream(r, "sft-a", i) for i in range(3)] for r in runs]
    assert all(s == streams[0] for s in streams) and len(set(streams[0])) == 3
    assert sampling_stream(RLSettings("outcome", rl_seed=1), "sft-a", 0) != streams[0][0]


def test_per_run_sampling_is_a_run_of_its_own_keyed_by_the_run():
    """The control arm of issue 41 item 4's measurement: with ``common_sampling`` off the stream is
    empty (the acting policy keys its draws by its own id, which names the run) and the run key
    changes; with it on (the default) the key is the one runs had before the switch existed."""
    from training.rl.runs import RLSettings, sampling_stream

    shared, own = RLSettings("outcome"), RLSettings("outcome", common_sampling=False)
    assert sampling_stream(own, "sft-a", 0) == ""
    assert sampling_stream(shared, "sft-a", 0) != ""
    assert own.run_key("sft-a") != shared.run_key("sft-a")
    assert RLSettings("orm", common_sampling=False).run_key("sft-a") != own.run_key("sft-a")


def test_the_sparse_block_is_chosen_by_its_own_rule_and_may_be_empty():
    """Table-1 issue: SFT success in (0, 15%] on selection seeds and a median demonstration of >= 5 steps."""
    from training.policy.task_blocks import choose_sparse_tasks, choose_tasks

    rates = {"long-rare": 0.1, "long-never": 0.0, "short-rare": 0.1, "long-often": 0.5, "long-edge": 0.15}
    steps = {"long-rare": 13.0, "long-never": 9.0, "short-rare": 2.0, "long-often": 6.0, "long-edge": 5.0}
    assert choose_sparse_tasks(rates, steps) == ["long-rare", "long-edge"]  # hardest first
    assert choose_sparse_tasks(rates, steps, max_tasks=1) == ["long-rare"]
    assert choose_sparse_tasks(rates, {}) == []  # no demonstration: no evidence of a long solution
    assert choose_sparse_tasks({"a": 0.0, "b": 1.0}, {"a": 9.0, "b": 9.0}) == []
    assert choose_tasks(rates, 0.1, 0.9, 4) == ["long-often", "long-edge"]  # the dense block, as before


def test_the_sparse_block_leaves_out_tasks_a_fixed_answer_solves_too_often():
    """A task one fixed answer solves 5% of the time or more (envs.fixed_answer) is left out, by either
    rule; a task never measured stays; the threshold can be switched off."""
    from training.policy.task_blocks import MAX_CONSTANT_SHARE, farmable_tasks, sparse_block

    rates = {"spinner": 0.04, "boxes": 0.1, "unmeasured": 0.12, "edge": 0.02}
    steps = dict.fromkeys(rates, 6.0)
    shares = {"spinner": 0.1, "boxes": 0.0, "edge": MAX_CONSTANT_SHARE}
    assert farmable_tasks(shares) == {"edge": MAX_CONSTANT_SHARE, "spinner": 0.1}
    assert sparse_block(rates, steps, constant_shares=shares) == (["boxes", "unmeasured"], "strict")
    assert sparse_block(rates, steps, constant_shares=shares, max_constant_share=1.01)[0] == [
        "edge",
        "spinner",
        "boxes",
        "unmeasured",
    ]
    never = {"spinner": 0.0, "boxes": 0.0}  # the fallback rule (success 0) leaves it out too
    assert sparse_block(never, steps, constant_shares=shares) == (["boxes"], "unsolved")


def test_an_empty_sparse_block_falls_back_to_the_long_tasks_sft_never_solved():
    from training.policy.task_blocks import SPARSE_RULE_STRICT, SPARSE_RULE_UNSOLVED, sparse_block, sparse_block_rule

    steps = {"long-never": 9.0, "long-never-2": 6.0, "short-never": 2.0, "long-often": 6.0, "long-rare": 7.0}
    rates = {"long-never": 0.0, "long-never-2": 0.0, "short-never": 0.0, "long-often": 0.5}
    assert sparse_block(rates, steps) == (["long-never", "long-never-2"], SPARSE_RULE_UNSOLVED)
    assert sparse_block(rates, steps, fallback=False) == ([], SPARSE_RULE_STRICT)
    # a task in (0, 15%] keeps the rule: the unsolved ones do not join it
    assert sparse_block(rates | {"long-rare": 0.05}, steps) == (["long-rare"], SPARSE_RULE_STRICT)
    assert sparse_block({"short-never": 0.0}, steps) == ([], SPARSE_RULE_UNSOLVED)  # short tasks never qualify
    import json

    recorded = {"task_blocks": {"dense": [], "sparse": ["long-never"], "sparse_rule": SPARSE_RULE_UNSOLVED}}
    assert sparse_block_rule({"parameters": json.dumps(recorded)}) == SPARSE_RULE_UNSOLVED
    assert sparse_block_rule({"parameters": "{}"}) == SPARSE_RULE_STRICT  # policies before the fallback


def test_the_sparse_rule_reads_sampled_success_when_there_is_some():
    """What RL's first iteration samples decides whether a task is sparse for RL: a long task SFT
    solves greedily 9% of the time may sample at 57% (guess-number, stop 63), and one greedy never
    solves may sample at 5%. With sampled rates no task that samples above 15% joins the block."""
    from training.policy.task_blocks import (
        SPARSE_RULE_SAMPLED,
        SPARSE_RULE_SAMPLED_UNSOLVED,
        SPARSE_RULE_STRICT,
        sparse_block,
    )

    steps = {"guess": 20.0, "spinner": 16.0, "flight": 12.0, "short": 2.0}
    greedy = {"guess": 0.09, "spinner": 0.0, "flight": 0.0, "short": 0.0}
    sampled = {"guess": 0.57, "spinner": 0.05, "flight": 0.12, "short": 0.03}
    # hardest first by the sampled rate; a short task never qualifies; greedy 9% is not sparse for RL
    assert sparse_block(greedy, steps, sampled_rates=sampled) == (["spinner", "flight"], SPARSE_RULE_SAMPLED)
    assert sparse_block(greedy, steps, sampled_rates=sampled, max_tasks=1) == (["spinner"], SPARSE_RULE_SAMPLED)
    # nothing samples in (0, 15%]: the long tasks never solved even sampling, not greedy's 9%
    flat = {"guess": 0.57, "spinner": 0.0, "flight": 0.4}
    assert sparse_block(greedy, steps) == (["guess"], SPARSE_RULE_STRICT)  # greedy rates alone
    assert sparse_block(greedy, steps, sampled_rates=flat) == (["spinner"], SPARSE_RULE_SAMPLED_UNSOLVED)
    assert sparse_block(greedy, steps, sampled_rates=flat, fallback=False) == ([], SPARSE_RULE_SAMPLED)
    assert sparse_block(greedy, steps, sampled_rates={"guess": 0.5}) == ([], SPARSE_RULE_SAMPLED_UNSOLVED)


def test_a_run_trains_on_its_block_of_the_sft_policys_pre_registered_tasks():
    import json

    from training.policy.task_blocks import task_blocks
    from training.rl.runs import RLSettings

    blocks = {"dense": ["click-tab-2"], "sparse": ["book-flight-nodelay"]}
    sft = {"tasks": ["click-tab-2"], "parameters": json.dumps({"task_blocks": blocks})}
    assert task_blocks(sft) == blocks
    # a policy made before the blocks: its chosen tasks are the dense block, and there is no sparse one
    assert task_blocks({"tasks": ["click-tab-2"], "parameters": "{}"}) == {"dense": ["click-tab-2"], "sparse": []}
    assert RLSettings("outcome", block="sparse").run_key("sft-a") != RLSettings("outcome").run_key("sft-a")
    with pytest.raises(ValueError, match="unknown task block 'long'"):
        RLSettings("outcome", block="long")


def test_the_orm_rule_is_the_blocks_and_only_a_changed_rule_changes_a_run_key():
    """The rare-positive rule, declared before the runs: the dense block keeps ProgRM's threshold,
    the sparse block pays P(success); only the ORM has a rule, and keys of runs whose behaviour did
    not change stay as they were."""
    from training.policy.task_blocks import TASK_BLOCKS
    from training.rl.rewards.orm import ORM_RULE_BY_BLOCK
    from training.rl.runs import RLSettings

    assert set(ORM_RULE_BY_BLOCK) == set(TASK_BLOCKS)
    assert RLSettings("orm").orm_rule == "threshold"
    assert RLSettings("orm", block="sparse").orm_rule == "probability"
    assert RLSettings("orm", block="sparse", orm_rule="threshold").orm_rule == "threshold"  # an explicit choice wins
    assert RLSettings("outcome", block="sparse").orm_rule is None  # no other source has one
    # the dense ORM's key is the one it had before the rule existed; the sparse ORM's is new
    assert RLSettings("orm").run_key("sft-a") == RLSettings("orm", orm_rule="threshold").run_key("sft-a")
    sparse = RLSettings("orm", block="sparse")
    assert sparse.run_key("sft-a") != RLSettings("orm", block="sparse", orm_rule="threshold").run_key("sft-a")
    # (code version rl-6's key; rl-5 gave ...bd0d62: only a new code version changes it)
    assert RLSettings("outcome", block="sparse").run_key("sft-232af32921") == "outcome-reinforce_pp-s0-583bb4"
    with pytest.raises(ValueError, match="unknown ORM rule 'soft'"):
        RLSettings("orm", orm_rule="soft")


def test_a_pinned_reward_model_is_a_run_of_its_own_and_an_unpinned_run_keeps_its_model(tmp_path):
    """Pinning a reward model (a flywheel round's) gives a run key of its own; without a pin the key
    is the one runs had before pins existed, and a started run is bound to the model its checkpoint
    or its published iterations name, so retraining the kind cannot change its rewards mid-run."""
    import json

    from training.rl.runs import RLSettings, run_reward_model
    from warehouse.catalog import LineageInput, Materialization, Warehouse

    # the key of the first sparse runs (2026-11-26, ...bd0d62 under code version rl-5), made before pins:
    # pins leave it unchanged (rl-6's own sampling stream is what changed it)
    assert RLSettings("outcome", block="sparse").run_key("sft-232af32921") == "outcome-reinforce_pp-s0-583bb4"
    today, pinned = RLSettings("orm"), RLSettings("orm", reward_model_id="orm-fw3")
    assert pinned.run_key("sft-a") != today.run_key("sft-a")
    assert pinned.run_key("sft-a") != RLSettings("orm", reward_model_id="orm-fw4").run_key("sft-a")
    with pytest.raises(ValueError, match="outcome reward uses no reward model"):
        RLSettings("outcome", reward_model_id="orm-fw3")

    warehouse = Warehouse(tmp_path / "home")
    checkpoint = tmp_path / "checkpoint"

    def publish(model_id: str) -> None:
        m = Materialization(
            asset="rl_run",
            parameters={"run_key": "orm-run"},
            inputs=[LineageInput(kind="asset", input_asset="reward_model", version=model_id)],
        )
        warehouse.publish(m, [])

    publish("orm-first")
    publish("orm-old")
    assert run_reward_model(warehouse, "orm-run") == "orm-old"  # the lineage's newest iteration
    assert run_reward_model(warehouse, "other-run") is None
    # no checkpoint: a new run, or one started over, takes the newest model whatever was published
    assert run_reward_model(warehouse, "orm-run", checkpoint) is None
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text(json.dumps({"iteration": 3}))  # written before checkpoints kept it
    assert run_reward_model(warehouse, "orm-run", checkpoint) == "orm-old"
    (checkpoint / "state.json").write_text(json.dumps({"iteration": 3, "reward_model_id": "orm-recorded"}))
    assert run_reward_model(warehouse, "orm-run", checkpoint) == "orm-recorded"  # the checkpoint's record first


def test_a_flywheel_round_names_only_the_models_it_trained(tmp_path):
    """A round lists every kind its report judged, retrained or carried over: a carried-over model
    is neither tagged as that round's nor pinned by ``--flywheel-round``, and a model is named by
    the first round that trained it."""
    import pyarrow as pa

    from training.rl.evaluation import flywheel_round_models, reward_model_tags
    from warehouse.catalog import Materialization, Warehouse
    from warehouse.tables_training import FLYWHEEL_ROUNDS

    warehouse = Warehouse(tmp_path / "home")
    assert reward_model_tags(warehouse) == {} and flywheel_round_models(warehouse, 1) == {}
    rounds = {
        0: {"orm": "orm-a", "prm": "prm-a"},
        1: {"orm": "orm-a", "prm": "prm-b"},  # only the PRM retrained
        2: {"orm": "orm-c", "prm": "prm-b"},  # only the ORM retrained
    }
    for round_, models in rounds.items():
        rows = [{"round": round_, "kind": kind, "model_id": model} for kind, model in models.items()]
        m = Materialization(asset="flywheel_round")
        table = pa.Table.from_pylist(rows, schema=FLYWHEEL_ROUNDS)
        warehouse.publish(m, [warehouse.stage_table("flywheel_rounds", f"round-{round_:02d}", table, m)])
    assert reward_model_tags(warehouse) == {"prm-b": "flywheel r1", "orm-c": "flywheel r2"}
    assert flywheel_round_models(warehouse, 1) == {"prm": "prm-b"}
    assert flywheel_round_models(warehouse, 2) == {"orm": "orm-c"}


def test_the_block_is_part_of_the_rl_partition():
    """Issue 41 item 7: a sparse and a dense run of one source and seed are two partitions (s0 and
    sparse-s0), each run's settings take the block from its partition, and a config that names
    another block is refused in one line."""
    from training.rl.runs import RL_SEED_KEYS, RL_SEEDS, rl_settings_for, seed_key, split_seed_key

    assert RL_SEED_KEYS[: len(RL_SEEDS)] == RL_SEEDS  # the dense keys runs always had
    assert [split_seed_key(k) for k in ("s0", "sparse-s3")] == [("dense", 0), ("sparse", 3)]
    assert all(seed_key(*split_seed_key(k)) == k for k in RL_SEED_KEYS)
    dense, sparse = rl_settings_for("orm", "s1"), rl_settings_for("orm", "sparse-s1", iterations=3)
    assert (dense.block, dense.rl_seed, sparse.block, sparse.rl_seed) == ("dense", 1, "sparse", 1)
    assert dense.run_key("sft-a") != sparse.run_key("sft-a") and sparse.iterations == 3
    assert rl_settings_for("orm", "sparse-s1", block="sparse", iterations=3) == sparse
    assert rl_settings_for("orm", "s1", block=None) == dense
    with pytest.raises(ValueError, match="partition seed 's1' is the dense block, the config asks for 'sparse'"):
        rl_settings_for("orm", "s1", block="sparse")
    for bad in ("1", "x-s1", "sparse-1", "sparse-"):
        with pytest.raises(ValueError, match="an RL seed key is s<number>"):
            split_seed_key(bad)
