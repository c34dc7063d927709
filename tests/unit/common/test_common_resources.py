"""The resource model: quantities, annotations, node specs, kubeconfig parsing."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from alnair.common import resources as r
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.kube import CLUSTERQUEUES, LOCALQUEUES, PODS, resource_for
from alnair.common.kubeconfig import KubeConfig
from alnair.dev.localstack.controlplane import gpu_node_manifest, parse_node_specs


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", Decimal("0.5")), ("2", Decimal(2)), ("1Gi", Decimal(2**30)), ("1e3", Decimal(1000))],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert r.parse_quantity(text) == value


def test_cpu_and_memory_round_up() -> None:
    assert r.cpu_milli("1.0001") == 1001
    assert r.memory_mib("1536Ki") == 2
    assert r.memory_mib("32Gi") == 32768


def test_bad_quantity_names_the_value() -> None:
    with pytest.raises(InvalidValueError, match="'12 cores'"):
        r.parse_quantity("12 cores", "cpu")


def test_indices_and_durations() -> None:
    assert r.parse_indices("0, 3,7") == [0, 3, 7]
    with pytest.raises(InvalidValueError, match="alnair.io/gpu-indices"):
        r.parse_indices("0,x")
    assert r.duration_value(90) == "90s"
    assert r.duration_value(2.5) == "2.5s"


def test_node_specs_and_manifest() -> None:
    specs = parse_node_specs("2x V100M32, 3x T4:4")
    assert [(s.count, s.model, s.gpus) for s in specs] == [(2, "V100M32", 8), (3, "T4", 4)]
    node = gpu_node_manifest("n1", specs[1])
    cap = node["status"]["capacity"]
    assert cap[r.GPU] == "4"
    assert cap[r.GPU_COMPUTE] == "400"
    assert node["metadata"]["labels"][r.LABEL_GPU_MODEL] == "T4"
    assert node["metadata"]["annotations"][r.ANN_KWOK_NODE] == "fake"
    with pytest.raises(InvalidValueError, match="'Z80'"):
        parse_node_specs("1x Z80")
    with pytest.raises(InvalidValueError, match="node spec"):
        parse_node_specs("lots of GPUs")


def test_resource_paths() -> None:
    assert PODS.path("ns", "p", "binding") == "/api/v1/namespaces/ns/pods/p/binding"
    assert CLUSTERQUEUES.path(None, "team-a") == "/apis/alnair.io/v1alpha1/clusterqueues/team-a"
    assert (
        LOCALQUEUES.path("ml", "gpus") == "/apis/alnair.io/v1alpha1/namespaces/ml/localqueues/gpus"
    )
    assert resource_for("kubeflow.org/v1", "PyTorchJob").path("ns") == (
        "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs"
    )


def test_kubeconfig_relative_paths_and_errors(tmp_path: Path) -> None:
    doc = {
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://x:6443/", "certificate-authority": "ca.crt"},
            }
        ],
        "users": [{"name": "u", "user": {"token": "t0k"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump(doc))
    cfg = KubeConfig.load(str(path))
    assert cfg.server == "https://x:6443"
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    assert cfg.token == "t0k"
    path.write_text(yaml.safe_dump({**doc, "current-context": "missing"}))
    with pytest.raises(ConfigError, match="no usable current context"):
        KubeConfig.load(str(path))
    with pytest.raises(ConfigError, match="cannot read kubeconfig"):
        KubeConfig.load(str(tmp_path / "nope"))


def _container(limits: dict[str, object] | None = None, requests: dict[str, object] | None = None) -> dict[str, object]:  # fmt: skip
    resources: dict[str, object] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "resources": resources}


def test_a_containers_requests_are_its_limits_with_its_requests_over_them() -> None:
    only_limit = _container(limits={r.GPU: "2", "cpu": "4"})
    assert r.container_requests(only_limit) == {r.GPU: "2", "cpu": "4"}
    both = _container(limits={"cpu": "4", "memory": "8Gi"}, requests={"cpu": "1"})
    assert r.container_requests(both) == {"cpu": "1", "memory": "8Gi"}
    assert r.container_requests({"name": "bare"}) == {}


def test_whole_gpus_sums_containers_and_takes_the_largest_init_container() -> None:
    spec = {
        "containers": [_container(limits={r.GPU: 2}), _container(requests={r.GPU: "1"})],
        "initContainers": [_container(limits={r.GPU: "1"})],
    }
    assert r.whole_gpus(spec) == 3
    spec["initContainers"] = [_container(limits={r.GPU: "4"})]
    assert r.whole_gpus(spec) == 4  # Kubernetes' effective request
    assert r.whole_gpus({"containers": [_container(limits={"cpu": "1"})]}) == 0


@pytest.mark.parametrize("bad", ["1.5", "-1", "two"])
def test_whole_gpus_names_a_count_that_is_not_whole(bad: str) -> None:
    spec = {"containers": [_container(), _container(limits={r.GPU: bad})]}
    with pytest.raises(InvalidValueError) as caught:
        r.whole_gpus(spec, "spec.template.spec")
    assert caught.value.field == f"spec.template.spec.containers[1].resources.{r.GPU}"


@pytest.mark.parametrize(
    ("product", "memory_mib", "key"),
    [
        ("Tesla V100-SXM2-16GB", 16160, "V100M16"),
        ("Tesla V100-SXM2-32GB", 32510, "V100M32"),
        ("Tesla V100-PCIE-32GB", 32510, "V100M32"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100M80"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100M80"),
        ("NVIDIA A10", 22731, "A10"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100"),
        ("Tesla T4", 15360, "T4"),
        ("Tesla P100-PCIE-16GB", 16280, "P100"),
        ("Tesla K80", 11441, "K80"),
        ("NVIDIA GeForce RTX 4090", 24564, None),
    ],
)
def test_nvml_product_names_map_to_the_model_keys(
    product: str, memory_mib: int, key: str | None
) -> None:
    """What NVML names a GPU (the strings its nvmlDeviceGetName returns on those boards) is
    what a node's agent reads; queues, requests and throughput tables use the keys."""
    assert r.gpu_model_key(product, memory_mib) == key
    if key is not None:
        assert key in r.GPU_MODEL_MEMORY_MIB
