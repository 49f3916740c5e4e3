"""Nothing half-written (issue 19): every file the planner writes goes to a temporary file beside the
target and replaces it only when complete, so a run killed or failing mid-write leaves the earlier file
byte for byte, and a failing run leaves no temporary file behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.builders import build, save
from planner.cli import main
from planner.graph import load_model
from planner.outputs import TEMP_SUFFIX, atomic_open, write_text

ROOT = Path(__file__).resolve().parent.parent
GPT = {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("atomic") / "gpt.onnx"
    save(build("gpt", GPT), str(path))
    return str(path)


def plan_argv(model: str, out: Path, *extra: str, global_batch: int = 8) -> list[str]:
    return ["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", str(global_batch), "--out", str(out),
            *extra]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX))


def disk_full() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class HalfFile:
    """A file whose first write stores half of what it is given and then calls ``then`` (the disk fills
    up, or the process is killed)."""

    def __init__(self, handle, then) -> None:
        self.handle, self.then = handle, then

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

    def write(self, data):
        self.handle.write(data[: len(data) // 2])
        self.handle.flush()
        self.then()

    def __getattr__(self, name):  # tell(), seekable(), ... of the real file
        if name in ("handle", "then"):
            raise AttributeError(name)
        return getattr(self.handle, name)


def cut_writes(monkeypatch, then=disk_full) -> None:
    """From now on, every file opened by planner.outputs is cut half-way through its first write."""
    real = os.fdopen
    monkeypatch.setattr("planner.outputs.os.fdopen", lambda *a, **k: HalfFile(real(*a, **k), then))


def test_a_killed_plan_out_leaves_the_earlier_plan(tiny_model, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(plan_argv(tiny_model, out)) == 0
    capsys.readouterr()
    before = out.read_bytes()
    # a child process plans again (with another batch, so another plan), writes half of it and is killed
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import pytest
        from test_atomic_writes import cut_writes, killed
        from planner.cli import main
        cut_writes(pytest.MonkeyPatch(), killed)
        sys.exit(main({plan_argv(tiny_model, out, global_batch=16)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert out.read_bytes() == before
    # the killed run could not remove its temporary file; it holds the half plan, the target does not
    (partial,) = leftovers(tmp_path)
    assert 0 < (tmp_path / partial).stat().st_size < len(before)


def test_a_failing_plan_out_leaves_the_earlier_plan_and_no_temporary_file(tiny_model, tmp_path, capsys,
                                                                           monkeypatch):
    out = tmp_path / "plan.json"
    assert main(plan_argv(tiny_model, out)) == 0
    before = out.read_bytes()
    capsys.readouterr()
    cut_writes(monkeypatch)
    assert main(plan_argv(tiny_model, out, global_batch=16)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"planner: error: --out {out}: cannot write it (No space left on device); choose a writable path"]
    assert out.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_an_interrupt_while_writing_leaves_the_earlier_file(tmp_path):
    out = tmp_path / "a.csv"
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(out) as handle:
            handle.write("new, half")
            raise KeyboardInterrupt
    assert out.read_text() == "old\n" and leftovers(tmp_path) == []


def test_a_new_file_gets_the_permissions_of_a_plain_open_and_an_old_file_keeps_its_own(tmp_path):
    old_umask = os.umask(0o022)
    try:
        fresh = write_text(tmp_path / "fresh.txt", "x", "--out")
        assert fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o600)
        write_text(kept, "new", "--out")
        assert kept.stat().st_mode & 0o777 == 0o600 and kept.read_text() == "new"
    finally:
        os.umask(old_umask)


def test_a_symbolic_link_is_written_through(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(link, "new", "--out")
    assert link.is_symlink() and real.read_text() == "new"


def _whatif(model: str, csv: Path) -> list[str]:
    return ["whatif", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--sweep", "count=1,2",
            "--workers", "1", "--csv", str(csv)]


@pytest.mark.parametrize("name", ["models-build", "whatif-csv", "plan-gantt"])
def test_every_writer_keeps_the_earlier_file_when_a_write_fails(name, tiny_model, tmp_path, capsys, monkeypatch):
    target = tmp_path / {"models-build": "m.onnx", "whatif-csv": "w.csv", "plan-gantt": "g.png"}[name]
    argv = {"models-build": ["models", "build", "gpt", "--set", "layers=2", "--out", str(target)],
            "whatif-csv": _whatif(tiny_model, target),
            "plan-gantt": ["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8",
                           "--gantt", str(target)]}[name]
    assert main(argv) == 0
    before = target.read_bytes()
    assert before
    capsys.readouterr()
    cut_writes(monkeypatch)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert target.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_a_failing_split_keeps_every_earlier_file(tmp_path, capsys, monkeypatch):
    from test_split import FIXTURES, plan_over

    model = os.path.join(FIXTURES, "cnn.onnx")
    graph = load_model(model, dims={"batch": 2})
    plan = tmp_path / "plan.json"
    plan.write_text(plan_over(graph, [1, len(graph.layers) - 1]).to_json())
    out = tmp_path / "stages"
    argv = ["split", model, "--plan", str(plan), "--out-dir", str(out), "--dim", "batch=2", "--force"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["manifest.json", "stage_0.onnx", "stage_1.onnx"]
    capsys.readouterr()
    cut_writes(monkeypatch)
    assert main(argv) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file either
