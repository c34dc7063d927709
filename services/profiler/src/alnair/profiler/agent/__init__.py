"""The node agent process: samples the node's GPUs and tells the rest of the system.

- `node_agent`: the `Agent` (metrics, inventory, health, node labels);
- `attribution`: a shared GPU's utilization split between the pods on it;
- `cgroups`: each pod's CPU and memory from its cgroup;
- `summaries`: each pod's running summary, published when it ends and spooled on disk.
"""
