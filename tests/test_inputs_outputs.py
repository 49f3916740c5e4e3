"""Where the output goes: a named pipe (or a link to one) given as an output path is written into, not
replaced by a regular file; an empty output path is an error naming its flag; ``planner`` alone ends with a
``planner: error:`` line; and a failure to write stdout is one error line with exit code 2.

The special-file tests use a named pipe in tmp_path, never /dev/null: if the direct write regressed to the
temporary-file-and-replace path, only the test's own pipe would be turned into a file. Its read end is opened
non-blocking before the write, so the write never waits for a reader and a regression fails instead of hanging.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from planner.builders import build, save
from planner.cli import build_parser, main
from planner.errors import ConfigError
from planner.outputs import atomic_open, check_output_file, write_bytes, write_text

GPT = {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}
CLUSTER = ["--cluster", "dgx-a100-80gb*1", "--global-batch", "8"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("inputs_outputs") / "gpt.onnx"
    save(build("gpt", GPT), str(path))
    return str(path)


@pytest.fixture
def fifo(tmp_path: Path):
    """A named pipe in tmp_path and the non-blocking read end opened on it: (path, read fd)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    yield path, reader
    os.close(reader)


def drain(reader: int) -> bytes:
    """Everything written into the pipe so far (the writer has closed its end)."""
    chunks = []
    while True:
        try:
            chunk = os.read(reader, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def last_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("planner: error: "), err
    return line


# ------------------------------------------------------------------------------------------- special files
@pytest.mark.parametrize("via_link", [False, True], ids=["pipe", "link-to-pipe"])
def test_write_text_writes_into_a_named_pipe(fifo, via_link: bool) -> None:
    path, reader = fifo
    target = path
    if via_link:  # as /dev/stdout is a link to the process's stdout
        target = path.parent / "link"
        target.symlink_to(path)
    write_text(target, "hello\n", "--out")
    assert stat.S_ISFIFO(os.stat(path).st_mode), "the pipe was replaced by a regular file"
    assert drain(reader) == b"hello\n"
    if via_link:
        assert target.is_symlink()


def test_write_bytes_and_atomic_open_write_into_a_named_pipe(fifo) -> None:
    path, reader = fifo
    write_bytes(path, b"\x00\x01", "--out")
    assert drain(reader) == b"\x00\x01"
    with atomic_open(path) as handle:
        handle.write("text")
    assert drain(reader) == b"text"
    assert stat.S_ISFIFO(os.stat(path).st_mode)
    assert sorted(p.name for p in path.parent.iterdir()) == ["pipe"]  # no temporary file beside it


def test_a_regular_file_is_still_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    before = os.stat(target).st_ino
    write_text(target, "new", "--out")
    assert target.read_text() == "new"
    assert os.stat(target).st_ino != before  # a new file renamed over the old one, not the old one rewritten


def test_plan_out_into_a_named_pipe(tiny_model, fifo, capsys) -> None:
    path, reader = fifo
    assert main(["plan", tiny_model, *CLUSTER, "--out", str(path)]) == 0
    assert stat.S_ISFIFO(os.stat(path).st_mode)
    assert b'"schema_version"' in drain(reader)


# -------------------------------------------------------------------------------------------- empty paths
def test_check_output_file_refuses_an_empty_path() -> None:
    with pytest.raises(ConfigError, match=r"^--out: the path is empty; give a file name$"):
        check_output_file("", "--out")
    with pytest.raises(ConfigError, match=r"^--plot: the path is empty"):
        check_output_file("", "--plot", (".png", ".svg"))


def must_not_run(*args, **kwargs):
    raise AssertionError("the command did its work before checking its output paths")


@pytest.mark.parametrize("flag", ["--out", "--gantt"])
def test_plan_refuses_an_empty_output_path(tiny_model, flag: str, capsys, monkeypatch) -> None:
    monkeypatch.setattr("planner.search.search", must_not_run)
    assert main(["plan", tiny_model, *CLUSTER, flag, ""]) == 2
    assert last_error_line(capsys) == f"planner: error: {flag}: the path is empty; give a file name"


@pytest.mark.parametrize("flag", ["--csv", "--plot"])
def test_whatif_refuses_an_empty_output_path(tiny_model, flag: str, capsys, monkeypatch) -> None:
    monkeypatch.setattr("planner.sweep.whatif.whatif", must_not_run)
    assert main(["whatif", tiny_model, *CLUSTER, "--sweep", "count=1,2", "--workers", "1", flag, ""]) == 2
    assert last_error_line(capsys) == f"planner: error: {flag}: the path is empty; give a file name"


@pytest.mark.parametrize("argv", [["models", "build", "gpt", "--out", ""], ["profile", "--out", ""]],
                         ids=["models-build", "profile"])
def test_required_output_paths_refuse_the_empty_path(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    assert last_error_line(capsys) == "planner: error: --out: the path is empty; give a file name"


# ------------------------------------------------------------------------------------------ the CLI itself
def test_no_command_is_one_error_line(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give a command" in err[0] and "planner --help" in err[0]


class FailingStdout:
    """A stdout whose write (or only its flush, as a buffered file on a full disk) fails with ``error``."""

    def __init__(self, error: OSError, on_flush: bool = False) -> None:
        self.error, self.on_flush, self.written = error, on_flush, []

    def write(self, text: str) -> int:
        if not self.on_flush:
            raise self.error
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if self.on_flush:
            raise self.error

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("on_flush", [False, True], ids=["write", "flush"])
@pytest.mark.parametrize("argv", [["schema"], ["devices", "--json"], ["models", "list"]])
def test_a_full_disk_on_stdout_is_one_error_line(argv: list[str], on_flush: bool, capsys, monkeypatch) -> None:
    failing = FailingStdout(OSError(errno.ENOSPC, "No space left on device"), on_flush)
    monkeypatch.setattr(sys, "stdout", failing)
    assert main(argv) == 2
    assert last_error_line(capsys) == ("planner: error: cannot write the output to stdout (No space left on "
                                       "device); send it to a writable file or terminal")
    assert sys.stdout is failing  # main puts the stream back


def test_a_broken_pipe_on_stdout_ends_quietly(capsys, monkeypatch) -> None:
    # the reader stopped early (planner ... | head): not the user's mistake, nothing to report
    monkeypatch.setattr(sys, "stdout", FailingStdout(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert main(["schema"]) == 0
    assert capsys.readouterr().err == ""


def test_an_os_error_outside_stdout_is_not_reported_as_an_output_error(monkeypatch) -> None:
    # an OSError from the library is a bug: it must still surface (as a traceback, exit 1)
    def broken() -> str:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("planner.commands.schema.schema_text", broken)
    with pytest.raises(OSError, match="Input/output error"):
        main(["schema"])


def test_a_closed_stdout_is_one_error_line(capsys, monkeypatch) -> None:
    # a process started with `>&-` has sys.stdout None
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["schema"]) == 2
    assert "stdout is closed" in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_option_of_one_value_given_twice_is_refused(capsys) -> None:
    """`--tp 2 ... --tp 4` took the last one without a word; options that collect (--set, --dim, --sweep)
    still take many."""
    with pytest.raises(SystemExit) as stop:
        main(["estimate", "m.onnx", "--cluster", "a10*1", "--global-batch", "8", "--tp", "2", "--tp", "4"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["planner: error: --tp is given twice (--tp 2, then --tp 4); give it once (see 'planner --help')"]
    args = build_parser().parse_args(["models", "build", "gpt", "--set", "layers=2", "--set", "hidden=64",
                                      "--out", "g.onnx"])
    assert args.settings == ["layers=2", "hidden=64"]


def _planner_with_home(argv: list[str], home: Path) -> None:
    """Run ``python -m planner`` in a fresh process whose HOME is ``home``, with no setting that would send
    matplotlib's or onnxruntime's files elsewhere (or switch onnxruntime's telemetry either way)."""
    env = {k: v for k, v in os.environ.items() if k not in {
        "MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"}}
    env["HOME"] = str(home)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "planner", *argv], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_gantt_writes_nothing_under_home(tiny_model, tmp_path):
    """matplotlib keeps its config and font cache in a temporary folder, not ~/.config and ~/.cache."""
    pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")
    (tmp_path / "home").mkdir()
    _planner_with_home(["plan", tiny_model, *CLUSTER, "--gantt", str(tmp_path / "g.png")], tmp_path / "home")
    assert (tmp_path / "g.png").is_file()
    assert list((tmp_path / "home").rglob("*")) == []


def test_profile_writes_nothing_under_home(tmp_path):
    """onnxruntime's telemetry (a device id and an event store under ~/.cache/Microsoft) stays off."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (the profile extra) is not installed")
    (tmp_path / "home").mkdir()
    _planner_with_home(["profile", "--quick", "--threads", "1", "--out", str(tmp_path / "p.yaml")], tmp_path / "home")
    assert (tmp_path / "p.yaml").is_file()
    assert list((tmp_path / "home").rglob("*")) == []
