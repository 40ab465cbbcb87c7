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
- The other models' profiles: NVIDIA/go-nvml pkg/nvml/mock/shared/gpus/a100.go (A100-SXM4-40GB,
  PCI 0x20B0, and -80GB, 0x20B2: name, count, multiprocessors, engines, memory, placements) and
  b200.go (B200: the same per-profile facts; its device ID there, 0x2B00, is the Jetson Thor's in
  the PCI ID database, which gives the B200 0x2901 and the GB200 0x2941). NVIDIA's MIG user guide
  ("A100 MIG profiles", "B200 MIG profiles", "GB200 MIG profiles") for the names and how many fit:
  A100 40GB 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; A100 80GB the H100's
  names; B200 1g.23gb, 1g.23gb+me, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb; GB200 1g.23gb,
  1g.23gb+me, 1g.47gb, 2g.47gb, 3g.93gb, 4g.93gb, 7g.186gb (no mock: its engines taken as the B200's,
  the same GB100 die; its memory the profile name's GiB). Every one of them has 7 compute slots and
  8 memory slices, with the H100's placements.
- The GPU instance IDs NVML gives by placement (7g: 0; 3g/4g at slot 0: 1, 3g at slot 4: 2; 2g at
  slot 0/2/4: 3/4/5; 1g at slot s: 7+s), as `nvidia-smi mig -lgi` shows them on A100/H100; on a GPU
  of 4 compute slots (A30, RTX PRO 6000) 4g: 0, 2g at slot 0/2: 1/2, 1g at slot s: 3+s, as
  `nvidia-smi mig -lgi` shows them on an A30 (1g.6gb at 0..3: 3..6, 2g.12gb at 2: 2) and on an RTX
  PRO 6000 (1g.24gb: 3..6, 2g.48gb at 0: 1); one compute instance (ID 0) spans each GPU instance,
  as mig-parted creates them.
- The RTX PRO 6000 Blackwell Server Edition (GB202, compute capability 12.0, 96GB, PCI device 0x2BB5;
  all its editions have the same profiles), the first model whose profiles carry NVML's attribute
  suffixes (`+gfx` graphics, `+me` / `+me.all` media extensions, `-me` none), which NVIDIA's device
  plugin v0.20 advertises as resources of their own (`migresources`). NVIDIA/mig-parted's config
  builder test (pkg/mig/builder/builder_test.go, `gpuProfiles["RTX-PRO-6000"]`, device 0x2BB510DE):
  4 compute slots and the profiles with how many fit: 1g.24gb 4, 1g.24gb+me 1, 1g.24gb+gfx 4,
  1g.24gb+me.all 1, 1g.24gb-me 4, 2g.48gb 2, 2g.48gb+gfx 2, 2g.48gb+me.all 1, 2g.48gb-me 2, 4g.96gb 1,
  4g.96gb+gfx 1. NVIDIA's MIG user guide: "Supported GPUs" (the model, GB202, 12.0, 96GB, at most
  4 instances), "Getting Started with MIG" (MIG needs driver R575, >= 575.51.03) and "Supported MIG
  Profiles", the RTX PRO 6000 table: per profile the NVDEC, NVENC, JPEG and OFA engines (1g 1/1/1/0,
  +me 1/1/1/1, +gfx as the plain profile, +me.all 4/4/4/1, -me none; 2g 2/2/2/0, 2g +me.all
  4/4/4/1; 4g 4/4/4/1) and copy engines (1, 2, 4). Multiprocessors (46, 94, 188), the GPU instance
  profile IDs (1g.24gb 14, +me 21, +gfx 47, +me.all 65, -me 67; 2g.48gb 5, +gfx 35, +me.all 64,
  -me 66; 4g.96gb 0, +gfx 32) and memory (23.62, 47.38 and 95.12 GiB) as `nvidia-smi mig -lgip`
  prints them on the Server Edition (published captures of its output, not an NVIDIA document; the
  GPU instance IDs above from the same captures of `-lgi`); memory_mb is those GiB read as eighths
  (24192 MiB = 23.625 GiB, what CUDA reports for a 1g.24gb device; 48512 = 47.375; 97408 = 95.125).
  Assumptions (no NVIDIA source states them): 4 memory slices, one per compute slot (1g takes 1,
  2g 2, 4g 4); placements on the compute slots (1g at 0..3, 2g at 0 and 2, 4g at 0), where NVML
  counts placements in finer units (`nvidia-smi mig -lgipp` prints {0,3,6,9}:3, {0,6}:6, {0}:12), so
  a MIG device's placement start here (and in the DRA driver's device names, `dramig`) is the
  compute slot, not NVML's unit; the instances of one GPU share its media engines, the 4g
  profile's 4 NVDEC, 4 NVENC, 4 JPEG and 1 OFA (+me.all takes them all), so at most one +me or
  +me.all instance fits a GPU and +me.all leaves no engine to an instance that needs one.
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
    # NVML's GPU instance profile ID where the model's table gives it (None: the DRA driver's IDs
    # by the profile's kind, `dramig.GI_PROFILE_IDS`)
    profile_id: int | None = None

    @property
    def resource_suffix(self) -> str:
        """The profile as NVIDIA's device plugin and GFD spell it in names: `+` becomes `.`."""
        return self.name.replace("+", ".")


@dataclass(frozen=True)
class GPUModel:
    name: str
    compute_slots: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    # the decoders, encoders, JPEG and OFA engines the GPU's instances share (None: not checked)
    media: tuple[int, int, int, int] | None = None

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)


_H100_80GB = GPUModel(
    "NVIDIA H100 80GB HBM3",
    7,
    8,
    (
        Profile("1g.10gb", 1, 1, 7, 10240, 16, 1, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        Profile("1g.10gb+me", 1, 1, 1, 10240, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        Profile("1g.20gb", 1, 2, 4, 20480, 16, 1, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        Profile("2g.20gb", 2, 2, 3, 20480, 32, 2, 1, 0, 0, 0, (0, 2, 4)),
        Profile("3g.40gb", 3, 4, 2, 40960, 48, 3, 2, 0, 0, 0, (0, 4)),
        Profile("4g.40gb", 4, 4, 1, 40960, 64, 4, 2, 0, 0, 0, (0,)),
        Profile("7g.80gb", 7, 8, 1, 81920, 112, 7, 5, 0, 0, 0, (0,)),
    ),
)


def _seven_slot(
    name: str,
    sizes: tuple[str, ...],
    memory_mb: tuple[int, ...],
    sms: tuple[int, ...],
    copy: tuple[int, ...],
    decoder: tuple[int, ...],
    encoder: tuple[int, ...],
    jpeg: tuple[int, ...],
) -> GPUModel:
    """A model with the A100/H100/B200 layout of 7 compute slots and 8 memory slices: the profiles
    1g, 1g+me, 1g (2 memory slices), 2g, 3g, 4g, 7g, in that order, with their sizes in the names
    (`sizes`) and per-profile facts in the same order (`jpeg` counts JPEG and OFA engines alike)."""
    shape = (
        (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (1, 2, 4, (0, 1, 2, 3, 4, 5, 6)),
        (2, 2, 3, (0, 2, 4)),
        (3, 4, 2, (0, 4)),
        (4, 4, 1, (0,)),
        (7, 8, 1, (0,)),
    )
    return GPUModel(
        name,
        7,
        8,
        tuple(
            Profile(
                f"{g}g.{size}",
                g,
                mem,
                count,
                memory_mb[i],
                sms[i],
                copy[i],
                decoder[i],
                encoder[i],
                jpeg[i],
                jpeg[i],
                starts,
            )
            for i, ((g, mem, count, starts), size) in enumerate(zip(shape, sizes, strict=True))
        ),
    )


_A100_40GB = _seven_slot(
    "NVIDIA A100-SXM4-40GB",
    ("5gb", "5gb+me", "10gb", "10gb", "20gb", "20gb", "40gb"),
    (4864, 4864, 9856, 9856, 19968, 19968, 40192),
    (14, 14, 14, 28, 42, 56, 98),
    (1, 1, 1, 2, 3, 4, 7),
    (1, 1, 1, 1, 2, 2, 5),
    (0,) * 7,
    (0, 1, 0, 0, 0, 0, 1),
)
_A100_80GB = _seven_slot(
    "NVIDIA A100-SXM4-80GB",
    ("10gb", "10gb+me", "20gb", "20gb", "40gb", "40gb", "80gb"),
    (9856, 9856, 19968, 19968, 40192, 40192, 80384),
    (14, 14, 14, 28, 42, 56, 98),
    (1, 1, 1, 2, 3, 4, 7),
    (1, 1, 1, 1, 2, 2, 5),
    (0,) * 7,
    (0, 1, 0, 0, 0, 0, 1),
)
_B200_ENGINES = dict(
    sms=(18, 18, 18, 36, 54, 72, 126),
    copy=(1, 1, 1, 2, 3, 4, 7),
    decoder=(1, 1, 1, 2, 3, 4, 7),
    encoder=(0, 1, 0, 1, 2, 2, 4),
    jpeg=(0, 1, 0, 1, 2, 2, 4),
)
_B200 = _seven_slot(
    "NVIDIA B200",
    ("23gb", "23gb+me", "45gb", "45gb", "90gb", "90gb", "180gb"),
    (23552, 23552, 46080, 46080, 92160, 92160, 184320),
    **_B200_ENGINES,
)
_GB200 = _seven_slot(
    "NVIDIA GB200",
    ("23gb", "23gb+me", "47gb", "47gb", "93gb", "93gb", "186gb"),
    (23552, 23552, 48128, 48128, 95232, 95232, 190464),
    **_B200_ENGINES,
)


def _four_slot(
    name: str,
    size: int,
    memory_mb: tuple[int, int, int],
    sms: tuple[int, int, int],
    media: tuple[int, int, int, int],
    profiles: tuple[tuple[str, int, int, int, int, int, int], ...],
) -> GPUModel:
    """A model of 4 compute slots and 4 memory slices (1g at slots 0..3, 2g at 0 and 2, 4g at 0) whose
    1g profile holds `size` GB. `profiles`: (g and the attribute suffix, how many fit, NVDEC,
    NVENC, JPEG, OFA, NVML's profile ID); `media`: the engines the instances share."""
    starts = {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)}
    index = {1: 0, 2: 1, 4: 2}
    out = []
    for spec, count, decoder, encoder, jpeg, ofa, profile_id in profiles:
        g = int(spec[0])
        i = index[g]
        out.append(
            Profile(
                f"{g}g.{g * size}gb{spec[1:]}",
                g,
                g,
                count,
                memory_mb[i],
                sms[i],
                g,
                decoder,
                encoder,
                jpeg,
                ofa,
                starts[g],
                profile_id,
            )
        )
    return GPUModel(name, 4, 4, tuple(out), media)


_RTX_PRO_6000 = _four_slot(
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    24,
    (24192, 48512, 97408),
    (46, 94, 188),
    (4, 4, 4, 1),
    (
        ("1", 4, 1, 1, 1, 0, 14),
        ("1+me", 1, 1, 1, 1, 1, 21),
        ("1+gfx", 4, 1, 1, 1, 0, 47),
        ("1+me.all", 1, 4, 4, 4, 1, 65),
        ("1-me", 4, 0, 0, 0, 0, 67),
        ("2", 2, 2, 2, 2, 0, 5),
        ("2+gfx", 2, 2, 2, 2, 0, 35),
        ("2+me.all", 1, 4, 4, 4, 1, 64),
        ("2-me", 2, 0, 0, 0, 0, 66),
        ("4", 1, 4, 4, 4, 1, 0),
        ("4+gfx", 1, 4, 4, 4, 1, 32),
    ),
)

# PCI device ID (lower-case hex, vendor 10de) -> the model's MIG profiles
MODELS: dict[str, GPUModel] = {
    "2330": _H100_80GB,
    "20b0": _A100_40GB,
    "20b2": _A100_80GB,
    "2901": _B200,
    "2941": _GB200,
    "2bb5": _RTX_PRO_6000,
}


def model(device_id: str) -> GPUModel | None:
    """The MIG profiles of PCI device `device_id` (e.g. "2330" or "0x233010DE"); None: not MIG-capable
    here (no profiles known)."""
    key = device_id.lower().removeprefix("0x")
    if len(key) == 8 and key.endswith("10de"):
        key = key[:4]
    return MODELS.get(key)


def gi_id(profile: Profile, start: int, compute_slots: int = 7) -> int:
    """The GPU instance ID NVML gives an instance of `profile` placed at `start` on a GPU of
    `compute_slots` (7: A100, H100, B200; 4: A30, RTX PRO 6000)."""
    if compute_slots == 4:
        return {4: 0, 2: 1 + start // 2}.get(profile.slices, 3 + start)
    if compute_slots != 7:
        raise ValueError(f"no GPU instance IDs known for a GPU of {compute_slots} compute slots")
    if profile.slices == 7:
        return 0
    if profile.slices in (3, 4):
        return 1 if start == 0 else 2
    if profile.slices == 2:
        return 3 + start // 2
    return 7 + start


class LayoutError(ValueError):
    """A layout does not fit the GPU; the message says which profile and why."""


def place(m: GPUModel, wanted: dict[str, int]) -> list[tuple[Profile, int]]:
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
    if m.media is not None:
        needs = tuple(sum(getattr(p, e) for p in items) for e in ("decoder", "encoder", "jpeg", "ofa"))
        if any(n > has for n, has in zip(needs, m.media, strict=True)):
            raise LayoutError(
                f"{_describe(wanted)} needs {_engines(needs)}; the instances of {m.name} "
                f"share {_engines(m.media)}"
            )
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
        raise LayoutError(
            f"{_describe(wanted)} does not fit the {m.compute_slots} compute slices of {m.name}"
        )
    return out


def _describe(wanted: dict[str, int]) -> str:
    return ", ".join(f"{n} x {p}" for p, n in wanted.items())


def _engines(counts: tuple[int, ...]) -> str:
    return ", ".join(f"{n} {e}" for n, e in zip(counts, ("NVDEC", "NVENC", "JPEG", "OFA"), strict=True))
