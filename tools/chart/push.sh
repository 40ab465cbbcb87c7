#!/usr/bin/env bash
# Pushes a release to an OCI registry: our image (dist/gpu-operator-<version>.index.oci.tar, the
# multi-arch index of `./dev image --arch all`, else dist/gpu-operator-<version>.oci.tar) with
# skopeo --all --preserve-digests, so the digest `./dev chart` pinned names the same image there,
# and the chart package (dist/charts/gpu-operator-<version>.tgz) with `helm push`, which uploads its
# provenance (.prov, `./dev chart --sign`) with it; each image's SBOM (`./dev image`) is attached
# as an OCI referrer of its manifest (attach_sbom.py). `./dev release` runs it after image and chart.
#
#   tools/chart/push.sh REGISTRY [--ca-file CA] [--creds-file FILE] [--dist DIR] [--charts DIR]
#     REGISTRY      host[:port][/path]: the image goes to REGISTRY/gpu-operator-py/gpu-operator:<version>,
#                   the chart to oci://REGISTRY/charts/gpu-operator:<version>
#     --ca-file     the registry's CA (PEM) when no public CA signed its certificate
#     --creds-file  a file holding USER:PASSWORD for the registry: skopeo and helm read it as an
#                   auth file of this run (--dest-authfile, --registry-config), never from a command
#                   line, and nothing is stored in the user's own registry logins
#     --sign-image KEY --keyring SECRING [--passphrase-file F]: sign the image (skopeo --sign-by:
#                   containers' simple signing with that OpenPGP key, the one `./dev chart --sign`
#                   uses); the signatures are written under --signatures DIR (default DIST/signatures),
#                   the lookaside directory users read them from (tools/chart/verify_image.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
fail() { echo "push: $*" >&2; exit 2; }

registry=${1:-}; [ -n "$registry" ] && [ "${registry#-}" = "$registry" ] \
  || fail "usage: tools/chart/push.sh REGISTRY [--ca-file CA] [--creds-file FILE] [--dist DIR] [--charts DIR]"
shift
ca="" creds="" dist="$repo/dist" charts="" sign="" keyring="" passphrase="" signatures=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ca-file) ca=${2:?--ca-file needs a file}; shift 2 ;;
    --creds-file) creds=${2:?--creds-file needs a file}; shift 2 ;;
    --dist) dist=${2:?--dist needs a directory}; shift 2 ;;
    --charts) charts=${2:?--charts needs a directory}; shift 2 ;;
    --sign-image) sign=${2:?--sign-image needs a key name}; shift 2 ;;
    --keyring) keyring=${2:?--keyring needs a secret keyring file}; shift 2 ;;
    --passphrase-file) passphrase=${2:?--passphrase-file needs a file}; shift 2 ;;
    --signatures) signatures=${2:?--signatures needs a directory}; shift 2 ;;
    *) fail "unknown option $1" ;;
  esac
done
charts=${charts:-$dist/charts}
signatures=${signatures:-$dist/signatures}
[ -z "$sign" ] || [ -f "$keyring" ] || fail "--sign-image needs --keyring SECRING (a secret keyring file, gpg --export-secret-keys)"
[ -z "$ca" ] || [ -f "$ca" ] || fail "--ca-file $ca: no such file"
[ -z "$creds" ] || [ -f "$creds" ] || fail "--creds-file $creds: no such file"
version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$repo/deployments/gpu-operator/Chart.yaml")
image=$dist/gpu-operator-$version.index.oci.tar
[ -f "$image" ] || image=$dist/gpu-operator-$version.oci.tar
[ -f "$image" ] || fail "$image is missing: run ./dev image first"
chart=$charts/gpu-operator-$version.tgz
[ -f "$chart" ] || fail "$chart is missing: run ./dev chart first"
helm=${GPU_OPERATOR_HELM:-helm}

skopeo_global=() skopeo_args=() helm_tls=() helm_auth=()
private=$(umask 077 && mktemp -d); trap 'rm -rf "$private"' EXIT  # the CA directory, the auth file
if [ -n "$ca" ]; then
  certs=$private/certs; mkdir "$certs"
  cp "$ca" "$certs/ca.crt"  # skopeo reads a directory: *.crt are CAs
  skopeo_args+=(--dest-cert-dir "$certs"); helm_tls+=(--ca-file "$ca")
fi
if [ -n "$creds" ]; then  # USER:PASSWORD as a containers/docker auth file (base64, as docker login writes it)
  (umask 077 && printf '{"auths": {"%s": {"auth": "%s"}}}\n' "${registry%%/*}" \
    "$(tr -d '\n' < "$creds" | base64 -w0)" > "$private/auth.json")
  skopeo_args+=(--dest-authfile "$private/auth.json"); helm_auth+=(--registry-config "$private/auth.json")
fi
ref=$registry/gpu-operator-py/gpu-operator:$version
if [ -n "$sign" ]; then
  # skopeo signs through GnuPG: the key imported into a GnuPG home of its own (never the user's),
  # and a registries.d whose lookaside-staging is where the signatures are written
  work=$(mktemp -d); trap 'gpgconf --kill gpg-agent; rm -rf "$work" "$private"' EXIT
  mkdir -m 700 "$work/gnupg" "$work/registries.d"; mkdir -p "$signatures"
  export GNUPGHOME=$work/gnupg
  gpg --batch --quiet --import "$keyring" 2>/dev/null || fail "--keyring $keyring: gpg cannot import it"
  fpr=$(gpg --batch --with-colons --list-secret-keys -- "$sign" 2>/dev/null | awk -F: '$1 == "fpr" {print $10; exit}')
  [ -n "$fpr" ] || fail "--sign-image $sign: no secret key of that name in --keyring $keyring"
  printf 'docker:\n  "%s":\n    lookaside-staging: file://%s\n' "$registry" "$(cd "$signatures" && pwd)" \
    > "$work/registries.d/release.yaml"
  skopeo_global+=(--registries.d "$work/registries.d")
  skopeo_args+=(--sign-by "$fpr" ${passphrase:+--sign-passphrase-file "$passphrase"})
fi
skopeo "${skopeo_global[@]}" copy --quiet --all --preserve-digests "${skopeo_args[@]}" "oci-archive:$image" "docker://$ref"
echo "push: image $ref from $(basename "$image")" >&2
[ -z "$sign" ] || echo "push: image signed by $sign ($fpr), signatures in $signatures" >&2
# the SBOM of each platform's image as an OCI referrer of its manifest (tools/chart/attach_sbom.py)
py=${PYTHON:-$repo/.venv/bin/python}; [ -x "$py" ] || py=python3
"$py" "$here/attach_sbom.py" "$registry" gpu-operator-py/gpu-operator "$image" ${ca:+--ca-file "$ca"} \
  ${creds:+--creds-file "$creds"} | while read -r manifest sbom; do
  echo "push: SBOM $sbom attached to $manifest" >&2
done
"$helm" push "$chart" "oci://$registry/charts" "${helm_tls[@]}" "${helm_auth[@]}" >&2
[ -f "$chart.prov" ] && echo "push: chart with its provenance $(basename "$chart").prov" >&2
echo "oci://$registry/charts/gpu-operator"
