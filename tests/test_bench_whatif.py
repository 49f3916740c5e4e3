"""benchmarks/bench_whatif.py prints its section and writes a file only where --out names one, so a plain run
leaves the recorded runs in benchmarks/results/whatif.md alone. The sweep itself is faked (the real one takes a
minute)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_whatif  # noqa: E402
from planner.sweep.whatif import WhatIfResult  # noqa: E402


@pytest.fixture
def fake_sweep(monkeypatch, tmp_path):
    """No model built or swept; ROOT points at an empty folder, so a default path under it would show. The
    benchmark quiets the planner's logger; its level is put back for the tests that follow."""
    monkeypatch.setattr(bench_whatif, "save", lambda model, path: None)
    monkeypatch.setattr(bench_whatif, "build", lambda family, dims: None)
    monkeypatch.setattr(bench_whatif, "load_model", lambda path: None)
    monkeypatch.setattr(bench_whatif, "whatif", lambda *args, **kwargs: WhatIfResult(points=(), keys=()))
    monkeypatch.setattr(bench_whatif, "ROOT", tmp_path / "root")
    monkeypatch.chdir(tmp_path)
    log = logging.getLogger("planner")
    level = log.level
    yield tmp_path
    log.setLevel(level)


def test_without_out_it_prints_and_writes_nothing(fake_sweep, capsys):
    assert bench_whatif.main(["--a100", "0", "--h100", "0"]) == 0
    assert capsys.readouterr().out.startswith("### 0 points")
    assert list(fake_sweep.iterdir()) == []


def test_out_writes_the_section_under_its_header_and_append_adds_to_it(fake_sweep, capsys):
    out = fake_sweep / "runs.md"
    bench_whatif.main(["--out", str(out)])
    first = out.read_text()
    assert first.startswith(bench_whatif.HEADER) and first.count("### 0 points") == 1
    bench_whatif.main(["--out", str(out), "--append"])
    assert out.read_text().startswith(first) and out.read_text().count("### 0 points") == 2


def test_append_without_out_is_refused(fake_sweep, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_whatif.main(["--append"])
    assert exc.value.code == 2 and "give --out FILE" in capsys.readouterr().err
