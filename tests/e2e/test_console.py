"""The web console in a real headless browser (issue 29), reached as a user reaches it:
`kubectl proxy` in front of the real API server, which authenticates and authorizes each read
and proxies it to the scheduler's and the dispatcher's aggregated APIs. Live updates come from
the bus: a job admitted while the page is open appears without a reload."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from alnair.common.aggregated import DISPATCHER_GROUP, QUERY_VERSION, SCHEDULER_GROUP
from alnair.common.bus import Bus
from alnair.common.kube import APISERVICES, JOBS, KubeClient, NotFound
from alnair.common.tls import issue, write_folder
from alnair.dev.browser import Browser
from alnair.dev.builders import shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import register_api_service
from alnair.dev.waiting import wait_for
from alnair.scheduler.app import start_query
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from dispatcher_support import POOL, admitted_type, cohort_queues, dispatcher_settings, gpu_job
from scheduler_support import Running, seen_ready

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
SERVING = re.compile(r"Starting to serve on 127\.0\.0\.1:(\d+)")
SHOTS = os.environ.get("ALNAIR_CONSOLE_SCREENSHOTS")
"""Where to keep the screenshots (the README's comes from here); else the test's folder."""


@contextlib.asynccontextmanager
async def kubectl_proxy(cp: ControlPlane) -> AsyncIterator[str]:
    """`kubectl proxy` on a free port, with the kubeconfig's credentials: its URL."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "kubectl"), "proxy", "--port=0", f"--kubeconfig={cp.kubeconfig}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode()
        match = SERVING.search(line)
        assert match, line
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        await proc.wait()


async def _available(kube: KubeClient, group: str) -> bool:
    api = await kube.get(APISERVICES, f"{QUERY_VERSION}.{group}")
    conds = (api.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conds)


async def test_the_console_shows_gpus_queues_and_jobs_and_follows_admissions_live(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, tmp_path: Path
) -> None:
    ns, cp = namespace, control_plane
    shots = Path(SHOTS) if SHOTS else tmp_path / "shots"
    (node,) = await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "c", {"ml": (4, None), "lab": (4, None)})
    certs = {}
    for service in ("dispatcher", "scheduler"):
        certs[service] = issue([f"alnair-{service}-query.default.svc", "127.0.0.1"])
        write_folder(tmp_path / service, certs[service].secret_data())
    bus = await Bus.connect(nats_url, name="console-e2e")
    # Both services under their own accounts, with the RBAC they ship.
    accounts = {
        service: KubeClient(await shipped_account(
            cp, kube, f"alnair-{service}", f"{service}/rbac.yaml", f"{service}/query-api.yaml",
            skip={"APIService"},
        ))
        for service in ("dispatcher", "scheduler")
    }  # fmt: skip
    running = Running(
        accounts["scheduler"], query_cert_dir=str(tmp_path / "scheduler"), query_port=0,
        http_host="127.0.0.1",
    )  # fmt: skip
    sched = await running.start()
    secure = await start_query(sched.settings, accounts["scheduler"], sched, bus=bus)
    assert secure is not None
    dispatcher = await start_dispatcher(dispatcher_settings(
        cp, ns, webhook_cert_dir=str(tmp_path / "dispatcher"), webhook_port=0,
        nats_enabled=True, nats_url=nats_url,
    ), kube=accounts["dispatcher"])  # fmt: skip
    assert dispatcher.webhook is not None
    try:
        for service, group, port in (
            ("dispatcher", DISPATCHER_GROUP, dispatcher.webhook.port),
            ("scheduler", SCHEDULER_GROUP, secure.port),
        ):
            await register_api_service(
                kube, group, QUERY_VERSION, port, certs[service].ca_pem,
                service=f"alnair-{service}-query",
            )  # fmt: skip
            await wait_for(lambda g=group: _available(kube, g), 60, what=f"{group} Available")
        await seen_ready(sched, [node])
        await kube.create(JOBS, gpu_job("first", ns, "ml", 4), ns)
        await wait_for(lambda: admitted_type(kube, ns, "first"), 20)

        async with kubectl_proxy(cp) as proxy, Browser() as page:
            console = f"{proxy}/apis/{SCHEDULER_GROUP}/{QUERY_VERSION}/console/"
            await page.open(console + "#gpus")
            # The GPU map: the node, four GPUs held by the first job's pod.
            held = f"document.querySelectorAll('[data-node=\"{node}\"] .cell.used').length"
            assert await page.wait_for(f"{held} === 4 && {held}") == 4
            cells = await page.evaluate(
                f"document.querySelectorAll('[data-node=\"{node}\"] .cell').length"
            )
            assert cells == 8
            summary = await page.evaluate(
                "[...document.querySelectorAll('#gpu-summary [data-model=\"V100M32\"] td')]"
                ".map(td => td.textContent)"
            )
            assert summary[0] == "V100M32" and summary[2] != "0", summary
            await page.screenshot(shots / "console-gpus.png")

            await page.evaluate("location.hash = 'queues'")  # the same page: no reload
            row = f'[data-queue="ml-{ns}"]'
            await page.wait_for(f"!!document.querySelector('{row}')")
            cells = await page.evaluate(
                f"[...document.querySelector('{row}').children].map(td => td.textContent)"
            )
            assert cells[0] == f"ml-{ns}" and cells[1] == f"c-{ns}" and cells[5] == "4 / 4"
            await page.screenshot(shots / "console-queues.png")

            await page.evaluate("location.hash = 'jobs'")
            await page.wait_for(f"!!document.querySelector('[data-job=\"{ns}/first\"]')")
            await page.wait_for("document.getElementById('live').textContent === 'live'")
            # A job admitted while the page is open: the bus says so, the page reads again.
            await kube.create(JOBS, gpu_job("second", ns, "lab", 2), ns)
            await wait_for(lambda: admitted_type(kube, ns, "second"), 20)
            second = f"document.querySelector('.row.admitted[data-job=\"{ns}/second\"]')"
            await page.wait_for(f"Boolean({second})", timeout_s=20)
            # Why a job waits: its explanation beside the timeline.
            await page.evaluate(f"{second}.click()")
            why = await page.wait_for(
                "!document.getElementById('why').hidden && document.getElementById('why')"
                ".textContent"
            )
            assert f"{ns}/second" in why and "admitted" in why
            await page.screenshot(shots / "console-jobs.png")
            assert await page.evaluate("document.getElementById('error').hidden") is True
            assert page.errors == [], page.errors
    finally:
        await dispatcher.stop()
        await secure.stop()
        await running.stop()
        for client in accounts.values():
            await client.close()
        await bus.close()
        for group in (DISPATCHER_GROUP, SCHEDULER_GROUP):
            with contextlib.suppress(NotFound):
                await kube.delete(APISERVICES, f"{QUERY_VERSION}.{group}")
