"""The bottom floor of the scheduler: what the cluster is, as every placement plugin reads it.

- `requests`: what a pod asks and a node offers (`PodRequest`, `NodeSpec`, `Placement`).
- `snapshot`: the column-oriented `ClusterSnapshot` the framework schedules against.
- `pods`: a Kubernetes pod (and a bound pod) read into a `PodRequest`.
- `terms`, `selectors`: node and pod affinity, spread, tolerations, label selectors.
- `budgets`: PodDisruptionBudgets as preemption reads them.
- `books`: gangs, nominations and reservations, kept current by their owner (the live binder
  or a simulation) and carried on the snapshot.

Nothing here imports the framework, the plugins or the live binder (`make lint` holds it).
"""
