#!/usr/bin/env bash
# Installs what deno-kube-proxy needs on a fresh machine, and nothing global besides apt packages:
#   - Deno, pinned below (the only place the version is written), from the npm registry, into
#     $DKP_TOOLS (default ~/.cache/deno-kube-proxy); skipped when that exact version is there. This
#     needs npm: when it is missing, it is installed with apt (as root), else the script says so and stops.
#   - the netfilter tools the agent and the tests spawn, openssl/flock/unshare for the tests and
#     systemd-analyze for the unit's test, prometheus and promtool for the monitoring tests (apt, only when missing and run as root; DKP_SYSTEM_TOOLS=0 skips
#     this, as the Dockerfile's build stage does).
# Puts deno on $DKP_TOOLS/bin (add that directory to PATH to use `deno` directly) and prints the path
# of the deno binary on its last line.
set -euo pipefail

DENO_VERSION=2.9.6
DKP_TOOLS=${DKP_TOOLS:-$HOME/.cache/deno-kube-proxy}
prefix="$DKP_TOOLS/deno-$DENO_VERSION"
deno_bin="$prefix/node_modules/@deno/linux-x64-glibc/deno"

log() { echo "install: $*" >&2; }

if [ ! -x "$deno_bin" ] || ! "$deno_bin" --version 2>/dev/null | grep -q "^deno $DENO_VERSION "; then
  log "installing deno $DENO_VERSION from the npm registry into $prefix"
  if ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "npm is missing: installing nodejs and npm with apt"
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
    else
      log "npm is required to install deno (install nodejs and npm, or run this script as root with apt)"
      exit 1
    fi
  fi
  mkdir -p "$prefix"
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$prefix" \
    "deno@$DENO_VERSION" "@deno/linux-x64-glibc@$DENO_VERSION" >&2
fi
mkdir -p "$DKP_TOOLS/bin"
ln -sf "$deno_bin" "$DKP_TOOLS/bin/deno"

# System tools: command -> Debian package.
declare -A tools=(
  [iptables-restore]=iptables [nft]=nftables [ipset]=ipset [conntrack]=conntrack
  [ipvsadm]=ipvsadm [ip]=iproute2 [sysctl]=procps [choom]=util-linux [unshare]=util-linux [nfacct]=nfacct
  [modprobe]=kmod [systemd-analyze]=systemd [flock]=util-linux [openssl]=openssl
  [prometheus]=prometheus [promtool]=prometheus [strace]=strace
)
missing=()
if [ "${DKP_SYSTEM_TOOLS:-1}" != 0 ]; then
  for t in "${!tools[@]}"; do
    pkg=${tools[$t]}
    # One package may provide several tools: list it once.
    if ! command -v "$t" >/dev/null 2>&1 && [[ " ${missing[*]} " != *" $pkg "* ]]; then missing+=("$pkg"); fi
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]} with apt"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    log "missing system tools (${missing[*]}); the tests that need them will be skipped"
  fi
fi
echo "$deno_bin"
