"""Retraining: the one owner of the serving model, woken by job completions.

Completed jobs bring execution records; each `JobEvent` completed calls `notify()`. The owner
task waits for that event (no timer wakes it otherwise), then lets the burst settle: it
retrains once no completion arrived for `debounce_s`, or at the latest `max_wait_s` after the
first one, so a hundred jobs finishing together cost one retrain. Training runs in a worker
thread while the event loop keeps answering with the old model; the candidate must validate
(`predictor.validate_candidate`) before it is stored in Redis, promoted and swapped in as the
new immutable snapshot. A rejected or failed candidate leaves the serving model untouched.

A completion also names its record; `absorb_record` reads that one record and, when it
measures a (job, GPU type, count) the serving model has not, swaps in the same model serving
it too (`predictor.with_measurements`, no training) as a new stored version, within
milliseconds of the event. That is how a TrialJob's run anchors the next prediction for its
job on its GPU type long before the debounced retrain. Absorbed measurements are re-applied to
a retrained model that was trained before they arrived, until one is trained with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import redis.asyncio as aioredis

from alnair.common.tasks import within
from alnair.predictor.datasets import JobKey, Observation, RecordProblem, TrainingData
from alnair.predictor.metrics import PredictorMetrics
from alnair.predictor.predictor import (
    ModelBundle,
    Validation,
    train_bundle,
    validate_candidate,
    with_measurements,
)
from alnair.predictor.records import load_record, load_records
from alnair.predictor.store import CorruptModelError, ModelStore
from alnair.predictor.throughput import ModelKind

log = logging.getLogger(__name__)


class Retrainer:
    """Owns the current `ModelBundle`; readers take `current` as an immutable snapshot."""

    def __init__(
        self,
        redis: aioredis.Redis,
        store: ModelStore,
        gavel: TrainingData,
        metrics: PredictorMetrics,
        kind: ModelKind = "ratio",
        level: float = 0.9,
        debounce_s: float = 5.0,
        max_wait_s: float = 60.0,
        tolerance: float = 0.25,
    ) -> None:
        self.redis = redis
        self.store = store
        self.gavel = gavel
        self.metrics = metrics
        self.kind: ModelKind = kind
        self.level = level
        self.debounce_s = debounce_s
        self.max_wait_s = max_wait_s
        self.tolerance = tolerance
        self.current: ModelBundle | None = None
        self.retraining = False
        self.last_validation: Validation | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self.attempts = 0
        # One swap of the serving bundle at a time (absorbing and promoting both read it).
        self._swap = asyncio.Lock()
        # Absorbed measurements no trained bundle has yet; emptied as retrains include them.
        self._absorbed: dict[tuple[JobKey, str, int], Observation] = {}
        self.installed = asyncio.Event()
        """Set each time a new bundle starts serving (the table publisher clears it)."""

    def notify(self) -> None:
        """A job completed: new records may be waiting."""
        self.metrics.completions.inc()
        self._wake.set()

    async def _records(self) -> list[Observation]:
        observations, problems = await load_records(self.redis)
        self.metrics.records_skipped.clear()
        for field, count in Counter(p.field for p in problems).items():
            self.metrics.records_skipped.labels(field).set(count)
        return observations

    async def bootstrap(self) -> ModelBundle:
        """Serve the stored current model, or train, store and promote the first one."""
        try:
            stored = await self.store.load_current()
        except CorruptModelError as exc:
            # Not signed by our key: tampered with, or written under another key. Never
            # unpickled; a fresh model replaces it.
            log.error("stored model refused, training a new one", extra={"error": str(exc)})
            stored = None
        if stored is not None:
            self._install(stored)
            log.info("serving stored model", extra={"version": stored.version})
            return stored
        records = await self._records()
        bundle = await asyncio.to_thread(train_bundle, self.gavel, records, self.kind, self.level)
        bundle.validation = Validation(True, "first model: nothing to compare with")
        await self._promote(bundle)
        return bundle

    async def absorb_record(self, key: str) -> ModelBundle | None:
        """Serve the measurement in record `key` at once, if it is new (see the module)."""
        parsed = await load_record(self.redis, key)
        if isinstance(parsed, RecordProblem):
            log.info(
                "record not absorbed",
                extra={"key": key, "field": parsed.field, "reason": parsed.reason},
            )
            return None
        return await self.absorb([parsed])

    async def absorb(self, observations: list[Observation]) -> ModelBundle | None:
        """The serving model plus these measurements, stored and promoted as a new version;
        None (nothing changes) when none of their cells is new or no model serves yet."""
        async with self._swap:
            current = self.current
            if current is None:
                return None
            bundle = with_measurements(current, observations)
            if bundle is None:
                return None
            added = [
                o for o in observations if (o.job, o.gpu_type, o.gpu_count) not in current.measured
            ]
            for obs in added:
                self._absorbed[(obs.job, obs.gpu_type, obs.gpu_count)] = obs
            bundle.validation = Validation(
                True, f"absorbed {len(added)} new measurement(s) of version {current.version}"
            )
            await self._promote_locked(bundle)
        self.metrics.absorbed.inc(len(added))
        return bundle

    async def _promote(self, bundle: ModelBundle) -> None:
        async with self._swap:
            # Trained from records read before some absorbed measurement arrived? Serve it too.
            trained = {k: o for k, o in self._absorbed.items() if k not in bundle.measured}
            self._absorbed = trained
            if trained:
                overlaid = with_measurements(bundle, list(trained.values()))
                if overlaid is not None:
                    bundle = overlaid
            await self._promote_locked(bundle)

    async def _promote_locked(self, bundle: ModelBundle) -> None:
        bundle.version = await self.store.next_version()
        await self.store.save(bundle)
        await self.store.promote(bundle.version)
        self._install(bundle)
        async with self._changed:
            self._changed.notify_all()
        log.info(
            "model promoted",
            extra={"version": bundle.version, "training_size": bundle.training_size},
        )

    def _install(self, bundle: ModelBundle) -> None:
        self.current = bundle
        self.installed.set()
        self.metrics.model_version.set(bundle.version)
        self.metrics.training_records.set(bundle.training_size.get("records", 0))

    async def run(self) -> None:
        """The owner loop: sleep until a completion, settle the burst, retrain."""
        while True:
            await self._wake.wait()
            await self._settle()
            await self.retrain_once()

    async def _settle(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while True:
            self._wake.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await within(self._wake.wait(), min(self.debounce_s, remaining))
            except TimeoutError:
                return

    async def retrain_once(self) -> Validation:
        """Train a candidate on every record, validate it, promote it if it passes."""
        started = time.perf_counter()
        self.retraining = True
        try:
            records = await self._records()
            validation = await asyncio.to_thread(
                validate_candidate,
                self.gavel,
                records,
                self.current,
                self.kind,
                self.level,
                0.2,
                self.tolerance,
            )
            self.last_validation = validation
            if not validation.accepted:
                self.metrics.retrains.labels("rejected").inc()
                log.warning("candidate model rejected", extra={"reason": validation.reason})
                return validation
            bundle = await asyncio.to_thread(
                train_bundle, self.gavel, records, self.kind, self.level
            )
            bundle.validation = validation
            await self._promote(bundle)
            self.metrics.retrains.labels("promoted").inc()
            return validation
        except Exception as exc:
            # The serving model stays; the next completion tries again.
            self.metrics.retrains.labels("error").inc()
            log.exception("retrain failed")
            failed = Validation(False, f"retrain failed: {exc!r}")
            self.last_validation = failed
            return failed
        finally:
            self.retraining = False
            self.attempts += 1
            self.metrics.retrain_seconds.observe(time.perf_counter() - started)
            async with self._changed:
                self._changed.notify_all()

    async def wait_for_version(self, version: int, timeout_s: float) -> ModelBundle:
        """Wait until version `version` or a later one serves (tests and tools)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(
                lambda: self.current is not None and self.current.version >= version
            )
        assert self.current is not None
        return self.current

    async def wait_for_attempts(self, count: int, timeout_s: float) -> None:
        """Wait until `count` retrain attempts have finished (tests and tools)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: self.attempts >= count)
