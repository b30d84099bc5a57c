"""Reward models: a pretrained Hugging Face backbone, a pooled representation, an MLP head, a sigmoid.

ProgRM §2.3: ``p̂ = Prog([g, ŝ]; θ)`` is an LLM plus an MLP with a sigmoid output, trained with
binary cross-entropy on soft progress labels (Eq. 5). The ORM and the binary step PRM
(GUI-Shepherd §3) use the same model with outcome / correctness labels; the GuidNav variant
regresses a step reward with MSE (GuidNav Eq. 3). One code path serves any checkpoint that
``AutoModel`` loads: encoder models are mean-pooled (as sentence-transformers pools MiniLM),
decoder models use the hidden state of their last non-padding token.

Two encoder modes, chosen in :class:`RewardModelConfig`:

* ``full`` (the GPU path, e.g. Qwen2.5-7B): the whole prompt of ProgRM Table 7/8 (truncated by
  ``training.reward_models.prompts.truncate_state``) goes through the backbone, which is fine-tuned with the head.
* ``frozen_segments`` (the CPU default, MiniLM): the backbone is frozen and encodes each *segment*
  of the state on its own (the instruction, every history action, every screen element line,
  the candidate action). Segments repeat a lot (the screen barely changes between steps, the
  same buttons appear in every episode of a task), so their embeddings are cached
  (:class:`training.base.encoder.EmbeddingCache`) and a step usually costs one or two new encodings. A small trained
  transformer (:class:`SegmentFusion`) attends over the segment embeddings (with type, recency,
  position and depth embeddings, and each segment's match with the instruction: exact entities,
  shared words, cosine) and its [CLS] output feeds the same MLP head. On CPU the frozen
  encoder's linear layers are int8 (per-row activation scales); every embedding is
  batch-invariant, bit for bit (:class:`training.base.encoder.SegmentEncoder`, shared with the
  policies and the reward sources).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.base.encoder import (
    DEFAULT_BACKBONE_NAME,
    EmbeddingCache,
    EncoderConfig,
    Pooling,
    SegmentEncoder,
    default_backbone,
    encoder_fingerprint,
    is_default_backbone,
    lane_multiple,
    load_backbone,
    load_tokenizer,
    padded_length,
    pool_hidden_states,
    resolve_pooling,
    segment_cache_dir,
)
from training.base.registry import CHECKPOINT_CONFIG_FILE, stale_encoder_reason
from training.base.states import N_MATCH_FEATURES, StepState, instruction_match
from training.reward_models.kinds import kind_spec
from training.reward_models.prompts import TruncationBudget, prompt_parts, render_user_message, truncate_state

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

CONFIG_FILE = CHECKPOINT_CONFIG_FILE
WEIGHTS_FILE = "reward_head.safetensors"
METADATA_FILE = "metadata.json"
BACKBONE_DIR = "backbone"


# Segment types (the fusion transformer's type embedding).
SEG_CLS, SEG_INSTRUCTION, SEG_CANDIDATE, SEG_HISTORY, SEG_ELEMENT = 0, 1, 2, 3, 4
N_SEGMENT_TYPES = 5
MAX_DEPTH = 15
MAX_COUNT = 63


@dataclass
class RewardModelConfig:
    """A reward model's architecture. Saved next to its weights as ``reward_model_config.json``."""

    kind: str = "progrm_lcs"
    backbone: str = field(default="", metadata={"help": "Hugging Face checkpoint (path or id); empty: MiniLM"})
    encoder_mode: str = field(default="frozen_segments", metadata={"help": "frozen_segments (CPU) | full (GPU)"})
    pooling: str = field(default="auto", metadata={"help": "auto | mean | last_token | cls"})
    # frozen_segments
    quantize_encoder: bool = field(
        default=True, metadata={"help": "int8 linear layers (per-row activation scales) in the frozen encoder on CPU"}
    )
    segment_max_tokens: int = 128
    max_history: int = 32
    max_elements: int = 96
    fusion_dim: int = 128
    fusion_layers: int = 2
    fusion_heads: int = 4
    # full
    max_length: int = field(default=1024, metadata={"help": "full mode: token budget of the prompt"})
    keep_recent_actions: int = 3
    use_chat_template: bool = True
    # head
    head_hidden: int = 128
    dropout: float = 0.1
    # loss
    pair_weight: float = field(
        default=1.0,
        metadata={"help": "weight of the pairwise loss over alternatives at one state (examples sharing a group_id)"},
    )

    def __post_init__(self) -> None:
        kind_spec(self.kind)
        if not self.backbone or self.backbone == DEFAULT_BACKBONE_NAME:
            self.backbone = default_backbone()
        if self.encoder_mode not in ("frozen_segments", "full"):
            raise ValueError(f"encoder_mode must be frozen_segments or full, got {self.encoder_mode!r}")
        if self.pooling not in ("auto", "mean", "last_token", "cls"):
            raise ValueError(f"pooling must be auto, mean, last_token or cls, got {self.pooling!r}")

    @property
    def loss(self) -> str:
        return kind_spec(self.kind).loss

    def encoder_config(self) -> EncoderConfig:
        """The frozen encoder this model reads its segments with (its fields of the same names)."""
        return EncoderConfig(self.backbone, self.pooling, self.quantize_encoder, self.segment_max_tokens)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if is_default_backbone(data["backbone"]):
            data["backbone"] = DEFAULT_BACKBONE_NAME
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewardModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------------------------------------
# States -> segments (frozen_segments mode)

#: Batches of states are filled to a multiple of this many rows before the fusion and head run: the
#: row count of a matrix product is as much a reduction layout as the width (8 sufficed on this
#: AVX-512 machine in every test, but nothing said why; a lane multiple holds by the argument of
#: :func:`padded_length`).
ROW_MULTIPLE = lane_multiple()


def _informative(line: str) -> bool:
    return '"' in line or "[" in line or "=" in line


@dataclass(frozen=True, slots=True)
class StateSegments:
    """One state as segments: texts with their type, position and depth, plus the history length."""

    texts: tuple[str, ...]
    types: tuple[int, ...]
    positions: tuple[int, ...]
    depths: tuple[int, ...]
    history_length: int


def state_segments(state: StepState, config: RewardModelConfig) -> StateSegments:
    """Split a state into segments: instruction, candidate action, the latest ``max_history``
    actions (position = recency, 0 = latest), and up to ``max_elements`` screen lines (position =
    document order, depth = indentation). Beyond ``max_elements``, lines with text, values or
    flags are kept before bare containers."""
    texts = [state.instruction]
    types = [SEG_INSTRUCTION]
    positions = [0]
    depths = [0]
    if state.action is not None:
        texts.append(state.action)
        types.append(SEG_CANDIDATE)
        positions.append(0)
        depths.append(0)
    history = state.history[-config.max_history :]
    for recency, action in enumerate(reversed(history)):
        texts.append(action)
        types.append(SEG_HISTORY)
        positions.append(recency)
        depths.append(0)
    lines = state.screen_lines
    chosen: Sequence[int] = range(len(lines))
    if len(lines) > config.max_elements:
        informative = [i for i, line in enumerate(lines) if _informative(line)]
        rest = [i for i, line in enumerate(lines) if not _informative(line)]
        chosen = sorted((informative + rest)[: config.max_elements])
    for order, i in enumerate(chosen):
        line = lines[i]
        stripped = line.lstrip(" ")
        texts.append(stripped or "(empty)")
        types.append(SEG_ELEMENT)
        positions.append(order)
        depths.append(min(MAX_DEPTH, (len(line) - len(stripped)) // 2))
    return StateSegments(tuple(texts), tuple(types), tuple(positions), tuple(depths), len(state.history))


@dataclass
class SegmentFeatures:
    """Segments of many states as cache row indices (ragged: ``offsets`` delimit each state)."""

    rows: np.ndarray  # int64, all states' segment rows concatenated
    types: np.ndarray  # int8
    positions: np.ndarray  # int16
    depths: np.ndarray  # int8
    offsets: np.ndarray  # int64, n_states + 1
    history_lengths: np.ndarray  # int32
    match: np.ndarray  # float32 (n_segments, N_MATCH_FEATURES): instruction_match of each segment

    def __len__(self) -> int:
        return len(self.offsets) - 1


def segment_features(states: Sequence[StepState], cache: EmbeddingCache, config: RewardModelConfig) -> SegmentFeatures:
    """Encode (through the cache) every segment of ``states``; new texts are encoded in one pass."""
    segs = [state_segments(s, config) for s in states]
    lengths = np.fromiter((len(s.texts) for s in segs), dtype=np.int64, count=len(segs))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    all_texts = [t for s in segs for t in s.texts]
    rows = cache.indices(all_texts)
    match = np.zeros((len(all_texts), N_MATCH_FEATURES), dtype=np.float32)
    memo: dict[tuple[str, str], tuple[float, ...]] = {}
    k = 0
    for state, seg in zip(states, segs, strict=True):
        for text, kind in zip(seg.texts, seg.types, strict=True):
            if kind != SEG_INSTRUCTION:
                key = (state.instruction, text)
                if key not in memo:
                    memo[key] = instruction_match(state.instruction, text)
                match[k] = memo[key]
            k += 1
    return SegmentFeatures(
        rows=rows,
        types=np.fromiter((x for s in segs for x in s.types), dtype=np.int8, count=len(all_texts)),
        positions=np.fromiter((x for s in segs for x in s.positions), dtype=np.int16, count=len(all_texts)),
        depths=np.fromiter((x for s in segs for x in s.depths), dtype=np.int8, count=len(all_texts)),
        offsets=offsets,
        history_lengths=np.fromiter((s.history_length for s in segs), dtype=np.int32, count=len(segs)),
        match=match,
    )


def collate_segments(
    features: SegmentFeatures, items: Sequence[int] | np.ndarray, matrix: torch.Tensor, width: int | None = None
) -> dict[str, torch.Tensor]:
    """A padded batch for :class:`SegmentFusion` from states ``items`` of ``features``, padded to
    ``width`` segments (default: the longest state's count)."""
    starts, ends = features.offsets[items], features.offsets[np.asarray(items) + 1]
    longest = int((ends - starts).max()) if len(items) else 0
    if width is None:
        width = longest
    elif width < longest:
        raise ValueError(f"width {width} is shorter than a state of {longest} segments")
    batch = len(items)
    rows = np.zeros((batch, width), dtype=np.int64)
    types = np.zeros((batch, width), dtype=np.int64)
    positions = np.zeros((batch, width), dtype=np.int64)
    depths = np.zeros((batch, width), dtype=np.int64)
    mask = np.zeros((batch, width), dtype=bool)
    match = np.zeros((batch, width, N_MATCH_FEATURES), dtype=np.float32)
    for b, (s, e) in enumerate(zip(starts, ends, strict=True)):
        n = e - s
        match[b, :n] = features.match[s:e]
        rows[b, :n] = features.rows[s:e]
        types[b, :n] = features.types[s:e]
        positions[b, :n] = features.positions[s:e]
        depths[b, :n] = features.depths[s:e]
        mask[b, :n] = True
    return {
        "segment_embeddings": matrix[torch.from_numpy(rows)],
        "segment_types": torch.from_numpy(types),
        "segment_positions": torch.from_numpy(positions),
        "segment_depths": torch.from_numpy(depths),
        "segment_mask": torch.from_numpy(mask),
        "segment_match": torch.from_numpy(match),
        "history_lengths": torch.from_numpy(np.minimum(features.history_lengths[items], MAX_COUNT).astype(np.int64)),
    }


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------


class SegmentFusion(nn.Module):
    """A small transformer over frozen segment embeddings; returns its [CLS] state.

    Each segment's embedding is projected and tagged with its type, position (recency for
    history actions, document order for screen elements) and depth; the [CLS] token carries
    the number of actions taken so far. Self-attention lets the instruction meet the screen's
    values and the actions (did the typed text match the requested one?).
    """

    def __init__(self, input_dim: int, config: RewardModelConfig) -> None:
        super().__init__()
        d = config.fusion_dim
        self.project = nn.Sequential(nn.Linear(input_dim, d), nn.LayerNorm(d))
        # instruction match: the lexical features and the cosine to the instruction's embedding
        self.match_projection = nn.Linear(N_MATCH_FEATURES + 1, d)
        self.type_embedding = nn.Embedding(N_SEGMENT_TYPES, d)
        self.position_embedding = nn.Embedding(max(config.max_history, config.max_elements) + 1, d)
        self.depth_embedding = nn.Embedding(MAX_DEPTH + 1, d)
        self.count_embedding = nn.Embedding(MAX_COUNT + 1, d)
        self.cls = nn.Parameter(torch.zeros(d))
        layer = nn.TransformerEncoderLayer(
            d, config.fusion_heads, 2 * d, config.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.fusion_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.max_position = max(config.max_history, config.max_elements)

    def forward(
        self,
        segment_embeddings: torch.Tensor,
        segment_types: torch.Tensor,
        segment_positions: torch.Tensor,
        segment_depths: torch.Tensor,
        segment_mask: torch.Tensor,
        history_lengths: torch.Tensor,
        segment_match: torch.Tensor,
    ) -> torch.Tensor:
        embeddings = segment_embeddings.to(self.cls.dtype)
        # segment 0 is the instruction; embeddings are L2-normalised, so this is a cosine
        cosine = (embeddings * embeddings[:, :1]).sum(-1, keepdim=True)
        match = torch.cat([segment_match.to(embeddings.dtype), cosine], dim=-1)
        x = (
            self.project(embeddings)
            + self.match_projection(match)
            + self.type_embedding(segment_types)
            + self.position_embedding(segment_positions.clamp(0, self.max_position))
            + self.depth_embedding(segment_depths.clamp(0, MAX_DEPTH))
        )
        cls = (self.cls + self.type_embedding.weight[SEG_CLS]).expand(x.shape[0], 1, -1)
        cls = cls + self.count_embedding(history_lengths.clamp(0, MAX_COUNT)).unsqueeze(1)
        x = torch.cat([cls, x], dim=1)
        keep = torch.cat([torch.ones_like(segment_mask[:, :1]), segment_mask], dim=1)
        x = self.encoder(x, src_key_padding_mask=~keep)
        return self.norm(x[:, 0])


class RewardHead(nn.Module):
    """The MLP of ProgRM §2.3: pooled representation -> hidden -> one logit (sigmoid outside)."""

    def __init__(self, input_dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(pooled).squeeze(-1)


def reward_loss(
    logits: torch.Tensor, labels: torch.Tensor, loss: str, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """BCE on soft labels (ProgRM Eq. 5; also ORM and binary PRM) or MSE on sigmoid outputs
    (GuidNav Eq. 3). Computed in float32 (bf16/fp16 training). With ``weights`` (within-task
    balancing, :mod:`training.reward_models.balance`), the batch mean of the weighted losses."""
    logits, labels = logits.float(), labels.float()
    reduction = "mean" if weights is None else "none"
    if loss == "bce":
        losses = F.binary_cross_entropy_with_logits(logits, labels, reduction=reduction)
    elif loss == "mse":
        losses = F.mse_loss(torch.sigmoid(logits), labels, reduction=reduction)
    else:
        raise ValueError(f"unknown loss {loss!r}")
    return losses if weights is None else (losses * weights.float().reshape(losses.shape)).mean()


def pairwise_loss(logits: torch.Tensor, groups: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The ranking loss over alternatives at one state (RankNet / Bradley-Terry): for every pair of
    examples of the batch in the same group (``groups`` >= 0: the same state) whose values differ,
    ``-log sigmoid(z_better - z_worse)``, weighted by how much the values differ (a Monte-Carlo
    difference of one continuation in four counts a quarter of a sure one). A weighted mean over
    the pairs; 0 when the batch has no such pair. In float32."""
    z, v = logits.float().reshape(-1), values.float().reshape(-1)
    g = groups.reshape(-1)
    same = (g[:, None] == g[None, :]) & (g[:, None] >= 0)
    gap = v[:, None] - v[None, :]
    weight = torch.where(same & (gap > 0), gap, torch.zeros_like(gap))
    total = weight.sum()
    if total <= 0:
        return z.sum() * 0.0  # keeps the graph (and DeepSpeed's gradient hooks) intact
    return (weight * F.softplus(-(z[:, None] - z[None, :]))).sum() / total


class RewardModel(nn.Module):
    """Backbone (full mode) or segment fusion (frozen_segments mode), then the MLP head.

    ``forward`` returns ``{"loss", "logits"}`` as the Hugging Face Trainer expects; scores are
    ``sigmoid(logits)`` in [0, 1].
    """

    #: The loss is a per-batch mean: the Trainer must average it over gradient-accumulation steps
    #: itself (it would otherwise expect a sum normalised by ``num_items_in_batch``).
    accepts_loss_kwargs = False

    def __init__(
        self, config: RewardModelConfig, *, backbone: PreTrainedModel | None = None, input_dim: int | None = None
    ) -> None:
        super().__init__()
        self.rm_config = config  # not `config`: the Trainer reads `model.config` as a PretrainedConfig
        self.backbone: PreTrainedModel | None
        self.fusion: SegmentFusion | None
        self.pooling: Pooling | None  # full mode; frozen mode has none (the SegmentEncoder pools)
        if config.encoder_mode == "full":
            if backbone is None:
                raise ValueError("full mode needs the backbone module")
            self.backbone = backbone
            self.fusion = None
            self.pooling = resolve_pooling(backbone.config, config.pooling)
            width = int(backbone.config.hidden_size)
        else:
            if input_dim is None:
                raise ValueError("frozen_segments mode needs the encoder's embedding width (input_dim)")
            self.backbone = None
            self.fusion = SegmentFusion(input_dim, config)
            self.pooling = None
            width = config.fusion_dim
        self.input_dim = input_dim
        self.head = RewardHead(width, config.head_hidden, config.dropout)

    def forward(
        self,
        labels: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        segment_embeddings: torch.Tensor | None = None,
        segment_types: torch.Tensor | None = None,
        segment_positions: torch.Tensor | None = None,
        segment_depths: torch.Tensor | None = None,
        segment_mask: torch.Tensor | None = None,
        history_lengths: torch.Tensor | None = None,
        segment_match: torch.Tensor | None = None,
        groups: torch.Tensor | None = None,
        rank_values: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        **unused: object,  # e.g. the Trainer's num_items_in_batch
    ) -> dict[str, torch.Tensor]:
        if self.backbone is not None:
            assert self.pooling is not None  # resolved with the backbone
            if attention_mask is None:
                raise ValueError("full mode needs the attention_mask of input_ids")
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
            pooled = pool_hidden_states(out.last_hidden_state, attention_mask, self.pooling)
            logits = self.head(pooled.to(next(self.head.parameters()).dtype))
        else:
            assert self.fusion is not None  # frozen_segments mode
            logits = self.head(
                self.fusion(
                    segment_embeddings,
                    segment_types,
                    segment_positions,
                    segment_depths,
                    segment_mask,
                    history_lengths,
                    segment_match,
                )
            )
        result = {"logits": logits}
        if labels is not None:
            loss = reward_loss(logits, labels, self.rm_config.loss, weights)
            if groups is not None and rank_values is not None and self.rm_config.pair_weight > 0:
                loss = loss + self.rm_config.pair_weight * pairwise_loss(logits, groups, rank_values)
            result = {"loss": loss, "logits": logits}
        return result

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """What the Trainer calls for ``--activation_checkpointing``: checkpoint the backbone's layers
        (full mode; the frozen-segment fusion is small and has nothing to gain)."""
        if self.backbone is not None:
            self.backbone.activation_checkpointing_enable(
                activation_checkpointing_kwargs=activation_checkpointing_kwargs,
                every_n_layers=every_n_layers,
                offload=offload,
            )

    @property
    def is_activation_checkpointing(self) -> bool:
        return bool(getattr(self.backbone, "is_activation_checkpointing", False))

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything that is not the frozen backbone (frozen mode) / everything (full mode)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Prompts for full mode
# ---------------------------------------------------------------------------------------------


def prompt_texts(states: Sequence[StepState], kind: str, tokenizer, config: RewardModelConfig) -> list[str]:
    """Render states with the kind's prompt (Tables 7/8), truncated to ``config.max_length``
    tokens of ``tokenizer`` by the rule of ``training.reward_models.prompts.truncate_state``; with the
    tokenizer's chat template (system + user, generation prompt) when it has one."""
    system, _ = prompt_parts(kind)
    use_template = bool(config.use_chat_template and getattr(tokenizer, "chat_template", None))

    def count(texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    frame = render_user_message(kind, truncate_state(StepState("", (), ()), TruncationBudget(max_tokens=10**6), count))
    overhead = count([system])[0] + count([frame])[0] + 32
    budget = TruncationBudget(max_tokens=config.max_length, keep_recent_actions=config.keep_recent_actions)
    texts = []
    for state in states:
        user = render_user_message(kind, truncate_state(state, budget, count, overhead_tokens=overhead))
        if use_template:
            texts.append(
                tokenizer.apply_chat_template(
                    [{"role": "system", "content": system}, {"role": "user", "content": user}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
        else:
            texts.append(f"System: {system}\nUser: {user}")
    return texts


def tokenize_prompts(texts: Sequence[str], tokenizer, max_length: int) -> dict[str, torch.Tensor]:
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


# ---------------------------------------------------------------------------------------------
# Building, saving, loading, scoring
# ---------------------------------------------------------------------------------------------


def build_reward_model(
    config: RewardModelConfig, *, torch_dtype: torch.dtype | None = None, input_dim: int | None = None
) -> RewardModel:
    """A fresh model: the pretrained backbone (full mode) or an untrained fusion (frozen mode)."""
    if config.encoder_mode == "full":
        return RewardModel(config, backbone=load_backbone(config.backbone, torch_dtype=torch_dtype))
    if input_dim is None:
        from transformers import AutoConfig

        input_dim = int(AutoConfig.from_pretrained(config.backbone).hidden_size)
    return RewardModel(config, input_dim=input_dim)


def save_reward_model(
    model: RewardModel, directory: Path | str, *, tokenizer=None, metadata: dict | None = None
) -> Path:
    """Export a trained model: config, weights (safetensors), metadata; full mode also writes the
    fine-tuned backbone (``save_pretrained``) and tokenizer under ``backbone/``. Written to a
    temporary folder and renamed into place."""
    from safetensors.torch import save_file

    from warehouse.storage import replace_dir_atomic

    def write(tmp: Path) -> None:
        config = RewardModelConfig.from_dict(model.rm_config.to_dict())
        if model.backbone is not None:
            model.backbone.save_pretrained(tmp / BACKBONE_DIR)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp / BACKBONE_DIR)
            config.backbone = BACKBONE_DIR
            state = {k: v for k, v in model.trainable_state_dict().items() if not k.startswith("backbone.")}
        else:
            state = model.trainable_state_dict()
        save_file(state, str(tmp / WEIGHTS_FILE))
        payload = config.to_dict() | {"input_dim": model.input_dim}
        if config.encoder_mode == "frozen_segments":  # the embeddings the model was trained on (CPU)
            payload["encoder_fingerprint"] = encoder_fingerprint(config.encoder_config(), config.quantize_encoder)
        (tmp / CONFIG_FILE).write_text(json.dumps(payload, indent=2))
        (tmp / METADATA_FILE).write_text(json.dumps(metadata or {}, indent=2, default=str))

    directory = Path(directory)
    replace_dir_atomic(directory, write)
    return directory


def read_model_config(directory: Path | str) -> tuple[RewardModelConfig, int | None]:
    directory = Path(directory)
    data = json.loads((directory / CONFIG_FILE).read_text())
    config = RewardModelConfig.from_dict(data)
    if config.encoder_mode == "full" and not Path(config.backbone).is_absolute():
        config.backbone = str(directory / config.backbone)
    return config, data.get("input_dim")


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    """The logistic function in float64, element by element: the same bits for a logit however
    many share its array (torch's float32 kernel takes another path for an array's tail)."""
    return 1.0 / (1.0 + np.exp(-logits))


def width_batches(widths: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Batches that keep each row's score independent of the others: rows of one padded width
    together, at most ``batch_size`` of them, filled to a multiple of :data:`ROW_MULTIPLE` rows by
    repeating them (the CPU's matrix kernels round differently for a few rows than for many).
    Yields (the rows' indices, the filled indices, the width)."""
    for width in np.unique(widths):
        members = np.flatnonzero(widths == width)
        for start in range(0, len(members), batch_size):
            items = members[start : start + batch_size]
            yield items, np.resize(items, -(-len(items) // ROW_MULTIPLE) * ROW_MULTIPLE), int(width)


@dataclass
class SharedSegmentEncoders:
    """One frozen segment encoder and one embedding cache per encoder (its config and device), for
    the scorers one process loads side by side (the report scores every kind, the flywheel every
    round's models): MiniLM loads once and each segment text is encoded once, whichever model meets
    it first. A score does not change: the encoder is batch-invariant, so an embedding has the same
    bits whichever call encoded it. For scorers used one call at a time, as a report does: a
    server scoring from several threads keeps a cache per scorer (a shared cache evicting under
    one call could move rows another call is reading)."""

    by_encoder: dict[tuple[str, str], tuple[SegmentEncoder, EmbeddingCache]] = field(default_factory=dict)
    _warmed: set[int] = field(default_factory=set)  # the caches already warmed from a home

    def load(self, checkpoint: Path | str, home: Path | str | None = None) -> RewardScorer:
        """A scorer of ``checkpoint`` on the shared encoder and cache; the cache warmed from the
        segments ``home``'s training saved (:meth:`RewardScorer.load_home_cache`) once."""
        scorer = RewardScorer.from_checkpoint(checkpoint, shared=self)
        if home is not None and scorer.cache is not None and id(scorer.cache) not in self._warmed:
            self._warmed.add(id(scorer.cache))
            scorer.load_home_cache(home)
        return scorer


class RewardScorer:
    """A trained reward model ready to score states (the batch scoring API).

    ``score_states`` returns sigmoid outputs in [0, 1]; in frozen mode segment embeddings go
    through an :class:`EmbeddingCache` (optionally warm-started from a saved cache).
    """

    def __init__(
        self,
        model: RewardModel,
        *,
        encoder: SegmentEncoder | None = None,
        tokenizer=None,
        device: str | torch.device = "cpu",
        metadata: dict | None = None,
        max_cache_entries: int = 500_000,
        cache: EmbeddingCache | None = None,
    ) -> None:
        self.model = model.eval().to(device)
        self.config = model.rm_config
        self.kind = model.rm_config.kind
        self.device = torch.device(device)
        self.encoder = encoder
        if cache is None and encoder is not None:
            cache = EmbeddingCache(encoder, max_entries=max_cache_entries)
        self.cache = cache
        self.tokenizer = tokenizer
        self.metadata = metadata or {}
        self._lock = threading.Lock()

    @classmethod
    def from_checkpoint(
        cls,
        directory: Path | str,
        *,
        device: str | torch.device = "cpu",
        warm_cache: Path | str | None = None,
        torch_dtype: torch.dtype | None = None,
        shared: SharedSegmentEncoders | None = None,
    ) -> RewardScorer:
        """Load an exported model. ``torch_dtype`` (e.g. ``torch.bfloat16`` on a GPU) applies to a
        full-mode backbone; ``warm_cache`` is a saved segment cache to start from (frozen mode);
        ``shared``: take the segment encoder and cache from it where a scorer loaded before has
        the same encoder, and leave this one's there for the next."""
        from safetensors.torch import load_file

        directory = Path(directory)
        config, input_dim = read_model_config(directory)
        metadata = json.loads((directory / METADATA_FILE).read_text()) if (directory / METADATA_FILE).exists() else {}
        if config.encoder_mode == "full":
            model = build_reward_model(config, torch_dtype=torch_dtype)
            state = load_file(str(directory / WEIGHTS_FILE))
            missing, unexpected = model.load_state_dict(state, strict=False)
            if unexpected or any(not k.startswith("backbone.") for k in missing):
                raise ValueError(f"checkpoint {directory} does not match its config: {unexpected or missing}")
            return cls(model, tokenizer=load_tokenizer(config.backbone), device=device, metadata=metadata)
        key = (repr(config.encoder_config()), str(torch.device(device)))
        encoder, cache = shared.by_encoder[key] if shared is not None and key in shared.by_encoder else (None, None)
        encoder = encoder or SegmentEncoder.shared(config.encoder_config(), device=device)
        if encoder.device.type == "cpu" and (stale := stale_encoder_reason(directory)):
            raise ValueError(stale)
        model = RewardModel(config, input_dim=input_dim or encoder.hidden_size)
        model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)))
        scorer = cls(model, encoder=encoder, device=device, metadata=metadata, cache=cache)
        if shared is not None and scorer.cache is not None:
            shared.by_encoder.setdefault(key, (encoder, scorer.cache))
        if warm_cache is not None and scorer.cache is not None:  # (it is: the scorer has an encoder)
            scorer.cache.load(warm_cache)
        return scorer

    def with_own_cache(self, home: Path | str | None = None) -> RewardScorer:
        """This model and encoder with a cache of its own, warmed from ``home``'s saved segments
        only: what a scorer loaded alone meets (a report times each kind's single calls on one, so
        no kind is timed on segments another kind's scoring encoded)."""
        scorer = RewardScorer(
            self.model, encoder=self.encoder, tokenizer=self.tokenizer, device=self.device, metadata=self.metadata
        )
        if home is not None:
            scorer.load_home_cache(home)
        return scorer

    def encode_segments(self, states: Sequence[StepState]) -> None:
        """Encode the segments of ``states`` that the cache lacks (frozen mode; nothing in full mode)."""
        if self.cache is not None:
            with self._lock:
                segment_features(states, self.cache, self.config)

    def load_home_cache(self, home: Path | str) -> int:
        """Start from the segment cache that training saved under ``home`` (frozen mode; same
        encoder only). Returns the number of entries loaded."""
        if self.cache is None or self.encoder is None:
            return 0
        return self.cache.load(segment_cache_dir(home, self.encoder.fingerprint))

    @torch.inference_mode()
    def score_states(self, states: Sequence[StepState], batch_size: int = 256) -> np.ndarray:
        """Scores in [0, 1] of ``states`` (float64 array, same order)."""
        if not states:
            return np.zeros(0)
        with self._lock:
            if self.cache is not None:  # frozen mode (the cache comes with the encoder)
                features = segment_features(states, self.cache, self.config)
                matrix = torch.from_numpy(self.cache.matrix)
                # A state's score must not depend on the states that share its batch: states are
                # batched with others of the same padded segment count (the fusion prepends its
                # [CLS], so the encoder's padding rule alone does not suffice), and a batch is
                # filled up to a multiple of ROW_MULTIPLE states, since the CPU's matrix kernels
                # round differently for a few rows than for many
                # (tests/training/reward_models/test_batch_invariance.py).
                widths = np.array([padded_length(int(n)) for n in np.diff(features.offsets)])
                scores = np.zeros(len(states), dtype=np.float64)
                for items, filled, width in width_batches(widths, batch_size):
                    collated = collate_segments(features, filled, matrix, width=width)
                    batch = {k: v.to(self.device) for k, v in collated.items()}
                    logits = self.model(**batch)["logits"].float()[: len(items)]
                    scores[items] = _sigmoid(logits.cpu().double().numpy())
                return scores
            texts = prompt_texts(states, self.kind, self.tokenizer, self.config)
            token_ids = self.tokenizer(texts, truncation=True, max_length=self.config.max_length)["input_ids"]
            return self._score_prompt_tokens(token_ids, batch_size)

    def _score_prompt_tokens(self, token_ids: Sequence[Sequence[int]], batch_size: int) -> np.ndarray:
        """Full mode, as batch-invariant as the frozen path: a prompt is batched only with prompts
        of its lane-padded width (:func:`padded_length`, capped at the backbone's positions) and a
        batch is filled to ROW_MULTIPLE rows, so its score does not depend on what else is scored
        (with width-padded batches, SmolLM2's float32 scores differed in the 7th digit alone and
        beside another state on this machine)."""
        pad_id = int(self.tokenizer.pad_token_id or 0)
        positions = getattr(getattr(self.model.backbone, "config", None), "max_position_embeddings", None)
        limit = int(positions or 10**9)
        widths = np.array([min(padded_length(len(ids)), limit) for ids in token_ids])
        scores = np.zeros(len(token_ids), dtype=np.float64)
        for items, filled, width in width_batches(widths, batch_size):
            ids = np.full((len(filled), width), pad_id, dtype=np.int64)
            mask = np.zeros((len(filled), width), dtype=np.int64)
            for row, i in enumerate(filled.tolist()):
                ids[row, : len(token_ids[i])] = token_ids[i]
                mask[row, : len(token_ids[i])] = 1
            batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
            logits = self.model(**{k: v.to(self.device) for k, v in batch.items()})["logits"].float()
            scores[items] = _sigmoid(logits[: len(items)].cpu().double().numpy())
        return scores
