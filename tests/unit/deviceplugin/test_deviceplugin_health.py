"""The health state machine: newest observation wins, whatever order observations arrive in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from alnair.common.events import GpuDevice, GpuHealthChanged
from alnair.deviceplugin.health import HealthBook, Outcome

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def event(healthy: bool, at_s: float, uuid: str = "GPU-a", node: str = "n1") -> GpuHealthChanged:
    return GpuHealthChanged(
        node=node,
        gpu_index=0,
        gpu_uuid=uuid,
        healthy=healthy,
        reason="" if healthy else "XID 79",
        xid=None if healthy else 79,
        ts=T0 + timedelta(seconds=at_s),
    )


def test_unknown_gpu_counts_as_healthy() -> None:
    assert HealthBook("n1").healthy("GPU-x")


def test_down_then_back_up() -> None:
    book = HealthBook("n1")
    book, down = book.apply(event(False, 1))
    assert down.outcome is Outcome.CHANGED
    assert not book.healthy("GPU-a")
    assert book.get("GPU-a") is not None
    assert book.get("GPU-a").xid == 79  # type: ignore[union-attr]
    book, up = book.apply(event(True, 2))
    assert up.outcome is Outcome.CHANGED
    assert book.healthy("GPU-a")


def test_a_late_old_event_cannot_undo_a_recovery() -> None:
    book = HealthBook("n1")
    book, _ = book.apply(event(False, 1))
    book, _ = book.apply(event(True, 5))
    book, status = book.apply(event(False, 3))
    assert status.outcome is Outcome.STALE
    assert book.healthy("GPU-a")


def test_repeat_is_unchanged_and_other_nodes_are_ignored() -> None:
    book, _ = HealthBook("n1").apply(event(False, 1))
    book, again = book.apply(event(False, 2))
    assert again.outcome is Outcome.UNCHANGED
    same, other = book.apply(event(True, 3, node="n2"))
    assert other.outcome is Outcome.OTHER_NODE
    assert same is book


def test_inventory_observations_follow_the_same_rule() -> None:
    gpus = [
        GpuDevice(index=0, uuid="GPU-a", model="A100", memory_mib=40960, healthy=True),
        GpuDevice(index=1, uuid="GPU-b", model="A100", memory_mib=40960, healthy=False),
    ]
    book, _ = HealthBook("n1").apply(event(False, 10))
    book, statuses = book.apply_inventory(gpus, T0 + timedelta(seconds=5))
    # the inventory is older than the XID event for GPU-a, but the first word on GPU-b
    assert [s.outcome for s in statuses] == [Outcome.STALE, Outcome.CHANGED]
    assert not book.healthy("GPU-a")
    assert not book.healthy("GPU-b")
    book, statuses = book.apply_inventory(gpus, T0 + timedelta(seconds=20))
    assert book.healthy("GPU-a")
    assert statuses[0].outcome is Outcome.CHANGED


observations = st.lists(
    st.tuples(st.sampled_from(["GPU-a", "GPU-b"]), st.booleans(), st.integers(0, 50)),
    max_size=30,
)


@given(observations, st.randoms(use_true_random=False))
def test_any_arrival_order_ends_in_the_newest_state(
    obs: list[tuple[str, bool, int]], rnd: object
) -> None:
    # distinct times per GPU, so "newest" is well defined
    seen: dict[tuple[str, int], bool] = {}
    for uuid, healthy, t in obs:
        seen.setdefault((uuid, t), healthy)
    items = list(seen.items())
    shuffled = list(items)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    book = HealthBook("n1")
    for (uuid, t), healthy in shuffled:
        book, _ = book.apply(event(healthy, t, uuid=uuid))
    for uuid in ("GPU-a", "GPU-b"):
        mine = [(t, h) for (u, t), h in items if u == uuid]
        expected = max(mine)[1] if mine else True
        assert book.healthy(uuid) is expected
