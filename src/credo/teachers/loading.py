"""Finding, checking and loading a teacher model from disk.

Accepted paths (:func:`resolve_policy_folder`):

- a **credo run folder**: its ``final_policy/`` (a run without one is still training or
  was interrupted: error, pointing at its newest checkpoint); its ``reference/`` folder
  is the run's warm start (OPRD's base teacher);
- a **checkpoint folder** ``checkpoints/step_N`` (its ``policy/``);
- any **Hugging Face model folder** (``config.json``) or LoRA adapter folder
  (``adapter_config.json``), such as ``final_policy/`` itself.

Before any weights are loaded, :func:`check_teacher_folder` compares the folder's
vocabulary size (``config.json``) and tokenizer (token → id map and special ids) with the
student's: a teacher must score the student's own token ids, so anything else is a
one-line ``ValueError``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from credo.policy import HFPolicy

__all__ = [
    "check_teacher_folder",
    "check_tokenizers",
    "load_teacher_policy",
    "resolve_policy_folder",
]

#: A run whose ``metrics.jsonl`` changed this recently (seconds) is reported as training.
FRESH_SECONDS = 300.0

_SPECIALS = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id")


def _is_model_folder(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / "adapter_config.json").is_file()


def resolve_policy_folder(path: str | Path) -> Path:
    """The model folder a teacher path names (module docstring); one-line errors.

    Raises:
        ValueError: the path does not exist, is a run without ``final_policy/`` (still
            training or interrupted), or holds no model.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(
            f"teacher path {str(p)!r} does not exist; pass a credo run folder, a checkpoint "
            "folder (RUN/checkpoints/step_N) or a Hugging Face model folder"
        )
    if not p.is_dir():
        raise ValueError(f"teacher path {str(p)!r} is a file; pass a folder")
    if (p / "final_policy").is_dir():
        return p / "final_policy"
    if (p / "policy").is_dir() and _is_model_folder(p / "policy"):
        return p / "policy"
    if _is_model_folder(p):
        return p
    if (
        (p / "checkpoints").is_dir()
        or (p / "metrics.jsonl").exists()
        or (p / "config.yaml").exists()
    ):
        raise ValueError(_unfinished_run_message(p))
    raise ValueError(
        f"teacher path {str(p)!r} holds no model: expected a run folder with final_policy/, a "
        "checkpoint folder with policy/, or a model folder with config.json"
    )


def _unfinished_run_message(run: Path) -> str:
    metrics = run / "metrics.jsonl"
    state = "still training or interrupted"
    if metrics.exists():
        age = time.time() - metrics.stat().st_mtime
        if age < FRESH_SECONDS:
            state = f"still training (metrics.jsonl written {age:.0f}s ago) or interrupted"
    steps = sorted(
        (c for c in (run / "checkpoints").glob("step_*") if (c / "policy").is_dir()),
        key=lambda c: int(c.name.split("_")[1]) if c.name.split("_")[1].isdigit() else -1,
    )
    hint = f" such as {steps[-1]}" if steps else ""
    return f"teacher run {str(run)!r} has no final_policy/: {state}; pass a checkpoint folder{hint}"


def _folder_vocab_size(folder: Path) -> int | None:
    """``vocab_size`` from the folder's config (a LoRA folder: its base model's)."""
    cfg_dir = folder
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            return None
        cfg_dir = Path(base)
    try:
        cfg = json.loads((cfg_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"teacher folder {str(folder)!r}: unreadable config.json ({exc})"
        ) from None
    v = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    return int(v) if v else None


def check_tokenizers(teacher_tok: Any, student_tok: Any, where: str) -> None:
    """Raise a one-line ``ValueError`` unless both tokenizers map tokens to the same ids
    and have the same special token ids."""
    tv, sv = teacher_tok.get_vocab(), student_tok.get_vocab()
    if tv != sv:
        only_t = sorted(set(tv) - set(sv))
        moved = sorted(k for k in set(tv) & set(sv) if tv[k] != sv[k])
        if moved:
            what = f"token {moved[0]!r} is id {tv[moved[0]]} for the teacher, {sv[moved[0]]} for the student"
        elif only_t:
            what = f"token {only_t[0]!r} is only in the teacher's"
        else:
            extra = sorted(set(sv) - set(tv))
            what = f"token {extra[0]!r} is only in the student's"
        raise ValueError(
            f"teacher {where} uses another tokenizer than the student ({what}); a teacher "
            "must share the student's tokenizer"
        )
    for attr in _SPECIALS:
        a, b = getattr(teacher_tok, attr, None), getattr(student_tok, attr, None)
        if a != b:
            raise ValueError(
                f"teacher {where}: {attr} is {a} but the student's is {b}; a teacher must "
                "share the student's tokenizer"
            )


def check_teacher_folder(folder: Path, student: HFPolicy) -> None:
    """Check a model folder against the student before loading any weights.

    Raises:
        ValueError: another vocabulary size, or another tokenizer.
    """
    from transformers import AutoTokenizer

    v = _folder_vocab_size(folder)
    if v is not None and v != int(student.vocab_size):
        raise ValueError(
            f"teacher {str(folder)!r} has vocabulary size {v} but the student has "
            f"{student.vocab_size}; a teacher must share the student's vocabulary"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"teacher {str(folder)!r}: cannot load its tokenizer ({first})") from None
    check_tokenizers(tok, student.tokenizer, repr(str(folder)))


def load_teacher_policy(
    path: str | Path, student: HFPolicy, *, dtype: torch.dtype | None = None
) -> HFPolicy:
    """Resolve, check and load a teacher model onto the student's device, frozen.

    Args:
        path: a run, checkpoint or model folder (:func:`resolve_policy_folder`).
        student: the student policy (tokenizer, vocabulary size and device to match).
        dtype: load dtype (default ``None``: as saved).
    """
    folder = resolve_policy_folder(path)
    check_teacher_folder(folder, student)
    policy = HFPolicy.from_pretrained(folder, device=str(student.device), dtype=dtype)
    if int(policy.vocab_size) != int(student.vocab_size):  # e.g. a LoRA base not checked above
        raise ValueError(
            f"teacher {str(folder)!r} has vocabulary size {policy.vocab_size} but the student "
            f"has {student.vocab_size}; a teacher must share the student's vocabulary"
        )
    policy.model.requires_grad_(False)
    policy.model.eval()
    return policy
