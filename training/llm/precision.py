"""Acting with a lower-precision copy of the policy on the CPU (issue 25 item 2: bf16 or int8).

:func:`acting_copy` returns a copy for acting only: ``bf16`` casts every weight to bfloat16 (this
CPU has AVX512-BF16, so oneDNN runs bf16 matrix products natively); ``int8`` is torch's dynamic
quantisation of the Linear layers (weights int8 per tensor, activations quantised on the fly).
The learner trains the float32 model, so a turn recorded by a copy is off-policy by the copy's
rounding: its ``logp`` is not the float32 policy's. An RL loop that acts with a copy must make the
learner recompute the old log-probs (``LLMLearnerSettings(recompute_logp_old=True)``) and refresh
the copy after every update; :func:`logp_drift` measures how far the copy is from the original
on recorded turns (the benchmark reports it). Measured figures: ``docs/llm.md``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

PRECISIONS = ("fp32", "bf16", "int8")


def acting_copy(model: Any, precision: str) -> Any:
    """A copy of ``model`` in ``precision`` (``fp32``: the model itself, no copy), in eval mode."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "fp32":
        return model
    clone = copy.deepcopy(model).eval()
    if precision == "bf16":
        return clone.to(torch.bfloat16)
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(clone, {torch.nn.Linear}, dtype=torch.qint8)


def logp_drift(reference: Any, other: Any, turns: Sequence[Any], *, pad_id: int = 0) -> dict[str, float]:
    """How far ``other`` acts from ``reference`` on recorded turns (``TurnRecord``s, constrained or
    not): the mean absolute difference of the (masked) log-probs of the chosen tokens, and the
    share of chosen tokens and of whole answers where ``other``'s greedy choice under the same
    mask is the recorded token (the recorded turns should be greedy ones of ``reference``)."""
    from training.llm.action_grammar import masks_matrix

    diffs: list[float] = []
    agree_tokens = total_tokens = agree_answers = 0
    with torch.inference_mode():
        for turn in turns:
            ids = torch.from_numpy(np.concatenate([turn.prompt_ids, turn.response_ids]))[None]
            start = len(turn.prompt_ids) - 1
            rows = []
            keep = ids.shape[1] - start  # only the positions that predict response tokens
            for model in (reference, other):
                logits = model(input_ids=ids, logits_to_keep=keep).logits[0, : turn.n_tokens].float()
                if turn.masks is not None:
                    allowed = torch.from_numpy(masks_matrix(turn.masks, logits.shape[-1]))
                    logits = logits.masked_fill(~allowed, float("-inf"))
                rows.append(logits)
            chosen = (
                np.ones(turn.n_tokens, dtype=bool)
                if turn.masks is None
                else np.asarray([not m.forced for m in turn.masks])
            )
            target = torch.from_numpy(turn.response_ids)
            logps = [torch.log_softmax(r, -1).gather(1, target[:, None]).squeeze(1).numpy() for r in rows]
            diffs.extend(np.abs(logps[0] - logps[1])[chosen].tolist())
            same = (rows[1].argmax(-1) == target).numpy()[chosen]
            agree_tokens += int(same.sum())
            total_tokens += int(chosen.sum())
            agree_answers += int(same.all())
    return {
        "mean_abs_logp_diff": float(np.mean(diffs)) if diffs else 0.0,
        "token_agreement": agree_tokens / max(1, total_tokens),
        "answer_agreement": agree_answers / max(1, len(turns)),
    }
