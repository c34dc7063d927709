"""alnair.common: what every Alnair service shares.

Settings, structured logging, guarded tasks, metrics helpers, the resource model (names of
resources, labels and annotations), the event schemas, the NATS bus client and the Kubernetes
helpers. Services import this package and never one another.
"""
