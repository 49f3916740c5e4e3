import subprocess
import sys

import pytest

from planner.cli import main


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "planner" in capsys.readouterr().out


def test_version_prints_the_package_version(capsys):
    import planner
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"planner {planner.__version__}\n"


def test_unknown_command_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("planner: error:")


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "planner", "--help"], capture_output=True, text=True)
    assert out.returncode == 0


@pytest.mark.parametrize("argv, verbose", [
    (["models"], False),
    (["-v", "models"], True),
    (["models", "-v"], True),
    (["--verbose", "models", "--verbose"], True),
    (["plan", "m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "-v"], True),
])
def test_verbose_is_taken_before_or_after_the_command(argv, verbose):
    from planner.cli import build_parser

    assert build_parser().parse_args(argv).verbose is verbose
