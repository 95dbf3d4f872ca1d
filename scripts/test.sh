#!/usr/bin/env bash
# The full test suite on a fresh machine: installs Deno and the netfilter tools (scripts/install.sh),
# builds kube-apiserver, etcd and upstream kube-proxy from source (scripts/build_k8s.sh; tens of minutes on
# a fresh machine, seconds later) for the real-apiserver and parity tests, type-checks, lints, runs every
# test (the dataplane tests need root), and ends with the plain line "N passed, N failed". Exits non-zero on
# any failure. Extra arguments go to `deno test`.
set -euo pipefail
cd "$(dirname "$0")/.."
deno_bin=$(bash scripts/install.sh | tail -n 1)
export PATH="$(dirname "$deno_bin"):$PATH" NO_COLOR=1
deno --version | head -n 1
bash scripts/build_k8s.sh >/dev/null

deno task check
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
deno test --allow-all "${@:-tests/}" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
summary=$(sed -nE 's/^(ok|FAILED) \| ([0-9]+) passed( \([0-9]+ steps?\))? \| ([0-9]+) failed.*/\2 passed, \4 failed/p' "$out" | tail -n 1)
echo "${summary:-0 passed, 1 failed}"
exit "$rc"
