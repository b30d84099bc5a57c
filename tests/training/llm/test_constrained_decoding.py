"""Constrained decoding of the action grammar (issue 25 item 2): every answer parses, the fixed
parts are forced, the allowed sets are recorded, and the learner renormalises over the same sets
(the ratio starts at 1, forced tokens carry no gradient). On the tiny Qwen2 of the
``tiny_causal_lm_path`` fixture; the real SmolLM2 is in test_smollm2.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from envs.protocol import EpisodeContext
from envs.task_catalog import load_catalog
from tests.training.llm.llm_fixtures import MINIWOB_ACTIONS, login_screen
from training.llm.action_grammar import (
    EMPTY_THOUGHT_PREFIX,
    ActionGrammar,
    End,
    Literal,
    TokenIndex,
    TokenizerNotSupportedError,
    TokenSet,
    call_strings,
    walk,
)
from training.llm.decoding import PrefixCache, constrained_generate, sample_masked
from training.llm.policy import HFPolicy, TurnRecord, response_logprobs
from training.llm.prompts import format_response, numbered_elements, offered_functions, parse_response
from training.rl.llm_learner import LLMLearner, LLMLearnerSettings, chosen_tokens, frozen_reference
from warehouse.model import ActionType, Screen, UIElement

LOGIN = load_catalog("miniwob")["login-user"]
SCREEN = login_screen()
ELEMENTS = numbered_elements(SCREEN)  # 0 label, 1 textbox, 2 label, 3 password, 4 button
MINIWOB_FUNCTIONS = offered_functions(MINIWOB_ACTIONS)
ALL_FUNCTIONS = offered_functions(None)


def _context(episode_id: str, supported: frozenset[ActionType] | None = MINIWOB_ACTIONS) -> EpisodeContext:
    return EpisodeContext(
        task=LOGIN.spec,
        instruction='Enter the username "ada" and the password "xy" into the text fields and press login.',
        slots={"username": "ada", "password": "xy"},
        seed=1,
        backend="miniwob",
        supported_actions=supported,
        max_steps=4,
        episode_id=episode_id,
    )


def _many_buttons(n: int = 14) -> Screen:
    """A screen with two-digit element numbers (CLICK(1) and CLICK(12) share a prefix)."""
    buttons = tuple(
        UIElement(
            ref=str(10 + i), role="button", text=f"option {i}", clickable=True, bounds=(0, 20 * i, 90, 20 * i + 18)
        )
        for i in range(n)
    )
    return Screen((replace(SCREEN.elements[0], bounds=(0, 0, 100, 400)), *buttons, *SCREEN.elements[3:4]))


@pytest.fixture(scope="module")
def tiny_lm(tiny_causal_lm_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path), AutoTokenizer.from_pretrained(tiny_causal_lm_path)


@pytest.fixture(scope="module")
def index(tiny_lm) -> TokenIndex:
    model, tokenizer = tiny_lm
    return TokenIndex.build(tokenizer, model.config.vocab_size)


# -- the grammar ----------------------------------------------------------------------------------


def test_the_grammar_lists_exactly_the_calls_the_parser_accepts_on_the_screen():
    complete, heads = call_strings(ELEMENTS, MINIWOB_FUNCTIONS)
    assert {f"CLICK({i})" for i in range(5)} <= set(complete) and "DO_NOTHING()" in complete
    assert "SCROLL(DOWN)" in complete and 'PRESS_KEY("Enter")' in complete
    assert not any(c.startswith(("GOBACK", "ANSWER", "LONG_CLICK")) for c in complete + heads)  # not offered
    assert heads == ['INPUT(1, "', 'INPUT(3, "']  # only the editable elements
    for call in complete + [h + 'some text")' for h in heads]:
        parsed = parse_response(format_response(call), ELEMENTS, MINIWOB_ACTIONS)
        assert parsed.ok and parsed.call == call, call
    complete_all, heads_all = call_strings(ELEMENTS, ALL_FUNCTIONS)
    assert {"GOBACK()", "LONG_CLICK(4)"} <= set(complete_all) and 'ANSWER("' in heads_all


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("CLICK(4)\n</action>", True),
        ('INPUT(3, "xy")\n</action>', True),
        ('INPUT(1, "")\n</action>', True),
        ("CLICK(5)\n</action>", False),  # not on the screen
        ('INPUT(0, "ada")\n</action>', False),  # a label is not editable
        ("GOBACK()\n</action>", False),  # not offered in MiniWoB++
        ('INPUT(1, "a"b")\n</action>', False),  # a quote inside the text
        ('INPUT(1, "a\nb")\n</action>', False),  # a newline inside the text
        ("click(4)\n</action>", False),  # the parser is lenient; the grammar writes one spelling
    ],
)
def test_the_automaton_accepts_valid_answers_and_nothing_else(index, answer, ok):
    grammar = ActionGrammar.for_screen(index, ELEMENTS, MINIWOB_FUNCTIONS)
    end = walk(grammar.root, answer)
    assert (end is not None and type(end).__name__ == "End") is ok


def test_token_sets_are_compact_and_exact():
    few = TokenSet.of([5, 3, 3], 10)
    assert not few.complement and few.ids.tolist() == [3, 5] and 3 in few and 4 not in few
    most = TokenSet.of(range(9), 10)
    assert most.complement and most.ids.tolist() == [9] and 8 in most and 9 not in most
    assert most.to_mask(10).sum() == 9 and most.size(10) == 9 and TokenSet.of([7], 10).forced


def test_a_tokenizer_whose_tokens_do_not_decode_alone_is_refused_in_one_line(tiny_lm):
    _, tokenizer = tiny_lm

    class Stripping:  # like a SentencePiece tokenizer: a token's leading space is lost on its own
        eos_token_id, all_special_ids = tokenizer.eos_token_id, tokenizer.all_special_ids

        def __len__(self) -> int:
            return len(tokenizer)

        def batch_decode(self, ids):
            return [t.strip() for t in tokenizer.batch_decode(ids)]

        def __call__(self, text, add_special_tokens=False):
            return tokenizer(text, add_special_tokens=add_special_tokens)

    with pytest.raises(TokenizerNotSupportedError, match="byte-level BPE"):
        TokenIndex.build(Stripping())


# -- sampling under the mask ------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampling_under_the_mask_follows_the_masked_softmax_and_never_leaves_it(temperature):
    logits = torch.tensor([2.0, 0.5, -1.0, 1.0, 0.0, 3.0])
    allowed = torch.tensor([False, True, False, True, True, False])
    expected = torch.softmax(logits.masked_fill(~allowed, float("-inf")) / temperature, dim=-1)
    generator = torch.Generator().manual_seed(0)
    draws = [
        sample_masked(logits, allowed, greedy=False, temperature=temperature, generator=generator) for _ in range(6000)
    ]
    counts = np.bincount([t for t, _ in draws], minlength=6) / len(draws)
    assert counts[~allowed.numpy()].sum() == 0  # never a token outside the allowed set
    np.testing.assert_allclose(counts, expected.numpy(), atol=0.02)
    # the recorded log-prob is the policy's own (temperature 1) renormalised over the allowed set
    at_one = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    assert all(lp == pytest.approx(float(at_one[t]), abs=1e-6) for t, lp in draws[:50])
    assert sample_masked(logits, allowed, greedy=True)[0] == 3  # the best allowed, not the best overall (5)


# -- the policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("screen", "supported", "think"),
    [(SCREEN, MINIWOB_ACTIONS, False), (_many_buttons(), MINIWOB_ACTIONS, False), (SCREEN, None, True)],
    ids=["login", "two-digit-elements", "all-functions-with-thought"],
)
def test_every_constrained_answer_parses_and_records_what_was_allowed(tiny_lm, screen, supported, think):
    """A random model, sampled: all answers parse, end with EOS, each token lies in its recorded
    set, forced tokens have log-prob 0, and the counters split forced from sampled tokens."""
    model, tokenizer = tiny_lm
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=24, think=think, max_thought_tokens=6)
    for k in range(4):
        actor = policy.start(_context(f"ep-{k}", supported))
        for _ in range(2):
            actor.act(screen)
    turns = [t for k in range(4) for t in policy.turns[f"ep-{k}"]]
    assert all(t.format_ok and t.failure is None for t in turns), [t.response_text for t in turns]
    assert not policy.counters.format_failures and policy.counters.steps == 8
    for turn in turns:
        assert turn.masks is not None and len(turn.masks) == turn.n_tokens == turn.logp.size
        assert turn.response_ids[-1] == tokenizer.eos_token_id
        assert all(int(token) in mask for token, mask in zip(turn.response_ids, turn.masks, strict=True))
        forced = np.asarray([m.forced for m in turn.masks])
        assert np.all(turn.logp[forced] == 0.0) and np.all(turn.logp[~forced] <= 0.0)
        assert turn.response_text.startswith("<think>\n" if think else EMPTY_THOUGHT_PREFIX)
    c = policy.counters
    assert (
        c.forced_tokens == sum(t.n_forced for t in turns) and c.forced_tokens + c.sampled_tokens == c.generated_tokens
    )
    assert 0 < c.sampled_tokens < c.forced_tokens  # the format's fixed parts are most of an answer


def test_free_text_is_bounded_and_closed_by_the_grammar(tiny_lm):
    model, tokenizer = tiny_lm
    index = TokenIndex.build(tokenizer, model.config.vocab_size)
    prompt = tokenizer("<|im_start|>user\nType something<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    grammar = ActionGrammar.for_screen(index, ELEMENTS, ["INPUT"], think=True, max_text_tokens=3, max_thought_tokens=4)
    for seed in range(4):
        out = constrained_generate(model, np.asarray(prompt), grammar, seed=seed)
        parsed = parse_response(out.text, ELEMENTS, None)
        assert parsed.ok and parsed.action.type is ActionType.INPUT, out.text
        thought_tokens = out.text.index("</think>")
        assert len(tokenizer(out.text[len("<think>\n") : thought_tokens])["input_ids"]) <= 4 + 2
        assert len(tokenizer(parsed.action.text or "")["input_ids"]) <= 3 + 1


def test_the_prefix_cache_reuses_the_prompt_and_changes_nothing(tiny_lm):
    """Greedy answers and their log-probs are the same with and without kept prompt caches, and
    the second step of an episode takes most of its prompt from the first."""
    model, tokenizer = tiny_lm
    runs = {}
    for size in (4, 0):
        policy = HFPolicy(model, tokenizer, record=True, greedy=True, prefix_cache_size=size)
        actor = policy.start(_context("cached"))
        for screen in (SCREEN, login_screen(username="ada", focused="username")):
            actor.act(screen)
        runs[size] = policy
    cached, plain = runs[4].turns["cached"], runs[0].turns["cached"]
    for a, b in zip(cached, plain, strict=True):
        assert a.response_ids.tolist() == b.response_ids.tolist()
        np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)
    assert runs[0].counters.reused_prompt_tokens == 0
    assert runs[4].counters.reused_prompt_tokens > 0.5 * cached[1].prompt_ids.size
    cache = PrefixCache(capacity=1)
    assert cache.lookup(cached[0].prompt_ids) == (None, 0) and cache.lookups == 1


# -- the learner renormalises over the same sets ---------------------------------------------------------


def _episodes(policy: HFPolicy, n: int = 3) -> list[tuple[list[TurnRecord], np.ndarray]]:
    episodes = []
    for k in range(n):
        actor = policy.start(_context(f"rl-{k}"))
        for _ in range(2):
            actor.act(SCREEN)
        episodes.append((policy.turns[f"rl-{k}"], np.array([0.0, 1.0 if k % 2 else -1.0])))
    return episodes


def test_the_ratio_at_the_acting_weights_is_one_and_forced_tokens_have_no_gradient(tiny_causal_lm_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=16)
    episodes = _episodes(policy)
    turns = [t for ts, _ in episodes for t in ts]
    learner = LLMLearner(model, frozen_reference(model), LLMLearnerSettings(micro_batch=2), pad_id=0)
    batch = learner.prepare(episodes)
    # the learner's masked recomputation, batched and padded, gives the recorded log-probs: ratio 1
    with torch.inference_mode():
        prompts, responses = [t.prompt_ids for t in turns], [t.response_ids for t in turns]
        new = response_logprobs(model, prompts, responses, masks=[t.masks for t in turns], micro_batch=3)
        unmasked = response_logprobs(model, prompts, responses)
    for turn, logp, free in zip(turns, new, unmasked, strict=True):
        np.testing.assert_allclose(np.exp(logp.numpy() - turn.logp), 1.0, atol=1e-4)
        chosen = chosen_tokens(turn)
        assert np.all(free.numpy()[chosen] < logp.numpy()[chosen])  # the mask matters: without it, not 1
    # the reference is the same model here: the masked KL is 0 on every token
    assert max(float(np.abs(k).max()) for k in batch.kl) < 1e-4
    # advantages live on the chosen tokens only, normalised there
    picked = np.concatenate([a[c] for a, c in zip(batch.advantages, batch.chosen, strict=True)])
    assert picked.mean() == pytest.approx(0.0, abs=1e-6) and picked.std() == pytest.approx(1.0, abs=1e-3)
    assert all(np.all(a[~c] == 0) for a, c in zip(batch.advantages, batch.chosen, strict=True))
    # forced positions: exactly 0 and no gradient; chosen ones have one
    turn = turns[0]
    (logp,) = response_logprobs(model, [turn.prompt_ids], [turn.response_ids], masks=[turn.masks])
    forced = ~chosen_tokens(turn)
    assert forced.any() and torch.all(logp[torch.from_numpy(forced)] == 0)
    grad = torch.autograd.grad(
        logp[torch.from_numpy(forced)].sum(), model.lm_head.weight, allow_unused=True, retain_graph=True
    )[0]
    assert grad is None or float(grad.abs().max()) == 0.0
    grad = torch.autograd.grad(logp[torch.from_numpy(~forced)].sum(), model.lm_head.weight)[0]
    assert float(grad.abs().max()) > 0.0
    stats = learner.update(episodes)
    assert stats.chosen_tokens == int(sum(c.sum() for c in batch.chosen)) < stats.tokens
    # the update changed the weights in place: kept prompt caches of the old weights are not used
    reused = policy.counters.reused_prompt_tokens
    policy.start(_context("after-update")).act(SCREEN)
    assert policy.counters.reused_prompt_tokens == reused
    policy.start(_context("after-update-2")).act(SCREEN)
    assert policy.counters.reused_prompt_tokens > reused


def test_the_learner_rejects_masks_that_do_not_fit_the_turn(tiny_lm):
    model, tokenizer = tiny_lm
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=8)
    policy.start(_context("bad")).act(SCREEN)
    (turn,) = policy.turns["bad"]
    assert turn.masks is not None
    with pytest.raises(ValueError, match="masks for"):
        response_logprobs(model, [turn.prompt_ids], [turn.response_ids], masks=[turn.masks[:-1]])
    outside = tuple(TokenSet(np.asarray([int(t) + 1], dtype=np.int32)) for t in turn.response_ids)
    with pytest.raises(ValueError, match="outside its allowed set"):
        response_logprobs(model, [turn.prompt_ids], [turn.response_ids], masks=[outside])


def test_recompute_logp_old_makes_the_learner_authoritative(tiny_causal_lm_path):
    """An actor whose recorded log-probs are off (another precision, stale weights): with
    ``recompute_logp_old`` the learner's own masked log-probs replace them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    episodes = _episodes(HFPolicy(model, tokenizer, record=True, max_new_tokens=12), n=2)
    skewed = [([replace(t, logp=t.logp - 0.5 * chosen_tokens(t)) for t in ts], r) for ts, r in episodes]
    trusting = LLMLearner(model, frozen_reference(model), LLMLearnerSettings(), pad_id=0).prepare(skewed)
    recomputing = LLMLearner(
        model, frozen_reference(model), LLMLearnerSettings(recompute_logp_old=True), pad_id=0
    ).prepare(skewed)
    flat = [t for ts, _ in episodes for t in ts]
    for turn, trusted, recomputed in zip(flat, trusting.logp_old, recomputing.logp_old, strict=True):
        np.testing.assert_allclose(trusted, turn.logp - 0.5 * chosen_tokens(turn), atol=1e-6)
        np.testing.assert_allclose(recomputed, turn.logp, atol=1e-4)


# -- bad input ----------------------------------------------------------------------------------------


def test_a_prompt_longer_than_the_models_context_is_shortened_before_generation(tiny_lm, monkeypatch):
    model, tokenizer = tiny_lm
    monkeypatch.setattr(model.config, "max_position_embeddings", 600)
    policy = HFPolicy(model, tokenizer, record=True, max_new_tokens=24)
    assert policy.prompt_limit == 600 - 24 - 64 < policy.max_prompt_tokens
    policy.start(_context("long")).act(_many_buttons(40))
    (turn,) = policy.turns["long"]
    assert turn.prompt_ids.size + turn.n_tokens <= 600 and policy.counters.truncated_prompts == 1
    assert turn.format_ok  # the grammar follows the elements the shortened prompt shows
    with pytest.raises(ValueError, match="context of 600 positions leaves"):
        HFPolicy(model, tokenizer, max_new_tokens=500)


# -- lower-precision acting copies ---------------------------------------------------------------------


def test_acting_copies_and_their_drift_from_the_float32_policy(tiny_lm):
    from training.llm.precision import acting_copy, logp_drift

    model, tokenizer = tiny_lm
    policy = HFPolicy(model, tokenizer, record=True, greedy=True, max_new_tokens=12)
    policy.start(_context("drift")).act(SCREEN)
    turns = policy.turns["drift"]
    assert acting_copy(model, "fp32") is model
    with pytest.raises(ValueError, match="precision must be one of"):
        acting_copy(model, "fp8")
    same = logp_drift(model, model, turns)
    assert same == {"mean_abs_logp_diff": 0.0, "token_agreement": 1.0, "answer_agreement": 1.0}
    bf16 = acting_copy(model, "bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    drift = logp_drift(model, bf16, turns)
    assert 0.0 < drift["mean_abs_logp_diff"] < 0.5  # rounding moves the log-probs: off-policy for the learner
    int8 = acting_copy(model, "int8")
    assert any("quantized" in type(m).__module__ for m in int8.modules())
    assert 0.0 <= logp_drift(model, int8, turns)["token_agreement"] <= 1.0


def test_sft_targets_are_answers_the_constrained_policy_can_give(index, tiny_lm):
    """SFT teaches ``format_response(call)`` tokenised by the tokenizer: its forced prefix must be
    the grammar's canonical one, and every later token must be allowed, or SFT would put mass
    where the constrained policy cannot go."""
    from training.llm.sft import sft_examples

    _, tokenizer = tiny_lm
    grammar = ActionGrammar.for_screen(index, ELEMENTS, MINIWOB_FUNCTIONS)
    prefix = index.canonical(EMPTY_THOUGHT_PREFIX)
    for call in ("CLICK(4)", 'INPUT(1, "ada")', 'INPUT(3, "x y z")', 'PRESS_KEY("Enter")', "DO_NOTHING()"):
        (example,) = sft_examples(tokenizer, [([{"role": "user", "content": "hi"}], format_response(call))])
        target = example.target_ids.tolist()
        assert tuple(target[: len(prefix)]) == prefix and target[-1] == tokenizer.eos_token_id
        state, rest = grammar.root, target[len(prefix) : -1]
        while rest:
            if isinstance(state, Literal):  # forced in the canonical tokenisation: SFT must agree
                forced = list(index.canonical(state.rest))
                assert rest[: len(forced)] == forced, (call, [index.strings[t] for t in rest])
                rest, state = rest[len(forced) :], state.then
                continue
            assert rest[0] in grammar.allowed(state), (call, index.strings[rest[0]])
            state, rest = walk(state, index.strings[rest[0]]), rest[1:]
            assert state is not None
        assert isinstance(state, End)
