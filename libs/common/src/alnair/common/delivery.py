"""The consuming side of the bus: every delivered message ends acknowledged, retried later, or
dead-lettered, and a JetStream event is handled once per consumer.

`Delivery.dispatch` is the one place that turns a handler's outcome into the
acknowledgement: success -> ack; `TemporaryError` -> nak with its delay; anything
undecodable, schema-invalid, sent on a subject its payload does not name, a
`PermanentError`, or a message that exhausted its deliveries -> a `DeadLetter` on
`alnair.dlq.<durable>` (stream DLQ), then term. Handled event ids live in the `alnair-handled`
KV bucket (and an in-memory LRU in front of it), so a redelivery after a restart is
acknowledged without calling the handler again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from alnair.common.errors import PermanentError, TemporaryError
from alnair.common.events import DeadLetter, DecodeError, E, Envelope, decode, subject_token
from alnair.common.tasks import in_flight

log = logging.getLogger(__name__)

DLQ_PREFIX = "alnair.dlq"

Handler = Callable[[E, Envelope[E]], Awaitable[None]]
Publish = Callable[[str, bytes, dict[str, str], float], Awaitable[None]]
"""A JetStream publish (subject, payload, headers, time budget), for the dead letters."""


class _Lru:
    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        if key in self._d:
            self._d.move_to_end(key)
            return True
        return False

    def add(self, key: str) -> None:
        self._d[key] = None
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)


class Subscription:
    """A running consumer; `stop()` ends it without acknowledging anything in flight."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks: list[asyncio.Task[Any]] = []
        self._subs: list[Any] = []
        self.handled = 0
        self.dead_lettered = 0
        self._stopped = False

    @property
    def dead(self) -> bool:
        """Its pull loop ended without `stop`: nothing more reaches its handler."""
        return not self._stopped and any(t.done() for t in self.tasks)

    async def stop(self) -> None:
        self._stopped = True
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()


class DeadLetterCollector(Collector):
    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "alnair_bus_dead_letters",
            "Messages dead-lettered by this service's consumers, by consumer and cause",
            labels=["consumer", "cause"],
        )
        for (consumer, cause), count in sorted(self.delivery.dead_letters.items()):
            family.add_metric([consumer, cause], count)
        yield family


class Delivery:
    """The consumers' state of one bus client: handled ids, copies in flight, dead letters."""

    GONE_AFTER = 3
    """Consecutive failed fetches after which a pull loop asks whether its consumer is gone."""

    def __init__(
        self, publish: Publish, on_gone: Callable[[str, str], Awaitable[None]] | None = None
    ) -> None:
        self._publish = publish
        self._on_gone = on_gone
        """Asked with (stream, durable) when fetches keep failing: makes the consumer (and its
        stream) again if the server lost them while it stayed up (no reconnect says so)."""
        self.handled_kv: KeyValue | None = None
        """The handled-id bucket, once the bus made or found it (until then: memory only)."""
        self._lru = _Lru(65536)
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self.dead_letters: Counter[tuple[str, str]] = Counter()
        """Messages dead-lettered, by (consumer, cause): `alnair_bus_dead_letters_total`."""

    async def pull_loop(
        self,
        psub: JetStreamContext.PullSubscription,
        event_type: type[E],
        handler: Handler[E],
        durable: str,
        sub: Subscription,
        sem: asyncio.Semaphore,
        batch: int,
        max_deliver: int,
    ) -> None:
        inflight: set[asyncio.Task[None]] = set()
        failed = 0
        try:
            while True:
                free = max(1, batch - len(inflight))
                try:
                    # A long poll: the server answers as soon as a message arrives.
                    msgs = await psub.fetch(free, timeout=5.0)
                    failed = 0
                except (nats.errors.TimeoutError, TimeoutError):
                    # nats-py raises its own TimeoutError or asyncio's, depending on where the
                    # wait ended; both mean "nothing yet".
                    failed = 0
                    continue
                except (
                    nats.errors.ConnectionClosedError,
                    nats.errors.ConnectionReconnectingError,
                    nats.js.errors.ServiceUnavailableError,
                    nats.js.errors.APIError,
                ) as exc:
                    log.warning("fetch failed", extra={"durable": durable, "error": repr(exc)})
                    failed += 1
                    if failed >= self.GONE_AFTER and self._on_gone is not None:
                        failed = 0
                        await self._on_gone(event_type.STREAM or "", durable)
                    await asyncio.sleep(0.5)
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Crash-only: a consumer that stops quietly loses every later event; a
                    # surprise from the client is logged and the loop goes on after a pause.
                    log.exception("fetch failed unexpectedly", extra={"durable": durable})
                    await asyncio.sleep(1.0)
                    continue
                for msg in msgs:
                    await sem.acquire()
                    # A dispatch that fails leaves its message unacknowledged: JetStream
                    # redelivers it after ack_wait (`in_flight` logs why).
                    dispatching = self._dispatch(
                        msg, event_type, handler, durable, sub, max_deliver
                    )
                    task = in_flight(dispatching, name=f"bus.dispatch.{durable}", into=inflight)
                    task.add_done_callback(lambda _t: sem.release())
        finally:
            # Cancelled: let in-flight handlers finish so nothing is handled twice needlessly.
            if inflight:
                await asyncio.wait(inflight, timeout=10.0)

    async def subscribe_core(
        self,
        event_type: type[E],
        handler: Handler[E],
        durable: str,
        subject: str,
        sub: Subscription,
        sem: asyncio.Semaphore,
        nc: NatsClient,
    ) -> None:
        """Consume core-NATS events (at most once, nothing redelivers) in a queue group."""

        async def on_msg(msg: Msg) -> None:
            async with sem:
                await self._dispatch(msg, event_type, handler, durable, sub, max_deliver=1)

        nsub = await nc.subscribe(subject, queue=durable, cb=on_msg)
        sub._subs.append(nsub)

    async def _dispatch(
        self,
        msg: Msg,
        event_type: type[E],
        handler: Handler[E],
        durable: str,
        sub: Subscription,
        max_deliver: int,
    ) -> None:
        """The one place that turns a handler outcome into ack / nak(delay) / dead-letter."""
        jetstream = bool(msg.reply) and msg.reply.startswith("$JS.ACK")
        try:
            env = decode(msg.data, expected=event_type)
        except DecodeError as exc:
            await self._dead_letter(msg, durable, str(exc), sub, jetstream, "undecodable")
            return
        named = env.data.subject()
        if msg.subject != named:
            # Each event names its subject from its own fields (a node's samples under that
            # node): a message on another subject was sent by someone allowed that subject
            # speaking for what the payload names (node A's agent writing node B's health).
            await self._dead_letter(
                msg, durable, f"sent on {msg.subject!r}, but its payload belongs on {named!r}",
                sub, jetstream, "wrong_subject",
            )  # fmt: skip
            return
        if not jetstream:
            # Core NATS delivers at most once and nothing redelivers, so there is no copy to
            # recognise: keeping every sample's id (a KV entry per sample, kept a week) only
            # grew the handled-id bucket without bound (found by the soak, issue 16).
            await self._handle(msg, env, handler, durable, sub, max_deliver, "", jetstream)
            return
        key = f"{subject_token(durable)}.{subject_token(env.id)}"
        # A copy of an event still being handled waits for that outcome instead of racing it.
        while (running := self._inflight.get(key)) is not None:
            await asyncio.shield(running)
        # Claimed before the first await, so a copy dispatched meanwhile sees the claim.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        try:
            if await self._already_handled(key):
                if jetstream:
                    await msg.ack()
                return
            await self._handle(msg, env, handler, durable, sub, max_deliver, key, jetstream)
        finally:
            self._inflight.pop(key, None)
            done.set_result(None)

    async def _handle(
        self,
        msg: Msg,
        env: Envelope[E],
        handler: Handler[E],
        durable: str,
        sub: Subscription,
        max_deliver: int,
        key: str,
        jetstream: bool,
    ) -> None:
        try:
            await handler(env.data, env)
        except TemporaryError as exc:
            delivered = msg.metadata.num_delivered if jetstream else 1
            if jetstream and delivered < max_deliver:
                log.info(
                    "handler asked for retry",
                    extra={"durable": durable, "id": env.id, "delay_s": exc.delay_s},
                )
                await msg.nak(delay=exc.delay_s)
                return
            await self._dead_letter(
                msg, durable, f"gave up after {delivered} deliveries: {exc}", sub, jetstream,
                "gave_up",
            )  # fmt: skip
            return
        except (PermanentError, ValidationError) as exc:
            await self._dead_letter(
                msg, durable, f"{type(exc).__name__}: {exc}", sub, jetstream, "refused"
            )
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # An unexpected bug: keep the message (redelivered after a delay) and say so loudly.
            log.exception("handler failed", extra={"durable": durable, "id": env.id})
            if jetstream and msg.metadata.num_delivered < max_deliver:
                await msg.nak(delay=2.0)
            else:
                await self._dead_letter(
                    msg, durable, f"handler error: {exc!r}", sub, jetstream, "handler_error"
                )
            return
        if jetstream:
            await self._mark_handled(key)
        sub.handled += 1
        if jetstream:
            await msg.ack()

    async def _already_handled(self, key: str) -> bool:
        if key in self._lru:
            return True
        if self.handled_kv is None:
            return False
        try:
            await self.handled_kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return False
        self._lru.add(key)
        return True

    async def _mark_handled(self, key: str) -> None:
        self._lru.add(key)
        if self.handled_kv is not None:
            await self.handled_kv.put(key, b"1")

    async def _dead_letter(
        self, msg: Msg, durable: str, reason: str, sub: Subscription, jetstream: bool,
        cause: str,
    ) -> None:  # fmt: skip
        dl = DeadLetter(
            subject=msg.subject,
            consumer=durable,
            reason=reason,
            payload=msg.data.decode("utf-8", errors="replace"),
            headers={k: str(v) for k, v in (msg.headers or {}).items()},
        )
        subject = f"{DLQ_PREFIX}.{subject_token(durable)}"
        await self._publish(subject, dl.model_dump_json().encode(), {}, 30.0)
        sub.dead_lettered += 1
        self.dead_letters[(durable, cause)] += 1
        log.warning(
            "message dead-lettered",
            extra={"durable": durable, "subject": msg.subject, "reason": reason},
        )
        if jetstream:
            await msg.term()
