#!/usr/bin/env bash
# Builds the real Kubernetes parts the tests and the scale harness run beside the agent, from source, into
# the tools cache beside Deno ($DKP_TOOLS, default ~/.cache/deno-kube-proxy), skipping what is built:
#   k8s-v$K8S_VERSION/kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver
#   k8s-v$K8S_VERSION/kube-proxy       k8s.io/kubernetes/cmd/kube-proxy (upstream, for parity and scale)
#   k8s-v$K8S_VERSION/etcd             go.etcd.io/etcd/server/v3 at the version kubernetes requires
# k8s.io/kubernetes cannot be required as a module as it is (its go.mod replaces every k8s.io/* staging
# module with a local path), so a small module here requires it and replaces each staging module with its
# published v0.x twin. etcd builds in a module of its own so that its dependencies do not move kubernetes'.
# First run on a fresh machine: tens of minutes (module download and build); later runs: a version check.
# Each binary is checked (and rebuilt) on its own and installed atomically (built beside, then renamed),
# so an interrupted build leaves nothing half-written; concurrent runs wait for each other (flock).
# Go: `go` on PATH, else $GOROOT/bin/go, else /usr/local/go/bin/go. Prints the directory holding the
# binaries on its last line.
set -euo pipefail

K8S_VERSION=1.37.2
DKP_TOOLS=${DKP_TOOLS:-$HOME/.cache/deno-kube-proxy}
out="$DKP_TOOLS/k8s-v$K8S_VERSION"
src="$DKP_TOOLS/k8s-src-v$K8S_VERSION"
staging_version="v0.${K8S_VERSION#1.}"
ETCD_VERSION=3.7.0 # what k8s.io/kubernetes v$K8S_VERSION requires

log() { echo "build_k8s: $*" >&2; }

# Whether $out/$1 exists and reports the version we build.
current() {
  local bin="$out/$1"
  [ -x "$bin" ] || return 1
  # Read whole before matching: `grep -q` would stop at the first line and, under pipefail, a binary that
  # prints more lines (etcd) would fail the pipeline with SIGPIPE now and then.
  local version
  version=$("$bin" --version 2>/dev/null) || return 1
  case "$1" in
    etcd) grep -q "^etcd Version: $ETCD_VERSION\$" <<<"$version" ;;
    *) grep -q "^Kubernetes v$K8S_VERSION\$" <<<"$version" ;;
  esac
}

all_current() { current kube-apiserver && current kube-proxy && current etcd; }

if all_current; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  log "another build is running; waiting for it"
  flock 9
fi
if all_current; then # built by the run we waited for
  echo "$out"
  exit 0
fi

go_bin=$(command -v go || true)
for candidate in "${GOROOT:+$GOROOT/bin/go}" /usr/local/go/bin/go; do
  [ -n "$go_bin" ] && break
  [ -n "$candidate" ] && [ -x "$candidate" ] && go_bin=$candidate
done
[ -n "$go_bin" ] || { log "go is required to build kube-apiserver, kube-proxy and etcd (not on PATH, nor /usr/local/go/bin)"; exit 1; }
export PATH="$(dirname "$go_bin"):$PATH" GOFLAGS=-mod=mod CGO_ENABLED=0
log "using $("$go_bin" version)"

# Builds package $2 into $out/$1 from the current module, via a temporary name.
build() {
  log "building $1"
  rm -f "$out/.$1.tmp"
  "$go_bin" build -trimpath -ldflags "$3" -o "$out/.$1.tmp" "$2"
  mv -f "$out/.$1.tmp" "$out/$1"
  current "$1" || { log "$out/$1 does not report the expected version"; exit 1; }
}

if ! current kube-apiserver || ! current kube-proxy; then
  rm -rf "$src/kubernetes"
  mkdir -p "$src/kubernetes"
  staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
    cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
    cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
    kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils
    pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)
  {
    echo "module dkp.local/k8s-tools"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	k8s.io/$m => k8s.io/$m $staging_version"; done
    echo ")"
  } >"$src/kubernetes/go.mod"
  cd "$src/kubernetes"
  # The version stamps kubernetes' own build sets, so that --version reports it.
  minor=${K8S_VERSION#1.}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/component-base/version.gitTreeState=clean"
  log "resolving modules (k8s.io/kubernetes v$K8S_VERSION, staging $staging_version)"
  "$go_bin" get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@v$K8S_VERSION" >&2
  current kube-apiserver || build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
  current kube-proxy || build kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$ldflags"
fi

if ! current etcd; then
  rm -rf "$src/etcd"
  mkdir -p "$src/etcd"
  printf 'module dkp.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$src/etcd/go.mod"
  cd "$src/etcd"
  log "resolving etcd v$ETCD_VERSION"
  "$go_bin" get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
  build etcd go.etcd.io/etcd/server/v3 "-s -w"
fi

all_current || { log "built binaries do not report v$K8S_VERSION / etcd $ETCD_VERSION"; exit 1; }
echo "$out"
