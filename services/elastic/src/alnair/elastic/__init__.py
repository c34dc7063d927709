"""Alnair Elastic: the ElasticJob controller that grows and shrinks distributed training jobs.

An ElasticJob's workers run as a StatefulSet (Parallel pod management) with a headless Service
and a PodGroup whose `minMember` is the job's `minReplicas`; the controller only ever changes the
StatefulSet's `.spec.replicas`. It grows on events that free GPUs (pod and node watches, scale
requests on `alnair.scale.<ns>.<job>`) and shrinks when the scheduler takes surplus workers for a
higher-priority job or a scale request asks it to; nothing resizes on a timer. Modules: `spec`
(the CRD's spec, validated), `sizing` (pure: free GPUs and the size to run at), `manifests`
(the owned objects), `controller` (watches and per-job reconcile), `handlers` (scale events),
`api`, `metrics`, `settings`, `app`.
"""
