"""Text similarity for Eq. (9): the cached MiniLM embedder and the model-free stand-in."""

from __future__ import annotations

import numpy as np
import pytest

from annotation.progress.soft_lcs import build_match_table
from annotation.progress.text_similarity import (
    SIMILARITY_RESOLUTION,
    HashingTextEmbedder,
    TextEmbedder,
    quantise_similarity,
    text_similarity_matrix,
)
from warehouse.model import Action, ActionType, UIElement


@pytest.fixture(scope="module")
def minilm() -> TextEmbedder:
    return TextEmbedder()


def test_minilm_scores_a_paraphrased_field_value_above_unrelated_text(minilm: TextEmbedder) -> None:
    related = minilm.similarity("username vanda", "vanda")
    unrelated = minilm.similarity("vanda", "the quarterly report is due on friday")
    assert 0.0 <= unrelated < related <= 1.0
    assert related > 0.5
    assert minilm.similarity("vanda", "vanda") == 1.0


def test_minilm_embeds_each_distinct_text_once(minilm: TextEmbedder) -> None:
    before = minilm.texts_encoded
    vectors = minilm.embed(["alpha beta", "gamma", "alpha beta"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float64
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert minilm.texts_encoded == before + 2
    minilm.embed(["gamma", "alpha beta"])
    assert minilm.texts_encoded == before + 2


def test_minilm_drives_the_soft_match_of_inputs(minilm: TextEmbedder) -> None:
    field = UIElement(ref="f", role="textbox", element_id="username")
    actions = [Action(ActionType.INPUT, field, text=t) for t in ("vanda", "username vanda", "42 apples")]
    table = build_match_table([actions], minilm)
    vanda, username_vanda, apples = table.encode(actions).tolist()
    assert table.scores[vanda, username_vanda] > table.scores[vanda, apples]


def test_hashing_embedder_is_deterministic_and_graded() -> None:
    first, second = HashingTextEmbedder(), HashingTextEmbedder()
    assert np.array_equal(first.embed(["vanda", "blue car"]), second.embed(["vanda", "blue car"]))
    assert first.similarity("username vanda", "vanda") > first.similarity("blue car", "vanda")
    assert first.embed([]).shape == (0, first.dimension)


def test_similarities_are_clipped_quantised_and_one_for_identical_texts() -> None:
    values = quantise_similarity(np.array([-0.3, 0.123456789, 1.0000001]))
    assert values[0] == 0.0 and values[2] == 1.0
    assert values[1] / SIMILARITY_RESOLUTION == round(values[1] / SIMILARITY_RESOLUTION)
    matrix = text_similarity_matrix(["a b", "c", "a b"], ["a b", "c"], HashingTextEmbedder())
    assert matrix[0, 0] == matrix[2, 0] == matrix[1, 1] == 1.0
    assert ((matrix >= 0) & (matrix <= 1)).all()
