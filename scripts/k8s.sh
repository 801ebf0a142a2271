#!/usr/bin/env bash
# Kubernetes test control plane for gpuledger: etcd + kube-apiserver + kwok on 127.0.0.1.
#
#   scripts/k8s.sh build   build the three binaries from the Go module proxy (cached)
#   scripts/k8s.sh up      build if needed, then start them (idempotent: a healthy plane is reused)
#   scripts/k8s.sh down    stop them and forget the cluster state
#   scripts/k8s.sh status  exit 0 when the API server answers
#   scripts/k8s.sh env     print KUBECONFIG=... for `eval`
#   scripts/k8s.sh kube-scheduler
#                          build the upstream kube-scheduler of the same version as the API
#                          server (cached; only `make bench` needs it) and print its path
#
# Everything (GOPATH, module and build caches, binaries, certs, etcd data, logs) lives under
# $GPULEDGER_K8S_CACHE (default ~/.cache/gpuledger/k8s), outside the repo, so a clean clone on
# the same machine reuses a warm build.
set -euo pipefail

CACHE=${GPULEDGER_K8S_CACHE:-$HOME/.cache/gpuledger/k8s}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
K8S_VERSION=${K8S_VERSION:-v1.34.4}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
# Staging modules (k8s.io/api, client-go, ...) are published as v0.<minor>.<patch>.
STAGING_VERSION=v0${K8S_VERSION#v1}
API_PORT=${GPULEDGER_K8S_PORT:-16443}
ETCD_PORT=${GPULEDGER_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))

BIN=$CACHE/bin
RUN=$CACHE/run
PKI=$CACHE/pki
export GOPATH=$CACHE/go
export GOMODCACHE=$CACHE/go/pkg/mod
export GOCACHE=$CACHE/gocache
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

ETCD_BIN=$BIN/etcd-$ETCD_VERSION
APISERVER_BIN=$BIN/kube-apiserver-$K8S_VERSION
SCHEDULER_BIN=$BIN/kube-scheduler-$K8S_VERSION
KWOK_BIN=$BIN/kwok-$KWOK_VERSION

log() { printf '[k8s.sh] %s\n' "$*" >&2; }

# A throwaway wrapper module per binary: `go install pkg@version` refuses modules whose go.mod
# has replace directives (k8s.io/kubernetes has one per staging module), a wrapper does not.
wrapper() {
  local dir=$CACHE/src/$1
  rm -rf "$dir"; mkdir -p "$dir"
  printf 'module gpuledger.local/%s\n\ngo 1.24\n' "$1" >"$dir/go.mod"
  echo "$dir"
}

build_etcd() {
  [[ -x $ETCD_BIN ]] && return 0
  log "building etcd $ETCD_VERSION"
  local dir; dir=$(wrapper etcd)
  (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
     && go build -trimpath -o "$ETCD_BIN.tmp" go.etcd.io/etcd/server/v3)
  mv "$ETCD_BIN.tmp" "$ETCD_BIN"
}

# Build k8s.io/kubernetes/cmd/$1 at $K8S_VERSION into $2, every staging module replaced by its
# published version (k8s.io/kubernetes's own go.mod points them at ./staging).
build_k8s_cmd() { # name output
  local name=$1 out=$2
  log "building $name $K8S_VERSION (staging modules at $STAGING_VERSION)"
  local dir; dir=$(wrapper "$name")
  # Map every staging module named by k8s.io/kubernetes's own go.mod to its published version.
  local gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
          | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo 'replace ('
    grep -oE '^\s*k8s\.io/[a-z0-9.-]+ => \./staging/src/k8s\.io/[a-z0-9.-]+' "$gomod" \
      | awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
    echo ')'
  } >>"$dir/go.mod"
  local ver=k8s.io/component-base/version
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
  ldflags+=" -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
  (cd "$dir" && go get "k8s.io/kubernetes/cmd/$name@$K8S_VERSION" \
     && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$out.tmp" "$out"
}

build_apiserver() {
  [[ -x $APISERVER_BIN ]] && return 0
  build_k8s_cmd kube-apiserver "$APISERVER_BIN"
}

# The upstream kube-scheduler, same version as the API server: bench/kube.py's yardstick.
# Not part of `build`/`up` (the tests do not need it); `make bench` builds it.
cmd_kube_scheduler() {
  if [[ ! -x $SCHEDULER_BIN ]]; then
    mkdir -p "$BIN"
    local t0=$SECONDS
    build_k8s_cmd kube-scheduler "$SCHEDULER_BIN" >&2  # stdout is only the path
    log "kube-scheduler built in $((SECONDS - t0))s"
  fi
  echo "$SCHEDULER_BIN"
}

build_kwok() {
  [[ -x $KWOK_BIN ]] && return 0
  log "building kwok $KWOK_VERSION"
  local dir; dir=$(wrapper kwok)
  (cd "$dir" && go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
     && go build -trimpath -ldflags "-s -w" -o "$KWOK_BIN.tmp" sigs.k8s.io/kwok/cmd/kwok)
  mv "$KWOK_BIN.tmp" "$KWOK_BIN"
}

cmd_build() {
  mkdir -p "$BIN"
  local t0=$SECONDS
  build_etcd; build_kwok; build_apiserver
  log "binaries ready in $((SECONDS - t0))s under $BIN"
}

KUBECONFIG_FILE=$CACHE/kubeconfig
ADMIN_TOKEN_FILE=$CACHE/admin.token
STAGES=$(cd "$(dirname "$0")/.." && pwd)/deploy/kwok/stages.yaml

gen_pki() {
  [[ -s $PKI/server.crt && -s $PKI/sa.key && -s $ADMIN_TOKEN_FILE ]] && return 0
  log "generating self-signed certificates and tokens under $PKI"
  mkdir -p "$PKI"; chmod 700 "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gpuledger-test-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$PKI/san.ext"
  openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 3650 -extfile "$PKI/san.ext" -out "$PKI/server.crt" 2>/dev/null
  # The service-account key pair signs the ServiceAccount tokens the components use.
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  local admin kwok
  admin=$(openssl rand -hex 24); kwok=$(openssl rand -hex 24)
  # Static tokens only for the operator (tests, make targets) and kwok, both cluster admins;
  # gpuledger's own components authenticate with ServiceAccount tokens bound to deploy/ RBAC.
  printf '%s,admin,admin,"system:masters"\n%s,kwok,kwok,"system:masters"\n' "$admin" "$kwok" \
    >"$PKI/tokens.csv"
  echo "$admin" >"$ADMIN_TOKEN_FILE"; echo "$kwok" >"$PKI/kwok.token"
  chmod 600 "$PKI"/* "$ADMIN_TOKEN_FILE"
}

write_kubeconfig() { # file token user
  cat >"$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: gpuledger-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $3
  user:
    token: $2
contexts:
- name: gpuledger-test
  context: {cluster: gpuledger-test, user: $3}
current-context: gpuledger-test
KCFG
  chmod 600 "$1"
}

alive() { [[ -s $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

api_ready() {
  [[ -s $ADMIN_TOKEN_FILE ]] || return 1
  curl -sf --max-time 2 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(cat "$ADMIN_TOKEN_FILE")" \
    "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1
}

wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@"; do
    if ((SECONDS > deadline)); then log "$what did not come up; see $RUN/*.log"; return 1; fi
    sleep 0.3
  done
}

etcd_ready() { curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1; }

start() { # name command... (detached, own session, so `down` can stop it by pid)
  local name=$1; shift
  setsid "$@" >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

cmd_up() {
  if alive etcd && alive kube-apiserver && alive kwok && api_ready; then
    log "control plane already up (KUBECONFIG=$KUBECONFIG_FILE)"; return 0
  fi
  cmd_down quiet
  cmd_build
  gen_pki
  mkdir -p "$RUN"
  write_kubeconfig "$KUBECONFIG_FILE" "$(cat "$ADMIN_TOKEN_FILE")" admin
  write_kubeconfig "$RUN/kwok.kubeconfig" "$(cat "$PKI/kwok.token")" kwok
  local t0=$SECONDS
  start etcd "$ETCD_BIN" --name gpuledger-test --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "gpuledger-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296
  wait_for etcd 30 etcd_ready
  # No controller-manager runs: the ServiceAccount admission plugin would reject pods whose
  # namespace has no `default` ServiceAccount (that controller creates it), so it is off.
  # Priority-and-fairness is off so the bench measures gpuledger, not a single-user throttle.
  start kube-apiserver "$APISERVER_BIN" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file "$PKI/server.crt" --tls-private-key-file "$PKI/server.key" \
    --client-ca-file "$PKI/ca.crt" \
    --token-auth-file "$PKI/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount \
    --enable-priority-and-fairness=false --max-requests-inflight 1000 \
    --max-mutating-requests-inflight 500 --profiling=false --event-ttl 2h
  wait_for kube-apiserver 120 api_ready
  start kwok "$KWOK_BIN" --kubeconfig "$RUN/kwok.kubeconfig" --config "$STAGES" \
    --manage-all-nodes=false --manage-nodes-with-label-selector type=kwok \
    --cidr 10.240.0.0/16 --node-ip 10.239.0.1 --server-address 127.0.0.1:0 \
    --node-lease-duration-seconds 0
  sleep 1
  alive kwok || { log "kwok exited; see $RUN/kwok.log"; tail -20 "$RUN/kwok.log" >&2; return 1; }
  log "control plane up in $((SECONDS - t0))s: KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_down() {
  local name
  for name in kwok kube-apiserver etcd; do
    if alive "$name"; then
      kill -TERM -- "-$(cat "$RUN/$name.pid")" 2>/dev/null || kill -TERM "$(cat "$RUN/$name.pid")" 2>/dev/null || true
      for _ in $(seq 50); do alive "$name" || break; sleep 0.1; done
      alive "$name" && kill -KILL -- "-$(cat "$RUN/$name.pid")" 2>/dev/null || true
    fi
    rm -f "$RUN/$name.pid"
  done
  # The cluster is disposable: a fresh `up` starts from an empty etcd.
  rm -rf "$RUN/etcd"
  [[ ${1:-} == quiet ]] || log "control plane down"
}

case ${1:-} in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) api_ready ;;
  env) echo "export KUBECONFIG=$KUBECONFIG_FILE" ;;
  kube-scheduler) cmd_kube_scheduler ;;
  *) echo "usage: $0 build|up|down|status|env|kube-scheduler" >&2; exit 2 ;;
esac
