"""Cluster loading: shorthand, files, numbering, overrides, device files; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from planner.cli import main
from planner.errors import ClusterError, ConfigError
from planner.hardware import load_cluster

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = sorted((ROOT / "hardware_profiles" / "clusters").glob("*.yaml"))
SCHEMA = json.loads((ROOT / "planner" / "schemas" / "cluster.schema.json").read_text())


def test_shorthand_numbers_devices_in_group_order():
    cluster = load_cluster("dgx-a100-80gb*16+hgx-v100-32gb*8")
    assert [g.name for g in cluster.groups] == ["dgx-a100-80gb", "hgx-v100-32gb"]
    assert [g.first_device for g in cluster.groups] == [0, 128]
    assert cluster.num_devices == 192
    assert cluster.device_types == ("a100-80gb", "v100-32gb")


def test_shorthand_count_defaults_to_one_and_repeats_get_unique_names():
    cluster = load_cluster(" t4 + dgx-h100*2 + t4*3 ")
    assert [(g.name, g.count, g.first_device) for g in cluster.groups] == [
        ("t4", 1, 0), ("dgx-h100", 2, 1), ("t4_2", 3, 17)]


@pytest.mark.parametrize("text, message", [
    ("dgx-a100-80g*2", "did you mean dgx-a100-80gb"),
    ("dgx-a100-80gb*0", "must be from 1 to 1000000"),
    ("dgx-a100-80gb*-1", "must be from 1 to 1000000"),
    ("dgx-a100-80gb*two", "not a whole number"),
    ("dgx-a100-80gb**2", "cannot read"),
    ("", "empty cluster"),
])
def test_bad_shorthand(text, message):
    with pytest.raises(ClusterError, match=message):
        load_cluster(text)


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_example_clusters_load_and_match_the_schema(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), SCHEMA)
    cluster = load_cluster(path)
    assert cluster.num_devices > 0
    assert len({g.name for g in cluster.groups}) == len(cluster.groups)


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_example_clusters_load_by_name(path):
    def shape(cluster):  # inline nodes' sources name the file's path, which the catalog reaches through a link
        return ([(g.name, g.node.name, g.node.device.name, g.count, g.first_device, g.price_per_node_hour)
                 for g in cluster.groups], cluster.fabric_latency_s, cluster.oversubscription, cluster.name)
    assert shape(load_cluster(path.stem)) == shape(load_cluster(path))
    assert shape(load_cluster(f" {path.stem.upper()} ")) == shape(load_cluster(path))


def test_the_profiles_readme_lists_every_example_cluster():
    """hardware_profiles/README.md's paragraph on clusters/ names each example file by its name."""
    text = (ROOT / "hardware_profiles" / "README.md").read_text(encoding="utf-8")
    paragraph = " ".join(text.split("`clusters/` holds examples:", 1)[1].split("\n\n", 1)[0].split())
    missing = [p.stem for p in CLUSTERS if f"`{p.stem}`" not in paragraph]
    assert not missing, f"hardware_profiles/README.md does not list {missing}"


def test_a_node_name_wins_over_a_cluster_file_of_that_name(tmp_path, monkeypatch):
    root = ROOT / "hardware_profiles"
    for kind in ("devices", "nodes"):
        (tmp_path / kind).symlink_to(root / kind)
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "dgx-h100.yaml").write_text("groups: [{node: t4, count: 2}]\n")
    (tmp_path / "clusters" / "two-t4.yaml").write_text("groups: [{node: t4, count: 2}]\n")
    monkeypatch.setenv("PLANNER_PROFILES_DIR", str(tmp_path))
    assert load_cluster("dgx-h100").device_types == ("h100-sxm",)
    assert load_cluster("two-t4").num_devices == 2


@pytest.mark.parametrize("text, message", [
    ("dgx-a100-1", "unknown node or cluster 'dgx-a100-1' (did you mean dgx-a100-16, "),
    ("nonsense", "unknown node or cluster 'nonsense'"),
    ("dgx-a100-16*2", "unknown node 'dgx-a100-16'"),  # a count multiplies nodes, not cluster files
])
def test_unknown_bare_names_suggest_nodes_and_clusters(text, message):
    with pytest.raises(ClusterError) as err:
        load_cluster(text)
    assert message in str(err.value)


def test_a_missing_file_named_like_an_example_points_at_the_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClusterError, match=r"h100-a100-mixed.yaml: no such file; the catalog's example cluster of "
                                           r"that name is --cluster h100-a100-mixed"):
        load_cluster("h100-a100-mixed.yaml")
    (tmp_path / "h100-a100-mixed.yaml").write_text("groups: [{node: t4, count: 2}]\n")
    assert load_cluster("h100-a100-mixed.yaml").device_types == ("t4",)  # a file of that name is read


def test_devices_lists_the_example_clusters(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "cluster (--cluster NAME)" in out
    assert "h100-a100-mixed           48       dgx-h100*2 + dgx-a100-40gb*4" in out
    assert main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["clusters"]
    assert [c["name"] for c in listed] == [p.stem for p in CLUSTERS]


def test_mixed_examples_exist():
    types = {p.stem: load_cluster(p).device_types for p in CLUSTERS}
    assert set(types["a100-v100-mixed"]) == {"a100-80gb", "v100-32gb"}
    assert set(types["h100-a100-mixed"]) == {"h100-sxm", "a100-40gb"}
    assert "rtx-4090" in types["consumer"]


def test_contract_example_overrides_and_inline_node():
    cluster = load_cluster(ROOT / "hardware_profiles" / "clusters" / "inline-v100.yaml")
    a100, v100 = cluster.groups
    assert a100.node.inter_node_bandwidth_Bps == pytest.approx(50e9)  # the override
    assert v100.node.device.name == "v100-32gb" and v100.node.devices_per_node == 8
    assert v100.node.intra_node_bandwidth_Bps == pytest.approx(150e9)
    assert v100.price_per_node_hour == 8.0 and a100.price_per_node_hour is None
    assert cluster.fabric_latency_s == pytest.approx(5e-6)
    assert v100.first_device == 48 * 8


def test_json_cluster_and_explicit_names(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"groups": [{"name": "fast", "node": "dgx-h100", "count": 2},
                                           {"node": "dgx-h100", "count": 1}],
                                "fabric": {"oversubscription": 2}}))
    cluster = load_cluster(str(path))
    assert [g.name for g in cluster.groups] == ["fast", "dgx-h100"]
    assert cluster.oversubscription == 2.0


def test_device_profile_file_in_a_cluster(tmp_path):
    profile = yaml.safe_load((ROOT / "hardware_profiles" / "devices" / "t4.yaml").read_text())
    profile["name"] = "measured-gpu"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gpu.yaml").write_text(yaml.safe_dump(profile))
    (tmp_path / "c.yaml").write_text(
        "groups:\n"
        "  - node: {device_file: sub/gpu.yaml, devices_per_node: 1, inter_node_bandwidth_GBps: 1.25}\n"
        "    count: 2\n"
        "  - node: {device: ./sub/gpu.yaml, devices_per_node: 2, intra_node_bandwidth_GBps: 16,\n"
        "           inter_node_bandwidth_GBps: 1.25}\n"
        "    count: 1\n")
    cluster = load_cluster(tmp_path / "c.yaml")
    assert [g.node.device.name for g in cluster.groups] == ["measured-gpu", "measured-gpu"]
    assert cluster.num_devices == 4


# ------------------------------------------------------------------------------------------ bad input

def _run_bad(capsys, cluster: str) -> str:
    assert main(["devices", "--cluster", cluster]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("planner: error: ") and "Traceback" not in captured.err
    return lines[0]


BAD_FILES = {
    "unknown_node": ("groups:\n  - node: dgx-a100-80g\n    count: 2\n", r"c\.yaml:2: .*did you mean dgx-a100-80gb"),
    "unknown_device": ("groups:\n  - node: {device: v100-32g, devices_per_node: 1, inter_node_bandwidth_GBps: 1}\n"
                       "    count: 1\n", r"c\.yaml:2: .*unknown device 'v100-32g'.*did you mean v100-32gb"),
    "zero_count": ("groups:\n  - node: t4\n    count: 0\n", r"c\.yaml:3: 'groups\[0\]\.count' must be an integer from 1 to 1000000, got 0"),
    "negative_bandwidth": ("groups:\n  - node: t4\n    count: 1\n    inter_node_bandwidth_GBps: -5\n",
                           r"c\.yaml:4: .*inter_node_bandwidth_GBps' must be a finite number from 0\.001 to 100000, got -5"),
    "zero_inline_bandwidth": ("groups:\n  - node: {device: t4, devices_per_node: 1, inter_node_bandwidth_GBps: 0}\n"
                              "    count: 1\n", r"c\.yaml:2: .*must be a finite number from 0\.001 to"),
    "missing_count": ("groups:\n  - node: t4\n", r"c\.yaml:2: 'groups\[0\]' is missing the required field 'count'"),
    "missing_groups": ("fabric: {latency_us: 1}\n", r"missing the required field 'groups'"),
    "unknown_key": ("groups:\n  - node: t4\n    count: 1\n    cuont: 2\n",
                    r"c\.yaml:4: .*unknown key 'cuont' \(did you mean count"),
    "unknown_fabric_key": ("groups:\n  - node: t4\n    count: 1\nfabric: {latncy_us: 3}\n",
                           r"c\.yaml:4: .*unknown key 'latncy_us'"),
    "malformed": ("groups:\n  - node: t4\n    count: [1\n", r"c\.yaml:4: malformed YAML"),
    "bad_indent": ("groups:\n  - node: t4\n   count: 1\n", r"c\.yaml:3: malformed YAML"),
    "string_count": ("groups:\n  - node: t4\n    count: many\n", r"'groups\[0\]\.count' must be an integer"),
    "no_groups": ("groups: []\n", r"needs at least 1 item"),
    "not_mapping": ("- t4\n", r"must be a mapping"),
    "inline_needs_device": ("groups:\n  - node: {devices_per_node: 1, inter_node_bandwidth_GBps: 1}\n    count: 1\n",
                            r"needs one of: device, device_file"),
    "inline_multi_needs_intra": ("groups:\n  - node: {device: t4, devices_per_node: 4, inter_node_bandwidth_GBps: 1}\n"
                                 "    count: 1\n", r"needs 'intra_node_bandwidth_GBps'"),
    "missing_device_file": ("groups:\n  - node: {device_file: nope.yaml, devices_per_node: 1, "
                            "inter_node_bandwidth_GBps: 1}\n    count: 1\n", r"nope\.yaml.*no such file"),
    "duplicate_names": ("groups:\n  - {name: a, node: t4, count: 1}\n  - {name: a, node: l4, count: 1}\n",
                        r"two groups are named 'a'"),
    "duplicate_key": ("groups:\n  - node: t4\n    count: 1\n    count: 2\n",
                      r"c\.yaml:4: the key 'count' appears twice"),
    "oversubscription_below_one": ("groups:\n  - {node: t4, count: 1}\nfabric: {oversubscription: 0.5}\n",
                                   r"oversubscription' must be a finite number from 1 to 1000, got 0\.5"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_cluster_file_is_one_line_exit_2(case, tmp_path, capsys):
    text, pattern = BAD_FILES[case]
    path = tmp_path / "c.yaml"
    path.write_text(text)
    line = _run_bad(capsys, str(path))
    assert __import__("re").search(pattern, line), line


def test_bad_device_profile_file_names_its_line(tmp_path, capsys):
    profile = yaml.safe_load((ROOT / "hardware_profiles" / "devices" / "t4.yaml").read_text())
    profile["memory_bandwidth_Bps"] = -1.0
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    (tmp_path / "c.yaml").write_text("groups:\n  - node: {device_file: gpu.yaml, devices_per_node: 1, "
                                     "inter_node_bandwidth_GBps: 1}\n    count: 1\n")
    line = _run_bad(capsys, str(tmp_path / "c.yaml"))
    assert "gpu.yaml:" in line and "memory_bandwidth_Bps' must be a finite number from 1e+06 to 1e+15, got -1" in line


@pytest.mark.parametrize("content, what", [
    ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", "it holds plain text"),
    ("password: hunter2\ntoken: s3cret\n", "none of its 2 keys is a device profile field"),
    ("- hunter2\n", "it holds a list"),
])
def test_a_device_file_that_is_no_profile_is_named_without_its_content(tmp_path, capsys, content, what):
    """A cluster file's device_file may point anywhere (``../../etc/passwd``): the error names the file and
    what is wrong, never what the file holds."""
    (tmp_path / "notes.txt").write_text(content)
    (tmp_path / "c.yaml").write_text("groups:\n  - node: {device_file: notes.txt, devices_per_node: 1, "
                                     "inter_node_bandwidth_GBps: 1}\n    count: 1\n")
    line = _run_bad(capsys, str(tmp_path / "c.yaml"))
    assert "notes.txt: not a device profile" in line and what in line
    assert not any(secret in line for secret in ("root:x", "hunter2", "s3cret", "password", "token"))


def test_missing_cluster_file(capsys, tmp_path):
    line = _run_bad(capsys, str(tmp_path / "absent.yaml"))
    assert "no such file" in line
    assert "a cluster file's path, an example cluster's name (`planner devices` lists them) or a shorthand" in line
    assert "no such file" in _run_bad(capsys, str(tmp_path / "absent"))


def test_bad_shorthand_through_cli(capsys):
    line = _run_bad(capsys, "dgx-h10*2")
    assert "did you mean dgx-h100" in line


def test_devices_cluster_json(capsys):
    assert main(["devices", "--cluster", "dgx-a100-80gb*2+t4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["num_devices"] == 17
    assert [g["first_device"] for g in doc["groups"]] == [0, 16]


def _mutations(doc):
    """Single edits of a valid cluster document, each making it invalid."""
    import copy
    group = doc["groups"][0]
    for key in ("node", "count"):
        bad = copy.deepcopy(doc)
        del bad["groups"][0][key]
        yield f"drop {key}", bad
    for key, value in (("count", 0), ("count", -3), ("count", 1.5), ("count", "8"), ("price_per_node_hour", -1),
                       ("inter_node_bandwidth_GBps", 0), ("intra_node_bandwidth_GBps", -2.0), ("colour", "red")):
        bad = copy.deepcopy(doc)
        bad["groups"][0][key] = value
        yield f"{key}={value!r}", bad
    for fabric in ({"latency_us": -1}, {"oversubscription": 0.5}, {"hops": 3}):
        bad = copy.deepcopy(doc)
        bad["fabric"] = fabric
        yield f"fabric {fabric}", bad
    if isinstance(group["node"], dict):
        bad = copy.deepcopy(doc)
        bad["groups"][0]["node"]["devices_per_node"] = 0
        yield "devices_per_node=0", bad


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_our_validator_and_the_json_schema_agree(path):
    from planner.hardware.documents import Document, check
    doc = yaml.safe_load(path.read_text())
    for label, bad in _mutations(doc):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)
        with pytest.raises(ClusterError):
            check(Document(data=bad, where=path.name, lines={}), "cluster")


def test_the_default_dtype_is_one_every_device_runs():
    """bf16 where every device runs it, else the next of fp16 and fp32 they all run: a device profiled with an
    fp32 peak alone (planner profile --device cpu) trains in fp32, which --dtype bf16 would refuse."""
    from planner.hardware.efficiency import resolve_dtype

    def devices(text: str) -> list:
        return [g.node.device for g in load_cluster(text).groups]

    profiled = str(Path(__file__).resolve().parents[1] / "hardware_profiles" / "clusters" / "profiled-cpu.yaml")
    assert resolve_dtype(devices("dgx-a100-80gb*1"), None) == "bf16"
    assert resolve_dtype(devices("dgx-a100-80gb*1+hgx-v100-32gb*1"), None) == "fp16"
    assert resolve_dtype(devices(profiled), None) == "fp32"
    with pytest.raises(ConfigError, match="cannot run it"):
        resolve_dtype(devices(profiled), "bf16")
    # a mixed cluster names the way out: the common dtype, or the cluster without the device that lacks it
    with pytest.raises(ConfigError, match="v100-32gb cannot run it .*use --dtype fp32 or fp16, or a cluster "
                                          "without that device for bf16"):
        resolve_dtype(devices("dgx-a100-80gb*1+hgx-v100-32gb*1"), "bf16")


def test_a_node_gives_its_host_memory_to_the_embedding_sharder(tmp_path):
    """Host (UVM) memory per GPU is the node's system memory over its GPUs where the profile gives it (DGX H200:
    2 TB for 8 GPUs, under twice their HBM), else twice the GPU's memory; an inline node may give it too."""
    from planner.embeddings.devices import HOST_MEMORY_PER_GPU_MEMORY, device_arrays

    h200, h100 = load_cluster("dgx-h200*1"), load_cluster("dgx-h100*1")
    assert h200.groups[0].node.host_memory_bytes == 2000e9
    assert device_arrays(h200, None, None, True).host_capacity_bytes[0] == 2000e9 / 8
    assert h100.groups[0].node.host_memory_bytes == 0
    assert device_arrays(h100, None, None, True).host_capacity_bytes[0] == \
        HOST_MEMORY_PER_GPU_MEMORY * h100.groups[0].node.device.memory_bytes
    path = tmp_path / "inline.yaml"
    path.write_text("groups:\n  - node: {device: t4, devices_per_node: 1, inter_node_bandwidth_GBps: 12.5, "
                    "host_memory_GB: 64}\n    count: 2\n")
    assert device_arrays(load_cluster(path), None, None, True).host_capacity_bytes[0] == 64e9
