"""The LLM policy: ProgRM Table 11's prompt and its parser, a local causal LM acting in live
MiniWoB++ and trained by multi-turn REINFORCE++ and SFT (plain PyTorch and DeepSpeed ZeRO-3 on
CPU), and an OpenAI-compatible endpoint (``transformers serve``) behind the same Policy interface.

Everything runs on the tiny random Qwen2 of the ``tiny_causal_lm_path`` fixture, with a byte-level
BPE tokenizer trained on demonstration prompts (so prompts round-trip; "Hardening" item 17).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.protocol import EpisodeContext, StepResult, run_episode
from envs.task_catalog import load_catalog
from tests.training.llm.llm_fixtures import MINIWOB_ACTIONS, login_screen
from training.llm import prompts
from training.llm.chat_client import ChatClient, ChatEndpoint
from training.llm.policy import (
    ENDPOINT_ERROR,
    EndpointPolicy,
    HFPolicy,
    TurnRecord,
    encode_prompt,
    response_logprobs,
)
from training.llm.prompts import (
    FAILURE_REASONS,
    HistoryEntry,
    ParsedAction,
    ParseFailure,
    action_to_call,
    build_messages,
    format_response,
    numbered_elements,
    parse_response,
)
from training.llm.sft import sft_examples, sft_loss, sft_step, trajectory_sft_pairs
from training.rl import estimators
from training.rl.llm_learner import (
    DS_ZERO3,
    DS_ZERO3_CPU,
    LLMLearner,
    LLMLearnerSettings,
    frozen_reference,
    resolve_deepspeed_config,
)
from training.rl.rewards.prm import format_rewards
from warehouse.model import Action, ActionType

REPO = Path(__file__).resolve().parents[3]
LOGIN = load_catalog("miniwob")["login-user"]
INSTRUCTION = 'Enter the username "ada" and the password "xy" into the text fields and press login.'

# The login screen's numbered elements: 0 label Username, 1 textbox, 2 label Password, 3 password, 4 button.
SCREEN = login_screen()
ELEMENTS = numbered_elements(SCREEN)


def _context(episode_id: str = "ep-1", max_steps: int = 3) -> EpisodeContext:
    return EpisodeContext(
        task=LOGIN.spec,
        instruction=INSTRUCTION,
        slots={"username": "ada", "password": "xy"},
        seed=1,
        backend="miniwob",
        supported_actions=MINIWOB_ACTIONS,
        max_steps=max_steps,
        episode_id=episode_id,
    )


@pytest.fixture(scope="module")
def tiny_lm(tiny_causal_lm_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path), AutoTokenizer.from_pretrained(tiny_causal_lm_path)


# -- the tokenizer matches its model ----------------------------------------------------------


def test_the_tiny_models_tokenizer_round_trips_a_prompt(tiny_causal_lm_path):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    messages, _ = build_messages(INSTRUCTION, SCREEN, [], step_index=0, max_steps=3, supported=MINIWOB_ACTIONS)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text  # spaces, quotes, brackets, newlines all survive
    assert len(ids) < len(text) / 3  # words, not single characters (the BERT-vocabulary failure)
    odd = 'INPUT(2, "Zoë — 東京 ✓")\ttabs  and  double spaces'
    assert tokenizer.decode(tokenizer(odd, add_special_tokens=False)["input_ids"]) == odd  # byte-level: any text
    assert AutoConfig.from_pretrained(tiny_causal_lm_path).vocab_size == len(tokenizer)


# -- the prompt --------------------------------------------------------------------------------


def test_the_prompt_offers_the_environments_actions_and_numbers_the_screen():
    history = [
        HistoryEntry(Action(ActionType.CLICK, ELEMENTS[1])),
        HistoryEntry(Action(ActionType.NOTHING), format_failure="no_action_block"),
        HistoryEntry(Action(ActionType.PRESS_KEY, text="Hyper+Q"), problem="unknown modifier Hyper"),
    ]
    messages, elements = build_messages(
        INSTRUCTION, SCREEN, history, step_index=3, max_steps=10, supported=MINIWOB_ACTIONS
    )
    system, user = messages[0]["content"], messages[1]["content"]
    assert [m["role"] for m in messages] == ["system", "user"]
    for offered in ("INPUT(element_id: int, text: str)", "CLICK(element_id: int)", "SCROLL(", "PRESS_KEY(key: str)"):
        assert offered in system
    assert "DO_NOTHING()" in system and "<think>" in system and "<action>" in system and "10 steps" in system
    assert "GOBACK()" not in system and "ANSWER(" not in system and "LONG_CLICK" not in system  # MiniWoB++ lacks them
    assert "WikiHow" not in system
    assert [e.role for e in elements] == ["label", "textbox", "label", "password", "button"]  # the body is no target
    assert "[1] textbox#username [clickable, editable]" in user and '[4] button#subbtn "Login" [clickable]' in user
    assert f"Task:\n{INSTRUCTION}" in user and "step 4 of at most 10" in user
    assert "1. CLICK(textbox#username)" in user
    assert "2. DO_NOTHING()  (your answer was not a valid action: no_action_block)" in user
    assert '3. PRESS_KEY("Hyper+Q")  (failed: unknown modifier Hyper)' in user
    everything = prompts.system_prompt(5)
    assert all(f"{name}(" in everything for name in prompts.FUNCTIONS)  # Table 11's list + PRESS_KEY

    few, shown = build_messages(INSTRUCTION, SCREEN, [], step_index=0, max_steps=3, max_elements=2)
    assert len(shown) == 2 and "(3 more elements not shown)" in few[1]["content"]
    assert "(none yet)" in few[1]["content"]


# -- the parser --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "call", "expected"),
    [
        ('<think>\nType the name.\n</think>\n<action>\nINPUT(1, "ada")\n</action>', 'INPUT(1, "ada")',
         Action(ActionType.INPUT, ELEMENTS[1], text="ada")),
        ("<think>no closing tag <action> click( 4 ) ", "CLICK(4)", Action(ActionType.CLICK, ELEMENTS[4])),
        ("<action>INPUT(element_id=3, text='xy')</action>", 'INPUT(3, "xy")',
         Action(ActionType.INPUT, ELEMENTS[3], text="xy")),
        ('<action>INPUT(1, "say "hi" now")</action>', 'INPUT(1, "say \\"hi\\" now")',
         Action(ActionType.INPUT, ELEMENTS[1], text='say "hi" now')),
        ("<action>\n```\nSCROLL(down)\n```\n</action>", "SCROLL(DOWN)", Action(ActionType.SCROLL, direction="DOWN")),
        ('<action> SCROLL("UP") </action>', "SCROLL(UP)", Action(ActionType.SCROLL, direction="UP")),
        ("<action>PRESS_KEY(Enter)</action>", 'PRESS_KEY("Enter")', Action(ActionType.PRESS_KEY, text="Enter")),
        ("<action>DO_NOTHING()</action>", "DO_NOTHING()", Action(ActionType.NOTHING)),
        ("<action>NOTHING()</action>", "DO_NOTHING()", Action(ActionType.NOTHING)),
        ("<think>an <action>example</action> inside</think><action>CLICK([2])</action>", "CLICK(2)",
         Action(ActionType.CLICK, ELEMENTS[2])),
        ('<action>INPUT("1", 42)</action>', 'INPUT(1, "42")', Action(ActionType.INPUT, ELEMENTS[1], text="42")),
    ],
)  # fmt: skip
def test_well_formed_answers_become_actions_on_the_screen(answer, call, expected):
    parsed = parse_response(answer, ELEMENTS, MINIWOB_ACTIONS)
    assert isinstance(parsed, ParsedAction), parsed
    assert parsed.call == call and parsed.action == expected
    assert parsed.action.target is None or parsed.action.target.ref == expected.target.ref


def test_every_action_type_parses_when_the_environment_offers_it():
    for answer, action in [
        ("<action>GOBACK()</action>", Action(ActionType.GOBACK)),
        ('<action>ANSWER("42 apples")</action>', Action(ActionType.ANSWER, text="42 apples")),
        ("<action>LONG_CLICK(4)</action>", Action(ActionType.LONG_CLICK, ELEMENTS[4])),
        ("<action>SCROLL(LEFT)</action>", Action(ActionType.SCROLL, direction="LEFT")),
    ]:
        parsed = parse_response(answer, ELEMENTS)  # no restriction: all of Table 11 (+ PRESS_KEY)
        assert isinstance(parsed, ParsedAction) and parsed.action == action


FAILURES = [
    ("I would click the login button.", prompts.NO_ACTION_BLOCK),
    ("<think>x</think><action>   </action>", prompts.EMPTY_ACTION),
    ("<action>click the button</action>", prompts.NOT_A_CALL),
    ('<action>CLICK(4)\nINPUT(1, "ada")</action>', prompts.SEVERAL_ACTIONS),
    ("<action>DOUBLE_CLICK(4)</action>", prompts.UNKNOWN_FUNCTION),
    ("<action>GOBACK()</action>", prompts.UNSUPPORTED_FUNCTION),
    ("<action>CLICK()</action>", prompts.BAD_ARGUMENTS),
    ("<action>CLICK(4, 5)</action>", prompts.BAD_ARGUMENTS),
    ("<action>CLICK(login)</action>", prompts.BAD_ARGUMENTS),
    ("<action>SCROLL(SIDEWAYS)</action>", prompts.BAD_ARGUMENTS),
    ("<action>INPUT(1, text=)</action>", prompts.BAD_ARGUMENTS),
    ("<action>INPUT(1, name='ada')</action>", prompts.BAD_ARGUMENTS),
    ('<action>PRESS_KEY("  ")</action>', prompts.BAD_ARGUMENTS),
    ("<action>CLICK(5)</action>", prompts.ELEMENT_OUT_OF_RANGE),
    ("<action>CLICK(-1)</action>", prompts.ELEMENT_OUT_OF_RANGE),
    ('<action>INPUT(4, "ada")</action>', prompts.NOT_EDITABLE),
]


@pytest.mark.parametrize(("answer", "reason"), FAILURES)
def test_malformed_answers_are_failures_with_their_reason(answer, reason):
    parsed = parse_response(answer, ELEMENTS, MINIWOB_ACTIONS)
    assert isinstance(parsed, ParseFailure) and not parsed.ok
    assert parsed.reason == reason, parsed.describe()


def test_every_failure_reason_is_exercised():
    assert {reason for _, reason in FAILURES} == set(FAILURE_REASONS)


def test_actions_written_as_calls_parse_back_to_themselves():
    for action in [
        Action(ActionType.CLICK, ELEMENTS[4]),
        Action(ActionType.INPUT, ELEMENTS[1], text='a "quoted" name'),
        Action(ActionType.SCROLL, direction="DOWN"),
        Action(ActionType.PRESS_KEY, text="Enter"),
        Action(ActionType.NOTHING),
        Action(ActionType.ANSWER, text="done"),
        Action(ActionType.GOBACK),
    ]:
        call = action_to_call(action, ELEMENTS)
        assert call is not None
        parsed = parse_response(format_response(call, "thinking"), ELEMENTS)
        assert isinstance(parsed, ParsedAction) and parsed.action == action and parsed.thought == "thinking"
    body = SCREEN.elements[0]
    assert action_to_call(Action(ActionType.CLICK, body), ELEMENTS) is None  # not a numbered element


# -- the local model as a policy ----------------------------------------------------------------


def _policy(tiny_lm, **kwargs) -> HFPolicy:
    model, tokenizer = tiny_lm
    return HFPolicy(model, tokenizer, **({"record": True, "max_new_tokens": 24} | kwargs))


def test_hf_policy_records_turns_whose_logprobs_the_learner_recomputes(tiny_lm):
    """The free-text path (constrained=False): ``model.generate``, then a scoring forward pass."""
    policy = _policy(tiny_lm, constrained=False)
    actor = policy.start(_context("ep-a"))
    actions = [actor.act(SCREEN) for _ in range(3)]
    turns = policy.turns["ep-a"]
    assert len(turns) == 3 and policy.counters.steps == 3
    for turn, action in zip(turns, actions, strict=True):
        assert 1 <= turn.n_tokens <= 24 and turn.logp.shape == (turn.n_tokens,) and np.all(turn.logp <= 0)
        assert turn.prompt_ids[-3:].tolist() == policy.tokenizer("<|im_start|>assistant\n")["input_ids"][-3:]
        if not turn.format_ok:
            assert action.type is ActionType.NOTHING and str(action.detail).startswith("format: ")
            assert turn.failure and turn.action_text == ""
    # a batched, padded forward pass (the learner's) gives the recorded values
    again = response_logprobs(
        policy.model, [t.prompt_ids for t in turns], [t.response_ids for t in turns], pad_id=0, micro_batch=3
    )
    for turn, logp in zip(turns, again, strict=True):
        np.testing.assert_allclose(turn.logp, logp.detach().numpy(), atol=1e-4)
    # the same episode id starts over on a retry (the last attempt wins), and sampling replays
    retry = policy.start(_context("ep-a"))
    retry.act(SCREEN)
    assert len(policy.turns["ep-a"]) == 1
    assert policy.turns["ep-a"][0].response_ids.tolist() == turns[0].response_ids.tolist()


def test_hf_policy_greedy_and_two_threads(tiny_lm):
    policy = _policy(tiny_lm, greedy=True, max_new_tokens=12)
    results: dict[str, list[TurnRecord]] = {}

    def episode(key: str) -> None:
        actor = policy.start(_context(key))
        for _ in range(2):
            actor.act(SCREEN)
            actor.observe(Action(ActionType.NOTHING), StepResult(screen=SCREEN))
        results[key] = policy.turns[key]

    threads = [threading.Thread(target=episode, args=(f"ep-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(results) == {"ep-0", "ep-1"} and policy.counters.steps == 4
    # greedy decoding of the same prompt gives the same answer in both threads
    assert results["ep-0"][0].response_ids.tolist() == results["ep-1"][0].response_ids.tolist()


@pytest.mark.e2e
def test_hf_policy_acts_in_live_miniwob(tiny_causal_lm_path):
    """One short episode of login-user in Chromium: the random model's answers mostly fail to
    parse, so the steps are NOTHING with format_ok False, and the format reward is -1 there."""
    from envs.miniwob.live import MiniWoBEnv

    policy = HFPolicy.from_pretrained(tiny_causal_lm_path, record=True, max_new_tokens=32, constrained=False)
    env = MiniWoBEnv()
    try:
        started = time.perf_counter()
        record = run_episode(env, policy, LOGIN.spec, 5, episode_id="llm-live", max_steps=3)
        elapsed = time.perf_counter() - started
    finally:
        env.close()
    turns = policy.turns["llm-live"]
    assert record.n_steps == len(turns) >= 1 and record.steps[-1].done
    assert record.policy_id == "llm" and record.instruction.startswith("Enter the username")
    failed = [t for t in turns if not t.format_ok]
    assert len(failed) >= (len(turns) + 1) // 2  # random weights: mostly not an action
    for step, turn in zip(record.steps, turns, strict=True):
        if not turn.format_ok:
            assert step.action.type is ActionType.NOTHING and turn.failure
    rollout = policy.rollout(record)
    assert list(format_rewards(rollout)) == [0.0 if t.format_ok else -1.0 for t in turns]
    print(f"\nlive episode: {record.n_steps} steps in {elapsed:.1f} s, {policy.counters}")


# -- learning ------------------------------------------------------------------------------------


def _turn(prompt: list[int], response: list[int], logp: list[float]) -> TurnRecord:
    return TurnRecord(
        prompt_ids=np.asarray(prompt, dtype=np.int64),
        response_ids=np.asarray(response, dtype=np.int64),
        logp=np.asarray(logp, dtype=np.float32),
        format_ok=True,
        action_text="CLICK(4)",
        response_text="",
    )


def test_token_returns_follow_the_multi_turn_recursion(tiny_lm):
    """Returns by hand for a 2-turn episode (2 and 3 response tokens) with gamma_token < 1:
    G_{t,last} = r_t - beta KL + gamma_turn G_{t+1,0}; G_{t,j} = -beta KL + gamma_token G_{t,j+1}."""
    model, tokenizer = tiny_lm
    settings = LLMLearnerSettings(gamma_turn=0.9, gamma_token=0.95, kl_coef=0.5, learning_rate=1e-3)
    learner = LLMLearner(model, frozen_reference(model), settings)
    prompt = tokenizer("Task: log in", add_special_tokens=False)["input_ids"]
    turns = [_turn(prompt, [5, 6], [-1.0, -2.0]), _turn(prompt + [7], [8, 9, 10], [-0.5, -3.0, -1.5])]
    rewards = np.array([0.25, 1.0])
    batch = learner.prepare([(turns, rewards)])
    ref = [r for r in batch.logp_ref]
    kl = [np.asarray(t.logp, dtype=np.float64) - r for t, r in zip(turns, ref, strict=True)]
    beta, ga, gw = 0.5, 0.9, 0.95
    g12 = 1.0 - beta * kl[1][2]
    g11 = -beta * kl[1][1] + gw * g12
    g10 = -beta * kl[1][0] + gw * g11
    g01 = 0.25 - beta * kl[0][1] + ga * g10
    g00 = -beta * kl[0][0] + gw * g01
    np.testing.assert_allclose(batch.returns[0][0], [g00, g01], rtol=1e-9)
    np.testing.assert_allclose(batch.returns[0][1], [g10, g11, g12], rtol=1e-9)
    expected = estimators.multi_turn_token_returns(rewards, kl, gamma_turn=ga, gamma_token=gw, kl_coef=beta)
    for got, want in zip(batch.returns[0], expected, strict=True):
        np.testing.assert_allclose(got, want)
    flat = np.array([g00, g01, g10, g11, g12])
    np.testing.assert_allclose(np.concatenate(batch.advantages), estimators.normalise(flat))
    # the reference is the acting model here: the reference log-probs are its own
    own = response_logprobs(model, [t.prompt_ids for t in turns], [t.response_ids for t in turns])
    for r, o in zip(ref, own, strict=True):
        np.testing.assert_allclose(r, o.detach().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="2 turns but 3 rewards"):
        learner.prepare([(turns, np.zeros(3))])


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "constrained"])
def test_reinforce_pp_updates_move_the_policy_towards_rewarded_answers(tiny_causal_lm_path, constrained):
    """Free text and constrained answers alike: the ratio starts at 1, the KL at 0, and updates
    move the (masked, for constrained turns) log-probs towards rewarded answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=16, constrained=constrained)
    episodes = []
    for k in range(4):
        actor = policy.start(_context(f"ep-{k}"))
        for _ in range(2):
            actor.act(SCREEN)
        episodes.append((policy.turns[f"ep-{k}"], np.array([0.0, 1.0 if k % 2 == 0 else -1.0])))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    settings = LLMLearnerSettings(learning_rate=2e-3, batch_turns=4, micro_batch=2, epochs=2, total_steps=20)
    learner = LLMLearner(model, frozen_reference(model), settings, pad_id=tokenizer.pad_token_id, lock=policy.lock)

    def mean_logp(rewarded: bool) -> float:
        chosen = [t for (turns, r) in episodes for t in turns if (r[-1] > 0) == rewarded]
        with torch.inference_mode():
            lp = response_logprobs(
                model, [t.prompt_ids for t in chosen], [t.response_ids for t in chosen], masks=[t.masks for t in chosen]
            )
        return float(torch.cat(lp).mean())

    good, bad = mean_logp(True), mean_logp(False)
    stats = [learner.update(episodes) for _ in range(3)]
    assert stats[0].optimizer_steps == 4 and stats[-1].optimizer_steps == 12  # 8 turns / 4 per step x 2 epochs
    # (the ratio averages over 4 optimiser steps; at the acting weights it is 1: test_constrained_decoding)
    assert abs(stats[0].kl_to_reference) < 1e-4
    assert stats[0].ratio_mean == pytest.approx(1.0, abs=0.05) or constrained
    assert all(t.format_ok for ts, _ in episodes for t in ts) or not constrained
    assert stats[-1].kl_to_reference != 0.0 or stats[-1].clip_fraction > 0.0  # the policy left the reference
    assert 0 < stats[0].learning_rate <= 2e-3 and stats[0].tokens == sum(t.n_tokens for ts, _ in episodes for t in ts)
    changed = max(float((p.detach() - before[name]).abs().max()) for name, p in model.named_parameters())
    assert changed > 1e-4
    assert mean_logp(True) > good and mean_logp(False) < bad  # towards rewarded answers, away from punished
    assert not model.training  # acting mode restored


def test_sft_lowers_the_loss_of_a_demonstrated_answer(tiny_causal_lm_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    screens = [login_screen(), login_screen(username="ada", focused="username"), login_screen("ada", "xy")]
    elements = numbered_elements(screens[0])
    steps = [
        (screens[0], Action(ActionType.INPUT, elements[1], text="ada")),
        (screens[1], Action(ActionType.INPUT, elements[3], text="xy")),
        (screens[2], Action(ActionType.CLICK, elements[4])),
    ]
    pairs = trajectory_sft_pairs(INSTRUCTION, steps, max_steps=5, supported=MINIWOB_ACTIONS)
    assert [answer.split("<action>\n")[1].split("\n")[0] for _, answer in pairs] == [
        'INPUT(1, "ada")',
        'INPUT(3, "xy")',
        "CLICK(4)",
    ]
    assert '1. INPUT(textbox#username, "ada")' in pairs[1][0][1]["content"]  # history of the demonstration
    examples = sft_examples(tokenizer, pairs)
    assert all(e.target_ids[-1] == tokenizer.eos_token_id for e in examples)
    start = sft_loss(model, examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    losses = [sft_step(model, optimizer, examples, micro_batch=2) for _ in range(4)]
    assert losses[0] == pytest.approx(start, rel=1e-4)  # the loss before the first step
    assert sft_loss(model, examples) < start - 0.3 and losses[-1] < losses[0]
    learner = LLMLearner(model, frozen_reference(model), LLMLearnerSettings(learning_rate=3e-3, micro_batch=2))
    # the learner's own optimiser, too: a fresh Adam's first steps may overshoot, so a few of them
    learner_losses = [learner.sft_step(examples) for _ in range(4)]
    assert learner_losses[-1] < learner_losses[0], learner_losses


# -- DeepSpeed ---------------------------------------------------------------------------------------


def test_deepspeed_configs_fill_every_auto_value():
    settings = LLMLearnerSettings(total_steps=1000, batch_turns=64, micro_batch=4)
    gpu = resolve_deepspeed_config(DS_ZERO3, settings, hidden_size=3584, world_size=8)
    assert gpu["zero_optimization"]["stage"] == 3 and gpu["train_batch_size"] == 4 * 16 * 8
    assert gpu["optimizer"]["params"] == {"lr": 7e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
    assert gpu["scheduler"]["type"] == "WarmupCosineLR" and gpu["scheduler"]["params"]["warmup_num_steps"] == 30
    assert gpu["zero_optimization"]["reduce_bucket_size"] == 3584 * 3584
    assert gpu["bf16"]["enabled"] == torch.cuda.is_available()  # no GPU here: bf16 off
    cpu = resolve_deepspeed_config(DS_ZERO3_CPU, settings, hidden_size=64)
    assert cpu["zero_optimization"]["stage"] == 3 and cpu["optimizer"]["params"]["torch_adam"] is True
    with pytest.raises(ValueError, match="still has 'auto'"):
        resolve_deepspeed_config({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, settings, hidden_size=8)


DEEPSPEED_SCRIPT = """
import json, sys
import numpy as np
from training.llm.policy import HFPolicy
from training.llm.sft import sft_examples
from training.rl.llm_learner import LLMLearner, LLMLearnerSettings, frozen_reference
from tests.training.llm.llm_fixtures import login_screen
from tests.training.llm.test_llm_policy import _context
import deepspeed

policy = HFPolicy.from_pretrained(sys.argv[1], record=True, max_new_tokens=12)
reference = frozen_reference(policy.model)
before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
settings = LLMLearnerSettings(learning_rate=1e-3, batch_turns=4, micro_batch=2, total_steps=10,
                              use_deepspeed=True, deepspeed_config=sys.argv[2])
learner = LLMLearner(policy.model, reference, settings, pad_id=policy.tokenizer.pad_token_id, lock=policy.lock)
episodes = []
for k in range(2):  # acting with the ZeRO-3-partitioned model (its hooks gather the weights)
    actor = policy.start(_context(f"ep-{k}"))
    for _ in range(2):
        actor.act(login_screen())
    episodes.append((policy.turns[f"ep-{k}"], np.array([0.0, float(k)])))
stats = learner.update(episodes)
pairs = [([{"role": "user", "content": "log in"}], "<action>\\nCLICK(4)\\n</action>")]
sft = [learner.sft_step(sft_examples(policy.tokenizer, pairs)) for _ in range(3)]
params = list(policy.model.named_parameters())
with deepspeed.zero.GatheredParameters([p for _, p in params]):
    changed = max(float((p.detach() - before[n]).abs().max()) for n, p in params)
print("RESULT " + json.dumps({"stage": learner.engine.zero_optimization_stage(), "steps": stats.optimizer_steps,
                              "changed": changed, "sft": sft, "ratio": stats.ratio_mean}))
"""


@pytest.mark.e2e
def test_deepspeed_zero3_on_cpu_updates_the_policy(tiny_causal_lm_path, tmp_path):
    """The learner under DeepSpeed ZeRO-3 (one CPU process, gloo, fp32): acting, an RL update and
    SFT steps, in a subprocess (DeepSpeed's process group would outlive the test otherwise)."""
    script = tmp_path / "ds_run.py"
    script.write_text(textwrap.dedent(DEEPSPEED_SCRIPT))
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONWARNINGS": "ignore::FutureWarning",
        "TORCH_EXTENSIONS_DIR": str(Path.home() / ".cache" / "stepwise" / "torch_extensions"),
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script), tiny_causal_lm_path, str(DS_ZERO3_CPU)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["stage"] == 3 and result["steps"] == 1 and result["changed"] > 0
    assert result["sft"][-1] < result["sft"][0]
    assert result["ratio"] == pytest.approx(1.0, abs=0.05)


# -- an OpenAI-compatible endpoint -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_down_endpoint_makes_the_step_nothing_not_an_exception():
    port = _free_port()  # closed again: nothing listens there
    client = ChatClient(ChatEndpoint(f"http://127.0.0.1:{port}/v1", "tiny", timeout_s=2.0))
    policy = EndpointPolicy(client)
    actor = policy.start(_context("down"))
    action = actor.act(SCREEN)
    assert action.type is ActionType.NOTHING and action.detail == f"format: {ENDPOINT_ERROR}"
    (turn,) = policy.turns["down"]
    assert not turn.format_ok and "not reachable" in str(turn.failure)
    assert policy.counters.format_failures == {ENDPOINT_ERROR: 1} and client.calls == 1
    actor.act(SCREEN)  # the episode goes on
    assert policy.format_ok("down") == (False, False)


@pytest.mark.e2e
def test_endpoint_policy_against_transformers_serve(tiny_causal_lm_path, tmp_path):
    """A real OpenAI-compatible server (``transformers serve``) on the tiny model: every step is
    one chat call, and each answer is parsed or counted as a format failure."""
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "transformers"), "serve", "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu", tiny_causal_lm_path],
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "transformers serve did not come up"
            time.sleep(0.3)
        client = ChatClient(ChatEndpoint(f"http://127.0.0.1:{port}/v1", tiny_causal_lm_path, timeout_s=60))
        policy = EndpointPolicy(client, max_tokens=24, stop=("</action>",))
        actor = policy.start(_context("served"))
        actions = [actor.act(SCREEN) for _ in range(3)]
        turns = policy.turns["served"]
        assert client.calls == 3 and len(turns) == 3 and policy.counters.steps == 3
        assert all(t.failure is None or not t.failure.startswith(ENDPOINT_ERROR) for t in turns), turns
        assert sum(policy.counters.format_failures.values()) == sum(not t.format_ok for t in turns)
        for turn, action in zip(turns, actions, strict=True):
            assert turn.format_ok or action.type is ActionType.NOTHING
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        log.close()


def test_a_prompt_too_long_shows_fewer_elements_and_the_parser_follows(tiny_lm):
    from dataclasses import replace

    from warehouse.model import Screen, UIElement

    buttons = tuple(
        UIElement(
            ref=str(10 + i), role="button", text=f"option {i}", clickable=True, bounds=(0, 20 * i, 90, 20 * i + 18)
        )
        for i in range(60)
    )
    screen = Screen((replace(SCREEN.elements[0], bounds=(0, 0, 100, 1300)), *buttons))
    full, _ = build_messages(INSTRUCTION, screen, [], step_index=0, max_steps=3, supported=MINIWOB_ACTIONS)
    model, tokenizer = tiny_lm
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=4, max_prompt_tokens=700)
    assert len(encode_prompt(tokenizer, full)) > 700
    policy.start(_context("long")).act(screen)
    (turn,) = policy.turns["long"]
    assert len(turn.prompt_ids) <= 700 and policy.counters.truncated_prompts == 1
    shown = tokenizer.decode(turn.prompt_ids.tolist())
    assert "[14] button" in shown and "more elements not shown" in shown and "[59] button" not in shown
