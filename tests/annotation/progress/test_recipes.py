"""Recipe library construction (ProgRM §2.2 stage 1; Eqs. 3 and 10)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import LCSseq

from annotation.progress.recipes import (
    Episode,
    build_recipe_libraries,
    build_recipe_library,
    fold_group,
    group_by_similarity,
    similarity_matrix,
)
from annotation.progress.soft_lcs import build_match_table, build_match_tables, lcs_length
from annotation.progress.text_similarity import HashingTextEmbedder
from warehouse.model import Action, ActionType, UIElement


def click(element_id: str) -> Action:
    return Action(ActionType.CLICK, UIElement(ref=element_id, role="button", element_id=element_id))


def trajectory(spec: str) -> tuple[Action, ...]:
    """'abc' -> CLICK a, CLICK b, CLICK c; '.' is NOTHING."""
    return tuple(Action(ActionType.NOTHING) if c == "." else click(c) for c in spec)


def episode(episode_id: str, spec: str, success: bool = True) -> Episode:
    return Episode(episode_id, trajectory(spec), success)


@st.composite
def similarity_matrices(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(0, 12))
    values = np.array(draw(st.lists(st.floats(0, 1), min_size=n * n, max_size=n * n))).reshape(n, n)
    sim = np.triu(values, 1)
    sim = sim + sim.T
    np.fill_diagonal(sim, 1.0)
    return sim


@settings(max_examples=200, deadline=None)
@given(similarity_matrices(), st.sampled_from([0.3, 0.6, 0.9]))
def test_grouping_is_a_partition_respecting_theta_for_every_pair(sim: np.ndarray, theta: float) -> None:
    groups = group_by_similarity(sim, theta)
    assert sorted(m for g in groups for m in g) == list(range(sim.shape[0]))
    for group in groups:
        for i in group:
            for j in group:
                assert i == j or sim[i, j] >= theta
    assert groups == group_by_similarity(sim.copy(), theta)  # deterministic


def test_grouping_separates_two_policies() -> None:
    episodes = [episode("p1", "abcde"), episode("q1", "vwxyz"), episode("p2", "ab.cde"), episode("q2", "vwxz")]
    table = build_match_table([e.actions for e in episodes], mode="hard")
    sim = similarity_matrix([table.encode(e.actions) for e in episodes], table)
    assert sim[0, 2] == 1.0 and sim[0, 1] == 0.0  # Eq. (3): LCS 5 / min(5, 6)
    library = build_recipe_library("t", episodes, table)
    assert library.reason is None
    assert sorted(r.member_episode_ids for r in library.recipes) == [("p1", "p2"), ("q1", "q2")]
    recipes = {r.member_episode_ids: "".join(a.target.element_id for a in r.actions) for r in library.recipes}
    assert recipes == {("p1", "p2"): "abcde", ("q1", "q2"): "vwxz"}


def test_recipe_is_the_left_associative_lcs_of_eq10() -> None:
    members = [trajectory("xabcd"), trajectory("abyd"), trajectory("zbd")]
    table = build_match_table(members, mode="hard")
    symbols, anchors = fold_group([table.encode(m) for m in members], table)
    assert "".join(a.target.element_id for a in table.decode(symbols)) == "bd"  # (xabcd ⊙ abyd) ⊙ zbd
    assert anchors.tolist() == [2, 4]  # positions in the first member


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="abcde", min_size=1, max_size=12), min_size=2, max_size=6))
def test_recipe_is_a_common_subsequence_of_every_member(specs: list[str]) -> None:
    members = [trajectory(s) for s in specs]
    table = build_match_table(members, mode="hard")
    codes = [table.encode(m) for m in members]
    symbols, _ = fold_group(codes, table)
    for member in codes:
        assert lcs_length(symbols.tolist(), member.tolist()) == symbols.size
    if len(specs) == 2:
        assert symbols.size == LCSseq.similarity(specs[0], specs[1])


def test_task_with_one_success_gets_no_recipe_and_a_reason() -> None:
    episodes = [episode("won", "abc"), episode("lost", "abx", success=False)]
    library = build_recipe_library("t", episodes, build_match_table([e.actions for e in episodes], mode="hard"))
    assert library.recipes == () and not library.has_recipes
    assert "only one successful trajectory" in library.reason and "won" in library.reason


def test_task_without_success_gets_no_recipe_and_a_reason() -> None:
    episodes = [episode("lost", "abx", success=False)]
    library = build_recipe_library("t", episodes, build_match_table([e.actions for e in episodes], mode="hard"))
    assert library.recipes == () and "no successful trajectory" in library.reason


def test_dissimilar_successes_get_no_recipe_and_a_reason() -> None:
    episodes = [episode("e1", "abcd"), episode("e2", "wxyz")]
    library = build_recipe_library("t", episodes, build_match_table([e.actions for e in episodes], mode="hard"))
    assert library.recipes == ()
    assert "Sim >= 0.6" in library.reason and library.groups == (("e1",), ("e2",))
    assert len(library.notes) == 2


def test_soft_recipe_keeps_the_first_members_input() -> None:
    field = UIElement(ref="u", role="textbox", element_id="user")
    a = (click("a"), Action(ActionType.INPUT, field, text="vanda"), click("go"))
    b = (click("a"), Action(ActionType.INPUT, field, text="username vanda"), click("go"))
    episodes = [Episode("a", a, True), Episode("b", b, True)]
    tables = build_match_tables({"t": [a, b]}, HashingTextEmbedder())
    library = build_recipe_library("t", episodes, tables["t"])
    (recipe,) = library.recipes
    assert recipe.actions == a and recipe.anchor_step_indices == (0, 1, 2)


def test_batched_libraries_equal_one_task_at_a_time() -> None:
    rng = np.random.default_rng(7)
    corpus = {
        f"task{t}": [
            episode(
                f"task{t}-e{k}",
                "".join(rng.choice(list("abcdef."), size=rng.integers(1, 10))),
                bool(rng.random() < 0.7),
            )
            for k in range(int(rng.integers(0, 7)))
        ]
        for t in range(12)
    }
    tables = build_match_tables({t: [e.actions for e in eps] for t, eps in corpus.items()}, None, mode="hard")
    batched = build_recipe_libraries(corpus, tables, theta=0.5)
    for task, episodes in corpus.items():
        assert batched[task] == build_recipe_library(task, episodes, tables[task], theta=0.5)
