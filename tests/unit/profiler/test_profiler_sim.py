"""The sim backend: GPUs from node labels, load from Gavel, slowdown when pods share a GPU."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alnair.common import resources as res
from alnair.profiler.agent.node_agent import node_labels, pod_metrics
from alnair.profiler.gpu import GpuBackend
from alnair.profiler.sim import (
    ANN_SIM_MEM,
    ANN_SIM_UNHEALTHY,
    ANN_SIM_UTIL,
    SimBackend,
    gpu_uuid,
    node_inventory,
    sim_pod,
)
from alnair.profiler.workloads import ThroughputTable

NOW = 1_700_000_000.0


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self.obj: dict[str, Any] = {
            "metadata": {"name": name, "labels": {}, "annotations": {}},
            "status": {"capacity": {}},
        }

    def labels(self, **labels: str) -> NodeBuilder:
        self.obj["metadata"]["labels"].update({k.replace("_", "-"): v for k, v in labels.items()})
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self.obj["metadata"]["labels"][key] = value
        return self

    def capacity_gpus(self, n: int) -> NodeBuilder:
        self.obj["status"]["capacity"][res.GPU] = str(n)
        return self

    def unhealthy(self, indices: str) -> NodeBuilder:
        self.obj["metadata"]["annotations"][ANN_SIM_UNHEALTHY] = indices
        return self


class PodBuilder:
    def __init__(self, name: str, node: str = "n1") -> None:
        self.obj: dict[str, Any] = {
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": {}},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "resources": {"limits": {}, "requests": {"cpu": "4", "memory": "8Gi"}},
                    }
                ],
            },
            "status": {"phase": "Running", "startTime": "2023-11-14T22:13:20Z"},
        }

    def gpus(self, n: int) -> PodBuilder:
        self.obj["spec"]["containers"][0]["resources"]["limits"][res.GPU] = str(n)
        return self

    def ann(self, key: str, value: str) -> PodBuilder:
        self.obj["metadata"]["annotations"][key] = value
        return self

    def model(self, name: str, batch: int) -> PodBuilder:
        return self.ann(res.ANN_MODEL_NAME, name).ann(res.ANN_BATCH_SIZE, str(batch))

    def phase(self, phase: str) -> PodBuilder:
        self.obj["status"]["phase"] = phase
        return self


def v100_node(name: str = "n1", count: int = 4) -> dict[str, Any]:
    return (
        NodeBuilder(name)
        .label(res.LABEL_GPU_MODEL, "V100M32")
        .label(res.LABEL_GPU_COUNT, str(count))
        .obj
    )


_TABLE = ThroughputTable.load()


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.load()


def test_gpus_derive_from_labels_with_known_model_defaults() -> None:
    inv = node_inventory(v100_node(count=8))
    assert inv is not None
    assert len(inv.gpus) == 8
    assert {g.memory_mib for g in inv.gpus} == {32510}
    assert {g.compute_capability for g in inv.gpus} == {"7.0"}
    assert inv.gpus[0].uuid == gpu_uuid("n1", 0) != inv.gpus[1].uuid
    assert (inv.gpus[0].numa_node, inv.gpus[7].numa_node) == (0, 1)
    assert inv.links[0][0] == "X"
    assert inv.links[0][5] == "NV2"
    assert node_labels(inv) == {
        res.LABEL_GPU_MODEL: "V100M32",
        res.LABEL_GPU_MEMORY_MIB: "32510",
        res.LABEL_GPU_COUNT: "8",
        res.LABEL_GPU_COMPUTE_CAPABILITY: "7.0",
    }


def test_capacity_and_explicit_labels_win() -> None:
    node = (
        NodeBuilder("t")
        .capacity_gpus(2)
        .label(res.LABEL_GPU_MODEL, "T4")
        .label(res.LABEL_GPU_MEMORY_MIB, "15000")
        .obj
    )
    inv = node_inventory(node)
    assert inv is not None
    assert [g.memory_mib for g in inv.gpus] == [15000, 15000]
    assert inv.gpus[0].compute_capability == "7.5"
    assert inv.links[0][1] == "PHB"  # T4: PCIe only
    assert node_inventory(NodeBuilder("cpu-only").obj) is None


def test_backend_satisfies_the_interface() -> None:
    assert isinstance(SimBackend(), GpuBackend)


def test_pod_alone_gets_its_annotated_load_and_metrics_name_it() -> None:
    sim = SimBackend(jitter=0.0)
    sim.upsert_node(v100_node())
    pod = PodBuilder("p").gpus(1).ann(ANN_SIM_UTIL, "70").ann(ANN_SIM_MEM, "9000").obj
    sim.upsert_pod(pod, NOW)
    sample = sim.sample("n1", NOW)
    busy = [g for g in sample.gpus if g.processes]
    assert len(busy) == 1
    assert busy[0].util_pct == pytest.approx(70.0)
    assert busy[0].mem_used_mib == pytest.approx(9000.0)
    metrics = pod_metrics(sample, {}, {})
    assert len(metrics) == 1
    m = metrics[0]
    assert (m.namespace, m.pod, m.pod_uid, m.node) == ("ml", "p", "uid-p", "n1")
    assert m.gpu_uuid == busy[0].uuid
    assert m.gpu_util_pct == pytest.approx(70.0)
    assert m.gpu_mem_used_mib == pytest.approx(9000.0)
    assert m.cpu_util_cores > 0
    assert m.mem_used_mib > 0


def test_scheduler_chosen_indices_are_honoured_and_multi_gpu_pods_report_each_gpu() -> None:
    sim = SimBackend(jitter=0.0)
    sim.upsert_node(v100_node())
    sim.upsert_pod(PodBuilder("p").gpus(2).ann(res.ANN_GPU_INDICES, "1,3").obj, NOW)
    metrics = pod_metrics(sim.sample("n1", NOW), {}, {})
    assert sorted(m.gpu_index for m in metrics if m.gpu_index is not None) == [1, 3]


def test_picked_gpus_spread_whole_gpu_pods_before_sharing() -> None:
    sim = SimBackend(jitter=0.0)
    sim.upsert_node(v100_node(count=2))
    for name in ("a", "b", "c"):
        sim.upsert_pod(PodBuilder(name).gpus(1).obj, NOW)
    by_gpu = {g.index: {p.pod_uid for p in g.processes} for g in sim.sample("n1", NOW).gpus}
    assert {len(v) for v in by_gpu.values()} == {1, 2}  # two alone would be wrong: three pods


def test_sharing_a_gpu_slows_each_pod_by_the_measured_factor(table: ThroughputTable) -> None:
    sim = SimBackend(table, jitter=0.0)
    sim.upsert_node(v100_node())
    a = PodBuilder("a").gpus(1).model("ResNet-50", 64).ann(res.ANN_GPU_INDICES, "0").obj
    sim.upsert_pod(a, NOW)
    alone = next(m for m in pod_metrics(sim.sample("n1", NOW), {}, {}) if m.pod == "a")
    b = PodBuilder("b").gpus(1).model("ResNet-18", 16).ann(res.ANN_GPU_INDICES, "0").obj
    sim.upsert_pod(b, NOW)
    shared = {m.pod: m for m in pod_metrics(sim.sample("n1", NOW), {}, {})}
    expected = table.slowdown(
        table.resolve("ResNet-50", 64), [table.resolve("ResNet-18", 16)], "V100M32"
    )
    assert expected < 1.0
    # The pod's own SM share drops by the measured factor ...
    assert shared["a"].sm_util_pct == pytest.approx(alone.sm_util_pct * expected)
    # ... and each pod has its own number, not the device's (the dcgm-exporter gap): the
    # device's utilization (capped at 100) is split between them.
    device = next(g for g in sim.sample("n1", NOW).gpus if g.index == 0)
    assert shared["a"].gpu_util_pct + shared["b"].gpu_util_pct == pytest.approx(device.util_pct)
    assert shared["a"].gpu_mem_used_mib + shared["b"].gpu_mem_used_mib == pytest.approx(
        device.mem_used_mib
    )


def test_pods_leave_when_not_running_and_cpu_pods_have_no_gpu() -> None:
    sim = SimBackend(jitter=0.0)
    sim.upsert_node(v100_node())
    sim.upsert_pod(PodBuilder("cpu").obj, NOW)
    sim.upsert_pod(PodBuilder("g").gpus(1).obj, NOW)
    metrics = {m.pod: m for m in pod_metrics(sim.sample("n1", NOW), {}, {})}
    assert metrics["cpu"].gpu_uuid is None
    assert metrics["g"].gpu_uuid is not None
    sim.upsert_pod(PodBuilder("g").gpus(1).phase("Succeeded").obj, NOW)
    sim.remove_pod("uid-cpu")
    assert pod_metrics(sim.sample("n1", NOW), {}, {}) == []
    assert all(not g.processes for g in sim.sample("n1", NOW).gpus)


def test_jitter_is_deterministic_and_bounded() -> None:
    sim = SimBackend(jitter=0.05)
    sim.upsert_node(v100_node())
    sim.upsert_pod(PodBuilder("p").gpus(1).ann(ANN_SIM_UTIL, "60").obj, NOW)
    values = [pod_metrics(sim.sample("n1", NOW + s), {}, {})[0].gpu_util_pct for s in range(20)]
    assert all(57.0 - 1e-9 <= v <= 63.0 + 1e-9 for v in values)
    assert len(set(values)) > 1
    assert values[3] == pod_metrics(sim.sample("n1", NOW + 3), {}, {})[0].gpu_util_pct


async def test_health_flips_from_node_annotation_are_signalled() -> None:
    sim = SimBackend()
    sim.upsert_node(v100_node())
    sim.upsert_node(
        NodeBuilder("n1")
        .label(res.LABEL_GPU_MODEL, "V100M32")
        .label(res.LABEL_GPU_COUNT, "4")
        .unhealthy("2")
        .obj
    )
    assert not sim.inventory("n1").gpus[2].healthy
    sim.upsert_node(v100_node())
    sim.close()
    signals = [s async for s in sim.health_signals()]
    assert [(s.gpu_index, s.healthy) for s in signals] == [(2, False), (2, True)]
    assert signals[0].xid == 79
    assert signals[0].gpu_uuid == gpu_uuid("n1", 2)


def test_throughput_is_gavels_measurement_slowed_by_sharing(table: ThroughputTable) -> None:
    sim = SimBackend(table, jitter=0.0)
    sim.upsert_node(v100_node())
    r50 = table.resolve("ResNet-50", 64)
    r18 = table.resolve("ResNet-18", 16)
    sim.upsert_pod(
        PodBuilder("a").gpus(1).model("ResNet-50", 64).ann(res.ANN_GPU_INDICES, "0").obj, NOW
    )
    sim.upsert_pod(
        PodBuilder("wide").gpus(2).model("ResNet-50", 64).ann(res.ANN_GPU_INDICES, "2,3").obj, NOW
    )
    alone = sim.pod_throughputs("n1")
    assert alone["uid-a"] == pytest.approx(table.throughput(r50, "V100M32", 1) or 0)
    # Two GPUs: Gavel's 2-GPU measurement, not twice the 1-GPU one.
    assert alone["uid-wide"] == pytest.approx(table.throughput(r50, "V100M32", 2) or 0)
    sim.upsert_pod(
        PodBuilder("b").gpus(1).model("ResNet-18", 16).ann(res.ANN_GPU_INDICES, "0").obj, NOW
    )
    shared = sim.pod_throughputs("n1")
    assert shared["uid-a"] == pytest.approx(alone["uid-a"] * table.slowdown(r50, [r18], "V100M32"))
    assert shared["uid-wide"] == alone["uid-wide"]
    # A failed GPU stops its pods.
    sim.upsert_node(
        NodeBuilder("n1")
        .label(res.LABEL_GPU_MODEL, "V100M32")
        .label(res.LABEL_GPU_COUNT, "4")
        .unhealthy("3")
        .obj
    )
    assert sim.pod_throughputs("n1")["uid-wide"] == 0.0
    assert "uid-cpu" not in sim.pod_throughputs("n1")


@given(
    placements=st.lists(
        st.tuples(
            st.sampled_from(
                ["ResNet-50", "ResNet-18", "Transformer", "LM", "A3C", "CycleGAN", "Recommendation"]
            ),
            st.sampled_from([16, 32, 64, 128, 256]),
            st.sets(st.integers(min_value=0, max_value=3), min_size=1, max_size=4),
        ),
        max_size=8,
    ),
    second=st.integers(min_value=0, max_value=10**6),
)
@settings(max_examples=60, deadline=None)
def test_sim_samples_are_physically_possible(
    placements: list[tuple[str, int, set[int]]], second: int
) -> None:
    sim = SimBackend(_TABLE)
    sim.upsert_node(v100_node())
    for i, (model, batch, gpus) in enumerate(placements):
        pod = (
            PodBuilder(f"p{i}")
            .gpus(len(gpus))
            .model(model, batch)
            .ann(res.ANN_GPU_INDICES, ",".join(map(str, sorted(gpus))))
        )
        sim.upsert_pod(pod.obj, NOW)
    sample = sim.sample("n1", NOW + second)
    for gpu in sample.gpus:
        assert 0 <= gpu.util_pct <= 100
        assert 0 <= gpu.mem_used_mib <= 32510
    metrics = pod_metrics(sample, {}, {})
    for gpu in sample.gpus:
        on_gpu = [m for m in metrics if m.gpu_index == gpu.index]
        assert sum(m.gpu_util_pct for m in on_gpu) == pytest.approx(gpu.util_pct, abs=1e-6)
    assert {m.pod for m in metrics} == {f"p{i}" for i in range(len(placements))}
    assert all(v >= 0 for v in sim.pod_throughputs("n1").values())


def test_seed_spelled_model_annotations_pick_the_same_workload(table: ThroughputTable) -> None:
    prefixed = PodBuilder("a").gpus(1).model("ResNet-50", 64).obj
    seeds = PodBuilder("b").gpus(1).ann("model_name", "ResNet-50").ann("batch_size", "64").obj
    a, b = sim_pod(prefixed, table, NOW), sim_pod(seeds, table, NOW)
    assert a is not None and b is not None
    assert a.job is not None
    assert b.job == a.job == table.resolve("ResNet-50", 64)


@pytest.mark.parametrize("resource", list(res.GPU_MEMORY_UNIT_MIB))
def test_a_fraction_asked_in_either_memory_unit_sits_on_one_gpu(resource: str) -> None:
    pod = PodBuilder("frac")
    pod.obj["spec"]["containers"][0]["resources"]["limits"][resource] = "4"
    found = sim_pod(pod.obj, None, NOW)
    assert found is not None
    assert found.gpus_wanted == 1
    cpu_only = sim_pod(PodBuilder("cpu").obj, None, NOW)
    assert cpu_only is not None
    assert cpu_only.gpus_wanted == 0
