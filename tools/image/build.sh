#!/usr/bin/env bash
# Builds the project's OCI image (operator + node agents) without a Docker daemon and without
# pulling anything from a container registry:
#   1. a slim Debian 12 root filesystem from Debian's packages (mmdebstrap), cached under
#      ~/.cache/gpu-operator/image/ keyed by the package list and options below;
#   2. our wheel plus tools/image/requirements.lock (versions and sha256 pinned) installed into
#      it by the image's own python3.11, no bytecode, no pip cache; a non-root user 65532;
#   3. one layer written by GNU tar with sorted entries, mtimes clamped to SOURCE_DATE_EPOCH
#      (the commit's time), no atime/ctime; umoci assembles the OCI layout and config;
#   4. dist/: <name>-<tag>.oci.tar (OCI archive), .docker.tar (`docker load` / `ctr import`,
#      written by skopeo), .digest (manifest digest), .sbom.cdx.json (CycloneDX).
# Needs root (chroot, file ownership) and the Debian packages mmdebstrap, umoci, skopeo.
# --arch arm64 (or IMAGE_ARCH=arm64) builds the same image for arm64 on an amd64 host: Debian's
# arm64 packages, the arm64 wheels of the lock file, the root's own programs run under
# qemu-user-static (binfmt_misc); its outputs are named <name>-<tag>-arm64.*.
# IMAGE_OUT=DIR writes the outputs there instead of dist/. Last stdout line: "<digest> <size-bytes-uncompressed> <oci archive path> <image ref>".
set -euo pipefail
cd "$(dirname "$0")/../.."
root_dir=$PWD
py=${PYTHON:-$root_dir/.venv/bin/python}

say() { echo "image: $*" >&2; }
die() { say "error: $*"; exit 1; }

arch=${IMAGE_ARCH:-amd64}
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=${2:?--arch needs amd64 or arm64}; shift 2 ;;
    --arch=*) arch=${1#--arch=}; shift ;;
    *) die "unknown argument $1 (only --arch amd64|arm64)" ;;
  esac
done
case "$arch" in
  amd64) triplet=x86_64-linux-gnu; suffix="" ;;
  arm64) triplet=aarch64-linux-gnu; suffix="-arm64" ;;
  *) die "--arch $arch: the image is built for amd64 or arm64" ;;
esac
host_arch=$(dpkg --print-architecture)

[ "$(id -u)" = 0 ] || die "building the image needs root (chroot into the root filesystem, uid 0 files); run as root"
for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null || die "$tool not found: install the Debian package $tool (./dev image does it as root)"
done
if [ "$arch" != "$host_arch" ]; then
  qemu=/proc/sys/fs/binfmt_misc/qemu-${triplet%%-*}
  [ -e "$qemu" ] && grep -q '^enabled' "$qemu" || die "building for $arch on $host_arch runs $arch programs: \
install qemu-user-static and binfmt-support and mount binfmt_misc (./dev image --arch $arch does it as root); $qemu is not registered"
fi
platform_args=$(ARCH=$arch bash tools/image/platforms.sh)

read -r name tag < <("$py" - <<'PY'
import yaml
values = yaml.safe_load(open("deployments/gpu-operator/values.yaml"))
chart = yaml.safe_load(open("deployments/gpu-operator/Chart.yaml"))
op = values["operator"]
print(f'{op["repository"]}/{op["image"]}', op.get("version") or chart["appVersion"])
PY
)
ref="$name:$tag"
base_name=gpu-operator-$tag$suffix
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse HEAD)
[ -z "$(git status --porcelain -- src pyproject.toml tools/image deployments/gpu-operator/Chart.yaml)" ] \
  || say "warning: uncommitted changes in the tree: the image holds them but is dated and labelled as commit ${revision:0:12}"

# --- 1. base root filesystem (cached) -------------------------------------------------------
suite=bookworm
packages=(python3.11 ca-certificates)
mirrors=("deb http://deb.debian.org/debian $suite main"
         "deb http://deb.debian.org/debian $suite-updates main"
         "deb http://deb.debian.org/debian-security $suite-security main")
mmopts=(--variant=essential "--include=$(IFS=,; echo "${packages[*]}")"
        --aptopt='APT::Install-Recommends "false"'
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
        --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/doc/*'
        --dpkgopt='path-include=/usr/share/doc/*/copyright'
        --dpkgopt="path-exclude=/usr/lib/$triplet/gconv/*" "--architectures=$arch"
        --dpkgopt='path-exclude=/usr/share/lintian/*')
cache=${GPU_OPERATOR_CACHE:-$HOME/.cache/gpu-operator}/image
key=$(printf '%s\n' "$suite" "${packages[@]}" "${mirrors[@]}" "${mmopts[@]}" | sha256sum | cut -c1-16)
base_tar=$cache/base-$suite-$arch-$key.tar
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time per cache (the base and the wheel directory are shared)
if [ ! -f "$base_tar" ]; then
  say "building the Debian $suite root filesystem (mmdebstrap; cached as $base_tar)"
  # The base has its own fixed epoch so the cache does not depend on which commit built it.
  SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet "${mmopts[@]}" "$suite" "$cache/partial-$key.tar" "${mirrors[@]}" \
    > "$cache/mmdebstrap.log" 2>&1 || { tail -n 30 "$cache/mmdebstrap.log" >&2; die "mmdebstrap failed (log $cache/mmdebstrap.log)"; }
  mv "$cache/partial-$key.tar" "$base_tar"
else
  say "reusing the Debian root filesystem $base_tar"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-operator-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs" && tar -xpf "$base_tar" --numeric-owner -C "$rootfs"

# --- 2. Python packages ---------------------------------------------------------------------
wheels=$cache/wheels-$arch
mkdir -p "$wheels" "$work/install"
pip_version=$(awk -F'[= ]+' '$1 == "pip" {print $2}' tools/image/build-requirements.lock)
say "fetching pinned wheels (tools/image/requirements.lock, build-requirements.lock) into $wheels"
fetch() {  # from the cache directory alone when it has everything, else from PyPI
  # shellcheck disable=SC2086
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$wheels" \
    $platform_args --no-index --find-links "$wheels" "$@" >/dev/null 2>&1 \
  || "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$wheels" \
    $platform_args "$@" >&2
}
fetch --require-hashes -r tools/image/requirements.lock
fetch --require-hashes -r tools/image/build-requirements.lock  # pip, setuptools, wheel
say "building the gpu-operator wheel"
# from a copy of the tracked files, so the build neither sees nor leaves untracked files; in a
# build environment of setuptools and wheel installed by hash (no build isolation: pip would
# fetch them unpinned)
mkdir -p "$work/src" && git ls-files -z | xargs -0 tar -c | tar -x -C "$work/src"
bash tools/image/buildenv.sh "$wheels" "$work/buildenv" >&2
"$work/buildenv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  "$work/src" -w "$work/install" >&2
cp "$wheels"/*.whl tools/image/requirements.lock "$work/install/"
mv "$work/install" "$rootfs/tmp/install"
in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp \
  PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }
pip_in_root=(/usr/bin/python3.11 "/tmp/install/pip-$pip_version-py3-none-any.whl/pip")
say "installing into the image (no bytecode, no cache)"
in_root "${pip_in_root[@]}" install -q --no-index --find-links /tmp/install --no-compile \
  --root-user-action=ignore --break-system-packages --require-hashes -r /tmp/install/requirements.lock >&2
wheel=$(cd "$rootfs/tmp/install" && ls gpu_operator-*.whl)
in_root "${pip_in_root[@]}" install -q --no-index --no-deps --no-compile --root-user-action=ignore --break-system-packages \
  "/tmp/install/$wheel" >&2
in_root "${pip_in_root[@]}" check >&2 || die "the installed packages' dependencies disagree: regenerate tools/image/requirements.lock (tools/image/lock.sh)"
for entry in gpu-operator nvidia-validator; do
  [ -x "$rootfs/usr/local/bin/$entry" ] || say "warning: the wheel has no console script $entry"
done
rm -rf "$rootfs/tmp/install" "$rootfs/tmp/"* "$rootfs/root/.cache"
find "$rootfs/usr/local" -name __pycache__ -prune -exec rm -rf {} +

# --- the user and what varies between runs ----------------------------------------------------
echo 'gpu-operator:x:65532:65532:gpu-operator:/nonexistent:/usr/sbin/nologin' >> "$rootfs/etc/passwd"
echo 'gpu-operator:x:65532:' >> "$rootfs/etc/group"
rm -rf "$rootfs"/var/cache/ldconfig/aux-cache "$rootfs"/var/log/* "$rootfs"/var/cache/apt/* \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old

# --- 3. layer and OCI layout ------------------------------------------------------------------
say "writing the layer (sorted, mtimes clamped to $created)"
tar --create --file "$work/layer.tar" --directory "$rootfs" --sort=name --numeric-owner \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime .
size=$(stat -c %s "$work/layer.tar")
oci=$work/oci
umoci init --layout "$oci"
umoci new --image "$oci:$tag"
umoci raw add-layer --image "$oci:$tag" --history.created "$created" \
  --history.created_by "./dev image (Debian $suite: ${packages[*]}; gpu-operator wheel)" "$work/layer.tar"
umoci config --image "$oci:$tag" --created "$created" --author gpu-operator --os linux --architecture "$arch" \
  --no-history --config.user 65532:65532 --config.workingdir / \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env LANG=C.UTF-8 --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
  --config.env HOME=/tmp --config.cmd gpu-operator --config.cmd --help \
  --config.label "org.opencontainers.image.title=gpu-operator" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0" \
  --config.label "org.opencontainers.image.version=$tag" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.created=$created"
umoci gc --layout "$oci"
digest=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$oci/index.json")

# --- 4. outputs -------------------------------------------------------------------------------
out_dir=${IMAGE_OUT:-dist}
mkdir -p "$out_dir"
out=$out_dir/$base_name
rm -f "$out".oci.tar "$out".docker.tar
# the OCI archive is the layout umoci wrote, archived with fixed metadata
tar --create --file "$out.oci.tar" --directory "$oci" --sort=name --numeric-owner --owner=0 --group=0 \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$SOURCE_DATE_EPOCH" oci-layout index.json blobs
skopeo copy --quiet "oci:$oci:$tag" "docker-archive:$out.docker.tar:$ref" >&2
echo "$digest" > "$out.digest"
"$py" tools/image/sbom.py --rootfs "$rootfs" --name "$name" --version "$tag" --digest "$digest" \
  --created "$created" > "$out.sbom.cdx.json"
compressed=$(stat -c %s "$out.oci.tar")
say "image $ref ($arch)"
say "digest $digest"
say "size $((size / 1000000)) MB uncompressed (layer), $((compressed / 1000000)) MB as OCI archive"
say "wrote $out.oci.tar $out.docker.tar $out.digest $out.sbom.cdx.json"
echo "$digest $size $out.oci.tar $ref"
