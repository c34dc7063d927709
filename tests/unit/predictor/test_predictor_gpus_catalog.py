"""GPU specification table and model catalog: names in, the right facts out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alnair.predictor.catalog import FAMILIES, describe_model, normalize_model_name
from alnair.predictor.gpus import GPU_SPECS, UnknownGpuError, canonical_gpu, lookup_gpu


@pytest.mark.parametrize(
    ("name", "canonical", "memory_mib"),
    [
        ("Tesla V100-SXM2-32GB", "V100", 32 * 1024),
        ("V100M16", "V100", 16 * 1024),
        ("NVIDIA A100-SXM4-40GB", "A100", 40 * 1024),
        ("a10", "A10", 24 * 1024),
        ("Tesla K80", "K80", 12 * 1024),
        ("NVIDIA H100 80GB HBM3", "H100", 80 * 1024),
        ("Tesla T4", "T4", 16 * 1024),
        ("p100", "P100", 16 * 1024),
    ],
)
def test_gpu_names_as_nvml_labels_and_traces_spell_them(
    name: str, canonical: str, memory_mib: int
) -> None:
    spec = lookup_gpu(name)
    assert spec.name == canonical
    assert spec.memory_mib == memory_mib


def test_a100_is_not_read_as_a10() -> None:
    assert canonical_gpu("A100") == "A100"
    assert canonical_gpu("A10G") is None or canonical_gpu("A10G") == "A10"


def test_unknown_gpu_names_the_value() -> None:
    with pytest.raises(UnknownGpuError, match="'G2'"):
        lookup_gpu("G2")


def test_the_table_orders_generations_sensibly() -> None:
    assert set(GPU_SPECS) == {"K80", "P100", "T4", "V100", "A10", "A100", "H100"}
    assert GPU_SPECS["K80"].fp32_tflops < GPU_SPECS["P100"].fp32_tflops
    assert GPU_SPECS["P100"].fp32_tflops < GPU_SPECS["V100"].fp32_tflops
    assert GPU_SPECS["V100"].bandwidth_gbps < GPU_SPECS["A100"].bandwidth_gbps
    assert GPU_SPECS["A100"].bandwidth_gbps < GPU_SPECS["H100"].bandwidth_gbps
    for spec in GPU_SPECS.values():
        assert spec.fp16_tflops >= spec.fp32_tflops
        assert all(math.isfinite(f) for f in spec.features())


@pytest.mark.parametrize(
    ("name", "family", "in_table"),
    [
        ("ResNet-50", "resnet", True),
        ("resnet_18", "resnet", True),
        ("resnet200", "resnet", False),
        ("bert-large-uncased", "transformer", False),
        ("BERT-base", "transformer", True),
        ("densenet121", "densenet", True),
        ("lstm-lm", "lm", False),
        ("A3C", "rl", True),
        ("CycleGAN", "gan", True),
        ("my-secret-net", "other", False),
    ],
)
def test_model_family_from_name(name: str, family: str, in_table: bool) -> None:
    info = describe_model(name)
    assert info.family == family
    assert info.in_table is in_table


def test_deeper_unknown_resnets_are_bigger() -> None:
    assert describe_model("resnet200").params_m > describe_model("resnet50").params_m


@given(st.text(min_size=1, max_size=40))
def test_any_name_gets_finite_features(name: str) -> None:
    info = describe_model(name)
    features = info.features()
    assert len(features) == len(FAMILIES) + 1
    assert sum(features[: len(FAMILIES)]) == 1.0
    assert all(math.isfinite(f) for f in features)
    assert info.params_m > 0
    assert normalize_model_name(name) == info.name
