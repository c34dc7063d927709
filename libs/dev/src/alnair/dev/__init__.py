"""Development tooling: never installed in a service image.

- `localstack`: real etcd, kube-apiserver, controller-manager, KWOK, NATS and Redis processes
  for tests, benchmarks and the demo; `devstack`: the same stack kept up for `make up`.
- `live_demo`: the second part of `make demo`.
- `builders`, `waiting`, `elastic`, `chaos`, `soak`: what the tests and the benchmarks both use
  (object builders, the one wait helper, an in-process elastic stack, the chaos and soak
  drivers), so no benchmark imports from `tests/`.
"""
