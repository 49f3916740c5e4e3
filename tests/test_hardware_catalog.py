"""The catalog: every file loads, matches its schema, and names a source for every number."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from planner.errors import ClusterError
from planner.hardware import catalog

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "hardware_profiles"
SCHEMAS = ROOT / "planner" / "schemas"

CONTRACT_DEVICES = ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "v100-16gb", "v100-32gb", "t4", "l4", "a10",
                    "rtx-3090", "rtx-4090", "titan-rtx", "rtx-2080", "mi250x", "mi300x")
CONTRACT_NODES = ("dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "hgx-v100-32gb", "hgx-v100-16gb",
                  "t4", "l4", "a10", "rtx-3090", "rtx-4090", "mi300x-8")


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def test_contract_names_are_in_the_catalog():
    assert set(CONTRACT_DEVICES) <= set(catalog.device_names())
    assert set(CONTRACT_NODES) <= set(catalog.node_names())


@pytest.mark.parametrize("path", sorted((PROFILES / "devices").glob("*.yaml")), ids=lambda p: p.stem)
def test_device_file_is_valid_and_sourced(path):
    data = yaml.safe_load(path.read_text())
    jsonschema.validate(data, _schema("device"))
    numeric = [k for k, v in data.items() if isinstance(v, (int, float, dict, list)) and k not in ("sources",)]
    missing = [k for k in numeric if not data.get("sources", {}).get(k)]
    assert not missing, f"{path.name}: no source for {missing}"
    profile = catalog.get_device(path.stem)
    assert profile.name == path.stem
    assert all(v > 1e12 for v in profile.peak_flops_per_s.values())
    assert 0 < profile.gemm_efficiency[0][1] < profile.gemm_efficiency[-1][1] <= 1
    # every curve says whether it was measured or where its shape comes from
    assert "not measured" in data["sources"]["gemm_efficiency"] or "fitted" in data["sources"]["gemm_efficiency"]


@pytest.mark.parametrize("path", sorted((PROFILES / "nodes").glob("*.yaml")), ids=lambda p: p.stem)
def test_node_file_is_valid_and_sourced(path):
    data = yaml.safe_load(path.read_text())
    jsonschema.validate(data, _schema("node"))
    numeric = [k for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    missing = [k for k in numeric if not data["sources"].get(k)]
    assert not missing, f"{path.name}: no source for {missing}"
    node = catalog.get_node(path.stem)
    assert node.inter_node_bandwidth_Bps == pytest.approx(data["nics_per_node"] * data["nic_bandwidth_GBps"] * 1e9)


def test_datasheet_numbers_spot_check():
    a100 = catalog.get_device("a100-80gb")
    assert a100.peak_flops_per_s["bf16"] == pytest.approx(312e12)
    assert a100.memory_bandwidth_Bps == pytest.approx(2.039e12)
    dgx = catalog.get_node("dgx-a100-80gb")
    assert dgx.devices_per_node == 8
    assert dgx.intra_node_bandwidth_Bps == pytest.approx(300e9)
    assert dgx.inter_node_bandwidth_Bps == pytest.approx(200e9)
    assert "bf16" not in catalog.get_device("v100-32gb").peak_flops_per_s


def test_mi250x_node_is_eight_gcds_with_faster_pairs():
    # software sees each MI250X as two 64 GB GCDs, so a Frontier/LUMI node is 8 devices; a pair of consecutive
    # GCDs is one MI250X (4 Infinity Fabric links), a quad two MI250X joined by 2 single links; the 4 NICs, one
    # per MI250X, serve 2 GCDs each
    from planner.hardware import load_cluster
    from planner.hardware.collectives import comm_group, intra_group_Bps
    node = catalog.get_node("mi250x-4")
    gcd = node.device
    assert gcd.name == "mi250x" and node.devices_per_node == 8
    assert gcd.memory_bytes == 65520 * 2 ** 20  # what HIP reports for one GCD, under 64 GiB
    assert gcd.peak_flops_per_s["bf16"] == pytest.approx(191.5e12)
    assert gcd.memory_bandwidth_Bps == pytest.approx(1.6384e12)
    pair, quad, whole = (intra_group_Bps(node, r) for r in (2, 4, 8))
    assert pair > quad and whole > quad and pair >= whole
    assert pair == pytest.approx(200e9 * node.intra_node_efficiency) and quad == pytest.approx(pair / 2)
    cluster = load_cluster("mi250x-4*2")
    assert comm_group(cluster, [0, 1]).intra_bandwidth_Bps > comm_group(cluster, [0, 1, 2, 3]).intra_bandwidth_Bps
    assert node.nics_per_node == 4 and node.inter_node_bandwidth_Bps / node.devices_per_node == pytest.approx(12.5e9)


def test_unknown_names_suggest_close_ones():
    with pytest.raises(ClusterError, match=r"unknown device 'a100-80g'.*did you mean a100-80gb"):
        catalog.get_device("a100-80g")
    with pytest.raises(ClusterError, match=r"unknown node 'dgx-h10'.*did you mean dgx-h100"):
        catalog.get_node("dgx-h10")


def test_names_are_case_insensitive():
    assert catalog.get_device("H100-SXM").name == "h100-sxm"


def test_profiles_dir_env_override(tmp_path, monkeypatch):
    (tmp_path / "devices").mkdir()
    (tmp_path / "nodes").mkdir()
    text = (PROFILES / "devices" / "t4.yaml").read_text().replace("name: t4", "name: my-t4")
    (tmp_path / "devices" / "my-t4.yaml").write_text(text)
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    assert catalog.device_names() == ["my-t4"]
    assert catalog.get_device("my-t4").memory_bytes == 15360 * 2 ** 20  # the T4 file's nvidia-smi total
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(ClusterError, match="PLANNER_PROFILES_DIR"):
        catalog.device_names()


def test_file_name_must_match_name(tmp_path, monkeypatch):
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "x.yaml").write_text((PROFILES / "devices" / "t4.yaml").read_text())
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    with pytest.raises(ClusterError, match="named 'x'"):
        catalog.get_device("x")


def test_devices_command_lists_catalog(capsys):
    from planner.cli import main
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in doc["devices"]} >= set(CONTRACT_DEVICES)
    assert all(d["source"] for d in doc["devices"] + doc["nodes"])
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "a100-80gb" in out and "dgx-h100" in out


def test_every_catalog_device_gives_its_host_link():
    # UVM embedding rows are read over this link: PCIe 3.0 (V100, T4, Turing), 4.0 (Ampere), 5.0 (Hopper,
    # Blackwell, MI300X), NVLink-C2C on the Grace superchips
    links = {name: catalog.get_device(name).host_bandwidth_Bps for name in catalog.device_names()}
    assert all(bw > 0 for bw in links.values()), links
    assert links["v100-32gb"] == 15.75e9 and links["a100-80gb"] == 31.5e9 and links["h100-sxm"] == 63e9
    assert links["gh200"] == 450e9


def test_host_memory_lookups_read_over_each_devices_own_link():
    from planner.embeddings.devices import device_arrays
    from planner.hardware import load_cluster
    arrays = device_arrays(load_cluster("hgx-v100-32gb*1+dgx-h100*1"))
    assert set(arrays.host_Bps[:8]) == {15.75e9} and set(arrays.host_Bps[8:]) == {63e9}
