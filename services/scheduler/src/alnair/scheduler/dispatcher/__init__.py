"""The dispatcher: the scheduler's top layer, which admits *jobs* through queues.

Workloads are created suspended (a batch/v1 Job with `spec.suspend: true` and the label
`alnair.io/queue-name: <LocalQueue>`), as Kueue users already do. The dispatcher watches the
queues (ClusterQueue, LocalQueue, Cohort), the queued Jobs and the GPU nodes, and on every change
builds a `QueueSnapshot` and asks the configured queueing policy (`alnair.scheduler.queueing`,
the same pure code the job simulator replays) what to do: admit (unsuspend, with the chosen GPU
model written into the pod template's node selector), preempt (suspend again), or wait, with a
reason the user can read (`GET /v1/jobs/{ns}/{name}`, Events, annotations).

All its state lives in the Job objects (annotations written with the admission), so a restarted
dispatcher rebuilds it from its informers; an admission is a patch conditioned on the Job's
resourceVersion, so the same decision is never applied twice. Nothing runs on a timer: a Job
finishing, a queue or node changing, or the predictor retraining wakes the reconcile loop.
"""
