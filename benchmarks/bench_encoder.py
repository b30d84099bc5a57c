"""Benchmark of the frozen segment encoder: what batch invariance costs, and what it buys.

    python benchmarks/bench_encoder.py [--home STEPWISE_HOME] [--texts 3000]
    python benchmarks/bench_encoder.py --smoke      # 96 generated texts (the test suite)

Texts are the real segments the reward models encode (instruction, history actions, screen lines
of the warehouse's trajectories, each distinct text once); without a warehouse, generated texts of
the same shapes. Side by side, in the same run:

* **baseline**: the encoder before issue 21 (PyTorch dynamic int8 quantisation, one activation
  scale per batch tensor; batches sorted by length and padded to their longest text);
* **int8 per-row, padded forward**: batches padded to a multiple of 16 tokens (the lane unit of
  ``training.base.encoder.padded_length``), int8 linears with per-row activation scales
  (``training.base.encoder.RowScaledInt8Linear``), every padded token through every layer (the
  default until the packed forward);
* **int8 per-row, packed** (the default): the same function, its linear layers on the real tokens
  only and query/key/value in one product (``packed_bert_states``): the same bits, checked here;
* **fp32**: the same padding rule, MiniLM's own float32 weights.

For each: texts/s in bulk (batches of 64) and in calls of 5 new texts (what a reward model meets
per step of an RL loop), the largest difference between a text encoded alone and inside a batch,
and the cosine to the float32 model's embedding.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from training.base.encoder import (
    LENGTH_STEP,
    EncoderConfig,
    SegmentEncoder,
    load_backbone,
    load_tokenizer,
    pool_hidden_states,
)
from training.reward_models.models import RewardModelConfig


class BaselineEncoder:
    """The encoder as it was before batch invariance: per-tensor dynamic int8, padded batches."""

    def __init__(self, backbone: str, max_tokens: int = 128) -> None:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        self.tokenizer = load_tokenizer(backbone)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = load_backbone(backbone).eval()
            self.model = quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
        self.max_tokens = max_tokens

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
            )
            hidden = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            out[idx] = F.normalize(pool_hidden_states(hidden, batch["attention_mask"], "mean"), dim=-1).numpy()
        return out


def warehouse_texts(home: str | None, limit: int) -> list[str]:
    """Distinct segment texts of the warehouse's trajectories (empty without a warehouse)."""
    from training.base.states import progress_state
    from training.reward_models.models import state_segments
    from training.reward_models.readers import read_splits, read_trajectories
    from warehouse.catalog import Warehouse

    try:
        warehouse = Warehouse(home)
        ids = sorted(read_splits(warehouse))
    except Exception as error:  # no warehouse, or no split yet: generated texts instead
        print(f"(no warehouse texts: {error}; using generated texts)")
        return []
    config = RewardModelConfig(kind="progrm_lcs")
    texts: dict[str, None] = {}
    rng = random.Random(0)
    rng.shuffle(ids)
    for trajectory in read_trajectories(warehouse, ids[: max(limit // 4, 50)]).values():
        for t in range(len(trajectory)):
            texts.update(dict.fromkeys(state_segments(progress_state(trajectory, t), config).texts))
        if len(texts) >= limit:
            break
    return list(texts)[:limit]


def generated_texts(n: int, seed: int = 0) -> list[str]:
    """Action- and screen-line-shaped texts of 1 to ~80 tokens."""
    rng = random.Random(seed)
    words = (
        "submit cancel ok username password email inbox reply forward delete search flight from to date "
        "button link checkbox textbox tab next previous select option star important"
    ).split()
    texts = []
    for _ in range(n):
        phrase = " ".join(rng.choices(words, k=rng.choice([1, 2, 4, 8, 20, 40])))
        texts.append(f'{rng.choice(["CLICK", "INPUT", "div", "span"])}({phrase} "{rng.randint(0, 9999)}")')
    return list(dict.fromkeys(texts))


def measure(name: str, encode: Callable[..., np.ndarray], texts: list[str], reference: np.ndarray) -> dict:
    encode(texts[:64])  # warm-up
    t0 = time.perf_counter()
    bulk = encode(texts, batch_size=64)
    bulk_rate = len(texts) / (time.perf_counter() - t0)
    calls = [texts[i : i + 5] for i in range(0, min(len(texts), 500), 5)]
    t0 = time.perf_counter()
    for call in calls:
        encode(call)
    small_rate = sum(map(len, calls)) / (time.perf_counter() - t0)
    probe = texts[:: max(1, len(texts) // 60)][:60]
    alone = np.concatenate([encode([t]) for t in probe])
    in_bulk = bulk[[texts.index(t) for t in probe]]
    cosine = np.sum(bulk * reference, axis=1)
    return {
        "encoder": name,
        "bulk texts/s": round(bulk_rate),
        "calls of 5 texts/s": round(small_rate),
        "max |alone - in batch|": float(np.abs(alone - in_bulk).max()),
        "cos to fp32 (min / mean)": f"{cosine.min():.4f} / {cosine.mean():.4f}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", default=None, help="STEPWISE_HOME whose trajectories give the texts")
    parser.add_argument("--texts", type=int, default=3000, help="distinct texts to encode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="96 generated texts (two bulk batches; seconds)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = 96 if args.smoke else args.texts
    texts = [] if args.smoke else warehouse_texts(args.home, n)
    source = "warehouse segments"
    if not texts:
        texts, source = generated_texts(n), "generated texts"
    print(f"{len(texts)} distinct {source}; {args.threads} threads; load average {os.getloadavg()[0]:.1f}")

    fp32 = SegmentEncoder(EncoderConfig(quantize_encoder=False))
    reference = fp32.encode(texts)
    padded_forward = SegmentEncoder(EncoderConfig())
    padded_forward.packed = False
    packed = SegmentEncoder(EncoderConfig())
    rows = [
        measure(
            "baseline: int8 per-tensor, padded batches", BaselineEncoder(fp32.config.backbone).encode, texts, reference
        ),
        measure(
            f"int8 per-row, widths padded to {LENGTH_STEP}, padded forward", padded_forward.encode, texts, reference
        ),
        measure(f"int8 per-row, widths padded to {LENGTH_STEP}, packed (default)", packed.encode, texts, reference),
        measure(f"fp32, widths padded to {LENGTH_STEP}", fp32.encode, texts, reference),
    ]
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.2e}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")
    # The int8 default is exact (integer sums); float32 may differ in its last bit on some CPUs
    # (1.0e-7 on an Intel AVX-512 machine, 2026-11-27), within the 1e-6.
    if rows[1]["max |alone - in batch|"] != 0.0 or rows[2]["max |alone - in batch|"] != 0.0:
        print("bench_encoder: the int8 encoder differed between alone and batched", file=sys.stderr)
        return 1
    if rows[3]["max |alone - in batch|"] > 1e-6:
        print("bench_encoder: the float32 encoder differed between alone and batched by > 1e-6", file=sys.stderr)
        return 1
    if not np.array_equal(packed.encode(texts), padded_forward.encode(texts)):
        print("bench_encoder: the packed forward gave other bits than the padded one", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
