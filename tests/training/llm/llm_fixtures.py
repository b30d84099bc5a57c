"""Helpers for the LLM-policy tests: prompts from real demonstrations, a byte-level BPE tokenizer
trained on them, a tiny Qwen2 causal LM built from a config, and a small login screen.

The tokenizer matches its model (issue "Hardening" item 17): a byte-level BPE, so every text
round-trips through encode/decode, trained in a couple of seconds on a few hundred actor prompts
built from the MiniWoB++ demonstrations in ``../shared/data/miniwob-demos``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from training.llm.prompts import HistoryEntry, action_to_call, build_messages, format_response
from warehouse.model import Action, ActionType, Screen, UIElement

DEMOS = Path(__file__).resolve().parents[4] / "shared" / "data" / "miniwob-demos"
DEMO_TASKS = (
    "login-user",
    "click-button",
    "enter-text",
    "click-checkboxes",
    "click-option",
    "focus-text",
    "click-link",
    "email-inbox",
    "click-tab",
    "enter-password",
)
#: What live MiniWoB++ supports (envs.miniwob.live.SUPPORTED_ACTIONS), without starting a browser.
MINIWOB_ACTIONS = frozenset(
    {ActionType.CLICK, ActionType.INPUT, ActionType.SCROLL, ActionType.PRESS_KEY, ActionType.NOTHING}
)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: A Qwen-style chat template (ChatML), small enough to read.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    + IM_START
    + "{{ message['role'] }}\n{{ message['content'] }}"
    + IM_END
    + "\n{% endfor %}"
    + "{% if add_generation_prompt %}"
    + IM_START
    + "assistant\n{% endif %}"
)


def chatml(messages: list[dict[str, str]]) -> str:
    """What CHAT_TEMPLATE renders, with the generation prompt (for training the tokenizer)."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages) + f"{IM_START}assistant\n"


def demo_prompts(limit: int = 300, per_task: int = 12) -> Iterator[tuple[list[dict[str, str]], str]]:
    """(actor messages, target answer) for steps of recorded demonstrations, up to ``limit``."""
    from envs.miniwob.recordings import (
        RecordingError,
        parse_recording_json,
        read_recording_bytes,
        recording_to_episode,
    )

    count = 0
    for task in DEMO_TASKS:
        files = sorted(DEMOS.glob(f"*/{task}/*.json.gz"))[:per_task]
        for path in files:
            try:
                data, _ = read_recording_bytes(path)
                episode = recording_to_episode(parse_recording_json(data), task)
            except (RecordingError, OSError):
                continue
            history: list[HistoryEntry] = []
            for t, step in enumerate(episode.steps):
                messages, elements = build_messages(
                    episode.instruction,
                    step.screen,
                    history,
                    step_index=t,
                    max_steps=max(10, len(episode.steps)),
                    supported=MINIWOB_ACTIONS,
                )
                call = action_to_call(step.action, elements) or "DO_NOTHING()"
                yield messages, format_response(call, f"Next: {step.action.canonical_text()}")
                history.append(HistoryEntry(step.action))
                count += 1
                if count >= limit:
                    return


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 2048):
    """A byte-level BPE (GPT-2 / Qwen style) trained on ``texts``, as a PreTrainedTokenizerFast with
    ChatML special tokens and CHAT_TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=PAD, additional_special_tokens=[IM_START]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_causal_lm(folder: Path, *, n_prompts: int = 300, vocab_size: int = 2048, seed: int = 0) -> Path:
    """Tokenizer (trained on demonstration prompts) + a random 2-layer Qwen2ForCausalLM (hidden 64)
    with that vocabulary, both saved to ``folder`` with save_pretrained."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    texts = [chatml(messages) + answer + IM_END for messages, answer in demo_prompts(n_prompts)]
    if len(texts) < n_prompts // 2:
        raise RuntimeError(f"only {len(texts)} demonstration prompts under {DEMOS}")
    tokenizer = train_bpe_tokenizer(texts, vocab_size)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def login_screen(username: str | None = "", password: str | None = "", focused: str | None = None) -> Screen:
    """A MiniWoB++-like login form with real geometry (numbered: labels, the two fields, the button)."""

    def el(ref: str, role: str, top: float, **kw) -> UIElement:
        return UIElement(ref=ref, role=role, bounds=(10.0, top, 150.0, top + 20.0), depth=2, parent_ref="2", **kw)

    return Screen(
        (
            UIElement(ref="1", role="body", bounds=(0.0, 0.0, 160.0, 210.0)),
            UIElement(ref="2", role="div", element_id="wrap", bounds=(0.0, 50.0, 160.0, 210.0), depth=1),
            el("3", "label", 60.0, text="Username", clickable=True),
            el("4", "textbox", 80.0, element_id="username", value=username, editable=True, clickable=True,
               focused=focused == "username"),
            el("5", "label", 110.0, text="Password", clickable=True),
            el("6", "password", 130.0, element_id="password", value=password, editable=True, clickable=True,
               focused=focused == "password"),
            el("7", "button", 170.0, element_id="subbtn", text="Login", clickable=True),
        )
    )  # fmt: skip


def click(element: UIElement) -> Action:
    return Action(ActionType.CLICK, element)
