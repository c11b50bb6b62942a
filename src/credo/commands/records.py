"""Run records: what a finished comparison run measured, kept beside its study file.

A study of 24 runs takes longer than one working session on 2 cores, and a run folder
(checkpoints, the trained policy) is too large to keep in a repository. A **record** is the
part of a finished run that the study's table and plot are made of, small enough to
commit (``studies/records/<study>/<run>/``):

- ``config.yaml``: the run's resolved config;
- ``warmstart.json``, ``final_eval.json``: the warm start's and the trained policy's
  held-out evaluations;
- ``metrics.jsonl``: the per-iteration metrics (the curves and health columns);
- ``record.json``: the credo commit the run trained at, the CPU it trained on and when it
  was recorded.

Beside them, ``warmstarts/<key>/`` keeps a copy of each seed's warm start (the cached
folder of :func:`credo.train.warmstart.warm_start`: its weights as safetensors and its
held-out evaluation) when it is small (at most ``MAX_WARM_START_MB``: the built-in
models' are 1–2 MB; an LLM's is not kept). Before a run trains, a recorded warm start
missing from the cache is put back there, so a run trained in a later session starts from
the very weights its seed's recorded runs started from: a warm start retrained on another
CPU rounds differently (one seed of ``shop/multi``: 0.6 % held out on an AVX2 CPU,
4.2 % mean over seeds on an AVX-512 one) and would break the study's "same warm start
per seed".

:func:`credo.commands.compare.compare` given a records folder writes a record after each
run it trains, and reads a run from its record instead of training it when the record's
config equals the config the run would have now (the run folder's location aside). So a
study continues across sessions and machines: ``git pull``, ``credo study FILE`` trains
only the runs without a record. What a record cannot give is the trained policy (pass^k,
setup runs); a record whose config differs is ignored and the run retrained. A record does
not prove that the code it trained with behaves as the current code does: the study page
lists the commits its runs came from, and the CPUs (the same config trains to other
floats on a CPU that rounds differently, as another seed would).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from credo.train.config import Config
from credo.train.warmstart import warm_start_folder
from credo.utils.atomic import replace_dir
from credo.utils.safe_yaml import read_yaml_file

__all__ = [
    "MAX_WARM_START_MB",
    "RECORD_FILES",
    "config_difference",
    "cpu_name",
    "record_commits",
    "record_cpus",
    "record_problem",
    "record_warm_start",
    "restore_warm_start",
    "write_record",
]

#: the files of a run folder that a record keeps
RECORD_FILES = ("config.yaml", "warmstart.json", "final_eval.json", "metrics.jsonl")
#: the largest warm start (MB) a records folder keeps a copy of
MAX_WARM_START_MB = 32
#: the subfolder of a records folder holding its warm starts, by key
WARM_STARTS = "warmstarts"
#: config fields that name where the run was written, not what it trained
_WHERE = {("train", "runs_dir"), ("train", "name")}


def _what(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the fields that only say where the run folder is."""
    return {
        section: (
            {k: v for k, v in body.items() if (section, k) not in _WHERE}
            if isinstance(body, dict)
            else body
        )
        for section, body in config.items()
    }


def record_problem(record: Path, cfg: Config) -> str | None:
    """Why the record folder ``record`` cannot stand for a run of ``cfg`` (``None``: it
    can): a file is missing, or the recorded config differs (the first differing key)."""
    missing = [f for f in (*RECORD_FILES, "record.json") if not (record / f).is_file()]
    if missing:
        return f"{record} lacks {', '.join(missing)}"
    return config_difference(record, cfg)


def config_difference(folder: Path, cfg: Config) -> str | None:
    """How the run config in ``folder/config.yaml`` (a record's or a run folder's)
    differs from ``cfg``, where the run folder is aside: the first differing key, or
    that it does not load; ``None`` when they are the same run."""
    try:
        recorded = Config.from_saved(read_yaml_file(folder / "config.yaml")).to_dict()
    except Exception as exc:  # an unreadable or outdated config: another run
        return f"{folder / 'config.yaml'} does not load ({exc})"
    want, have = _what(cfg.to_dict()), _what(recorded)
    for section in sorted(set(want) | set(have)):
        a, b = want.get(section), have.get(section)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            return f"{section}.{key} is {a.get(key)!r} now, {b.get(key)!r} in {folder}"
        return f"{section} differs from {folder}"
    return None


def _git(*args: str) -> str | None:
    """``git -C <credo's source folder> ARGS``'s output, ``None`` if it fails."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _commit() -> str:
    """The git commit of the credo source tree that is running, with ``+changes`` when
    its tracked files differ from it (``unknown`` when credo is not a checkout: an
    installed copy inside some other repository is not tracked there)."""
    if _git("ls-files", "--error-unmatch", Path(__file__).name) is None:
        return "unknown"
    sha = (_git("rev-parse", "HEAD") or "").strip()
    if not sha:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no", ":/")
    return f"{sha}+changes" if dirty is None or dirty.strip() else sha


def cpu_name() -> str:
    """The machine, its CPU model and the kernels torch uses on it (``AVX2``, ``AVX512``):
    what decides how a run's floats round."""
    name = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()} {name} {torch.backends.cpu.get_cpu_capability()}"


def write_record(run_dir: Path, record: Path) -> Path:
    """Copy the finished run ``run_dir``'s record files into ``record`` (replacing an
    older record whole: a reader sees the old record or the new one, never a mix)."""
    record = Path(record)
    record.parent.mkdir(parents=True, exist_ok=True)
    info = {
        "commit": _commit(),
        "cpu": cpu_name(),
        "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }

    def write(tmp: Path) -> None:
        tmp.mkdir()
        for name in RECORD_FILES:
            shutil.copyfile(run_dir / name, tmp / name)
        (tmp / "record.json").write_text(json.dumps(info, indent=1) + "\n")

    replace_dir(record, write)
    return record


def _infos(records: Path) -> list[dict[str, Any]]:
    """The ``record.json`` of every record under ``records``, oldest record first."""
    infos = []
    for path in sorted(Path(records).glob("*/record.json")):
        try:
            infos.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    infos.sort(key=lambda i: str(i.get("recorded", "")))
    return infos


def record_commits(records: Path) -> list[str]:
    """The commits the records under ``records`` were trained at, oldest record first."""
    return list(dict.fromkeys(str(i.get("commit", "unknown")) for i in _infos(records)))


def record_cpus(records: Path) -> list[str]:
    """The CPUs the records under ``records`` were trained on, oldest record first
    (``unknown`` for records written before the CPU was)."""
    return list(dict.fromkeys(str(i.get("cpu", "unknown")) for i in _infos(records)))


def _size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def _copy_into(source: Path, target: Path) -> None:
    """Copy the folder ``source`` to ``target``, atomically (:func:`replace_dir`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(target, lambda tmp: shutil.copytree(source, tmp))


def record_warm_start(key: str, records: Path) -> bool:
    """Keep a copy of the cached warm start ``key`` in ``records/warmstarts/<key>`` (once);
    whether it is kept there now (not when it is not in the cache, or is larger than
    :data:`MAX_WARM_START_MB`)."""
    kept = Path(records) / WARM_STARTS / key
    if (kept / "warmstart.json").is_file():
        return True
    cached = warm_start_folder(key)
    if not (cached / "warmstart.json").is_file() or _size_mb(cached) > MAX_WARM_START_MB:
        return False
    _copy_into(cached, kept)
    return True


def restore_warm_start(key: str, records: Path) -> bool:
    """Put the warm start ``key`` kept in ``records`` into the cache if the cache lacks it
    (the next run of its seed loads it instead of training another); whether it did."""
    kept = Path(records) / WARM_STARTS / key
    cached = warm_start_folder(key)
    if (cached / "warmstart.json").is_file() or not (kept / "warmstart.json").is_file():
        return False
    _copy_into(kept, cached)
    return True
