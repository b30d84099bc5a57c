"""GUI-Shepherd's rationales for human step labels, written by an LLM behind a chat endpoint.

GUI-Shepherd (Chen et al., 2025, arXiv:2509.23738) §3 annotates its PRM data in two parts: people
give each step a binary correctness verdict (positive / negative), and an LLM (GPT-4o there) writes
a chain-of-thought rationale *for that verdict*; the verdict is never the model's to change (its
App. A describes the annotation, with the unsure answers left out). Here the verdicts come from the
``step_correctness`` interface in Label Studio (``human_labels``), the LLM is any OpenAI-compatible
endpoint (by default SmolLM2-135M-Instruct served locally, :mod:`training.llm.endpoint`), and the
rationale is stored with the label: table ``label_rationales``, keyed by the label's identity
(``ls_server``, ``annotation_id``, ``revision``), so a label edited in Label Studio (a new
revision) is explained again.

The prompt is our own wording of what the paper describes (instruction, screen, action, verdict;
explain, do not judge). Every way a label can go without a rationale is a counted row, never a
crash mid-run: the endpoint failing or too slow (``endpoint_error``; after
``stop_after_endpoint_errors`` failures in a row the run stops asking and leaves the rest for the
next run), an empty answer (``empty``), an answer that is not an explanation (``unparsed``), a
prompt that does not fit ``max_prompt_chars`` even with the screen cut (``prompt_too_long``).
An endpoint that is down before the first label is one :class:`RationaleEndpointError` line.
Rows without a rationale are asked again by the next run.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from training.llm.chat_client import ChatClient, ChatEndpointError
from training.llm.prompts import element_line
from warehouse.model import Screen

PROMPT_VERSION = "gui-shepherd-rationale@1"
RATIONALE_VERSION = "1"  # the stage's code version (Dagster)
TABLE = "label_rationales"
DATASET = "llm"
VERDICTS = {"positive": "correct", "negative": "incorrect"}
FAILURES = ("endpoint_error", "empty", "unparsed", "prompt_too_long")
MIN_WORDS = 4
MAX_RATIONALE_CHARS = 1200

Log = Callable[[str], None]


class RationaleEndpointError(RuntimeError):
    """The endpoint does not answer before the first label is asked about (one line, no key)."""


# -- the prompt (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class RationaleRequest:
    """What the rationale writer sees of one labelled step (GUI-Shepherd §3: instruction, screen,
    action, and the human verdict it must explain)."""

    instruction: str
    screen: Screen
    action: str
    verdict: str  # positive | negative
    history: tuple[str, ...] = ()  # the earlier actions' texts, in order


_SYSTEM = (
    "You explain the verdicts of human annotators on the steps of a GUI agent. A person has already judged "
    "whether the step's action was a correct step toward the instruction; the verdict is final. Write the "
    "reasoning that supports it in 2 to 4 sentences of plain text: what the instruction still needs, what the "
    "action does on this screen, and why that is (or is not) the right next step."
)


def _screen_lines(screen: Screen, max_elements: int) -> list[str]:
    """The screen in brief: the elements that show text or can be acted on, in document order,
    numbered as the actor's prompt numbers them (at most ``max_elements``)."""
    useful = [e for e in screen.elements if e.text or e.value or e.description or e.clickable or e.editable]
    shown = [element_line(i, e) for i, e in enumerate(useful[:max_elements])]
    if len(useful) > max_elements:
        shown.append(f"({len(useful) - max_elements} more elements not shown)")
    return shown or ["(empty screen)"]


def _user_prompt(request: RationaleRequest, max_elements: int, history: int = 5) -> str:
    verdict = VERDICTS[request.verdict]
    earlier = [f"{i + 1}. {a}" for i, a in enumerate(request.history)][-history:] or ["(none)"]
    return "\n".join(
        [
            f"Instruction: {request.instruction}",
            "Previous actions:",
            *earlier,
            "Screen before the action:",
            *_screen_lines(request.screen, max_elements),
            f"Action: {request.action}",
            f"Human verdict: the action is {verdict}.",
            f"Explain why the action is {verdict}.",
        ]
    )


def rationale_messages(
    request: RationaleRequest, *, max_prompt_chars: int = 6000, max_elements: int = 40
) -> list[dict[str, str]] | None:
    """The chat messages asking for one rationale, or None when they cannot fit ``max_prompt_chars``
    (the screen is cut to fewer elements first, halving down to none). Raises ``ValueError`` for a
    verdict other than positive / negative (unsure labels have nothing to explain, App. A)."""
    if request.verdict not in VERDICTS:
        raise ValueError(f"no rationale for the verdict {request.verdict!r} (only positive / negative)")
    elements = max_elements
    while True:
        user = _user_prompt(request, elements)
        if len(_SYSTEM) + len(user) <= max_prompt_chars:
            return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]
        if elements == 0:
            return None
        elements //= 2


_LABEL = re.compile(r"^(?:rationale|explanation|reasoning|answer)\s*:\s*", re.IGNORECASE)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ECHO = re.compile(r"^(?:instruction|screen before the action|previous actions|human verdict)\s*:", re.IGNORECASE)


def parse_rationale(text: str) -> tuple[str | None, str | None]:
    """(rationale, None) or (None, failure): ``empty`` for no text, ``unparsed`` for fewer than
    ``MIN_WORDS`` words or an echo of the prompt. The text is cleaned (a leading label such as
    ``Rationale:``, code fences, runs of white space) and cut to ``MAX_RATIONALE_CHARS`` at a
    sentence end where there is one. Repeated sentences are kept once, and an answer the token
    budget cut mid-sentence ends at its last whole sentence (when it has one)."""
    cleaned = _FENCE.sub("", text.strip()).strip()
    cleaned = " ".join(_LABEL.sub("", cleaned).split())
    if not cleaned:
        return None, "empty"
    if len(re.findall(r"[A-Za-z]{2,}", cleaned)) < MIN_WORDS or _ECHO.match(cleaned):
        return None, "unparsed"
    sentences = list(dict.fromkeys(_SENTENCE_END.split(cleaned)))  # a repeated sentence once
    if len(sentences) > 1 and not sentences[-1].endswith((".", "!", "?")):
        sentences.pop()  # cut by the token budget: end at the last whole sentence
    cleaned = " ".join(sentences)
    if len(cleaned) > MAX_RATIONALE_CHARS:
        cut = cleaned[:MAX_RATIONALE_CHARS]
        end = cut.rfind(". ")
        cleaned = cut[: end + 1] if end > MAX_RATIONALE_CHARS // 2 else cut.rstrip() + "…"
    return cleaned, None


def public_url(url: str) -> str:
    """``url`` without credentials, query or fragment (what may be stored and logged)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


# -- which labels need one (pure) -------------------------------------------------------------


def label_identity(row: Mapping[str, Any]) -> tuple[str, int, int]:
    return (str(row["ls_server"]), int(row["annotation_id"]), int(row["revision"]))


def pending_labels(labels: Iterable[Mapping[str, Any]], rationales: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The active, not skipped ``step_correctness`` labels with a positive or negative verdict and
    a step, whose current revision has no rationale yet (a failed row is asked again), in
    (server, annotation) order."""
    done = {label_identity(r) for r in rationales if r["ok"]}
    out = [
        dict(row)
        for row in labels
        if row["interface"] == "step_correctness"
        and row["status"] == "active"
        and not row["was_cancelled"]
        and row["label"] in VERDICTS
        and row["episode_id"] is not None
        and row["step_idx"] is not None
        and label_identity(row) not in done
    ]
    return sorted(out, key=label_identity)


# -- asking -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RationaleOptions:
    """How the stage asks: the answer budget, the prompt limit (characters; SmolLM2's context is
    8,192 tokens), how many labels per run (None: all), when to stop after endpoint failures."""

    max_tokens: int = 160
    max_prompt_chars: int = 6000
    max_elements: int = 40
    max_labels: int | None = None
    stop_after_endpoint_errors: int = 3
    publish_every: int = 25


def ask_rationale(client: ChatClient, request: RationaleRequest, options: RationaleOptions) -> dict[str, Any]:
    """One rationale: the row fields that do not depend on the label (``rationale``, ``ok``,
    ``failure``, ``error``, ``prompt_chars``, ``seconds``). Never raises for the endpoint or the answer."""
    messages = rationale_messages(request, max_prompt_chars=options.max_prompt_chars, max_elements=options.max_elements)
    if messages is None:
        return _outcome(None, "prompt_too_long", f"the prompt needs more than {options.max_prompt_chars} characters")
    chars = sum(len(m["content"]) for m in messages)
    started = time.perf_counter()
    try:
        text = client.complete(messages, max_tokens=options.max_tokens, temperature=0.0)
    except ChatEndpointError as exc:
        return _outcome(None, "endpoint_error", _one_line(exc, client), chars, time.perf_counter() - started)
    rationale, failure = parse_rationale(text)
    why = None if failure is None else f"answer: {text.strip()[:160]!r}"
    return _outcome(rationale, failure, why, chars, time.perf_counter() - started)


def _outcome(
    rationale: str | None,
    failure: str | None,
    error: str | None,
    chars: int | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    return {
        "rationale": rationale,
        "ok": rationale is not None,
        "failure": failure,
        "error": error,
        "prompt_chars": chars,
        "seconds": seconds,
    }


def _one_line(exc: Exception, client: ChatClient) -> str:
    """The error in one line, with the endpoint's URL shown without credentials."""
    base = client.endpoint.base_url.rstrip("/")
    return " ".join(str(exc).replace(base, public_url(base)).split())[:300]


def check_endpoint(client: ChatClient) -> None:
    """One tiny completion before any label: a down, refusing or wrong endpoint is one line."""
    try:
        client.complete([{"role": "user", "content": "Say OK."}], max_tokens=2)
    except ChatEndpointError as exc:
        raise RationaleEndpointError(f"rationale endpoint: {_one_line(exc, client)}") from None


def rationale_row(label: Mapping[str, Any], outcome: Mapping[str, Any], client: ChatClient) -> dict[str, Any]:
    """A ``label_rationales`` row: the label's identity and step, the outcome, what asked it."""
    return {
        "ls_server": label["ls_server"],
        "annotation_id": int(label["annotation_id"]),
        "revision": int(label["revision"]),
        "episode_id": label["episode_id"],
        "step_idx": label["step_idx"],
        "task_id": label.get("task_id"),
        "label": label["label"],
        **outcome,
        "model": client.endpoint.model,
        "prompt_version": PROMPT_VERSION,
        "endpoint": public_url(client.endpoint.base_url),
        "created_at": datetime.now(UTC),
    }


def merge_rows(previous: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The table after a run: a new row replaces the row of the same identity (a retried failure)."""
    merged = {label_identity(r): dict(r) for r in previous}
    merged.update({label_identity(r): dict(r) for r in new})
    return [merged[k] for k in sorted(merged)]


def summarize(rows: Sequence[Mapping[str, Any]], pending: int, skipped: int) -> dict[str, Any]:
    """Counts of a run's rows: asked, produced, each failure kind, seconds per call."""
    seconds = [r["seconds"] for r in rows if r["seconds"] is not None]
    summary: dict[str, Any] = {
        "pending": pending,
        "asked": len(rows),
        "rationales": sum(bool(r["ok"]) for r in rows),
        "skipped": skipped,
        "seconds_per_call": round(sum(seconds) / len(seconds), 3) if seconds else None,
    }
    summary |= {f"failures_{f}": sum(r["failure"] == f for r in rows) for f in FAILURES}
    return summary


def rationale_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    from warehouse.tables_annotation import LABEL_RATIONALES

    return pa.Table.from_pylist([dict(r) for r in rows], schema=LABEL_RATIONALES)


# -- the stage --------------------------------------------------------------------------------


def _no_log(message: str) -> None:
    pass


def _publish(warehouse: Any, rows: Sequence[Mapping[str, Any]], run_id: str | None, inputs: list) -> None:
    from warehouse.catalog import Materialization

    materialization = Materialization(
        asset=TABLE,
        run_id=run_id,
        code_version=RATIONALE_VERSION,
        parameters={"prompt_version": PROMPT_VERSION},
        inputs=inputs,
    )
    warehouse.publish(materialization, [warehouse.stage_table(TABLE, DATASET, rationale_table(rows), materialization)])


def generate_label_rationales(
    warehouse: Any,
    client: ChatClient,
    options: RationaleOptions | None = None,
    *,
    run_id: str | None = None,
    log: Log = _no_log,
) -> dict[str, Any]:
    """Ask ``client`` for a rationale of every pending label (:func:`pending_labels`, at most
    ``options.max_labels``), publishing ``label_rationales`` every ``publish_every`` answers and at
    the end (a killed run keeps what it had published); a summary of counts. Raises
    :class:`RationaleEndpointError` (one line) only when the endpoint is down before the first label."""
    from annotation.labelstudio.reads import current_rows, read_human_labels, read_step_views, table_inputs

    options = options or RationaleOptions()
    previous = current_rows(warehouse, TABLE, DATASET)
    pending = pending_labels(read_human_labels(warehouse), previous)
    todo = pending if options.max_labels is None else pending[: options.max_labels]
    if not todo:
        return summarize([], len(pending), 0) | {"missing_steps": 0}
    check_endpoint(client)
    inputs = table_inputs(warehouse, ("human_labels", "steps", "episodes"))
    views = read_step_views(warehouse, {(str(r["episode_id"]), int(r["step_idx"])) for r in todo}, None)
    new: list[dict[str, Any]] = []
    failures_in_a_row = missing = skipped = 0
    for i, label in enumerate(todo):
        if failures_in_a_row >= options.stop_after_endpoint_errors:
            skipped = len(todo) - i
            log(f"rationales: the endpoint failed {failures_in_a_row} times in a row; {skipped} labels left for later")
            break
        view = views.get((str(label["episode_id"]), int(label["step_idx"])))
        if view is None:  # the step is no longer in the warehouse
            missing += 1
            continue
        request = RationaleRequest(view.instruction, view.screen, view.action_text, label["label"], view.history)
        outcome = ask_rationale(client, request, options)
        failures_in_a_row = failures_in_a_row + 1 if outcome["failure"] == "endpoint_error" else 0
        new.append(rationale_row(label, outcome, client))
        if len(new) % options.publish_every == 0:
            _publish(warehouse, merge_rows(previous, new), run_id, inputs)
            log(f"rationales: {len(new)} of {len(todo)} asked")
    if new:
        _publish(warehouse, merge_rows(previous, new), run_id, inputs)
    return summarize(new, len(pending), skipped) | {"missing_steps": missing}
