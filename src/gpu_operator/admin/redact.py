"""What a support bundle must not carry: credentials. Pure functions over API objects and text.

Rules, structured where the object is structured, by pattern where it is text:
- a Secret is reduced to its name, namespace, type and the names of its keys (never a value);
- a value whose name says it holds a credential has it replaced: an environment variable by its
  `name` (`*TOKEN*`, `*PASSWORD*`/`*PASSWD*`, `*SECRET*`, `*CREDENTIAL*`, `*AUTH*`, `*_KEY`,
  `*API_KEY*`, `*PRIVATE_KEY*`, `*ACCESS_KEY*`), a ConfigMap key, an annotation or label, or any
  other field holding a string (`password: ...` in a custom resource), except names that hold a
  reference, not the credential (`secretName`, `tokenSecretRef`, `credentialsFile`, ...);
- an argument list's `--token X` / `--password X` / `--api-key X` ...: the value after the flag;
- in every string left (object fields, logs, events) the patterns below are replaced: URL
  credentials (`scheme://user:PASSWORD@host`: the user stays), `Authorization:` values (Basic,
  Bearer, ...), JSON Web Tokens, Docker config `auth`/`identitytoken`/`registrytoken` fields,
  netrc `password`, `--token=X`/`--token X` arguments, `NAME=value`/`name: value` assignments
  whose name is a credential's, AWS access key ids (AKIA.../ASIA...) and PEM private keys.
`managedFields` and `last-applied-configuration` are dropped (noise, and a copy of the spec).
What is not a credential stays readable: taint and toleration keys (`key: nvidia.com/gpu`), the
names of Secrets, proxy hosts and ports, a user name in a URL, `--token-file PATH`,
`--password-stdin`.
"""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "<redacted>"
_WORDS = r"passw(?:or)?d|token|secret|credentials?|auth|api[_-]?key|private[_-]?key|access[_-]?key"
# A name (env var, ConfigMap key, annotation, field) whose value is a credential.
SENSITIVE_NAME = re.compile(rf"({_WORDS}|[_.-]key(?:$|[_.-]id$)|\.tok$)", re.I)  # `key` alone: a taint's
# ... unless the name says the value only points at one (a Secret's name, a file, a path, a flag).
_REFERENCE = re.compile(
    r"(name|names|ref|refs|file|files|path|dir|secrets|env|mode|type|method|enabled|_?configmap|seconds|ttl|"
    r"expiration|audiences?|stdin)$|^(automount|use|enable|disable|tokenizer)",
    re.I,
)

# A flag whose next argument is a credential (`--token X`); `--token-file`, `--password-stdin`
# end in another word, so they are not.
SENSITIVE_FLAG = re.compile(
    r"^--?(?:[\w-]*[_-])?(?:passw(?:or)?d|token|secret|api-?key|access-key|secret-key|private-key|creds|"
    r"credentials|identity-token|registry-token)$",
    re.I,
)
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s"',;&}]+)"""  # a quoted or bare value
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys, whole block
    (re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----", re.S), REDACTED),
    # URL credentials: scheme://user:password@host (the user stays); scheme://TOKEN@host when it
    # is token-sized (16+ characters: `git@`, `user@` stay)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/?#@:\"'<>]*:)[^\s/?#\"'<>]+(@)"), rf"\g<1>{REDACTED}\g<2>"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[A-Za-z0-9._~%+-]{16,}(@)"), rf"\g<1>{REDACTED}\g<2>"),
    # Authorization / Proxy-Authorization header values, whatever the scheme
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
            r"(?:(?:basic|bearer|digest|negotiate|token|aws4-hmac-sha256)\s+)?)[^\s\"',;]+"
        ),
        rf"\g<1>{REDACTED}",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\g<1>{REDACTED}"),
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),  # a JWT
    # AWS access key ids
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"), REDACTED),
    # netrc: `machine H login U password P` (one line or several), `password P` opening a line
    (
        re.compile(
            r"(?i)(\b(?:machine|login|default)\s+\S+\s+(?:(?:login|account)\s+\S+\s+)*password\s+)"
            r"[^\s\"'\\]+"
        ),
        rf"\g<1>{REDACTED}",
    ),
    (re.compile(r"(?im)^(\s*(?:password|passwd|account)\s+)(?![:=])[^\s\"'\\]+"), rf"\g<1>{REDACTED}"),
    # arguments: --token=X, --token X, --registry-password X (not --token-file, --password-stdin)
    (
        re.compile(
            r"(?i)(--(?:[\w-]*[_-])?(?:passw(?:or)?d|token|secret|api-?key|access-key|secret-key|private-key|"
            rf"creds|credentials|identity-token|registry-token)(?:=|\s+))(?!-)({_VALUE})"
        ),
        rf"\g<1>{REDACTED}",
    ),
    # assignments: NAME=value, name: value, "name": "value" where the name is a credential's
    # (Docker config's auth/identitytoken, aws_secret_access_key, *_KEY, *TOKEN*, ...)
    (
        re.compile(
            r"(?i)((?<![\w.-])[\"']?[\w.-]*?(?:" + _WORDS + r"|identitytoken|registrytoken|[_.-]key)"
            r"(?:[_.-][A-Za-z0-9]+)*[\"']?\s*[:=]\s*)(?![\s\"']*<redacted>)(" + _VALUE + ")"
        ),
        "<assign>",
    ),
)


def _assignment(match: re.Match[str]) -> str:
    head, value = match.group(1), match.group(2)
    name = head.strip().rstrip(":=").strip().strip("\"'")
    if (
        _REFERENCE.search(name)
        or not value
        or value in ("true", "false", "null", "[]", "{}", "|", ">", "[", "{")
    ):
        return match.group(0)
    if value[0] in "\"'":
        return f"{head}{value[0]}{REDACTED}{value[0]}"
    return f"{head}{REDACTED}"


def text(value: str) -> str:
    """A string with every credential-looking part replaced."""
    for pattern, replacement in _PATTERNS:
        if replacement == "<assign>":
            value = pattern.sub(_assignment, value)
        else:
            value = pattern.sub(replacement, value)
    return value


def sensitive(name: str) -> bool:
    """Whether a field, variable, key or annotation of this name holds a credential itself."""
    return bool(SENSITIVE_NAME.search(name)) and not _REFERENCE.search(name)


def secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret as a bundle may show it: no value, not even encoded."""
    meta = obj.get("metadata") or {}
    keys = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "type": obj.get("type"),
        "keys": keys,
    }


def _env(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        if isinstance(item, dict) and "value" in item and sensitive(str(item.get("name", ""))):
            item = {**item, "value": REDACTED}
        out.append(item)
    return out


def _args(items: list[Any]) -> list[Any]:
    """An argument list with the value after each credential flag (`--token`, `X`) replaced."""
    out = list(items)
    for i, item in enumerate(items[:-1]):
        if isinstance(item, str) and SENSITIVE_FLAG.match(item) and isinstance(items[i + 1], str):
            out[i + 1] = REDACTED
    return out


def _walk(value: Any, key: str = "") -> Any:
    if isinstance(value, dict) and key in ("annotations", "labels"):
        return mapping(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if k == "managedFields" or k in DROPPED_ANNOTATIONS:
                continue
            if isinstance(k, str) and sensitive(k) and v and isinstance(v, str):
                out[k] = REDACTED
            elif (
                isinstance(k, str)
                and sensitive(k)
                and isinstance(v, list)
                and all(isinstance(i, str) for i in v)
            ):
                out[k] = [REDACTED for _ in v]
            else:
                out[k] = _walk(v, k)
        return out
    if isinstance(value, list):
        items = _env(value) if key == "env" else _args(value)
        return [_walk(v) for v in items]
    if isinstance(value, str):
        return text(value)
    return value


DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def obj(value: dict[str, Any]) -> dict[str, Any]:
    """Any API object, ready for a bundle (Secrets reduced, credentials replaced). A ConfigMap's
    data and an object's labels and annotations are judged by key name first, then as text."""
    if value.get("kind") == "Secret":
        return secret(value)
    out: dict[str, Any] = _walk(value)
    if value.get("kind") == "ConfigMap":
        for field in ("data", "binaryData"):
            data = out.get(field) or {}
            for name in data:
                if SENSITIVE_NAME.search(
                    name
                ):  # a file named like a credential: even `*.tok`, `*-secret.yaml`
                    data[name] = REDACTED
    return out


def mapping(values: dict[str, Any]) -> dict[str, Any]:
    """Labels or annotations: a credential-named key's value replaced, a value that is JSON
    redacted as the structure it is, every other value as text."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k in DROPPED_ANNOTATIONS:
            continue
        out[k] = REDACTED if isinstance(v, str) and v and sensitive(k) else json_text(v)
    return out


def json_text(value: Any) -> Any:
    """A string that may be JSON (a probe's facts, an annotation): redacted as the structure it
    is where it parses, as text where not; formatting as it came."""
    if not isinstance(value, str):
        return _walk(value)
    if value.lstrip()[:1] in ("{", "["):
        try:
            parsed = json.loads(value)
        except ValueError:
            return text(value)
        return json.dumps(_walk(parsed), separators=(",", ":"))
    return text(value)
