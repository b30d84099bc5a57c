"""A finished episode as a learner sees it: the environment's record plus what the policy knows
about each of its steps (whether its output parsed, how it described the action)."""

from __future__ import annotations

from dataclasses import dataclass

from envs.protocol import EpisodeRecord


@dataclass(frozen=True)
class Rollout:
    """A finished episode plus what the policy knows about it: per step, whether its output was a
    well-formed action (an LLM's text can fail to parse; the learned CPU policy's never does) and
    the instruction-relative description of each action (ADMIRE matches those to milestones)."""

    record: EpisodeRecord
    format_ok: tuple[bool, ...] = ()
    descriptions: tuple[str, ...] = ()

    @property
    def n_steps(self) -> int:
        return self.record.n_steps

    def well_formed(self, t: int) -> bool:
        return self.format_ok[t] if t < len(self.format_ok) else True
