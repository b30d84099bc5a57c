"""ADMIRE's milestone distillation (§3.1, Eq. 6, P_init) through the real SmolLM2-135M-Instruct
behind ``transformers serve``, from the first success of a real task (a human demonstration): the
answer parses as a JSON list, or the counted trajectory fallback applies; either way the milestones
pay ADMIRE's reward on that success. A dead endpoint is one line before any rollout."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_smollm2_writers import first_success, rationale_steps
from training.base.encoder import EmbeddingCache, EncoderConfig, SegmentEncoder
from training.llm.chat_client import ChatClient, ChatEndpoint, ChatEndpointError
from training.llm.endpoint import free_port
from training.policy.rollouts import Rollout
from training.rl.rewards.admire import (
    AdmireReward,
    LLMMilestones,
    MilestoneStore,
    action_descriptions,
    essential_steps,
    parse_milestones,
)


def test_first_successes_of_real_tasks_come_from_the_demonstrations(demos_dir):
    record = first_success("login-user", demos_dir)
    assert record is not None and record.success and record.task_id == "login-user"
    assert set(record.slots) >= {"username", "password"} and essential_steps(record)
    assert any("<username>" in d for d in action_descriptions(record))  # instruction-relative, as milestones are
    (first, positive), (_, second) = rationale_steps(record)
    assert positive == "positive" and first in essential_steps(record) and second in ("positive", "negative")


@pytest.mark.parametrize(
    ("answer", "parsed"),
    [
        ('Milestones:\n```json\n["Enter <username>", "Click Login"]\n```', ["Enter <username>", "Click Login"]),
        ('[1, 2] then ["Type <password>"]', ["Type <password>"]),
        ('{ "action": "login-user", "input": {"a": "b"} }', None),
        ('["unterminated", ', None),
        ("[]", None),
    ],
)
def test_milestone_answers_parse_only_as_a_list_of_strings(answer, parsed):
    assert parse_milestones(answer) == parsed


@pytest.mark.e2e
def test_milestones_from_a_first_success_through_smollm2(smollm2_endpoint, demos_dir):
    record = first_success("login-user", demos_dir)
    client = ChatClient(smollm2_endpoint.chat_endpoint(timeout_s=300))
    writer = LLMMilestones(client, max_tokens=120)
    writer.check()  # the endpoint answers: what the RL stage checks before any rollout
    store = MilestoneStore(writer)
    assert store.update([Rollout(record)]) == ["login-user"]
    milestones = store.tasks["login-user"].milestones
    assert milestones and all(isinstance(m, str) and m.strip() for m in milestones)
    assert client.calls == 2 and writer.last_answer is not None  # the check and P_init, both answered
    parsed = parse_milestones(writer.last_answer)
    print(f"SmolLM2 answered {writer.last_answer!r}; parsed: {parsed}; milestones: {milestones}")
    if parsed is None:  # the 135M model did not write a JSON list: the counted fallback applies
        assert writer.fallbacks == 1
        descriptions = action_descriptions(record)
        assert milestones == list(dict.fromkeys(descriptions[i] for i in essential_steps(record)))
    else:
        assert writer.fallbacks == 0 and milestones == parsed
    # the same success under ADMIRE's reward: the milestone term is finite and the fallback counted
    source = AdmireReward(EmbeddingCache(SegmentEncoder(EncoderConfig())), store=store)
    batch = source.rewards([Rollout(record)], iteration=0)
    assert batch.details["milestone_fallbacks"] == writer.fallbacks and batch.details["milestones_changed"] == 0
    (rewards,) = batch.rewards
    assert rewards.shape == (record.n_steps,) and np.isfinite(rewards).all()
    if parsed is None:  # its own essential steps are the milestones: each is reached (similarity 1)
        assert batch.details["mean_milestones_reached"] == pytest.approx(1.0)


def test_a_dead_milestone_endpoint_is_one_line_before_any_rollout():
    writer = LLMMilestones(ChatClient(ChatEndpoint(f"http://127.0.0.1:{free_port()}/v1", "smollm2", timeout_s=2)))
    with pytest.raises(ChatEndpointError) as refused:
        writer.check()
    assert "not reachable" in str(refused.value) and "\n" not in str(refused.value)
    # during a run the same failure is a counted fallback, never an exception
    assert writer.initial("t", "i", ["CLICK(a)", "CLICK(a)", "INPUT(b)"]) == ["CLICK(a)", "INPUT(b)"]
    assert writer.fallbacks == 1 and writer.last_answer is None
