"""Encoder A/B in one process: another version of ``training/base/encoder.py`` (e.g. the previous
commit's), this checkout's, and the encoder before batch invariance, on the same warehouse
segments, interleaved, median texts/s over ``--repeats`` rounds; and whether the two versions give
the same bits. What docs/performance.md's encoder table came from.

    git show HEAD~1:training/base/encoder.py > /tmp/encoder_old.py
    .venv/bin/python scripts/encoder_ab.py --old /tmp/encoder_old.py --home .stepwise
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="another encoder.py to compare with this checkout's")
    parser.add_argument("--home", required=True, help="STEPWISE_HOME whose trajectories give the texts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from bench_encoder import BaselineEncoder, warehouse_texts

    from training.base import encoder as new

    torch.set_num_threads(2)
    spec = importlib.util.spec_from_file_location("encoder_old", args.old)
    if spec is None or spec.loader is None:
        raise SystemExit(f"encoder_ab: cannot load {args.old}")
    old = importlib.util.module_from_spec(spec)
    sys.modules["encoder_old"] = old  # dataclasses look their module up
    spec.loader.exec_module(old)
    texts = warehouse_texts(args.home, 2000)
    if len(texts) < 2000:
        raise SystemExit(f"encoder_ab: {args.home} holds {len(texts)} distinct segments; 2,000 are needed")
    encoders = {
        "other version": old.SegmentEncoder(old.EncoderConfig()),
        "this checkout": new.SegmentEncoder(new.EncoderConfig()),
        "before batch invariance": BaselineEncoder(new.default_backbone(), new.EncoderConfig().segment_max_tokens),
    }
    for encoder in encoders.values():
        encoder.encode(texts[:50])  # kernels and thread pools started
    bulk: dict[str, list[float]] = {name: [] for name in encoders}
    fives: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(args.repeats):
        for name, encoder in encoders.items():
            started = time.perf_counter()
            encoder.encode(texts[:1500])
            bulk[name].append(1500 / (time.perf_counter() - started))
            started = time.perf_counter()
            for i in range(1500, 2000, 5):
                encoder.encode(texts[i : i + 5])
            fives[name].append(500 / (time.perf_counter() - started))
    print(f"| encoder | bulk texts/s | calls of 5 texts/s |  (median of {args.repeats})\n|---|---:|---:|")
    for name in encoders:
        print(f"| {name} | {statistics.median(bulk[name]):.0f} | {statistics.median(fives[name]):.0f} |")
    same = np.array_equal(encoders["other version"].encode(texts[:300]), encoders["this checkout"].encode(texts[:300]))
    print(f"the two versions give the same bits on 300 texts: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
