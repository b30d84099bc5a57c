"""Same input, same output: an embedding, a reward score or a policy's choice depends on its own
input and the model alone, never on what shared its batch or what a cache met first."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from training.base.encoder import (
    LENGTH_STEP,
    EmbeddingCache,
    EncoderConfig,
    RowScaledInt8Linear,
    SegmentEncoder,
    lane_multiple,
    padded_length,
    vector_lanes,
)
from training.base.states import StepState
from training.reward_models.models import ROW_MULTIPLE, RewardModelConfig, RewardScorer, build_reward_model

WORDS = (
    "submit cancel ok username password email inbox reply forward delete search flight from to date "
    "button link checkbox textbox tab next previous select option star important vanda 4242 the of"
).split()


def _texts(rng: random.Random, n: int) -> list[str]:
    """Action and screen-line shaped texts of very different lengths (1 to ~120 tokens)."""
    texts = []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 13, 30, 70])))
        texts.append(f'{rng.choice(["CLICK", "INPUT", "div", "span"])}({words} "{rng.randint(0, 9999)}")')
    return list(dict.fromkeys(texts))


@pytest.fixture(scope="module", params=[True, False], ids=["int8", "fp32"])
def encoder(request) -> SegmentEncoder:
    return SegmentEncoder(EncoderConfig(quantize_encoder=request.param))


def assert_same_embedding(encoder: SegmentEncoder, got: np.ndarray, expected: np.ndarray) -> None:
    """Bit for bit with the int8 encoder (the CPU default: its sums are exact integers); within the
    issue's 1e-6 with float32, whose matrix products differ in the last bit (1.0e-7) alone and in a
    batch on this Intel AVX-512 machine (2026-11-27), with the code that passed on an earlier CI machine."""
    if encoder.quantized:
        np.testing.assert_array_equal(got, expected)
    else:
        assert float(np.abs(got - expected).max()) <= 1e-6


def test_padded_length_is_the_next_multiple_of_sixteen_above_the_longest_row():
    assert [padded_length(n) for n in (1, 15, 16, 17, 31, 32, 127, 128)] == [16, 16, 32, 32, 32, 48, 128, 144]


def test_a_text_encoded_alone_equals_it_inside_random_batches(encoder):
    """The issue's criterion (tolerance 1e-6); the encoder in fact gives the same bits."""
    rng = random.Random(7)
    texts = _texts(rng, 120)
    alone = np.concatenate([encoder.encode([t]) for t in texts[:40]])
    worst = 0.0
    for _ in range(12):
        batch = rng.sample(texts, rng.randint(2, 60))
        batch.insert(rng.randrange(len(batch) + 1), texts[rng.randrange(40)])
        got = encoder.encode(batch, batch_size=rng.choice([1, 5, 64]))
        for row, text in enumerate(batch):
            if text in texts[:40]:
                worst = max(worst, float(np.abs(got[row] - alone[texts.index(text)]).max()))
    assert worst <= 1e-6
    assert_same_embedding(encoder, encoder.encode(texts[:40], batch_size=64), alone)


def test_the_packed_forward_gives_the_models_own_bits_on_real_tokens_only(encoder):
    """The int8 encoder computes its linear layers on the real tokens alone (padding skipped, query,
    key and value in one product): the embeddings are those of the model's own padded forward, bit
    for bit, on texts of every length in batches of every size."""
    if not encoder.quantized:
        assert not encoder.packed  # float32 products are not row-invariant: the model's own forward
        return
    assert encoder.packed
    texts = _texts(random.Random(5), 150)
    try:
        packed = {size: encoder.encode(texts, batch_size=size) for size in (1, 7, 64)}
        encoder.packed = False
        padded = encoder.encode(texts, batch_size=64)
    finally:
        encoder.packed = True
    for got in packed.values():
        np.testing.assert_array_equal(got, padded)


def test_a_text_that_fills_a_whole_lane_is_encoded_alone_as_in_a_padded_batch(encoder):
    """A text of exactly 16 or 32 tokens, alone, would have no padding: its attention mask all ones,
    which Transformers drops (another kernel, other last bits) unless a padded position is kept."""
    rng = random.Random(11)
    candidates = _texts(rng, 400)
    lengths = [len(ids) for ids in encoder.tokenizer(candidates, truncation=True, max_length=128)["input_ids"]]
    full = [t for t, n in zip(candidates, lengths, strict=True) if n % LENGTH_STEP == 0][:6]
    assert full
    for text in full:
        alone = encoder.encode([text])
        batch = [text, *rng.sample(candidates, 7)]
        assert_same_embedding(encoder, encoder.encode(batch)[:1], alone)


def test_thread_count_does_not_change_an_embedding(encoder):
    texts = _texts(random.Random(3), 30)
    threads = torch.get_num_threads()
    reference = encoder.encode(texts)
    try:
        torch.set_num_threads(1)
        single = encoder.encode(texts)
    finally:
        torch.set_num_threads(threads)
    assert_same_embedding(encoder, single, reference)


def test_row_scaled_int8_linear_is_row_independent_and_close_to_fp32():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    quantized = RowScaledInt8Linear(linear)
    # rows of very different magnitudes: one per-tensor scale would crush the small ones
    x = torch.randn(50, 64) * torch.logspace(-3, 2, 50).unsqueeze(1)
    per_tensor = torch.ao.quantization.quantize_dynamic(nn.Sequential(linear), {nn.Linear}, torch.qint8)
    with torch.inference_mode():
        together = quantized(x)
        apart = torch.cat([quantized(x[i : i + 1]) for i in range(50)])
        signal = linear(x) - linear.bias  # the input-dependent part of the output

        def relative_error(y: torch.Tensor) -> torch.Tensor:
            return ((y - linear.bias) - signal).norm(dim=1) / signal.norm(dim=1)

        ours, theirs = relative_error(together), relative_error(per_tensor(x))
    assert torch.equal(together, apart)
    assert ours.max() < 0.05  # every row keeps its precision, small ones included
    assert theirs.max() > 0.5  # one scale for the whole batch loses the small rows


def test_the_fixed_range_kernel_gives_the_dynamic_kernels_bits():
    """The fast path (fbgemm's linear at the fixed activation range [-1, 1]) and the first path (the
    dynamic kernel with a +1/-1 row appended) give the same bits on rows of any magnitude, and a
    layer without the fast path (another CPU's engine, a torch without the kernel) still works."""
    torch.manual_seed(1)
    linear = nn.Linear(384, 1536)
    fast = RowScaledInt8Linear(linear)
    if torch.backends.quantized.engine in ("x86", "fbgemm"):
        assert fast.fixed_range is not None  # the fast path is taken on this stack
    slow = RowScaledInt8Linear(linear)
    slow.fixed_range = None
    x = torch.randn(300, 384) * torch.logspace(-4, 3, 300).unsqueeze(1)
    x[7] = 0.0  # an all-zero row: its scale is clamped, not divided by zero
    with torch.inference_mode():
        assert torch.equal(fast(x), slow(x))
        assert torch.equal(fast(x[5:6]), slow(x)[5:6])


def test_cache_history_never_changes_a_reward_score(tmp_path):
    """Two scorers with the same weights: one meets the states one at a time (a cold RL loop),
    the other after a warm-up that encoded them among many other texts, in other batches, then
    through a cache saved to disk and loaded again. Same scores, bit for bit."""
    config = RewardModelConfig(kind="progrm_lcs")
    torch.manual_seed(0)
    model = build_reward_model(config, input_dim=384).eval()
    encoder = SegmentEncoder(config.encoder_config())
    states = [
        StepState(
            f'Enter the username "{name}" and press Login',
            tuple(f'INPUT(textbox#username, "{name[:k]}")' for k in range(step)),
            ("body", f'  textbox#username value="{name[:step]}" [editable]', '  button "Login" [clickable]'),
        )
        for name in ("vanda", "kasey", "ilsa")
        for step in range(3)
    ]
    cold = RewardScorer(model, encoder=encoder)
    one_at_a_time = np.concatenate([cold.score_states([s]) for s in states])

    warm = RewardScorer(model, encoder=encoder)
    warm.cache.indices(_texts(random.Random(1), 80) + [t for s in states for t in (s.instruction, *s.history)])
    warm.cache.save(tmp_path / "cache")
    reloaded = RewardScorer(model, encoder=encoder)
    assert reloaded.cache.load(tmp_path / "cache") > 0
    for scorer in (warm, reloaded):
        np.testing.assert_array_equal(scorer.score_states(states[::-1])[::-1], one_at_a_time)


def test_a_fresh_cache_and_a_shared_one_give_the_same_rows():
    encoder = SegmentEncoder(EncoderConfig())
    texts = _texts(random.Random(5), 50)
    shared = EmbeddingCache(encoder)
    shared.indices(texts[25:] + texts[:10])
    rows = shared.indices(texts)
    fresh = EmbeddingCache(encoder)
    fresh_rows = fresh.indices(texts)
    np.testing.assert_array_equal(shared.matrix[rows], fresh.matrix[fresh_rows])


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512", "SVE256", "NEON", "a future 64-byte unit"])
def test_token_and_row_padding_are_whole_lanes_on_every_cpu(capability):
    """Both paddings hold for any lane width, not only this machine's: the width a batch is padded
    to and the row count the fusion is filled to are multiples of the CPU's float32 lanes (a fill
    of 8 rows, as before, is half a lane on an AVX-512 machine). 16 stays the unit on AVX2 and
    AVX-512 alike, so an encoder's fingerprint does not change between them."""
    unit = lane_multiple(capability)
    lanes = vector_lanes(capability)
    assert unit % lanes == 0 and unit % 16 == 0
    assert lanes == {"AVX2": 8, "AVX512": 16}.get(capability, lanes)
    here = vector_lanes()
    assert LENGTH_STEP % here == 0 and ROW_MULTIPLE % here == 0
    assert lane_multiple("AVX512") == lane_multiple("AVX2") == 16
    assert lane_multiple("a future 64-byte unit") == 32


def test_a_state_scores_the_same_alone_and_in_any_batch_size():
    """The fusion and head's rows: one state alone (filled to ROW_MULTIPLE rows), and inside
    batches of every size from 2 to 40, give the same score, bit for bit."""
    config = RewardModelConfig(kind="progrm_env")
    torch.manual_seed(0)
    scorer = RewardScorer(
        build_reward_model(config, input_dim=384).eval(), encoder=SegmentEncoder(config.encoder_config())
    )
    rng = random.Random(9)
    states = [
        StepState(
            f'Enter "{rng.choice(WORDS)}" and press {rng.choice(WORDS)}',
            tuple(rng.choice(WORDS) for _ in range(rng.randint(0, 3))),
            tuple(f"  {rng.choice(WORDS)} [clickable]" for _ in range(rng.randint(1, 6))),
        )
        for _ in range(40)
    ]
    alone = np.concatenate([scorer.score_states([s]) for s in states])
    for size in (2, 3, 7, 8, 9, 16, 17, 40):
        np.testing.assert_array_equal(scorer.score_states(states[:size]), alone[:size])


def test_one_shared_encoder_per_config_and_loading_it_draws_nothing():
    """``SegmentEncoder.shared``: one CPU encoder per config in a process (the same object, the same
    bits as a private one), another config another encoder, and loading never moves torch's global
    generator (a first use and a later one leave later draws alike)."""
    from training.base.encoder import EncoderConfig, SegmentEncoder

    torch.manual_seed(7)
    before = torch.get_rng_state().clone()
    first = SegmentEncoder.shared(EncoderConfig(segment_max_tokens=96))
    assert torch.equal(torch.get_rng_state(), before)
    assert SegmentEncoder.shared(EncoderConfig(segment_max_tokens=96)) is first
    assert SegmentEncoder.shared(EncoderConfig(segment_max_tokens=64)) is not first
    texts = ["Click the Submit button.", "Username: ada"]
    assert np.array_equal(first.encode(texts), SegmentEncoder(EncoderConfig(segment_max_tokens=96)).encode(texts))
