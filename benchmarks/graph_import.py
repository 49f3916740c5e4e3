"""Import speed of large ONNX graphs: `planner.load_model` on GPT-like graphs of about 10k and 100k nodes.

Run from the repository root:  python benchmarks/graph_import.py [--repeat 3]
Prints a Markdown table (best of --repeat runs): nodes, file size, import time end to end, and the time in
ONNX shape inference alone. Variants: layers found from name scopes, and from graph structure (no names).
Then the 1T-parameter GPT (128 layers, hidden 25600, 160 heads, seq 2048, vocab 51200): build with
`planner.builders`, save, and `planner inspect --json` on the file, end to end in one process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextlib  # noqa: E402
import io  # noqa: E402

from planner.builders import build, save  # noqa: E402
from planner.cli import main as cli  # noqa: E402
from planner.graph import load_model  # noqa: E402
from tests._graph_util import tiny_gpt  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, float]:
    """Best (wall, CPU) seconds of ``repeat`` runs; CPU time is what other processes on a shared machine
    do not inflate."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (300, 3000):
            for named in (True, False):
                model = tiny_gpt(layers=layers, hidden=64, heads=4, seq=16, vocab=1000, named=named)
                path = Path(tmp) / f"gpt{layers}_{named}.onnx"
                onnx.save(model, str(path))
                nodes = len(model.graph.node)
                graph = load_model(path)
                assert len(graph.layers) == layers + 2, len(graph.layers)
                total = _best(lambda: load_model(path), args.repeat)
                infer = _best(lambda: onnx.shape_inference.infer_shapes(model), args.repeat)
                rows.append((nodes, path.stat().st_size, "name scopes" if named else "structure", total, infer))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt-1t.onnx"

        def build_and_inspect() -> None:
            model = build("gpt", {"layers": 128, "hidden": 25600, "heads": 160, "seq_len": 2048, "vocab": 51200})
            save(model, str(path))
            with contextlib.redirect_stdout(io.StringIO()) as out:
                assert cli(["inspect", str(path), "--json"]) == 0
            assert '"params": 1008038758400' in out.getvalue()

        gpt = _best(build_and_inspect, args.repeat)
    print("| nodes | file | layers from | import wall (s) | import CPU (s) | ONNX shape inference alone, CPU (s) |")
    print("|---:|---:|---|---:|---:|---:|")
    for nodes, size, how, total, infer in rows:
        print(f"| {nodes:,} | {size / 2**20:.1f} MiB | {how} | {total[0]:.2f} | {total[1]:.2f} | {infer[1]:.2f} |")
    print()
    print(f"1T GPT: build + save + inspect --json: {gpt[0]:.2f} s wall, {gpt[1]:.2f} s CPU")


if __name__ == "__main__":
    main()
