"""Soft / hard LCS (ProgRM App. A, Eqs. 7-9): the fast batched DP against the reference and rapidfuzz."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import LCSseq

from annotation.progress.soft_lcs import (
    EPSILON_NOTHING,
    SequenceStore,
    action_key,
    build_match_table,
    build_match_tables,
    completion_ratio,
    hard_match,
    lcs_length,
    soft_lcs,
    soft_lcs_alignment_arrays_indexed,
    soft_lcs_alignments,
    soft_lcs_reference,
    soft_lcs_reference_actions,
    soft_lcs_scores,
    soft_lcs_scores_indexed,
    soft_match,
    trajectory_similarity,
)
from annotation.progress.text_similarity import HashingTextEmbedder
from warehouse.model import Action, ActionType, UIElement

FAST = settings(max_examples=200, deadline=None)


def click(element_id: str, text: str = "", ref: str = "r") -> Action:
    return Action(ActionType.CLICK, UIElement(ref=ref, role="button", element_id=element_id, text=text))


def type_into(field: str, text: str) -> Action:
    return Action(ActionType.INPUT, UIElement(ref="f", role="textbox", element_id=field), text=text)


NOTHING = Action(ActionType.NOTHING)
GOBACK = Action(ActionType.GOBACK)


# ---- hard mode is the classic LCS --------------------------------------------------------


@FAST
@given(st.lists(st.integers(0, 5), max_size=25), st.lists(st.integers(0, 5), max_size=25))
def test_hard_lcs_equals_rapidfuzz_on_integers(a: list[int], b: list[int]) -> None:
    assert lcs_length(a, b) == LCSseq.similarity(a, b)


@FAST
@given(st.text(alphabet="abcd", max_size=30), st.text(alphabet="abcd", max_size=30))
def test_hard_lcs_equals_rapidfuzz_on_strings(a: str, b: str) -> None:
    assert lcs_length(a, b) == LCSseq.similarity(a, b)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["ok", "back", "x", "y"]), max_size=15),
            st.lists(st.sampled_from(["ok", "back", "x", "y"]), max_size=15),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_hard_lcs_batched_equals_rapidfuzz(pairs: list[tuple[list[str], list[str]]]) -> None:
    """Many pairs of different shapes in one batch (exercises padding and batch ordering)."""
    vocabulary = {"ok": 0, "back": 1, "x": 2, "y": 3}
    a_seqs = [np.array([vocabulary[s] for s in a], dtype=np.int64) for a, _ in pairs]
    b_seqs = [np.array([vocabulary[s] for s in b], dtype=np.int64) for _, b in pairs]
    scores = soft_lcs_scores(a_seqs, b_seqs, np.eye(4))
    assert scores.tolist() == [float(LCSseq.similarity(a, b)) for a, b in pairs]


def test_hard_mode_table_on_actions_equals_classic_lcs() -> None:
    a = [click("a"), type_into("user", "vanda"), NOTHING, click("b")]
    b = [click("a"), type_into("user", "username vanda"), NOTHING, click("b")]
    table = build_match_table([a, b], mode="hard")
    result = soft_lcs(table.encode(a), table.encode(b), table)
    keys_a, keys_b = [action_key(x) for x in a], [action_key(x) for x in b]
    assert result.score == LCSseq.similarity(keys_a, keys_b) == 3.0
    assert result.pairs == ((0, 0), (2, 2), (3, 3))


# ---- fast == reference on soft inputs ------------------------------------------------------


@st.composite
def soft_problems(draw: st.DrawFn) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """A random symmetric score table in [0, 1] (with exact zeros and ties) and pairs of symbol sequences."""
    n_symbols = draw(st.integers(1, 6))
    levels = st.sampled_from([0.0, 0.0, 0.4, 1.0, 0.25, 0.73, 0.125])
    raw = np.array([[draw(levels) for _ in range(n_symbols)] for _ in range(n_symbols)])
    table = np.triu(raw) + np.triu(raw, 1).T
    sequence = st.lists(st.integers(0, n_symbols - 1), max_size=14).map(lambda s: np.array(s, dtype=np.int64))
    n_pairs = draw(st.integers(1, 8))
    return table, [draw(sequence) for _ in range(n_pairs)], [draw(sequence) for _ in range(n_pairs)]


@FAST
@given(soft_problems())
def test_fast_equals_reference_on_random_soft_tables(problem) -> None:
    table, a_seqs, b_seqs = problem
    as_lists = table.tolist()
    fast = soft_lcs_alignments(a_seqs, b_seqs, table)
    for a, b, result in zip(a_seqs, b_seqs, fast, strict=False):
        reference = soft_lcs_reference(a.tolist(), b.tolist(), lambda x, y: as_lists[x][y])
        assert abs(result.score - reference.score) <= 1e-9
        # Same float operations and the same tie-breaking: the alignments are identical too.
        assert result.pairs == reference.pairs
        # The alignment is a valid common subsequence achieving the optimum.
        assert all(a1 < a2 and b1 < b2 for (a1, b1), (a2, b2) in zip(result.pairs, result.pairs[1:], strict=False))
        assert abs(sum(as_lists[a[i]][b[j]] for i, j in result.pairs) - result.score) <= 1e-9
    assert np.allclose(soft_lcs_scores(a_seqs, b_seqs, table), [r.score for r in fast], atol=1e-9, rtol=0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pairs_of_different_tables_share_a_batch(data: st.DataObject) -> None:
    tables, a_seqs, b_seqs, which = [], [], [], []
    for t in range(data.draw(st.integers(1, 4))):
        table, a, b = data.draw(soft_problems())
        tables.append(table)
        a_seqs += a
        b_seqs += b
        which += [t] * len(a)
    batched = soft_lcs_alignments(a_seqs, b_seqs, tables, which)
    one_by_one = [soft_lcs(a, b, tables[t]) for a, b, t in zip(a_seqs, b_seqs, which, strict=False)]
    assert batched == one_by_one


def test_large_batches_of_mixed_tables_equal_reference() -> None:
    """Hundreds of pairs per batch (the per-column kernel, pairs finishing at different rows)."""
    rng = np.random.default_rng(11)
    tables = []
    for size in (3, 7, 12):
        raw = rng.choice([0.0, 0.0, 0.0, 0.4, 1.0, 0.61, 0.25], size=(size, size))
        tables.append(np.triu(raw) + np.triu(raw, 1).T)
    which = rng.integers(0, len(tables), size=600)
    a_seqs = [rng.integers(0, len(tables[t]), size=rng.integers(0, 40)) for t in which]
    b_seqs = [rng.integers(0, len(tables[t]), size=rng.integers(0, 40)) for t in which]
    fast = soft_lcs_alignments(a_seqs, b_seqs, tables, which)
    lists = [t.tolist() for t in tables]
    for a, b, t, result in zip(a_seqs, b_seqs, which, fast, strict=False):
        assert result == soft_lcs_reference(a.tolist(), b.tolist(), lambda x, y, s=lists[t]: s[x][y])
    assert soft_lcs_scores(a_seqs, b_seqs, tables, which).tolist() == [r.score for r in fast]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_asymmetric_tables_are_never_transposed(data: st.DataObject) -> None:
    """The scorer puts the shorter sequence first only for symmetric tables (where it is exact)."""
    n_symbols = data.draw(st.integers(2, 5))
    table = np.array(
        data.draw(st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=n_symbols**2, max_size=n_symbols**2))
    )
    table = table.reshape(n_symbols, n_symbols)
    sequence = st.lists(st.integers(0, n_symbols - 1), max_size=12).map(lambda s: np.array(s, dtype=np.int64))
    a_seqs = [data.draw(sequence) for _ in range(6)]
    b_seqs = [data.draw(sequence) for _ in range(6)]
    as_lists = table.tolist()
    expected = [
        soft_lcs_reference(a.tolist(), b.tolist(), lambda x, y: as_lists[x][y])
        for a, b in zip(a_seqs, b_seqs, strict=False)
    ]
    assert soft_lcs_scores(a_seqs, b_seqs, table).tolist() == [r.score for r in expected]
    assert soft_lcs_alignments(a_seqs, b_seqs, table) == expected


def test_indexed_api_reads_pairs_from_a_store() -> None:
    table = np.eye(3)
    store = SequenceStore.from_sequences([np.array([0, 1, 2]), np.array([2, 1]), np.array([0, 2, 2, 1])])
    assert store[2].tolist() == [0, 2, 2, 1] and len(store) == 3
    scores = soft_lcs_scores_indexed(store, [0, 0, 1], [1, 2, 2], table)
    assert scores.tolist() == [1.0, 2.0, 2.0]
    _, alignments = soft_lcs_alignment_arrays_indexed(store, [0], [2], table)
    assert [x.tolist() for x in alignments[0]] == [[0, 1], [0, 3]]  # [0, 1] common; ties go to the end


def test_empty_sequences_score_zero() -> None:
    table = np.eye(2)
    empty = np.zeros(0, dtype=np.int64)
    results = soft_lcs_alignments([empty, np.array([0, 1]), empty], [np.array([1]), empty, empty], table)
    assert [(r.score, r.pairs) for r in results] == [(0.0, ())] * 3
    assert soft_lcs_scores([], [], table).shape == (0,)


def test_backtracking_matches_latest_repeat() -> None:
    """Ties are broken towards the diagonal from the end: a repeated step is matched at its last occurrence."""
    result = soft_lcs_reference(["A", "X", "A", "B"], ["A", "B"], lambda x, y: float(x == y))
    assert result.pairs == ((2, 0), (3, 1))


# ---- Eq. (9) on actions -------------------------------------------------------------------


def test_soft_match_cases_of_eq9() -> None:
    def similarity(a: str, b: str) -> float:
        return 1.0 if a == b else 0.5

    assert soft_match(click("a"), Action(ActionType.LONG_CLICK, click("a").target), similarity) == 0.0
    assert soft_match(type_into("user", "vanda"), type_into("pass", "vanda"), similarity) == 1.0
    assert soft_match(type_into("user", "vanda"), type_into("user", "x"), similarity) == 0.5
    assert (
        soft_match(type_into("user", "vanda"), type_into("pass", "vanda"), similarity, input_target_must_match=True)
        == 0.0
    )
    answer = Action(ActionType.ANSWER, text="42")
    assert soft_match(answer, Action(ActionType.ANSWER, text="forty two"), similarity) == 0.5
    assert soft_match(NOTHING, NOTHING, similarity) == EPSILON_NOTHING
    assert soft_match(click("a", ref="r1"), click("a", ref="r9"), similarity) == 1.0  # ref is per-episode
    assert soft_match(click("a"), click("b"), similarity) == 0.0
    up, down = Action(ActionType.SCROLL, direction="UP"), Action(ActionType.SCROLL, direction="DOWN")
    assert soft_match(up, down, similarity) == 0.0 and soft_match(down, down, similarity) == 1.0
    assert soft_match(GOBACK, GOBACK, similarity) == 1.0
    unknown = Action(ActionType.UNKNOWN, detail="keydown")
    assert soft_match(unknown, unknown, similarity) == 0.0 and hard_match(unknown, unknown) == 0.0


def test_match_table_holds_eq9_between_symbols() -> None:
    embedder = HashingTextEmbedder()
    actions = [click("a"), NOTHING, type_into("user", "vanda"), type_into("user", "username vanda"), GOBACK]
    table = build_match_table([actions], embedder)
    for x in actions:
        for y in actions:
            expected = soft_match(x, y, embedder.similarity)
            assert table.scores[table.symbol_of[action_key(x)], table.symbol_of[action_key(y)]] == expected
    assert np.array_equal(table.scores, table.scores.T)
    assert table.decode(table.encode(actions)) == tuple(actions)


def test_soft_mode_needs_an_embedder_for_text_actions() -> None:
    with pytest.raises(ValueError, match="embedder"):
        build_match_table([[type_into("user", "vanda")]], None)


@st.composite
def action_trajectories(draw: st.DrawFn) -> list[Action]:
    texts = st.sampled_from(["vanda", "username vanda", "blue", "blue car", "", "42"])
    action = st.one_of(
        st.sampled_from(["a", "b", "c"]).map(click),
        texts.map(lambda t: type_into("user", t)),
        texts.map(lambda t: Action(ActionType.ANSWER, text=t)),
        st.sampled_from(["UP", "DOWN"]).map(lambda d: Action(ActionType.SCROLL, direction=d)),
        st.just(NOTHING),
        st.just(GOBACK),
    )
    return draw(st.lists(action, max_size=12))


@FAST
@given(action_trajectories(), action_trajectories())
def test_encoded_fast_path_equals_reference_on_actions(a: list[Action], b: list[Action]) -> None:
    """Eq. (8)+(9) action by action (no tables) == symbols + table + batched DP, alignments included."""
    embedder = HashingTextEmbedder()
    table = build_match_tables({"task": [a, b]}, embedder)["task"]
    fast = soft_lcs(table.encode(a), table.encode(b), table)
    reference = soft_lcs_reference_actions(a, b, embedder)
    assert abs(fast.score - reference.score) <= 1e-9
    assert fast.pairs == reference.pairs


# ---- Eq. (3) and Eq. (4) ------------------------------------------------------------------


def test_similarity_and_completion_ratio() -> None:
    assert trajectory_similarity(3.0, 4, 6) == 0.75  # Eq. (3): over the shorter trajectory
    assert trajectory_similarity(0.0, 0, 5) == 0.0
    assert completion_ratio(2.5, 5) == 0.5  # Eq. (4): over the recipe length
    assert completion_ratio(0.0, 0) == 0.0
