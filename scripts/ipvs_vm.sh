#!/usr/bin/env bash
# Runs tests against a real IPVS kernel: the host kernel has no ip_vs, so this boots Debian's own kernel
# (pinned below) under QEMU's software emulator (TCG, no KVM needed) from a small busybox initramfs with
# the netfilter tools the agent spawns, shares the checkout, the Deno binary and the Deno cache over 9p,
# runs the command, and powers off. The VM has no network card: its test addresses never leave it.
#
#   bash scripts/ipvs_vm.sh build                    install host packages, fetch the kernel, build the image
#   bash scripts/ipvs_vm.sh test [PATH...] [-- FLAGS] run `deno test` inside the VM on every *_vmtest.ts file
#                                                    under the PATHs (default tests/); FLAGS go to deno test
#   bash scripts/ipvs_vm.sh run CMD [ARG...]          run one command inside the VM (cwd: the checkout)
#   bash scripts/ipvs_vm.sh boot                      boot, load the modules, check ip_vs, power off
#
# A test file opts in by its name: `*_vmtest.ts`. `deno test` does not pick such files up on the host; the
# host test tests/dataplane/ipvs_vm_test.ts runs them all in one VM (testkit/ipvs_vm.ts).
#
# Everything is cached under $DKP_TOOLS/ipvs-vm (default ~/.cache/deno-kube-proxy/ipvs-vm): the kernel .deb
# and its uncompressed vmlinux, busybox, and the initramfs (rebuilt when this script or the kernel changes).
# A second run only boots. Needs root for apt (qemu-system-x86, cpio, kmod, the netfilter tools) on the
# first run; QEMU itself runs unprivileged. Inside the VM the programs run as root with iproute2's `ip`,
# iptables legacy and nft, nft, ipset, ipvsadm, conntrack, procps sysctl and choom; busybox provides the rest.
#
# Exit code: that of the command inside the VM; 99 when the VM reported no result, 124 on timeout.
# Environment: DKP_TOOLS; IPVS_VM_K8S (Kubernetes binaries shared read-only when the directory exists,
# default $DKP_TOOLS/k8s-v1.37.2); IPVS_VM_MEM (MiB, default 2048); IPVS_VM_CPUS (default 2, 1 on one core);
# IPVS_VM_TIMEOUT (s, default 2400; the VM suite takes ~8 min on a quiet 2-core host, ~25 beside a CPU hog);
# IPVS_VM_JUNIT=FILE (test: copy Deno's JUnit report there); IPVS_VM_KEEP=1 (keep the scratch dir).
set -euo pipefail

# The kernel, pinned here and only here. If the archive has dropped this version (Debian keeps a few ABIs),
# the build warns loudly and uses the version linux-image-amd64 currently depends on: bump these two lines.
KERNEL_PKG=linux-image-6.1.0-57-amd64
KERNEL_PKG_VERSION=6.1.192-3

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
self="$repo/scripts/ipvs_vm.sh"
DKP_TOOLS=${DKP_TOOLS:-$HOME/.cache/deno-kube-proxy}
vm_dir="$DKP_TOOLS/ipvs-vm"
VM_MEM=${IPVS_VM_MEM:-2048}
VM_TIMEOUT=${IPVS_VM_TIMEOUT:-2400}
# Multi-threaded TCG: one vCPU per host core, at most 2 (the suite runs test files one after another, so the
# host's cores are free while the VM runs; the VM holds kube-apiserver, etcd and two proxies at once).
VM_CPUS=${IPVS_VM_CPUS:-$(( $(nproc) < 2 ? 1 : 2 ))}
K8S_DIR=${IPVS_VM_K8S:-$DKP_TOOLS/k8s-v1.37.2}
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[ipvs-vm %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# ------------------------------------------------------------------------------------------ host packages
# The host binaries copied into the image, and the Debian package of each.
declare -A host_tools=(
  [/usr/sbin/ipvsadm]=ipvsadm [/usr/sbin/ipset]=ipset [/usr/bin/ip]=iproute2
  [/usr/sbin/xtables-legacy-multi]=iptables [/usr/sbin/xtables-nft-multi]=iptables [/usr/sbin/nft]=nftables
  [/usr/sbin/conntrack]=conntrack [/usr/sbin/sysctl]=procps [/usr/bin/choom]=util-linux [/usr/bin/openssl]=openssl
)

apt_install() {
  [ "$(id -u)" = 0 ] || die "missing host packages ($*); installing them needs root"
  log "apt-get install $*"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  fi
}

deps() {
  local need=() t
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  command -v cpio >/dev/null || need+=(cpio)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v depmod >/dev/null && command -v modprobe >/dev/null || need+=(kmod)
  for t in "${!host_tools[@]}"; do [ -x "$t" ] || need+=("${host_tools[$t]}"); done
  if [ ${#need[@]} -gt 0 ]; then apt_install $(printf '%s\n' "${need[@]}" | sort -u); fi
}

# Downloads a package's .deb into $vm_dir/debs without installing it (prints its path).
# Retries after `apt-get update` when the lists are stale.
download_deb() {
  local spec=$1 name=${1%%=*} deb
  mkdir -p "$vm_dir/debs"
  if ! (cd "$vm_dir/debs" && apt-get download -q "$spec" >/dev/null 2>&1); then
    [ "$(id -u)" = 0 ] && apt-get update -qq >&2
    (cd "$vm_dir/debs" && apt-get download -q "$spec" >/dev/null 2>&1) || return 1
  fi
  deb=$(ls -t "$vm_dir/debs/${name}"_*.deb 2>/dev/null | head -n 1)
  [ -n "$deb" ] && echo "$deb"
}

busybox_bin() {
  local bb="$vm_dir/busybox/busybox" deb tmp
  if [ ! -x "$bb" ]; then
    deb=$(download_deb busybox-static) || die "cannot download busybox-static"
    tmp=$(mktemp -d)
    dpkg-deb -x "$deb" "$tmp"
    mkdir -p "$vm_dir/busybox"
    cp "$tmp/bin/busybox" "$bb"
    rm -rf "$tmp"
  fi
  echo "$bb"
}

# ----------------------------------------------------------------------------------------------- kernel
# Sets KVER and KDEB (the kernel package's .deb), downloading it once. Extracts vmlinux for PVH boot:
# Debian's bzImage is xz-compressed, and decompressing it under TCG would cost ~5-7 s of every boot.
kernel() {
  local want="$KERNEL_PKG=$KERNEL_PKG_VERSION" resolved="$vm_dir/kernel.resolved" pkg ver
  if [ -f "$resolved" ] && [ "$(sed -n 1p "$resolved")" = "$want" ] && [ -f "$(sed -n 3p "$resolved")" ]; then
    KVER=$(sed -n 2p "$resolved")
    KDEB=$(sed -n 3p "$resolved")
  else
    pkg=$KERNEL_PKG
    if ! KDEB=$(download_deb "$want"); then
      pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
      ver=$(apt-cache show "$pkg" 2>/dev/null | awk '/^Version:/ {print $2; exit}')
      log "WARNING: the pinned kernel $want is no longer in the archive; using $pkg=$ver instead."
      log "WARNING: update KERNEL_PKG and KERNEL_PKG_VERSION in scripts/ipvs_vm.sh"
      KDEB=$(download_deb "$pkg=$ver") || die "cannot download a kernel package"
    fi
    KVER=${pkg#linux-image-}
    mkdir -p "$vm_dir"
    printf '%s\n%s\n%s\n' "$want" "$KVER" "$KDEB" >"$resolved"
  fi
  local vmlinux="$vm_dir/vmlinux-$KVER"
  if [ ! -s "$vmlinux" ]; then
    log "extracting vmlinux from $(basename "$KDEB")"
    local tmp off
    tmp=$(mktemp -d)
    dpkg-deb --fsys-tarfile "$KDEB" | tar -x -C "$tmp" "./boot/vmlinuz-$KVER"
    off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$tmp/boot/vmlinuz-$KVER" | head -n 1 | cut -d: -f1)
    [ -n "$off" ] || die "no xz stream in vmlinuz-$KVER"
    tail -c +"$((off + 1))" "$tmp/boot/vmlinuz-$KVER" | xz -dc --single-stream >"$vmlinux.tmp" 2>/dev/null || true
    rm -rf "$tmp"
    [ "$(head -c 4 "$vmlinux.tmp" | tail -c 3)" = ELF ] || die "could not extract an ELF vmlinux"
    mv "$vmlinux.tmp" "$vmlinux"
  fi
}

# Modules packed into the image and loaded at boot, in this order (dependencies come from modules.dep).
# Names this kernel does not have are skipped with a warning.
MODULES="
crc32c_generic libcrc32c virtio_pci 9pnet_virtio 9p
dummy veth bridge br_netfilter
nf_conntrack nf_nat nf_defrag_ipv4 nf_defrag_ipv6 nf_conntrack_netlink nfnetlink_log
ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr ip_vs_sh ip_vs_dh ip_vs_sed ip_vs_nq
ip_vs_mh ip_vs_fo ip_vs_ovf ip_vs_twos
ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_hash_net
ip_set_hash_netport ip_set_hash_netiface ip_set_hash_ipmark ip_set_bitmap_port ip_set_bitmap_ip
ip_set_list_set xt_set
x_tables ip_tables ip6_tables iptable_filter iptable_nat iptable_mangle iptable_raw
ip6table_filter ip6table_nat ip6table_mangle ip6table_raw
xt_tcpudp xt_conntrack xt_comment xt_mark xt_MASQUERADE xt_addrtype xt_ipvs xt_multiport xt_nat
xt_state xt_statistic xt_physdev xt_recent xt_limit xt_CT xt_NFLOG xt_connmark xt_pkttype xt_REDIRECT
nf_reject_ipv4 nf_reject_ipv6 ipt_REJECT ip6t_REJECT
nf_tables nft_compat nft_chain_nat nft_ct nft_nat nft_masq nft_redir nft_reject nft_reject_inet
nft_reject_ipv4 nft_reject_ipv6 nft_fib nft_fib_ipv4 nft_fib_ipv6 nft_fib_inet nft_limit nft_numgen
nft_hash nft_objref nft_quota nft_log
overlay
"

R= # the rootfs tree being built

# copy_with_libs SRC [DEST]: copies SRC to DEST in the image (DEST "-" copies nothing) plus every library
# ldd names and the ELF interpreter.
copy_with_libs() {
  local src=$1 dst=${2:-$1} lib
  if [ "$dst" != "-" ]; then
    mkdir -p "$R$(dirname "$dst")"
    cp -L "$src" "$R$dst"
  fi
  { ldd "$src" 2>/dev/null || true; } | { grep -o '/[^ )]*' || true; } | while read -r lib; do
    [ -e "$R$lib" ] && continue
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
}

# The image's cache key: this script, the kernel and busybox.
image_key() {
  { cat "$self"; echo "$KVER"; sha256sum "$1"; } | sha256sum | cut -c1-12
}

build() {
  deps
  kernel
  local bb key img
  bb=$(busybox_bin)
  key=$(image_key "$bb")
  img="$vm_dir/initramfs-$KVER-$key.cpio.gz"
  if [ -s "$img" ]; then
    IMAGE=$img
    return
  fi
  local t0
  t0=$(date +%s.%N)
  log "building the initramfs for $KVER in $vm_dir"
  local work="$vm_dir/build.tmp"
  rm -rf "$work"
  mkdir -p "$work"
  R="$work/root"

  # Merged /usr as on Debian.
  mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,run,tmp,root,scratch,var}
  ln -s usr/bin "$R/bin"
  ln -s usr/sbin "$R/sbin"
  ln -s usr/lib "$R/lib"
  ln -s usr/lib64 "$R/lib64"
  ln -s ../run "$R/var/run"
  chmod 1777 "$R/tmp"

  # Real tools first, then busybox applets for every name they leave free (busybox's own `ip`, `sysctl`,
  # ... would otherwise shadow them in $PATH; scripts run by busybox sh must call them by full path).
  local t n
  for t in "${!host_tools[@]}"; do copy_with_libs "$t"; done
  ln -s ../bin/ip "$R/usr/sbin/ip"
  for n in iptables ip6tables; do
    for s in "" -save -restore; do
      ln -s xtables-legacy-multi "$R/usr/sbin/$n-legacy$s"
      ln -s xtables-nft-multi "$R/usr/sbin/$n-nft$s"
      ln -s xtables-nft-multi "$R/usr/sbin/$n$s" # Debian's default backend
    done
  done
  for t in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_with_libs "$t"; done
  [ -d /usr/share/iproute2 ] && mkdir -p "$R/usr/share" && cp -a /usr/share/iproute2 "$R/usr/share/"
  # openssl's configuration (the real kube-apiserver's test PKI is made with openssl: testkit/certs.ts).
  if [ -f /etc/ssl/openssl.cnf ]; then
    mkdir -p "$R/etc/ssl" "$R/usr/lib/ssl"
    cp /etc/ssl/openssl.cnf "$R/etc/ssl/"
    ln -s /etc/ssl/openssl.cnf "$R/usr/lib/ssl/openssl.cnf"
  fi
  # The kernel's module loader, and glibc's C/C++ runtime for the Deno binary that comes over 9p.
  cp "$bb" "$R/usr/bin/busybox"
  for n in $("$bb" --list-full); do
    [ -e "$R/usr/bin/${n##*/}" ] || [ -e "$R/usr/sbin/${n##*/}" ] || ln -s /usr/bin/busybox "$R/usr/bin/${n##*/}"
  done
  for t in libgcc_s.so.1 libstdc++.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libm.so.6; do
    [ -e "/lib/x86_64-linux-gnu/$t" ] && copy_with_libs "/lib/x86_64-linux-gnu/$t"
  done

  cp /etc/protocols /etc/services "$R/etc/" 2>/dev/null || true
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$R/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
  printf 'hosts: files\n' >"$R/etc/nsswitch.conf"
  printf '127.0.0.1 localhost\n127.0.1.1 ipvs-vm\n::1 localhost\n' >"$R/etc/hosts"
  echo ipvs-vm >"$R/etc/hostname"

  # Kernel modules: the closure of $MODULES, resolved by kmod against the unpacked package.
  local kroot="$work/kroot" M="$R/lib/modules/$KVER" mods=() m out ko rel
  mkdir -p "$kroot"
  dpkg-deb -x "$KDEB" "$kroot"
  depmod -b "$kroot" "$KVER"
  mkdir -p "$M"
  cp "$kroot/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$M/"
  for m in $MODULES; do
    if out=$(modprobe -d "$kroot" -S "$KVER" --show-depends "$m" 2>/dev/null); then
      mods+=("$m")
      while read -r ko; do
        rel=${ko#"$kroot"}
        mkdir -p "$R$(dirname "$rel")"
        [ -e "$R$rel" ] || cp "$ko" "$R$rel"
      done < <(awk '$1 == "insmod" {print $2}' <<<"$out")
    else
      log "warning: module $m is not in $KVER; skipped"
    fi
  done
  depmod -b "$R" "$KVER"
  printf '%s\n' "${mods[@]}" >"$R/etc/modules-load"

  install -m 0755 /dev/stdin "$R/init" <<'INIT'
#!/bin/sh
# PID 1: mounts, modules, loopback, hostname, clock; then /scratch/run.sh (written by the host) and poweroff.
# Busybox sh runs its own applets before $PATH, so iproute2's ip is called by full path here.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
echo
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run/netns
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
echo /usr/bin/modprobe >/proc/sys/kernel/modprobe
arg() { for w in $(cat /proc/cmdline); do case $w in "$1"=*) echo "${w#*=}" ;; esac; done; }
epoch=$(arg ipvsvm.epoch)
[ -n "$epoch" ] && date -s "@$epoch" >/dev/null
failed=""
for m in $(cat /etc/modules-load); do modprobe "$m" 2>/dev/null || failed="$failed $m"; done
[ -n "$failed" ] && echo "IPVSVM: modules that failed to load:$failed"
/usr/bin/ip link set lo up
hostname ipvs-vm
echo "IPVSVM: up at $(cut -d' ' -f1 /proc/uptime)s, kernel $(uname -r), $(wc -l </proc/modules) modules"
rc=0
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 scratch /scratch 2>/dev/null; then
  if [ -f /scratch/run.sh ]; then
    sh /scratch/run.sh
    rc=$?
  fi
elif [ ! -e /proc/net/ip_vs ]; then
  rc=1
fi
[ -e /proc/net/ip_vs ] || { echo "IPVSVM: no /proc/net/ip_vs"; rc=1; }
echo "IPVSVM-RESULT rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)s"
sync
poweroff -f
INIT

  log "packing the initramfs"
  (cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$img.tmp"
  mv "$img.tmp" "$img"
  rm -rf "$work"
  find "$vm_dir" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -name "$(basename "$img")" -delete
  log "initramfs $(basename "$img"): $(du -h "$img" | cut -f1), built in $(seconds_since "$t0")s"
  IMAGE=$img
}

# ------------------------------------------------------------------------------------------------- boot
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # single-quote for sh

# boot SCRATCH [TAG=PATH:MODE ...]: boots the VM with SCRATCH as /scratch (read-write) and each further
# host directory at the same path inside (ro or rw), then streams the console. Returns the VM's rc.
boot() {
  local scratch=$1
  shift
  local share=(-virtfs "local,path=$scratch,mount_tag=scratch,security_model=none,id=scratch")
  local spec tag path mode
  for spec in "$@"; do
    tag=${spec%%=*} path=${spec#*=} mode=${path##*:} path=${path%:*}
    share+=(-virtfs "local,path=$path,mount_tag=$tag,security_model=none,id=$tag$([ "$mode" = ro ] && echo ,readonly=on)")
  done
  local append="console=ttyS0 quiet loglevel=3 panic=-1 ipvsvm.epoch=$(date +%s)"
  local console="$scratch/console.log" t0 rc
  log "booting $KVER (TCG, ${VM_MEM} MiB, ${VM_CPUS} vCPU, timeout ${VM_TIMEOUT}s)"
  t0=$(date +%s.%N)
  # QEMU runs in the background so that a TERM to this script stops it (see the trap).
  (timeout -k 5 "$VM_TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$VM_MEM" -smp "$VM_CPUS" \
    -kernel "$vm_dir/vmlinux-$KVER" -initrd "$IMAGE" -append "$append" \
    -nographic -no-reboot -nic none -pidfile "$scratch/qemu.pid" "${share[@]}" </dev/null 2>&1
  echo "IPVSVM-HOST qemu exit $?") |
    tr -d '\r' | sed -u 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' | tee "$console" &
  local pipeline=$!
  trap 'kill "$(cat "$scratch/qemu.pid" 2>/dev/null)" 2>/dev/null; sleep 1; rm -rf "$scratch"; exit 143' INT TERM
  wait "$pipeline" || true
  trap - INT TERM
  rc=$(sed -n 's/^IPVSVM-RESULT rc=\([0-9]*\).*/\1/p' "$console" | tail -n 1)
  if [ -z "$rc" ]; then
    rc=99
    grep -q '^IPVSVM-HOST qemu exit 124' "$console" && rc=124
  fi
  log "VM finished: rc=$rc, wall $(seconds_since "$t0")s from QEMU start to power-off"
  return "$rc"
}

# The Deno binary (installed by scripts/install.sh if missing), resolved to the real file.
DENO_BIN=
resolve_deno() {
  [ -n "$DENO_BIN" ] || DENO_BIN=$(readlink -f "$(bash "$repo/scripts/install.sh" | tail -n 1)")
}

# run_in_vm CMD...: boots with the checkout, the Deno binary and the Deno cache shared, and runs CMD in
# the checkout through sh. Sets up the scratch dir; honours IPVS_VM_JUNIT.
run_in_vm() {
  local deno_bin deno_dir scratch rc
  resolve_deno
  deno_bin=$DENO_BIN
  deno_dir=$(DENO_NO_UPDATE_CHECK=1 "$deno_bin" info --json | sed -n 's/^ *"denoDir": "\(.*\)",$/\1/p')
  [ -n "$deno_dir" ] || die "cannot find Deno's cache directory"
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/ipvs-vm.XXXXXX")
  # The checkout, the Deno binary and the Kubernetes binaries (if built) at their host paths, parents
  # first. The Deno cache is read-only over 9p with a tmpfs overlay on top, so that Deno can write its
  # caches in the VM without touching the host's.
  local mounts=("repo=$repo:ro" "denobin=$(dirname "$deno_bin"):ro")
  # Kubernetes binaries built from source (upstream kube-proxy for the parity test and the benchmarks).
  [ -d "$K8S_DIR" ] && mounts+=("k8s=$K8S_DIR:ro")
  {
    echo 'mnt() { mkdir -p "$2" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro "$1" "$2"; }'
    local spec p
    for spec in $(printf '%s\n' "${mounts[@]}" | awk -F= '{print length($2) "\t" $0}' | sort -n | cut -f2); do
      p=${spec#*=}
      echo "mnt ${spec%%=*} $(sq "${p%:*}") || { echo 'IPVSVM: 9p mount of ${spec%%=*} failed'; exit 98; }"
    done
    echo "mnt denodir /run/denodir.lower && mkdir -p /tmp/denodir.upper /tmp/denodir.work $(sq "$deno_dir") &&"
    echo "  mount -t overlay overlay -o lowerdir=/run/denodir.lower,upperdir=/tmp/denodir.upper,workdir=/tmp/denodir.work $(sq "$deno_dir") ||"
    echo "  { echo 'IPVSVM: mounting the Deno cache failed'; exit 98; }"
    echo "export PATH=$(sq "$(dirname "$deno_bin")"):\$PATH DENO_DIR=$(sq "$deno_dir") NO_COLOR=1 DENO_NO_UPDATE_CHECK=1 DENO_NO_PROMPT=1 TMPDIR=/tmp"
    echo "cd $(sq "$repo") || exit 98"
    echo 'echo "IPVSVM: running the command at $(cut -d" " -f1 /proc/uptime)s"'
    local a cmd=""
    for a in "$@"; do cmd="$cmd $(sq "$a")"; done
    echo "$cmd"
  } >"$scratch/run.sh"
  set +e
  boot "$scratch" "${mounts[@]}" "denodir=$deno_dir:ro"
  rc=$?
  set -e
  if [ -n "${IPVS_VM_JUNIT:-}" ] && [ -f "$scratch/junit.xml" ]; then cp "$scratch/junit.xml" "$IPVS_VM_JUNIT"; fi
  if [ "${IPVS_VM_KEEP:-}" = 1 ]; then log "scratch kept in $scratch"; else rm -rf "$scratch"; fi
  return "$rc"
}

# Builds (locked: engineers share the cache) and prepares the kernel variables for boot.
prepare() {
  mkdir -p "$vm_dir"
  exec 9>"$vm_dir/.lock"
  flock 9
  build
  flock -u 9
}

cmd_test() {
  local paths=() flags=() files=() p
  while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then
      shift
      flags=("$@")
      break
    fi
    paths+=("$1")
    shift
  done
  [ ${#paths[@]} -gt 0 ] || paths=("$repo/tests")
  for p in "${paths[@]}"; do
    [ -e "$p" ] || die "no such file or directory: $p"
    p=$(readlink -f "$p")
    case $p/ in "$repo"/*) ;; *) die "$p is outside the checkout $repo (only the checkout is shared)" ;; esac
    if [ -d "$p" ]; then
      while IFS= read -r f; do files+=("$f"); done < <(find "$p" -name '*_vmtest.ts' | LC_ALL=C sort)
    else
      files+=("$p")
    fi
  done
  [ ${#files[@]} -gt 0 ] || die "no *_vmtest.ts files under ${paths[*]}"
  cd "$repo"
  prepare
  # The VM has no network: cache every module of the checkout on the host first (the tests also spawn
  # programs that they do not import: pod servers, probes, the agent).
  local t0
  t0=$(date +%s.%N)
  resolve_deno
  find . -path ./node_modules -prune -o -path ./dist -prune -o -name '*.ts' -print0 |
    xargs -0 "$DENO_BIN" cache --frozen >&2
  log "deno cache on the host: $(seconds_since "$t0")s"
  run_in_vm deno test --allow-all --no-check --frozen --cached-only --junit-path=/scratch/junit.xml \
    "${flags[@]}" "${files[@]}"
}

action=${1:-}
[ $# -gt 0 ] && shift
case $action in
  build)
    prepare
    log "ready: $IMAGE"
    ;;
  boot)
    prepare
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/ipvs-vm.XXXXXX")
    printf '%s\n' 'ipvsadm -Ln && ipset --version && iptables-legacy -V && iptables-nft -V && nft --version' \
      'conntrack --version && /usr/sbin/sysctl --version && choom --version && /usr/bin/ip -V' >"$scratch/run.sh"
    set +e
    boot "$scratch"
    rc=$?
    rm -rf "$scratch"
    exit "$rc"
    ;;
  run)
    [ $# -gt 0 ] || die "usage: $0 run CMD [ARG...]"
    prepare
    run_in_vm "$@"
    ;;
  test) cmd_test "$@" ;;
  *)
    sed -n '2,25p' "$self" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
