"""Event subscribers: scale requests on `alnair.scale.<ns>.<job>` reach the controller.

The scheduler or the dispatcher publishes a `ScaleEvent` with phase `requested` (grow into GPUs
it freed or granted, shrink to give surplus back); the controller answers each with `applied`
(the size it now runs at) or `refused` (why), under an id derived from the request's, so a
request redelivered after a crash is answered once. The same subject carries the answers and
the controller's own resizes (`applied`): the handler skips every phase but `requested`.
Consumption is durable and deduplicated by event id (`alnair.common.bus`).
"""

from __future__ import annotations

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.events import Envelope, ScaleEvent, ScalePhase
from alnair.elastic.controller import Controller
from alnair.elastic.scaling import ScaleRequest


async def subscribe(bus: Bus, controller: Controller, durable: str) -> list[Subscription]:
    async def on_scale(event: ScaleEvent, envelope: Envelope[ScaleEvent]) -> None:
        if event.phase is not ScalePhase.REQUESTED:
            return
        await controller.started.wait()
        req = ScaleRequest(replicas=event.replicas, reason=event.reason, event_id=envelope.id)
        await controller.request(event.namespace, event.job, req)

    return [await bus.subscribe(ScaleEvent, on_scale, durable=durable, max_in_flight=8)]
