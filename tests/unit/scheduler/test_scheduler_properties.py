"""Invariants every policy keeps, on random clusters and pod streams (hypothesis):
no placement over-commits CPU, memory or any GPU's milli-GPU, and a pod restricted to GPU
models only lands on those models. Also: the vectorised fragmentation equals its definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from alnair.scheduler.cluster.requests import NodeSpec, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework import CycleState
from alnair.scheduler.plugins.fit import DEFAULT_FILTERS
from alnair.scheduler.plugins.fragmentation import FragmentationModel, TypicalPods, candidates
from alnair.scheduler.plugins.registry import POLICIES, framework

MODELS = ("T4", "V100M32", "G2")

nodes_st = st.lists(
    st.builds(
        lambda i, cpu, mem, gpus, model: NodeSpec(
            f"n{i}", cpu, mem, gpus, MODELS[model] if gpus else ""
        ),
        st.integers(0, 10**6),
        st.integers(1000, 96000),
        st.integers(1024, 262144),
        st.sampled_from([0, 1, 2, 4, 8]),
        st.integers(0, len(MODELS) - 1),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda n: n.name,
)


@st.composite
def pod_st(draw: st.DrawFn) -> PodRequest:
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    cpu = draw(st.integers(0, 32000))
    mem = draw(st.integers(0, 65536))
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    name = f"p{draw(st.integers(0, 10**9))}"
    if kind == "cpu":
        return PodRequest(name, cpu, mem)
    if kind == "share":
        return PodRequest(name, cpu, mem, 1, draw(st.integers(1, 999)), models)
    return PodRequest(name, cpu, mem, draw(st.sampled_from([1, 2, 4, 8])), 1000, models)


pods_st = st.lists(pod_st(), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None)
@given(nodes=nodes_st, pods=pods_st, which=st.sampled_from([p.name for p in POLICIES]))
def test_no_policy_overcommits_or_ignores_gpu_model(
    nodes: list[NodeSpec], pods: list[PodRequest], which: str
) -> None:
    snap = ClusterSnapshot.build(nodes)
    fw = framework(which, pods, tie_break="random")
    rng = np.random.default_rng(1)
    for i, pod in enumerate(pods):
        pod_i = PodRequest(
            f"{pod.name}-{i}",
            pod.cpu_milli,
            pod.memory_mib,
            pod.num_gpu,
            pod.gpu_milli,
            pod.gpu_models,
        )
        result = fw.schedule(pod_i, snap, rng)
        if result.placement is None:
            continue
        place = result.placement
        assert snap.fits(pod_i, place) is None
        if pod_i.num_gpu and pod_i.gpu_models:
            assert snap.models[snap.model_id[place.node]] in pod_i.gpu_models
        snap.assume(pod_i, place)
        assert (snap.cpu_free >= 0).all()
        assert (snap.mem_free >= 0).all()
        assert (snap.gpu_free >= 0).all()
        assert (snap.gpu_free <= 1000).all()
    # Accounting adds up: what is placed is what is missing from free capacity.
    placed = [p for p, _ in snap.placed.values()]
    assert snap.gpu_allocated_milli == sum(p.total_milli_gpu for p in placed)
    assert int((snap.cpu_cap - snap.cpu_free).sum()) == sum(p.cpu_milli for p in placed)


def naive_fragmentation(typical: TypicalPods, cpu_free: int, free: list[int], model: str) -> float:
    """F_n straight from the paper's definition, one typical pod at a time."""
    left = sum(free)
    total = 0.0
    for t in range(len(typical)):
        p = float(typical.prob[t])
        if typical.num_gpu[t] == 0:
            total += p * left
            continue
        allowed = typical.models[t]
        usable = bool(model) and (not allowed or model in allowed)
        fitting = sum(1 for g in free if g >= typical.gpu_milli[t])
        if usable and fitting >= typical.num_gpu[t] and cpu_free >= typical.cpu[t]:
            total += p * sum(g for g in free if g < typical.gpu_milli[t])
        else:
            total += p * left
    return total


@settings(max_examples=40, deadline=None)
@given(
    nodes=nodes_st,
    workload=st.lists(pod_st(), min_size=1, max_size=40),
    pod=pod_st(),
    data=st.data(),
)
def test_vectorised_fragmentation_matches_definition(
    nodes: list[NodeSpec], workload: list[PodRequest], pod: PodRequest, data: st.DataObject
) -> None:
    snap = ClusterSnapshot.build(nodes)
    for n in range(len(snap)):
        count = int(snap.gpu_count[n])
        snap.gpu_free[n, :count] = data.draw(
            st.lists(st.integers(0, 1000), min_size=count, max_size=count)
        )
        snap.cpu_free[n] = data.draw(st.integers(0, int(snap.cpu_cap[n])))
    typical = TypicalPods.from_pods(workload)
    model = FragmentationModel(typical)
    stats = model.node_stats(snap, "test")
    for n in range(len(snap)):
        count = int(snap.gpu_count[n])
        expected = naive_fragmentation(
            typical,
            int(snap.cpu_free[n]),
            list(snap.gpu_free[n, :count]),
            snap.models[snap.model_id[n]],
        )
        assert abs(stats.frag[n] - expected) < 1e-6

    # Candidates are only ever asked for nodes that passed Filter.
    nodes_idx = np.arange(len(snap), dtype=np.int64)
    for plugin in DEFAULT_FILTERS:
        verdict = plugin.filter(pod, snap, CycleState(rng=np.random.default_rng(0)), nodes_idx)
        nodes_idx = nodes_idx[verdict.passed]
    cand = candidates(model, stats, pod, snap, nodes_idx)
    if pod.is_fractional:
        # One candidate per (node, distinct free share that fits), on its lowest-index GPU.
        expected_gpus = {
            (pos, min(g for g in range(snap.gpu_free.shape[1]) if snap.gpu_free[n, g] == value))
            for pos, n in enumerate(nodes_idx)
            for value in set(snap.gpu_free[n].tolist())
            if value >= pod.gpu_milli
        }
        assert set(zip(cand.node_pos.tolist(), cand.gpu.tolist(), strict=True)) == expected_gpus
        assert len(expected_gpus) == cand.delta.size
    for k in range(cand.delta.size):
        n = int(nodes_idx[cand.node_pos[k]])
        count = int(snap.gpu_count[n])
        free = list(snap.gpu_free[n, :count])
        if pod.is_fractional:
            free[int(cand.gpu[k])] -= pod.gpu_milli
        else:
            taken = 0
            for g in range(count):
                if taken < pod.num_gpu and free[g] == 1000:
                    free[g] = 0
                    taken += 1
        cpu = int(snap.cpu_free[n]) - (pod.cpu_milli or 100)
        after = naive_fragmentation(typical, cpu, free, snap.models[snap.model_id[n]])
        assert abs(cand.frag_after[k] - after) < 1e-6


def test_typical_pods_cover_the_requested_share() -> None:
    pods = (
        [PodRequest(f"a{i}", 1000, 1, 1, 500) for i in range(60)]
        + [PodRequest(f"b{i}", 2000, 1, 1, 1000) for i in range(30)]
        + [PodRequest(f"c{i}", 3000, 1) for i in range(6)]
        + [PodRequest(f"d{i}", 4000, 1, 8, 1000) for i in range(4)]
    )
    typical = TypicalPods.from_pods(pods, coverage=0.95)
    assert len(typical) == 3
    assert typical.coverage == 0.96
    assert np.isclose(typical.prob.sum(), 1.0)
    assert typical.gpu_milli.tolist() == [500, 1000, 0]


def test_a_shapes_memory_is_pooled_over_the_models_its_pods_name() -> None:
    # Same CPU and GPUs; some name a model, some do not. Each shape keeps its own popularity
    # and models, but its memory is the quantile over all of them (naming a model does not
    # change what a pod asks of memory).
    v100 = frozenset({"V100M32"})
    pods = [PodRequest(f"a{i}", 1000, mem, 1, 1000) for i, mem in enumerate((1000, 2000, 3000))]
    pods += [PodRequest("b", 1000, 9000, 1, 1000, v100)]
    typical = TypicalPods.from_pods(pods, coverage=1.0, memory_quantile=0.5)
    assert typical.models == (frozenset(), v100)
    assert typical.prob.tolist() == [0.75, 0.25]
    assert typical.memory.tolist() == [2500, 2500]  # the median of 1000, 2000, 3000, 9000
    assert TypicalPods.from_pods(pods, coverage=1.0).memory.tolist() == [0, 0]  # FGD's
