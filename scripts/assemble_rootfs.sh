#!/usr/bin/env bash
# Assembles the deno-kube-proxy image's file set (deploy/image/files.txt) into a directory, the way upstream's
# distroless-iptables image is staged (kubernetes/release images/build/distroless-iptables): each program with the
# symlinks that lead to it and its ldd closure, dlopen'ed plugins with theirs, data files, and for every staged file
# its package's copyright and /var/lib/dpkg/status.d entry (so image scanners see the packages). The Dockerfile runs
# it in a Debian 12 stage and copies the result onto gcr.io/distroless/cc-debian12; tests/image/rootfs_test.ts runs
# it here and executes the agent and every tool inside the result.
#
#   assemble_rootfs.sh [--with-base] [--program SRC=DEST]... LIST DESTDIR
#   assemble_rootfs.sh --packages LIST        # the Debian packages to install before staging, one a line
#
# --with-base     also stage the `base` entries (what the distroless base image already holds), for a test root
# --program S=D   also stage file S at D (absolute, in the root) with its ldd closure: the agent's binary
set -euo pipefail
shopt -s dotglob nullglob

# The image's PATH (distroless sets it; the agent looks programs up in it).
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() {
  echo "assemble_rootfs: $*" >&2
  exit 1
}

with_base=0
programs=()
packages_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --with-base) with_base=1 ;;
    --program) programs+=("$2"); shift ;;
    --program=*) programs+=("${1#--program=}") ;;
    --packages) packages_only=1 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
  shift
done
list=${1:-}
[ -n "$list" ] && [ -f "$list" ] || die "usage: assemble_rootfs.sh [--with-base] [--program SRC=DEST]... LIST DESTDIR"

# entries: "kind name package" with comments and blank lines removed
entries=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$list")
while read -r kind name pkg rest; do
  case $kind in program | helper | plugins | data | base) ;; *) die "$list: unknown kind '$kind'" ;; esac
  [ -n "$name" ] && [ -n "$pkg" ] && [ -z "$rest" ] || die "$list: bad entry '$kind $name $pkg $rest'"
done <<<"$entries"

if [ $packages_only = 1 ]; then
  awk '$1 != "base" { print $3 }' <<<"$entries" | sort -u
  exit 0
fi

dest=${2:-}
[ -n "$dest" ] || die "no destination directory"
mkdir -p "$dest"
dest=$(realpath "$dest")
[ "$dest" != / ] || die "refusing to stage into /"

declare -A staged=()  # source path -> 1
owned=()              # staged files and links whose package metadata is wanted

# The absolute path a symlink points to, without resolving further links (realpath -s only normalises).
link_target() {
  local t
  t=$(readlink -- "$1")
  case $t in /*) ;; *) t="$(dirname -- "$1")/$t" ;; esac
  realpath -s -- "$t"
}

is_elf() {
  [ "$(head -c 4 -- "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]
}

# The libraries (absolute paths, the loader included) that ld.so maps for ELF file $1.
needed_libs() {
  local out
  if ! out=$(ldd -- "$1" 2>&1); then
    case $out in *"not a dynamic executable"*) return 0 ;; esac
    die "ldd $1 failed: $out"
  fi
  if grep -q 'not found' <<<"$out"; then
    die "$1 needs libraries that are not installed: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
  fi
  sed -nE 's#^[[:space:]]*([^[:space:]]+ => )?(/[^[:space:]]+) \(0x[0-9a-f]+\)$#\2#p' <<<"$out"
}

# Copies path $1 (file, symlink or directory tree) to the same path under $dest, following symlinks to their
# targets and ELF files to their libraries. $2=1 records it for package metadata.
stage() {
  local p=$1 meta=${2:-1} lib
  [ -z "${staged[$p]:-}" ] || return 0
  staged[$p]=1
  [ -e "$p" ] || [ -L "$p" ] || die "$p does not exist"
  if [ -d "$p" ] && [ ! -L "$p" ]; then
    mkdir -p -- "$dest$p"
    chmod --reference="$p" -- "$dest$p"
    local e
    for e in "$p"/*; do stage "$e" "$meta"; done
    return 0
  fi
  mkdir -p -- "$dest$(dirname -- "$p")"
  cp -a -- "$p" "$dest$p"
  [ "$meta" = 1 ] && owned+=("$p")
  if [ -L "$p" ]; then
    stage "$(link_target "$p")" "$meta"
  elif [ -f "$p" ] && is_elf "$p"; then
    while read -r lib; do stage "$lib" "$meta"; done < <(needed_libs "$p")
  fi
  return 0
}

find_program() {
  local d
  case $1 in /*) [ -x "$1" ] && echo "$1" && return 0 ;; esac
  for d in ${IMAGE_PATH//:/ }; do
    if [ -x "$d/$1" ] && [ ! -d "$d/$1" ]; then
      echo "$d/$1"
      return 0
    fi
  done
  die "program $1 not found (in $IMAGE_PATH unless absolute; install its package: $2)"
}

while read -r kind name pkg; do
  case $kind in
    program | helper) stage "$(find_program "$name" "$pkg")" ;;
    plugins | data)
      [ -e "$name" ] || die "$name not found (install its package: $pkg)"
      stage "$name"
      ;;
    base)
      [ $with_base = 1 ] || continue
      if [ -d "$name" ] && [ ! -L "$name" ]; then # an empty directory with the base's mode (/tmp)
        mkdir -p -- "$dest$name"
        chmod --reference="$name" -- "$dest$name"
      else
        staged[$name]=1
        mkdir -p -- "$dest$(dirname -- "$name")"
        cp -L -- "$name" "$dest$name"
      fi
      ;;
  esac
done <<<"$entries"

for spec in "${programs[@]}"; do
  src=${spec%%=*}
  to=${spec#*=}
  [ "$src" != "$spec" ] && [ "${to#/}" != "$to" ] || die "--program wants SRC=/absolute/dest, got $spec"
  [ -f "$src" ] || die "--program: $src is not a file"
  mkdir -p -- "$dest$(dirname -- "$to")"
  cp -L --preserve=mode -- "$src" "$dest$to"
  while read -r lib; do stage "$lib"; done < <(needed_libs "$src")
done

# Package metadata, as upstream's stage_file does: the owning package of each staged file (dpkg knows the
# pre-usrmerge path for some, e.g. /bin/ip for /usr/bin/ip), its copyright and its `dpkg -s` status.
if command -v dpkg-query >/dev/null 2>&1 && [ ${#owned[@]} -gt 0 ]; then
  unmerged() {
    case $1 in
      /usr/bin/* | /usr/sbin/* | /usr/lib/* | /usr/lib64/*) echo "${1#/usr}" ;;
      /bin/* | /sbin/* | /lib/* | /lib64/*) echo "/usr$1" ;;
      *) echo "$1" ;;
    esac
  }
  queries=()
  for p in "${owned[@]}"; do queries+=("$p" "$(unmerged "$p")"); done
  mapfile -t pkgs < <(dpkg-query -S -- "${queries[@]}" 2>/dev/null |
    sed -nE 's/^([^:,[:space:]]+)(:[a-z0-9]+)?(, [^:]+)?: \/.*$/\1/p' | sort -u)
  mkdir -p "$dest/var/lib/dpkg/status.d"
  for pkg in "${pkgs[@]}"; do
    if [ -f "/usr/share/doc/$pkg/copyright" ]; then
      mkdir -p "$dest/usr/share/doc/$pkg"
      cp -L "/usr/share/doc/$pkg/copyright" "$dest/usr/share/doc/$pkg/copyright"
    fi
    dpkg-query -s "$pkg" >"$dest/var/lib/dpkg/status.d/$pkg"
  done
fi
echo "assemble_rootfs: staged ${#staged[@]} paths into $dest" >&2
