#!/usr/bin/env bash
# Carries flodl's Debian build and run dependencies to a machine without network (a GPU machine
# that has CUDA, cmake and a compiler but none of these libraries): `download` fetches the .deb
# files here, `unpack` extracts them there into a prefix (never into /) and prints the shell
# exports that point a build at it. Building itself is left to cmake (scripts/gpu-check.sh).
#   scripts/gpu-deps.sh download [DIR]     (default DIR: .deps/debs under the repository root)
#   eval "$(scripts/gpu-deps.sh unpack DIR PREFIX)"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# What flodl builds and runs against (scripts/install-deps.sh's list, the runtime packages named
# too, so that a dependency closure that stops at -dev packages still carries them).
want=(libzmq3-dev libzmq5 libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler libprotoc32
      libprotobuf32 liblz4-dev liblz4-1 libcjson-dev libcjson1 zlib1g-dev zlib1g
      libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev
      libmicrohttpd-dev libmicrohttpd12 check libsubunit-dev libsubunit0 pkgconf pkgconf-bin
      libpkgconf3)
# The base every image has (the GPU image brings its own, newer C library and compiler runtime):
# never carried, and whatever only they need is not followed.
base_re='^(libc6|libc6-dev|libc-dev-bin|libc-bin|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl2|libnsl-dev|libtirpc[0-9a-z-]*|rpcsvc-proto|libgcc-s1|libstdc\+\+6|libstdc\+\+-[0-9]+-dev|gcc-[0-9]+-base|gcc|gcc-[0-9]+|cpp|binutils|debconf|debconf-2\.0|dpkg|perl-base|perl|mawk|awk|bash|dash|coreutils|tar|sed|grep|base-files|debianutils|libselinux1|libpcre2-8-0|libzstd1|liblzma5|libbz2-1\.0|libaudit1|libpam0g|init-system-helpers|sensible-utils|lsb-base|sysvinit-utils)$'
apt_flags=(--no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances)

die() { echo "gpu-deps.sh: $*" >&2; exit 1; }

is_wanted() {
  local p
  for p in "${want[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

# The packages to carry: the closure of `want` over Depends/PreDepends, taking the first
# alternative of each "a | b" group (apt's own choice; the others are other builds of the same
# library, openblas-openmp or -serial beside -pthread) and the first provider of a virtual
# package. Base packages end a path; so do -dev packages nobody asked for: they only serve
# static links (libzmq3-dev's libkrb5-dev, libgnutls28-dev, ... bring libicu-dev and tens of
# MiB), and `unpack` drops the Requires.private lines that would name them.
closure() {
  apt-cache depends --recurse "${apt_flags[@]}" "${want[@]}" 2>/dev/null | awk '
    # A group is one dependency with its alternatives (" |Depends: a" then "  Depends: b");
    # providers of a virtual one follow it, indented by four.
    function flush() {
      if (pending != "" && pending !~ /^</) edge[cur] = edge[cur] " " pending
      pending = ""
    }
    /^[^ ]/ { flush(); cur = $1; open = 0; waitprov = 0; next }
    /^ [ |](Pre)?Depends: / {
      if (!open) { flush(); pending = $2; waitprov = ($2 ~ /^</) }
      else waitprov = 0
      open = substr($0, 2, 1) == "|"
      next
    }
    /^    [^ ]/ { if (waitprov) { pending = $1; waitprov = 0 } next }
    END { flush(); for (p in edge) print p edge[p] }
  ' >"$tmp/edges"
  local -A edges=()
  local p rest d
  while read -r p rest; do edges[$p]=$rest; done <"$tmp/edges"
  # Breadth-first from the wanted packages over the edges.
  local queue=("${want[@]}") seen=" "
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    case "$seen" in *" $p "*) continue ;; esac
    [[ "$p" =~ $base_re ]] && continue
    if [[ "$p" == *-dev ]] && ! is_wanted "$p"; then continue; fi
    seen+="$p "
    echo "$p"
    for d in ${edges[$p]:-}; do queue+=("$d"); done
  done
}

download() {
  local dir=${1:-$root/.deps/debs}
  command -v apt-get >/dev/null || die "download needs apt-get (run it on a Debian machine)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mapfile -t pkgs < <(closure)
  [ ${#pkgs[@]} -gt 0 ] || die "apt-cache knows none of the packages (run apt-get update first)"
  local fetched=() have=0 p
  for p in "${pkgs[@]}"; do
    if compgen -G "$dir/${p}_*.deb" >/dev/null; then
      have=$((have + 1))
      continue
    fi
    fetched+=("$p")
  done
  if [ ${#fetched[@]} -gt 0 ]; then
    # apt-get download writes into the current directory; as root it warns that _apt cannot
    # write there and downloads unsandboxed, which is fine for a plain download.
    (cd "$dir" && apt-get download -q "${fetched[@]}" 2>&1) |
      grep -v -e '^Get:' -e 'unsandboxed' >&2 || true
    for p in "${fetched[@]}"; do
      compgen -G "$dir/${p}_*.deb" >/dev/null || die "apt-get download $p failed"
    done
    echo "gpu-deps.sh: fetched ${#fetched[@]} package(s): ${fetched[*]}" >&2
  fi
  echo "gpu-deps.sh: $have package(s) were already in $dir" >&2
  echo "gpu-deps.sh: ${#pkgs[@]} packages, $(du -sh "$dir" | cut -f1) in $dir" >&2
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  [ "$kib" -le $((40 * 1024)) ] || echo "gpu-deps.sh: warning: over 40 MiB; the device tool carries 64 MiB of working tree in all" >&2
}

# The soname of a shared object (readelf or objdump; else its file name).
soname() {
  local s=""
  if command -v readelf >/dev/null; then
    s=$(readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
  elif command -v objdump >/dev/null; then
    s=$(objdump -p "$1" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
  fi
  echo "${s:-$(basename "$1")}"
}

extract() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
  else
    # No dpkg (not a Debian-family image): a .deb is an ar archive holding data.tar.*.
    local member
    member=$(ar t "$1" | grep '^data\.tar')
    ar p "$1" "$member" | tar -x -a -f - -C "$2" 2>/dev/null ||
      ar p "$1" "$member" | tar -x -J -f - -C "$2"
  fi
}

unpack() {
  [ $# -eq 2 ] || die "usage: gpu-deps.sh unpack DIR PREFIX"
  local dir=$1 prefix=$2
  [ -d "$dir" ] || die "$dir: no such directory"
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  [ "$prefix" != / ] || die "refusing to unpack into /: give a prefix of its own"
  compgen -G "$dir/*.deb" >/dev/null || die "$dir holds no .deb files"
  mkdir -p "$prefix/.unpacked"
  local deb n=0
  for deb in "$dir"/*.deb; do
    local stamp
    stamp="$prefix/.unpacked/$(basename "$deb")"
    [ -e "$stamp" ] && continue
    extract "$deb" "$prefix" || die "cannot extract $deb"
    touch "$stamp"
    n=$((n + 1))
  done
  echo "gpu-deps.sh: unpacked $n new package(s) into $prefix" >&2

  # Absolute symlinks (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) point at the host:
  # make them relative, into the prefix.
  local l t rel
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    [[ "$t" == /* ]] || continue
    rel=$(realpath -m --relative-to="$(dirname "$l")" "$prefix$t")
    ln -sfn "$rel" "$l"
  done < <(find "$prefix" -path "$prefix/ld-path" -prune -o -type l -print0)
  local dangling
  # (usr/share/doc links into base packages that were not carried are expected.)
  dangling=$(find "$prefix" \( -path "$prefix/ld-path" -o -path "$prefix/usr/share/doc" \) -prune \
               -o -xtype l -print | tr '\n' ' ')
  [ -z "$dangling" ] || echo "gpu-deps.sh: note: links left dangling: $dangling" >&2

  # pkg-config files say prefix=/usr or libdir=/usr/lib/...: point every such path into the
  # prefix (rewriting rather than PKG_CONFIG_SYSROOT_DIR, which would also bend the host's own
  # .pc files). Requires.private names -dev packages that were not carried (krb5-gssapi,
  # gnutls, ...), and pkgconf refuses a module whose private requirements are missing even
  # for --cflags; they matter only to static links, which flodl does not make. The rewrite is
  # idempotent: a path already in the prefix is not preceded by '=', a blank or -I/-L.
  local pc pcdirs=()
  while IFS= read -r -d '' pc; do
    sed -i -E \
      -e "s#(^[A-Za-z_.]+=|[[:space:]]|-I|-L)/(usr|lib|lib64|include)(/|\$|[[:space:]])#\\1$prefix/\\2\\3#g" \
      -e '/^Requires\.private:/d' "$pc"
  done < <(find "$prefix" -name '*.pc' -path '*/pkgconfig/*' -type f -print0)
  mapfile -t pcdirs < <(find "$prefix" -name '*.pc' -path '*/pkgconfig/*' -printf '%h\n' | sort -u)

  # The run-time search path gets only the libraries the host lacks, through a directory of
  # links: LD_LIBRARY_PATH goes before the host's own libraries for every program started,
  # and Debian 12's libssl, gnutls or nettle in front of a newer host's would break the host's
  # cmake, git or python. (flodl's binaries get no RUNPATH into the prefix: gcc reports
  # LIBRARY_PATH's directories as implicit, so CMake leaves them out; this path serves all.)
  local libdirs=() f so host_libs
  mapfile -t libdirs < <(find "$prefix/usr/lib" "$prefix/lib" -name 'lib*.so*' \
                           \( -type f -o -type l \) -printf '%h\n' 2>/dev/null | sort -u)
  # GPU_DEPS_IGNORE_HOST=1 pretends the host has none of them (to test this on a machine that
  # has them all).
  host_libs=""
  if [ "${GPU_DEPS_IGNORE_HOST:-0}" != 1 ]; then
    host_libs=$({ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } |
                awk '{ print $1 }')
  fi
  rm -rf "$prefix/ld-path"
  mkdir -p "$prefix/ld-path"
  local shadowed=0 linked=0
  for d in "${libdirs[@]}"; do
    while IFS= read -r -d '' f; do
      so=$(soname "$f")
      [ -e "$prefix/ld-path/$so" ] && continue
      if grep -qxF "$so" <<<"$host_libs"; then
        shadowed=$((shadowed + 1))
        continue
      fi
      ln -s "$(realpath "$f")" "$prefix/ld-path/$so"
      linked=$((linked + 1))
    done < <(find "$d" -maxdepth 1 -name 'lib*.so*' -type f -print0)
  done
  echo "gpu-deps.sh: $linked libraries on the run-time path, $shadowed left to the host's own" >&2

  local pcpath libpath
  pcpath=$(IFS=:; echo "${pcdirs[*]}")
  libpath=$(IFS=:; echo "${libdirs[*]}")
  # PATH gets the prefix last: the host's own tools (pkg-config, protoc-c) win where they exist.
  # shellcheck disable=SC2016 # the ${VAR:+...} are for the shell that evals these lines
  {
    printf 'export PATH="${PATH:+$PATH:}%s"\n' "$prefix/usr/bin"
    printf 'export PKG_CONFIG_PATH="%s${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"\n' "$pcpath"
    printf 'export LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$prefix/ld-path"
    printf 'export LIBRARY_PATH="%s${LIBRARY_PATH:+:$LIBRARY_PATH}"\n' "$libpath"
    printf 'export CPATH="%s${CPATH:+:$CPATH}"\n' "$prefix/usr/include"
    printf 'export CMAKE_PREFIX_PATH="%s${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"\n' "$prefix/usr"
  }
}

case "${1:-}" in
  download) shift; download "$@" ;;
  unpack) shift; unpack "$@" ;;
  *) echo "usage: gpu-deps.sh download [DIR] | unpack DIR PREFIX" >&2; exit 2 ;;
esac
