"""The order in which workloads that ask no GPU are tried for admission: Kueue's.

Kueue keeps each ClusterQueue's workloads in priority order (then by arrival) and, each cycle,
takes the head of every queue and tries those heads in order: those that fit their queue's
own nominal quota first, then higher priority, then by arrival (its classical iterator, with
`PrioritySortingWithinCohort`). So a queue's high-priority workload gets the room its queue is
given before that queue's low-priority ones, and a workload owed quota comes before another
queue's borrower, which, taking the room first, would be reclaimed for it again and again.

`kueue_order` yields the same sequence in one pass: a heap of the queues' heads, each keyed
when it becomes its queue's head, so whether it borrows is judged after what was admitted
before it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator

from alnair.scheduler.dispatcher.parsing import Workload

Waiting = tuple[Workload, str]
"""A workload and the ClusterQueue it waits in."""
Rank = tuple[int, str, str]
"""Where a workload stands in its queue: (-priority, arrival, key)."""


def kueue_order(
    waiting: list[Waiting],
    *,
    borrows: Callable[[Workload, str], bool],
    rank: Callable[[Workload], Rank],
    settled: Callable[[Workload, str], bool] = lambda wl, queue: False,
) -> Iterator[Waiting]:
    """`waiting` in the order Kueue tries it. `rank` is (-priority, arrival, key). `borrows`
    is asked when a workload becomes its queue's head, after the caller has admitted (or not)
    every workload yielded before.

    `settled` says, when a workload becomes its queue's head, that the caller already knows
    it will not be admitted in this pass (one of its shape did not fit, and admissions only
    take room): it is yielded at once, without judging whether it borrows, since where a
    workload that takes nothing comes in the sequence changes nothing for the others. With
    thousands waiting behind a few shapes, that keeps the heap to the few that may fit."""
    keyed = sorted(((rank(wl), (wl, queue)) for wl, queue in waiting), key=lambda r: r[0])
    queues: dict[str, deque[tuple[Rank, Waiting]]] = {}
    for place, item in keyed:
        queues.setdefault(item[1], deque()).append((place, item))
    heads: list[tuple[bool, int, str, str, str]] = []
    ready: list[str] = list(queues)  # queues whose next head is to be judged
    while ready or heads:
        while ready:
            queue = ready.pop()
            line = queues[queue]
            while line and settled(*line[0][1]):
                yield line.popleft()[1]
            if line:
                (neg, when, key), (wl, _) = line[0]
                heapq.heappush(heads, (borrows(wl, queue), neg, when, key, queue))
        if heads:
            queue = heapq.heappop(heads)[-1]
            yield queues[queue].popleft()[1]
            ready.append(queue)
