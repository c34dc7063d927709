#!/usr/bin/env bash
# Other projects' parts the e2e tests meet, built from their Go modules at exact versions
# through the Go module proxy and cached outside the tree (never committed). For each, its
# CRDs and webhook configurations as the project ships them, and its controller manager:
#   JobSet (sigs.k8s.io/jobset)          -> $CACHE/peers/jobset-<version>/
#   LeaderWorkerSet (sigs.k8s.io/lws)    -> $CACHE/peers/lws-<version>/
#   KubeRay (github.com/ray-project/kuberay/ray-operator) -> $CACHE/peers/kuberay-<version>/
#   Kubeflow Trainer (github.com/kubeflow/trainer/v2)      -> $CACHE/peers/trainer-<version>/
#     (with its shipped training runtimes in runtimes/)
#   Kubeflow training-operator v1 (github.com/kubeflow/training-operator): PyTorchJob and
#     MPIJob v1                                            -> $CACHE/peers/training-operator-<version>/
#   Kueue (sigs.k8s.io/kueue): its CRDs and its sample manifests (crds/, examples/), for
#     the dispatcher reading Kueue's queue objects, and its scheduler performance test
#     (test/performance/scheduler: the runner, minimalkueue, the checker built as a test
#     binary, the generator configs and range specs) -> $CACHE/peers/kueue-<version>/
# each holding crds/*.yaml, webhook/ (a kustomization; KubeRay's default deploy runs without
# one, so it has none) and manager.
#
# Idempotent: what is cached is not rebuilt. Safe to run concurrently (a lock serialises it).
set -euo pipefail

JOBSET_VERSION="${ALNAIR_JOBSET_VERSION:-v0.10.1}"
LWS_VERSION="${ALNAIR_LWS_VERSION:-v0.7.0}"
KUBERAY_VERSION="${ALNAIR_KUBERAY_VERSION:-v1.5.0}"
TRAINER_VERSION="${ALNAIR_TRAINER_VERSION:-v2.0.0}"
TRAINING_OPERATOR_VERSION="${ALNAIR_TRAINING_OPERATOR_VERSION:-v1.8.1}"
KUEUE_VERSION="${ALNAIR_KUEUE_VERSION:-v0.19.2}"
CACHE="${ALNAIR_CACHE_DIR:-$HOME/.cache/alnair}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$CACHE/build" "$CACHE/peers"

exec 9>"$CACHE/build/.peers-lock"
flock 9

log() { printf '[build-peers] %s\n' "$*" >&2; }

# build_peer NAME MODULE VERSION CRD_DIR WEBHOOK_DIR MAIN_PACKAGE [RUNTIMES_DIR]
#   CRD_DIR and WEBHOOK_DIR are paths inside the module (WEBHOOK_DIR "-": none); MAIN_PACKAGE
#   its manager's import path.
build_peer() {
  local name=$1 module=$2 version=$3 crds=$4 webhook=$5 main=$6
  local out="$CACHE/peers/$name-$version"
  if [[ -x "$out/manager" && -n "$(ls "$out"/crds/*.yaml 2>/dev/null)" \
        && ( "$webhook" == - || -f "$out/webhook/kustomization.yaml" ) ]]; then
    log "$name $version cached in $out"; return
  fi
  local w="$CACHE/build/$name-$version"
  rm -rf "$w" "$out"; mkdir -p "$w" "$out/crds"; cd "$w"
  log "fetching $module@$version"
  go mod download -json "$module@$version" > dl.json
  local dir gover
  dir=$(python3 -c 'import json; print(json.load(open("dl.json"))["Dir"])')
  gover=$(grep -E '^go [0-9]' "$dir/go.mod" | head -1)
  cp "$dir/$crds"/*.yaml "$out/crds/"
  if [[ "$webhook" != - ]]; then
    cp -r "$dir/$webhook" "$out/webhook"; chmod -R u+w "$out/webhook"
  fi
  # The module's own main package, built as a dependency of a throwaway module (the proxy
  # refuses the version list that `go install pkg@version` asks for).
  printf 'module alnair.local/%sbuild\n\n%s\n\nrequire %s %s\n' \
    "$name" "$gover" "$module" "$version" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$main" > tools.go
  log "building the $name controller manager (cold build: a few minutes)"
  go build -trimpath -o "$out/manager.tmp" "$main"
  if [[ -n "${7:-}" ]]; then cp -r "$dir/$7" "$out/runtimes"; chmod -R u+w "$out/runtimes"; fi
  mv "$out/manager.tmp" "$out/manager"
  log "$name $version: $out"
}

# peer_files NAME MODULE VERSION CRD_DIR EXAMPLES_DIR: a module's CRDs and sample manifests,
# no controller (the tests run Alnair's in its place).
peer_files() {
  local name=$1 module=$2 version=$3 crds=$4 examples=$5
  local out="$CACHE/peers/$name-$version"
  if [[ -n "$(ls "$out"/crds/*.yaml 2>/dev/null)" && -n "$(ls "$out"/examples/*.yaml 2>/dev/null)" ]]; then
    log "$name $version cached in $out"; return
  fi
  local w="$CACHE/build/$name-$version"
  rm -rf "$w" "$out"; mkdir -p "$w" "$out/crds" "$out/examples"; cd "$w"
  log "fetching $module@$version"
  go mod download -json "$module@$version" > dl.json
  local dir
  dir=$(python3 -c 'import json; print(json.load(open("dl.json"))["Dir"])')
  cp "$dir/$crds"/*.yaml "$out/crds/"
  cp "$dir/$examples"/*.yaml "$out/examples/"
  chmod -R u+w "$out"
  log "$name $version: $out"
}

# peer_perf NAME MODULE VERSION DIR: a module's scheduler performance test under DIR (its
# runner, minimalkueue and checker, and configs/), built as dependencies of a throwaway module.
peer_perf() {
  local name=$1 module=$2 version=$3 perf=$4
  local out="$CACHE/peers/$name-$version/perf"
  if [[ -x "$out/runner" && -x "$out/minimalkueue" && -x "$out/checker.test" \
        && -f "$out/configs/baseline/generator.yaml" ]]; then
    log "$name $version performance test cached in $out"; return
  fi
  local w="$CACHE/build/$name-perf-$version"
  rm -rf "$w" "$out"; mkdir -p "$w" "$out"; cd "$w"
  go mod download -json "$module@$version" > dl.json
  local dir gover
  dir=$(python3 -c 'import json; print(json.load(open("dl.json"))["Dir"])')
  gover=$(grep -E '^go [0-9]' "$dir/go.mod" | head -1)
  cp -r "$dir/$perf/configs" "$out/configs"; chmod -R u+w "$out"
  printf 'module alnair.local/%sperf\n\n%s\n\nrequire %s %s\n' \
    "$name" "$gover" "$module" "$version" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/runner"\n\t_ "%s/minimalkueue"\n)\n' \
    "$module/$perf" "$module/$perf" > tools.go
  log "building $name's scheduler performance test (cold build: several minutes)"
  go build -trimpath -o "$out/runner.tmp" "$module/$perf/runner"
  go build -trimpath -o "$out/minimalkueue.tmp" "$module/$perf/minimalkueue"
  go test -c -trimpath -o "$out/checker.test.tmp" "$module/$perf/checker"
  for b in runner minimalkueue checker.test; do mv "$out/$b.tmp" "$out/$b"; done
  log "$name $version performance test: $out"
}

build_peer jobset sigs.k8s.io/jobset "$JOBSET_VERSION" \
  config/components/crd/bases config/components/webhook sigs.k8s.io/jobset
build_peer lws sigs.k8s.io/lws "$LWS_VERSION" \
  config/crd/bases config/webhook sigs.k8s.io/lws/cmd
build_peer kuberay github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" \
  config/crd/bases - github.com/ray-project/kuberay/ray-operator
build_peer trainer github.com/kubeflow/trainer/v2 "$TRAINER_VERSION" \
  manifests/base/crds manifests/base/webhook \
  github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager manifests/base/runtimes
build_peer training-operator github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION" \
  manifests/base/crds manifests/base/webhook \
  github.com/kubeflow/training-operator/cmd/training-operator.v1
peer_files kueue sigs.k8s.io/kueue "$KUEUE_VERSION" \
  config/components/crd/bases cmd/kueueviz/examples
peer_perf kueue sigs.k8s.io/kueue "$KUEUE_VERSION" test/performance/scheduler
