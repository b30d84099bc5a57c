"""The GUI-PRA judge (training-free process reward agent), over any OpenAI-compatible endpoint or,
without one, on the local reward model.

Per step, for the N candidates of the policy (Eq. 7: a* = argmax GUI-PRA(g, scr, e, H', (a, u), UI_t)):

1. **Dynamic memory** (§3.1, Eqs. 2-5). The history H_{t-1} = (u_i, a_i, o_i) is split into
   H_recent, the last ``recent_steps`` (m) steps kept whole (Eq. 2), and H_early, the rest (Eq. 3),
   condensed into one sentence S_sum = f_sum(H_early) (Eq. 4); H' = concat(S_sum, H_recent)
   (Eq. 5). It activates only when the history is longer than ``memory_threshold`` steps (App. B: 5).
   The paper lets the LLM choose m by relevance (F.1 stage 1); here m is fixed. S_sum comes from
   the endpoint (F.1 stage 2 prompt) or, without one, from :func:`extractive_summary`.
2. **Adaptive UI perception** (§3.2, Eq. 6). The judge notes whether the screen changed since the
   last step and chooses tools in a loop of at most K = 2 (App. B) until ``terminate``: a *global
   parse* of the screen (OmniParser's role: every element, numbered) or a *local lookup* of the
   elements around the candidates' targets (Point's role: the target, its containers, its
   neighbours, and its state). With an endpoint the LLM routes (F.2 rules: at least one tool, no
   tool twice); without one, F.2's heuristic: a global parse after a major change of the screen,
   a local lookup otherwise. The evidence is aggregated into UI_t.
3. **Scoring** (§3.3, App. F.3): a 0-10 score in tiers (0 severe; 1-2, 3-4, 5-6, 7-8, 9-10: the
   §3.3 text's five tiers and the prompt's floor of 0), with explicit penalties for repeated and
   wrong actions, and the previous step's action and score as context ("Here's the last action
   and its score"). With an endpoint the LLM scores each candidate (one call each, answer
   ``<eval>{"score": s, "original_step": ...}</eval>``). Without one the local step reward model
   gives the base score 10 * p(correct | state) and the rubric's penalties are applied as rules
   (:func:`rubric_score`); the output says so (``Verdict.mode == "local"`` and its note).

Bad endpoints: a call that fails (down, too slow, HTTP error) or an answer that does not parse
falls back to the local model's score for that candidate (mode ``fallback``, the reason in the
note); with no local model the candidate is unjudged, and when no candidate is judged the policy's
first candidate is executed (mode ``unjudged``). A down or too slow endpoint is not called again for
``retry_after_s``, so an episode goes on at the local model's pace.

Ablations (GUI-PRA Table 2): ``memory=False`` gives the judge the raw transcript (Eq. 1's standard
PRM input) instead of H'; ``perception=False`` gives it the raw screen only: it does not know
whether the last action changed the screen and looks up no target, so the rules that need that
evidence (an ineffective repeat, a field that already holds the text) do not apply.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from envs.protocol import EpisodeContext, StepResult
from training.base.states import StepState
from training.guidance.proposals import GuidanceError, Proposal
from training.guidance.verifiers import EpisodeVerifier, StepView, Verdict, load_local_scorer
from training.llm.chat_client import ChatClient, ChatEndpoint, ChatEndpointError
from training.reward_models.kinds import STEP_JUDGE_KINDS
from training.reward_models.scoring import LocalScorer
from warehouse.catalog import LineageInput, Warehouse
from warehouse.model import ActionType, Screen, UIElement

GLOBAL_PARSE = "global_parse"
LOCAL_LOOKUP = "local_lookup"
TERMINATE = "terminate"
TOOLS = (GLOBAL_PARSE, LOCAL_LOOKUP, TERMINATE)
#: Share of the screen's elements that must change for a "major UI change" (F.2's global parse).
MAJOR_CHANGE = 0.3
#: Score tiers (App. F.3), highest first: (low, high, meaning).
TIERS: tuple[tuple[int, int, str], ...] = (
    (9, 10, "Clearly advances the goal; highly efficient; strong use of reflection; no loops."),
    (7, 8, "Good progress; minor inefficiencies; clear use of reflection; minimal loop risk."),
    (5, 6, "Moderate progress; limited efficiency; moderate use of reflection; mild repetition risks."),
    (3, 4, "Poor progress; inefficient; weak use of reflection; noticeable loop risks."),
    (1, 2, "Minimal progress; repetitive actions leading to loops; significant errors or deviations from the plan."),
    (
        0,
        0,
        "Severe issues: explicit loops, critical errors that block progress, wrong Action Space, or complete "
        "irrelevance to the task.",
    ),
)
VARIANTS = ("full", "no_memory", "no_perception")


@dataclass(frozen=True)
class JudgeSettings:
    """The judge's configuration; ``endpoint`` None is the local mode."""

    memory: bool = True
    perception: bool = True
    recent_steps: int = 3  # m
    memory_threshold: int = 5  # App. B: memory activates beyond this many steps
    max_tools: int = 2  # K (App. B)
    endpoint: str | None = None  # an OpenAI-compatible base URL (…/v1)
    model: str = "default"
    timeout_s: float = 30.0
    max_tokens: int = 96
    local_kind: str = "prm"  # the local step reward model (local mode, and the fallback)
    retry_after_s: float = 30.0  # a down endpoint is left alone this long

    def __post_init__(self) -> None:
        if self.recent_steps < 1 or self.memory_threshold < 0 or self.max_tools < 1:
            raise GuidanceError("recent_steps and max_tools must be at least 1, memory_threshold at least 0")
        if self.local_kind not in STEP_JUDGE_KINDS:
            raise GuidanceError(f"the judge's local model must be a step judge ({', '.join(STEP_JUDGE_KINDS)})")

    @classmethod
    def for_variant(cls, variant: str, **kwargs: Any) -> JudgeSettings:
        """``full``, ``no_memory`` or ``no_perception`` (GUI-PRA Table 2's ablations)."""
        if variant not in VARIANTS:
            raise GuidanceError(f"unknown judge variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        return cls(memory=variant != "no_memory", perception=variant != "no_perception", **kwargs)

    @property
    def variant(self) -> str:
        if self.memory and self.perception:
            return "full"
        if not self.memory and not self.perception:
            return "no_memory_no_perception"
        return "no_memory" if not self.memory else "no_perception"


# ---------------------------------------------------------------------------------------------
# Dynamic memory (Eqs. 2-5)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryStep:
    """(u_i, a_i, o_i): the thought (empty for the learned policy), the action as reward models read
    it, what was observed after it, and the score the judge gave it."""

    index: int
    action: str
    thought: str = ""
    observation: str = ""
    score: float | None = None
    failed: bool = False

    def line(self) -> str:
        score = "" if self.score is None else f" [score {self.score:.1f}]"
        observed = f" -> {self.observation}" if self.observation else ""
        return f"{self.index + 1}. {self.action}{observed}{score}"


@dataclass(frozen=True)
class Memory:
    """H' = concat(S_sum, H_recent) (Eq. 5); ``active`` False: the raw transcript, whole."""

    summary: str
    recent: tuple[MemoryStep, ...]
    early: tuple[MemoryStep, ...] = ()
    active: bool = False

    def history_texts(self) -> tuple[str, ...]:
        """The history as a reward model reads it: the summary as one leading segment."""
        texts = tuple(s.action for s in self.recent)
        return (f"[summary of steps 1-{len(self.early)}] {self.summary}", *texts) if self.active else texts

    def text(self) -> str:
        lines = [f"Summary of the earlier steps: {self.summary}"] if self.active else []
        lines += [s.line() for s in self.recent] or ["(no steps yet)"]
        return "\n".join(lines)


def split_history(
    steps: Sequence[MemoryStep], recent_steps: int, threshold: int
) -> tuple[tuple[MemoryStep, ...], tuple[MemoryStep, ...]]:
    """(H_early, H_recent): Eqs. 3 and 2 with m = ``recent_steps``; nothing is early while the
    history has at most ``threshold`` steps (App. B's activation threshold)."""
    if len(steps) <= threshold or len(steps) <= recent_steps:
        return (), tuple(steps)
    return tuple(steps[:-recent_steps]), tuple(steps[-recent_steps:])


def extractive_summary(early: Sequence[MemoryStep]) -> str:
    """f_sum (Eq. 4) without an LLM: one sentence naming the distinct actions of H_early in order
    (with how often each was taken) and the steps that failed."""
    if not early:
        return ""
    counts = Counter(s.action for s in early)
    ordered = list(dict.fromkeys(s.action for s in early))
    shown = [a if counts[a] == 1 else f"{a} ({counts[a]} times)" for a in ordered[:8]]
    more = f" and {len(ordered) - 8} other actions" if len(ordered) > 8 else ""
    failed = [s for s in early if s.failed]
    failures = f"; {len(failed)} of them could not be carried out ({failed[0].action} first)" if failed else ""
    return f"In its first {len(early)} steps the agent took {', '.join(shown)}{more}{failures}."


def build_memory(
    steps: Sequence[MemoryStep],
    recent_steps: int,
    threshold: int,
    summarise: Callable[[Sequence[MemoryStep]], str] = extractive_summary,
) -> Memory:
    """f_mem (Eq. 5): the summary of H_early followed by H_recent."""
    early, recent = split_history(steps, recent_steps, threshold)
    if not early:
        return Memory("", recent)
    return Memory(summarise(early), recent, early, True)


# ---------------------------------------------------------------------------------------------
# Adaptive UI perception (Eq. 6)
# ---------------------------------------------------------------------------------------------


def _signature(e: UIElement) -> tuple:
    return (e.role, e.element_id, e.text, e.value, e.checked)


def screen_change(previous: Screen | None, current: Screen) -> float | None:
    """The share of elements that differ between two screens (1 - Jaccard over role, id, text,
    value, checked); None when there is no previous screen."""
    if previous is None:
        return None
    a = Counter(_signature(e) for e in previous.elements)
    b = Counter(_signature(e) for e in current.elements)
    union = sum((a | b).values())
    return 0.0 if union == 0 else 1.0 - sum((a & b).values()) / union


def _element_line(index: int, e: UIElement) -> str:
    parts = [f"[{index}] {e.role}"]
    if e.element_id:
        parts[0] += f"#{e.element_id}"
    if e.text or e.description:
        parts.append(json.dumps((e.text or e.description)[:60]))
    if e.value:
        parts.append(f"value={json.dumps(e.value[:40])}")
    if e.checked is not None:
        parts.append("checked" if e.checked else "unchecked")
    if e.focused:
        parts.append("focused")
    return " ".join(parts)


def global_parse(screen: Screen, max_elements: int = 60) -> tuple[str, ...]:
    """OmniParser's role: every element of the screen with text or an action, numbered (Set-of-Mark)."""
    shown = [e for e in screen.elements if e.text or e.description or e.clickable or e.editable or e.value]
    lines = [_element_line(i, e) for i, e in enumerate(shown[:max_elements])]
    if len(shown) > max_elements:
        lines.append(f"({len(shown) - max_elements} more elements)")
    return tuple(lines)


def local_lookup(screen: Screen, refs: Sequence[str], radius: int = 2) -> tuple[str, ...]:
    """Point's role: for each target, the element itself, the texts of its containers, and its
    ``radius`` nearest siblings in document order."""
    index = {e.ref: i for i, e in enumerate(screen.elements)}
    lines: list[str] = []
    for ref in dict.fromkeys(refs):
        i = index.get(ref)
        if i is None:
            lines.append(f"target {ref}: not on the screen")
            continue
        e = screen.elements[i]
        containers: list[str] = []
        parent = e.parent_ref
        while parent is not None and parent in index and len(containers) < 3:
            p = screen.elements[index[parent]]
            if p.text:
                containers.append(json.dumps(p.text[:40]))
            parent = p.parent_ref
        siblings = [
            s
            for s in screen.elements[max(0, i - 3 * radius) : i + 3 * radius + 1]
            if s.parent_ref == e.parent_ref and s.ref != e.ref
        ]
        near = [_element_line(index[s.ref], s) for s in siblings[: 2 * radius]]
        lines.append(
            f"target {_element_line(i, e)}"
            + (f" within {' / '.join(containers)}" if containers else "")
            + (f"; next to: {'; '.join(near)}" if near else "")
        )
    return tuple(lines)


def route_rule(change: float | None, has_targets: bool, used: Sequence[str]) -> str:
    """F.2's routing heuristic: a global parse after a major change (or on the first screen), a
    local lookup of the targets otherwise; no tool twice; at least one tool."""
    if not used:
        if change is None or change >= MAJOR_CHANGE or not has_targets:
            return GLOBAL_PARSE
        return LOCAL_LOOKUP
    if used[-1] == GLOBAL_PARSE and has_targets and LOCAL_LOOKUP not in used:
        return LOCAL_LOOKUP
    return TERMINATE


@dataclass(frozen=True)
class Perception:
    """UI_t: the tools called, in order, the aggregated evidence, and the screen's change."""

    tools: tuple[str, ...]
    evidence: tuple[str, ...]
    change: float | None
    calls: int = 0
    note: str = ""


def perceive(
    view: StepView,
    proposals: Sequence[Proposal],
    *,
    max_tools: int = 2,
    router: Callable[[Sequence[str], float | None], str | None] | None = None,
) -> Perception:
    """Eq. 6: tool_i ~ pi_tool(. | g, scr, H', I_{i-1}) for i = 1..K until ``terminate``;
    UI_t = f_aggregate(I). ``router`` is the LLM's choice (None when it failed: the rule decides)."""
    change = screen_change(view.previous_screen, view.screen)
    refs = [p.action.target.ref for p in proposals if p.action.target is not None]
    used: list[str] = []
    evidence: list[str] = []
    calls, note = 0, ""
    for _ in range(max_tools):
        tool = None
        if router is not None and not note:
            calls += 1
            tool = router(used, change)
            if tool is None:
                note = "router answer unusable: rule-based routing"
        if tool is None or tool in used or (tool == TERMINATE and not used):
            tool = route_rule(change, bool(refs), used)
        if tool == TERMINATE:
            break
        used.append(tool)
        if tool == GLOBAL_PARSE:
            evidence += ["(global parse)", *global_parse(view.screen)]
        else:
            evidence += ["(local lookup)", *local_lookup(view.screen, refs)]
    return Perception(tuple(used), tuple(evidence), change, calls, note)


# ---------------------------------------------------------------------------------------------
# The rubric (App. F.3)
# ---------------------------------------------------------------------------------------------


def tier_of(score: float) -> str:
    """The rubric band of a 0-10 score ("0", "1-2", ..., "9-10")."""
    s = int(round(score))
    for low, high, _ in TIERS:
        if low <= s <= high:
            return str(low) if low == high else f"{low}-{high}"
    return "0"


def rubric_score(
    base: float,
    candidate: str,
    executed: Sequence[str],
    failed: set[str],
    *,
    last_changed: bool | None,
    previous: tuple[str, float | None] | None,
    redundant: bool = False,
) -> tuple[float, tuple[str, ...]]:
    """The rubric's explicit penalties on a base score in [0, 10] (App. F.3 criteria 4-10 as rules):

    * repeating an action that could not be carried out: 0 (a critical error);
    * the same action a third time in a row: 0 (an explicit loop);
    * repeating the last action: at most 2 when it did not change the screen (an ineffective loop;
      needs perception), else -3; a further -2 when the last step's score was below 5 (context of
      the previous action and score);
    * typing into a field the text it already holds: at most 2 (no progress; needs perception).
    """
    if candidate in failed:
        return 0.0, ("repeats an action that could not be carried out",)
    if len(executed) >= 2 and executed[-1] == executed[-2] == candidate:
        return 0.0, ("explicit loop: the same action a third time in a row",)
    score, reasons = float(base), []
    if executed and executed[-1] == candidate:
        if last_changed is False:
            score = min(score, 2.0)
            reasons.append("repeats the last action, which did not change the screen")
        else:
            score -= 3.0
            reasons.append("repeats the last action")
        if previous is not None and previous[0] == candidate and previous[1] is not None and previous[1] < 5:
            score -= 2.0
            reasons.append("the last action, repeated here, scored below 5")
    if redundant:
        score = min(score, 2.0)
        reasons.append("the field already holds this text")
    return float(np.clip(score, 0.0, 10.0)), tuple(reasons)


JUDGE_SYSTEM = (
    "You are an expert evaluator of agents that operate graphical user interfaces. You score one candidate "
    "action for the current step of a task.\n"
    "Do not give a high score just because the reason and the action within the response are consistent. "
    "You need to prioritize whether the action is performed correctly.\n"
    "Criteria: progress toward the goal (penalize irrelevant or low-impact actions); errors and stability "
    "(fatal errors get the lowest scores); efficiency (penalize redundant or repetitive actions that yield no "
    "significant progress); loop detection (does this action repeat previous steps? If there are consecutive "
    "repetitive steps, reduce the score significantly); contextual awareness (use the memory and the screen); "
    "ensure the task is actually completed before choosing to end.\n"
    "Scoring Guidelines (0-10 Scale):\n"
    + "\n".join(f"- {low if low == high else f'{low}-{high}'}: {text}" for low, high, text in TIERS)
    + '\nAnswer with <eval>{"score": <0-10>, "original_step": "<the candidate action exactly>"}</eval> '
    "and nothing else."
)


def judge_messages(
    instruction: str,
    memory: Memory,
    perception: Perception | None,
    screen_lines: Sequence[str],
    candidate: str,
    previous: tuple[str, float | None] | None,
) -> list[dict[str, str]]:
    """The scoring prompt (App. F.3): task, memory H', UI_t (or the raw screen), the previous step's
    action and score, and the candidate."""
    if perception is not None:
        change = "unknown" if perception.change is None else f"{perception.change:.0%} of the elements changed"
        screen = f"Screen evidence (tools: {', '.join(perception.tools)}; since the last step {change}):\n" + "\n".join(
            perception.evidence[:80]
        )
    else:
        screen = "Current screen:\n" + "\n".join(list(screen_lines)[:80])
    last = "none (this is the first step)"
    if previous is not None:
        last = f"{previous[0]} with score {'unjudged' if previous[1] is None else f'{previous[1]:.1f}'}"
    user = (
        f"Task:\n{instruction}\n\nSteps so far:\n{memory.text()}\n\n{screen}\n\n"
        "Please complete a granular scoring for the current step based on the previous steps and scores. "
        f"Here's the last action and its score: {last}\n\nCandidate action:\n{candidate}"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


_EVAL = re.compile(r"<eval>(.*?)(?:</eval>|$)", re.IGNORECASE | re.DOTALL)
_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)
_SCORE = re.compile(r"[\"']?score[\"']?\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_judgement(text: str) -> float | None:
    """The score of an answer: the JSON object in ``<eval>...</eval>``, else a ``"score": s`` pair
    anywhere; clipped to [0, 10]; None when there is none (an unparsable answer)."""
    found = _EVAL.search(text or "")
    body = found.group(1) if found else (text or "")
    for candidate in _OBJECT.findall(body):
        try:
            value = json.loads(candidate).get("score")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
            return float(np.clip(value, 0.0, 10.0))
    match = _SCORE.search(body)
    if match:
        return float(np.clip(float(match.group(1)), 0.0, 10.0))
    return None


SUMMARY_SYSTEM = (
    "You condense the early part of a GUI agent's action history. Write one sentence that captures the main "
    "accomplishments and the state reached before the final few steps. Do not use a list format or mention "
    "step numbers."
)
ROUTER_SYSTEM = (
    "You choose a perception tool before a candidate action is judged. Tools: global_parse (parse the whole "
    "screen: use it after major UI changes or screen transitions), local_lookup (look at the elements around "
    "the candidates' targets: use it for a specific fine-grained element), terminate (enough evidence). "
    "Always ensure that at least one tool is used. Do not call any tool that you have used before. "
    "Answer with the tool's name only."
)


def parse_tool(text: str) -> str | None:
    """The first tool named in a router's answer, or None."""
    lowered = (text or "").lower()
    hits = [(lowered.find(t), t) for t in TOOLS if t in lowered]
    return min(hits)[1] if hits else None


# ---------------------------------------------------------------------------------------------
# The judge as a verifier
# ---------------------------------------------------------------------------------------------


@dataclass
class _EndpointHealth:
    down_until: float = 0.0
    reason: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def available(self) -> bool:
        with self.lock:
            return time.monotonic() >= self.down_until

    def mark_down(self, reason: str, seconds: float) -> None:
        with self.lock:
            self.down_until, self.reason = time.monotonic() + seconds, reason


@dataclass
class JudgeVerifier:
    """GUI-PRA as a best-of-N verifier (see the module docstring)."""

    settings: JudgeSettings
    local: LocalScorer | None
    client: ChatClient | None
    name: str = "judge"
    health: _EndpointHealth = field(default_factory=_EndpointHealth)

    @property
    def mode(self) -> str:
        return "endpoint" if self.client is not None else "local"

    def start(self, context: EpisodeContext) -> EpisodeVerifier:
        return _JudgeEpisode(self)

    def lineage(self) -> list[LineageInput]:
        out = self.local.lineage() if self.local is not None else []
        if self.settings.endpoint:
            out.append(LineageInput(kind="file", path=self.settings.endpoint, version=self.settings.model))
        return out

    def chat(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[str | None, str]:
        """(the answer, "") or (None, why not): a down endpoint is not called (see the module doc)."""
        if self.client is None:
            return None, "no endpoint"
        if not self.health.available():
            return None, f"endpoint down ({self.health.reason})"
        try:
            return self.client.complete(messages, max_tokens=max_tokens, temperature=0.0), ""
        except ChatEndpointError as exc:
            reason = str(exc)
            if "not reachable" in reason:
                self.health.mark_down(reason[:160], self.settings.retry_after_s)
            return None, reason[:200]


class _JudgeEpisode:
    def __init__(self, judge: JudgeVerifier) -> None:
        self.judge = judge
        self.steps: list[MemoryStep] = []
        self.previous: tuple[str, float | None] | None = None
        self.summaries: dict[int, str] = {}
        self.screen: Screen | None = None

    # -- memory and perception --------------------------------------------------------------

    def _summarise(self, early: Sequence[MemoryStep]) -> tuple[str, int, str]:
        """(S_sum, calls, note): the endpoint's sentence (cached per length of H_early), else extractive."""
        if len(early) in self.summaries:
            return self.summaries[len(early)], 0, ""
        if self.judge.client is None:
            return extractive_summary(early), 0, ""
        listing = "\n".join(s.line() for s in early)
        answer, why = self.judge.chat(
            [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": listing}],
            self.judge.settings.max_tokens,
        )
        calls = 0 if why.startswith("endpoint down") else 1
        text = " ".join((answer or "").split())[:400]
        if not text:
            return extractive_summary(early), calls, f"summary: extractive ({why or 'empty answer'})"
        self.summaries[len(early)] = text
        return text, calls, ""

    def _router(self, view: StepView, memory: Memory) -> Callable[[Sequence[str], float | None], str | None] | None:
        if self.judge.client is None:
            return None

        def route(used: Sequence[str], change: float | None) -> str | None:
            changed = "unknown (first step)" if change is None else f"{change:.0%} of the elements changed"
            user = (
                f"Task: {view.instruction}\nSteps so far:\n{memory.text()}\nSince the last step: {changed}.\n"
                f"Tools used so far: {', '.join(used) or 'none'}.\nWhich tool next?"
            )
            answer, _ = self.judge.chat(
                [{"role": "system", "content": ROUTER_SYSTEM}, {"role": "user", "content": user}], 16
            )
            return parse_tool(answer) if answer is not None else None

        return route

    # -- scoring -------------------------------------------------------------------------------

    def score(self, view: StepView, proposals: Sequence[Proposal]) -> Verdict:
        settings, judge = self.judge.settings, self.judge
        self.screen = view.screen
        raw = tuple(self.steps)
        calls, notes = 0, []
        if settings.memory:
            early, recent = split_history(raw, settings.recent_steps, settings.memory_threshold)
            memory = Memory("", recent)
            if early:
                summary, used, note = self._summarise(early)
                memory = Memory(summary, recent, early, True)
                calls += used
                notes += [note] if note else []
        else:
            memory = Memory("", raw)  # the raw transcript (Eq. 1's input)
        perception = None
        if settings.perception:
            perception = perceive(view, proposals, max_tools=settings.max_tools, router=self._router(view, memory))
            calls += perception.calls
            notes += [perception.note] if perception.note else []
        executed = [s.action for s in raw]
        failed = {s.action for s in raw if s.failed}
        last_changed = None
        if perception is not None and raw:
            last_changed = bool(perception.change) if perception.change is not None else None

        scores: list[float | None] = [None] * len(proposals)
        sources: list[str] = [""] * len(proposals)
        failures: list[str] = []
        if judge.client is not None:
            for i, p in enumerate(proposals):
                messages = judge_messages(
                    view.instruction, memory, perception, view.screen_lines, p.description, self.previous
                )
                answer, why = judge.chat(messages, settings.max_tokens)
                if not why.startswith("endpoint down"):
                    calls += 1
                parsed = parse_judgement(answer) if answer is not None else None
                if parsed is None:
                    failures.append(why or f"unparsable answer {(answer or '')[:60]!r}")
                else:
                    scores[i], sources[i] = parsed, "endpoint"
        need_local = [i for i, s in enumerate(scores) if s is None]
        penalties: dict[int, tuple[str, ...]] = {}
        if need_local and judge.local is not None:
            states = [
                StepState(view.instruction, memory.history_texts(), view.screen_lines, proposals[i].description)
                for i in need_local
            ]
            base = judge.local.scorer.score_states(states)
            calls += 1
            for i, b in zip(need_local, base, strict=True):
                p = proposals[i]
                redundant = (
                    perception is not None
                    and p.action.type is ActionType.INPUT
                    and p.action.target is not None
                    and (view.screen.by_ref(p.action.target.ref) or p.action.target).value == p.action.text
                )
                scores[i], penalties[i] = rubric_score(
                    10.0 * float(b),
                    p.description,
                    executed,
                    failed,
                    last_changed=last_changed,
                    previous=self.previous,
                    redundant=redundant,
                )
                sources[i] = "local"
        if all(s is None for s in scores):
            mode = "unjudged"
            notes.append("no candidate judged: " + (failures[0] if failures else "no scorer") + "; the policy's first")
        elif judge.client is None:
            mode = "local"
            notes.append(
                f"local mode (no endpoint configured): {settings.local_kind} reward model under the GUI-PRA rubric, "
                "extractive memory summary, rule-based perception"
            )
        elif failures:
            mode = "fallback"
            notes.append(
                f"endpoint failed for {len(failures)}/{len(proposals)} candidates ({failures[0]}): "
                + ("local scores" if judge.local is not None else "left unjudged")
            )
        else:
            mode = "endpoint"
        details = {
            "variant": settings.variant,
            "memory_active": memory.active,
            "summary": memory.summary[:200],
            "tools": list(perception.tools) if perception is not None else [],
            "screen_change": None if perception is None else perception.change,
            "sources": sources,
            "tiers": [None if s is None else tier_of(s) for s in scores],
            "penalties": {str(i): list(r) for i, r in penalties.items() if r},
        }
        return Verdict(tuple(scores), calls=calls, mode=mode, note="; ".join(n for n in notes if n), details=details)

    def observe(self, chosen: Proposal, score: float | None, result: StepResult) -> None:
        change = screen_change(self.screen, result.screen)
        if result.problem is not None:
            observation = f"failed: {result.problem[:80]}"
        elif change is not None:
            observation = "screen changed" if change > 0 else "screen unchanged"
        else:
            observation = ""
        self.steps.append(
            MemoryStep(
                len(self.steps),
                chosen.description,
                chosen.policy_text if chosen.policy_text != chosen.description else "",
                observation,
                score,
                result.problem is not None,
            )
        )
        self.previous = (chosen.description, score)


def make_judge(
    settings: JudgeSettings, warehouse: Warehouse | None, *, checkpoint: Path | str | None = None
) -> JudgeVerifier:
    """The judge: its local step reward model loaded now (required without an endpoint; with one it
    is the fallback, and its absence means unjudged candidates on failures)."""
    local: LocalScorer | None = None
    try:
        local = load_local_scorer(warehouse, settings.local_kind, checkpoint)
    except GuidanceError as exc:
        if settings.endpoint is None:
            raise GuidanceError(f"the judge has no endpoint and no local reward model: {exc}") from None
    client = None
    if settings.endpoint:
        client = ChatClient(ChatEndpoint(settings.endpoint, settings.model, timeout_s=settings.timeout_s))
    return JudgeVerifier(settings, local, client)


def without_endpoint(settings: JudgeSettings) -> JudgeSettings:
    """The same judge in local mode."""
    return replace(settings, endpoint=None)
