"""Data checks as plain results: stage modules compute them, ``assets/`` reports them to Dagster
as asset checks (so the checks run, and are testable, without Dagster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckOutcome:
    """Whether a check passed, and the figures that show why (asset-check metadata)."""

    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    description: str = ""
