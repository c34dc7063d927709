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


def kueue_order(
    waiting: list[Waiting],
    *,
    borrows: Callable[[Workload, str], bool],
    priority: Callable[[Workload], int],
    arrival: Callable[[Workload], str],
) -> Iterator[Waiting]:
    """`waiting` in the order Kueue tries it. `borrows` is asked when a workload becomes its
    queue's head, after the caller has admitted (or not) every workload yielded before."""
    queues: dict[str, deque[Waiting]] = {}
    for item in sorted(waiting, key=lambda w: (-priority(w[0]), arrival(w[0]), w[0].key)):
        queues.setdefault(item[1], deque()).append(item)
    heads: list[tuple[bool, int, str, str, str]] = []

    def push(queue: str) -> None:
        if queues[queue]:
            wl = queues[queue][0][0]
            heapq.heappush(heads, (borrows(wl, queue), -priority(wl), arrival(wl), wl.key, queue))

    for queue in queues:
        push(queue)
    while heads:
        queue = heapq.heappop(heads)[-1]
        yield queues[queue].popleft()
        push(queue)
