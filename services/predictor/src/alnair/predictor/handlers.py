"""Event subscribers: job completions wake the retrainer; NATS requests get predictions.

Completions are the only thing that makes the predictor retrain (no timer looks for new
records). The handler does no training itself, it only tells the retrainer, so a burst of
completions is acknowledged at once and folded into one retrain. Before that it hands the
retrainer the record the completion names (`detail.record`, written by the profiler's
aggregator before it publishes), so a new measurement, such as a TrialJob's run on a GPU type
the job was never measured on, serves at once (`Retrainer.absorb_record`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.errors import TemporaryError
from alnair.common.events import Envelope, JobEvent, JobPhase
from alnair.predictor.metrics import PredictorMetrics
from alnair.predictor.predictor import ModelBundle, colocation, predict
from alnair.predictor.retraining import Retrainer
from alnair.predictor.schemas import (
    ColocationReply,
    ColocationRequest,
    PredictReply,
    PredictRequest,
)


def job_event_handler(
    retrainer: Retrainer,
) -> Callable[[JobEvent, Envelope[JobEvent]], Awaitable[None]]:
    async def on_job_event(event: JobEvent, _envelope: Envelope[JobEvent]) -> None:
        if event.phase == JobPhase.COMPLETED:
            record = event.detail.get("record")
            if isinstance(record, str) and record:
                await retrainer.absorb_record(record)
            retrainer.notify()

    return on_job_event


def _serving(retrainer: Retrainer) -> ModelBundle:
    bundle = retrainer.current
    if bundle is None:
        raise TemporaryError("no model trained yet", delay_s=2.0)
    return bundle


async def subscribe(
    bus: Bus, retrainer: Retrainer, metrics: PredictorMetrics, durable: str, subject: str
) -> list[Subscription]:
    """Start the job-event consumer and the request-reply servers."""

    async def on_predict(request: PredictRequest) -> PredictReply:
        reply = predict(_serving(retrainer), request)
        metrics.requests.labels("predict", "nats", "ok").inc()
        if reply.low_confidence:
            metrics.low_confidence.labels("predict").inc()
        return reply

    async def on_colocation(request: ColocationRequest) -> ColocationReply:
        reply = colocation(_serving(retrainer), request)
        metrics.requests.labels("colocation", "nats", "ok").inc()
        if reply.low_confidence:
            metrics.low_confidence.labels("colocation").inc()
        return reply

    subs: list[Any] = [
        await bus.subscribe(JobEvent, job_event_handler(retrainer), durable=durable),
        await bus.serve(subject, PredictRequest, on_predict),
        await bus.serve(f"{subject}.colocation", ColocationRequest, on_colocation),
    ]
    return subs
