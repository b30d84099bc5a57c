"""Reflect and retry (GuidNav §3.3, §6.1): after a failed attempt a reflection is written and fed
to the next attempt of the same task instance (same seed), up to R retries; pass@k is the share of
instances solved by one of the first k attempts (pass@1: no retry; pass@(R + 1): all R retries).

* Whether an attempt failed is the environment's verdict (GuidNav has GPT-4o judge it; MiniWoB++
  tells us).
* The reflection comes from an OpenAI-compatible endpoint when one is configured
  (:func:`reflection_messages`); otherwise, or when the endpoint fails, it is a template
  (:func:`template_reflection`) built from the failure mode (``training.policy.evaluation.failure_mode``)
  and the steps, naming the step where the attempt went wrong (:func:`blame_step`).
* The LLM policies read the reflection in their prompt. **The learned CPU policy cannot read
  text**: for it the reflection acts only through a *ban*: the action the failed attempt took at
  the step where it went wrong is removed from the candidates whenever the next attempt reaches
  the same state (the same actions so far on the same seed). Bans accumulate over retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envs.protocol import EpisodeRecord
from training.llm.chat_client import ChatClient, ChatEndpointError
from training.policy.evaluation import failure_mode, wrong_field_step


@dataclass(frozen=True)
class Ban:
    """Do not take ``action`` (canonical text) after exactly the actions ``prefix``."""

    prefix: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class AttemptGuidance:
    """What an attempt is given: the reflection text (LLM policies) and the bans (learned policy)."""

    reflection: str | None = None
    bans: tuple[Ban, ...] = ()
    attempt: int = 0
    source: str | None = None  # where the reflection came from: endpoint | template

    def banned_at(self, prefix: tuple[str, ...]) -> frozenset[str]:
        """The actions banned after ``prefix``."""
        return frozenset(b.action for b in self.bans if b.prefix == prefix)


@dataclass(frozen=True)
class Reflection:
    """A reflection on one failed attempt: its text, the step blamed, where the text came from."""

    text: str
    blamed_step: int | None
    failure_mode: str | None
    source: str  # endpoint | template
    note: str = ""


def blame_step(record: EpisodeRecord, mode: str | None = None) -> int | None:
    """The step where a failed attempt went wrong (None for a success or an empty episode):

    * an action the environment could not carry out: the first such step;
    * ``useless_repetition``: the first step that repeats one of the two actions before it;
    * ``wrong_field``: the first value typed into a field the instruction did not name it for;
    * ``wrong_submission``: the last step (the action that ended the episode as a failure);
    * ``out_of_steps``: the first repeated action, else the last step.
    """
    if record.success or not record.steps:
        return None
    mode = mode if mode is not None else failure_mode(record)
    failed = next((t for t, s in enumerate(record.steps) if s.problem is not None), None)
    if failed is not None:
        return failed
    texts = [s.action.canonical_text() for s in record.steps]
    first_repeat = next((t for t in range(1, len(texts)) if texts[t] in texts[max(0, t - 2) : t]), None)
    if mode == "useless_repetition" and first_repeat is not None:
        return first_repeat
    if mode == "wrong_field":
        wrong = wrong_field_step(record)
        if wrong is not None:
            return wrong
    if mode == "out_of_steps" and first_repeat is not None:
        return first_repeat
    return len(texts) - 1


_MODE_ADVICE = {
    "useless_repetition": "it repeated actions without making progress",
    "wrong_field": "it typed a value into a field the instruction did not name it for",
    "wrong_submission": "it submitted before the task was done, or chose the wrong item",
    "out_of_steps": "it ran out of steps",
}


def template_reflection(record: EpisodeRecord, mode: str | None, blamed: int | None) -> str:
    """The reflection without an LLM: what failed, the steps taken, and what to do differently."""
    steps = [s.action.canonical_text() for s in record.steps]
    shown = "; ".join(f"{i + 1}. {a}" for i, a in enumerate(steps[:12])) + (" ..." if len(steps) > 12 else "")
    why = _MODE_ADVICE.get(mode or "", "it failed")
    text = f"The previous attempt failed: {why} after {len(steps)} steps ({shown})."
    if blamed is not None:
        text += f" It went wrong at step {blamed + 1}, {steps[blamed]}: do something else at that point."
    return text


def reflection_messages(record: EpisodeRecord, mode: str | None) -> list[dict[str, str]]:
    """The reflection prompt (GuidNav §3.3: a "reflection thought" on a failed trajectory)."""
    steps = "\n".join(
        f"{i + 1}. {s.action.canonical_text()}" + (f" (failed: {s.problem[:80]})" if s.problem else "")
        for i, s in enumerate(record.steps)
    )
    return [
        {
            "role": "system",
            "content": "You review a failed attempt of a GUI agent. In two or three sentences, say where it went "
            "wrong and what the next attempt should do differently. Do not repeat the steps.",
        },
        {
            "role": "user",
            "content": f"Task: {record.instruction}\nSteps:\n{steps}\nOutcome: failed"
            + (f" ({_MODE_ADVICE.get(mode, mode)})" if mode else ""),
        },
    ]


def reflect(record: EpisodeRecord, client: ChatClient | None = None, *, max_tokens: int = 128) -> Reflection:
    """The reflection on a failed attempt: the endpoint's when configured and usable, else the template."""
    mode = failure_mode(record)
    blamed = blame_step(record, mode)
    if client is not None:
        try:
            text = " ".join(client.complete(reflection_messages(record, mode), max_tokens=max_tokens).split())[:800]
        except ChatEndpointError as exc:
            return Reflection(
                template_reflection(record, mode, blamed), blamed, mode, "template", f"endpoint failed: {exc}"[:200]
            )
        if text:
            return Reflection(text, blamed, mode, "endpoint")
        return Reflection(template_reflection(record, mode, blamed), blamed, mode, "template", "endpoint: empty answer")
    return Reflection(template_reflection(record, mode, blamed), blamed, mode, "template")


def next_guidance(previous: AttemptGuidance, record: EpisodeRecord, reflection: Reflection) -> AttemptGuidance:
    """The next attempt's guidance: this reflection, and the bans so far plus the blamed action."""
    bans = previous.bans
    if reflection.blamed_step is not None:
        texts = tuple(s.action.canonical_text() for s in record.steps)
        ban = Ban(texts[: reflection.blamed_step], texts[reflection.blamed_step])
        if ban not in bans:
            bans = (*bans, ban)
    return AttemptGuidance(reflection.text, bans, previous.attempt + 1, reflection.source)


def pass_at(attempts: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k: the share of task instances solved by one of their first ``k`` attempts (k - 1
    retries; pass@1 is the policy alone). ``attempts[i]`` lists instance i's outcomes in order (an
    instance stops at its first success)."""
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if not attempts:
        return float("nan")
    return sum(any(a[:k]) for a in attempts) / len(attempts)
