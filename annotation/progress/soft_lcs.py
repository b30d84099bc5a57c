"""Soft and hard longest common subsequence between action trajectories (ProgRM §2.2, App. A).

The paper's self-annotation compares trajectories with a *soft* LCS: the Bellman equation of the
classic LCS (Eq. 7) with the exact-equality test replaced by a match score ``f(a, b)`` in [0, 1]
(Eq. 8), where ``f`` (Eq. 9) is

* 0 when the action types differ,
* SBERT(text_a, text_b) for two INPUTs or two ANSWERs (clipped to [0, 1]),
* epsilon = 0.4 for two NOTHINGs (waiting is sometimes needed, but should weigh less),
* 1[a = b] otherwise, where "a = b" compares the *semantic* identity of the actions
  (:func:`action_key`): the target element's role / id / text for clicks, the direction for
  SCROLL, nothing more for GOBACK.

Two implementations of Eq. (8) live here:

* :func:`soft_lcs_reference`: a plain-Python transcription of the equations, on any sequences
  and any match function. It is the specification the fast path is tested against.
* :func:`soft_lcs_scores` / :func:`soft_lcs_alignments`: the fast path. Each task's distinct
  actions are encoded once as integer *symbols* of a :class:`MatchTable` whose (V, V) matrix
  holds Eq. (9) between symbols (text similarities come from one batched embedding call). A
  pair's match matrix M[i, j] is then a gather from that table, and the DP runs on many pairs at
  once: one numpy step per DP row for a whole batch of pairs, the within-row dependency
  ``dp[i][j-1]`` resolved by a running maximum (see :func:`_dp_rows`). Pairs of different tasks
  share a batch: each pair indexes its own table in a flat concatenation.

Both return the optimal score and the alignment (matched index pairs, used for key steps),
with the same deterministic tie-breaking, so their outputs are identical, not merely close.

Also here: the trajectory similarity of Eq. (3) and the completion ratio of Eq. (4), both
ratios of a soft-LCS score to a length.

Why this module is long: it holds one algorithm twice on purpose. The equations cell by cell (the
specification) and the batched fast path sit side by side, with the match function both use, so a
reader checks one against the other line by line, as the tests check their outputs are identical.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import numpy as np

from annotation.progress.text_similarity import Embed, normalise_text, text_similarity, text_similarity_matrix
from warehouse.model import Action, ActionType, UIElement

#: epsilon of Eq. (9): the score of matching two NOTHING actions.
EPSILON_NOTHING: Final[float] = 0.4

#: Action types whose match is the similarity of their free-form text (Eq. 9, second case).
SOFT_TEXT_TYPES: Final[frozenset[ActionType]] = frozenset({ActionType.INPUT, ActionType.ANSWER})

MatchMode = Literal["soft", "hard"]
ActionKey = tuple[str, ...]
TextSimilarity = Callable[[str, str], float]
Item = TypeVar("Item")

# Upper bound on the DP cells (pairs x rows x columns) of one batch of the fast path. Scoring keeps
# two rows, and a batch this size keeps them in L2 cache (measured best on the 2-core dev box);
# aligning keeps the whole table (8 bytes a cell), so the bound also caps memory.
_ALIGN_CELL_BUDGET: Final[int] = 2_000_000
_SCORE_CELL_BUDGET: Final[int] = 800_000

# Below this many live pairs, the running max along a row uses np.maximum.accumulate rather than
# one np.maximum call per column (crossover measured on the dev box).
_FEW_PAIRS: Final[int] = 128

_NO_ALIGNMENT: Final[tuple[np.ndarray, np.ndarray]] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
_NO_ALIGNMENT[0].setflags(write=False)
_NO_ALIGNMENT[1].setflags(write=False)


# --------------------------------------------------------------------------------------------
# Semantic identity of an action and the match function f of Eq. (9)
# --------------------------------------------------------------------------------------------


def target_identity(element: UIElement | None) -> ActionKey:
    """The identity of a target element across episodes: (role, id, visible label).

    ``ref`` is deliberately left out: it is a per-episode handle. When the page gives no id, the
    element's classes stand in for it, so two unnamed elements of different kinds stay distinct.
    """
    if element is None:
        return ("", "", "")
    identity = element.element_id or (f".{'.'.join(element.classes.split())}" if element.classes else "")
    return (element.role, identity, normalise_text(element.text or element.description))


def action_key(action: Action) -> ActionKey:
    """Hashable semantic identity of an action: two actions are "equal" in Eq. (7)/(9) iff their keys are.

    * CLICK / LONG_CLICK: the target element's identity (:func:`target_identity`).
    * INPUT: target identity and the typed text (the hard match compares both; the soft match
      scores the text by similarity instead, see :func:`soft_match`).
    * ANSWER, PRESS_KEY, OPEN_APP: the (whitespace-normalised) text.
    * SCROLL: the direction. GOBACK, NOTHING: the type alone.
    * UNKNOWN: the importer's detail; UNKNOWN actions never match anything (see :func:`soft_match`).
    """
    kind = action.type
    if type(kind) is not ActionType:
        kind = ActionType(kind)  # also accepts the plain strings of a deserialised action
    if kind in (ActionType.CLICK, ActionType.LONG_CLICK):
        return (kind.value, *target_identity(action.target))
    if kind is ActionType.INPUT:
        return (kind.value, *target_identity(action.target), normalise_text(action.text))
    if kind in (ActionType.ANSWER, ActionType.PRESS_KEY, ActionType.OPEN_APP):
        return (kind.value, normalise_text(action.text))
    if kind is ActionType.SCROLL:
        return (kind.value, action.direction or "")
    if kind is ActionType.UNKNOWN:
        return (kind.value, action.detail or "")
    return (kind.value,)


def soft_match(
    a: Action,
    b: Action,
    similarity: TextSimilarity,
    *,
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> float:
    """The soft match function f of Eq. (9), generalised to the canonical action space.

    ``similarity(text_a, text_b)`` must return a value in [0, 1] (e.g. a clipped SBERT cosine,
    :func:`annotation.progress.text_similarity.text_similarity`). The paper scores two INPUTs on their text
    alone; ``input_target_must_match=True`` additionally requires the same target field (so a
    username typed into the password box does not count).
    UNKNOWN actions (events the importer could not type) score 0: nothing is known of what they did.
    """
    kind = ActionType(a.type)
    if kind != b.type or kind is ActionType.UNKNOWN:
        return 0.0
    if kind in SOFT_TEXT_TYPES:
        if input_target_must_match and target_identity(a.target) != target_identity(b.target):
            return 0.0
        return float(similarity(normalise_text(a.text), normalise_text(b.text)))
    if kind is ActionType.NOTHING:
        return epsilon
    return 1.0 if action_key(a) == action_key(b) else 0.0


def hard_match(a: Action, b: Action) -> float:
    """The exact match of Eq. (7): 1 iff the actions have the same :func:`action_key` (UNKNOWN never)."""
    if a.type == ActionType.UNKNOWN:
        return 0.0
    return 1.0 if action_key(a) == action_key(b) else 0.0


# --------------------------------------------------------------------------------------------
# Results, Eq. (3) and Eq. (4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SoftLCSResult:
    """Optimal soft-LCS score (Eq. 8) and one optimal alignment.

    ``pairs`` are the matched (index in a, index in b) pairs, increasing in both; the score is
    the sum of the match scores of these pairs.
    """

    score: float
    pairs: tuple[tuple[int, int], ...]

    @property
    def n_matched(self) -> int:
        return len(self.pairs)


def trajectory_similarity(soft_lcs_score: float, length_a: int, length_b: int) -> float:
    """Sim(T_i, T_j) of Eq. (3): SoftLCS(T_i, T_j) / min(|T_i|, |T_j|); 0 when either is empty."""
    shorter = min(length_a, length_b)
    return soft_lcs_score / shorter if shorter > 0 else 0.0


def completion_ratio(soft_lcs_score: float, recipe_length: int) -> float:
    """CR(T_i; L_j) of Eq. (4): |l_ij| / |L_j|, the share of recipe L_j that trajectory T_i matches.

    |l_ij| is the soft-LCS score between the trajectory and the recipe (the "length" of a soft
    LCS), so CR lies in [0, 1]. An empty recipe has CR 0.
    """
    return soft_lcs_score / recipe_length if recipe_length > 0 else 0.0


# --------------------------------------------------------------------------------------------
# Reference implementation: the equations, cell by cell
# --------------------------------------------------------------------------------------------


def soft_lcs_reference(a: Sequence[Item], b: Sequence[Item], match: Callable[[Item, Item], float]) -> SoftLCSResult:
    """Soft LCS of Eq. (8) by the textbook dynamic programme, in plain Python.

    dp[i][j] = max(dp[i-1][j-1] + f(a_i, b_j), dp[i-1][j], dp[i][j-1]), dp[0][*] = dp[*][0] = 0.
    With ``match`` = 1[a == b] this is the classic LCS length of Eq. (7).

    Backtracking from (|a|, |b|) takes, in this order of preference: the diagonal when f > 0 and
    it produced the optimum (a match), else up (skip a_i), else left (skip b_j). Preferring the
    diagonal matches the *latest* occurrences of repeated actions: a step repeated after a failed
    attempt gets its credit when it is done for good.
    """
    m, n = len(a), len(b)
    dp = [[0.0] * (n + 1) for _ in range(m + 1)]
    scores = [[0.0] * n for _ in range(m)]
    for i in range(1, m + 1):
        a_i = a[i - 1]
        above, row, score_row = dp[i - 1], dp[i], scores[i - 1]
        for j in range(1, n + 1):
            f = float(match(a_i, b[j - 1]))
            score_row[j - 1] = f
            row[j] = max(above[j - 1] + f, above[j], row[j - 1])
    pairs: list[tuple[int, int]] = []
    i, j = m, n
    while i > 0 and j > 0:
        f = scores[i - 1][j - 1]
        if f > 0.0 and dp[i][j] == dp[i - 1][j - 1] + f:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif dp[i][j] == dp[i - 1][j]:
            i -= 1
        else:
            j -= 1
    pairs.reverse()
    return SoftLCSResult(score=dp[m][n], pairs=tuple(pairs))


def soft_lcs_reference_actions(
    a: Sequence[Action],
    b: Sequence[Action],
    embed: Embed,
    *,
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> SoftLCSResult:
    """Eq. (8) with the match function of Eq. (9) evaluated action by action (no encoding, no tables)."""

    def similarity(text_a: str, text_b: str) -> float:
        return text_similarity(text_a, text_b, embed)

    def match(x: Action, y: Action) -> float:
        return soft_match(x, y, similarity, epsilon=epsilon, input_target_must_match=input_target_must_match)

    return soft_lcs_reference(a, b, match)


# --------------------------------------------------------------------------------------------
# Encoding: distinct actions -> symbols, Eq. (9) between symbols -> one small matrix per task
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MatchTable:
    """The distinct actions ("symbols") of a set of trajectories and Eq. (9) between every two of them.

    ``scores[x, y]`` is f(a, b) for any actions a, b with symbols x, y; trajectories are encoded
    once (:meth:`encode`) and every DP then works on integer arrays.
    """

    keys: tuple[ActionKey, ...]
    representatives: tuple[Action, ...]  # one action per symbol, e.g. to spell out a recipe
    scores: np.ndarray  # (V, V) float64, symmetric, values in [0, 1]
    mode: MatchMode
    symbol_of: Mapping[ActionKey, int]

    def __len__(self) -> int:
        return len(self.keys)

    def encode(self, actions: Iterable[Action]) -> np.ndarray:
        """Symbols of a trajectory (int64 array). Raises KeyError for an action the table has not seen."""
        return np.fromiter((self.symbol_of[action_key(a)] for a in actions), dtype=np.int64)

    def decode(self, symbols: Iterable[int]) -> tuple[Action, ...]:
        return tuple(self.representatives[int(s)] for s in symbols)


def build_match_table(
    trajectories: Iterable[Sequence[Action]],
    embed: Embed | None = None,
    *,
    mode: MatchMode = "soft",
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> MatchTable:
    """Collect the distinct actions of ``trajectories`` and score every two of them by Eq. (9).

    ``mode="soft"`` is Eq. (9); it needs ``embed`` when INPUT/ANSWER actions occur (all their
    distinct texts are embedded in one call). ``mode="hard"`` is Eq. (7): 1 iff identical keys.
    Symbols are numbered in order of first appearance, so the table is deterministic.
    """
    return build_match_table_encoded(
        trajectories, embed, mode=mode, epsilon=epsilon, input_target_must_match=input_target_must_match
    )[0]


def build_match_table_encoded(
    trajectories: Iterable[Sequence[Action]],
    embed: Embed | None = None,
    *,
    mode: MatchMode = "soft",
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> tuple[MatchTable, list[np.ndarray]]:
    """:func:`build_match_table`, and the trajectories encoded in it (each action's key computed once)."""
    symbol_of: dict[ActionKey, int] = {}
    representatives: list[Action] = []
    codes: list[np.ndarray] = []
    for trajectory in trajectories:
        symbols = []
        for action in trajectory:
            key = action_key(action)
            symbol = symbol_of.get(key)
            if symbol is None:
                symbol = symbol_of[key] = len(representatives)
                representatives.append(action)
            symbols.append(symbol)
        codes.append(np.array(symbols, dtype=np.int64))
    n_symbols = len(representatives)
    types = [ActionType(a.type) for a in representatives]
    known = np.array([t is not ActionType.UNKNOWN for t in types], dtype=bool)
    scores = np.zeros((n_symbols, n_symbols), dtype=np.float64)
    # Every symbol matches itself fully (1[a = b]); UNKNOWN never matches.
    scores[np.arange(n_symbols), np.arange(n_symbols)] = known.astype(np.float64)
    symmetric = True  # only the text blocks below can break it
    if mode == "soft":
        for symbol, kind in enumerate(types):
            if kind is ActionType.NOTHING:
                scores[symbol, symbol] = epsilon
        for kind in SOFT_TEXT_TYPES:
            members = np.array([s for s, t in enumerate(types) if t is kind], dtype=np.int64)
            if members.size == 0:
                continue
            if embed is None:
                raise ValueError(f"soft matching of {kind.value} actions needs an embedder for their texts")
            texts = [normalise_text(representatives[s].text) for s in members]
            distinct = list(dict.fromkeys(texts))
            row_of = {text: row for row, text in enumerate(distinct)}
            rows = np.array([row_of[t] for t in texts], dtype=np.int64)
            text_scores = text_similarity_matrix(distinct, distinct, embed)
            symmetric = symmetric and bool(np.array_equal(text_scores, text_scores.T))
            block = text_scores[np.ix_(rows, rows)]
            if input_target_must_match:
                target_of: dict[ActionKey, int] = {}
                targets = np.array(
                    [target_of.setdefault(target_identity(representatives[s].target), len(target_of)) for s in members],
                    dtype=np.int64,
                )
                block = np.where(targets[:, None] == targets[None, :], block, 0.0)
            scores[np.ix_(members, members)] = block
    elif mode != "hard":
        raise ValueError(f"mode must be 'soft' or 'hard', got {mode!r}")
    scores.setflags(write=False)
    table = MatchTable(
        keys=tuple(symbol_of),
        representatives=tuple(representatives),
        scores=scores,
        mode=mode,
        symbol_of=symbol_of,
    )
    _remember_symmetry(scores, symmetric)
    return table, codes


def build_match_tables(
    trajectories_by_task: Mapping[str, Iterable[Sequence[Action]]],
    embed: Embed | None = None,
    *,
    mode: MatchMode = "soft",
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> dict[str, MatchTable]:
    """One :class:`MatchTable` per task (recipes and key steps never compare across tasks).

    All INPUT/ANSWER texts of all tasks are embedded in a single call first, so a model-backed
    embedder batches the whole corpus and each task then reads its cache.
    """
    encoded = build_match_tables_encoded(
        trajectories_by_task, embed, mode=mode, epsilon=epsilon, input_target_must_match=input_target_must_match
    )
    return {task: table for task, (table, _) in encoded.items()}


def build_match_tables_encoded(
    trajectories_by_task: Mapping[str, Iterable[Sequence[Action]]],
    embed: Embed | None = None,
    *,
    mode: MatchMode = "soft",
    epsilon: float = EPSILON_NOTHING,
    input_target_must_match: bool = False,
) -> dict[str, tuple[MatchTable, list[np.ndarray]]]:
    """:func:`build_match_tables`, with each task's trajectories encoded in its table."""
    materialised = {task: [list(t) for t in trajectories] for task, trajectories in trajectories_by_task.items()}
    if mode == "soft" and embed is not None:
        texts = {
            normalise_text(a.text)
            for trajectories in materialised.values()
            for trajectory in trajectories
            for a in trajectory
            if a.type in SOFT_TEXT_TYPES
        }
        if texts:
            embed(sorted(texts))
    return {
        task: build_match_table_encoded(
            trajectories, embed, mode=mode, epsilon=epsilon, input_target_must_match=input_target_must_match
        )
        for task, trajectories in materialised.items()
    }


def encode_hashables(sequences: Sequence[Sequence[Hashable]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Encode arbitrary hashable sequences for the hard LCS: (symbol arrays, identity score table)."""
    symbol_of: dict[Hashable, int] = {}
    encoded = [
        np.fromiter((symbol_of.setdefault(item, len(symbol_of)) for item in sequence), dtype=np.int64)
        for sequence in sequences
    ]
    return encoded, np.eye(max(len(symbol_of), 1), dtype=np.float64)


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Classic LCS length (Eq. 7) of two sequences of hashables, via the fast DP in hard mode."""
    (codes_a, codes_b), table = encode_hashables([a, b])
    return int(round(soft_lcs_scores([codes_a], [codes_b], table)[0]))


# --------------------------------------------------------------------------------------------
# Fast path: many pairs at once
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SequenceStore:
    """Symbol sequences concatenated into one array once, addressed by index.

    The batched DP takes pairs as (index, index) into a store, so scoring N pairs costs no
    per-pair Python work: padding a batch is one gather from ``symbols``.
    """

    symbols: np.ndarray  # int64, all sequences back to back
    starts: np.ndarray  # int64, where sequence k starts
    lengths: np.ndarray  # int64, its length

    @classmethod
    def from_sequences(cls, sequences: Iterable[np.ndarray]) -> SequenceStore:
        arrays = [np.asarray(s, dtype=np.int64).ravel() for s in sequences]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        symbols = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(symbols=symbols, starts=np.cumsum(lengths) - lengths, lengths=lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, k: int) -> np.ndarray:
        start = int(self.starts[k])
        return self.symbols[start : start + int(self.lengths[k])]


#: Tables with more entries than this are never copied into a concatenation: their pairs run
#: as a batch of their own, reading the table in place (a paper-mode task with thousands of
#: distinct typed texts has a table of hundreds of MB).
_BIG_TABLE_ENTRIES: Final[int] = 1 << 20


@dataclass(frozen=True, eq=False)
class TableSet:
    """Eq. (9) tables prepared once for many DP calls: small ones raveled back to back into one
    flat array (pairs of many small tasks then share a batch), each big one in place.

    Folding a recipe (Eq. 10) runs one DP call per member; passing the task tables as a
    ``TableSet`` keeps each call from concatenating (and re-checking) them again, which made
    large paper-mode tasks quadratic in their successes.
    """

    tables: tuple[np.ndarray, ...]
    segment_of: np.ndarray  # table -> segment (0: the small tables together; then one per big table)
    flats: tuple[np.ndarray, ...]  # per segment: its tables, raveled
    offsets: np.ndarray  # table -> where it starts in its segment's flat array
    sizes: np.ndarray  # table -> V
    symmetric: np.ndarray  # table -> exactly symmetric

    @classmethod
    def of(cls, tables: Sequence[np.ndarray] | TableSet) -> TableSet:
        if isinstance(tables, TableSet):
            return tables
        arrays = tuple(np.asarray(t, dtype=np.float64) for t in tables)
        sizes = np.array([t.shape[0] for t in arrays], dtype=np.int64)
        big = sizes * sizes > _BIG_TABLE_ENTRIES
        segment_of = np.where(big, np.cumsum(big), 0).astype(np.int64)
        small = np.flatnonzero(~big)
        offsets = np.zeros(len(arrays), dtype=np.int64)
        offsets[small] = np.cumsum(sizes[small] ** 2) - sizes[small] ** 2
        flats = [_flat_tables([arrays[k] for k in small.tolist()])]
        flats += [np.ascontiguousarray(arrays[k]).reshape(-1) for k in np.flatnonzero(big).tolist()]
        return cls(
            tables=arrays,
            segment_of=segment_of,
            flats=tuple(flats),
            offsets=offsets,
            sizes=sizes,
            symmetric=np.array([is_symmetric(t) for t in arrays], dtype=bool),
        )

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.tables[k]


#: id(table) -> (a weak reference to the table, whether it is symmetric). Weak: the cache must not
#: keep a task's (possibly hundreds of MB) table alive after its batch; a dead reference, or
#: another array at a reused id, is a miss.
_SYMMETRY_CACHE: OrderedDict[int, tuple[weakref.ref[np.ndarray], bool]] = OrderedDict()


def _flat_tables(tables: list[np.ndarray]) -> np.ndarray:
    """The tables raveled back to back (a view when there is one contiguous table)."""
    if not tables:
        return np.zeros(0)
    if len(tables) == 1:
        return np.ascontiguousarray(tables[0]).reshape(-1)
    return np.concatenate([t.ravel() for t in tables])


def _remember_symmetry(table: np.ndarray, symmetric: bool) -> None:
    """Record what is known of a read-only table by construction (its off-diagonal entries come
    from blocks whose symmetry was checked), sparing :func:`is_symmetric` a (V, V) comparison."""
    if not table.flags.writeable:
        _cache_symmetry(table, symmetric)


def _cache_symmetry(table: np.ndarray, symmetric: bool) -> None:
    _SYMMETRY_CACHE[id(table)] = (weakref.ref(table), symmetric)
    _SYMMETRY_CACHE.move_to_end(id(table))
    while len(_SYMMETRY_CACHE) > 64:
        _SYMMETRY_CACHE.popitem(last=False)


def is_symmetric(table: np.ndarray) -> bool:
    """Whether an Eq. (9) table is exactly symmetric (remembered for read-only tables, which
    cannot change: :attr:`MatchTable.scores`)."""
    if table.flags.writeable:
        return bool(np.array_equal(table, table.T))
    hit = _SYMMETRY_CACHE.get(id(table))
    if hit is not None and hit[0]() is table:
        _SYMMETRY_CACHE.move_to_end(id(table))
        return hit[1]
    symmetric = bool(np.array_equal(table, table.T))
    _cache_symmetry(table, symmetric)
    return symmetric


@dataclass(frozen=True, slots=True)
class _PreparedPairs:
    """Pairs ready for the batched DP: where their sequences lie, and their tables in one flat array."""

    symbols: np.ndarray
    a_start: np.ndarray  # per pair: where its first sequence starts in ``symbols``
    b_start: np.ndarray
    a_len: np.ndarray
    b_len: np.ndarray
    flat_scores: np.ndarray  # the used tables, raveled and concatenated
    table_offset: np.ndarray  # per pair: where its table starts in flat_scores
    table_size: np.ndarray  # per pair: V of its table (row stride)


def _prepared_segments(
    store: SequenceStore,
    a_ids: Sequence[int] | np.ndarray,
    b_ids: Sequence[int] | np.ndarray,
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None,
    *,
    shorter_first: bool = False,
) -> Iterator[tuple[np.ndarray, _PreparedPairs]]:
    """The pairs, ready for the DP, as (positions among the pairs, prepared pairs), one part per
    :class:`TableSet` segment (all small tables together, each big table alone)."""
    a_ids = np.asarray(a_ids, dtype=np.int64).ravel()
    b_ids = np.asarray(b_ids, dtype=np.int64).ravel()
    if a_ids.shape != b_ids.shape:
        raise ValueError(f"got {a_ids.size} first sequences but {b_ids.size} second sequences")
    n_pairs = a_ids.size
    if isinstance(tables, np.ndarray) and tables.ndim == 2:
        tables = [tables]
        table_index = None
    if table_index is None:
        if len(tables) != 1:
            raise ValueError("table_index is required when several tables are given")
        table_index = np.zeros(n_pairs, dtype=np.int64)
    index: np.ndarray = np.asarray(table_index, dtype=np.int64).reshape(n_pairs)
    if not isinstance(tables, TableSet):
        # Only the tables these pairs use are prepared (recipe folding calls with few pairs).
        used, inverse = np.unique(index, return_inverse=True)
        tables = TableSet.of([tables[t] for t in used.tolist()])
        index = inverse.ravel().astype(np.int64)
    if shorter_first:
        # Scores only: SoftLCS(a, b) = SoftLCS(b, a) bit for bit when the table is symmetric (the
        # DP of the transposed matrix holds the transposed values), and fewer rows mean fewer
        # numpy calls. Alignments are not swapped: tie-breaking is orientation-specific.
        swap = (store.lengths[a_ids] > store.lengths[b_ids]) & tables.symmetric[index]
        a_ids, b_ids = np.where(swap, b_ids, a_ids), np.where(swap, a_ids, b_ids)
    segment = tables.segment_of[index]
    for seg in np.unique(segment).tolist():
        positions = np.flatnonzero(segment == seg) if len(tables.flats) > 1 else np.arange(n_pairs)
        a, b, t = a_ids[positions], b_ids[positions], index[positions]
        yield (
            positions,
            _PreparedPairs(
                symbols=store.symbols,
                a_start=store.starts[a],
                b_start=store.starts[b],
                a_len=store.lengths[a],
                b_len=store.lengths[b],
                flat_scores=tables.flats[seg],
                table_offset=tables.offsets[t],
                table_size=tables.sizes[t],
            ),
        )


def _pairs_of_lists(
    a_seqs: Sequence[np.ndarray], b_seqs: Sequence[np.ndarray]
) -> tuple[SequenceStore, np.ndarray, np.ndarray]:
    if len(a_seqs) != len(b_seqs):
        raise ValueError(f"got {len(a_seqs)} first sequences but {len(b_seqs)} second sequences")
    store = SequenceStore.from_sequences([*a_seqs, *b_seqs])
    n_pairs = len(a_seqs)
    return store, np.arange(n_pairs), np.arange(n_pairs, 2 * n_pairs)


def _batches(pairs: _PreparedPairs, cell_budget: int) -> Iterable[np.ndarray]:
    """Split the non-empty pairs into batches of similar shape, each within ``cell_budget`` DP cells.

    Sorting by the second length keeps a batch's padded width close to its pairs' real widths;
    within a batch, pairs are ordered by the first length so that finished pairs form a prefix
    the row loop can drop (see :func:`_dp_rows`). Both keep padding waste small.
    """
    nonempty = np.nonzero((pairs.a_len > 0) & (pairs.b_len > 0))[0]
    order = nonempty[np.lexsort((pairs.a_len[nonempty], pairs.b_len[nonempty]))]
    # Padded cells per pair if a batch ended here: non-decreasing along ``order``, so a batch from
    # ``start`` may grow while (count * this bound) stays within budget.
    padded_cost = (np.maximum.accumulate(pairs.a_len[order]) + 1) * (pairs.b_len[order] + 1)
    start = 0
    while start < order.size:
        # At most budget / cost[start] pairs fit, so only that window needs looking at.
        window = padded_cost[start : start + cell_budget // int(padded_cost[start]) + 1]
        count = np.arange(1, window.size + 1)
        fits = int(np.searchsorted(count * window > cell_budget, True))
        stop = start + max(fits, 1)
        batch = order[start:stop]
        # Finished pairs must form a prefix (sort by |a|); among equal |a|, neighbours share a
        # table, so the gathers of M hit the same cache lines.
        yield batch[np.lexsort((pairs.table_offset[batch], pairs.a_len[batch]))]
        start = stop


def _padded_columns(symbols: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """(width, pairs) symbols, one pair per column (the batch axis is the contiguous one).

    Past a sequence's end the column holds whatever follows it in ``symbols`` (not zeros: masking
    would cost a pass). That is harmless: cell (i, j) of the DP depends only on cells above-left
    of it, so padded cells never reach a pair's own (|a|, |b|) corner, and the gathers of M are
    done with ``mode="clip"`` so a foreign symbol cannot index outside the tables.
    """
    index = starts[None, :] + np.arange(width, dtype=np.int64)[:, None]
    return np.take(symbols, index, mode="clip")


def _dp_rows(
    pairs: _PreparedPairs, batch: np.ndarray, workspace: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """Eq. (8) for a batch of pairs, one numpy step per DP row.

    Within row i, dp[i][j] = max(c_j, dp[i][j-1]) with c_j = max(dp[i-1][j], dp[i-1][j-1] + M[i, j])
    and dp[i][0] = 0: the c_j of a whole row (gather of M, add, max) are computed in three numpy
    calls over all pairs, and only the running maximum over j stays sequential, one
    ``np.maximum`` per column across all pairs. (``np.maximum.accumulate`` computes the same but
    measured ~25x slower on batches of thousands of short rows, but is faster for fewer than
    ``_FEW_PAIRS`` pairs, where it is used.) The max is over the same candidates as the
    reference, computed with the same float operations, hence bit-identical results.
    Arrays are laid out (row, column, pair) so every numpy call runs along the contiguous pair axis.

    With a ``workspace`` (a flat float64 buffer, reused across batches so the kernel does not
    fault in fresh pages for every batch) the whole DP table is kept there for backtracking;
    without one, only two rows live at a time.

    Returns (scores, dp table (|a|+1, |b|+1, pairs) or None, a symbols, b symbols).
    """
    a_len, b_len = pairs.a_len[batch], pairs.b_len[batch]
    n_pairs, rows, cols = batch.size, int(a_len.max()), int(b_len.max())
    a_sym = _padded_columns(pairs.symbols, pairs.a_start[batch], a_len, rows)  # (rows, pairs)
    b_sym = _padded_columns(pairs.symbols, pairs.b_start[batch], b_len, cols)  # (cols, pairs)
    # M[i, j] = flat[offset + a_i * V + b_j]: precompute the part that depends on a_i once.
    row_base = pairs.table_offset[batch] + a_sym * pairs.table_size[batch]
    flat = pairs.flat_scores
    table = None
    if workspace is not None:
        n_cells = (rows + 1) * (cols + 1) * n_pairs
        storage = workspace[:n_cells] if n_cells <= workspace.size else np.empty(n_cells)
        table = storage.reshape(rows + 1, cols + 1, n_pairs)
        # Row 0 and column 0 are the DP's boundary; other cells are written before being read
        # (cells of finished pairs in later rows are never read: backtracking starts at (|a|, |b|)).
        table[0] = 0.0
        table[:, 0] = 0.0
    else:
        buffers = (np.zeros((cols + 1, n_pairs)), np.zeros((cols + 1, n_pairs)))
    scores = np.zeros(n_pairs, dtype=np.float64)
    index = np.empty((cols, n_pairs), dtype=np.int64)
    match_row = np.empty((cols, n_pairs), dtype=np.float64)
    # Pairs are sorted by |a|: those with |a| < i (before row_start[i]) are finished and dropped,
    # and those with |a| == i (row_start[i]:row_start[i+1]) end at row i.
    row_start = np.searchsorted(a_len, np.arange(rows + 2))
    for i in range(1, rows + 1):
        live = slice(int(row_start[i]), n_pairs)
        if table is not None:
            previous, current = table[i - 1], table[i]
        else:
            previous, current = buffers[(i - 1) % 2], buffers[i % 2]
        idx, m_row = index[:, live], match_row[:, live]
        np.add(b_sym[:, live], row_base[i - 1, live], out=idx)
        np.take(flat, idx, out=m_row, mode="clip")  # clip: see _padded_columns; 'raise' also buffers out
        np.add(previous[:-1, live], m_row, out=m_row)  # dp[i-1][j-1] + M[i, j]
        np.maximum(m_row, previous[1:, live], out=m_row)  # vs dp[i-1][j]
        # Running max along the row (vs dp[i][j-1]); current[0] stays 0. Across many pairs, one
        # np.maximum per column; for a few (long) pairs, accumulate is cheaper than the calls.
        if n_pairs - live.start < _FEW_PAIRS:
            np.maximum.accumulate(m_row, axis=0, out=current[1:, live])
        else:
            np.copyto(current[1, live], m_row[0])
            for j in range(1, cols):
                np.maximum(current[j, live], m_row[j], out=current[j + 1, live])
        ending = np.arange(row_start[i], row_start[i + 1])
        scores[ending] = current[b_len[ending], ending]
    return scores, table, a_sym, b_sym


def _backtrack(
    pairs: _PreparedPairs, batch: np.ndarray, table: np.ndarray, a_sym: np.ndarray, b_sym: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Alignments of a batch, all pairs stepping back together, with the reference's tie-breaking."""
    flat = pairs.flat_scores
    offset, size = pairs.table_offset[batch], pairs.table_size[batch]
    # Walk the table through flat indices: cheaper than 3-D fancy indexing.
    cells = table.reshape(-1)
    n_pairs = batch.size
    stride_j = n_pairs
    stride_i = table.shape[1] * n_pairs
    i = pairs.a_len[batch].copy()
    j = pairs.b_len[batch].copy()
    hit_pair: list[np.ndarray] = []
    hit_i: list[np.ndarray] = []
    hit_j: list[np.ndarray] = []
    live = np.nonzero((i > 0) & (j > 0))[0]
    while live.size:
        ii, jj = i[live], j[live]
        here_at = ii * stride_i + jj * stride_j + live
        here = cells[here_at]
        match = flat[offset[live] + a_sym[ii - 1, live] * size[live] + b_sym[jj - 1, live]]
        diagonal = (match > 0.0) & (here == cells[here_at - stride_i - stride_j] + match)
        up = ~diagonal & (here == cells[here_at - stride_i])
        if diagonal.any():
            hit_pair.append(live[diagonal])
            hit_i.append(ii[diagonal] - 1)
            hit_j.append(jj[diagonal] - 1)
        ii -= diagonal | up
        jj -= ~up  # left or diagonal
        i[live] = ii
        j[live] = jj
        live = live[(ii > 0) & (jj > 0)]
    alignments: list[tuple[np.ndarray, np.ndarray]] = [_NO_ALIGNMENT] * batch.size
    if hit_pair:
        owner, a_idx, b_idx = np.concatenate(hit_pair), np.concatenate(hit_i), np.concatenate(hit_j)
        order = np.lexsort((a_idx, owner))
        owner, a_idx, b_idx = owner[order], a_idx[order], b_idx[order]
        bounds = np.searchsorted(owner, np.arange(batch.size + 1))
        for row in np.unique(owner).tolist():
            alignments[row] = (a_idx[bounds[row] : bounds[row + 1]], b_idx[bounds[row] : bounds[row + 1]])
    return alignments


def soft_lcs_scores_indexed(
    store: SequenceStore,
    a_ids: Sequence[int] | np.ndarray,
    b_ids: Sequence[int] | np.ndarray,
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """SoftLCS(store[a_ids[k]], store[b_ids[k]]) of Eq. (8) for every pair k, batched (the fast path).

    ``tables[table_index[k]]`` is the (V, V) Eq. (9) score matrix the pair's symbols index
    (``MatchTable.scores``); pass a single 2-D matrix to use it for all pairs.
    """
    scores = np.zeros(np.asarray(a_ids).size, dtype=np.float64)
    for positions, pairs in _prepared_segments(store, a_ids, b_ids, tables, table_index, shorter_first=True):
        part = np.zeros(positions.size, dtype=np.float64)
        for batch in _batches(pairs, _SCORE_CELL_BUDGET):
            part[batch] = _dp_rows(pairs, batch)[0]
        scores[positions] = part
    return scores


def soft_lcs_alignment_arrays_indexed(
    store: SequenceStore,
    a_ids: Sequence[int] | np.ndarray,
    b_ids: Sequence[int] | np.ndarray,
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Like :func:`soft_lcs_scores_indexed`, plus each pair's alignment as (indices in a, indices in b)."""
    n_pairs = np.asarray(a_ids).size
    scores = np.zeros(n_pairs, dtype=np.float64)
    alignments: list[tuple[np.ndarray, np.ndarray]] = [_NO_ALIGNMENT] * n_pairs
    for positions, pairs in _prepared_segments(store, a_ids, b_ids, tables, table_index):
        batches = list(_batches(pairs, _ALIGN_CELL_BUDGET))
        padded_cells = [(pairs.a_len[b].max() + 1) * (pairs.b_len[b].max() + 1) * b.size for b in batches]
        workspace = np.empty(int(max(padded_cells, default=0)), dtype=np.float64)
        where = positions.tolist()
        for batch in batches:
            batch_scores, table, a_sym, b_sym = _dp_rows(pairs, batch, workspace)
            assert table is not None
            scores[positions[batch]] = batch_scores
            for k, alignment in zip(batch.tolist(), _backtrack(pairs, batch, table, a_sym, b_sym), strict=True):
                alignments[where[k]] = alignment
    return scores, alignments


def soft_lcs_scores(
    a_seqs: Sequence[np.ndarray],
    b_seqs: Sequence[np.ndarray],
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """SoftLCS(a_k, b_k) of Eq. (8) for every pair k of symbol arrays, batched (the fast path).

    ``a_seqs[k]``, ``b_seqs[k]`` are symbol arrays (:meth:`MatchTable.encode`) and
    ``tables[table_index[k]]`` the (V, V) Eq. (9) score matrix they index (``MatchTable.scores``);
    pass a single 2-D matrix to use it for all pairs. Returns a float64 array of scores.
    """
    store, a_ids, b_ids = _pairs_of_lists(a_seqs, b_seqs)
    return soft_lcs_scores_indexed(store, a_ids, b_ids, tables, table_index)


def soft_lcs_alignment_arrays(
    a_seqs: Sequence[np.ndarray],
    b_seqs: Sequence[np.ndarray],
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Like :func:`soft_lcs_scores`, plus each pair's alignment as (indices in a, indices in b) arrays."""
    store, a_ids, b_ids = _pairs_of_lists(a_seqs, b_seqs)
    return soft_lcs_alignment_arrays_indexed(store, a_ids, b_ids, tables, table_index)


def soft_lcs_alignments(
    a_seqs: Sequence[np.ndarray],
    b_seqs: Sequence[np.ndarray],
    tables: np.ndarray | Sequence[np.ndarray] | TableSet,
    table_index: Sequence[int] | np.ndarray | None = None,
) -> list[SoftLCSResult]:
    """Eq. (8) scores and alignments for every pair (fast path), identical to :func:`soft_lcs_reference`."""
    scores, alignments = soft_lcs_alignment_arrays(a_seqs, b_seqs, tables, table_index)
    return [
        SoftLCSResult(score=float(score), pairs=tuple(zip(a_idx.tolist(), b_idx.tolist(), strict=True)))
        for score, (a_idx, b_idx) in zip(scores, alignments, strict=True)
    ]


def soft_lcs(a: np.ndarray, b: np.ndarray, table: MatchTable | np.ndarray) -> SoftLCSResult:
    """Eq. (8) for one pair of encoded trajectories (fast path; batch many pairs for speed)."""
    scores = table.scores if isinstance(table, MatchTable) else table
    return soft_lcs_alignments([a], [b], scores)[0]
