"""Reward-model datasets: states, prompts, labels and examples for ORM, ProgRM, PRM and GuidNav.

What a reward model reads (ProgRM §2.3, Eq. 6): the task instruction ``g``, the action history
and the current screen, ``ŝ_t = [a_1, ..., a_{t-1}, o_t]``, rendered with the prompt of ProgRM
Table 7 (progress) or Table 8 (outcome). Indexing used throughout this package:

* ``steps[t]`` is what the warehouse stores: the screen ``o_t`` the agent saw *before* action
  ``a_t``, and the action.
* A progress label ``p*_t`` (``progress_labels.progress`` at ``step_idx = t``) is the progress
  reached *after* action ``a_t`` (§2.2: a key step's label is the recipe position it completes).
  The state that can show it is the one after the action: instruction, history ``a_0..a_t`` and
  the next screen ``o_{t+1}`` (:func:`progress_state`). The last action has no recorded next
  screen; the latest screen ``o_T`` stands in (or ``TextTrajectory.final_screen`` when known).
* A step-correctness judgement (GUI-Shepherd Eq. 1, GuidNav Eq. 2) looks at the state *before*
  the action plus the candidate action: history ``a_0..a_{t-1}``, screen ``o_t``, action ``a_t``
  (:func:`action_state`).

Labels per kind (:data:`KINDS`):

* ``progrm_lcs`` / ``progrm_env``: soft progress labels in [0, 1] (LCS recipes or environment
  milestones, §2.2); only the steps ``progress_split.sampled_steps`` keeps (App. C: failed
  trajectories' steps sampled to balance success:failure steps ~1:1).
* ``orm``: one example per trajectory, the final state, labelled with the outcome (success).
* ``prm``: one example per (state, action), positive / negative; human labels where present,
  otherwise derived from progress labels (:func:`derive_step_verdicts`); ``unsure`` dropped
  (GUI-Shepherd App. A.2).
* ``guidnav``: a scalar step reward in [0, 1] regressed with MSE (GuidNav §3.1, Eq. 3).

Actions appear as their canonical text (``steps.action_text``) plus, when the target has no
text of its own, the texts of its nearest container (:func:`target_context`): ``CLICK(span.retweet)
within "Christan" "@lacus" "6h ago"``. The canonical text alone cannot tell identical buttons apart.

The pure functions here take plain data; the ``read_*`` functions at the end read the warehouse.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa

from warehouse.catalog import LineageInput, Warehouse
from warehouse.model import Screen, UIElement
from warehouse.tables_training import RM_EXAMPLES, RM_TRL_STEPWISE

log = logging.getLogger(__name__)

Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = ("train", "validation", "test")
Verdict = Literal["positive", "negative", "unsure"]

# ---------------------------------------------------------------------------------------------
# Kinds of reward model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindSpec:
    """What one kind of reward model learns, from which labels, with which loss and prompt."""

    name: str
    target: Literal["progress", "outcome", "step_correctness", "step_reward"]
    loss: Literal["bce", "mse"]
    state: Literal["after_action", "before_action"]  # progress_state | action_state
    question: str  # the last line of the system/user instruction of the prompt
    description: str
    label_source: str | None = None  # progress_labels.source the labels come from, if any

    @property
    def scores_progress(self) -> bool:
        """Whether the score is a progress p_t, so that Eq. 2 gains p_t - p_{t-k} are rewards."""
        return self.state == "after_action"


KINDS: dict[str, KindSpec] = {
    "orm": KindSpec(
        "orm",
        "outcome",
        "bce",
        "after_action",
        "You should give a judgment about the success or failure of this task.",
        "Outcome reward model: final state of each trajectory, success label (ProgRM Table 8 prompt).",
    ),
    "progrm_lcs": KindSpec(
        "progrm_lcs",
        "progress",
        "bce",
        "after_action",
        "You should give a percentage which is an estimation of his progress on this task.",
        "ProgRM with LCS progress labels (§2.2), BCE on soft labels (Eq. 5), Table 7 prompt.",
        label_source="lcs",
    ),
    "progrm_env": KindSpec(
        "progrm_env",
        "progress",
        "bce",
        "after_action",
        "You should give a percentage which is an estimation of his progress on this task.",
        "ProgRM with environment-milestone progress labels (§2.2 last paragraph), BCE (Eq. 5).",
        label_source="env",
    ),
    "prm": KindSpec(
        "prm",
        "step_correctness",
        "bce",
        "before_action",
        "You should judge whether the candidate action is a correct step towards completing this task.",
        "Binary step-correctness PRM (GUI-Shepherd §3): human labels, else derived; unsure filtered.",
    ),
    "guidnav": KindSpec(
        "guidnav",
        "step_reward",
        "mse",
        "before_action",
        "You should give a score between 0 and 1 for how much the candidate action helps to complete this task.",
        "GuidNav process reward model (§3.1): scalar step reward regressed with MSE (Eq. 3).",
    ),
}
REWARD_MODEL_KINDS: tuple[str, ...] = tuple(KINDS)


def kind_spec(kind: str) -> KindSpec:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown reward-model kind {kind!r}; expected one of {', '.join(KINDS)}") from None


# ---------------------------------------------------------------------------------------------
# Trajectories and states (Eq. 6)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextStep:
    """One step as recorded: the screen before the action (one element per line) and the action."""

    screen_lines: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class TextTrajectory:
    """A trajectory as reward models see it. ``final_screen_lines``: the screen after the last
    action, when the recorder kept it (the warehouse does not; RL callers may send it)."""

    episode_id: str
    task_id: str
    instruction: str
    steps: tuple[TextStep, ...]
    success: bool | None = None
    final_screen_lines: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(s.action for s in self.steps)


@dataclass(frozen=True, slots=True)
class StepState:
    """A reward model's input: instruction, action history (oldest first), screen, and for step
    judges the candidate action."""

    instruction: str
    history: tuple[str, ...]
    screen_lines: tuple[str, ...]
    action: str | None = None


def screen_lines(screen: Screen) -> tuple[str, ...]:
    """A screen as prompt lines: exactly ``Screen.to_text()`` split per element (indentation = depth)."""
    text = screen.to_text()
    return tuple(text.split("\n")) if text else ()


def screen_lines_from_records(records: Sequence[Mapping] | None) -> tuple[str, ...]:
    """Warehouse ``steps.screen`` records -> prompt lines (see :func:`screen_lines`)."""
    return screen_lines(Screen(tuple(UIElement.from_dict(dict(r)) for r in records or ())))


def _field(element, name: str):
    """A field of an element given as a mapping (warehouse record) or a ``UIElement``."""
    return element.get(name) if isinstance(element, Mapping) else getattr(element, name, None)


def _element_text(element) -> str:
    return " ".join(str(_field(element, "text") or _field(element, "description") or "").split())


def target_context(
    records: Sequence,
    target_ref: str | None,
    *,
    max_texts: int = 4,
    max_chars: int = 40,
    max_container_elements: int = 16,
) -> str | None:
    """The texts around an action's target that has no text of its own: those of the nearest
    enclosing element (below the page's top two levels) that has any, in document order.

    Canonical action texts name an element by role, id and text (``CLICK(span.retweet)``), which
    does not say *which* of several identical buttons was clicked: the one of user @lacus, or the
    one of the third e-mail. The texts of its closest container do (``"Christan" "@lacus"``).
    Containers of more than ``max_container_elements`` elements are too broad to say anything
    (a whole list or page). Returns None when the target has its own text, is not on the screen,
    or no small container with texts encloses it.
    """
    if target_ref is None:
        return None
    index = next((i for i, r in enumerate(records) if _field(r, "ref") == target_ref), None)
    if index is None or _element_text(records[index]):
        return None
    by_ref = {_field(r, "ref"): i for i, r in enumerate(records)}
    depths = [_field(r, "depth") or 0 for r in records]

    def parent_of(i: int) -> int | None:
        parent_ref = _field(records[i], "parent_ref")
        if parent_ref is not None and parent_ref in by_ref:
            return by_ref[parent_ref]
        for j in range(i - 1, -1, -1):  # document order: the nearest earlier, shallower element
            if depths[j] < depths[i]:
                return j
        return None

    node = parent_of(index)
    while node is not None and depths[node] >= 2:
        depth = depths[node]
        texts = []
        end = node + 1
        while end < len(records) and depths[end] > depth:
            end += 1
        if end - node > max_container_elements:
            return None
        for j in range(node, end):
            text = _element_text(records[j])
            if text and j != index:
                texts.append(text if len(text) <= max_chars else text[: max_chars - 3] + "...")
        if texts:
            return " ".join(json.dumps(t, ensure_ascii=False) for t in texts[:max_texts])
        node = parent_of(node)
    return None


def action_in_context(action_text: str, context: str | None) -> str:
    """An action as reward models read it: its canonical text, plus ``within <texts>`` when its
    target's own description cannot tell it apart (see :func:`target_context`)."""
    return f"{action_text} within {context}" if context else action_text


def progress_state(trajectory: TextTrajectory, t: int) -> StepState:
    """The state after action ``a_t``: ``[g, a_0..a_t, o_{t+1}]`` (Eq. 6 one step later), whose
    progress is the label p*_t. The last action's next screen is ``final_screen_lines`` if known,
    else the latest recorded screen ``o_t``."""
    steps = trajectory.steps
    if not 0 <= t < len(steps):
        raise IndexError(f"step {t} out of range for a trajectory of {len(steps)} steps")
    if t + 1 < len(steps):
        screen = steps[t + 1].screen_lines
    elif trajectory.final_screen_lines is not None:
        screen = trajectory.final_screen_lines
    else:
        screen = steps[t].screen_lines
    return StepState(trajectory.instruction, tuple(s.action for s in steps[: t + 1]), screen)


def action_state(trajectory: TextTrajectory, t: int) -> StepState:
    """The state before action ``a_t`` with ``a_t`` as the candidate: ``(g, a_0..a_{t-1}, o_t, a_t)``
    (GUI-Shepherd Eq. 1: r_t = PRM(I, s_t, a_t))."""
    steps = trajectory.steps
    if not 0 <= t < len(steps):
        raise IndexError(f"step {t} out of range for a trajectory of {len(steps)} steps")
    return StepState(trajectory.instruction, tuple(s.action for s in steps[:t]), steps[t].screen_lines, steps[t].action)


def state_for(kind: str, trajectory: TextTrajectory, t: int) -> StepState:
    """The state a model of ``kind`` scores at step ``t``."""
    return progress_state(trajectory, t) if kind_spec(kind).state == "after_action" else action_state(trajectory, t)


# ---------------------------------------------------------------------------------------------
# Prompts (ProgRM Tables 7-8) and the truncation rule
# ---------------------------------------------------------------------------------------------

#: ProgRM's system prompt (Table 7/8) with its WikiHow-specific sentences made interface-neutral.
SYSTEM_PROMPT = (
    "You are an expert of GUI use, on web pages and in mobile apps. You know well how people can "
    "search for things, fill in forms, pick options from lists, menus and tabs, and check what the "
    "screen shows. So you can accurately assess how efficient the people are finishing a particular "
    "task on this interface.\n"
    "Now you will be given a trajectory of other's operation, including\n"
    "* instructions describing the task goal\n"
    "* history actions leading to current state\n"
    "* screen representation reflecting the current state"
)
CANDIDATE_BULLET = "\n* a candidate action to take in the current state"

#: Counts tokens of several texts at once (a tokenizer's batch length, or an approximation).
TokenCounter = Callable[[Sequence[str]], Sequence[int]]


def approx_token_count(texts: Sequence[str]) -> list[int]:
    """About 4 characters per token (GPT/BERT-style tokenizers on English and markup); +1 per text."""
    return [len(t) // 4 + 1 for t in texts]


@dataclass(frozen=True)
class TruncationBudget:
    """How many tokens a prompt may take, and what is protected.

    The rule (:func:`truncate_state`): the instruction is always kept (cut only if it alone
    exceeds ``max_instruction_share`` of the budget); the ``keep_recent_actions`` latest actions
    and the candidate action are kept; the screen gets what remains and is cut from the end
    (document order: the page's top first); older actions fill any budget left, newest first.
    Omitted parts are marked ("[k earlier actions omitted]", "[n more elements]").
    """

    max_tokens: int = 2048
    keep_recent_actions: int = 3
    max_instruction_share: float = 0.25
    min_screen_tokens: int = 64


@dataclass(frozen=True, slots=True)
class TruncatedState:
    """What of a state fits the budget."""

    instruction: str
    history: tuple[str, ...]  # the kept (latest) actions
    n_history_omitted: int
    screen_lines: tuple[str, ...]
    n_screen_omitted: int
    action: str | None


def truncate_state(
    state: StepState,
    budget: TruncationBudget,
    count_tokens: TokenCounter = approx_token_count,
    overhead_tokens: int = 0,
) -> TruncatedState:
    """Apply the truncation rule of :class:`TruncationBudget` to one state.

    ``overhead_tokens`` is what the fixed prompt text costs. Tokens are counted per piece (one
    per action and per screen line, +1 each for the newline), which slightly over-counts.
    """
    pieces = [state.instruction, state.action or "", *state.history, *state.screen_lines]
    counts = [int(c) + 1 for c in count_tokens(pieces)]
    n_hist = len(state.history)
    instr_tokens, action_tokens = counts[0], counts[1] if state.action else 0
    hist_tokens = counts[2 : 2 + n_hist]
    line_tokens = counts[2 + n_hist :]

    available = budget.max_tokens - overhead_tokens
    instruction = state.instruction
    max_instr = max(16, int(budget.max_instruction_share * budget.max_tokens))
    if instr_tokens > max_instr:  # keep the start of a pathological instruction
        keep_chars = max(1, int(len(instruction) * max_instr / instr_tokens))
        instruction = instruction[:keep_chars] + " [...]"
        instr_tokens = max_instr
    available -= instr_tokens + action_tokens

    recent = min(budget.keep_recent_actions, n_hist)
    recent_tokens = sum(hist_tokens[n_hist - recent :])
    screen_allowance = max(budget.min_screen_tokens, available - recent_tokens)
    kept_lines = 0
    used = 0
    for tokens in line_tokens:
        if used + tokens > screen_allowance:
            break
        used += tokens
        kept_lines += 1
    available -= used + recent_tokens

    kept_history = recent
    for tokens in reversed(hist_tokens[: n_hist - recent]):
        if tokens > available:
            break
        available -= tokens
        kept_history += 1
    return TruncatedState(
        instruction=instruction,
        history=tuple(state.history[n_hist - kept_history :]),
        n_history_omitted=n_hist - kept_history,
        screen_lines=tuple(state.screen_lines[:kept_lines]),
        n_screen_omitted=len(state.screen_lines) - kept_lines,
        action=state.action,
    )


def _format_history(kept: TruncatedState) -> str:
    if not kept.history and not kept.n_history_omitted:
        return "None"
    lines = [f"[{kept.n_history_omitted} earlier actions omitted]"] if kept.n_history_omitted else []
    lines += [f"{kept.n_history_omitted + i + 1}. {a}" for i, a in enumerate(kept.history)]
    return "\n" + "\n".join(lines)


def _format_screen(kept: TruncatedState) -> str:
    lines = list(kept.screen_lines)
    if kept.n_screen_omitted:
        lines.append(f"[{kept.n_screen_omitted} more elements]")
    return "\n" + "\n".join(lines) if lines else "(empty)"


def prompt_parts(kind: str) -> tuple[str, str]:
    """(system prompt, question) of a kind: Table 7 for ProgRM, Table 8 for the ORM, and the same
    frame with a candidate action for step judges."""
    spec = kind_spec(kind)
    system = SYSTEM_PROMPT + (CANDIDATE_BULLET if spec.state == "before_action" else "")
    return system, spec.question


def render_user_message(kind: str, kept: TruncatedState) -> str:
    """The user turn of Tables 7/8: question, instructions, history actions, current screen."""
    _, question = prompt_parts(kind)
    text = (
        f"{question}\nInstructions: {kept.instruction}\nHistory Actions: {_format_history(kept)}\n"
        f"Current screen: {_format_screen(kept)}"
    )
    if kept.action is not None:
        text += f"\nCandidate action: {kept.action}"
    return text


def render_prompt(
    kind: str,
    state: StepState,
    budget: TruncationBudget = TruncationBudget(),
    count_tokens: TokenCounter = approx_token_count,
) -> str:
    """The whole prompt as plain text ("System: ...\\nUser: ..."), truncated to ``budget``.

    Models with a chat template render the same two messages with it instead (see
    ``training.models``); the truncation rule is the same.
    """
    system, question = prompt_parts(kind)
    frame = (
        f"System: {system}\nUser: {question}\nInstructions: \nHistory Actions: \nCurrent screen: \nCandidate action: "
    )
    overhead = int(count_tokens([frame])[0]) + 8
    kept = truncate_state(state, budget, count_tokens, overhead_tokens=overhead)
    return f"System: {system}\nUser: {render_user_message(kind, kept)}"


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def progress_gains(progress: Sequence[float] | np.ndarray, k: int = 1) -> np.ndarray:
    """ProgRM Eq. (2): r_t = p_t - p_{t-k}, with p_{-1} = ... = 0 (the "Init" placeholder of Fig. 5)."""
    if k < 1:
        raise ValueError("the progress history length k must be >= 1")
    p = np.asarray(progress, dtype=np.float64)
    previous = np.concatenate([np.zeros(min(k, p.size)), p[:-k]]) if p.size else p
    return p - previous


def outcome_anchored_progress(
    progress: Sequence[float] | np.ndarray, success: bool, *, tolerance: float = 1e-9
) -> np.ndarray:
    """Progress labels that agree with the trajectory's outcome: the outcome is the last milestone.

    ProgRM's labels (§2.2) come from key steps alone, so they can contradict the environment's own
    verdict: a successful trajectory whose task spec misses one of its paths ends below 1, and a
    failed one that matched the whole recipe (a wrong value typed, a wrong item clicked) ends at 1.
    The success judgement of Table 2 reads the final score, so such labels teach the model to
    misjudge exactly those trajectories. Here the environment's outcome is treated as the task's
    final milestone, as WikiHow's task-completion reward is:

    * successful: the final step's label is 1 (reaching the goal implies every sub-goal);
    * failed: no step reaches 1; a step labelled 1 gets the highest label below 1 reached so far
      in the trajectory (0 if none): the step that would have completed the task did not.

    Labels strictly between the two are unchanged, so key-step progress is unaffected.
    """
    p = np.asarray(progress, dtype=np.float64).copy()
    if not p.size:
        return p
    if success:
        p[-1] = 1.0
        return p
    best_below_one = 0.0
    for t in range(p.size):
        if p[t] >= 1.0 - tolerance:
            p[t] = best_below_one
        else:
            best_below_one = max(best_below_one, p[t])
    return p


def derive_step_verdicts(progress: Sequence[float], success: bool, *, tolerance: float = 1e-9) -> list[Verdict]:
    """Step correctness derived from progress labels, where no human looked at the step.

    * every step of a successful trajectory is positive (GuidNav §3.1: demonstrated steps are
      assumed correct);
    * in a failed trajectory, a step that gains progress (p*_t > p*_{t-1}, a key step) is
      positive; a step after the last gain is negative (the trajectory went nowhere from there);
      a non-gaining step before the last gain is ``unsure`` (a detour or a needed preparatory
      step: the labels cannot tell), and is filtered like GUI-Shepherd's unsure (App. A.2).
    """
    if success:
        return ["positive"] * len(progress)
    gains = progress_gains(progress)
    gaining = np.flatnonzero(gains > tolerance)
    last_gain = int(gaining[-1]) if gaining.size else -1
    return [
        "positive" if gains[t] > tolerance else ("negative" if t > last_gain else "unsure") for t in range(len(gains))
    ]


HUMAN_POSITIVE = frozenset({"positive", "correct", "good", "true", "yes"})
HUMAN_NEGATIVE = frozenset({"negative", "incorrect", "wrong", "bad", "false", "no"})


def human_step_verdicts(rows: Iterable[Mapping]) -> dict[tuple[str, int], tuple[Verdict, int]]:
    """Majority vote of human step labels per (episode_id, step_idx): (verdict, number of votes).

    Labels other than positive / negative (``unsure``, ``skip``, ...) count as unsure; a tie,
    or only unsure votes, gives ``unsure`` (filtered downstream, GUI-Shepherd App. A.2).
    """
    votes: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for row in rows:
        label = str(row.get("label") or "").strip().lower()
        vote = "positive" if label in HUMAN_POSITIVE else "negative" if label in HUMAN_NEGATIVE else "unsure"
        votes[(str(row["episode_id"]), int(row["step_idx"]))][vote] += 1
    result: dict[tuple[str, int], tuple[Verdict, int]] = {}
    for key, counter in votes.items():
        pos, neg = counter["positive"], counter["negative"]
        verdict: Verdict = "positive" if pos > neg else "negative" if neg > pos else "unsure"
        result[key] = (verdict, sum(counter.values()))
    return result


#: GuidNav's scalar step reward for each verdict (1 for a correct step, 0 for a wrong one);
#: an unsure step is not dropped from a regression: it is worth half.
GUIDNAV_REWARD: dict[str, float] = {"positive": 1.0, "negative": 0.0, "unsure": 0.5}


def sampled_steps(episode_id: str, n_steps: int, n_sampled: int | None) -> list[int]:
    """Which steps of a trajectory to keep when ``n_sampled`` of ``n_steps`` are kept (ProgRM
    App. C samples failed trajectories' steps to balance success:failure ~1:1).

    Deterministic: the steps whose hash of (episode, step) is smallest, in step order.
    """
    if n_sampled is None or n_sampled >= n_steps:
        return list(range(n_steps))
    n_sampled = max(0, n_sampled)
    ranked = sorted(range(n_steps), key=lambda t: hashlib.sha1(f"{episode_id}:{t}".encode()).digest())
    return sorted(ranked[:n_sampled])


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeLabels:
    """Per-step progress labels of one episode from one source (``progress_labels`` rows)."""

    progress: tuple[float, ...]
    is_key_step: tuple[bool, ...]
    label_version: str | None


@dataclass(frozen=True)
class SplitInfo:
    """An episode's row of ``progress_split``."""

    split: str
    goal_key: str | None = None
    n_steps_sampled: int | None = None
    sampled: tuple[int, ...] | None = None  # which steps the balancing kept, when the split says


@dataclass
class DatasetStats:
    """What building one kind's dataset kept, and what it dropped and why."""

    kind: str
    examples_by_split: dict[str, int] = field(default_factory=dict)
    label_mean_by_split: dict[str, float] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)
    label_sources: Counter = field(default_factory=Counter)
    label_versions: set[str] = field(default_factory=set)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "examples_by_split": self.examples_by_split,
            "label_mean_by_split": {k: round(v, 4) for k, v in self.label_mean_by_split.items()},
            "dropped": dict(self.dropped),
            "label_sources": dict(self.label_sources),
            "label_versions": sorted(self.label_versions),
        }


@dataclass(frozen=True)
class DatasetOptions:
    """Parameters of dataset building (recorded in lineage)."""

    # progress_labels.method of the LCS labels: improved (the pipeline's better labels, about half
    # the paper mode's key-step error against milestones) | paper (ProgRM §2.2 as published)
    lcs_method: str = "improved"
    derived_from: str = "lcs"  # labels step verdicts are derived from where no human label: lcs | env
    prompt_budget: TruncationBudget = TruncationBudget()
    sample_failed_steps: bool = True  # ProgRM App. C balancing (progrm_* kinds)
    # progrm_* kinds: the outcome as the final milestone (:func:`outcome_anchored_progress`); an
    # episode without labels of its kind's source then falls back (see :func:`fallback_sources`)
    # instead of being dropped
    anchor_outcome: bool = True

    def to_json(self) -> dict:
        return {
            "anchor_outcome": self.anchor_outcome,
            "lcs_method": self.lcs_method,
            "derived_from": self.derived_from,
            "prompt_max_tokens": self.prompt_budget.max_tokens,
            "keep_recent_actions": self.prompt_budget.keep_recent_actions,
            "sample_failed_steps": self.sample_failed_steps,
        }


def fallback_sources(kind: str, options: DatasetOptions) -> tuple[str, ...]:
    """Where a progress kind's labels come from for an episode its own source did not label.

    ProgRM-Env's milestone labels exist only for tasks with a task spec; on the others the best
    progress label there is, is the LCS one. Anchored to the outcome (``anchor_outcome``), an
    episode labelled by nobody gets outcome-only labels (0, then 1 at a success's last step),
    since the outcome is the one milestone every task has. Without anchoring (§2.2 as
    published) such episodes are dropped.
    """
    if not options.anchor_outcome:
        return ()
    return ("lcs", "outcome") if kind_spec(kind).label_source == "env" else ("outcome",)


def build_examples(
    kind: str,
    trajectories: Mapping[str, TextTrajectory],
    splits: Mapping[str, SplitInfo],
    *,
    progress_labels: Mapping[str, Mapping[str, EpisodeLabels]],
    human_verdicts: Mapping[tuple[str, int], tuple[Verdict, int]] | None = None,
    options: DatasetOptions = DatasetOptions(),
    count_tokens: TokenCounter = approx_token_count,
) -> tuple[pa.Table, DatasetStats]:
    """One kind's examples (``rm_examples`` rows) from trajectories, splits and labels.

    ``progress_labels[source][episode_id]`` holds the labels of a source: ``"lcs"`` (already
    restricted to ``options.lcs_method``) and ``"env"``. Episodes without a split are skipped;
    episodes without the labels a kind needs are skipped and counted in ``stats.dropped``.
    """
    spec = kind_spec(kind)
    human_verdicts = human_verdicts or {}
    stats = DatasetStats(kind)
    rows: dict[str, list] = {name: [] for name in RM_EXAMPLES.names}

    def add(
        traj: TextTrajectory,
        info: SplitInfo,
        t: int,
        state: StepState,
        label: float,
        source: str,
        version: str | None,
        key: bool | None,
    ) -> None:
        rows["example_id"].append(f"{kind}:{traj.episode_id}:{t}")
        rows["kind"].append(kind)
        rows["split"].append(info.split)
        rows["episode_id"].append(traj.episode_id)
        rows["task_id"].append(traj.task_id)
        rows["goal_key"].append(info.goal_key)
        rows["step_idx"].append(t)
        rows["n_steps"].append(len(traj))
        rows["instruction"].append(state.instruction)
        rows["history"].append(list(state.history))
        rows["screen_lines"].append(list(state.screen_lines))
        rows["action"].append(state.action)
        rows["prompt"].append(render_prompt(kind, state, options.prompt_budget, count_tokens))
        rows["label"].append(float(label))
        rows["label_source"].append(source)
        rows["label_version"].append(version)
        rows["is_key_step"].append(key)
        rows["episode_success"].append(traj.success)
        stats.label_sources[source] += 1
        if version:
            stats.label_versions.add(version)

    derived_source = "lcs" if options.derived_from == "lcs" else "env"
    derived_name = f"derived:{derived_source}" + (f":{options.lcs_method}" if derived_source == "lcs" else "")
    for episode_id in sorted(trajectories):
        traj = trajectories[episode_id]
        info = splits.get(episode_id)
        if info is None:
            stats.dropped["no split"] += 1
            continue
        if not traj.steps:
            stats.dropped["no steps"] += 1
            continue
        n = len(traj)
        if spec.target == "outcome":
            if traj.success is None:
                stats.dropped["no outcome"] += 1
                continue
            add(traj, info, n - 1, progress_state(traj, n - 1), float(traj.success), "outcome", None, None)
            continue
        if spec.target == "progress":
            source = spec.label_source or "lcs"
            labels = progress_labels.get(source, {}).get(episode_id)
            if labels is not None and len(labels.progress) != n:
                stats.dropped[f"{source} labels length mismatch"] += 1
                continue
            if labels is None and traj.success is not None:
                for fallback in fallback_sources(kind, options):
                    if fallback == "outcome":  # the one milestone every task has
                        progress = outcome_anchored_progress(np.zeros(n), bool(traj.success))
                        labels = EpisodeLabels(
                            tuple(float(v) for v in progress), tuple(bool(v > 0) for v in progress), None
                        )
                    else:
                        labels = progress_labels.get(fallback, {}).get(episode_id)
                        labels = labels if labels is not None and len(labels.progress) == n else None
                    if labels is not None:
                        source = fallback
                        break
            if labels is None:
                stats.dropped[f"no {spec.label_source or 'lcs'} labels"] += 1
                continue
            name = {"lcs": f"lcs:{options.lcs_method}", "outcome": "outcome"}.get(source, source)
            if source != "outcome" and options.anchor_outcome and traj.success is not None:
                labels = EpisodeLabels(
                    tuple(float(v) for v in outcome_anchored_progress(labels.progress, traj.success)),
                    labels.is_key_step,
                    labels.label_version,
                )
                name += "+outcome"
            keep: Sequence[int]
            if not options.sample_failed_steps:
                keep = range(n)
            elif info.sampled is not None:  # the split's own choice of steps (App. C balancing)
                keep = sorted(t for t in set(info.sampled) if 0 <= t < n)
            elif traj.success is False:
                keep = sampled_steps(episode_id, n, info.n_steps_sampled)
            else:
                keep = range(n)
            stats.dropped["failed steps not sampled (App. C)"] += n - len(keep)
            for t in keep:
                add(
                    traj,
                    info,
                    t,
                    progress_state(traj, t),
                    labels.progress[t],
                    name,
                    labels.label_version,
                    labels.is_key_step[t],
                )
            continue
        # step judges: human verdicts where present, derived verdicts otherwise
        derived_labels = progress_labels.get(derived_source, {}).get(episode_id)
        derived: list[Verdict] | None = None
        if derived_labels is not None and len(derived_labels.progress) == n and traj.success is not None:
            derived = derive_step_verdicts(derived_labels.progress, traj.success)
        for t in range(n):
            human = human_verdicts.get((episode_id, t))
            version: str | None
            if human is not None:  # a person looked at the step; if they were unsure, so are we
                verdict, source, version = human[0], "human", "human_labels"
            elif derived is not None and derived_labels is not None:
                verdict, source, version = derived[t], derived_name, derived_labels.label_version
            else:
                stats.dropped["no step label"] += 1
                continue
            if spec.target == "step_correctness":
                if verdict == "unsure":
                    stats.dropped[f"unsure ({source.split(':')[0]})"] += 1
                    continue
                label = 1.0 if verdict == "positive" else 0.0
            else:
                label = GUIDNAV_REWARD[verdict]
            key = derived_labels.is_key_step[t] if derived is not None and derived_labels is not None else None
            add(traj, info, t, action_state(traj, t), label, source, version, key)

    table = pa.Table.from_pydict(rows, schema=RM_EXAMPLES)
    for split in SPLITS:
        split_labels = [lab for lab, s in zip(rows["label"], rows["split"], strict=True) if s == split]
        stats.examples_by_split[split] = len(split_labels)
        if split_labels:
            stats.label_mean_by_split[split] = float(np.mean(split_labels))
    return table, stats


def trl_stepwise_rows(
    trajectories: Mapping[str, TextTrajectory],
    splits: Mapping[str, SplitInfo],
    verdicts: Mapping[str, Sequence[tuple[Verdict, str]]],
    *,
    max_screen_chars: int = 4000,
) -> pa.Table:
    """Step-correctness labels in TRL's stepwise-supervision format (``prompt``, ``completions``,
    ``labels``; one bool per completion), so a PRM can be trained with ``trl.PRMTrainer``.

    ``verdicts[episode_id][t] = (verdict, label_source)``. The prompt carries the instruction and
    the actions before the row's first step; each completion is one step: the screen the agent
    saw (cut at ``max_screen_chars``) and its action. TRL has no "ignore" label, so an ``unsure``
    step ends a row and the next labelled step starts a new one whose prompt lists the history.
    """
    rows: dict[str, list] = {name: [] for name in RM_TRL_STEPWISE.names}

    def flush(traj: TextTrajectory, start: int, completions: list[str], labels: list[bool], sources: list[str]) -> None:
        if not completions:
            return
        history = traj.actions[:start]
        history_text = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(history)) if history else "None"
        prompt = (
            f"{SYSTEM_PROMPT}{CANDIDATE_BULLET}\n{KINDS['prm'].question}\n"
            f"Instructions: {traj.instruction}\nHistory Actions: {history_text}"
        )
        info = splits[traj.episode_id]
        rows["example_id"].append(f"{traj.episode_id}:{start}")
        rows["split"].append(info.split)
        rows["episode_id"].append(traj.episode_id)
        rows["task_id"].append(traj.task_id)
        rows["first_step_idx"].append(start)
        rows["prompt"].append(prompt)
        rows["completions"].append(list(completions))
        rows["labels"].append(list(labels))
        rows["label_sources"].append(list(sources))

    for episode_id in sorted(verdicts):
        traj = trajectories.get(episode_id)
        if traj is None or episode_id not in splits:
            continue
        start = 0
        completions: list[str] = []
        labels: list[bool] = []
        sources: list[str] = []
        for t, (verdict, source) in enumerate(verdicts[episode_id]):
            if verdict == "unsure":
                flush(traj, start, completions, labels, sources)
                start, completions, labels, sources = t + 1, [], [], []
                continue
            screen = "\n".join(traj.steps[t].screen_lines)
            if len(screen) > max_screen_chars:
                screen = screen[:max_screen_chars] + "\n[...]"
            completions.append(f"Current screen:\n{screen}\nAction: {traj.steps[t].action}")
            labels.append(verdict == "positive")
            sources.append(source)
        flush(traj, start, completions, labels, sources)
    return pa.Table.from_pydict(rows, schema=RM_TRL_STEPWISE)


def step_verdicts_for_export(
    trajectories: Mapping[str, TextTrajectory],
    progress_labels: Mapping[str, EpisodeLabels],
    human_verdicts: Mapping[tuple[str, int], tuple[Verdict, int]],
    derived_name: str,
) -> dict[str, list[tuple[Verdict, str]]]:
    """Per episode and step: (verdict, source), human where present, else derived (PRM rule)."""
    result: dict[str, list[tuple[Verdict, str]]] = {}
    for episode_id, traj in trajectories.items():
        labels = progress_labels.get(episode_id)
        derived = (
            derive_step_verdicts(labels.progress, traj.success)
            if labels is not None and len(labels.progress) == len(traj) and traj.success is not None
            else None
        )
        out: list[tuple[Verdict, str]] = []
        for t in range(len(traj)):
            human = human_verdicts.get((episode_id, t))
            if human is not None:
                out.append((human[0], "human"))
            elif derived is not None:
                out.append((derived[t], derived_name))
            else:
                out.append(("unsure", "none"))
        result[episode_id] = out
    return result


# ---------------------------------------------------------------------------------------------
# Reading the warehouse
# ---------------------------------------------------------------------------------------------


def view_exists(warehouse: Warehouse, name: str) -> bool:
    """Whether a table or view is defined in the catalog (e.g. ``human_labels`` before it lands)."""
    if not warehouse.db_path.exists():
        return False
    rows = warehouse.query(
        "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [name]
    ).to_pylist()
    return bool(rows and rows[0]["n"])


def read_splits(warehouse: Warehouse) -> dict[str, SplitInfo]:
    """``progress_split``: episode -> split (train / validation / test), goal, sampled steps."""
    table = warehouse.query("SELECT * FROM progress_split")
    has_list = "sampled_steps" in table.column_names
    return {
        r["episode_id"]: SplitInfo(
            r["split"],
            r.get("goal_key"),
            r.get("n_steps_sampled"),
            tuple(r["sampled_steps"]) if has_list and r["sampled_steps"] is not None else None,
        )
        for r in table.to_pylist()
    }


def read_progress_labels(warehouse: Warehouse, source: str, method: str | None = None) -> dict[str, EpisodeLabels]:
    """``progress_labels`` of one source (and LCS method) per episode, in step order.

    If several label versions are current for the same source and method, the latest
    ``label_version`` (lexicographic) wins, so one episode never mixes versions.
    """
    sql = "SELECT episode_id, step_idx, progress, is_key_step, label_version FROM progress_labels WHERE source = ?"
    params: list = [source]
    if method is not None:
        sql += " AND method = ?"
        params.append(method)
    table = warehouse.query(sql + " ORDER BY episode_id, label_version, step_idx", params)
    grouped: dict[tuple[str, str | None], list[tuple[int, float, bool]]] = defaultdict(list)
    for r in table.to_pylist():
        grouped[(r["episode_id"], r["label_version"])].append((r["step_idx"], r["progress"], r["is_key_step"]))
    result: dict[str, EpisodeLabels] = {}
    for (episode_id, version), steps in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        steps.sort()
        if [s[0] for s in steps] != list(range(len(steps))):
            continue  # gaps in step indices: not a usable label sequence
        result[episode_id] = EpisodeLabels(tuple(float(s[1]) for s in steps), tuple(bool(s[2]) for s in steps), version)
    return result


def read_human_verdicts(warehouse: Warehouse) -> tuple[dict[tuple[str, int], tuple[Verdict, int]], list[str]]:
    """Human step-correctness verdicts and the tables they came from (empty when there are none:
    the annotation stage may not have run, or its views may not exist yet).

    ``human_step_labels`` (the annotation stage's per-step aggregate: majority of usable votes,
    null on a tie) is read when it has rows; otherwise ``human_labels`` itself, keeping the
    ``step_correctness`` interface's active, not skipped answers, by majority vote here.
    A step whose only answers were ``unsure`` is ``unsure`` (filtered, GUI-Shepherd App. A.2).
    """
    if view_exists(warehouse, "human_step_labels"):
        table = warehouse.query("SELECT * FROM human_step_labels")
        if table.num_rows and {"episode_id", "step_idx", "correctness"} <= set(table.column_names):
            verdicts: dict[tuple[str, int], tuple[Verdict, int]] = {}
            for r in table.to_pylist():
                votes = int(r.get("correctness_votes") or 0) + int(r.get("unsure_votes") or 0)
                if r["correctness"] in ("positive", "negative"):
                    verdicts[(r["episode_id"], int(r["step_idx"]))] = (r["correctness"], votes)
                elif votes:
                    verdicts[(r["episode_id"], int(r["step_idx"]))] = ("unsure", votes)
            return verdicts, ["human_step_labels"]
    if not view_exists(warehouse, "human_labels"):
        return {}, []
    table = warehouse.query("SELECT * FROM human_labels")
    columns = set(table.column_names)
    if not table.num_rows or not {"episode_id", "step_idx", "label"} <= columns:
        return {}, []
    rows = [
        r
        for r in table.to_pylist()
        if r["episode_id"] is not None
        and r["step_idx"] is not None
        and r.get("interface", "step_correctness") in ("step_correctness", None)
        and r.get("status", "active") in ("active", None)
        and not r.get("was_cancelled")
    ]
    return human_step_verdicts(rows), ["human_labels"]


def read_trajectories(
    warehouse: Warehouse,
    episode_ids: Iterable[str] | None = None,
    *,
    batch_rows: int = 4096,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, TextTrajectory]:
    """Episodes and their steps as :class:`TextTrajectory` objects (screens rendered to lines).

    ``episode_ids`` restricts the read (e.g. one split); steps are converted in batches so the
    screens of the whole corpus never exist as Python objects at once.
    """
    where, params = "", []
    if episode_ids is not None:
        ids = sorted(set(episode_ids))
        if not ids:
            return {}
        where, params = "WHERE e.episode_id IN (SELECT unnest(?))", [ids]
    episodes = {
        r["episode_id"]: r
        for r in warehouse.query(
            f"SELECT e.episode_id, e.task_id, e.instruction, e.success FROM episodes e {where}", params
        ).to_pylist()
    }
    steps_table = warehouse.query(
        f"SELECT s.episode_id, s.step_idx, s.action_text, s.target_ref, s.screen FROM steps s "
        f"JOIN episodes e USING (episode_id) {where} ORDER BY s.episode_id, s.step_idx",
        params,
    )
    from warehouse.trajectories import screens_from_arrow

    steps: dict[str, list[TextStep]] = defaultdict(list)
    done = 0
    for batch in steps_table.to_batches(max_chunksize=batch_rows):
        # a batch is a slice of the query's table: rebase its list offsets first, else every batch
        # would convert the elements of the whole table
        screens = screens_from_arrow(pa.chunked_array([pa.concat_arrays([batch.column("screen")])]))
        for episode_id, action, target_ref, screen in zip(
            batch.column("episode_id").to_pylist(),
            batch.column("action_text").to_pylist(),
            batch.column("target_ref").to_pylist(),
            screens,
            strict=True,
        ):
            context = target_context(screen.elements, target_ref)
            steps[episode_id].append(TextStep(screen_lines(screen), action_in_context(action, context)))
        done += batch.num_rows
        if progress is not None:
            progress(done, steps_table.num_rows)
    return {
        episode_id: TextTrajectory(
            episode_id=episode_id,
            task_id=e["task_id"],
            instruction=e["instruction"] or "",
            steps=tuple(steps.get(episode_id, ())),
            success=e["success"],
        )
        for episode_id, e in episodes.items()
    }


@dataclass
class RewardModelDataset:
    """One kind's dataset as built from the warehouse (see :func:`build_reward_model_dataset`)."""

    kind: str
    examples: pa.Table
    stats: DatasetStats
    inputs: list[LineageInput]
    trl_stepwise: pa.Table | None = None
    human_labels_present: bool = False

    def summary(self) -> dict:
        return self.stats.to_json() | {"human_labels_present": self.human_labels_present}


def build_reward_model_dataset(
    warehouse: Warehouse,
    kind: str,
    options: DatasetOptions = DatasetOptions(),
    *,
    trajectories: Mapping[str, TextTrajectory] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RewardModelDataset:
    """Read splits, labels and trajectories from the warehouse and build ``kind``'s examples
    (plus, for ``prm``, the TRL stepwise export), with the lineage inputs to record."""
    spec = kind_spec(kind)
    splits = read_splits(warehouse)
    if not splits:
        raise ValueError("progress_split is empty: the reward-model split has not been materialized")
    labels: dict[str, dict[str, EpisodeLabels]] = {}
    needed: set[str] = (
        ({spec.label_source or "lcs", *fallback_sources(kind, options)} - {"outcome"})
        if spec.target == "progress"
        else set()
    )
    if spec.target in ("step_correctness", "step_reward"):
        needed.add(options.derived_from)
    for source in needed:
        labels[source] = read_progress_labels(warehouse, source, options.lcs_method if source == "lcs" else None)
    human, human_tables = (
        read_human_verdicts(warehouse) if spec.target in ("step_correctness", "step_reward") else ({}, [])
    )
    if trajectories is None:
        trajectories = read_trajectories(warehouse, splits.keys(), progress=progress)
    examples, stats = build_examples(
        kind, trajectories, splits, progress_labels=labels, human_verdicts=human, options=options
    )
    tables = ["episodes", "steps", "progress_split"] + (["progress_labels"] if needed else []) + human_tables
    trl = None
    if kind == "prm":
        source = options.derived_from
        derived_name = f"derived:{source}" + (f":{options.lcs_method}" if source == "lcs" else "")
        verdicts = step_verdicts_for_export(trajectories, labels.get(source, {}), human, derived_name)
        trl = trl_stepwise_rows(trajectories, splits, verdicts)
    return RewardModelDataset(kind, examples, stats, warehouse.current_inputs(tables), trl, bool(human))
