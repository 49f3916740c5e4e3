"""The device and node catalog: YAML files under ``hardware_profiles/`` (every number with its source).

Where the catalog is found, first match wins:
1. ``$PLANNER_PROFILES_DIR`` (a folder with ``devices/`` and ``nodes/``);
2. ``planner/hardware_profiles`` inside the installed package (a non-editable ``pip install .``);
3. ``hardware_profiles/`` at the top of a source checkout.

Its ``clusters/`` folder holds example cluster files, which ``--cluster`` also takes by name.

Unknown names raise :class:`~planner.errors.ClusterError` with the closest known names suggested.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import ClusterError, suggest
from planner.hardware.documents import Document, check, load_schema, read_document
from planner.types import DeviceProfile, NodeProfile
from planner.units import GB  # bandwidths in the files are GB/s = 1e9 bytes/s

ENV_VAR = "PLANNER_PROFILES_DIR"
US = 1e-6
DEVICE_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def profiles_dir() -> Path:
    """The catalog folder (see the module docstring for the search order)."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not (path / "devices").is_dir():
            raise ClusterError(f"${ENV_VAR}={env}: no 'devices' folder there; point it at a folder holding "
                               "devices/ and nodes/ (like hardware_profiles/)")
        return path
    here = Path(__file__).resolve().parent.parent  # planner/
    for candidate in (here / "hardware_profiles", here.parent / "hardware_profiles"):
        if (candidate / "devices").is_dir():
            return candidate
    raise ClusterError("the hardware catalog (hardware_profiles/) is missing from this installation; "
                       f"reinstall planner or set ${ENV_VAR}")


# ------------------------------------------------------------------------------------------ conversion

def _pairs(points: Any) -> tuple[tuple[float, float], ...]:
    return tuple(sorted((float(x), float(y)) for x, y in points))


def _not_a_device_profile(doc: Document) -> str | None:
    """What makes ``doc`` no device profile at all (not a mapping, or a mapping with none of the profile's
    fields), said without quoting it: a device_file may name any file, and its content is no one's business
    in an error message. None when it looks like a profile (the schema then checks it field by field)."""
    data = doc.data
    if not isinstance(data, dict):
        held = {str: "plain text", list: "a list", type(None): "nothing"}.get(type(data), "a single value")
        return f"it holds {held}, not a mapping of fields"
    if not data.keys() & set(load_schema("device")["properties"]):
        return f"none of its {len(data)} keys is a device profile field"
    return None


def device_from_document(doc: Document) -> DeviceProfile:
    """A DeviceProfile from a checked device document (catalog file or `planner profile` output)."""
    wrong = _not_a_device_profile(doc)
    if wrong is not None:
        required = ", ".join(load_schema("device")["required"])
        raise ClusterError(f"{doc.where}: not a device profile ({wrong}); give a YAML/JSON device profile with "
                           f"{required} (as `planner profile` writes or hardware_profiles/devices holds)")
    check(doc, "device")
    data = doc.data
    sources = data.get("sources", {})
    return DeviceProfile(
        name=data["name"],
        peak_flops_per_s={k: float(v) for k, v in sorted(data["peak_flops_per_s"].items())},
        memory_bytes=int(data["memory_bytes"]),
        memory_bandwidth_Bps=float(data["memory_bandwidth_Bps"]),
        gemm_efficiency=_pairs(data["gemm_efficiency"]),
        memory_efficiency=float(data.get("memory_efficiency", 1.0)),
        vendor=data.get("vendor", ""),
        source="; ".join(f"{k}: {v}" for k, v in sorted(sources.items())),
        memory_efficiency_curve=_pairs(data.get("memory_efficiency_curve", ())),
        op_overhead_s=float(data.get("op_overhead_s", 0.0)),
        description=data.get("description", ""),
        conv_efficiency=_pairs(data.get("conv_efficiency", ())),
        vector_flops_per_s=float(data.get("vector_flops_per_s", 0.0)),
        flash_attention_efficiency=tuple(float(x) for x in data.get("flash_attention_efficiency", ())),
        flash_attention=bool(data.get("flash_attention", True)),
        compute_capability=float(data.get("compute_capability", 0.0)),
        host_bandwidth_Bps=float(data.get("host_bandwidth_Bps", 0.0)),
    )


def node_from_document(doc: Document) -> NodeProfile:
    check(doc, "node")
    data = doc.data
    try:
        device = get_device(data["device"])
    except ClusterError as exc:  # the node file names the device: say which file and line to fix
        raise ClusterError(f"{doc.at(('device',))}: {exc}") from None
    sources = data["sources"]
    return NodeProfile(
        name=data["name"],
        device=device,
        devices_per_node=int(data["devices_per_node"]),
        intra_node_bandwidth_Bps=float(data["intra_node_bandwidth_GBps"]) * GB,
        intra_node_latency_s=float(data["intra_node_latency_us"]) * US,
        inter_node_bandwidth_Bps=float(data["nics_per_node"]) * float(data["nic_bandwidth_GBps"]) * GB,
        inter_node_latency_s=float(data["inter_node_latency_us"]) * US,
        source="; ".join(f"{k}: {v}" for k, v in sorted(sources.items())),
        intra_node_efficiency=float(data.get("intra_node_efficiency", 1.0)),
        inter_node_efficiency=float(data.get("inter_node_efficiency", 1.0)),
        nics_per_node=int(data["nics_per_node"]),
        intra_node_fabric=data.get("intra_node_fabric", ""),
        host_memory_bytes=float(data.get("host_memory_GB", 0.0)) * GB,
        intra_node_group_fraction=tuple(sorted((int(r), float(f))
                                               for r, f in data.get("intra_node_group_fraction", ()))),
        nvls_efficiency=float(data.get("nvls_efficiency", 0.0)),
    )


# --------------------------------------------------------------------------------------------- catalog

@lru_cache(maxsize=None)
def _files(kind: str, root: str) -> dict[str, Path]:
    folder = Path(root) / kind
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix in DEVICE_FILE_SUFFIXES}


@lru_cache(maxsize=None)
def _load_device(path: str) -> DeviceProfile:
    return device_from_document(read_document(Path(path)))


@lru_cache(maxsize=None)
def _load_node(path: str) -> NodeProfile:
    return node_from_document(read_document(Path(path)))


def device_names() -> list[str]:
    return sorted(_files("devices", str(profiles_dir())))


def node_names() -> list[str]:
    return sorted(_files("nodes", str(profiles_dir())))


def cluster_names() -> list[str]:
    """The catalog's example clusters (its ``clusters/`` folder), by file name without the suffix."""
    return sorted(_files("clusters", str(profiles_dir())))


def cluster_file(name: str) -> Path | None:
    """The catalog's cluster file named ``name`` (no suffix), or None."""
    return _files("clusters", str(profiles_dir())).get(name.strip().lower())


def _get(kind: str, name: str, load):
    files = _files(f"{kind}s", str(profiles_dir()))
    key = name.strip().lower()
    if key not in files:
        raise ClusterError(f"unknown {kind} {name!r}{suggest(key, files)}; `planner devices` lists the catalog")
    profile = load(str(files[key]))
    if profile.name != key:
        raise ClusterError(f"{files[key]}: 'name' is {profile.name!r} but the file is named {key!r}")
    return profile


def get_device(name: str) -> DeviceProfile:
    return _get("device", name, _load_device)


def get_node(name: str) -> NodeProfile:
    return _get("node", name, _load_node)


def load_device_file(path: str | os.PathLike) -> DeviceProfile:
    """A device profile from a file, e.g. one written by ``planner profile``."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a loop of links
        raise ClusterError(f"{str(path)!r} is not a usable path ({exc}); give the path of a device profile "
                           "file") from None
    return _load_device(str(resolved))


def is_device_file(text: str) -> bool:
    return text.lower().endswith(DEVICE_FILE_SUFFIXES) or "/" in text or os.sep in text
