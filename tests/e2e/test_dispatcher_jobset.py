"""JobSets through a queue, with JobSet's own CRD and controller (`sigs.k8s.io/jobset`, built by
hack/build-peers.sh): nothing of JobSet is written here but the JobSets a user would write.

A JobSet created without `suspend` is held by the dispatcher's webhook. The dispatcher, under
its shipped account, admits it within quota with the GPU model in every replicated Job's pod
template. JobSet's controller then creates the child Jobs, the Job controller creates their
pods, Alnair's scheduler binds them, and KWOK runs them to completion. The JobSet's
completion admits the next one. A JobSet on borrowed quota is suspended again when the lender
needs its quota back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    JOBS,
    JOBSETS,
    PODS,
    ApiError,
    KubeClient,
    Unavailable,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, ANN_BORROWING
from dispatcher_support import (
    admitted_type,
    gpu_job,
    jobset,
    queue_used,
    queued_pool,
)
from peers_support import JOBSET, install_crds, peer_controller

pytestmark = pytest.mark.e2e
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


async def _jobset(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.get(JOBSETS, name, ns)


async def _admitted(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    js = await _jobset(kube, ns, name)
    annotations = js["metadata"].get("annotations") or {}
    return js if not js["spec"].get("suspend") and ANN_ADMITTED_TYPE in annotations else None


async def _finished(kube: KubeClient, ns: str, name: str) -> bool:
    conds = ((await _jobset(kube, ns, name)).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Completed" and c["status"] == "True" for c in conds)


async def _pods(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{JOBSET_NAME}={name}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def test_jobsets_queue_admit_run_complete_and_are_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await install_crds(kube, JOBSET)
    async with queued_pool(
        cp,
        kube,
        ns,
        tmp_path,
        cohort="jc",
        queues={"train": (2, 2), "lender": (2, 0)},
        peers=[peer_controller(JOBSET, cp, kube, tmp_path, ns)],
    ):
        # Both projects' webhooks answer before anything is created (a dry run).
        await wait_for(lambda: _defaulted_and_held(kube, ns), 30, 0.2)
        # Held at creation; admitted within the queue's quota; every pod gets the model.
        first = await kube.create(JOBSETS, jobset("js1", ns, "train", 2, 5), ns)
        assert first["spec"]["suspend"] is True
        await wait_for(lambda: _admitted(kube, ns, "js1"), 20)

        async def bound_with_model(name: str, n: int) -> list[dict[str, Any]] | None:
            pods = await _pods(kube, ns, name)
            ok = [p for p in pods if p["spec"].get("nodeName")]
            return ok if len(ok) == n else None

        pods = await wait_for(lambda: bound_with_model("js1", 3), 30)
        for pod in pods:  # two workers and the driver
            assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32", pod
        # Counted: the workers' two GPUs, nothing for the driver.
        assert await wait_for(lambda: queue_used(kube, f"train-{ns}"), 10) == 2

        # On quota borrowed from the idle lender; then one more waits for quota.
        await kube.create(JOBSETS, jobset("js2", ns, "train", 2, 600), ns)
        js2 = await wait_for(lambda: _admitted(kube, ns, "js2"), 20)
        assert js2["metadata"]["annotations"][ANN_BORROWING] == "true"
        await kube.create(JOBSETS, jobset("js3", ns, "train", 2, 600), ns)
        if not await _finished(kube, ns, "js1"):
            assert await _admitted(kube, ns, "js3") is None
        # js1 completes (its Jobs, then the JobSet, by JobSet's controller): js3 admitted.
        await wait_for(lambda: _finished(kube, ns, "js1"), 60, 0.1)
        await wait_for(lambda: _admitted(kube, ns, "js3"), 20)

        # The lender needs its quota back: a borrowing JobSet is suspended again, and its
        # controller removes its pods.
        await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 30) == "V100M32"

        async def one_suspended() -> str | None:
            held = [n for n in ("js2", "js3") if (await _jobset(kube, ns, n))["spec"]["suspend"]]
            return held[0] if len(held) == 1 else None

        victim = await wait_for(one_suspended, 20)
        await wait_for(lambda: _no_pods(kube, ns, victim), 30)


async def _defaulted_and_held(kube: KubeClient, ns: str) -> bool:
    """A dry-run create: JobSet's webhook defaulted it and ours held it."""
    try:
        made = await kube.request(
            "POST", JOBSETS.path(ns), body=jobset("probe", ns, "train", 1, 1),
            params={"dryRun": "All"},
        )  # fmt: skip
    except (ApiError, Unavailable):
        return False  # registered, not answering yet
    return made["spec"].get("suspend") is True and "successPolicy" in made["spec"]


async def _no_pods(kube: KubeClient, ns: str, name: str) -> bool:
    return not await _pods(kube, ns, name)
