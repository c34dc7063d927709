"""Cold start, as the seed plans it (004): a job the predictor never measured on some GPU model
is held until a TrialJob has run it there briefly (one GPU each), so the first admission is
decided on a measurement rather than a guess. The trial's name is written on the job
(`alnair.io/trial`), so a restarted dispatcher waits for the same trial; `skip` opts out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from alnair.common.informer import Informer
from alnair.common.kube import TRIALJOBS, ApiError, Conflict, KubeClient, Obj
from alnair.scheduler.dispatcher.kinds import KINDS
from alnair.scheduler.dispatcher.parsing import ANN_TRIAL, Workload, trial_phase, trialjob_manifest
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.writing import JobState, PostEvent, WorkloadWriter
from alnair.scheduler.queueing import WaitReason

log = logging.getLogger(__name__)


class ColdStart:
    """Starts TrialJobs for jobs never measured, and holds the jobs until they are done."""

    def __init__(
        self,
        kube: KubeClient,
        settings: DispatcherSettings,
        trials: Informer,
        writer: WorkloadWriter,
        *,
        event: PostEvent,
        remember: Callable[[Workload, Obj], None],
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.trials = trials
        self.writer = writer
        self.event = event
        self.remember = remember

    async def holds(self, wl: Workload, state: JobState) -> bool:
        """Hold a job the predictor never measured on some GPU model until its TrialJob has
        run there (seed 004: an unseen model gets GPUs first to collect data). True: it waits.
        """
        prediction = state.prediction
        chosen = wl.annotations.get(ANN_TRIAL)
        if chosen == "skip" or not self.settings.trials or not KINDS[wl.kind].writable:
            return False
        if chosen:
            trial = self.trials.get(f"{wl.namespace}/{chosen}")
            phase = trial_phase(trial)
            if trial is None or phase in ("Succeeded", "Failed"):
                return False  # measured, could not be, or deleted: decide on what is known
            state.reason = WaitReason(
                "prediction", f"trial run {chosen} is measuring the job ({phase or 'Pending'})"
            )
            return True
        if prediction is None or not prediction.needs_trial:
            return False
        name = f"{wl.name[:50]}-trial"
        models = list(prediction.unmeasured_models)
        manifest = trialjob_manifest(wl, name, models, self.settings.trial_duration_s)
        try:
            created = await self.kube.create(TRIALJOBS, manifest, wl.namespace)
            # Known at once, before its watch event arrives (the next reconcile looks for it).
            self.trials.store.setdefault(f"{wl.namespace}/{name}", created)
        except Conflict:
            pass  # created by an earlier run of ours that died before annotating the Job
        except ApiError as exc:
            log.warning("trial not created", extra={"job": wl.key, "error": str(exc)})
            return False
        annotate = {"metadata": {"annotations": {ANN_TRIAL: name}}}
        updated = await self.writer.note(wl, annotate)
        if updated is not None:
            self.remember(wl, updated)
        await self.event(
            wl.ref(), "TrialStarted",
            f"never measured on {', '.join(models)}: trial run {name} (1 GPU each, "
            f"{self.settings.trial_duration_s} s) before admission",
        )  # fmt: skip
        state.reason = WaitReason("prediction", f"trial run {name} started on {', '.join(models)}")
        return True
