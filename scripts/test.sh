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
# Deno's last summary line ("ok | N passed (S steps) | M failed ...") gives the host's counts. The tests that
# tests/dataplane/ipvs_vm_test.ts runs inside the IPVS VM (scripts/ipvs_vm.sh) are steps of that one host
# test; it echoes the VM's own summary line prefixed "[vm] ", whose counts are added here.
summary=$(sed -nE 's/^(\[vm\] )?(ok|FAILED) \| ([0-9]+) passed( \([0-9]+ steps?\))? \| ([0-9]+) failed.*/\1\3 \5/p' "$out" |
  awk '/^\[vm\]/ { vp += $2; vf += $3; vm = 1; next } { hp = $1; hf = $2; host = 1 }
    END {
      if (!host) exit
      if (vm) printf "(%d passed, %d failed inside the IPVS VM, counted below)\n", vp, vf
      printf "%d passed, %d failed\n", hp + vp, hf + vf
    }')
echo "${summary:-0 passed, 1 failed}"
exit "$rc"
