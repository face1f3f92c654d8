"""The goodput model (mlckpt/plan/goodput.py): the interval it gives maximises its goodput, agrees
with Young's and Daly's estimates where they hold, and keeps its digits at every scale."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlckpt.plan.goodput import Costs, best, daly, goodput_at, lost_per_failure, optimal_interval, young

# C/M from a 10 ms stall in months between failures to a stall ten times the MTBF
RATIOS = st.floats(1e-10, 10.0)
MTBFS = st.floats(1.0, 1e8)


def _costs(ratio: float, mtbf: float, durable_extra: float = 0.0, restore: float = 0.0) -> Costs:
    stall = ratio * mtbf
    return Costs(stall, stall + durable_extra, restore)


# the unsafe window and the restore, in MTBFs
SHARES = st.floats(0, 5.0)


@given(RATIOS, MTBFS, SHARES, SHARES)
def test_the_interval_maximises_goodput(ratio: float, mtbf: float, extra: float, restore: float) -> None:
    costs = _costs(ratio, mtbf, extra * mtbf, restore * mtbf)
    tau = optimal_interval(costs, mtbf)
    assert 0 < tau <= mtbf
    g = goodput_at(tau, costs, mtbf)
    assert 0 < g < 1
    for factor in (0.99, 1.01, 0.5, 2.0):
        assert goodput_at(tau * factor, costs, mtbf) <= g * (1 + 1e-12)


@given(RATIOS, MTBFS)
def test_the_interval_solves_its_equation(ratio: float, mtbf: float) -> None:
    """e^u − 1 = (τ/M)·e^u at u = (τ+C)/M, i.e. −ln(1 − y) − y = C/M for y = τ/M."""
    y = optimal_interval(_costs(ratio, mtbf), mtbf) / mtbf
    if y < 1.0:
        assert -math.log1p(-y) - y == pytest.approx(ratio, rel=1e-9)


@given(st.floats(1e-10, 0.1), MTBFS)
def test_it_lies_between_daly_and_young_where_they_hold(ratio: float, mtbf: float) -> None:
    costs = _costs(ratio, mtbf)
    tau = optimal_interval(costs, mtbf)
    assert tau <= young(costs, mtbf)
    assert tau == pytest.approx(daly(costs, mtbf), rel=0.01)


def test_figures_a_reader_can_check() -> None:
    """A 30 s stall, a job failing every 3 hours (Llama 3's 16,384 GPUs): Young 805 s, Daly 785 s."""
    costs = Costs(30.0, 30.0, 60.0)
    g = best(costs, 3 * 3600.0)
    assert round(g.young_s) == 805 and round(g.daly_s) == 785 and round(g.optimal_s) == 785
    # one segment of 815 s in 10,800: the failure lands half-way on average, then the restore
    assert g.lost_per_failure_s == pytest.approx(815 / 2 + 60, rel=0.03)
    assert g.goodput == pytest.approx(785 / 815 * (1 - (815 / 2 + 60) / 10800), rel=0.01)


@given(RATIOS, MTBFS, SHARES)
def test_persisting_bounds_the_interval(ratio: float, mtbf: float, extra: float) -> None:
    costs = _costs(ratio, mtbf, durable_extra=extra * mtbf)
    g = best(costs, mtbf)
    assert g.keep_up_s == pytest.approx(extra * mtbf, abs=1e-9 * mtbf)
    assert g.interval_s == max(g.optimal_s, g.keep_up_s)
    assert g.goodput == goodput_at(g.interval_s, costs, mtbf)


@given(RATIOS, MTBFS, SHARES)
def test_what_costs_more_gives_less(ratio: float, mtbf: float, restore: float) -> None:
    base = _costs(ratio, mtbf, restore=restore * mtbf)
    tau = optimal_interval(base, mtbf)
    more = 0.01 * mtbf
    slower_restore = Costs(base.stall_s, base.durable_s, base.restore_s + more)
    later_safe = Costs(base.stall_s, base.durable_s + more, base.restore_s)
    for worse in (slower_restore, later_safe):
        assert goodput_at(tau, worse, mtbf) < goodput_at(tau, base, mtbf)
        assert lost_per_failure(tau, worse, mtbf) == pytest.approx(lost_per_failure(tau, base, mtbf) + more)


def test_without_failures_goodput_is_the_compute_share() -> None:
    costs = Costs(2.0, 5.0, 30.0)
    assert goodput_at(98.0, costs, 1e15) == pytest.approx(98.0 / 100.0, rel=1e-9)


def test_costs_that_cannot_be_are_refused() -> None:
    for stall, durable, restore in ((0.0, 1.0, 0.0), (2.0, 1.0, 0.0), (1.0, 1.0, -1.0)):
        with pytest.raises(ValueError, match="0 < stall ≤ durable and restore ≥ 0"):
            Costs(stall, durable, restore)
    with pytest.raises(ValueError, match="MTBF must be positive"):
        best(Costs(1.0, 1.0, 0.0), 0.0)
