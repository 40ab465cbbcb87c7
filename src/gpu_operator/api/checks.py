"""Field types with the checks Kubernetes and container runtimes would apply later, applied when a
ClusterPolicy or NVIDIADriver is loaded.

Two kinds of check:
- schema constraints (`Field(max_length=..., pattern=...)`, enums, ranges) go into the generated
  CRD, so the apiserver refuses the object and names the field;
- checks a structural schema cannot express cheaply (label keys, image references, object names,
  quantities) are pydantic validators: the operator reports the field and the fix in status and
  applies nothing for that object.

Every check refuses only what could never work (an object the apiserver would refuse when the
operator applies it, or an image no runtime can pull). docs/reliability.md lists the cases.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from gpu_operator.vocabulary import LABEL_VALUE_PATTERN  # a Kubernetes fact, shared with the node agents

# -- Kubernetes names and labels (k8s.io/apimachinery/pkg/util/validation) -----------------------
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


def dns_subdomain(value: str) -> str:
    """An object name (ConfigMap, Secret, PriorityClass, RuntimeClass); empty means unset."""
    if value and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
        raise ValueError(
            f"{_short(value)} is not a valid object name: use at most 253 lowercase letters, "
            "digits, '-' and '.', starting and ending with a letter or digit"
        )
    return value


def qualified_key(key: str) -> str:
    """A label or annotation key: optional DNS-subdomain prefix and '/', then a name of <= 63."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(
            f"key {_short(key)}: the prefix before '/' must be a DNS subdomain (e.g. example.com)"
        )
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        raise ValueError(
            f"key {_short(key)} is not a valid label/annotation key: the name part needs 1-63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return key


def _keys(value: dict[str, Any] | None) -> dict[str, Any] | None:
    for key in value or {}:
        qualified_key(key)
    return value


def _short(value: str) -> str:
    return repr(value) if len(value) <= 80 else f"{value[:40]!r}... ({len(value)} characters)"


ObjectName = Annotated[str, AfterValidator(dns_subdomain)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
# Label maps: values in the schema, keys checked on load (a schema cannot constrain map keys).
Labels = Annotated[dict[str, LabelValue], AfterValidator(_keys)]
Annotations = Annotated[dict[str, str], AfterValidator(_keys)]

# -- container images (the distribution reference grammar) --------------------------------------
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
)
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_REPOSITORY = re.compile(rf"^{_NAME}$")
_IMAGE = re.compile(rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$")
_VERSION = re.compile(rf"^(?:{_TAG}|{_DIGEST})$")


# Empty image fields mean "unset" (upstream's Helm chart renders them as "").
def _repository(value: str) -> str:
    if value and not _REPOSITORY.match(value):
        raise ValueError(
            f"{_short(value)} is not an image repository: lowercase registry host and path, "
            "no scheme, tag or spaces (e.g. nvcr.io/nvidia)"
        )
    return value


def _image(value: str) -> str:
    if value and not _IMAGE.match(value):
        raise ValueError(
            f"{_short(value)} is not an image name: lowercase path components, optionally a full "
            "reference with :tag or @sha256:digest (e.g. driver or nvcr.io/nvidia/driver:595.91.07)"
        )
    return value


def _version(value: str) -> str:
    if value and not _VERSION.match(value):
        raise ValueError(
            f"{_short(value)} is not an image tag or digest: letters, digits, '_', '.', '-' "
            "(<= 128, not starting with '.' or '-'), or sha256:<hex>"
        )
    return value


# Lengths: a reference's name is at most 255 characters, a tag 128, a digest ~135.
ImageRepository = Annotated[str, Field(max_length=255), AfterValidator(_repository)]
ImageName = Annotated[str, Field(max_length=512), AfterValidator(_image)]
ImageVersion = Annotated[str, Field(max_length=160), AfterValidator(_version)]

# -- other values the apiserver would refuse in a pod spec ---------------------------------------
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_PERCENT = re.compile(r"^(\d+)%$")


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"{_short(value)} is not a resource quantity (e.g. 500m, 2, 1Gi)")
    return value


def _int_or_percent(value: Any) -> Any:
    if isinstance(value, str):
        found = _PERCENT.match(value)
        if not value.isdigit() and (not found or int(found.group(1)) > 100):
            raise ValueError(f"{_short(value)} is neither a number nor a percentage from 0% to 100%")
    return value


def _absolute(value: str) -> str:
    if value and (not value.startswith("/") or "\0" in value):
        raise ValueError(f"{_short(value)} is not an absolute path (it must start with '/')")
    return value


def _env_name(value: str) -> str:
    if not value or "=" in value or not value.isprintable() or not value.isascii():
        raise ValueError(f"{_short(value)} is not an environment variable name: printable ASCII without '='")
    return value


Quantity = Annotated[int | str, AfterValidator(_quantity)]
IntOrPercent = Annotated[int | str, AfterValidator(_int_or_percent)]
NumberOrPercent = Annotated[str, AfterValidator(_int_or_percent)]  # upstream types some as strings
AbsolutePath = Annotated[str, AfterValidator(_absolute)]
EnvName = Annotated[str, AfterValidator(_env_name)]
Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[int, Field(ge=0)]
