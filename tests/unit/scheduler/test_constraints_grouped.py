"""The inter-pod constraint plugins read placed pods grouped by labels and by terms (one
selector match per group, not per pod). On random clusters and placements, kept through
assume, forget and relabel, their verdicts and scores equal a reference that visits every
placed pod one by one, as upstream's plugins define them."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from alnair.scheduler.cluster.requests import NodeSpec, Placement, PodRequest
from alnair.scheduler.cluster.selectors import LabelSelector
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.cluster.terms import PodAffinityTerm, SpreadConstraint
from alnair.scheduler.framework import CycleState
from alnair.scheduler.plugins.constraints import (
    HARD_POD_AFFINITY_WEIGHT,
    InterPodAffinity,
    NodeSelector,
    PodTopologySpread,
    PreferredInterPodAffinity,
)

KEYS = ("zone", "kubernetes.io/hostname", "rack")
APPS = ("web", "db", "cache")
NAMESPACES = ("a", "b")


def cluster(zones: list[int], racks: list[int | None]) -> ClusterSnapshot:
    nodes = []
    for i, (zone, rack) in enumerate(zip(zones, racks, strict=True)):
        labels = {"zone": f"z{zone}", "kubernetes.io/hostname": f"n{i}"}
        if rack is not None:
            labels["rack"] = f"r{rack}"
        nodes.append(NodeSpec(f"n{i}", 64000, 1 << 20, labels=tuple(sorted(labels.items()))))
    return ClusterSnapshot.build(nodes)


term_st = st.builds(
    lambda app, key, ns: PodAffinityTerm(
        LabelSelector(match_labels=(("app", app),)), frozenset(ns), key
    ),
    st.sampled_from(APPS),
    st.sampled_from(KEYS),
    st.sampled_from([(), ("a",), ("a", "b")]),
)
weighted_st = st.tuples(st.integers(1, 100), term_st)
spread_st = st.builds(
    lambda skew, key, hard, app, least: SpreadConstraint(
        skew, key, hard, LabelSelector(match_labels=(("app", app),)), least
    ),
    st.integers(1, 2),
    st.sampled_from(KEYS),
    st.booleans(),
    st.sampled_from(APPS),
    st.integers(1, 3),
)


@st.composite
def pod_st(draw: st.DrawFn, name: str) -> PodRequest:
    return PodRequest(
        name,
        100,
        100,
        namespace=draw(st.sampled_from(NAMESPACES)),
        labels=(("app", draw(st.sampled_from(APPS))),),
        pod_affinity=tuple(draw(st.lists(term_st, max_size=1))),
        pod_anti_affinity=tuple(draw(st.lists(term_st, max_size=2))),
        pod_preferences=tuple(draw(st.lists(weighted_st, max_size=2))),
        pod_aversions=tuple(draw(st.lists(weighted_st, max_size=2))),
        spread=tuple(draw(st.lists(spread_st, max_size=2))),
    )


# --- the reference: every placed pod, one at a time ----------------------------------------


def others(snap: ClusterSnapshot, pod: PodRequest) -> list[tuple[PodRequest, dict[str, str], int]]:
    return [(q, dict(q.labels), p.node) for q, p in snap.placed.values() if q.key != pod.key]


def in_domains(snap: ClusterSnapshot, key: str, values: set[str]) -> np.ndarray:
    return np.array([labels.get(key) in values for labels in snap.labels], dtype=np.bool_)


def domains(snap: ClusterSnapshot, term: PodAffinityTerm, pod: PodRequest) -> set[str]:
    return {
        snap.labels[n][term.topology_key]
        for q, labels, n in others(snap, pod)
        if term.covers(q.namespace, labels) and term.topology_key in snap.labels[n]
    }


def reference_filter(snap: ClusterSnapshot, pod: PodRequest) -> np.ndarray:
    own = dict(pod.labels)
    unmet = np.zeros(len(snap), dtype=np.bool_)
    repelled = np.zeros(len(snap), dtype=np.bool_)
    for term in pod.pod_affinity:
        found = domains(snap, term, pod)
        if found or not term.covers(pod.namespace, own):
            unmet |= ~in_domains(snap, term.topology_key, found)
    for term in pod.pod_anti_affinity:
        repelled |= in_domains(snap, term.topology_key, domains(snap, term, pod))
    for holder, _labels, n in others(snap, pod):
        for term in holder.pod_anti_affinity:
            value = snap.labels[n].get(term.topology_key)
            if value is not None and term.covers(pod.namespace, own):
                repelled |= in_domains(snap, term.topology_key, {value})
    passed: np.ndarray = ~repelled & ~unmet
    return passed


def reference_counts(
    snap: ClusterSnapshot, pod: PodRequest, c: SpreadConstraint, keys: set[str]
) -> dict[str, int]:
    eligible = [all(k in labels for k in keys) for labels in snap.labels]
    counts = {snap.labels[n][c.topology_key]: 0 for n, ok in enumerate(eligible) if ok}
    for q, labels, n in others(snap, pod):
        if eligible[n] and q.namespace == pod.namespace and c.selector.matches(labels):
            counts[snap.labels[n][c.topology_key]] += 1
    return counts


def reference_spread_filter(snap: ClusterSnapshot, pod: PodRequest) -> np.ndarray:
    hard = [c for c in pod.spread if c.hard]
    keys = {c.topology_key for c in hard}
    passed = np.ones(len(snap), dtype=np.bool_)
    for c in hard:
        counts = reference_counts(snap, pod, c, keys)
        floor = min(counts.values()) if len(counts) >= c.min_domains else 0
        mine = 1 if c.selector.matches(dict(pod.labels)) else 0
        for n, labels in enumerate(snap.labels):
            value = labels.get(c.topology_key)
            if value is None or counts.get(value, 0) + mine - floor > c.max_skew:
                passed[n] = False
    return passed


def reference_spread_raw(snap: ClusterSnapshot, pod: PodRequest) -> list[float | None]:
    soft = [c for c in pod.spread if not c.hard]
    keys = {c.topology_key for c in soft}
    raw: list[float | None] = [0.0] * len(snap)
    for c in soft:
        counts = reference_counts(snap, pod, c, keys)
        weight = math.log(len(counts) + 2)
        for n, labels in enumerate(snap.labels):
            value = labels.get(c.topology_key)
            current = raw[n]
            if value is None or current is None:
                raw[n] = None
            else:
                raw[n] = current + weight * (counts.get(value, 0) + c.max_skew - 1)
    return raw


def reference_preferred(snap: ClusterSnapshot, pod: PodRequest) -> dict[tuple[str, str], float]:
    signed = [(float(w), t) for w, t in pod.pod_preferences]
    signed += [(-float(w), t) for w, t in pod.pod_aversions]
    by_domain: dict[tuple[str, str], float] = {}

    def add(term: PodAffinityTerm, n: int, weight: float) -> None:
        value = snap.labels[n].get(term.topology_key)
        if value is not None:
            domain = (term.topology_key, value)
            by_domain[domain] = by_domain.get(domain, 0.0) + weight

    own = dict(pod.labels)
    for q, labels, n in others(snap, pod):
        for weight, term in signed:
            if term.covers(q.namespace, labels):
                add(term, n, weight)
        theirs = [(float(HARD_POD_AFFINITY_WEIGHT), t) for t in q.pod_affinity]
        theirs += [(float(w), t) for w, t in q.pod_preferences]
        theirs += [(-float(w), t) for w, t in q.pod_aversions]
        for weight, term in theirs:
            if term.covers(pod.namespace, own):
                add(term, n, weight)
    return {d: w for d, w in by_domain.items() if w}


# --- the property ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    zones=st.lists(st.integers(0, 2), min_size=1, max_size=7),
    data=st.data(),
)
def test_grouped_constraints_equal_the_per_pod_reference(
    zones: list[int], data: st.DataObject
) -> None:
    racks = data.draw(
        st.lists(st.none() | st.integers(0, 1), min_size=len(zones), max_size=len(zones))
    )
    snap = cluster(zones, racks)
    placed = [data.draw(pod_st(f"p{i}")) for i in range(data.draw(st.integers(0, 14)))]
    for pod in placed:
        n = data.draw(st.integers(0, len(snap) - 1))
        snap.assume(pod, Placement(n, snap.names[n], ()))
    for pod in placed:  # some leave, some are relabelled in place
        fate = data.draw(st.sampled_from(["stay", "stay", "forget", "relabel"]))
        if fate == "forget":
            snap.forget(pod.key)
        elif fate == "relabel":
            snap.relabel(replace(pod, labels=(("app", data.draw(st.sampled_from(APPS))),)))
    snap = data.draw(st.sampled_from([snap, snap.copy()]))
    incoming = data.draw(pod_st("new"))
    candidates = [incoming]
    if snap.placed:  # a pod judged while its own placement is in the snapshot counts itself out
        key = data.draw(st.sampled_from(sorted(snap.placed)))
        candidates.append(snap.placed[key][0])
    nodes = np.arange(len(snap), dtype=np.int64)
    state = CycleState(np.random.default_rng(0))
    for pod in candidates:
        passed = InterPodAffinity().filter(pod, snap, state, nodes).passed
        assert passed.tolist() == reference_filter(snap, pod).tolist()
        if any(c.hard for c in pod.spread):
            verdict = PodTopologySpread().filter(pod, snap, state, nodes)
            assert verdict.passed.tolist() == reference_spread_filter(snap, pod).tolist()
        if any(not c.hard for c in pod.spread):
            scores = PodTopologySpread().score(pod, snap, state, nodes)
            raw = reference_spread_raw(snap, pod)
            ranked = [x for x in raw if x is not None]
            if ranked and max(ranked) > 0:
                high, low = max(ranked), min(ranked)
                expected = [0.0 if x is None else 100 * (high + low - x) / high for x in raw]
                assert np.allclose(scores, expected)
        preferred = PreferredInterPodAffinity().score(pod, snap, state, nodes)
        by_domain = reference_preferred(snap, pod)
        keys = {k for k, _ in by_domain}
        raw_pref = [
            sum(by_domain.get((k, labels.get(k, "")), 0.0) for k in keys) for labels in snap.labels
        ]
        low, high = min(min(raw_pref, default=0.0), 0.0), max(max(raw_pref, default=0.0), 0.0)
        expected_pref = (
            [0.0] * len(snap) if high == low else [100 * (x - low) / (high - low) for x in raw_pref]
        )
        assert np.allclose(preferred, expected_pref)
    # The groups hold exactly the placed pods.
    counted = sum(sum(nodes.values()) for nodes in snap.label_groups.values())
    assert counted == len(snap.placed)
    termed = sum(sum(nodes.values()) for _holder, nodes in snap.term_groups.values())
    assert termed == len(snap.pod_termed)


def test_node_label_verdicts_are_remembered_until_a_node_is_relabelled() -> None:
    snap = cluster([0, 1, 2], [None, 0, None])
    pod = PodRequest("p", 100, 100, node_selector=(("rack", "r0"),))
    nodes = np.arange(len(snap), dtype=np.int64)
    state = CycleState(np.random.default_rng(0))
    assert NodeSelector().filter(pod, snap, state, nodes).passed.tolist() == [False, True, False]
    assert len(snap.label_verdicts) == 1  # remembered
    copy = snap.copy()
    assert NodeSelector().filter(pod, copy, state, nodes[[2, 1]]).passed.tolist() == [False, True]
    snap.set_labels(2, {**snap.labels[2], "rack": "r0"})
    assert not snap.label_verdicts and not snap.domain_codes  # a relabelled node drops them
    assert NodeSelector().filter(pod, snap, state, nodes).passed.tolist() == [False, True, True]
