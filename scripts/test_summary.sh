#!/usr/bin/env bash
# Reads `deno test` output (NO_COLOR=1) from the file $1 and prints the summary scripts/test.sh ends with:
# "N ignored:" and the ignored tests' names (when any), then the plain last line "N passed, N failed",
# which CI parses ("0 passed, 1 failed" when Deno printed no closing line, e.g. a module failed to load).
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
echo "${summary:-0 passed, 1 failed}"
