"""Shared by the bad-file tests: calling the CLI in-process on an input file and checking the outcome the
contract promises (exit 0, or exit 2 with exactly one ``planner: error:`` line; never a traceback; within
ANSWER_S seconds), and the valid input files of the repository that the mutations start from."""

from __future__ import annotations

import time
from pathlib import Path

from planner.cli import main
from planner.hardware import catalog

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "hardware_profiles"
CLUSTERS = sorted((PROFILES / "clusters").glob("*.yaml"))
DEVICES = sorted((PROFILES / "devices").glob("*.yaml")) + sorted((PROFILES / "measured").glob("*.yaml"))
NODES = sorted((PROFILES / "nodes").glob("*.yaml"))
TABLE_FILES = [ROOT / "models" / "criteo-tables.json", ROOT / "benchmarks" / "data" / "embedding_workloads.json"]
ANSWER_S = 5.0  # every input, good or bad, is answered within this


def clear_caches() -> None:
    """Forget the profiles read so far: the tests rewrite files under the same names."""
    catalog._files.cache_clear()
    catalog._load_device.cache_clear()
    catalog._load_node.cache_clear()


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``planner ARGV`` in-process: (exit code, stdout, stderr), checked to follow the contract in time."""
    capsys.readouterr()
    clear_caches()
    start = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert seconds < ANSWER_S, f"planner {' '.join(argv)} took {seconds:.1f} s"
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("planner: error: "), err
    return code, out, err


def error_line(argv: list[str], capsys) -> str:
    """The one error line of a run that must fail (exit 2)."""
    code, _, err = run(argv, capsys)
    assert code == 2, f"planner {' '.join(argv)} was accepted"
    return err.strip()
