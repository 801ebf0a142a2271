#!/usr/bin/env bash
# helm for the chart's tests (tests/test_helm.py): built once from the Go module proxy.
#
#   scripts/helm.sh          build helm if needed and print its path
#
# GOPATH, the module and build caches and the binary live under $GPULEDGER_HELM_CACHE
# (default ~/.cache/gpuledger/helm), outside the repo, so a clean clone on the same machine
# reuses a warm build and a warm run only checks that the binary is there.
set -euo pipefail

# v3 rather than v4 (helm.sh/helm/v4/cmd/helm builds too): v3 builds from source in about
# half v4's time to a smaller binary, and the chart (apiVersion v2) needs nothing of v4.
# HELM_VERSION=v4.x.y selects v4.
HELM_VERSION=${HELM_VERSION:-v3.21.4}
CACHE=${GPULEDGER_HELM_CACHE:-$HOME/.cache/gpuledger/helm}
BIN=$CACHE/bin
HELM_BIN=$BIN/helm-$HELM_VERSION

if [[ ! -x $HELM_BIN ]]; then
  export GOPATH=$CACHE/go
  export GOMODCACHE=$CACHE/go/pkg/mod
  export GOCACHE=$CACHE/gocache
  export GOFLAGS="-buildvcs=false -mod=mod"
  export CGO_ENABLED=0
  mkdir -p "$BIN"
  t0=$SECONDS
  printf '[helm.sh] building helm %s (once; cached under %s)\n' "$HELM_VERSION" "$CACHE" >&2
  major=${HELM_VERSION%%.*}
  tmp=$(mktemp -d "$CACHE/gobin.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # The version stamp `helm version` prints (helm's Makefile sets it the same way).
  GOBIN=$tmp go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/$major/cmd/helm@$HELM_VERSION"
  mv "$tmp/helm" "$HELM_BIN"
  printf '[helm.sh] helm %s built in %ss\n' "$HELM_VERSION" "$((SECONDS - t0))" >&2
fi
ln -sfn "$(basename "$HELM_BIN")" "$BIN/helm"
echo "$BIN/helm"
