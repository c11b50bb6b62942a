"""The end of a run: its last writes, and what "finished" means.

A finished run leaves ``final_policy/`` (the trained weights and tokenizer),
``curves.png`` and ``final_eval.json``. Each is written by temp-and-rename
(:mod:`credo.utils.atomic`), in that order, so ``final_eval.json`` is written only once
the others are complete: it is the mark of a finished run. It records the held-out
result, the ``iteration`` the policy was trained to, and the size and SHA-256 of every
file of ``final_policy/`` (``artefacts``).

A run is *finished* (:func:`unfinished_reason` is ``None``) when ``final_eval.json``
reads, names the iteration of the run's latest checkpoint, and every file it lists is
there with its size and content. Anything less (a kill during the final save, a run
extended after it finished, a damaged ``final_policy/``) is unfinished, and
``credo train --resume`` redoes the final evaluation and save from the last checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from credo.utils.atomic import remove_leftovers, replace_dir, write_text_atomic
from credo.utils.digest import digest_problem, digests

__all__ = [
    "FINAL_EVAL",
    "FINAL_POLICY",
    "read_final",
    "remove_final_leftovers",
    "save_final_policy",
    "unfinished_reason",
    "write_final_eval",
]

#: The mark of a finished run (written last).
FINAL_EVAL = "final_eval.json"
#: The trained policy's folder.
FINAL_POLICY = "final_policy"


def save_final_policy(policy: Any, run_dir: Path) -> Path:
    """Save ``policy`` as ``run_dir/final_policy`` by temp-and-rename (an earlier one,
    of a run being extended, is replaced only once the new one is complete)."""
    return replace_dir(Path(run_dir) / FINAL_POLICY, policy.save)


def write_final_eval(run_dir: Path, result: dict[str, Any], iteration: int) -> None:
    """Write ``final_eval.json`` (last): the held-out ``result``, the ``iteration`` and
    the digests of ``final_policy/``."""
    run_dir = Path(run_dir)
    record = {
        **result,
        "iteration": int(iteration),
        "artefacts": digests(run_dir, [FINAL_POLICY]),
    }
    write_text_atomic(run_dir / FINAL_EVAL, json.dumps(record, indent=1))


def read_final(run_dir: Path) -> dict[str, Any] | None:
    """``final_eval.json`` as a dict, or ``None`` when it is missing or does not read."""
    try:
        data = json.loads((Path(run_dir) / FINAL_EVAL).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def unfinished_reason(run_dir: Path, iteration: int) -> str | None:
    """Why ``run_dir`` is not a finished run whose latest checkpoint is ``iteration``, or
    ``None`` when it is (see the module docstring).

    A ``final_eval.json`` of an older credo (without ``iteration`` and ``artefacts``)
    counts when ``final_policy/`` holds weights and a tokenizer."""
    run_dir = Path(run_dir)
    final = read_final(run_dir)
    if final is None:
        return f"{run_dir / FINAL_EVAL} is missing or unreadable"
    if "artefacts" not in final:  # written before the digests were recorded
        folder = run_dir / FINAL_POLICY
        weights = folder.is_dir() and any(folder.glob("*.safetensors"))
        tokenizer = (folder / "tokenizer_config.json").exists()
        return None if weights and tokenizer else f"{folder} lacks its weights or tokenizer"
    if final.get("iteration") != iteration:
        return (
            f"{run_dir / FINAL_EVAL} is of iteration {final.get('iteration')}, the latest "
            f"checkpoint of iteration {iteration}"
        )
    if not final["artefacts"]:
        return f"{run_dir / FINAL_POLICY} was empty when the run ended"
    return digest_problem(run_dir, final["artefacts"])


def remove_final_leftovers(run_dir: Path) -> list[str]:
    """Delete what a kill during a folder-level write left in ``run_dir`` (hidden
    temporary siblings of ``final_policy``, ``curves.png``, ``final_eval.json`` and the
    reference policy's folder ``reference``)."""
    return remove_leftovers(Path(run_dir), (FINAL_POLICY, "curves.png", FINAL_EVAL, "reference"))
