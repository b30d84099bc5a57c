"""Hypothesis settings shared by the fuzz tests (marker ``fuzz``) over every input surface.

The suite's runs stay small (each fuzz test well under ~20 s). ``make fuzz`` sets
``STEPWISE_FUZZ_PROFILE=stepwise-fuzz-long``: the same tests with 25x the examples. Settings are
given per test (``fuzz_settings``), never loaded globally, so the project's other property tests
keep their own.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "STEPWISE_FUZZ_PROFILE"
_SCALE = {"stepwise-fuzz": 1, "stepwise-fuzz-long": 25}

for _name in _SCALE:
    settings.register_profile(
        _name,
        deadline=None,  # a slow example is not a failure here: the time bounds are asserted where they matter
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
    )

PROFILE = os.environ.get(PROFILE_ENV, "stepwise-fuzz")
if PROFILE not in _SCALE:
    raise ValueError(f"{PROFILE_ENV}={PROFILE!r}; known: {sorted(_SCALE)}")


def fuzz_settings(examples: int, **overrides) -> settings:
    """Settings for one fuzz test: ``examples`` in the suite's run, scaled up under ``make fuzz``."""
    return settings(settings.get_profile(PROFILE), max_examples=examples * _SCALE[PROFILE], **overrides)
