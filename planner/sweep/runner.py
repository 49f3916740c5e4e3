"""Run independent sweep points: in this process, on local worker processes, or on a Ray cluster.

``run_tasks(fn, tasks, ...)`` returns ``[fn(t) for t in tasks]`` in the order of ``tasks`` whatever the
backend or the number of workers, so results do not depend on scheduling. ``fn`` must be a module-level
function (it is pickled by reference) and deterministic. An exception raised by ``fn`` (a PlannerError for a
bad model file, or a bug) stops the sweep and is re-raised here.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence, TypeVar

from planner import arguments
from planner.errors import PlannerError
from planner.rules import check_choice

T = TypeVar("T")
R = TypeVar("R")
Progress = Callable[[int, int], None]  # (points done, points in all)

BACKENDS = ("process", "ray")
ABANDON_TIMEOUT_S = 10.0  # how long a failed Ray sweep waits for its points in flight to end
log = logging.getLogger(__name__)


def default_workers() -> int:
    """min(2, CPUs available to this process)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T], *, workers: int | None = None,
              backend: str = "process", progress: Progress | None = None) -> list[R]:
    # worded for the API's backend=/workers= and the CLI's --backend/--workers alike, as check_choice words a
    # choice and arguments.whole a count
    check_choice("backend", backend, BACKENDS)
    arguments.function(progress, "progress", "progress(done, total)")
    if workers is not None:
        workers = arguments.whole(workers, "workers")
    if backend == "ray":
        return _run_ray(fn, tasks, workers, progress)
    count = default_workers() if workers is None else workers
    if count == 1 or len(tasks) <= 1:
        return _run_serial(fn, tasks, progress)
    return _run_processes(fn, tasks, min(count, len(tasks)), progress)


def _run_serial(fn: Callable[[T], R], tasks: Sequence[T], progress: Progress | None) -> list[R]:
    results = []
    for done, task in enumerate(tasks, start=1):
        results.append(fn(task))
        if progress:
            progress(done, len(tasks))
    return results


Warned = tuple[str, int, str]  # a warning a worker logged: (logger name, level, message)


class _Warnings(logging.Handler):
    """Collects the warnings logged while it is attached to the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[Warned] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.levelno, record.getMessage()))


def _with_warnings(fn: Callable[[T], R], task: T) -> tuple[R, list[Warned]]:
    """``fn(task)`` in a worker, with the warnings it logged: a worker's log records reach no one, so they go
    back with the result."""
    caught = _Warnings()
    root = logging.getLogger()
    root.addHandler(caught)
    try:
        return fn(task), caught.records
    finally:
        root.removeHandler(caught)


def _log_again(warned: Sequence[list[Warned]]) -> None:
    """The workers' warnings logged here, in the order of the points, each once (a process that plans several
    points warns once, too, where the warning comes from a cached step such as reading the model)."""
    for name, level, message in dict.fromkeys(w for point in warned for w in point):
        logging.getLogger(name).log(level, "%s", message)


def _run_processes(fn: Callable[[T], R], tasks: Sequence[T], workers: int, progress: Progress | None) -> list[R]:
    results: list[R | None] = [None] * len(tasks)
    warned: list[list[Warned]] = [[] for _ in tasks]
    log.info("whatif: %d points on %d worker processes", len(tasks), workers)
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers)
    try:
        futures = {pool.submit(_with_warnings, fn, task): i for i, task in enumerate(tasks)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            i = futures[future]
            results[i], warned[i] = future.result()
            if progress:
                progress(done, len(tasks))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # a failed point ends the sweep now
        raise
    pool.shutdown(wait=True)
    _log_again(warned)
    return results  # type: ignore[return-value]


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _run_ray(fn: Callable[[T], R], tasks: Sequence[T], workers: int | None, progress: Progress | None) -> list[R]:
    """One Ray task per point. Uses the Ray instance this process is connected to; otherwise connects with
    :func:`_start_ray` (``RAY_ADDRESS`` selects a cluster; without it Ray starts a local instance). ``workers``,
    where given, caps the points in flight."""
    try:
        import ray  # noqa: PLC0415 - optional extra
    except ImportError:
        raise PlannerError("backend 'ray' needs Ray: pip install \"planner[ray]\" (or use backend 'process')") from None
    if not ray.is_initialized():
        _start_ray(ray)
    remote = ray.remote(num_cpus=1)(_with_warnings)
    limit = len(tasks) if workers is None else workers
    results: list[R | None] = [None] * len(tasks)
    warned: list[list[Warned]] = [[] for _ in tasks]
    pending: dict[object, int] = {}
    queue = list(enumerate(tasks))
    done = 0
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                i, task = queue.pop(0)
                pending[remote.remote(fn, task)] = i
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                results[i], warned[i] = _ray_get(ray, ref)
                done += 1
                if progress:
                    progress(done, len(tasks))
    except BaseException:
        _abandon(ray, list(pending))
        raise
    _log_again(warned)
    return results  # type: ignore[return-value]


def _start_ray(ray: ModuleType) -> None:
    """Connect to the cluster ``RAY_ADDRESS`` names, or start a local Ray instance for this process. A local
    instance keeps its session files (logs, sockets) in a temporary folder of its own rather than under
    /tmp/ray, where Ray leaves them; the folder goes when the process exits, after the instance is shut down."""
    # workers must import planner; a source checkout is not installed, so put it on their path
    path = os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH", "")) if p)
    # Ray's own start-up lines (its token-authentication warning, "Started a local Ray instance") would
    # reach stderr before the one line a bad input ends with; they are shown when planner logs at DEBUG
    quiet = not log.isEnabledFor(logging.DEBUG)
    # a short name: Ray's Unix socket paths under it must fit 107 characters
    folder = None if os.environ.get("RAY_ADDRESS") else tempfile.mkdtemp(prefix="ray-")
    try:
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR if quiet else logging.INFO,
                 runtime_env={"env_vars": {"PYTHONPATH": path}}, **({"_temp_dir": folder} if folder else {}))
    except BaseException:
        if folder is not None:
            _remove(folder)
        raise
    if folder is not None:
        # exit handlers run last registered first: this one before Ray's own shutdown, which it makes a no-op
        atexit.register(_shut_down, ray, folder)


def _shut_down(ray: ModuleType, folder: str) -> None:
    ray.shutdown()
    _remove(folder)


def _remove(folder: str) -> None:
    """Remove Ray's temporary folder; a failure is logged (at exit, nothing could handle it)."""
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning("could not remove Ray's temporary folder %s (%s); delete it by hand", folder, exc)


def _abandon(ray: ModuleType, refs: list[Any], timeout_s: float = ABANDON_TIMEOUT_S) -> None:
    """Collect how each point still in flight after one failed ends (at most ``workers`` of them): Ray prints
    a task error that no one fetched as an "Unhandled error" with a traceback, after the one line that
    already said what is wrong. Waits at most ``timeout_s`` for them and cancels only those still running
    then: cancelling a task as it completes can crash Ray's driver (task_manager.cc, "Check failed" on a
    reply for a task no longer pending), which a sweep of quickly failing points hits."""
    if not refs:
        return
    ended, running = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in running:
        ray.cancel(ref)
    for ref in ended:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - the sweep re-raises the first failure; these add nothing
            log.debug("whatif: a point in flight ended after the sweep failed", exc_info=True)


def _ray_get(ray, ref):  # type: ignore[no-untyped-def]
    """ray.get, re-raising the task's own exception (Ray wraps it) so a PlannerError stays one."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, PlannerError):
            raise cause from None
        raise
