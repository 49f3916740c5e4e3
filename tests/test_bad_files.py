"""Bad input files (issue 19): cluster files, device and node profiles, table files and plan files that are
malformed, hostile or out of physical range are each answered within 5 s by exit 2 and one line
``planner: error: ...`` naming the file, the field and the accepted range or the fix; never a traceback.
Every valid file of the repository still loads."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from bad_inputs import CLUSTERS, DEVICES, NODES, PROFILES, ROOT, TABLE_FILES, clear_caches, error_line, run
from plan_samples import ALL as SAMPLE_PLANS
from planner.builders import build, save
from planner.builders.tables import load_tables
from planner.errors import ClusterError
from planner.hardware import catalog, load_cluster
from planner.hardware.documents import (MAX_JSON_BYTES, MAX_NESTING_DEPTH, MAX_PLAN_JSON_BYTES, MAX_YAML_BYTES,
                                        RANGES, _size_text, _yaml_number)
from planner.hardware.profiler import KernelCosts

BILLION_LAUGHS = "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BILLION_LAUGHS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bad_files") / "gpt.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(path))
    return str(path)


def devices(path) -> list[str]:
    return ["devices", "--cluster", str(path), "--json"]


def estimate(model: str, cluster: str, tables=None) -> list[str]:
    argv = ["estimate", model, "--cluster", cluster, "--global-batch", "64", "--tp", "1", "--pp", "1", "--dp", "8",
            "--json"]
    return argv + (["--tables", str(tables)] if tables is not None else [])


def group_text(extra: str) -> str:
    return f"groups:\n  - node: dgx-a100-80gb\n    count: 2\n{extra}"


# ------------------------------------------------------------------------------------ the listed cases

def test_an_infinite_bandwidth_is_refused_with_its_field_and_range(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(group_text("    inter_node_bandwidth_GBps: .inf\n"))
    line = error_line(devices(path), capsys)
    assert line == (f"planner: error: {path}:4: 'groups[0].inter_node_bandwidth_GBps' must be a finite number "
                    "from 0.001 to 100000, got inf")


def test_billion_laughs_yaml_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(BILLION_LAUGHS + "groups: *i\n")
    line = error_line(devices(path), capsys)
    assert str(path) in line and "anchors and aliases (&name, *name) are not accepted" in line


@pytest.mark.parametrize("spec", ["dgx-a100-80gb*99999999999999999999", "dgx-a100-80gb*1000001",
                                  "t4*2+dgx-a100-80gb*" + "9" * 5000])
def test_a_huge_shorthand_count_is_refused(spec, tiny_model, capsys):
    line = error_line(devices(spec), capsys)
    assert "must be from 1 to 1000000 nodes per group" in line
    assert error_line(estimate(tiny_model, spec), capsys) == line  # where the traceback was


@pytest.mark.parametrize("sweep, words", [
    ("count=99999999999999999999", "--sweep count: 99999999999999999999 must be from 0 to 1000000"),
    ("count=1" + "0" * 5000, "has over 20 digits"),
    ("inter_node_bandwidth_GBps=1e9", "must be at most 100000, as in a cluster file"),
])
def test_a_huge_sweep_value_is_refused_like_a_cluster_file(sweep, words, tiny_model, capsys):
    argv = ["whatif", tiny_model, "--cluster", "t4", "--global-batch", "8", "--sweep", sweep, "--workers", "1"]
    assert words in error_line(argv, capsys)


def test_too_many_shorthand_groups(capsys):
    assert "over the limit of 1024" in error_line(devices("+".join(["t4"] * 1025)), capsys)


# ------------------------------------------------------------------------------------ cluster files

CLUSTER_CASES = {
    "json_infinity": ("c.json", '{"groups": [{"node": "t4", "count": 1, "intra_node_bandwidth_GBps": Infinity}]}',
                      "'groups[0].intra_node_bandwidth_GBps' must be a finite number from 0.001 to 100000, got inf"),
    "nan_latency": ("c.yaml", "groups: [{node: t4, count: 1}]\nfabric: {latency_us: .nan}\n",
                    "'fabric.latency_us' must be a finite number from 0 to 1e+06, got nan"),
    "bandwidth_1e308": ("c.yaml", group_text("    inter_node_bandwidth_GBps: 1.0e+308\n"),
                        "must be a finite number from 0.001 to 100000, got 1e+308"),
    "negative_price": ("c.yaml", group_text("    price_per_node_hour: -1\n"),
                       "'groups[0].price_per_node_hour' must be a finite number from 0 to 1e+06, got -1"),
    "half_a_node": ("c.yaml", "groups: [{node: t4, count: 2.5}]\n",
                    "'groups[0].count' must be an integer from 1 to 1000000, got 2.5"),
    "bool_count": ("c.yaml", "groups: [{node: t4, count: true}]\n",
                   "'groups[0].count' must be an integer from 1 to 1000000, got a boolean"),
    "huge_count": ("c.yaml", f"groups: [{{node: t4, count: {10**30}}}]\n",
                   "'groups[0].count' must be an integer from 1 to 1000000, got 1e+30"),
    "5000_digits": ("c.yaml", "groups: [{node: t4, count: 1" + "0" * 5000 + "}]\n",
                    "a number in the file has over 4300 digits"),
    "inline_2.5_devices": ("c.yaml", "groups:\n  - node: {device: t4, devices_per_node: 2.5, "
                           "intra_node_bandwidth_GBps: 10, inter_node_bandwidth_GBps: 1}\n    count: 1\n",
                           "'groups[0].node.devices_per_node' must be an integer from 1 to 1024, got 2.5"),
    "inline_efficiency_0": ("c.yaml", "groups:\n  - node: {device: t4, devices_per_node: 1, "
                            "inter_node_bandwidth_GBps: 1, inter_node_efficiency: 0}\n    count: 1\n",
                            "'groups[0].node.inter_node_efficiency' must be a finite number from 1e-06 to 1, got 0"),
    "oversubscription": ("c.yaml", "groups: [{node: t4, count: 1}]\nfabric: {oversubscription: 1.0e+9}\n",
                         "'fabric.oversubscription' must be a finite number from 1 to 1000"),
    "merge_key_alias": ("c.yaml", "base: &base {node: t4, count: 1}\ngroups:\n  - <<: *base\n",
                        "anchors and aliases"),
    "deep_flow": ("c.yaml", "groups: " + "[" * (MAX_NESTING_DEPTH + 8) + "]" * (MAX_NESTING_DEPTH + 8) + "\n",
                  f"nested deeper than {MAX_NESTING_DEPTH} levels"),
    "very_deep_flow": ("c.yaml", "groups: " + "[" * 100_000 + "]" * 100_000 + "\n", "malformed YAML/JSON"),
    "very_deep_block": ("c.yaml", "groups:\n" + "- " * 20_000 + "x\n", "malformed YAML/JSON"),
    "deep_json": ("c.json", '{"groups": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than"),
    "complex_key": ("c.yaml", "? [groups]\n: 1\n", "a key must be plain text"),
    "not_utf8": ("c.yaml", b"groups: [{node: t4, count: 1}] # \xff\xfe\n", "is not a UTF-8 text file"),
    "truncated": ("c.yaml", "groups:\n  - {node: dgx-a100-80gb, cou",
                  "malformed YAML/JSON: did not find expected ',' or '}'; fix the syntax at or before that line"),
    "yaml_named_json": ("c.json", "groups: [{node: t4, count: 1}]\n", "not valid JSON (line 1, column 1: Expecting "
                        "value); fix the syntax at that line (a YAML file must be named .yaml or .yml)"),
    # YAML 1.1 reads an exponent only after a dot and with a sign: 5e1 is text, and the message says how to write it
    "exponent_without_dot": ("c.yaml", group_text("    inter_node_bandwidth_GBps: 5e1\n"),
                             "'groups[0].inter_node_bandwidth_GBps' must be a number from 0.001 to 100000, got the "
                             "text '5e1'; write 50 (YAML reads 5e1 as text; 5.0e+1 is a number)"),
    "small_exponent": ("c.yaml", "groups: [{node: t4, count: 1}]\nfabric: {latency_us: 2e-1}\n",
                       "got the text '2e-1'; write 0.2 (YAML reads 2e-1 as text; 2.0e-1 is a number)"),
    "quoted_count": ("c.yaml", "groups: [{node: t4, count: '2'}]\n",
                     "'groups[0].count' must be an integer from 1 to 1000000, got the text '2'; write 2 without "
                     "quotes"),
    "a_date": ("c.yaml", "groups: [{node: t4, count: 2024-01-01}]\n", "'groups[0].count' must be an integer"),
    "no_such_date": ("c.yaml", "groups: [{node: t4, count: 2024-13-45}]\n",
                     "a value cannot be read (month must be in 1..12); write it as plain text or a number"),
    "long_unknown_key": ("c.json", '{"groups": [{"node": "t4", "count": 1, "' + "x" * 100_000 + '": 1}]}',
                         "has an unknown key 'xxxxxxxxxx"),
    "binary_tag": ("c.yaml", "groups: [{node: !!binary aGVsbG8=, count: 1}]\n", "'groups[0].node' must be"),
    "python_tag": ("c.yaml", "groups: [{node: !!python/object:os.system x, count: 1}]\n", "malformed YAML/JSON"),
    # json keeps the last of two equal keys, which used to report the empty list as too short
    "json_key_twice": ("c.json", '{"groups":[{"node":"dgx-a100-80gb","count":1}],"groups":[]}',
                       ":1: the key 'groups' appears twice; keep one"),
    "json_inner_key_twice": ("c.json", '{"groups": [{"node": "t4",\n "count": 1, "count": 2}]}',
                             ":2: the key 'count' appears twice; keep one"),
    "yaml_key_twice": ("c.yaml", "groups: [{node: t4, count: 1}]\ngroups: []\n",
                       ":2: the key 'groups' appears twice; keep one"),
}


@pytest.mark.parametrize("value", [50.0, 0.2, 1e-7, 1.5e-7, 1e20, 123456789.125, -0.001, 2.0**70])
def test_the_number_a_message_suggests_is_one_yaml_reads_back(value):
    """The spelling after "write" is a number to YAML 1.1 (an exponent with a dot and a sign), and the same one."""
    assert yaml.safe_load(_yaml_number(value)) == value


@pytest.mark.parametrize("case", sorted(CLUSTER_CASES))
def test_bad_cluster_file(case, tmp_path, capsys):
    name, text, words = CLUSTER_CASES[case]
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    line = error_line(devices(path), capsys)
    assert str(path) in line and words in line, line


@pytest.mark.parametrize("profile, kind", [("devices/h100-sxm.yaml", "device"), ("nodes/dgx-h100.yaml", "node"),
                                           ("onnx", "binary")])
def test_a_file_of_another_kind_given_as_the_cluster_is_named(profile, kind, tiny_model, capsys):
    """A device or node profile, or an ONNX model, passed to --cluster says what it is and what a cluster is,
    not "unknown key 'vendor'" or a UTF-8 decoding error."""
    path = tiny_model if profile == "onnx" else str(ROOT / "hardware_profiles" / profile)
    line = error_line(devices(path), capsys)
    if kind == "binary":
        assert line.endswith("is not a UTF-8 text file (a binary file such as an ONNX model?); give a YAML/JSON file")
    else:
        assert f"this is a {kind} profile, not a cluster file" in line and "dgx-h100*4" in line


def test_an_oversized_cluster_file_is_refused_before_it_is_read(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("groups: [{node: t4, count: 1}]\n" + "# padding\n" * (MAX_YAML_BYTES // 10 + 1))
    line = error_line(devices(path), capsys)
    size = _size_text(path.stat().st_size)
    assert line == (f"planner: error: {path}: the file is {size}, over the limit of 256 KiB for a "
                    "YAML/JSON input file; check that it is the file meant")


@pytest.mark.parametrize("name, body", [
    ("c.yaml", lambda room: "groups: [" + "0," * (room // 2) + "0]\n"),  # the most YAML nodes per byte
    ("c.yaml", lambda room: "groups:\n" + "- {a: 1}\n" * (room // 9)),
    ("c.json", lambda room: '{"groups": [' + "0," * (room // 2) + "0]}"),
])
def test_the_worst_file_under_the_size_limit_is_answered_in_time(name, body, tmp_path, capsys):
    # run() holds every answer to 5 s; these are the slowest shapes a file within the limit can take
    path = tmp_path / name
    path.write_text(body(MAX_YAML_BYTES - 64))
    assert "takes at most 1024 items" in error_line(devices(path), capsys)


def test_the_worst_json_under_the_size_limit_is_answered_in_time(tiny_model, tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text('{"tables": [' + "[]," * ((MAX_JSON_BYTES - 64) // 3) + "[]]}")  # the most lists per byte
    assert "takes at most 100000 items" in error_line(estimate(tiny_model, "dgx-a100-80gb*1", path), capsys)


def test_a_folder_is_not_a_cluster_file(tmp_path, capsys, monkeypatch):
    assert "is not a file" in error_line(devices(str(tmp_path) + "/"), capsys)
    # a folder named without a slash (`--cluster hardware_profiles`) is a folder too, not an unknown node
    (tmp_path / "profiles").mkdir()
    monkeypatch.chdir(tmp_path)
    assert error_line(devices("profiles"), capsys) == "planner: error: profiles: is not a file; give a YAML/JSON file"


# ------------------------------------------------------------------------------ device and node profiles

def _device_cluster(tmp_path, device: dict | str) -> str:
    text = device if isinstance(device, str) else yaml.safe_dump(device, sort_keys=False)
    (tmp_path / "gpu.yaml").write_text(text)
    cluster = tmp_path / "c.yaml"
    cluster.write_text("groups:\n  - node: {device_file: gpu.yaml, devices_per_node: 1, "
                       "inter_node_bandwidth_GBps: 1}\n    count: 1\n")
    return str(cluster)


@pytest.mark.parametrize("field, value, words", [
    (("peak_flops_per_s", "bf16"), float("inf"),
     "'peak_flops_per_s.bf16' must be a finite number from 1e+06 to 1e+19, got inf"),
    (("memory_bytes",), 10**308, "'memory_bytes' must be an integer from 1 to 1125899906842624, got 1e+308"),
    (("memory_bytes",), 8.5, "'memory_bytes' must be an integer"),
    (("memory_bandwidth_Bps",), float("nan"),
     "'memory_bandwidth_Bps' must be a finite number from 1e+06 to 1e+15, got nan"),
    (("gemm_efficiency", 0, 1), 0.0, "'gemm_efficiency[0][1]' must be a finite number from 1e-06 to 1, got 0"),
    (("op_overhead_s",), -1, "'op_overhead_s' must be a finite number from 0 to 1, got -1"),
    # found by tests/test_bad_files_fuzz.py: an integer too large for a float (the range check overflowed)
    (("memory_bytes",), 10**400, "'memory_bytes' must be an integer from 1 to 1125899906842624, got a number of "
                                 "over 300 digits"),
    (("memory_bandwidth_Bps",), -(10**400), "'memory_bandwidth_Bps' must be a finite number from 1e+06 to 1e+15"),
])
def test_bad_device_profile(field, value, words, tmp_path, capsys):
    profile = yaml.safe_load((PROFILES / "devices" / "a100-80gb.yaml").read_text())
    target = profile
    for part in field[:-1]:
        target = target[part]
    target[field[-1]] = value
    line = error_line(devices(_device_cluster(tmp_path, profile)), capsys)
    assert "gpu.yaml" in line and words in line, line


def test_a_key_twice_in_a_json_device_profile_or_a_measured_profile_is_refused(tmp_path, capsys):
    profile = (PROFILES / "devices" / "a100-80gb.yaml").read_text()
    cluster = _device_cluster(tmp_path, profile)
    (tmp_path / "gpu.json").write_text(json.dumps(yaml.safe_load(profile))[:-1] + ', "name": "again"}')
    (tmp_path / "c.yaml").write_text((tmp_path / "c.yaml").read_text().replace("gpu.yaml", "gpu.json"))
    line = error_line(devices(cluster), capsys)
    assert "gpu.json:1: the key 'name' appears twice; keep one" in line, line
    measured = tmp_path / "measured.yaml"
    measured.write_text("measured:\n  kernel_costs: {row_s: 1.0e-6, row_s: 2.0e-6}\n")
    with pytest.raises(ClusterError, match="measured.yaml:2: the key 'row_s' appears twice; keep one"):
        KernelCosts.from_file(measured)


def test_a_device_profile_of_aliases_is_refused(tmp_path, capsys):
    line = error_line(devices(_device_cluster(tmp_path, BILLION_LAUGHS + "name: x\n")), capsys)
    assert "gpu.yaml" in line and "anchors and aliases" in line


@pytest.fixture
def own_catalog(tmp_path, monkeypatch):
    """A copy of the catalog in $PLANNER_PROFILES_DIR, for a test to break one of its node profiles."""
    shutil.copytree(PROFILES / "devices", tmp_path / "devices")
    shutil.copytree(PROFILES / "nodes", tmp_path / "nodes")
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    yield tmp_path / "nodes"
    clear_caches()


@pytest.mark.parametrize("replace, words", [
    (("nic_bandwidth_GBps: 25", "nic_bandwidth_GBps: .nan"),
     "'nic_bandwidth_GBps' must be a finite number from 0.001 to 100000, got nan"),
    (("devices_per_node: 8", "devices_per_node: 2.5"),
     "'devices_per_node' must be an integer from 1 to 1024, got 2.5"),
    (("nics_per_node: 8", "nics_per_node: true"), "'nics_per_node' must be an integer from 1 to 1024, got a boolean"),
    (("inter_node_latency_us: 4.5", "inter_node_latency_us: 1e999"), "'inter_node_latency_us' must be a number"),
    (("inter_node_latency_us: 4.5", "inter_node_latency_us: 1.0e+999"),
     "must be a finite number from 0 to 1e+06, got inf"),
    # found by tests/test_bad_files_fuzz.py
    (("devices_per_node: 8", f"devices_per_node: {10**400}"),
     "'devices_per_node' must be an integer from 1 to 1024"),
    # the node file names the device, so the message names the node file and its line
    (("device: a100-80gb", "device: nosuch-gpu"), "dgx-a100-80gb.yaml:4: unknown device 'nosuch-gpu'"),
])
def test_bad_node_profile(replace, words, own_catalog, capsys):
    path = own_catalog / "dgx-a100-80gb.yaml"
    old, new = replace
    path.write_text(path.read_text().replace(old, new))
    line = error_line(devices("dgx-a100-80gb*2"), capsys)
    assert str(path) in line and words in line, line


# ------------------------------------------------------------------------------------------ table files

TABLE_CASES = {
    "infinite_pooling": ("t.json", '{"tables": [{"name": "a", "rows": 10, "dim": 4, "pooling_factor": Infinity}]}',
                         "'tables[0].pooling_factor' must be a finite number from 1e-06 to 1e+06, got inf"),
    "overflowing_rows": ("t.json", '{"tables": [{"name": "a", "rows": 1e999, "dim": 4}]}',
                         "'tables[0].rows' must be an integer from 1 to 1000000000000, got inf"),
    "half_a_row": ("t.yaml", "tables: [{name: a, rows: 2.5, dim: 4}]\n",
                   "'tables[0].rows' must be an integer from 1 to 1000000000000, got 2.5"),
    "bool_dim": ("t.json", '{"tables": [{"name": "a", "rows": 10, "dim": true}]}',
                 "'tables[0].dim' must be an integer from 1 to 65536, got a boolean"),
    "dim_1e308": ("t.yaml", "tables: [{name: a, rows: 10, dim: 1.0e+308}]\n",
                  "'tables[0].dim' must be an integer from 1 to 65536"),
    "nan_mlp": ("t.json", '{"tables": [{"name": "a", "rows": 10, "dim": 4}], "top_mlp": [64, NaN]}',
                "'top_mlp[1]' must be an integer from 1 to 1000000, got nan"),
    "aliases": ("t.yaml", BILLION_LAUGHS + "tables: *i\n", "anchors and aliases"),
    "deep_json": ("t.json", '{"tables": ' + "[" * 50_000 + "]" * 50_000 + "}",
                  f"nested deeper than {MAX_NESTING_DEPTH}"),
    "5000_digits": ("t.json", '{"tables": [{"name": "a", "rows": 1' + "0" * 5000 + ', "dim": 4}]}',
                    "a number in the file has over 4300 digits"),
    "not_a_mapping": ("t.json", "[1, 2]", "must be a mapping"),
    "truncated": ("t.json", '{"tables": [{"name": "a", "ro', "not valid JSON"),
    "key_twice": ("t.json", '{"tables": [{"name": "a", "rows": 10, "dim": 4, "dim": 8}]}',
                  ":1: the key 'dim' appears twice; keep one"),
    # a misspelt field used to fall back to its default silently
    "misspelt_pooling": ("t.json", '{"tables": [{"name": "a", "rows": 10, "dim": 4, "pooling_factr": 50}]}',
                         "'tables[0]' has an unknown key 'pooling_factr' (did you mean pooling_factor?)"),
}


def test_a_table_file_that_is_a_folder_is_named(tiny_model, tmp_path, capsys):
    line = error_line(estimate(tiny_model, "dgx-a100-80gb*1", tmp_path), capsys)
    assert f"tables file '{tmp_path}' is a folder" in line, line


@pytest.mark.parametrize("case", sorted(TABLE_CASES))
def test_bad_table_file(case, tiny_model, tmp_path, capsys):
    name, text, words = TABLE_CASES[case]
    path = tmp_path / name
    path.write_text(text)
    line = error_line(estimate(tiny_model, "dgx-a100-80gb*1", path), capsys)
    assert str(path) in line and words in line, line


def test_an_oversized_table_file_is_refused_before_it_is_read(tiny_model, tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text('{"tables": [' + ", ".join(['{"name": "a", "rows": 1, "dim": 1}'] * (MAX_JSON_BYTES // 30)) + "]}")
    line = error_line(estimate(tiny_model, "dgx-a100-80gb*1", path), capsys)
    assert str(path) in line and "over the limit of 4 MiB for a JSON input file" in line


# ------------------------------------------------------------------------------------------- plan files

def _plan_file(tmp_path, change) -> str:
    document = SAMPLE_PLANS["gpt"]().to_dict()
    change(document)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize("label, change, words", [
    ("nan_time", lambda d: d.update(iteration_time_s=float("nan")),
     "plan.iteration_time_s: nan is not a finite number"),
    ("inf_stage_time", lambda d: d["stages"][1].update(time_s=float("inf")),
     "plan.stages[1].time_s: inf is not a finite"),
    ("bool_tp", lambda d: d["stages"][0].update(tp=True), "plan.stages.0.tp: True is not of type 'integer'"),
    ("half_dp", lambda d: d["stages"][0].update(dp=2.5), "plan.stages.0.dp: 2.5 is not of type 'integer'"),
    ("huge_devices", lambda d: d["cluster"].update(num_devices=10**30), "is greater than the maximum of 1099511627776"),
    ("huge_memory", lambda d: d.update(memory_per_device_bytes=1e300), "is greater than the maximum"),
])
def test_bad_plan_file(label, change, words, tmp_path, capsys):
    path = _plan_file(tmp_path, change)
    line = error_line(["show", path], capsys)
    assert path in line and words.replace("plan.stages.0", "plan.stages[0]") in line.replace(
        "plan.stages.0", "plan.stages[0]"), line


@pytest.mark.parametrize("label, text, words", [
    ("infinity_literal", '{"schema_version": 1, "iteration_time_s": -Infinity}', "is not a finite number"),
    ("deep", '{"schema_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than"),
    ("5000_digits", '{"schema_version": 1' + "0" * 5000 + "}", "over 4300 digits"),
    ("truncated", SAMPLE_PLANS["gpt"]().to_json()[:200], "not valid JSON"),
    ("key_twice", '{"schema_version": 1,\n"schema_version": 2}', "plan.json:2: the key 'schema_version' appears twice"),
    # too large to find the line by reading it as YAML as well: the key alone is named
    ("key_twice_in_a_large_file", '{"x": "' + " " * MAX_YAML_BYTES + '", "x": 1}',
     "plan.json: the key 'x' appears twice; keep one"),
    ("list", "[1, 2]", "plan.json: expected a JSON object at the top level"),
    ("old_version", '{"schema_version": 0}', "plan.json: schema_version 0 is not supported"),
])
def test_malformed_plan_file(label, text, words, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(text)
    line = error_line(["show", str(path)], capsys)
    # the file is named once, in place of the plan (no "PATH: plan: ..." or "PATH: plan:LINE: ...")
    assert str(path) in line and words in line and "plan:" not in line, line


def test_an_oversized_plan_file_is_refused_before_it_is_read(tmp_path, capsys):
    path = tmp_path / "plan.json"
    with open(path, "wb") as handle:  # a sparse file: its size without the disk space
        handle.truncate(MAX_PLAN_JSON_BYTES + 1)
    line = error_line(["show", str(path)], capsys)
    assert str(path) in line and "over the limit of 1 GiB for a JSON input file" in line


# ------------------------------------------------------------------------------ every valid file loads

@pytest.mark.parametrize("path", CLUSTERS + sorted((ROOT / "planner" / "hardware_profiles" / "clusters").glob("*")),
                         ids=str)
def test_every_cluster_file_of_the_repository_loads(path, capsys):
    assert run(devices(path), capsys)[0] == 0


def test_every_device_and_node_profile_of_the_repository_loads(capsys):
    code, out, _ = run(["devices", "--json"], capsys)
    document = json.loads(out)
    assert code == 0
    assert {d["name"] for d in document["devices"]} == {p.stem for p in DEVICES if p.parent.name == "devices"}
    assert {n["name"] for n in document["nodes"]} == {p.stem for p in NODES}
    for path in DEVICES:
        assert catalog.load_device_file(path).name


def test_every_table_file_of_the_repository_loads():
    assert len(load_tables(str(TABLE_FILES[0])).tables) == 26
    workloads = json.loads(TABLE_FILES[1].read_text())["workloads"]
    for workload in workloads:
        assert load_tables(str(TABLE_FILES[1]), workload["name"]).tables


@pytest.mark.parametrize("name", sorted(SAMPLE_PLANS))
def test_every_sample_plan_loads(name, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(SAMPLE_PLANS[name]().to_json())
    assert run(["show", str(path), "--json"], capsys)[0] == 0


def test_the_limits_keep_the_catalogs_largest_numbers_inside():
    # the catalog's extremes sit well inside the physical limits (no valid file is near an edge)
    clusters = [load_cluster(p) for p in CLUSTERS]
    assert max(g.count for c in clusters for g in c.groups) < RANGES["nodes"][1]
    peak = max(v for n in catalog.device_names() for v in catalog.get_device(n).peak_flops_per_s.values())
    assert peak * 100 < RANGES["flops_per_s"][1]


# ----------------------------------------------------------------------------- paths the system refuses

def test_a_model_path_that_is_not_a_regular_file_is_refused_before_reading(capsys):
    """/dev/zero never ends: it is refused by its kind, not read until memory runs out."""
    assert error_line(["inspect", "/dev/zero"], capsys) == (
        "planner: error: /dev/zero: is not a regular file; give the path of an .onnx model file")


def test_paths_the_system_cannot_take_are_one_line(tiny_model, tmp_path, capsys):
    long_name = "a" * 300
    line = error_line(["inspect", str(tmp_path / f"{long_name}.onnx")], capsys)
    assert line.startswith("planner: error: ") and "cannot read it (File name too long)" in line
    line = error_line(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "16",
                       "--out", str(tmp_path / f"{long_name}.json")], capsys)
    assert line.startswith("planner: error: --out ") and "cannot write there (File name too long)" in line
    line = error_line(["models", "build", "gpt", "--out", f"{tiny_model}/x.onnx"], capsys)
    assert line == f"planner: error: --out {tiny_model}/x.onnx: {tiny_model!r} is not a folder"
    cluster = tmp_path / "c.yaml"
    cluster.write_text('groups:\n  - node: {device_file: "a\\0b.yaml", devices_per_node: 1, '
                       'inter_node_bandwidth_GBps: 1}\n    count: 1\n')
    line = error_line(devices(cluster), capsys)
    assert line.startswith(f"planner: error: {cluster}:2: device profile ") and "embedded null byte" in line


def test_an_output_that_names_an_input_is_refused_before_it_is_read(tiny_model, tmp_path, capsys):
    """plan --out on its own model (or cluster file, or --gantt on --out) would destroy what the run reads."""
    model = tmp_path / "m.onnx"
    shutil.copy(tiny_model, model)
    before = model.read_bytes()
    line = error_line(["plan", str(model), "--cluster", "dgx-a100-80gb*1", "--global-batch", "16", "--out",
                       str(model)], capsys)
    assert line == f"planner: error: --out {model}: is also the model, which the run would overwrite; give another path"
    assert model.read_bytes() == before
    out = str(tmp_path / "p.png")
    line = error_line(["plan", str(model), "--cluster", "dgx-a100-80gb*1", "--global-batch", "16", "--out", out,
                       "--gantt", out], capsys)
    assert line.startswith(f"planner: error: --gantt {out}: is also --out")


@pytest.mark.parametrize("written", ["010", "0x10", "1:30", "1_000", "1:30.5"])
def test_a_number_yaml_reads_in_another_base_is_refused(written, tmp_path):
    """YAML 1.1 reads 010 as 8 and 1:30 as 90; a cluster file's count or bandwidth would take it silently."""
    path = tmp_path / "c.yaml"
    path.write_text(f"groups:\n  - node: dgx-a100-80gb\n    count: {written}\n")
    with pytest.raises(ClusterError, match=rf"c\.yaml:3: the number '{written}' is not plain decimal"):
        load_cluster(str(path))
    path.write_text("groups:\n  - node: dgx-a100-80gb\n    count: 10\n")
    assert load_cluster(str(path)).num_devices == 80
