"""Why the device plugin is not ready: what the kubelet has not registered, or refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from alnair.deviceplugin.app import unregistered


def registered(yes: bool) -> asyncio.Event:
    event = asyncio.Event()
    if yes:
        event.set()
    return event


def plugin(yes: bool) -> Any:
    return SimpleNamespace(registered=registered(yes))


def dra(yes: bool, error: str = "") -> Any:
    registrar = SimpleNamespace(registered=registered(yes), error=error, driver="gpu.alnair.io")
    return SimpleNamespace(registrar=registrar)


def test_ready_when_every_resource_and_the_dra_driver_are_registered() -> None:
    assert unregistered({"nvidia.com/gpu": plugin(True)}, dra(True)) is None
    assert unregistered({"nvidia.com/gpu": plugin(True)}, None) is None


def test_names_each_resource_the_kubelet_does_not_know() -> None:
    why = unregistered(
        {"nvidia.com/gpu": plugin(False), "alnair.io/gpu-compute": plugin(True),
         "alnair.io/gpu-memory-gib": plugin(False)},
        None,
    )  # fmt: skip
    assert why == ("not registered with the kubelet: nvidia.com/gpu, alnair.io/gpu-memory-gib")


def test_says_why_the_kubelet_refused_the_dra_driver() -> None:
    why = unregistered({}, dra(False, "unsupported versions [v1beta1]"))
    assert why == (
        "not registered with the kubelet: DRA driver gpu.alnair.io (unsupported versions [v1beta1])"
    )
