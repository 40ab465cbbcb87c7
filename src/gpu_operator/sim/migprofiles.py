"""The MIG profiles of the GPU models our shapes have, as NVML reports them, and the check a
layout must pass on such a GPU (what the driver refuses when mig-parted creates the instances).

Facts (read for facts only):
- NVIDIA/go-nvml pkg/nvml/mock/gpus/h100.go (as vendored by NVIDIA/mig-parted v0.15.0), the H100
  SXM5 80GB (PCI device 0x2330): its GPU instance profiles (name, slice count, how many fit,
  multiprocessors, copy engines, decoders, encoders, JPEG and OFA engines, memory in MB) and their
  placements (start slot and size on the 7 compute slots).
- NVIDIA's MIG user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide, "H100 MIG profiles"):
  an H100 80GB has 8 memory slices; 1g.10gb takes 1, 1g.20gb and 2g.20gb 2, 3g.40gb and 4g.40gb 4,
  7g.80gb all 8. A layout fits when each instance has a free placement and the memory slices last.
- The GPU instance IDs NVML gives by placement (7g: 0; 3g/4g at slot 0: 1, 3g at slot 4: 2; 2g at
  slot 0/2/4: 3/4/5; 1g at slot s: 7+s), as `nvidia-smi mig -lgi` shows them on A100/H100; one
  compute instance (ID 0) spans each GPU instance, as mig-parted creates them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str  # NVML's profile name, e.g. 1g.10gb, 1g.10gb+me
    slices: int  # compute slices (GPU instance slice count)
    memory_slices: int
    max_count: int  # instances of this profile that fit on one GPU
    memory_mb: int
    multiprocessors: int
    copy: int
    decoder: int
    encoder: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]  # placement start slots (each `slices` wide)

    @property
    def resource_suffix(self) -> str:
        """The profile as NVIDIA's device plugin and GFD spell it in names: `+` becomes `.`."""
        return self.name.replace("+", ".")


@dataclass(frozen=True)
class Model:
    name: str
    compute_slots: int
    memory_slices: int
    profiles: tuple[Profile, ...]

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)


_H100_80GB = Model("NVIDIA H100 80GB HBM3", 7, 8, (
    Profile("1g.10gb", 1, 1, 7, 10240, 16, 1, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
    Profile("1g.10gb+me", 1, 1, 1, 10240, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    Profile("1g.20gb", 1, 2, 4, 20480, 16, 1, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
    Profile("2g.20gb", 2, 2, 3, 20480, 32, 2, 1, 0, 0, 0, (0, 2, 4)),
    Profile("3g.40gb", 3, 4, 2, 40960, 48, 3, 2, 0, 0, 0, (0, 4)),
    Profile("4g.40gb", 4, 4, 1, 40960, 64, 4, 2, 0, 0, 0, (0,)),
    Profile("7g.80gb", 7, 8, 1, 81920, 112, 7, 5, 0, 0, 0, (0,)),
))

# PCI device ID (lower-case hex, vendor 10de) -> the model's MIG profiles
MODELS: dict[str, Model] = {"2330": _H100_80GB}


def model(device_id: str) -> Model | None:
    """The MIG profiles of PCI device `device_id` (e.g. "2330" or "0x233010DE"); None: not MIG-capable
    here (no profiles known)."""
    key = device_id.lower().removeprefix("0x")
    if len(key) == 8 and key.endswith("10de"):
        key = key[:4]
    return MODELS.get(key)


def gi_id(profile: Profile, start: int) -> int:
    """The GPU instance ID NVML gives an instance of `profile` placed at `start`."""
    if profile.slices == 7:
        return 0
    if profile.slices in (3, 4):
        return 1 if start == 0 else 2
    if profile.slices == 2:
        return 3 + start // 2
    return 7 + start


class LayoutError(ValueError):
    """A layout does not fit the GPU; the message says which profile and why."""


def place(m: Model, wanted: dict[str, int]) -> list[tuple[Profile, int]]:
    """Placements (profile, start slot) for `wanted` {profile name: count} on a GPU of model `m`,
    largest instances first; LayoutError when a profile is unknown to the model, asked for more
    times than fit, or the instances together do not fit the slots or the memory slices."""
    items: list[Profile] = []
    for name, count in wanted.items():
        profile = m.profile(name)
        if profile is None:
            known = ", ".join(p.name for p in m.profiles)
            raise LayoutError(f"MIG profile {name!r} does not exist on {m.name} (its profiles: {known})")
        if count > profile.max_count:
            raise LayoutError(f"{count} x {name} on {m.name}: at most {profile.max_count} fit")
        items.extend([profile] * count)
    memory = sum(p.memory_slices for p in items)
    if memory > m.memory_slices:
        raise LayoutError(f"{_describe(wanted)} needs {memory} memory slices; {m.name} has {m.memory_slices}")
    items.sort(key=lambda p: (-p.slices, -p.memory_slices, p.name))
    used = [False] * m.compute_slots
    out: list[tuple[Profile, int]] = []

    def fit(i: int) -> bool:
        if i == len(items):
            return True
        profile = items[i]
        for start in profile.starts:
            span = range(start, min(start + profile.slices, m.compute_slots))
            if any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            out.append((profile, start))
            if fit(i + 1):
                return True
            out.pop()
            for s in span:
                used[s] = False
        return False

    if not fit(0):
        raise LayoutError(f"{_describe(wanted)} does not fit the {m.compute_slots} compute slices of {m.name}")
    return out


def _describe(wanted: dict[str, int]) -> str:
    return ", ".join(f"{n} x {p}" for p, n in wanted.items())
