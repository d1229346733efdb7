"""Runs sweep grids on a Ray cluster; results come back to the driver, which alone writes the store.

**Unit of work: the grid, not the config.** The runner loops windows outside and configs inside,
so the reference pass of a window is computed once and shared by every config of the grid, and a
weight config is quantized once for all its KV configs. One Ray task per config would redo the
reference forward for each config (twice the work for KV-only configs) unless the reference were
kept between tasks, which is the full-vocabulary distribution — 1.6 GB per 8k tokens of SmolLM2,
8.6 GB for Gemma-3 — per (model, data, ctx, tokens). So each Ray call runs one
:class:`GridTask`, the planner's weights × KV rectangle; ``grid: weight`` in the spec makes one
task per weight config when finer tasks (more parallelism, less lost to a crash) are worth one
extra reference forward per window each.

**Workers keep what tasks share.** Each worker is a Ray actor holding an
:class:`InProcessExecutor`, which keeps the last model and token windows loaded. The driver sends
a task to an idle worker that already holds its group (model, data, ctx, tokens, score, stride),
else one that holds its model, else any idle worker; so a model loads once per worker, not once
per task. Calibrated quantized models (GPTQ, AWQ, SmoothQuant) are shared through the on-disk
cache (``$WKVLAB_CACHE/quantized``) of the node the worker runs on.

**Resources.** A worker asks Ray for ``num_cpus_per_task`` CPUs (default: all CPUs of the largest
node, i.e. one worker per node, because torch already uses every core of a process) and runs
torch with that many threads. ``num_gpus_per_task`` (default 0) is passed to Ray's scheduler,
which places the worker on a node with that many free GPUs; wkvlab's evaluation itself runs on
the CPU (the runner has no CUDA path), so a GPU request only chooses where workers run.

**Progress and errors.** Workers record the runner's progress ticks; the driver polls them about
once a second and forwards them. A worker's :class:`WkvlabError` is raised again in the driver
with its own one-line message; any other worker failure (an exception, a dead worker process, a
node lost) becomes one :class:`ExecutorError` line naming the grid. Either way the driver has
already stored every outcome yielded before, so running the sweep again resumes.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from itertools import chain
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Iterable, Iterator
from urllib.parse import urlsplit

from wkvlab.errors import ConfigError, WkvlabError
from wkvlab.eval.runner import Progress
from wkvlab.sweep.executor import InProcessExecutor, TaskOutcome
from wkvlab.sweep.plan import GridTask

# A local cluster only carries results (per-token arrays: ~30 bytes per token and config), so a
# small object store suffices; Ray's default reserves 30% of RAM in /dev/shm.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2
PROGRESS_POLL_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 5.0


class ExecutorError(WkvlabError):
    """A worker or the cluster failed; the store keeps every result finished before."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("the Ray executor needs ray; install it with: pip install 'wkvlab[ray]'") from None
    return ray


def _one_line(exc: BaseException) -> str:
    """The exception's type and last non-empty line (for a remote traceback, the line that says what failed)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


def check_address(address: str) -> None:
    """A Ray address in one of its forms, with something listening at ``host:port``: a wrong one
    fails here in seconds with one line (``ray.init`` would retry for a minute)."""
    if address == "auto":
        return  # Ray reads the address of the cluster started on this machine by 'ray start'
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if parts.scheme not in ("ray", "tcp") or not host or port is None:
        raise ConfigError(f"--address {address!r} is not a Ray address; use auto, host:port (GCS) or ray://host:port (Ray Client)")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as exc:
        raise ConfigError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with 'ray start --head' or fix --address") from None


@contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None, object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES):
    """Ray for the length of a sweep: the caller's session if one is open, else a connection to
    ``address``, else a fresh local cluster (shut down at the end, also on error)."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address:
        check_address(address)
        try:
            ray.init(address=address, **quiet)
        except ConnectionError:
            if address != "auto":
                raise ConfigError(f"the Ray cluster at {address} refused the connection; check --address ('ray status' on the head node prints it), "
                                  "and for a cluster with token authentication set RAY_AUTH_MODE=token here") from None
            raise ConfigError("--address auto: no Ray cluster runs on this machine; start one with 'ray start --head' or give host:port") from None
        except Exception as exc:  # whatever Ray raises, the user's fix is the address or the cluster
            raise ConfigError(f"could not connect to the Ray cluster at {address}: {_one_line(exc)}; "
                              "check --address ('ray status' on the head node prints it)") from None
    else:
        try:
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, object_store_memory=object_store_bytes,
                     include_dashboard=False, **quiet)
        except Exception as exc:
            raise ExecutorError(f"could not start a local Ray cluster: {_one_line(exc)}; "
                                "see /tmp/ray/session_latest/logs, or run without --executor ray") from None
    try:
        yield ray
    finally:
        ray.shutdown()


class SweepWorker:
    """The Ray actor (``max_concurrency=2``: ``drain`` answers while ``run`` works). Runs one grid
    at a time and keeps the last model and windows for the next grid of the same group."""

    def __init__(self, cwd: str, threads: int) -> None:
        import torch

        if os.path.isdir(cwd):  # relative model and data paths mean what they meant to the driver
            os.chdir(cwd)
        torch.set_num_threads(max(1, threads))
        self._executor = InProcessExecutor()
        self._lock = threading.Lock()
        self._ticks: list[tuple[str, int]] = []

    def _tick(self, description: str, steps: int) -> None:
        with self._lock:
            self._ticks.append((description, steps))

    def run(self, task: dict) -> tuple:
        grid = GridTask.from_dict(task)
        return next(self._executor.run([grid], self._tick)).results

    def drain(self) -> list[tuple[str, int]]:
        """Progress ticks since the last call."""
        with self._lock:
            ticks, self._ticks = self._ticks, []
        return ticks


@dataclass(eq=False)
class _Slot:
    actor: object
    group: tuple | None = None  # what the worker holds loaded
    task: GridTask | None = None  # what it runs now
    ticked: int = 0  # progress steps forwarded for the current task


@dataclass
class _Pool:
    """Workers created on demand up to ``size``; a task goes to the idle worker that has the most
    of it loaded already."""

    make: object  # () -> actor handle
    size: int
    slots: list[_Slot] = field(default_factory=list)

    def idle(self) -> list[_Slot]:
        return [s for s in self.slots if s.task is None]

    def has_room(self) -> bool:
        return bool(self.idle()) or len(self.slots) < self.size

    def acquire(self, task: GridTask) -> _Slot:
        group = task.first.group
        idle = self.idle()
        slot = (next((s for s in idle if s.group == group), None)
                or next((s for s in idle if s.group is not None and s.group[:2] == group[:2]), None)  # same model
                or (None if len(self.slots) < self.size else idle[0]))
        if slot is None:
            slot = _Slot(self.make())
            self.slots.append(slot)
        slot.task, slot.group, slot.ticked = task, group, 0
        return slot


def _capacity(ray, cpus: float, gpus: float) -> int:
    """How many workers of this size the alive nodes can hold at once."""
    total = 0
    for node in ray.nodes():
        if node.get("Alive"):
            res = node.get("Resources", {})
            fits = int(res.get("CPU", 0) // cpus) if cpus else 1 << 30
            if gpus:
                fits = min(fits, int(res.get("GPU", 0) // gpus))
            total += fits
    return total


def _largest_node_cpus(ray) -> int:
    return max((int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=0)


def _worker_failure(ray, exc: Exception, task: GridTask) -> WkvlabError:
    where = f"a Ray worker failed on {len(task.configs)} config(s) of {task.first.model} {task.first.data} ctx {task.first.ctx}"
    cause = getattr(exc, "cause", None)
    if isinstance(cause, WkvlabError):
        return cause  # the user's error, as the in-process executor would have raised it
    if isinstance(exc, ray.exceptions.RayActorError):
        reason = "the worker process died (out of memory, killed, or its node was lost)"
    else:
        reason = _one_line(cause if isinstance(cause, BaseException) else exc)
    return ExecutorError(f"{where}: {reason}; the store keeps every finished result, run the sweep again to resume")


class RayExecutor:
    """Runs the sweep's grids on Ray workers, in parallel, yielding each outcome as it finishes.

    ``address``: ``None`` starts a local cluster on this machine (``num_cpus`` = ``os.cpu_count()``,
    a 256 MB object store, no dashboard) for the sweep and stops it at the end; ``"auto"`` joins the
    cluster that ``ray start --head`` started here; ``host:port`` or ``ray://host:port`` a remote
    one. An already initialized Ray session (``ray.init`` by the caller) is used as it is.
    ``max_workers``: at most this many workers (default: as many as the cluster can hold).
    """

    def __init__(self, address: str | None = None, *, num_cpus_per_task: float | None = None, num_gpus_per_task: float = 0,
                 max_workers: int | None = None, object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES) -> None:
        if num_cpus_per_task is not None and num_cpus_per_task <= 0:
            raise ConfigError(f"--cpus-per-task must be positive, got {num_cpus_per_task}")
        if num_gpus_per_task < 0:
            raise ConfigError(f"--gpus-per-task must be 0 or more, got {num_gpus_per_task}")
        if max_workers is not None and max_workers < 1:
            raise ConfigError(f"--max-workers must be at least 1, got {max_workers}")
        if address:
            check_address(address)  # before the sweep plans (hashes models) and creates its store
        self.address, self.num_cpus_per_task, self.num_gpus_per_task = address, num_cpus_per_task, num_gpus_per_task
        self.max_workers, self.object_store_bytes = max_workers, object_store_bytes

    def _pool(self, ray) -> _Pool:
        cpus = self.num_cpus_per_task or _largest_node_cpus(ray) or 1
        capacity = _capacity(ray, cpus, self.num_gpus_per_task)
        if capacity < 1:
            raise ConfigError(f"no node of the Ray cluster has {cpus:g} CPU(s)" + (f" and {self.num_gpus_per_task:g} GPU(s)" if self.num_gpus_per_task else "")
                              + " free for one worker; lower --cpus-per-task/--gpus-per-task or add nodes")
        from wkvlab.models.cache import cache_env

        env = cache_env()  # --cache-dir / --no-weight-cache reach the workers
        actor = ray.remote(num_cpus=cpus, num_gpus=self.num_gpus_per_task, max_concurrency=2,
                           **({"runtime_env": {"env_vars": env}} if env else {}))(SweepWorker)
        cwd, threads = os.getcwd(), max(1, int(cpus))
        return _Pool(lambda: actor.remote(cwd, threads), min(capacity, self.max_workers or capacity))

    def run(self, tasks: Iterable[GridTask], progress: Progress | None = None) -> Iterator[TaskOutcome]:
        pending = iter(tasks)
        first = next(pending, None)
        if first is None:
            return  # a finished sweep run again: no cluster to start or join
        with ray_session(self.address, object_store_bytes=self.object_store_bytes) as ray:
            pool = self._pool(ray)
            try:
                yield from self._schedule(ray, pool, chain([first], pending), progress)
            finally:
                for slot in pool.slots:  # also on error or when the driver stops early: free the cluster
                    ray.kill(slot.actor)

    def _schedule(self, ray, pool: _Pool, tasks: Iterator[GridTask], progress: Progress | None) -> Iterator[TaskOutcome]:
        running: dict = {}  # object ref -> slot
        more = True
        while True:
            # Tasks are taken from the driver only when a worker can start them: the driver trims
            # each to what the store still lacks at that moment (a concurrent sweep may have run it).
            while more and pool.has_room():
                task = next(tasks, None)
                if task is None:
                    more = False
                    break
                slot = pool.acquire(task)
                running[slot.actor.run.remote(task.to_dict())] = slot
            if not running:
                return
            ready, _ = ray.wait(list(running), num_returns=1, timeout=PROGRESS_POLL_SECONDS)
            if progress is not None:
                self._forward_progress(ray, list(running.values()), progress)
            for ref in ready:
                try:
                    outcome = self._collect(ray, ref, running, progress)
                except WkvlabError:
                    # grids other workers have finished are stored before the error surfaces
                    done = ray.wait(list(running), num_returns=len(running), timeout=0)[0] if running else []
                    for other in done:
                        with suppress(WkvlabError):
                            yield self._collect(ray, other, running, progress)
                    raise
                yield outcome

    @staticmethod
    def _collect(ray, ref, running: dict, progress: Progress | None) -> TaskOutcome:
        """The outcome of a finished call, its worker marked idle; a failure as one-line error."""
        slot = running.pop(ref)
        task, slot.task = slot.task, None
        try:
            results = ray.get(ref)
        except (ray.exceptions.RayError, WkvlabError) as exc:
            raise _worker_failure(ray, exc, task) from None
        if progress is not None and slot.ticked < task.steps:
            progress("sweep", task.steps - slot.ticked)  # ticks the last poll missed
        return TaskOutcome(task, tuple(results))

    @staticmethod
    def _forward_progress(ray, slots: list[_Slot], progress: Progress) -> None:
        """Forward the ticks of the workers that answer promptly; a worker still starting (or
        waiting for resources) is skipped, and whatever ticks are missed are made up when its task ends."""
        asked = {s.actor.drain.remote(): s for s in slots}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=PROGRESS_POLL_SECONDS / 4)
        for ref in answered:
            slot = asked[ref]
            try:
                ticks = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # a dead worker is reported by its task's result
            for description, steps in ticks:
                steps = min(steps, slot.task.steps - slot.ticked) if slot.task is not None else 0
                if steps > 0:
                    slot.ticked += steps
                    progress(description, steps)
