"""What the asset modules' run configs share: fields renamed since users saved run configs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster import Config, Failure


def renamed_field(config: Config, old: str, new: str, warn: Callable[[str], object] | None = None) -> Any:
    """The value of config field ``new``, which was called ``old`` before: a saved run config that
    still sets ``old`` keeps working (with a warning through ``warn``, a logger method), and one that
    sets both to different values is refused, naming both, rather than one silently winning. One
    case cannot be told apart: ``new`` set to its default beside ``old`` (Dagster fills in defaults),
    which uses ``old``, with the warning."""
    old_value, new_value = getattr(config, old), getattr(config, new)
    if old_value is None:
        return new_value
    default = type(config).model_fields[new].default
    if new_value not in (default, old_value):
        raise Failure(
            f"run config sets both {old!r} ({old_value!r}, the old name) and {new!r} ({new_value!r}): set {new!r} only"
        )
    if warn is not None:
        warn(f"run config field {old!r} is now called {new!r}: {old_value!r} used; rename it in saved configs")
    return old_value
