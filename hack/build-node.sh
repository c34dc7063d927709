#!/usr/bin/env bash
# Build what one real node needs beside the KWOK ones, and cache it outside the tree:
#   - the kubelet, from the same k8s.io/kubernetes module as the control plane;
#   - containerd 2.x, its runc shim and ctr, from github.com/containerd/containerd/v2;
#   - the CNI plugins (bridge, host-local, loopback), from github.com/containernetworking/plugins;
#   - a static pause binary (hack/pause/pause.go, ours);
# and install runc from Debian. Idempotent: what is cached is not rebuilt. The lock file is the
# control plane's (both write the same Go build cache).
set -euo pipefail

K8S_VERSION="${ALNAIR_K8S_VERSION:-v1.36.3}"
CONTAINERD_VERSION="${ALNAIR_CONTAINERD_VERSION:-v2.4.2}"
CNI_VERSION="${ALNAIR_CNI_PLUGINS_VERSION:-v1.10.0}"
CACHE="${ALNAIR_CACHE_DIR:-$HOME/.cache/alnair}"
HERE="$(cd "$(dirname "$0")" && pwd)"
KBIN="$CACHE/bin/k8s-$K8S_VERSION"
CBIN="$CACHE/bin/containerd-$CONTAINERD_VERSION"
NBIN="$CACHE/bin/cni-$CNI_VERSION"
PBIN="$CACHE/bin/pause"
PAUSE_SUM="$(sha256sum "$HERE/pause/pause.go" | cut -c1-64)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$KBIN" "$CBIN" "$NBIN" "$PBIN" "$CACHE/build"

log() { printf '[build-node] %s\n' "$*" >&2; }

install_runc() {
  if command -v runc >/dev/null 2>&1; then return; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-node: install runc (Debian: apt-get install runc) for the real node" >&2
    exit 1
  fi
  log "installing runc (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq runc >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    apt-get install -y -qq runc >/dev/null
  }
}

build_kubelet() {
  if [[ -x "$KBIN/kubelet" ]]; then log "kubelet $K8S_VERSION cached"; return; fi
  cd "$CACHE/build/k8s-$K8S_VERSION"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  log "building kubelet $K8S_VERSION (cold build: several minutes)"
  go build -trimpath -ldflags "$ld" -o "$KBIN/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet
  mv "$KBIN/kubelet.tmp" "$KBIN/kubelet"
}

build_containerd() {
  if [[ -x "$CBIN/containerd" && -x "$CBIN/containerd-shim-runc-v2" && -x "$CBIN/ctr" ]]; then
    log "containerd $CONTAINERD_VERSION cached"; return
  fi
  local w="$CACHE/build/containerd-$CONTAINERD_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  cat > go.mod <<GOMOD
module alnair.local/containerdbuild

go 1.24

require github.com/containerd/containerd/v2 $CONTAINERD_VERSION
GOMOD
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
GO
  go mod tidy >/dev/null 2>&1 || true
  go get "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" >/dev/null
  local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  local cmd
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    log "building $cmd $CONTAINERD_VERSION"
    go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" \
      -o "$CBIN/$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd"
    mv "$CBIN/$cmd.tmp" "$CBIN/$cmd"
  done
}

build_cni() {
  if [[ -x "$NBIN/bridge" && -x "$NBIN/host-local" && -x "$NBIN/loopback" ]]; then
    log "CNI plugins $CNI_VERSION cached"; return
  fi
  local p
  for p in main/bridge main/loopback ipam/host-local; do
    log "building CNI ${p#*/} $CNI_VERSION"
    GOBIN="$NBIN" go install -trimpath -ldflags "-s -w" \
      "github.com/containernetworking/plugins/plugins/$p@$CNI_VERSION"
  done
}

build_pause() {
  if [[ -x "$PBIN/pause" && "$(cat "$PBIN/source.sha256" 2>/dev/null)" == "$PAUSE_SUM" ]]; then
    log "pause cached"; return
  fi
  local w="$CACHE/build/pause"
  rm -rf "$w"; mkdir -p "$w"; cp "$HERE/pause/pause.go" "$w/main.go"
  cd "$w"
  printf 'module alnair.local/pause\n\ngo 1.24\n' > go.mod
  log "building pause"
  go build -trimpath -ldflags "-s -w" -o "$PBIN/pause.tmp" .
  mv "$PBIN/pause.tmp" "$PBIN/pause"
  echo "$PAUSE_SUM" > "$PBIN/source.sha256"
}

# The kubelet builds in the control plane's wrapper module; that script takes the lock itself.
[[ -f "$CACHE/build/k8s-$K8S_VERSION/go.mod" ]] || bash "$HERE/build-control-plane.sh" kubernetes
exec 9>"$CACHE/build/.lock"
flock 9
case "${1:-all}" in
  all) install_runc; build_pause; build_cni; build_containerd; build_kubelet ;;
  kubelet) build_kubelet ;;
  containerd) build_containerd ;;
  cni) build_cni ;;
  pause) build_pause ;;
  runc) install_runc ;;
  *) echo "usage: $0 [all|kubelet|containerd|cni|pause|runc]" >&2; exit 2 ;;
esac
log "binaries: $KBIN/kubelet $CBIN $NBIN $PBIN/pause"
