"""The live scheduler: binds pods with `schedulerName: alnair` on a real Kubernetes cluster.

It runs the same plugin framework as the trace simulator against a snapshot kept current by
watches (`cache`), takes pods from a priority queue with backoff that cluster events drain
(`queue`), places gangs all-or-nothing (`gang`), preempts lower-priority pods when nothing fits
(`preemption`), and binds many pods at once through the Binding subresource (`binder`).
"""
