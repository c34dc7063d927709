#!/usr/bin/env bash
# Build kube-scheduler with the coscheduling plugin of kubernetes-sigs/scheduler-plugins (the
# gang baseline of `make bench-scheduler`) from its Go module, and cache it outside the tree
# beside the control-plane binaries, with the PodGroup CRD of the same release.
#
# The release is the one nearest our Kubernetes (v1.36.3) that the Go module proxy serves:
# v0.35.7 (Kubernetes v1.35.7) is listed there but its source zip is refused ("403 This module
# version is not available"), so v0.34.7, built against Kubernetes v1.34 (its go.mod requires
# k8s.io/kubernetes v1.34.x). On this machine's proxy that build stops too: the zip of
# k8s.io/csi-translation-lib v0.34.7 (a staging module kube-scheduler v1.34 needs) is refused
# the same way. Building the v0.34.7 coscheduling plugin against our cached Kubernetes v1.36.3
# instead fails to compile: its controller-runtime (v0.22.3, and v0.23.3 likewise) lacks
# `HasSyncedChecker`, which client-go v0.36 added to ResourceEventHandlerRegistration. So
# `make bench-scheduler` runs its gang workload against plain kube-scheduler when this fails
# (see docs/notes/issue-18.md). Like
# k8s.io/kubernetes, scheduler-plugins pins the staging modules with replace directives, which
# a `go install` ignores; so a throwaway wrapper module requires it and copies its replace
# block (read from the downloaded go.mod, not hard-coded), as hack/build-control-plane.sh does.
#
# Idempotent (a cached binary is not rebuilt) and serialised with the control-plane builder.
set -euo pipefail

SP_VERSION="${ALNAIR_SCHEDULER_PLUGINS_VERSION:-v0.34.7}"
CACHE="${ALNAIR_CACHE_DIR:-$HOME/.cache/alnair}"
OUT="$CACHE/bin/scheduler-plugins-$SP_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$OUT" "$CACHE/build"

exec 9>"$CACHE/build/.lock"
flock 9

log() { printf '[build-coscheduling] %s\n' "$*" >&2; }

if [[ -x "$OUT/kube-scheduler" && -s "$OUT/podgroups.crd.yaml" ]]; then
  log "scheduler-plugins $SP_VERSION cached in $OUT"; exit 0
fi
w="$CACHE/build/scheduler-plugins-$SP_VERSION"
rm -rf "$w"; mkdir -p "$w"; cd "$w"
log "fetching sigs.k8s.io/scheduler-plugins@$SP_VERSION"
go mod download -json "sigs.k8s.io/scheduler-plugins@$SP_VERSION" > dl.json
err=$(python3 -c 'import json; print(json.load(open("dl.json")).get("Error", ""))')
[[ -z "$err" ]] || { log "cannot download: $err"; exit 1; }
gomod=$(python3 -c 'import json; print(json.load(open("dl.json"))["GoMod"])')
src=$(python3 -c 'import json; print(json.load(open("dl.json"))["Dir"])')
k8s=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$gomod")
gover=$(grep -E '^go [0-9]' "$gomod" | head -1)
godebug=$(grep -E '^godebug ' "$gomod" || true)
{
  echo "module alnair.local/coschedbuild"
  echo
  echo "$gover"
  [[ -n "$godebug" ]] && echo "$godebug"
  echo
  echo "require sigs.k8s.io/scheduler-plugins $SP_VERSION"
  echo
  # the release's own replace directives, block and single-line forms alike
  awk '/^replace \(/ {inblock=1; next} inblock && /^\)/ {inblock=0; next}
       inblock && /=>/ {print "replace " $0; next} /^replace [^(]/ {print}' "$gomod"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/scheduler-plugins/cmd/scheduler"
GO
log "resolving modules (Kubernetes $k8s)"
go mod tidy -e >/dev/null 2>&1 || true
go get "sigs.k8s.io/scheduler-plugins@$SP_VERSION" >/dev/null
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$(echo "$k8s" | cut -d. -f2)"
done
log "building kube-scheduler with scheduler-plugins $SP_VERSION (cold build: many minutes)"
go build -trimpath -ldflags "$ld" -o "$OUT/kube-scheduler.tmp" sigs.k8s.io/scheduler-plugins/cmd/scheduler
crd=$(ls "$src"/manifests/coscheduling/crd.yaml "$src"/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml 2>/dev/null | head -1)
[[ -n "$crd" ]] || { log "no PodGroup CRD in $src"; exit 1; }
cp "$crd" "$OUT/podgroups.crd.yaml"; chmod u+w "$OUT/podgroups.crd.yaml"
echo "$k8s" > "$OUT/KUBERNETES_VERSION"
mv "$OUT/kube-scheduler.tmp" "$OUT/kube-scheduler"
log "binary: $OUT/kube-scheduler (Kubernetes $k8s)"
