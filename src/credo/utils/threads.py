"""How many CPU threads torch may use: ``train.threads`` (0 = choose).

On a CPU, torch splits each operation over its intra-op threads (OpenMP). When other jobs
hold some cores, those threads wait for each other at every operation's end, so a run with
"all the cores" crawls: measured on 2 shared cores (load 5–8), the default run took 85 min
with torch's default of 2 threads against 4.4 min on quiet cores. The choice here:

- **the built-in model: 1 thread.** Its matrices are 128 wide; a second thread gains
  little on quiet cores and loses most of the run when the cores are shared.
- **a Hugging Face model: the cores not already busy**, ``usable cores − load average``
  (at least 1), shared among the processes a launcher started on this machine
  (``LOCAL_WORLD_SIZE``, set by ``torchrun`` and ``accelerate launch``): a large model's
  matrix products do gain from threads.

``OMP_WAIT_POLICY=PASSIVE`` (set by :mod:`credo` before torch is imported, unless the
user set it) makes idle OpenMP threads sleep rather than spin, so that the threads of one
run do not take the CPU from another's.
"""

from __future__ import annotations

import os

__all__ = ["auto_threads", "usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def auto_threads(
    builtin: bool, *, cpus: int | None = None, load: float | None = None, processes: int = 0
) -> int:
    """The thread count ``train.threads: 0`` stands for: 1 for the built-in model, else
    the cores not busy, ``(cpus − round(load)) // processes``, at least 1.

    Args:
        builtin: the run trains credo's built-in model.
        cpus: usable CPUs (default: :func:`usable_cpus`).
        load: the 1-minute load average (default: the OS's; 0 where it has none).
        processes: training processes on this machine (default: ``LOCAL_WORLD_SIZE``, else 1).
    """
    if builtin:
        return 1
    cpus = usable_cpus() if cpus is None else cpus
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    processes = processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(cpus, cpus - round(load)) // max(1, processes))
