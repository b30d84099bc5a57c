"""The Poisson-binomial tail, against brute force and the binomial it reduces to."""

import itertools
import math

import pytest

from warehouse.statistics import poisson_binomial_upper_tail


def _by_enumeration(probabilities: list[float], at_least: int) -> float:
    total = 0.0
    for happened in itertools.product((False, True), repeat=len(probabilities)):
        if sum(happened) >= at_least:
            total += math.prod(p if h else 1 - p for p, h in zip(probabilities, happened, strict=True))
    return total


@pytest.mark.parametrize("at_least", range(0, 6))
def test_the_tail_is_the_sum_over_every_way_the_events_can_fall(at_least: int) -> None:
    probabilities = [0.06, 0.13, 0.5, 0.9, 0.02]
    assert poisson_binomial_upper_tail(probabilities, at_least) == pytest.approx(
        _by_enumeration(probabilities, at_least), abs=1e-12
    )


def test_equal_probabilities_give_the_binomial_tail() -> None:
    n, p = 9, 0.063
    binomial = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(3, n + 1))
    assert poisson_binomial_upper_tail([p] * n, 3) == pytest.approx(binomial, rel=1e-12)


def test_edges_and_bad_probabilities() -> None:
    assert poisson_binomial_upper_tail([], 0) == 1.0
    assert poisson_binomial_upper_tail([0.5, 0.5], 3) == 0.0
    assert poisson_binomial_upper_tail([1.0, 1.0], 2) == 1.0
    with pytest.raises(ValueError, match="event 2"):
        poisson_binomial_upper_tail([0.5, 1.5], 1)
