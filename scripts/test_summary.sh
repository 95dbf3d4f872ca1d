#!/usr/bin/env bash
# Reads `deno test` output (NO_COLOR=1) from the file $1 and prints the summary scripts/test.sh ends with:
# "N ignored:" and the ignored tests' names (when any), then the plain last line "N passed, N failed",
# which CI parses ("0 passed, 1 failed" when Deno printed no closing line, e.g. a module failed to load).
# The tests that tests/dataplane/ipvs_vm_test.ts runs inside the IPVS VM are steps of that one host test; it
# echoes the VM's own closing line prefixed "[vm] ", whose counts are added to the host's.
set -euo pipefail
out=$1
# Deno's closing line, e.g. "FAILED | 2 passed (1 step) | 1 failed | 1 ignored (24ms)".
closing=$(grep -E '^(ok|FAILED) \| [0-9]+ passed' "$out" | tail -n 1 || true)
summary=$(sed -nE 's/^(ok|FAILED) \| ([0-9]+) passed( \([0-9]+ steps?\))? \| ([0-9]+) failed.*/\2 passed, \4 failed/p' \
  <<<"$closing")
ignored=$(sed -nE 's/.*\| ([0-9]+) ignored.*/\1/p' <<<"$closing")
if [ -n "$ignored" ] && [ "$ignored" != 0 ]; then
  echo "$ignored ignored:"
  sed -nE 's/^(.*) \.\.\. ignored \([^)]*\)$/  \1/p' "$out"
fi
vm=$(sed -nE 's/^\[vm\] (ok|FAILED) \| ([0-9]+) passed( \([0-9]+ steps?\))? \| ([0-9]+) failed.*/\2 \4/p' "$out" |
  awk '{ p += $1; f += $2; n++ } END { if (n) print p, f }')
if [ -n "$summary" ] && [ -n "$vm" ]; then
  read -r vp vf <<<"$vm"
  hp=${summary%% passed*}
  hf=${summary#*, }
  hf=${hf%% failed}
  echo "($vp passed, $vf failed inside the IPVS VM, counted below)"
  summary="$((hp + vp)) passed, $((hf + vf)) failed"
fi
echo "${summary:-0 passed, 1 failed}"
