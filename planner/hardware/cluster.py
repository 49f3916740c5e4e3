"""Cluster loading: a YAML/JSON file (``planner/schemas/cluster.schema.json``), the name of one of the
catalog's example cluster files (``hardware_profiles/clusters/NAME.yaml``), or the shorthand
``NODE*COUNT[+NODE*COUNT...]`` (``COUNT`` defaults to 1; a node's name wins over a cluster file's).

Devices are numbered globally in group order: group 0's devices are ``0 .. n0-1``, node-major (node 0's
devices first). Group names are unique: the ``name`` given, else the node name, with ``_2``, ``_3`` ... for
repeats, so a what-if sweep can address ``GROUP.count``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from bisect import bisect_right
from pathlib import Path
from typing import Any, Sequence

from planner.errors import ClusterError, suggest
from planner.hardware import catalog
from planner.hardware.documents import RANGES, Document, JsonPath, check, read_document
from planner.types import Cluster, DeviceGroup, NodeProfile
from planner.units import GB

US = catalog.US

# Used where a file does not say; each has a source.
# ~130 ns per InfiniBand switch hop (NVIDIA Quantum QM8700 datasheet) x 3 hops of a fat tree, plus cables
DEFAULT_FABRIC_LATENCY_S = 1.0e-6
DEFAULT_OVERSUBSCRIPTION = 1.0  # full-bisection fat tree, as in NVIDIA's DGX SuperPOD reference architectures
# An inline node that gives no latency/efficiency gets the figures of the catalog's DGX A100 node
# (sources in hardware_profiles/nodes/dgx-a100-80gb.yaml).
INLINE_DEFAULTS_NODE = "dgx-a100-80gb"

# a cluster file group's keys that override its node's links: file key (GB/s) -> NodeProfile field (B/s)
LINK_OVERRIDES = {"inter_node_bandwidth_GBps": "inter_node_bandwidth_Bps",
                  "intra_node_bandwidth_GBps": "intra_node_bandwidth_Bps"}
MAX_NODES_PER_GROUP = int(RANGES["nodes"][1])  # a cluster file's limit, for the shorthand too
MAX_GROUPS = int(RANGES["groups"][1])
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_BARE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHORTHAND_TERM = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\*\s*([^\s+*]+))?\s*$")


def load_cluster(spec: str | os.PathLike) -> Cluster:
    """A Cluster from a file path (YAML/JSON), a catalog cluster's name (``h100-a100-mixed``) or a shorthand
    such as ``dgx-a100-80gb*16+hgx-v100-32gb*8``."""
    if not isinstance(spec, (str, os.PathLike)):
        raise ClusterError(f"cluster: got a {type(spec).__name__}; give a cluster file's path or a shorthand such as "
                           "'dgx-a100-80gb*16+hgx-v100-32gb*8'")
    text = os.fspath(spec)
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in text or os.sep in text or (text and _exists(path)):
        # a missing file: "no such file" (naming the catalog's example of that name, which --cluster takes by
        # name); a folder: "is not a file"
        bundled = catalog.cluster_file(path.stem) if not _exists(path) else None
        if bundled is not None:
            raise ClusterError(f"{text}: no such file; the catalog's example cluster of that name is "
                               f"--cluster {path.stem} (or give its path, {bundled})")
        if not _exists(path):
            raise ClusterError(f"{text}: no such file; give a cluster file's path, an example cluster's name "
                               f"(`planner devices` lists them) or a shorthand such as dgx-a100-80gb*16")
        return _cluster_from_document(read_document(path), path.parent)
    bundled = catalog.cluster_file(text) if _BARE_NAME.fullmatch(text.strip()) else None
    if bundled is not None and text.strip().lower() not in catalog.node_names():
        return _cluster_from_document(read_document(bundled), bundled.parent)
    return parse_shorthand(text)


def _exists(path: Path) -> bool:
    """Whether ``path`` names a file or folder; a text no file can have (too long a name) names none."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def parse_shorthand(text: str) -> Cluster:
    if not text.strip():
        raise ClusterError("empty cluster: give a cluster file or a shorthand like dgx-a100-80gb*16")
    terms = text.split("+")
    if len(terms) > MAX_GROUPS:
        raise ClusterError(f"cluster shorthand: {len(terms)} groups, over the limit of {MAX_GROUPS}; give "
                           "a cluster file or fewer NODE*COUNT terms")
    groups: list[tuple[str, NodeProfile, int]] = []
    for term in terms:
        match = _SHORTHAND_TERM.match(term)
        if not match:
            raise ClusterError(f"cluster {text!r}: cannot read {term.strip()!r}; write NODE*COUNT, "
                               "e.g. dgx-a100-80gb*16+hgx-v100-32gb*8")
        name, count_text = match.group(1), match.group(2)
        count = 1
        if count_text is not None:
            if not _WHOLE_NUMBER.fullmatch(count_text):
                raise ClusterError(f"cluster {text!r}: node count {count_text!r} of {name!r} is not a whole "
                                   f"number; write e.g. {name}*4")
            # compared as text first: int() of thousands of digits is refused or slow
            count = int(count_text) if len(count_text) <= len(str(MAX_NODES_PER_GROUP)) + 1 else MAX_NODES_PER_GROUP + 1
            if not 1 <= count <= MAX_NODES_PER_GROUP:
                raise ClusterError(f"cluster {text!r}: node count {count_text} of {name!r} must be from 1 to "
                                   f"{MAX_NODES_PER_GROUP} nodes per group")
        groups.append((name.lower(), _shorthand_node(name, single=len(terms) == 1 and count_text is None), count))
    return _assemble(groups, prices=[None] * len(groups), fabric_latency_s=DEFAULT_FABRIC_LATENCY_S,
                     oversubscription=DEFAULT_OVERSUBSCRIPTION, name=text.strip())


def _shorthand_node(name: str, single: bool) -> NodeProfile:
    """The catalog node ``name``; where a bare name (``single``) is none, the error also suggests the catalog's
    cluster names, which ``--cluster`` takes as well."""
    try:
        return catalog.get_node(name)
    except ClusterError:
        if not single:
            raise
    key = name.strip().lower()
    raise ClusterError(f"unknown node or cluster {name!r}{suggest(key, catalog.node_names() + catalog.cluster_names())}"
                       "; `planner devices` lists the catalog's nodes and clusters") from None


def _cluster_from_document(doc: Document, base_dir: Path) -> Cluster:
    if not isinstance(doc.data, dict):
        raise ClusterError(f"{doc.where}: a cluster file must be a mapping with a 'groups' list, e.g. "
                           "groups: [{node: dgx-a100-80gb, count: 4}]")
    if "groups" not in doc.data:  # a profile of one device or one node given where a cluster was wanted
        kind = "device" if "peak_flops_per_s" in doc.data else "node" if "devices_per_node" in doc.data else None
        if kind is not None:
            raise ClusterError(f"{doc.where}: this is a {kind} profile, not a cluster file; a cluster file lists "
                               "groups of nodes, e.g. groups: [{node: dgx-h100, count: 4}], or use a shorthand "
                               "such as dgx-h100*4")
    check(doc, "cluster")
    data = doc.data
    groups: list[tuple[str, NodeProfile, int]] = []
    prices: list[float | None] = []
    overrides: list[tuple[tuple[str, float], ...]] = []
    for i, group in enumerate(data["groups"]):
        node = _group_node(doc, ("groups", i), base_dir)
        overrides.append(tuple((field, float(group[key]) * GB) for key, field in LINK_OVERRIDES.items()
                               if key in group))
        groups.append((group.get("name", node.name), with_overrides(node, overrides[-1]), int(group["count"])))
        price = group.get("price_per_node_hour")
        prices.append(float(price) if price is not None else None)
    fabric = data.get("fabric", {})
    return _assemble(
        groups, prices, overrides=overrides,
        fabric_latency_s=float(fabric.get("latency_us", DEFAULT_FABRIC_LATENCY_S / US)) * US,
        oversubscription=float(fabric.get("oversubscription", DEFAULT_OVERSUBSCRIPTION)),
        name=str(data.get("name", Path(doc.where).stem)),
        explicit_names=[("name" in g) for g in data["groups"]], where=doc.where,
    )


def _group_node(doc: Document, path: JsonPath, base_dir: Path) -> NodeProfile:
    """The group's node as its catalog name or inline spec gives it, before the group's overrides."""
    group: dict[str, Any] = doc.data[path[0]][path[1]]
    spec = group["node"]
    if isinstance(spec, str):
        try:
            node = catalog.get_node(spec)
        except ClusterError as exc:
            raise ClusterError(f"{doc.at(path + ('node',))}: {exc}") from None
    else:
        node = _inline_node(doc, path + ("node",), spec, base_dir)
    return node


def with_overrides(node: NodeProfile, overrides: Sequence[tuple[str, float]]) -> NodeProfile:
    """``node`` with a group's link overrides (``DeviceGroup.link_overrides``) applied: how a cluster file's
    group and a what-if sweep's swapped-in node get them."""
    return dataclasses.replace(node, **dict(overrides)) if overrides else node


def _inline_node(doc: Document, path: JsonPath, spec: dict[str, Any], base_dir: Path) -> NodeProfile:
    where = doc.at(path)
    if "device_file" in spec:
        device = _device_file(doc, path + ("device_file",), spec["device_file"], base_dir)
    elif catalog.is_device_file(spec["device"]):
        device = _device_file(doc, path + ("device",), spec["device"], base_dir)
    else:
        try:
            device = catalog.get_device(spec["device"])
        except ClusterError as exc:
            raise ClusterError(f"{doc.at(path + ('device',))}: {exc}") from None
    defaults = catalog.get_node(INLINE_DEFAULTS_NODE)
    per_node = int(spec["devices_per_node"])
    if per_node > 1 and "intra_node_bandwidth_GBps" not in spec:
        raise ClusterError(f"{where}: an inline node with {per_node} devices needs 'intra_node_bandwidth_GBps' "
                           "(per device, each way; e.g. 300 for NVLink 3, 31.5 for PCIe 4.0 x16)")
    if "inter_node_bandwidth_GBps" not in spec:
        raise ClusterError(f"{where}: an inline node needs 'inter_node_bandwidth_GBps' (per node, all NICs, each "
                           "way; e.g. 200 for 8x HDR 200 Gb/s)")
    return NodeProfile(
        name=spec.get("name", f"{device.name}x{per_node}"),
        device=device,
        devices_per_node=per_node,
        intra_node_bandwidth_Bps=float(spec.get("intra_node_bandwidth_GBps", 0.0)) * GB
        or defaults.intra_node_bandwidth_Bps,
        intra_node_latency_s=float(spec.get("intra_node_latency_us", defaults.intra_node_latency_s / US)) * US,
        inter_node_bandwidth_Bps=float(spec["inter_node_bandwidth_GBps"]) * GB,
        inter_node_latency_s=float(spec.get("inter_node_latency_us", defaults.inter_node_latency_s / US)) * US,
        source=f"written inline in {doc.where}; unspecified latencies/efficiencies from {INLINE_DEFAULTS_NODE}",
        intra_node_efficiency=float(spec.get("intra_node_efficiency", defaults.intra_node_efficiency)),
        inter_node_efficiency=float(spec.get("inter_node_efficiency", defaults.inter_node_efficiency)),
        nics_per_node=int(spec.get("nics_per_node", 1)),
        intra_node_fabric="inline",
        host_memory_bytes=float(spec.get("host_memory_GB", 0.0)) * GB,
    )


def _device_file(doc: Document, path: JsonPath, text: str, base_dir: Path):
    file = Path(text)
    if not file.is_absolute():
        file = base_dir / file
    try:
        return catalog.load_device_file(file)
    except ClusterError as exc:
        raise ClusterError(f"{doc.at(path)}: device profile {text!r}: {exc}") from None


def _assemble(groups: list[tuple[str, NodeProfile, int]], prices: list[float | None], *, fabric_latency_s: float,
              oversubscription: float, name: str, explicit_names: list[bool] | None = None,
              where: str = "", overrides: list[tuple[tuple[str, float], ...]] | None = None) -> Cluster:
    explicit_names = explicit_names or [False] * len(groups)
    overrides = overrides or [()] * len(groups)
    reserved = {g[0] for g, explicit in zip(groups, explicit_names) if explicit}
    used: set[str] = set()
    built: list[DeviceGroup] = []
    first = 0
    for (group_name, node, count), price, explicit, links in zip(groups, prices, explicit_names, overrides):
        unique = group_name
        if explicit and unique in used:
            raise ClusterError(f"{where}: two groups are named {group_name!r}; group names must be unique")
        index = 1
        while not explicit and (unique in used or unique in reserved):
            index += 1
            unique = f"{group_name}_{index}"
        used.add(unique)
        built.append(DeviceGroup(name=unique, node=node, count=count, first_device=first, price_per_node_hour=price,
                                 link_overrides=links))
        first += count * node.devices_per_node
    return Cluster(groups=tuple(built), fabric_latency_s=fabric_latency_s, oversubscription=oversubscription,
                   name=name)


# ----------------------------------------------------------------------------------------- device lookup

def pooled(cluster: Cluster) -> Cluster:
    """``cluster`` with each run of neighbouring groups of the same node and price as one group (the first's
    name, their nodes together): the same devices, numbered the same, and the same costs, since the cost model
    sees a node's profile, never its group. The search pools the groups of :func:`arranged`, so the groups of one
    node plan as one pool wherever they are listed. ``cluster`` itself when no two neighbours match."""
    merged: list[DeviceGroup] = []
    for group in cluster.groups:
        last = merged[-1] if merged else None
        if last is not None and last.node == group.node and last.price_per_node_hour == group.price_per_node_hour:
            merged[-1] = dataclasses.replace(last, count=last.count + group.count)
        else:
            merged.append(group)
    return cluster if len(merged) == len(cluster.groups) else dataclasses.replace(cluster, groups=tuple(merged))


def renumber(groups: Sequence[DeviceGroup]) -> tuple[DeviceGroup, ...]:
    """Groups with device ids numbered consecutively from 0 in the given order (``first_device``)."""
    renumbered: list[DeviceGroup] = []
    next_device = 0
    for group in groups:
        renumbered.append(dataclasses.replace(group, first_device=next_device))
        next_device += group.num_devices
    return tuple(renumbered)


def arranged(cluster: Cluster) -> tuple[Cluster, tuple[int, ...] | None]:
    """``cluster`` with every group moved up behind the earlier groups of the same node and price (so that
    :func:`pooled` pools them: a pool's devices are one run of ids), renumbered; and for each of its device
    ids, the id the device has in ``cluster``. ``(cluster, None)`` when no group moves. The cost model sees
    nodes, never their order, so a plan on the arranged cluster times the same with its ids mapped back."""
    kinds: list[list[DeviceGroup]] = []
    for group in cluster.groups:
        kind = next((k for k in kinds if k[0].node == group.node
                     and k[0].price_per_node_hour == group.price_per_node_hour), None)
        if kind is None:
            kinds.append([group])
        else:
            kind.append(group)
    order = [group for kind in kinds for group in kind]
    if order == list(cluster.groups):
        return cluster, None
    listed = tuple(d for g in order for d in range(g.first_device, g.first_device + g.num_devices))
    return dataclasses.replace(cluster, groups=renumber(order)), listed


def locate(cluster: Cluster, device: int) -> tuple[int, int]:
    """(group index, node index within the whole cluster) of a global device id."""
    firsts, node_offsets = _layout(cluster)
    gi = bisect_right(firsts, device) - 1
    if gi >= 0:
        group = cluster.groups[gi]
        local = device - group.first_device
        if local < group.num_devices:
            return gi, node_offsets[gi] + local // group.node.devices_per_node
    raise ClusterError(f"device {device} is not in the cluster (it has {cluster.num_devices} devices, 0.."
                       f"{cluster.num_devices - 1})")


_LAYOUTS: dict[int, tuple[Cluster, tuple[int, ...], tuple[int, ...]]] = {}


def _layout(cluster: Cluster) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each group's first device and first node index, cached per cluster (the entry holds the cluster, so
    its id is not reused while cached)."""
    hit = _LAYOUTS.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1], hit[2]
    firsts = tuple(g.first_device for g in cluster.groups)
    offsets = tuple(sum(g.count for g in cluster.groups[:i]) for i in range(len(cluster.groups)))
    if len(_LAYOUTS) > 256:
        _LAYOUTS.clear()
    _LAYOUTS[id(cluster)] = (cluster, firsts, offsets)
    return firsts, offsets
