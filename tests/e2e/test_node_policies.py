"""What RBAC cannot narrow, the shipped ValidatingAdmissionPolicies do (issue 25), against the
real API server with the shipped RBAC and policies applied:

- the node agent, with a token bound to its pod on node A, labels node A (alnair.io/ labels
  only); it cannot touch node B, another label, the Node's spec, and a token bound to no pod
  on a node changes no Node at all;
- the device plugin on node A marks a pod on node A; it cannot touch a pod on node B, nor a
  pod's labels;
- the elastic controller writes only objects an ElasticJob owns, never in alnair-system,
  though its ClusterRole lets it create StatefulSets and ConfigMaps anywhere.

Each denial is a 403 naming why; the agent and the device plugin tokens are minted as the
kubelet mints their projected tokens (bound to the pod, so the API server names its node).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from alnair.common.kube import (
    ADMISSION_POLICY_BINDINGS,
    CONFIGMAPS,
    NODES,
    PODS,
    STATEFULSETS,
    ApiError,
    KubeClient,
)
from alnair.dev.builders import make_pod, pod_bound_token, shipped_account, token_client
from alnair.dev.localstack import ControlPlane

pytestmark = pytest.mark.e2e

SYSTEM_NS = "alnair-system"


@pytest.fixture(autouse=True)
async def _policies_removed_after(kube: KubeClient) -> AsyncIterator[None]:
    """The policies bind the shipped accounts cluster-wide; later tests run those accounts with
    tokens bound to no node."""
    yield
    for binding in ("alnair-profiler-agent-own-node", "alnair-deviceplugin-own-node",
                    "alnair-elastic-owned-objects"):  # fmt: skip
        with contextlib.suppress(ApiError):
            await kube.delete(ADMISSION_POLICY_BINDINGS, binding)


async def _refused(call: Any, *says: str) -> str:
    with pytest.raises(ApiError) as refused:
        await call
    assert refused.value.status == 403, refused.value
    for text in says:
        assert text in str(refused.value), refused.value
    return str(refused.value)


async def _until_enforced(call: Any, undo: Any) -> None:
    """A new policy takes a moment to load: retry `call()` until it is refused, undoing
    (`undo()`, as the cluster's admin) what went through before it was."""
    async with asyncio.timeout(20):
        while True:
            try:
                await call()
            except ApiError as exc:
                if exc.status == 403:
                    return
                raise
            await undo()
            await asyncio.sleep(0.2)


async def test_node_components_change_only_their_own_node_and_its_pods(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    cp = control_plane
    await shipped_account(
        cp, kube, "alnair-profiler-agent",
        "profiler/agent-rbac/rbac.yaml", "profiler/agent-node-policy.yaml",
    )  # fmt: skip
    unbound_cfg = await shipped_account(
        cp, kube, "alnair-deviceplugin", "deviceplugin/rbac.yaml", "deviceplugin/node-policy.yaml"
    )
    node_a, node_b = await cp.create_gpu_nodes("2x V100M32:8", kube=kube, prefix=namespace)
    pods = {}
    for node in (node_a, node_b):
        body = make_pod(f"work-{node[-1]}", namespace).gpus(1).obj()
        body["spec"]["nodeName"] = node
        pods[node] = (await kube.create(PODS, body, namespace))["metadata"]["name"]

    agent_token, agent_pod = await pod_bound_token(kube, "alnair-profiler-agent", node_a)
    plugin_token, plugin_pod = await pod_bound_token(kube, "alnair-deviceplugin", node_a)
    agent, plugin = token_client(cp, agent_token), token_client(cp, plugin_token)
    labelled = {"metadata": {"labels": {"alnair.io/probe": "agent"}}}
    async with agent, plugin, KubeClient(unbound_cfg) as unbound_plugin:
        try:
            unlabel = {"metadata": {"labels": {"alnair.io/probe": None}}}
            await _until_enforced(lambda: agent.patch(NODES, node_b, labelled),
                                  lambda: kube.patch(NODES, node_b, unlabel))  # fmt: skip
            # The agent: its own node, its own labels.
            await agent.patch(NODES, node_a, labelled)
            await _refused(agent.patch(NODES, node_b, labelled),
                           f"only the Node its pod runs on ({node_a}), not {node_b}")  # fmt: skip
            await _refused(agent.patch(NODES, node_a, {"metadata": {"labels": {"team": "x"}}}),
                           "only alnair.io/ labels")  # fmt: skip
            await _refused(agent.patch(NODES, node_a, {"spec": {"unschedulable": True}}),
                           "may not change its Node's spec")  # fmt: skip
            node = await kube.get(NODES, node_b)
            assert "alnair.io/probe" not in (node["metadata"].get("labels") or {})

            # The device plugin: pods on its node, their alnair.io/ annotations only.
            marked = {"metadata": {"annotations": {"alnair.io/gpu-allocated": "train"}}}
            unmark = {"metadata": {"annotations": {"alnair.io/gpu-allocated": None}}}
            await _until_enforced(
                lambda: plugin.patch(PODS, pods[node_b], marked, namespace),
                lambda: kube.patch(PODS, pods[node_b], unmark, namespace),
            )
            await plugin.patch(PODS, pods[node_a], marked, namespace)
            await _refused(plugin.patch(PODS, pods[node_b], marked, namespace),
                           f"only pods on its own node ({node_a})")  # fmt: skip
            await _refused(
                plugin.patch(PODS, pods[node_a], {"metadata": {"labels": {"x": "y"}}}, namespace),
                "only alnair.io/ annotations",
            )
            # A token bound to no pod (so to no node) changes no pod, though RBAC allows it.
            await _refused(unbound_plugin.patch(PODS, pods[node_a], marked, namespace),
                           "its token is bound to no node")  # fmt: skip
        finally:
            for name in (agent_pod, plugin_pod):
                with contextlib.suppress(ApiError):
                    await kube.delete(PODS, name, SYSTEM_NS)


def _stateful_set(name: str, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [owner]
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
        "spec": {"replicas": 0, "serviceName": name, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }  # fmt: skip


async def test_the_elastic_controller_writes_only_what_an_elastic_job_owns(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    cfg = await shipped_account(
        control_plane, kube, "alnair-elastic", "elastic/rbac.yaml", "elastic/owned-policy.yaml"
    )
    owner = {"apiVersion": "alnair.io/v1alpha1", "kind": "ElasticJob", "name": "ej",
             "uid": str(uuid.uuid4()), "controller": True}  # fmt: skip
    async with KubeClient(cfg) as elastic:
        loose = _stateful_set("loose", namespace, None)
        await _until_enforced(lambda: elastic.create(STATEFULSETS, loose, namespace),
                              lambda: kube.delete(STATEFULSETS, "loose", namespace))  # fmt: skip
        await _refused(
            elastic.create(STATEFULSETS, _stateful_set("inside", SYSTEM_NS, owner), SYSTEM_NS),
            "may not write in alnair-system",
        )
        await _refused(elastic.create(STATEFULSETS, loose, namespace),
                       f"only objects an ElasticJob owns, not statefulsets {namespace}/loose")  # fmt: skip
        config = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "hosts", "namespace": namespace}}  # fmt: skip
        await _refused(elastic.create(CONFIGMAPS, config, namespace), "an ElasticJob owns")
        # What it makes for an ElasticJob goes through.
        await elastic.create(STATEFULSETS, _stateful_set("workers", namespace, owner), namespace)
        config["metadata"]["ownerReferences"] = [owner]
        await elastic.create(CONFIGMAPS, config, namespace)
