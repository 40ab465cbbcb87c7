#!/usr/bin/env bash
# Verifies that our image in a registry carries a signature by a key the user trusts: containers'
# simple signing, as `./dev release --sign` (tools/chart/push.sh --sign-image) writes it. The check
# is skopeo's own policy engine with a policy that rejects anything not signedBy a key in --key,
# the same policy.json and registries.d that podman and CRI-O enforce when they pull.
#
#   tools/chart/verify_image.sh REF --key PUBRING --signatures DIR|URL [--ca-file CA] [--creds-file F]
#     REF           HOST[:PORT]/PATH/gpu-operator-py/gpu-operator:TAG, as pushed
#     --key         the publisher's public keyring (gpg --export KEY > PUBRING)
#     --signatures  the lookaside where the signatures are kept: the release's signatures/
#                   directory, or an https:// URL serving it
#     --ca-file, --creds-file  the registry's CA and a file holding USER:PASSWORD (handed to
#                   skopeo in an auth file of its own, never on a command line)
# The tag is resolved to its manifest's digest once, and that digest is what is verified and
# printed (skopeo copies REPOSITORY@DIGEST under the policy): a tag that moves meanwhile cannot
# make the line name an image other than the one checked.
# Exit 0 and one line when verified; 1 and a line naming what to fix when not.
set -euo pipefail
fail() { echo "verify: $*" >&2; exit 2; }
usage="usage: tools/chart/verify_image.sh REF --key PUBRING --signatures DIR|URL [--ca-file CA] [--creds-file F]"
ref=${1:-}; [ -n "$ref" ] && [ "${ref#-}" = "$ref" ] || fail "$usage"
shift
key="" signatures="" ca="" creds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --key) key=${2:?--key needs a public keyring file}; shift 2 ;;
    --signatures) signatures=${2:?--signatures needs a directory or URL}; shift 2 ;;
    --ca-file) ca=${2:?--ca-file needs a file}; shift 2 ;;
    --creds-file) creds=${2:?--creds-file needs a file}; shift 2 ;;
    *) fail "unknown option $1; $usage" ;;
  esac
done
[ -f "$key" ] || fail "--key: a public keyring file is required (gpg --export KEY > PUBRING)"
[ -n "$signatures" ] || fail "--signatures: the directory or https:// URL holding the signatures is required"
case "$signatures" in
  https://*|http://*) lookaside=$signatures ;;
  *) [ -d "$signatures" ] || fail "--signatures $signatures: no such directory"
     lookaside=file://$(cd "$signatures" && pwd) ;;
esac
case "$ref" in *@sha256:*) repository=${ref%@*} ;; *) repository=${ref%:*} ;; esac
host=${ref%%/*}; path=${repository#*/}
[ -z "$creds" ] || [ -f "$creds" ] || fail "--creds-file $creds: no such file"

work=$(umask 077 && mktemp -d); trap 'rm -rf "$work"' EXIT
read_args=() copy_args=()
if [ -n "$ca" ]; then
  mkdir "$work/certs"; cp "$ca" "$work/certs/ca.crt"
  read_args+=(--cert-dir "$work/certs"); copy_args+=(--src-cert-dir "$work/certs")
fi
if [ -n "$creds" ]; then  # USER:PASSWORD as a containers auth file (base64, as docker login writes it)
  (umask 077 && printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$host" "$(tr -d '\n' < "$creds" | base64 -w0)" \
    > "$work/auth.json")
  read_args+=(--authfile "$work/auth.json"); copy_args+=(--src-authfile "$work/auth.json")
fi
mkdir "$work/registries.d"
printf 'docker:\n  "%s":\n    lookaside: %s\n' "$host" "$lookaside" > "$work/registries.d/verify.yaml"
cat > "$work/policy.json" <<EOF
{"default": [{"type": "reject"}],
 "transports": {"docker": {"$repository": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "$(realpath "$key")"}]}}}
EOF

if ! skopeo inspect --raw "${read_args[@]}" "docker://$ref" > "$work/manifest" 2> "$work/err"; then
  sed 's/^/skopeo: /' "$work/err" >&2
  echo "verify: $ref: the registry gave no manifest (above): check REF, --ca-file and --creds-file" >&2
  exit 1
fi
digest=sha256:$(sha256sum < "$work/manifest" | cut -d' ' -f1)
if skopeo --policy "$work/policy.json" --registries.d "$work/registries.d" copy --quiet "${copy_args[@]}" \
     "docker://$repository@$digest" "dir:$work/image" 2> "$work/err"; then
  echo "verify: $ref ($digest) is signed by a key in $key"
  exit 0
fi
sed 's/^/skopeo: /' "$work/err" >&2
# which fix: a signature for this digest in the lookaside (signature-1 is the first one skopeo writes)
first="$lookaside/$path@sha256=${digest#sha256:}/signature-1"
case "$first" in
  file://*) [ -f "${first#file://}" ] && signed=1 || signed=0 ;;
  *) curl -fsI ${ca:+--cacert "$ca"} "$first" > /dev/null && signed=1 || signed=0 ;;
esac
if [ "$signed" = 1 ]; then
  echo "verify: $ref ($digest) is signed, but by no key in --key $key: use the publisher's public key (gpg --export KEY > PUBRING)" >&2
else
  echo "verify: $ref ($digest) has no signature in --signatures $signatures: push it signed (./dev release --sign KEY --keyring SECRING), or point --signatures at its publisher's signatures" >&2
fi
exit 1
