"""Fluent builders for scheduler unit tests, as fixtures: `pod().gpus(2).obj()`, `node("n").obj()`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from alnair.scheduler.cluster.requests import NodeSpec, PodRequest


@dataclass
class PodBuilder:
    pod: PodRequest

    def cpu(self, milli: int) -> PodBuilder:
        return PodBuilder(replace(self.pod, cpu_milli=milli))

    def mem(self, mib: int) -> PodBuilder:
        return PodBuilder(replace(self.pod, memory_mib=mib))

    def gpus(self, count: int) -> PodBuilder:
        return PodBuilder(replace(self.pod, num_gpu=count, gpu_milli=1000))

    def share(self, milli: int) -> PodBuilder:
        return PodBuilder(replace(self.pod, num_gpu=1, gpu_milli=milli))

    def models(self, *names: str) -> PodBuilder:
        return PodBuilder(replace(self.pod, gpu_models=frozenset(names)))

    def named(self, name: str) -> PodBuilder:
        return PodBuilder(replace(self.pod, name=name))

    def obj(self) -> PodRequest:
        return self.pod


_count = 0


def make_pod(name: str | None = None) -> PodBuilder:
    global _count
    _count += 1
    return PodBuilder(PodRequest(name=name or f"pod-{_count}", cpu_milli=1000, memory_mib=1024))


@dataclass
class NodeBuilder:
    node: NodeSpec

    def cpu(self, milli: int) -> NodeBuilder:
        return NodeBuilder(replace(self.node, cpu_milli=milli))

    def mem(self, mib: int) -> NodeBuilder:
        return NodeBuilder(replace(self.node, memory_mib=mib))

    def gpus(self, count: int, model: str = "V100M32") -> NodeBuilder:
        return NodeBuilder(replace(self.node, gpu_count=count, gpu_model=model))

    def obj(self) -> NodeSpec:
        return self.node


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(NodeSpec(name=name, cpu_milli=32000, memory_mib=131072))


@pytest.fixture
def pod() -> Callable[..., PodBuilder]:
    return make_pod


@pytest.fixture
def node() -> Callable[[str], NodeBuilder]:
    return make_node
