"""Alnair scheduler: the plugin framework shared by the live binder and the trace simulator.

`snapshot` (cluster state), `framework` (extension points and the Framework that runs them),
`plugins` (filters and placement policies, named in `plugins.registry`), `placement` (GPU
choice inside a node) and `simulator` (Alibaba GPU trace replay).
"""
