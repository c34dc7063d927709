#!/usr/bin/env bash
# Other projects' parts the e2e tests meet, built from their Go modules at exact versions
# through the Go module proxy and cached outside the tree (never committed):
#   JobSet (sigs.k8s.io/jobset): its CRDs and webhook configurations as the project ships them,
#   and its controller manager.
# Output: $CACHE/peers/jobset-<version>/{crds/*.yaml,webhook/,jobset-manager}.
#
# Idempotent: what is cached is not rebuilt. Safe to run concurrently (a lock serialises it).
set -euo pipefail

JOBSET_VERSION="${ALNAIR_JOBSET_VERSION:-v0.10.1}"
CACHE="${ALNAIR_CACHE_DIR:-$HOME/.cache/alnair}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$CACHE/build" "$CACHE/peers"

exec 9>"$CACHE/build/.peers-lock"
flock 9

log() { printf '[build-peers] %s\n' "$*" >&2; }

build_jobset() {
  local out="$CACHE/peers/jobset-$JOBSET_VERSION"
  if [[ -x "$out/jobset-manager" && -f "$out/crds/jobset.x-k8s.io_jobsets.yaml" \
        && -f "$out/webhook/kustomization.yaml" ]]; then
    log "jobset $JOBSET_VERSION cached in $out"; return
  fi
  local w="$CACHE/build/jobset-$JOBSET_VERSION"
  rm -rf "$w"; mkdir -p "$w" "$out/crds"; cd "$w"
  log "fetching sigs.k8s.io/jobset@$JOBSET_VERSION"
  go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" > dl.json
  local dir gover
  dir=$(python3 -c 'import json; print(json.load(open("dl.json"))["Dir"])')
  gover=$(grep -E '^go [0-9]' "$dir/go.mod" | head -1)
  cp "$dir"/config/components/crd/bases/*.yaml "$out/crds/"
  rm -rf "$out/webhook"; cp -r "$dir/config/components/webhook" "$out/webhook"; chmod -R u+w "$out/webhook"
  # The module's own main package, built as a dependency of a throwaway module (the proxy
  # refuses the version list that `go install pkg@version` asks for).
  printf 'module alnair.local/jobsetbuild\n\n%s\n\nrequire sigs.k8s.io/jobset %s\n' \
    "$gover" "$JOBSET_VERSION" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/jobset"\n' > tools.go
  log "building the jobset controller manager (cold build: a few minutes)"
  go build -trimpath -o "$out/jobset-manager.tmp" sigs.k8s.io/jobset
  mv "$out/jobset-manager.tmp" "$out/jobset-manager"
  log "jobset $JOBSET_VERSION: $out"
}

build_jobset
