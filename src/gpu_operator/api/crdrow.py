"""What `gpu-operator crds generate` (api/crdgen.py) needs of one of our kinds beyond its module's
GROUP, VERSION, KIND, PLURAL (and SHORT_NAMES): a module under api/ that sets `CRD = CRDRow(...)` is
one of ours, and its CRD file is generated with no other edit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

Column = Literal["Status", "Default", "Age"]  # printer columns: .status.state, .spec.default, age


@dataclass(frozen=True)
class CRDRow:
    spec: type[BaseModel]
    status: type[BaseModel]  # its status subresource
    columns: tuple[Column, ...] = ("Status", "Age")
    rules: tuple[dict[str, str], ...] = ()  # CEL rules on the object (x-kubernetes-validations)
