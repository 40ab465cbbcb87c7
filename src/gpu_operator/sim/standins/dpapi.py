"""The kubelet's device-plugin API (package v1beta1) as protobuf message classes built at import
from a table (no generated code), and its gRPC method paths.

The messages, fields and numbers are the API's (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1):
the kubelet serves `Registration` on <plugin dir>/kubelet.sock; a plugin serves `DevicePlugin`
on its own socket in the same directory and registers that socket's name.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
REGISTER = f"/{VERSION}.Registration/Register"
PLUGIN_SERVICE = f"{VERSION}.DevicePlugin"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64}
# message -> [(field, number, type)]; "*T" repeated, "map" map<string, string>, other names messages
MESSAGES: dict[str, list[tuple[str, int, str]]] = {
    "Empty": [],
    "DevicePluginOptions": [
        ("pre_start_required", 1, "bool"),
        ("get_preferred_allocation_available", 2, "bool"),
    ],
    "RegisterRequest": [
        ("version", 1, "string"),
        ("endpoint", 2, "string"),
        ("resource_name", 3, "string"),
        ("options", 4, "DevicePluginOptions"),
    ],
    "NUMANode": [("ID", 1, "int64")],
    "TopologyInfo": [("nodes", 1, "*NUMANode")],
    "Device": [("ID", 1, "string"), ("health", 2, "string"), ("topology", 3, "TopologyInfo")],
    "ListAndWatchResponse": [("devices", 1, "*Device")],
    "PreStartContainerRequest": [("devices_ids", 1, "*string")],
    "PreStartContainerResponse": [],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, "*string"),
        ("must_include_deviceIDs", 2, "*string"),
        ("allocation_size", 3, "int32"),
    ],
    "PreferredAllocationRequest": [("container_requests", 1, "*ContainerPreferredAllocationRequest")],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, "*string")],
    "PreferredAllocationResponse": [("container_responses", 1, "*ContainerPreferredAllocationResponse")],
    "ContainerAllocateRequest": [("devices_ids", 1, "*string")],
    "AllocateRequest": [("container_requests", 1, "*ContainerAllocateRequest")],
    "CDIDevice": [("name", 1, "string")],
    "Mount": [("container_path", 1, "string"), ("host_path", 2, "string"), ("read_only", 3, "bool")],
    "DeviceSpec": [("container_path", 1, "string"), ("host_path", 2, "string"), ("permissions", 3, "string")],
    "ContainerAllocateResponse": [
        ("envs", 1, "map"),
        ("mounts", 2, "*Mount"),
        ("devices", 3, "*DeviceSpec"),
        ("annotations", 4, "map"),
        ("cdi_devices", 5, "*CDIDevice"),
    ],
    "AllocateResponse": [("container_responses", 1, "*ContainerAllocateResponse")],
}


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpu_operator_sim/deviceplugin_v1beta1.proto", package=VERSION, syntax="proto3"
    )
    for name, fields in MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind in fields:
            entry = message.field.add(name=field, number=number)
            repeated = kind.startswith("*") or kind == "map"
            entry.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            kind = kind.lstrip("*")
            if kind == "map":
                nested = message.nested_type.add(name=f"{_camel(field)}Entry")
                nested.options.map_entry = True
                nested.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
                nested.field.add(name="value", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
                entry.type, entry.type_name = _F.TYPE_MESSAGE, f".{VERSION}.{name}.{nested.name}"
            elif kind in _SCALARS:
                entry.type = _SCALARS[kind]
            else:
                entry.type, entry.type_name = _F.TYPE_MESSAGE, f".{VERSION}.{kind}"
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message(name: str) -> Any:
    """The message class `name` of the API (e.g. message("AllocateResponse"))."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{VERSION}.{name}"))
