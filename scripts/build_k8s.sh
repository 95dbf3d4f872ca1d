#!/usr/bin/env bash
# Builds the real Kubernetes parts the tests and the scale harness run beside the agent, from source, into
# the tools cache beside Deno ($DKP_TOOLS, default ~/.cache/deno-kube-proxy), skipping what is built:
#   k8s-v$K8S_VERSION/kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver
#   k8s-v$K8S_VERSION/kube-proxy       k8s.io/kubernetes/cmd/kube-proxy (upstream, for parity and scale)
#   k8s-v$K8S_VERSION/etcd             go.etcd.io/etcd/server/v3 at the version kubernetes requires
# k8s.io/kubernetes cannot be required as a module as it is (its go.mod replaces every k8s.io/* staging
# module with a local path), so a small module here requires it and replaces each staging module with its
# published v0.x twin. etcd builds in a module of its own so that its dependencies do not move kubernetes'. First run on a fresh machine: tens of minutes (module download and build); later
# runs: a version check. Prints the directory holding the binaries on its last line.
set -euo pipefail

K8S_VERSION=1.35.4
DKP_TOOLS=${DKP_TOOLS:-$HOME/.cache/deno-kube-proxy}
out="$DKP_TOOLS/k8s-v$K8S_VERSION"
src="$DKP_TOOLS/k8s-src-v$K8S_VERSION"
staging_version="v0.${K8S_VERSION#1.}"
ETCD_VERSION=3.6.5 # what k8s.io/kubernetes v$K8S_VERSION requires

log() { echo "build_k8s: $*" >&2; }

built() {
  [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-proxy" ] && [ -x "$out/etcd" ] &&
    "$out/kube-proxy" --version 2>/dev/null | grep -q "v$K8S_VERSION\$"
}

if built; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build kube-apiserver, kube-proxy and etcd"; exit 1; }

rm -rf "$src"
mkdir -p "$src/kubernetes" "$src/etcd" "$out"
staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
  csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils
  pod-security-admission sample-apiserver sample-cli-plugin sample-controller)
{
  echo "module dkp.local/k8s-tools"
  echo
  echo "go 1.25.0"
  echo
  echo "require k8s.io/kubernetes v$K8S_VERSION"
  echo
  echo "replace ("
  for m in "${staging[@]}"; do echo "	k8s.io/$m => k8s.io/$m $staging_version"; done
  echo ")"
} >"$src/kubernetes/go.mod"
printf 'module dkp.local/etcd\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$src/etcd/go.mod"
cd "$src/kubernetes"
# The version stamps kubernetes' own build sets, so that --version reports it.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
minor=${K8S_VERSION#1.}
ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/component-base/version.gitTreeState=clean"
log "resolving modules (k8s.io/kubernetes v$K8S_VERSION, staging $staging_version)"
go get k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION k8s.io/kubernetes/cmd/kube-proxy@v$K8S_VERSION >&2
export CGO_ENABLED=0
log "building kube-apiserver"
go build -trimpath -ldflags "$ldflags" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
log "building kube-proxy"
go build -trimpath -ldflags "$ldflags" -o "$out/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy
log "building etcd v$ETCD_VERSION"
cd "$src/etcd"
go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
built || { log "built binaries do not report v$K8S_VERSION"; exit 1; }
echo "$out"
