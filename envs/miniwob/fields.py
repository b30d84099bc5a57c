"""A MiniWoB++ episode's fields (the values its instruction states, by name), the same for a live
episode and a recorded demonstration.

The benchmark gives a live episode its fields: those the page states (natural-language tasks), else
those its field extractor reads from the utterance. Most recorded demonstrations carry none, so the
recordings get the extractor's too (``envs.miniwob.recordings.recording_to_episode``): the slots a
policy reads an instruction by (``TaskSpec.slots``) are then the same in the demonstrations SFT
learns from and in the live episodes it acts in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def utterance_fields(task_id: str, utterance: str, stated: Mapping[str, Any] | None) -> dict[str, str]:
    """The task's fields: those the page states, else miniwob's field extractor's, else none."""
    if stated:
        return {str(k): str(v) for k, v in stated.items() if v is not None}
    from miniwob.fields import get_field_extractor  # the package's import registers gymnasium envs: ~0.2 s

    try:
        pairs = get_field_extractor(task_id)(utterance)
    except (KeyError, ValueError):  # no extractor for this task, or an utterance it does not parse
        return {}
    return {str(k): str(v) for k, v in pairs}
