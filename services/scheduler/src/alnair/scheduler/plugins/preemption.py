"""PostFilter: choose the fewest, lowest-priority pods whose eviction lets a pod fit.

A pure function of (pod, snapshot, gang sizes). For every node that only failed for lack of
room (not for taints, selectors or GPU model), victims are the pods of lower priority placed
there. Gangs are kept whole: evicting a member of a gang that would then drop below its
`minMember` means evicting the whole gang (every member, on every node), counted as such.
Victims are removed lowest priority first until the pod fits, then given back one by one
(highest priority first) while it still fits, as upstream's reprieve does.

PodDisruptionBudgets (`budgets`): a victim whose eviction would take a budget below zero
allowed disruptions (the more important victims use a budget's allowance first, as upstream)
is taken only after every victim that breaks nothing, and given back first. A budget can still
be broken when nothing else makes room, as upstream does; the node choice then minimises the
broken budgets first. The node whose victim set breaks the fewest budgets, then has the lowest
highest-priority, then the fewest pods, then the lowest priority sum wins.

Elastic surplus: a gang member whose StatefulSet ordinal (`apps.kubernetes.io/pod-index`) is at
least its PodGroup's `minMember` is surplus (an elastic job's worker above its minimum; the
ElasticJob controller shrinks the job when it goes). Surplus members are taken before any other
candidate of the same budget class, highest ordinal first, given back last, and a node where
only surplus goes wins over one where anything else would; they are listed in `graceful` so
the binder deletes them with their own grace period (SIGTERM, time to commit a checkpoint)
instead of at once.

`DefaultPreemption` is the PostFilter plugin: for a pod that Filter rejected, victims on one
node (`select_victims`, and the node is held for it); for a gang that Coscheduling's PreFilter
rejected, victims for every missing member at once, chosen on one what-if snapshot (each
member's victims gone and the member placed before the next is considered), so members never
pick the same victim and the gang fits when they are gone. Nothing is evicted unless the whole
gang then fits. The plugin only nominates: the live binder deletes the victims through the API
server, the simulator forgets them from its snapshot.

Victims in flight (live): the binder deletes victims in the background while the next cycles
run, so the snapshot still holds them for a while. `Nominations` (the live cache's, shared with
every snapshot) records each nominated preemptor with its node and request, and the victims
being deleted. Upstream's rule for nominated pods holds: a nominated pod's request is counted on
its nominated node for every pod of lower or equal priority, in Filter (`NominatedPods`) and in
`select_victims`. Victims already leaving are never chosen again; their room counts as freed,
minus what is promised to the pods nominated there, so a second preemptor either shares that
room (a `Nomination` that only `awaiting`s them) or picks other victims, never the same GPUs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from alnair.common.resources import POD_INDEX_LABEL
from alnair.scheduler.cluster.books import Nominations
from alnair.scheduler.cluster.budgets import DisruptionBudgets
from alnair.scheduler.cluster.requests import IntArray, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import (
    CycleState,
    Filtered,
    NodeVerdicts,
    Nomination,
    PostFilterResult,
)
from alnair.scheduler.framework.status import SKIP, SUCCESS, Status, unschedulable
from alnair.scheduler.plugins.coscheduling import clone_member
from alnair.scheduler.plugins.fit import for_lack_of_room
from alnair.scheduler.plugins.reservation import REASON as RESERVED
from alnair.scheduler.plugins.reservation import hold

PROMISED = "Insufficient room: promised to nominated pods"
"""NominatedPods' Filter reason (an "Insufficient" one: preemption may still help)."""


def _priority(req: PodRequest) -> int:
    return req.priority


def surplus_ordinal(req: PodRequest, gang_min_member: dict[str, int]) -> int | None:
    """The ordinal of a gang member above its PodGroup's minMember, else None."""
    if not req.gang:
        return None
    raw = dict(req.labels).get(POD_INDEX_LABEL)
    if raw is None or not raw.isdigit():
        return None
    index = int(raw)
    return index if index >= gang_min_member.get(req.gang, 1) else None


def select_victims(
    pod: PodRequest,
    snapshot: ClusterSnapshot,
    candidate_nodes: list[int],
    gang_min_member: dict[str, int],
    budgets: DisruptionBudgets | None = None,
) -> Nomination | None:
    book = snapshot.nominations
    leaving_uids = book.leaving if book is not None else {}
    if book is not None and leaving_uids:
        shared = _shared_room(pod, snapshot, candidate_nodes, book)
        if shared is not None:
            return shared
    by_node: dict[int, list[tuple[PodRequest, Placement]]] = defaultdict(list)
    gang_members: dict[str, list[tuple[PodRequest, Placement]]] = defaultdict(list)
    for req, placement in snapshot.placed.values():
        by_node[placement.node].append((req, placement))
        if req.gang:
            gang_members[req.gang].append((req, placement))

    best: tuple[tuple[int, ...], Nomination] | None = None
    for n in candidate_nodes:
        here = by_node.get(n, [])
        leaving = [(q, p) for q, p in here if q.key in leaving_uids]
        lower = [
            (q, p) for q, p in here if _priority(q) < pod.priority and q.key not in leaving_uids
        ]
        promised = book.promised(pod, snapshot.names[n]) if book is not None else []
        if not lower:
            continue
        units: dict[str, list[tuple[PodRequest, Placement]]] = {}
        for q, p in lower:
            gang = q.gang
            if gang and len(gang_members[gang]) - 1 < gang_min_member.get(gang, 1):
                members = gang_members[gang]
                if any(_priority(m) >= pod.priority for m, _ in members):
                    continue  # the gang cannot go whole: do not touch any member
                units[f"gang:{gang}"] = [m for m in members if m[0].key not in leaving_uids]
            else:
                units[q.key] = [(q, p)]
        breaking = _budget_breakers(units, budgets)

        top = {k: max(_priority(q) for q, _ in members) for k, members in units.items()}
        surplus = {
            k: o
            for k, members in units.items()
            if len(members) == 1
            and (o := surplus_ordinal(members[0][0], gang_min_member)) is not None
        }
        order = sorted(
            units,
            key=lambda k: (
                k in breaking,
                k not in surplus,
                top[k],
                -surplus.get(k, 0),
                len(units[k]),
            ),
        )
        chosen: list[str] = []
        for unit_key in order:
            chosen.append(unit_key)
            freed = leaving + [m for k in chosen for m in units[k]]
            if _fits_without(pod, snapshot, n, freed, promised):
                break
        else:
            continue
        # Reprieve: give back the victims that are not needed after all, those that break a
        # budget first, then the most important.
        for unit_key in sorted(
            chosen, key=lambda k: (k not in breaking, k in surplus, -top[k], surplus.get(k, 0))
        ):
            trial = [k for k in chosen if k != unit_key]
            freed = leaving + [m for k in trial for m in units[k]]
            if _fits_without(pod, snapshot, n, freed, promised):
                chosen = trial
        victims = [m for k in chosen for m in units[k]]
        broken = sum(len(units[k]) for k in chosen if k in breaking)
        cost = (
            broken,
            int(any(k not in surplus for k in chosen)),
            # Highest ordinals first across nodes too: the lowest surplus ordinal taken is high.
            -min((surplus[k] for k in chosen if k in surplus), default=0),
            max(_priority(q) for q, _ in victims),
            len(victims),
            sum(_priority(q) for q, _ in victims),
        )
        nomination = Nomination(
            node_name=snapshot.names[n],
            victims=tuple(q.key for q, _ in victims),
            highest_priority=cost[3],
            budget_violations=broken,
            graceful=tuple(units[k][0][0].key for k in chosen if k in surplus),
            awaiting=tuple(q.key for q, _ in leaving),
        )
        if best is None or cost < best[0]:
            best = (cost, nomination)
    return best[1] if best else None


def _shared_room(
    pod: PodRequest, snapshot: ClusterSnapshot, candidates: list[int], book: Nominations
) -> Nomination | None:
    """Room already being freed (for other preemptors) that holds `pod` too, beyond what is
    promised there: the pod waits for it and evicts nobody more, which beats any eviction.
    Only the few nodes with victims in flight are looked at, so most preemptors of a wave
    cost one node each, not a scan of the cluster."""
    going: dict[int, list[tuple[PodRequest, Placement]]] = defaultdict(list)
    for uid in book.leaving:
        entry = snapshot.placed.get(uid)
        if entry is not None:
            going[entry[1].node].append(entry)
    allowed = set(candidates)
    for n in sorted(going):
        name = snapshot.names[n]
        if n in allowed and _fits_without(pod, snapshot, n, going[n], book.promised(pod, name)):
            return Nomination(node_name=name, awaiting=tuple(q.key for q, _ in going[n]))
    return None


def _budget_breakers(
    units: dict[str, list[tuple[PodRequest, Placement]]], budgets: DisruptionBudgets | None
) -> set[str]:
    """Units with a member whose eviction, were every candidate evicted, breaks a budget."""
    if budgets is None or not len(budgets):
        return set()
    members = sorted(
        ((q, unit) for unit, qs in units.items() for q, _ in qs), key=lambda m: -_priority(m[0])
    )
    unit_of = {q.key: unit for q, unit in members}
    breaking = budgets.violations((q.key, q.namespace, dict(q.labels)) for q, _ in members)
    return {unit_of[key] for key in breaking}


def _fits_without(
    pod: PodRequest,
    snapshot: ClusterSnapshot,
    n: int,
    victims: list[tuple[PodRequest, Placement]],
    promised: Sequence[PodRequest] = (),
) -> bool:
    """Does `pod` fit on node `n` once `victims` are gone and `promised` pods are placed?"""
    cpu = int(snapshot.cpu_free[n])
    mem = int(snapshot.mem_free[n])
    count = int(snapshot.gpu_count[n])
    gpus = snapshot.gpu_free[n, :count].copy()
    sick = snapshot.unhealthy if snapshot.unhealthy.size else None
    for q, p in victims:
        if p.node != n:
            continue
        cpu += q.cpu_milli
        mem += q.memory_mib
        for g in p.gpu_indices:
            # A victim's share of an unhealthy GPU is withheld, not freed.
            if g < count and not (sick is not None and sick[n, g]):
                gpus[g] += q.gpu_milli
    for q in promised:
        cpu -= q.cpu_milli
        mem -= q.memory_mib
        if q.num_gpu and not _take_gpus(gpus, q):
            return False  # more is promised here than the node has: nothing is left
    if cpu < pod.cpu_milli or mem < pod.memory_mib:
        return False
    if n < len(snapshot.pods_cap):
        leaving = [q for q, p in victims if p.node == n]
        if snapshot.extra_shortfall(pod, n, leaving) is not None:
            return False
        if promised and _promised_shortfall(pod, snapshot, n, leaving, promised):
            return False
    if pod.num_gpu == 0:
        return True
    return int(np.count_nonzero(gpus >= pod.gpu_milli)) >= pod.num_gpu


def _take_gpus(gpus: IntArray, q: PodRequest) -> bool:
    """Set `q`'s GPUs aside on `gpus` (the fullest that hold it, as a best fit would)."""
    fitting = np.flatnonzero(gpus >= q.gpu_milli)
    if len(fitting) < q.num_gpu:
        return False
    chosen = fitting[np.argsort(gpus[fitting], kind="stable")[: q.num_gpu]]
    gpus[chosen] -= q.gpu_milli
    return True


def _promised_shortfall(
    pod: PodRequest,
    snapshot: ClusterSnapshot,
    n: int,
    leaving: Sequence[PodRequest],
    promised: Sequence[PodRequest],
) -> bool:
    """Do the promised pods take the pod count or another resource `pod` needs on `n`?"""
    if snapshot.pods_used[n] - len(leaving) + len(promised) + 1 > snapshot.pods_cap[n]:
        return True
    for name, amount in pod.extra:
        room = int(snapshot.extra_room(name)[n])
        room += sum(dict(q.extra).get(name, 0) for q in leaving)
        room -= sum(dict(q.extra).get(name, 0) for q in promised)
        if room < amount:
            return True
    return False


_NOTHING = PostFilterResult(unschedulable("no preemption helps"))


def _shared_held_nodes(pod: PodRequest, snapshot: ClusterSnapshot, filtered: Filtered) -> list[int]:
    """Nodes held for a nominated preemptor that kept `pod` off: the room being freed there
    may hold `pod` too (the later filters did not see them: the GPU model is checked here,
    the room by `select_victims`)."""
    assert snapshot.nominations is not None
    held = set(snapshot.nominations.nodes())
    nodes = [
        n for n in filtered.nodes_where(lambda why: why == RESERVED) if snapshot.names[n] in held
    ]
    if nodes and pod.num_gpu and pod.gpu_models:
        allowed = snapshot.model_mask(pod.gpu_models)
        nodes = [n for n in nodes if allowed[n]]
    return nodes


class DefaultPreemption:
    """PostFilter: evict lower-priority pods so that the pod, or its whole gang, fits."""

    NAME: ClassVar[str] = "DefaultPreemption"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def post_filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, filtered: Filtered
    ) -> PostFilterResult:
        if pod.priority <= 0:
            return _NOTHING
        mins = snapshot.gangs.min_members() if snapshot.gangs is not None else {}
        if pod.gang and not filtered.by_reason:
            return self._for_gang(pod, snapshot, state, mins)
        candidates = filtered.nodes_where(for_lack_of_room)
        book = snapshot.nominations
        if book is not None and len(book):
            candidates = sorted({*candidates, *_shared_held_nodes(pod, snapshot, filtered)})
        if not candidates:
            return _NOTHING
        nomination = select_victims(pod, snapshot, candidates, mins, snapshot.budgets)
        if nomination is None:
            return _NOTHING
        if snapshot.reservations is not None:
            hold(snapshot.reservations, pod, nomination.node_name, self.clock())
        return PostFilterResult(unschedulable("preempting"), nomination)

    def _for_gang(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, mins: dict[str, int]
    ) -> PostFilterResult:
        gang = pod.gang
        book = snapshot.gangs
        if gang is None or book is None or gang not in book.specs or state.handle is None:
            return _NOTHING
        needed = book.specs[gang].min_member - snapshot.gang_placed.get(gang, 0)
        # A gang that can never fit must not evict anyone on its way to failing.
        if needed <= 0 or needed * pod.num_gpu > int(snapshot.gpu_count.sum()):
            return _NOTHING
        siblings = [s for s in book.pending(gang) if s.key != pod.key][: needed - 1]
        trial = [pod, *siblings]
        trial += [clone_member(pod, i) for i in range(len(trial), needed)]
        what_if = snapshot.copy()
        handle = state.handle
        victims: dict[str, bool] = {}
        for member in trial:
            placed = handle.schedule(member, what_if, state.rng, what_if=True)
            if placed.placement is None:
                explained = handle.schedule(member, what_if, state.rng, explain=True)
                lacking = [n for n, why in explained.node_reasons.items() if for_lack_of_room(why)]
                nomination = select_victims(member, what_if, lacking, mins, snapshot.budgets)
                if nomination is None:
                    return _NOTHING
                for uid in nomination.victims:
                    what_if.forget(uid)
                    victims[uid] = uid in nomination.graceful
                for uid in nomination.awaiting:  # leaving already: their room is counted
                    if uid in what_if.placed:
                        what_if.forget(uid)
                placed = handle.schedule(member, what_if, state.rng, what_if=True)
                if placed.placement is None:
                    return _NOTHING
            what_if.assume(member, placed.placement)
        if not victims:
            return _NOTHING
        return PostFilterResult(
            unschedulable("preempting for the gang"),
            Nomination(
                victims=tuple(victims),
                graceful=tuple(uid for uid, graceful in victims.items() if graceful),
                gang=gang,
                message=f"gang {gang} preempts {len(victims)} lower-priority pod(s) so that "
                f"its {needed} missing member(s) fit together.",
            ),
        )


class NominatedPods:
    """Filter: a nominated pod's request counts on its nominated node for every pod of lower
    or equal priority (upstream's rule), so the room its victims free is not taken by others."""

    NAME: ClassVar[str] = "NominatedPods"

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        book = snapshot.nominations
        return SUCCESS if book is not None and len(book) else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        book = snapshot.nominations
        assert book is not None  # PreFilter skips otherwise
        refused = [
            snapshot.node_index(name)
            for name in book.nodes()
            if name in snapshot._index
            and (promised := book.promised(pod, name))
            and not _fits_without(pod, snapshot, snapshot.node_index(name), [], promised)
        ]
        blocked = np.isin(nodes, np.array(refused, dtype=np.int64))
        return NodeVerdicts(passed=~blocked, failures=((PROMISED, blocked),))
