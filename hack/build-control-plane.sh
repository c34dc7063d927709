#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler), etcd and kwok from their Go modules, and cache them outside the tree.
#
# k8s.io/kubernetes replaces its staging modules with ./staging/..., so `go install` cannot
# build it; a throwaway wrapper module requires it and replaces every staging module with its
# published v0.X.Y (read from the downloaded go.mod, not hard-coded). etcd's own go.mod uses
# relative replaces, so it gets a wrapper module too.
#
# Idempotent: a binary that is already cached is not rebuilt. Safe to run concurrently
# (a lock file serialises builders).
set -euo pipefail

K8S_VERSION="${ALNAIR_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ALNAIR_ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${ALNAIR_KWOK_VERSION:-v0.8.0}"
CACHE="${ALNAIR_CACHE_DIR:-$HOME/.cache/alnair}"
BIN="$CACHE/bin/k8s-$K8S_VERSION"
EBIN="$CACHE/bin/etcd-$ETCD_VERSION"
KBIN="$CACHE/bin/kwok-$KWOK_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$BIN" "$EBIN" "$KBIN" "$CACHE/build"

exec 9>"$CACHE/build/.lock"
flock 9

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

build_kubernetes() {
  if [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/kube-scheduler" ]]; then
    log "kubernetes $K8S_VERSION cached in $BIN"; return
  fi
  local w="$CACHE/build/k8s-$K8S_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local staging="v0.${K8S_VERSION#v1.}"
  log "fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > dl.json
  local gomod; gomod=$(python3 -c 'import json,sys; print(json.load(open("dl.json"))["GoMod"])')
  local godebug; godebug=$(grep -E '^godebug ' "$gomod" || true)
  local gover; gover=$(grep -E '^go [0-9]' "$gomod" | head -1)
  {
    echo "module alnair.local/k8sbuild"
    echo
    echo "$gover"
    [[ -n "$godebug" ]] && echo "$godebug"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.M.P`
    grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  log "resolving modules"
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    if [[ ! -x "$BIN/$cmd" ]]; then
      log "building $cmd $K8S_VERSION (cold build: many minutes)"
      go build -trimpath -ldflags "$ld" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
  done
}

build_etcd() {
  if [[ -x "$EBIN/etcd" ]]; then log "etcd $ETCD_VERSION cached"; return; fi
  local w="$CACHE/build/etcd-$ETCD_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  cat > go.mod <<GOMOD
module alnair.local/etcdbuild

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  # etcd's server module pins its siblings at the same version; resolve them to published tags.
  local sib
  for sib in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    go mod edit -replace "go.etcd.io/etcd/$sib=go.etcd.io/etcd/$sib@$ETCD_VERSION"
  done
  go mod tidy >/dev/null
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$EBIN/etcd.tmp" .
  mv "$EBIN/etcd.tmp" "$EBIN/etcd"
}

build_kwok() {
  if [[ -x "$KBIN/kwok" ]]; then log "kwok $KWOK_VERSION cached"; return; fi
  log "building kwok $KWOK_VERSION"
  GOBIN="$KBIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

case "${1:-all}" in
  all) build_etcd; build_kwok; build_kubernetes ;;
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  kwok) build_kwok ;;
  *) echo "usage: $0 [all|kubernetes|etcd|kwok]" >&2; exit 2 ;;
esac
log "binaries: $BIN $EBIN $KBIN"
