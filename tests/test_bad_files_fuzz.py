"""Property-based: valid cluster files, device and node profiles, table files and plan files of the
repository, mutated (bit flips, truncation, deleted fields, swapped types, extreme numbers, deep nesting,
aliases), are answered by exit 0, or exit 2 with exactly one ``planner: error:`` line; never a traceback,
never over 5 s. Seeded (``derandomize=True``) and bounded; cases it found are kept as regression tests in
tests/test_bad_files.py (marked "found by tests/test_bad_files_fuzz.py")."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_inputs import CLUSTERS, DEVICES, NODES, PROFILES, TABLE_FILES, clear_caches, run
from plan_samples import ALL as SAMPLE_PLANS
from planner.builders import build, save
from planner.hardware import catalog

EXTREMES = [math.inf, -math.inf, math.nan, 1e308, -1e308, 1e-308, -1, 0, 0.0, 0.5, 2.5, 1, True, False, None,
            "", "x" * 300, "1e999", [], {}, 10**30, -(10**30), 2**63, 10**400]
ALIASES = "x-anchor: &a [1, 2, 3]\nx-alias: [*a, *a, *a]\n"


def fuzzed(examples: int):
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, path + (i,))
    return found


def _set(document: Any, path: tuple, change) -> Any:
    """``document`` with the value at ``path`` replaced by ``change(value)`` (or removed when it returns
    the DELETE marker)."""
    if not path:
        result = change(document)
        return None if result is DELETE else result
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    result = change(parent[path[-1]])
    if result is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = result
    return document


DELETE = object()
VALUE_CHANGES = {
    "delete": lambda draw, value: DELETE,
    "extreme": lambda draw, value: draw(st.sampled_from(EXTREMES)),
    "text": lambda draw, value: str(value),
    "listed": lambda draw, value: [value],
    "mapped": lambda draw, value: {"value": value},
    "nested": lambda draw, value: _nest(value, draw(st.integers(20, 60))),
    "scaled": lambda draw, value: _scaled(value, draw(st.sampled_from([10**6, 10**20, -1, 10**300]))),
}


def _scaled(value: Any, factor: int) -> Any:
    """A number multiplied by ``factor`` (a float overflowing to inf), anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value * factor if isinstance(value, int) else value * float(factor) if abs(value) < 1e300 else -value


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def _dump(document: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(document)
    return yaml.safe_dump(document, sort_keys=False, width=120)


@st.composite
def mutated(draw, base: Any) -> tuple[bytes, bool]:
    """A mutation of ``base`` (a parsed document): (the file's bytes, whether it is JSON)."""
    document = json.loads(json.dumps(base))  # a copy
    as_json = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(sorted(VALUE_CHANGES)))
        if kind == "delete" and not path:
            continue
        document = _set(document, path, lambda value: VALUE_CHANGES[kind](draw, value))
    text = _dump(document, as_json).encode()
    edit = draw(st.sampled_from(["none", "flip", "truncate", "aliases", "repeat"]))
    if edit == "flip" and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + bytes([text[at] ^ (1 << draw(st.integers(0, 7)))]) + text[at + 1:]
    elif edit == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif edit == "aliases" and not as_json:
        text = ALIASES.encode() + text
    elif edit == "repeat":
        text = text + text
    return text, as_json


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """clusters/ and measured/ side by side (a cluster file names ../measured/...), plus a tiny model."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "clusters").mkdir()
    shutil.copytree(PROFILES / "measured", root / "measured")
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(root / "gpt.onnx"))
    return root


def _write(folder: Path, name: str, text: bytes, as_json: bool) -> Path:
    path = folder / f"{name}.{'json' if as_json else 'yaml'}"
    path.write_bytes(text)
    return path


@fuzzed(200)
@given(data=st.data())
def test_mutated_cluster_files(data, folder, capsys):
    base = data.draw(st.sampled_from(CLUSTERS), label="cluster")
    text, as_json = data.draw(mutated(_load(base)))
    run(["devices", "--cluster", str(_write(folder / "clusters", "c", text, as_json)), "--json"], capsys)


@fuzzed(120)
@given(data=st.data())
def test_mutated_device_profiles(data, folder, capsys):
    base = data.draw(st.sampled_from(DEVICES[:3] + DEVICES[-1:]), label="device")
    text, as_json = data.draw(mutated(_load(base)))
    device = _write(folder, "gpu", text, as_json)
    cluster = folder / "device-cluster.yaml"
    cluster.write_text(f"groups:\n  - node: {{device_file: {device.name}, devices_per_node: 2, "
                       "intra_node_bandwidth_GBps: 10, inter_node_bandwidth_GBps: 1}\n    count: 2\n")
    run(["devices", "--cluster", str(cluster), "--json"], capsys)


@pytest.fixture(scope="module")
def own_catalog(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("catalog")
    shutil.copytree(PROFILES / "devices", root / "devices")
    shutil.copytree(PROFILES / "nodes", root / "nodes")
    return root


@fuzzed(80)
@given(data=st.data())
def test_mutated_node_profiles(data, own_catalog, capsys, monkeypatch):
    monkeypatch.setenv(catalog.ENV_VAR, str(own_catalog))
    base = data.draw(st.sampled_from(NODES[:4]), label="node")
    text, _ = data.draw(mutated(_load(base)))
    (own_catalog / "nodes" / base.name).write_bytes(text)
    try:
        run(["devices", "--cluster", f"{base.stem}*2", "--json"], capsys)
    finally:
        shutil.copy(base, own_catalog / "nodes" / base.name)
        clear_caches()


def _table_bases() -> list[Any]:
    """The repository's table files cut to three tables: placing 26 tables is a search of seconds, and the
    mutations are about the file, not the search."""
    criteo = json.loads(TABLE_FILES[0].read_text())
    workloads = json.loads(TABLE_FILES[1].read_text())["workloads"]
    small = {**workloads[0], "tables": workloads[0]["tables"][:3]}
    return [{"tables": criteo["tables"][:3]}, small, {"workloads": [small]}]


@fuzzed(60)
@given(data=st.data())
def test_mutated_table_files(data, folder, capsys):
    base = data.draw(st.sampled_from(_table_bases()), label="tables")
    text, as_json = data.draw(mutated(base))
    tables = _write(folder, "tables", text, as_json)
    run(["estimate", str(folder / "gpt.onnx"), "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--tp", "1",
         "--pp", "1", "--dp", "8", "--tables", str(tables), "--json"], capsys)


@fuzzed(100)
@given(data=st.data())
def test_mutated_plan_files(data, folder, capsys):
    name = data.draw(st.sampled_from(sorted(SAMPLE_PLANS)), label="plan")
    text, _ = data.draw(mutated(SAMPLE_PLANS[name]().to_dict()))
    path = folder / "plan.json"
    path.write_bytes(text)
    run(["show", str(path), "--format", data.draw(st.sampled_from(["table", "json", "megatron"]))], capsys)
