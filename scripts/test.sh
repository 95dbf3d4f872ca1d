#!/usr/bin/env bash
# The full test suite on a fresh machine: installs Deno and the netfilter tools (scripts/install.sh),
# builds kube-apiserver, etcd and upstream kube-proxy from source (scripts/build_k8s.sh; tens of minutes on
# a fresh machine, seconds later) for the real-apiserver and parity tests, type-checks, lints, runs every
# test (including the ones inside the IPVS VM, scripts/ipvs_vm.sh), and ends with the plain line
# "N passed, N failed" (CI reads it), preceded by "N ignored" and the names of ignored tests, if any. Exits
# non-zero on any failure.
#
# The dataplane and packet tests need root and the netfilter tools. Here they must run:
# DKP_REQUIRE_PRIVILEGED_TESTS=1 turns "cannot run here" into a failure instead of a skip (set it to 0 to
# allow skipping, e.g. as a non-root developer). iptables in the tests' namespaces uses a private
# XTABLES_LOCKFILE, never the host-wide /run/xtables.lock. Extra arguments go to `deno test`.
set -euo pipefail
cd "$(dirname "$0")/.."
deno_bin=$(bash scripts/install.sh | tail -n 1)
export PATH="$(dirname "$deno_bin"):$PATH" NO_COLOR=1
export DKP_REQUIRE_PRIVILEGED_TESTS=${DKP_REQUIRE_PRIVILEGED_TESTS:-1}
deno --version | head -n 1
bash scripts/build_k8s.sh >/dev/null

deno task check
out=$(mktemp)
lock=""
if [ -z "${XTABLES_LOCKFILE:-}" ]; then
  lock=$(mktemp --suffix=.xtables.lock)
  export XTABLES_LOCKFILE=$lock
fi
trap 'rm -f "$out" ${lock:+"$lock"}' EXIT
set +e
deno test --allow-all "${@:-tests/}" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
bash scripts/test_summary.sh "$out"
exit "$rc"
