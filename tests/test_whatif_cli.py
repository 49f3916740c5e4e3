"""`planner whatif` command-line errors that need no model or cluster (exit 2, one line)."""

from __future__ import annotations

import pytest

from planner.cli import main


def _run_error(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("planner: error:")
    return err[0]


def test_unknown_sweep_key_exits_2_naming_valid_keys(capsys):
    line = _run_error(["whatif", "m.onnx", "--cluster", "dgx-a100-80gb*2", "--global-batch", "8",
                       "--sweep", "cuont=1,2"], capsys)
    assert "unknown key 'cuont'" in line and "did you mean count" in line
    assert "seq_len" in line and "inter_node_bandwidth_GBps" in line


@pytest.mark.parametrize("sweep,match", [("count", "KEY=V1"), ("count=a,b", "not an integer"),
                                         ("seq_len=0", "at least 1")])
def test_bad_sweep_values_exit_2(capsys, sweep, match):
    assert match in _run_error(["whatif", "m.onnx", "--cluster", "x*1", "--global-batch", "8", "--sweep", sweep],
                               capsys)


def test_repeated_key_and_bad_plot_suffix(capsys):
    base = ["whatif", "m.onnx", "--cluster", "x*1", "--global-batch", "8"]
    assert "given twice" in _run_error([*base, "--sweep", "count=1", "--sweep", "count=2"], capsys)
    assert ".png or .svg" in _run_error([*base, "--sweep", "count=1", "--plot", "out.pdf"], capsys)


def test_sweep_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["whatif", "m.onnx", "--cluster", "x*1", "--global-batch", "8"])
    assert exc.value.code == 2 and "--sweep" in capsys.readouterr().err


@pytest.mark.parametrize("flags, field, value", [
    (["--ep", "2"], "ep", 2), (["--expert-tp", "1"], "expert_tp", 1), (["--fp8-recipe", "mxfp8"], "fp8_recipe", "mxfp8"),
    (["--tp", "2"], "tp", 2), (["--optimizer", "sgd"], "optimizer", "sgd"),
])
def test_every_pin_flag_alone_reaches_the_sweep(flags, field, value):
    """whatif pins what plan pins: a flag given alone (--ep 2 without any other pin) was dropped."""
    from planner.cli import build_parser
    from planner.commands.whatif import _pinned

    args = build_parser().parse_args(["whatif", "m.onnx", "--global-batch", "8", "--cluster", "a10*1",
                                      "--sweep", "count=1", *flags])
    assert getattr(_pinned(args), field) == value
    nothing = build_parser().parse_args(["whatif", "m.onnx", "--global-batch", "8", "--cluster", "a10*1",
                                         "--sweep", "count=1"])
    assert _pinned(nothing) is None


def test_csv_and_plot_on_one_file_are_refused(capsys, tmp_path):
    target = str(tmp_path / "out.png")
    line = _run_error(["whatif", "m.onnx", "--global-batch", "8", "--cluster", "a10*1", "--sweep", "count=1",
                       "--csv", target, "--plot", target], capsys)
    assert f"--plot {target}: is also --csv, which the run would overwrite" in line
