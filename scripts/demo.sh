#!/usr/bin/env bash
# The demo on a fresh machine, as root: installs Deno and the netfilter tools (scripts/install.sh), then
# runs scripts/demo.ts (network namespaces, API server simulator, the agent, real traffic, cleanup).
# Arguments go to the demo: `bash scripts/demo.sh --proxy-mode nftables`.
set -euo pipefail
cd "$(dirname "$0")/.."
deno_bin=$(bash scripts/install.sh | tail -n 1)
export PATH="$(dirname "$deno_bin"):$PATH"
exec deno task demo "$@"
