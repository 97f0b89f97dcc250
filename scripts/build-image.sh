#!/usr/bin/env bash
# Builds ringway's container image as an OCI image layout, from this tree
# and this machine's Debian, without pulling a base image:
#
#   1. the release binary (cargo build --release --locked), or --binary;
#   2. a root file system of the binary (debug info stripped, symbols
#      kept), the shared libraries it loads (those `ldd` lists, copied
#      from the host together with their Debian copyright files), a
#      minimal /etc (passwd, group, nsswitch.conf) and a world-writable
#      /tmp for the built-in CA (RINGWAY_CA_DIR=/tmp/ringway-ca);
#   3. one layer of it, packed by tar as root:root with fixed times, added
#      with umoci to an empty image, and the image's config: entrypoint
#      /usr/local/bin/ringway, user 0:0, ringway's ports. Times come from
#      the last commit (SOURCE_DATE_EPOCH overrides), so the same binary
#      gives the same image.
#
# deploy/image/Dockerfile builds the same image from official base images
# for those who build with docker; scripts/check-image.sh checks that the
# two agree and runs the image under runc.
#
#   scripts/build-image.sh [--binary PATH] [--out DIR] [--docker-archive FILE]
#
#   --binary PATH          package this ringway binary instead of building
#                          the release one
#   --out DIR              the OCI image layout to write (replaced);
#                          default <cargo target dir>/image/oci
#   --docker-archive FILE  also write FILE for `docker load -i` or
#                          `podman load -i` (with skopeo)
#
# The image is tagged <version> in the layout and named ringway:<version>
# (the workspace version, the chart's appVersion and default tag). Needs
# umoci (and skopeo for --docker-archive); installs them with apt when
# missing if it runs as root, and fails otherwise.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
cd "$(dirname "$0")/.."

die() {
  echo "build-image.sh: $*" >&2
  exit 1
}

binary=""
out=""
archive=""
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --docker-archive) archive=${2:?--docker-archive needs a file}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

# The workspace version: the first `version = ...` of Cargo.toml, in
# [workspace.package].
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
chart_version=$(sed -n 's/^appVersion: "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/ringway/Chart.yaml)
[ "$chart_version" = "$version" ] ||
  die "the chart's appVersion ($chart_version) is not the workspace version ($version): the chart would name another image"

# need_tool COMMAND PACKAGE
need_tool() {
  command -v "$1" >/dev/null 2>&1 && return 0
  [ "$(id -u)" -eq 0 ] || die "$1 is missing: apt-get install $2 (as root)"
  echo "installing $2"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2"; }; } >/dev/null 2>&1 ||
    die "could not install $2 (apt-get install $2)"
}
need_tool umoci umoci
[ -z "$archive" ] || need_tool skopeo skopeo
need_tool ldd libc-bin
need_tool strip binutils

if [ -z "$binary" ]; then
  cargo build --release --locked -p ringway-dataplane --bin ringway
  binary=$(ringway_target_dir)/release/ringway
fi
[ -x "$binary" ] || die "$binary is not an executable file"
[ -n "$out" ] || out=$(ringway_target_dir)/image/oci
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs

# --- the root file system -------------------------------------------------
mkdir -p "$root"/{usr/local/bin,etc,tmp,proc,sys,dev,var/run}
chmod 1777 "$root/tmp"
strip --strip-debug -o "$root/usr/local/bin/ringway" "$binary"
chmod 0755 "$root/usr/local/bin/ringway"
# The loader and libraries at the paths the binary asks for (ldd prints
# "name => /path (addr)" and the loader as "/path (addr)").
libs=$(ldd "$binary" | grep -o '/[^ ]*' | sort -u) || die "ldd $binary failed"
[ -n "$libs" ] || die "ldd lists no libraries for $binary (a static binary needs none, but this script expects glibc's)"
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
  chmod 0755 "$root$lib"
  # Their licences travel with them.
  pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) ||
    die "no Debian package owns $lib: cannot ship its copyright file"
  pkg=${pkg%%:*}
  if [ -f "/usr/share/doc/$pkg/copyright" ]; then
    mkdir -p "$root/usr/share/doc/$pkg"
    cp "/usr/share/doc/$pkg/copyright" "$root/usr/share/doc/$pkg/copyright"
  fi
done
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
# glibc's resolver without NSS modules to load: /etc/hosts, then DNS
# (the runtime mounts /etc/hosts and /etc/resolv.conf).
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
find "$root" -exec touch -h -d "@$epoch" {} +

# --- the image --------------------------------------------------------------
tar --create --file "$work/layer.tar" --directory "$root" --sort=name \
  --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime .
rm -rf "$out"
mkdir -p "$(dirname "$out")"
umoci init --layout "$out"
umoci new --image "$out:$version"
umoci raw add-layer --image "$out:$version" \
  --history.created "$created" --history.created_by "scripts/build-image.sh" \
  --history.comment "ringway $version, glibc and libgcc from the build host's Debian" \
  "$work/layer.tar"
ports=()
for p in 15001/tcp 15006/tcp 15008/tcp 15020/tcp 15021/tcp 15053/tcp 15053/udp 15080/tcp; do
  ports+=(--config.exposedports "$p")
done
umoci config --image "$out:$version" --created "$created" --author "ringway" \
  --history.created "$created" --history.created_by "scripts/build-image.sh" \
  --config.entrypoint /usr/local/bin/ringway \
  --config.user 0:0 --config.workingdir / \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin \
  --config.env RINGWAY_CA_DIR=/tmp/ringway-ca \
  --config.stopsignal SIGTERM \
  "${ports[@]}" \
  --config.label "org.opencontainers.image.title=ringway" \
  --config.label "org.opencontainers.image.version=$version"
umoci gc --layout "$out"

size=$(du -sb "$out/blobs" | cut -f1)
echo "built ringway:$version as OCI layout $out (tag $version), $((size / 1024)) KiB compressed, $(du -sb "$root" | cut -f1 | awk '{printf "%d", $1 / 1024}') KiB unpacked"
if [ -n "$archive" ]; then
  rm -f "$archive"
  skopeo copy --quiet "oci:$out:$version" "docker-archive:$archive:ringway:$version"
  echo "wrote $archive: docker load -i $archive (or podman load -i) gives ringway:$version"
fi
