"""What a support bundle must not carry: credentials. Pure functions over API objects and text.

Rules, in order of strength:
- a Secret is reduced to its name, namespace, type and the names of its keys (never a value);
- an environment variable or ConfigMap key whose name says it holds a credential (token,
  password, secret, API or private key, credentials, auth) has its value replaced;
- in every string left (object fields, logs): JSON Web Tokens, `Bearer ...` values, the
  `"auth"` of a Docker config, `password=...`-style assignments and PEM private keys are replaced.
`managedFields` and `last-applied-configuration` are dropped (noise, and a copy of the spec).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"
SENSITIVE_NAME = re.compile(r"(TOKEN|PASSW(OR)?D|SECRET|CREDENTIAL|API_?KEY|PRIVATE_?KEY|AUTH|\.tok$)", re.I)
_PATTERNS = (
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),  # a JWT
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\g<1>{REDACTED}"),
    (re.compile(r'("auth"\s*:\s*")[^"]+(")'), rf"\g<1>{REDACTED}\g<2>"),
    (re.compile(r"(?i)\b((?:password|passwd|token|secret|api[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]+"),
     rf"\g<1>{REDACTED}"),
    (re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----", re.S), REDACTED),
)
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def text(value: str) -> str:
    """A string with every credential-looking part replaced."""
    for pattern, replacement in _PATTERNS:
        value = pattern.sub(replacement, value)
    return value


def secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret as a bundle may show it: no value, not even encoded."""
    meta = obj.get("metadata") or {}
    keys = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
    return {"name": meta.get("name"), "namespace": meta.get("namespace"), "type": obj.get("type"), "keys": keys}


def _env(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        if isinstance(item, dict) and "value" in item and SENSITIVE_NAME.search(str(item.get("name", ""))):
            item = {**item, "value": REDACTED}
        out.append(item)
    return out


def _walk(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, k) for k, v in value.items() if k != "managedFields" and k not in DROPPED_ANNOTATIONS}
    if isinstance(value, list):
        items = _env(value) if key == "env" else value
        return [_walk(v) for v in items]
    if isinstance(value, str):
        return text(value)
    return value


def obj(value: dict[str, Any]) -> dict[str, Any]:
    """Any API object, ready for a bundle (Secrets reduced, credentials replaced)."""
    if value.get("kind") == "Secret":
        return secret(value)
    out: dict[str, Any] = _walk(value)
    if value.get("kind") == "ConfigMap":
        for field in ("data", "binaryData"):
            data = out.get(field) or {}
            for name in data:
                if SENSITIVE_NAME.search(name):
                    data[name] = REDACTED
    return out
