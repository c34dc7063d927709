"""The bus: typed events over NATS, with JetStream durability where losing one would matter.

Design:
- `publish` wraps an event in its CloudEvents envelope and sends it to the subject the event
  derives itself. Events of a JetStream stream (jobs, health, scale) carry `Nats-Msg-Id` = event
  id, so a publisher that retries after a lost ack does not store the event twice.
- `subscribe` binds a durable pull consumer: a stopped service resumes exactly where it stopped.
  What happens to each delivered message (ack, nak with a delay, dead letter; handled once per
  consumer, by event id) is `delivery`'s.
- Concurrency per consumer is bounded by a semaphore; ordering per subject is the caller's
  choice (max_in_flight=1 gives strict order).
- Request-reply (`request`/`serve`) for queries such as `alnair.predict`.
- nats-py reconnects by itself; we log disconnects/reconnects once, and JetStream publishes made
  while disconnected are retried until `publish_timeout_s`.
- Bounds: every stream keeps seven days and at most `STREAM_MAX_BYTES` (`DLQ_MAX_BYTES` for
  dead letters), discarding the oldest; a consumer created per replica (`inactive_s`) is
  deleted by the server once no replica has used it for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from alnair.common.colocation import BUCKET as COLOCATION_BUCKET
from alnair.common.delivery import (
    DLQ_PREFIX,
    DeadLetterCollector,
    Delivery,
    Handler,
    Subscription,
)
from alnair.common.errors import PermanentError, TemporaryError
from alnair.common.events import (
    STREAMS,
    E,
    Envelope,
    Event,
    GpuInventory,
    encode,
    wrap,
)
from alnair.common.natsauth import NatsCredentials
from alnair.common.retry import retrying
from alnair.common.tasks import spawn

log = logging.getLogger(__name__)

DLQ_STREAM = "DLQ"
HANDLED_BUCKET = "alnair-handled"
STREAM_MAX_BYTES = 1 << 30
"""Each event stream keeps at most this much (oldest dropped first, so it stays writable
whatever floods it), besides its seven days."""
DLQ_MAX_BYTES = 256 << 20
"""The dead-letter stream's bound: garbage published to every subject a service may use
cannot fill the server's store through it."""

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


class RemoteError(PermanentError):
    """A request-reply server answered with an error."""


def not_ready(bus: Bus | None) -> str | None:
    """Why a service's bus keeps it from being ready (None: ready, or it has no bus)."""
    return None if bus is None else bus.why_not_ready()


class Bus:
    """A connected NATS client with Alnair's event conventions."""

    def __init__(self, nc: NatsClient, js: JetStreamContext, name: str) -> None:
        self.nc = nc
        self.js = js
        self.name = name
        self.delivery = Delivery(self._js_publish, on_gone=self._consumer_gone)
        self._regain = asyncio.Lock()
        self._subs: list[Subscription] = []
        self._reconnect_listeners: list[Callable[[], Awaitable[None]]] = []
        self._ensures_streams = True
        self.replicas = 1
        """How many servers of a JetStream cluster keep each stream and bucket this client
        makes (1: a single server; 3: the production cluster, surviving one node's loss)."""
        self._consumers: list[tuple[str, ConsumerConfig]] = []
        self._recovery: asyncio.Task[None] | None = None
        self.recovered = asyncio.Event()
        self.recovered.set()
        self.recoveries = 0
        """Reconnects after which streams and consumers were made again (or found)."""

    def export_metrics(self, registry: CollectorRegistry) -> None:
        """Show this bus's dead letters in a service's registry, by consumer and cause
        (undecodable, wrong_subject, refused, gave_up, handler_error)."""
        registry.register(DeadLetterCollector(self.delivery))

    @property
    def connected(self) -> bool:
        """Whether the client holds a connection now (False while it reconnects)."""
        return bool(self.nc.is_connected)

    def on_reconnect(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Call `listener` each time the connection returns after a loss (work kept while
        the server was unreachable can go out now, without anyone polling for it)."""
        self._reconnect_listeners.append(listener)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        connect_timeout_s: float = 5.0,
        connect_within_s: float = 60.0,
        ensure_streams: bool = True,
        credentials: NatsCredentials | None = None,
        replicas: int = 1,
    ) -> Bus:
        """Connect as `name`, presenting `credentials` (the service's NATS user) if given.

        Once connected, the client reconnects for ever. The first connection must succeed
        within `connect_within_s`: a service that cannot reach its bus at start fails with an
        error naming the URL (and is restarted, visibly), instead of hanging unready."""

        async def on_disconnect() -> None:
            log.warning("nats disconnected", extra={"client": name})

        listeners: list[Callable[[], Awaitable[None]]] = []

        async def after_reconnect() -> None:
            # The server may have come back without its store (a wiped volume, a new pod):
            # what this client made is made again before anyone relies on it.
            await bus._recover()
            for listener in listeners:
                try:
                    await listener()
                except Exception:
                    log.exception("reconnect listener failed", extra={"client": name})

        async def on_reconnect() -> None:
            log.info("nats reconnected", extra={"client": name, "url": str(nc.connected_url)})
            # Not awaited here: nats-py runs this inside its reconnect loop, which must stay
            # free to handle the next loss while the recovery waits on the server.
            bus._recovery = spawn(after_reconnect(), name=f"bus.recover.{name}")

        async def on_error(exc: Exception) -> None:
            # A permissions violation means this service tried what its NATS user may not: a
            # bug or a misconfigured deployment, never noise.
            if "permissions violation" in str(exc).lower():
                log.error("nats refused", extra={"client": name, "error": str(exc)})
            else:
                log.debug("nats error", extra={"client": name, "error": str(exc)})

        nc = NatsClient()
        # (nats-py annotates its time-outs as int; it takes seconds as floats)
        options: dict[str, Any] = {
            "servers": [u.strip() for u in url.split(",")],
            "name": name,
            "connect_timeout": connect_timeout_s,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.25,
            "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
            "error_cb": on_error,
            **(credentials or NatsCredentials()).connect_options(),
        }
        try:
            async with asyncio.timeout(connect_within_s):
                await nc.connect(**options)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await nc.close()
            raise TemporaryError(
                f"NATS at {url} not reachable within {connect_within_s:g} s",
                url=url,
                client=name,
            ) from None
        bus = cls(nc, nc.jetstream(), name)
        bus._reconnect_listeners = listeners
        bus._ensures_streams = ensure_streams
        bus.replicas = replicas
        await bus._streams()
        return bus

    async def _streams(self) -> None:
        """Make the streams and buckets, or, for a client that may not make them, look up
        the ones it uses."""
        if self._ensures_streams:
            await self.ensure_streams()
        else:
            await self._bind_handled()

    @property
    def ready(self) -> bool:
        """Connected, and every stream and consumer this client relies on exists again since
        the last reconnect (readiness probes use it: a consumer whose durable vanished with
        the server's store consumes nothing, and must not look ready), and no consumer's pull
        loop has ended without being stopped."""
        return (
            bool(self.nc.is_connected)
            and self.recovered.is_set()
            and self.stopped_consumer() is None
        )

    def why_not_ready(self) -> str | None:
        """Why this bus keeps its service from being ready (None: it is ready)."""
        if self.ready:
            return None
        if not self.nc.is_connected:
            return "the bus is not connected"
        if (stopped := self.stopped_consumer()) is not None:
            return f"the bus consumer {stopped} stopped consuming"
        return "the bus is making its streams and consumers again after a reconnect"

    def stopped_consumer(self) -> str | None:
        """A consumer whose pull loop ended though nobody stopped it (None: every one runs)."""
        return next((sub.name for sub in self._subs if sub.dead), None)

    async def _recover(self) -> None:
        """Make again what this client made: the streams and buckets (or look them up, for a
        client that may not make them) and every durable consumer, retrying with a backoff
        until the server answers. Idempotent: after a plain reconnect it changes nothing."""
        self.recovered.clear()
        async for attempt in retrying(
            "bus recovery",
            on=(nats.errors.Error, nats.js.errors.Error, TimeoutError),
            wait_initial_s=0.5,
            wait_max_s=5.0,
            extra={"client": self.name},
        ):
            with attempt:
                await self._streams()
                for stream, cfg in self._consumers:
                    with contextlib.suppress(nats.js.errors.BadRequestError):
                        await self.js.add_consumer(stream, config=cfg)
        self.recovered.set()
        self.recoveries += 1
        log.info("bus recovered", extra={"client": self.name, "consumers": len(self._consumers)})

    async def _consumer_gone(self, stream: str, durable: str) -> None:
        """A pull loop's fetches keep failing while connected: if the server lost the consumer
        or its stream (deleted under a running server: no reconnect tells anyone), make
        everything again (`_recover`; readiness waits for it). One recovery at a time."""
        if not self.nc.is_connected:
            return  # the reconnect's own recovery covers it
        async with self._regain:
            try:
                await self.js.consumer_info(stream, durable)
                return  # it is there: the failures were something else
            except nats.js.errors.NotFoundError:
                pass
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                return
            log.warning(
                "a stream or consumer is gone under a running server: making them again",
                extra={"client": self.name, "stream": stream, "durable": durable},
            )
            await self._recover()

    async def _bind_handled(self) -> None:
        """Use the handled-event bucket the services that ensure streams made (a node
        component may look it up, not create it)."""
        try:
            self.delivery.handled_kv = await self.js.key_value(HANDLED_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            log.warning("no handled-event bucket yet: idempotence is in memory only")

    async def ensure_streams(
        self, max_bytes: int = STREAM_MAX_BYTES, dlq_max_bytes: int = DLQ_MAX_BYTES
    ) -> None:
        """Create (or update) the streams and buckets the event conventions need."""
        wanted = dict(STREAMS)
        wanted[DLQ_STREAM] = f"{DLQ_PREFIX}.>"
        for stream, subject in wanted.items():
            cfg = StreamConfig(
                name=stream,
                subjects=[subject],
                retention=RetentionPolicy.LIMITS,
                discard=DiscardPolicy.OLD,
                storage=StorageType.FILE,
                max_age=7 * 24 * 3600.0,
                max_bytes=dlq_max_bytes if stream == DLQ_STREAM else max_bytes,
                duplicate_window=120.0,
                num_replicas=self.replicas,
            )
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(cfg)
        self.delivery.handled_kv = await self.kv(HANDLED_BUCKET, ttl_s=7 * 24 * 3600.0)
        # Written by node components, which may not create it themselves (busauth).
        await self.kv(GpuInventory.BUCKET)
        await self.kv(COLOCATION_BUCKET)

    async def kv(self, bucket: str, ttl_s: float | None = None, history: int = 1) -> KeyValue:
        """The JetStream KV bucket `bucket`, created on first use."""
        try:
            return await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            return await self.js.create_key_value(
                KeyValueConfig(bucket=bucket, history=history, ttl=ttl_s, replicas=self.replicas)
            )

    async def close(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._recovery
        for sub in list(self._subs):
            await sub.stop()
        with contextlib.suppress(Exception):
            await self.nc.drain()

    # --- publishing -----------------------------------------------------------------------

    async def publish(
        self,
        event: Event,
        *,
        source: str,
        event_id: str | None = None,
        publish_timeout_s: float = 30.0,
    ) -> Envelope[Any]:
        """Publish `event`; JetStream events return once the server has stored them."""
        env = wrap(event, source=source, event_id=event_id)
        payload = encode(env)
        subject = env.subject or event.subject()
        if event.STREAM is None:
            await self.nc.publish(subject, payload)
            return env
        headers = {"Nats-Msg-Id": env.id}
        await self._js_publish(subject, payload, headers, publish_timeout_s)
        return env

    async def _js_publish(
        self, subject: str, payload: bytes, headers: dict[str, str], budget_s: float
    ) -> None:
        # While the server restarts the publish times out or fails; the message id makes the
        # retry safe (the stream's duplicate window drops a second copy).
        transient = (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError,
            nats.js.errors.ServiceUnavailableError,
            nats.js.errors.NoStreamResponseError,
        )
        try:
            async for attempt in retrying(
                "publish",
                on=transient,
                wait_initial_s=0.1,
                wait_max_s=1.0,
                timeout_s=budget_s,
                extra={"client": self.name, "subject": subject},
            ):
                with attempt:
                    try:
                        await self.js.publish(subject, payload, timeout=2.0, headers=headers)
                    except nats.js.errors.NoStreamResponseError:
                        # No stream takes the subject: lost under a running server. Made
                        # again (once at a time) before the next try.
                        if not self._regain.locked():
                            async with self._regain:
                                await self._recover()
                        raise
        except transient as exc:
            raise TemporaryError(
                "publish did not reach JetStream", subject=subject, error=repr(exc)
            ) from exc

    async def publish_raw(self, subject: str, payload: bytes) -> None:
        """Publish bytes as they are (tests and bridges); JetStream-backed if a stream matches."""
        await self.nc.publish(subject, payload)
        await self.nc.flush()

    # --- consuming ------------------------------------------------------------------------

    async def subscribe(
        self,
        event_type: type[E],
        handler: Handler[E],
        *,
        durable: str,
        subject: str | None = None,
        max_in_flight: int = 16,
        max_deliver: int = 10,
        ack_wait_s: float = 30.0,
        batch: int = 32,
        inactive_s: float | None = None,
    ) -> Subscription:
        """Deliver every `event_type` event matching `subject` to `handler`.

        JetStream events use the durable pull consumer `durable`; core-NATS events (metrics) use
        a queue group of that name, so replicas of a service share the load. A durable named
        per replica (each replica must see every event) takes `inactive_s`: the server deletes
        it once nothing has consumed from it for that long, so replicas that are gone for good
        leave nothing behind. The consumer is created or updated to this configuration.
        """
        subject = subject or event_type.subject_filter()
        sub = Subscription(durable)
        sem = asyncio.Semaphore(max_in_flight)
        self._subs.append(sub)
        if event_type.STREAM is None:
            await self.delivery.subscribe_core(
                event_type, handler, durable, subject, sub, sem, self.nc
            )
            return sub
        cfg = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_s,
            max_deliver=max_deliver + 1,
            max_ack_pending=max(max_in_flight * 4, batch),
            filter_subject=subject,
            inactive_threshold=inactive_s,
        )
        self._consumers.append((event_type.STREAM, cfg))
        try:
            await self.js.add_consumer(event_type.STREAM, config=cfg)  # create or update
        except nats.js.errors.BadRequestError as exc:
            # A change the server does not allow on an existing consumer: keep the one there.
            log.warning("consumer kept as it is", extra={"durable": durable, "error": str(exc)})
        psub = await self.js.pull_subscribe(
            subject, durable=durable, stream=event_type.STREAM, config=cfg
        )
        sub._subs.append(psub)
        sub.tasks.append(
            spawn(
                self.delivery.pull_loop(
                    psub, event_type, handler, durable, sub, sem, batch, max_deliver
                ),
                name=f"bus.consume.{durable}",
            )
        )
        return sub

    # --- request-reply --------------------------------------------------------------------

    async def request(
        self, subject: str, payload: BaseModel, reply_model: type[Rep], timeout_s: float = 5.0
    ) -> Rep:
        msg = await self.nc.request(subject, payload.model_dump_json().encode(), timeout=timeout_s)
        doc = json.loads(msg.data)
        if isinstance(doc, dict) and "error" in doc and len(doc) <= 2:
            raise RemoteError(str(doc["error"]), subject=subject, status=doc.get("status"))
        return reply_model.model_validate(doc)

    async def serve(
        self,
        subject: str,
        request_model: type[Req],
        handler: Callable[[Req], Awaitable[BaseModel]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Answer requests on `subject`; bad requests get `{"error": ..., "status": 400}`."""
        sub = Subscription(f"serve.{subject}")

        async def on_msg(msg: Msg) -> None:
            try:
                req = request_model.model_validate_json(msg.data)
                rep = await handler(req)
                body = rep.model_dump_json().encode()
            except ValidationError as exc:
                body = json.dumps({"error": _validation_text(exc), "status": 400}).encode()
            except PermanentError as exc:
                body = json.dumps({"error": str(exc), "status": 422}).encode()
            except Exception as exc:
                log.exception("request handler failed", extra={"subject": subject})
                body = json.dumps({"error": repr(exc), "status": 500}).encode()
            if msg.reply:
                await msg.respond(body)

        nsub = await self.nc.subscribe(subject, queue=queue or subject, cb=on_msg)
        sub._subs.append(nsub)
        self._subs.append(sub)
        return sub


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
    )
