"""The elastic demo's trainer stand-in: it completes a job when its work is done at the sizes
it held, and writes the completion again when the API server does not answer (chaos restarts
the API server; a completion lost there would leave the job running for ever)."""

from __future__ import annotations

import asyncio
from typing import Any

from alnair.common.kube import Unavailable
from alnair.common.tasks import within
from alnair.dev.demo_elastic import ElasticTrainer


class FlakyKube:
    """Refuses the first `failures` status writes as an API server that is away would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[tuple[str, Any]] = []

    async def patch(self, _resource: Any, name: str, body: Any, _ns: str, sub: str = "") -> Any:
        if self.failures:
            self.failures -= 1
            raise Unavailable("connection refused")
        self.written.append((name, body))
        return body


def worker(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"}}  # fmt: skip


async def test_a_completion_the_api_server_refused_is_written_again() -> None:
    clock = [0.0]
    kube = FlakyKube(failures=2)
    trainer = ElasticTrainer(kube, lambda: clock[0], lambda _job, _model: 10.0)  # type: ignore[arg-type]
    trainer.add("ej", "ns", gpus=1)
    assert trainer.on_worker("ej", worker("ej-0"), "V100", deleted=False) == 1
    runner = asyncio.create_task(trainer.run())
    try:
        clock[0] = 11.0  # its 10 s of work at one worker are done
        trainer.changed.set()

        async def written() -> bool:
            while not kube.written:
                await asyncio.sleep(0.05)
            return True

        assert await within(written(), 10)
    finally:
        runner.cancel()
    assert kube.written == [("ej", {"status": {"phase": "Succeeded"}})]
    assert trainer.retries == 2 and trainer.problems == []
