"""`planner devices [--json]`: the device and node catalog."""

from __future__ import annotations

import argparse
import sys

from planner.commands._common import add_json_flag, emit_json
from planner.hardware import catalog, load_cluster
from planner.hardware.efficiency import gemm_efficiency
from planner.hardware.fp8 import recipes_for
from planner.plans import cluster_summary
from planner.units import GB, GIB

HELP = "list the device and node catalog (hardware_profiles/), or describe a cluster (--cluster)"
TFLOP = 1e12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", help="describe this cluster (a file, an example cluster's name or "
                        "NODE*COUNT[+...]) instead of the catalog")
    add_json_flag(parser)


def cluster_document(spec: str) -> dict:
    """A plan's cluster summary (planner.plans.cluster_summary) with each group's links, price and device."""
    cluster = load_cluster(spec)
    document = cluster_summary(cluster)
    for entry, g in zip(document["groups"], cluster.groups):
        node = g.node
        entry.update({
            "devices_per_node": node.devices_per_node, "last_device": g.first_device + g.num_devices - 1,
            "price_per_node_hour": g.price_per_node_hour, "intra_node_bandwidth_Bps": node.intra_node_bandwidth_Bps,
            "inter_node_bandwidth_Bps": node.inter_node_bandwidth_Bps,
            "peak_flops_per_s": dict(sorted(node.device.peak_flops_per_s.items())),
            "memory_bytes": node.device.memory_bytes,
        })
    document.update({"device_types": list(cluster.device_types), "fabric_latency_s": cluster.fabric_latency_s,
                     "oversubscription": cluster.oversubscription})
    return document


def catalog_document() -> dict:
    devices = []
    for name in catalog.device_names():
        d = catalog.get_device(name)
        devices.append({
            "name": d.name, "vendor": d.vendor, "description": d.description,
            "peak_flops_per_s": dict(sorted(d.peak_flops_per_s.items())),
            "memory_bytes": d.memory_bytes, "memory_bandwidth_Bps": d.memory_bandwidth_Bps,
            "host_bandwidth_Bps": d.host_bandwidth_Bps or None,
            "gemm_efficiency": [list(p) for p in d.gemm_efficiency],
            "memory_efficiency": d.memory_efficiency,
            "compute_capability": d.compute_capability or None, "fp8_recipes": list(recipes_for([d])),
            "source": d.source,
        })
    nodes = []
    for name in catalog.node_names():
        n = catalog.get_node(name)
        nodes.append({
            "name": n.name, "device": n.device.name, "devices_per_node": n.devices_per_node,
            "intra_node_fabric": n.intra_node_fabric,
            "intra_node_bandwidth_Bps": n.intra_node_bandwidth_Bps, "intra_node_latency_s": n.intra_node_latency_s,
            "intra_node_efficiency": n.intra_node_efficiency,
            "intra_node_group_fraction": [list(p) for p in n.intra_node_group_fraction] or None,
            "nvls_efficiency": n.nvls_efficiency or None,
            "nics_per_node": n.nics_per_node,
            "inter_node_bandwidth_Bps": n.inter_node_bandwidth_Bps, "inter_node_latency_s": n.inter_node_latency_s,
            "inter_node_efficiency": n.inter_node_efficiency, "source": n.source,
        })
    clusters = []
    for name in catalog.cluster_names():
        c = load_cluster(name)
        clusters.append({"name": name, "devices": c.num_devices, "device_types": list(c.device_types),
                         "groups": [f"{g.node.name}*{g.count}" for g in c.groups]})
    return {"profiles_dir": str(catalog.profiles_dir()), "devices": devices, "nodes": nodes, "clusters": clusters}


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _run_cluster(args: argparse.Namespace) -> int:
    doc = cluster_document(args.cluster)
    if args.json:
        emit_json(doc)
        return 0
    rows = [["group", "node", "device", "nodes", "per node", "devices", "inter GB/s/node", "$/node-hour"]]
    for g in doc["groups"]:
        price = g["price_per_node_hour"]
        rows.append([g["name"], g["node"], g["device"], str(g["count"]), str(g["devices_per_node"]),
                     f"{g['first_device']}-{g['last_device']}", f"{g['inter_node_bandwidth_Bps'] / GB:g}",
                     "" if price is None else f"{price:g}"])
    sys.stdout.write(f"cluster {doc['name']}: {doc['num_devices']} devices "
                     f"({', '.join(doc['device_types'])}), fabric latency {doc['fabric_latency_s'] * 1e6:g} us, "
                     f"oversubscription {doc['oversubscription']:g}\n" + _table(rows) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.cluster is not None:
        return _run_cluster(args)
    doc = catalog_document()
    if args.json:
        emit_json(doc)
        return 0
    rows = [["device", "bf16/fp16 TF", "fp8 TF", "fp32 TF", "memory GiB", "HBM/GDDR GB/s", "large-GEMM eff",
             "fp8 recipes"]]
    for d in doc["devices"]:
        peaks = d["peak_flops_per_s"]
        half = peaks.get("bf16") or peaks.get("fp16") or 0.0
        profile = catalog.get_device(d["name"])
        rows.append([d["name"], f"{half / TFLOP:.1f}", f"{peaks['fp8'] / TFLOP:.1f}" if "fp8" in peaks else "-",
                     f"{peaks.get('fp32', 0.0) / TFLOP:.1f}",
                     f"{d['memory_bytes'] / GIB:.0f}", f"{d['memory_bandwidth_Bps'] / GB:.0f}",
                     f"{gemm_efficiency(profile, 1e12):.2f}", ",".join(d["fp8_recipes"]) or "-"])
    out = [_table(rows), ""]
    rows = [["node", "device", "per node", "intra fabric", "intra GB/s/dev", "NVLS", "NICs", "inter GB/s/node"]]
    for n in doc["nodes"]:
        rows.append([n["name"], n["device"], str(n["devices_per_node"]), n["intra_node_fabric"],
                     f"{n['intra_node_bandwidth_Bps'] / GB:g}", "yes" if n["nvls_efficiency"] else "-",
                     str(n["nics_per_node"]), f"{n['inter_node_bandwidth_Bps'] / GB:g}"])
    out += [_table(rows), ""]
    if doc["clusters"]:
        rows = [["cluster (--cluster NAME)", "devices", "groups"]]
        rows += [[c["name"], str(c["devices"]), " + ".join(c["groups"])] for c in doc["clusters"]]
        out += [_table(rows), ""]
    out.append(f"catalog: {doc['profiles_dir']} (sources: planner devices --json)")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
