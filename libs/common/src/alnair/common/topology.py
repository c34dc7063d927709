"""How well GPUs inside a node are connected, and the best-connected set for a request.

Shared by the scheduler (which chooses the GPU indices it writes on the pod) and the device
plugin (which answers the kubelet's GetPreferredAllocation), so both pick the same GPUs.
Links rank NVLink over one PCIe switch (PIX) over several (PXB) over the host bridge (PHB) over
the NUMA node's interconnect (NODE) over the socket interconnect (SYS), as `nvidia-smi topo -m`
names them. A set's score is the sum of its pairs' link scores; the best set has the highest
score, then spans the fewest NUMA nodes, then has the lowest indices (stable answers). The
search is exhaustive for the sizes real nodes have and greedy beyond `EXHAUSTIVE_LIMIT`
candidate sets.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Final

from alnair.common.events import GpuLink

LINK_SCORE: Final[dict[GpuLink, int]] = {
    GpuLink.SELF: 0,
    GpuLink.NVLINK: 5,
    GpuLink.PIX: 4,
    GpuLink.PXB: 3,
    GpuLink.PHB: 2,
    GpuLink.NODE: 1,
    GpuLink.SYS: 0,
}
EXHAUSTIVE_LIMIT: Final = 20000
"""Above this many candidate sets the choice is greedy."""

Topology = Sequence[Sequence[GpuLink]]
"""topology[i][j]: the link between GPU i and GPU j (GpuInventory.topology)."""


def set_score(gpus: Sequence[int], topology: Topology) -> int:
    """Sum of link scores over every pair of `gpus` (unknown links score as SYS)."""
    total = 0
    for a, b in itertools.combinations(gpus, 2):
        link = topology[a][b] if a < len(topology) and b < len(topology[a]) else GpuLink.SYS
        total += LINK_SCORE.get(link, 0)
    return total


def best_connected(
    pool: Sequence[int],
    need: int,
    topology: Topology,
    *,
    must: Sequence[int] = (),
    numa: Mapping[int, int | None] | None = None,
) -> list[int]:
    """`must` plus the `need` GPUs of `pool` that make the best-connected set with it (all of
    `pool` when it holds fewer)."""
    candidates = [g for g in dict.fromkeys(pool) if g not in must]
    if need >= len(candidates):
        return [*must, *candidates]
    numa = numa or {}

    def key(combo: Sequence[int]) -> tuple[int, int, list[int]]:
        full = [*must, *combo]
        return (-set_score(full, topology), len({numa.get(g) for g in full}), sorted(full))

    count = 1
    for i in range(need):
        count = count * (len(candidates) - i) // (i + 1)
    if count <= EXHAUSTIVE_LIMIT:
        return [*must, *min(itertools.combinations(candidates, need), key=key)]
    chosen: list[int] = []
    for _ in range(need):
        chosen.append(
            min((g for g in candidates if g not in chosen), key=lambda g: key([*chosen, g]))
        )
    return [*must, *chosen]
