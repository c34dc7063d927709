"""Quota over CPU, memory and other resources (`queueing/resources.py`): flavor order,
nominal quota, cohorts' borrowing and lending limits, exact quantities."""

from __future__ import annotations

from decimal import Decimal as D

from alnair.scheduler.queueing.resources import (
    FlavorQuotas,
    QueueResources,
    ResourceGroup,
    ResourceLedger,
    ResourceQuota,
)


def queue(cohort: str | None, *flavors: tuple[str, dict[str, ResourceQuota]]) -> QueueResources:
    group = ResourceGroup(("cpu", "memory"), tuple(FlavorQuotas(n, q) for n, q in flavors))
    return QueueResources((group,), cohort)


def q(nominal: str, borrow: str | None = None, lend: str | None = None) -> ResourceQuota:
    return ResourceQuota(D(nominal), None if borrow is None else D(borrow),
                         None if lend is None else D(lend))  # fmt: skip


def test_the_first_flavor_that_fits_is_taken_and_quantities_are_exact() -> None:
    ledger = ResourceLedger({
        "a": queue(None, ("on-demand", {"cpu": q("0.3"), "memory": q("300")}),
                   ("spot", {"cpu": q("10"), "memory": q("1000")})),
    })  # fmt: skip
    asked = {"cpu": D("0.15"), "memory": D("300")}
    first = ledger.assign("a", asked)
    assert first == {"cpu": "on-demand", "memory": "on-demand"}
    ledger.take("a", first, asked)
    # 0.15 + 0.15 cpu fits on-demand exactly, but memory does not: both go to spot together
    assert ledger.assign("a", asked) == {"cpu": "spot", "memory": "spot"}
    assert ledger.usage("a", "on-demand", "cpu") == D("0.15")
    # a resource no group covers is not counted
    assert ledger.assign("a", {"example.com/fpga": D(1)}) == {}


def test_nothing_fits_names_each_flavors_shortfall() -> None:
    ledger = ResourceLedger({"a": queue(None, ("f", {"cpu": q("1"), "memory": q("1")}))})
    why = ledger.assign("a", {"cpu": D("1.5")})
    assert why == "cpu in flavor f: 1.5 would exceed 1 of ClusterQueue a"


def test_a_cohort_lends_within_limits_and_takes_back_on_release() -> None:
    ledger = ResourceLedger({
        "lender": queue("c", ("f", {"cpu": q("4", lend="2")})),
        "borrower": queue("c", ("f", {"cpu": q("1", borrow="4")})),
    })  # fmt: skip
    three = {"cpu": D(3)}
    got = ledger.assign("borrower", three)
    assert got == {"cpu": "f"}  # 1 of its own and 2 lent
    ledger.take("borrower", got, three)
    assert "cohort c has 0 left to lend" in str(ledger.assign("borrower", {"cpu": D(1)}))
    # the lender still has its guaranteed 2, not the lent 2
    assert ledger.assign("lender", {"cpu": D(2)}) == {"cpu": "f"}
    assert isinstance(ledger.assign("lender", {"cpu": D(3)}), str)
    ledger.release("borrower", got, three)
    assert ledger.assign("lender", {"cpu": D(4)}) == {"cpu": "f"}


def test_a_borrowing_limit_bounds_a_queue_below_the_pool() -> None:
    ledger = ResourceLedger({
        "a": queue("c", ("f", {"cpu": q("1", borrow="1")})),
        "b": queue("c", ("f", {"cpu": q("10")})),
    })  # fmt: skip
    assert ledger.assign("a", {"cpu": D(2)}) == {"cpu": "f"}
    assert (
        ledger.assign("a", {"cpu": D(3)}) == "cpu in flavor f: 3 would exceed 2 of ClusterQueue a"
    )
