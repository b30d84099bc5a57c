"""The four labeling interfaces: their Label Studio configs, versions, and how to read their results.

=====================  =========================================================  ==============================
interface              what people answer                                         source
=====================  =========================================================  ==============================
``step_correctness``   positive / negative / unsure, optional rationale           GUI-Shepherd §3, App. A.2
``step_progress``      how much of the task is done after the step, 0-100         ProgRM progress labels
``milestone_review``   1-5 quality with factuality, order and granularity         ADMIRE App. B.5.2, Table 6
``milestone_match``    does this action accomplish this milestone? yes / no       ADMIRE App. B.4.2 (match pairs)
=====================  =========================================================  ==============================

Each interface has an integer ``version``: bump it when the meaning of the answers changes
(new choices, a different question). A new version gets its own Label Studio project, and the
queue's idempotency key includes it, so the same step can be asked again under the new question
but never twice under the same one. Cosmetic edits of the XML keep the version (the project's
config is updated in place).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

STYLE_MARKER = "/* stepwise-style */"


@dataclass(frozen=True)
class Interface:
    name: str
    version: int
    title: str
    config_file: str
    instruction: str  # shown to annotators (Label Studio's project instructions)

    @property
    def version_key(self) -> str:
        """``name@version``: the queue's notion of "the same question"."""
        return f"{self.name}@{self.version}"

    def project_title(self, namespace: str) -> str:
        """The Label Studio project of this interface version, e.g. ``Stepwise · Step correctness · v1``."""
        return f"{namespace} · {self.title} · v{self.version}"

    def label_config(self) -> str:
        """The Label Studio XML config, with the shared stylesheet inlined."""
        return _config_text(self.config_file)

    def config_digest(self) -> str:
        return hashlib.sha256(self.label_config().encode()).hexdigest()[:12]


@cache
def _config_text(file_name: str) -> str:
    folder = resources.files("annotation.labelstudio") / "configs"
    xml = (folder / file_name).read_text(encoding="utf-8")
    style = (folder / "style.css").read_text(encoding="utf-8")
    return xml.replace(STYLE_MARKER, " ".join(style.split()))


STEP_CORRECTNESS = Interface(
    name="step_correctness",
    version=1,
    title="Step correctness",
    config_file="step_correctness.xml",
    instruction=(
        "<p>Judge whether the <b>action</b>, taken on the <b>screen</b> shown, contributes to completing the "
        "<b>instruction</b>. <b>positive</b>: it moves the task forward (or is a necessary step). <b>negative</b>: it "
        "is wrong, useless or harmful. <b>unsure</b>: you cannot tell from what is shown; such answers are kept but "
        "not used for training. A rationale is optional.</p><p>Keys: 1 / 2 / 3, Ctrl+Enter submits.</p>"
    ),
)
STEP_PROGRESS = Interface(
    name="step_progress",
    version=1,
    title="Step progress",
    config_file="step_progress.xml",
    instruction=(
        "<p>After the <b>latest action</b>, what share of the task in the <b>instruction</b> is done? 0 means nothing "
        "useful has happened yet, 100 means the task is complete. Use the earlier actions and the screen; steps of "
        "5 are fine.</p><p>Ctrl+Enter submits.</p>"
    ),
)
MILESTONE_REVIEW = Interface(
    name="milestone_review",
    version=1,
    title="Milestone review",
    config_file="milestone_review.xml",
    instruction=(
        "<p>Rate the <b>milestones</b> (ordered sub-goals) generated for the instruction on the 1-5 scale: "
        "5 Perfect, 4 Good, 3 Acceptable, 2 Poor, 1 Critical failure (hover a score for its criteria). Then say "
        "where problems lie: <b>factuality</b> (do the described elements exist?), <b>order</b> (is the sequence "
        "executable?), <b>granularity</b> (is the abstraction level right?). A successful episode is shown for "
        "reference.</p>"
    ),
)
MILESTONE_MATCH = Interface(
    name="milestone_match",
    version=1,
    title="Milestone-action match",
    config_file="milestone_match.xml",
    instruction=(
        "<p>Does the <b>action</b> accomplish the <b>milestone</b>? Answer <b>yes</b> only if, after this action, the "
        "milestone is achieved. These pairs calibrate the automatic matcher (ADMIRE's similarity threshold).</p>"
        "<p>Keys: y / n, Ctrl+Enter submits.</p>"
    ),
)

INTERFACES: dict[str, Interface] = {
    i.name: i for i in (STEP_CORRECTNESS, STEP_PROGRESS, MILESTONE_REVIEW, MILESTONE_MATCH)
}
STEP_INTERFACES = ("step_correctness", "step_progress")


@dataclass(frozen=True)
class ParsedAnswer:
    """What one annotation says, interface-independent (see the human_labels columns)."""

    label: str | None = None
    value: float | None = None
    rationale: str | None = None
    factuality: str | None = None
    order: str | None = None
    granularity: str | None = None

    @property
    def has_answer(self) -> bool:
        return self.label is not None or self.value is not None


def _choice(region: dict) -> str | None:
    choices = (region.get("value") or {}).get("choices") or []
    return str(choices[0]) if choices else None


def _norm(text: str | None) -> str | None:
    return None if text is None else "_".join(text.strip().lower().split())


def parse_result(interface: str, result: list[dict[str, Any]] | None) -> ParsedAnswer:
    """Read a Label Studio ``result`` list for ``interface``; unknown regions are ignored."""
    by_name: dict[str, dict] = {}
    for region in result or []:
        by_name.setdefault(str(region.get("from_name")), region)
    rationale_region = by_name.get("rationale")
    rationale = None
    if rationale_region:
        texts = (rationale_region.get("value") or {}).get("text") or []
        joined = " ".join(str(t) for t in texts).strip()
        rationale = joined or None
    if interface == "step_correctness":
        label = _norm(_choice(by_name.get("correctness", {})))
        return ParsedAnswer(label=label if label in ("positive", "negative", "unsure") else None, rationale=rationale)
    if interface == "step_progress":
        number = (by_name.get("progress", {}).get("value") or {}).get("number")
        value = None if number is None else min(1.0, max(0.0, float(number) / 100.0))
        return ParsedAnswer(value=value, rationale=rationale)
    if interface == "milestone_review":
        score = _choice(by_name.get("quality", {}))
        digits = [c for c in (score or "") if c.isdigit()]
        return ParsedAnswer(
            value=float(digits[0]) if digits else None,
            factuality=_norm(_choice(by_name.get("factuality", {}))),
            order=_norm(_choice(by_name.get("order", {}))),
            granularity=_norm(_choice(by_name.get("granularity", {}))),
            rationale=rationale,
        )
    if interface == "milestone_match":
        label = _norm(_choice(by_name.get("match", {})))
        return ParsedAnswer(label=label if label in ("yes", "no") else None, rationale=rationale)
    raise ValueError(f"unknown interface {interface!r}; known: {sorted(INTERFACES)}")


def correctness_prediction(label: str) -> list[dict]:
    """A pre-annotation for ``step_correctness`` (positive / negative)."""
    return [{"from_name": "correctness", "to_name": "action", "type": "choices", "value": {"choices": [label]}}]


def progress_prediction(progress: float) -> list[dict]:
    """A pre-annotation for ``step_progress`` (progress in [0, 1], shown as 0-100 rounded to 5)."""
    shown = int(round(max(0.0, min(1.0, progress)) * 20)) * 5
    return [{"from_name": "progress", "to_name": "action", "type": "number", "value": {"number": shown}}]


def match_prediction(label: str) -> list[dict]:
    return [{"from_name": "match", "to_name": "action", "type": "choices", "value": {"choices": [label]}}]
