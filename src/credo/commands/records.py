"""Run records: what a finished comparison run measured, kept beside its study file.

A study of 24 runs takes longer than one working session on 2 cores, and a run folder
(checkpoints, the trained policy) is too large to keep in a repository. A **record** is the
part of a finished run that the study's table and plot are made of, small enough to
commit (``studies/records/<study>/<run>/``):

- ``config.yaml``: the run's resolved config;
- ``warmstart.json``, ``final_eval.json``: the warm start's and the trained policy's
  held-out evaluations;
- ``metrics.jsonl``: the per-iteration metrics (the curves and health columns);
- ``record.json``: the credo commit the run trained at and when it was recorded.

:func:`credo.commands.compare.compare` given a records folder writes a record after each
run it trains, and reads a run from its record instead of training it when the record's
config equals the config the run would have now (the run folder's location aside). So a
study continues across sessions and machines: ``git pull``, ``credo study FILE`` trains
only the runs without a record. What a record cannot give is the trained policy (pass^k,
setup runs); a record whose config differs is ignored and the run retrained. A record does
not prove that the code it trained with behaves as the current code does: the study page
lists the commits its runs came from.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from credo.train.config import Config
from credo.utils.atomic import replace_dir
from credo.utils.safe_yaml import read_yaml_file

__all__ = ["RECORD_FILES", "record_commits", "record_problem", "write_record"]

#: the files of a run folder that a record keeps
RECORD_FILES = ("config.yaml", "warmstart.json", "final_eval.json", "metrics.jsonl")
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
    try:
        recorded = Config.from_dict(read_yaml_file(record / "config.yaml")).to_dict()
    except Exception as exc:  # an unreadable or outdated config: retrain
        return f"{record / 'config.yaml'} does not load ({exc})"
    want, have = _what(cfg.to_dict()), _what(recorded)
    for section in sorted(set(want) | set(have)):
        a, b = want.get(section), have.get(section)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            return f"{section}.{key} is {a.get(key)!r} now, {b.get(key)!r} in {record}"
        return f"{section} differs from {record}"
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


def write_record(run_dir: Path, record: Path) -> Path:
    """Copy the finished run ``run_dir``'s record files into ``record`` (replacing an
    older record whole: a reader sees the old record or the new one, never a mix)."""
    record = Path(record)
    record.parent.mkdir(parents=True, exist_ok=True)
    info = {"commit": _commit(), "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    def write(tmp: Path) -> None:
        tmp.mkdir()
        for name in RECORD_FILES:
            shutil.copyfile(run_dir / name, tmp / name)
        (tmp / "record.json").write_text(json.dumps(info, indent=1) + "\n")

    replace_dir(record, write)
    return record


def record_commits(records: Path) -> list[str]:
    """The commits the records under ``records`` were trained at, oldest record first."""
    infos = []
    for path in sorted(Path(records).glob("*/record.json")):
        try:
            infos.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    infos.sort(key=lambda i: str(i.get("recorded", "")))
    return list(dict.fromkeys(str(i.get("commit", "unknown")) for i in infos))
