"""Recipes: named YAML configs, their inheritance, ``key.sub=value`` overrides and the
config hash.

A run's config is built from a recipe (``src/credo/train/recipes/<name>.yaml``, or a path
to a ``.yaml``; a recipe may ``inherit`` another one, e.g. ``base``, and its sections are
merged key by key except ``params`` and ``kwargs``, which replace the parent's whole),
then from ``key.sub=value`` overrides (values parsed as YAML: ``3``, ``0.1``, ``true``,
``[1, 2]``, ``{a: 1}``). YAML is read safely and bounded (:mod:`credo.utils.safe_yaml`:
no Python objects, aliases and nesting limited before anything is built).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from credo.train.config.schema import Config, ConfigError
from credo.utils.registry import unknown_name_message
from credo.utils.safe_yaml import load_yaml, read_yaml_file, yaml_problem

__all__ = ["RECIPES_DIR", "apply_overrides", "config_hash", "load_config", "recipe_names"]

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


def recipe_names() -> list[str]:
    """The built-in recipes (``base`` included)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _read_recipe(name_or_path: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = RECIPES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ConfigError(
                unknown_name_message("recipe", name_or_path, recipe_names())
                + " (or a path to a .yaml recipe)"
            )
    if str(path) in seen:
        raise ConfigError(f"recipe inheritance cycle: {' -> '.join((*seen, str(path)))}")
    try:
        data = read_yaml_file(path) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path}{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping at the top level")
    parent = data.pop("inherit", None)
    if parent is None:
        return data
    base = _read_recipe(str(parent), (*seen, str(path)))
    return _deep_merge(base, data)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("params", "kwargs"):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings to a nested dict (values parsed as bounded safe YAML,
    :func:`~credo.utils.safe_yaml.load_yaml`)."""
    data = json.loads(json.dumps(data))  # deep copy
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, _, raw = item.partition("=")
        key = key.strip()
        if not key:
            raise ConfigError(f"override {item!r} has an empty key")
        if ":" in key:
            raise ConfigError(
                f"override {item!r}: RECIPE:key=value applies to one recipe of a "
                f"`credo compare`; here write {key.split(':', 1)[1]}={raw}"
            )
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"override {item!r}: cannot parse the value{yaml_problem(exc)}"
            ) from None
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p, {}), dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data


def load_config(
    recipe: str = "grpo", overrides: list[str] | None = None, *, machine: bool = True
) -> Config:
    """Recipe (with inheritance) + overrides → validated :class:`Config`. With
    ``machine=False`` nothing about this machine is checked (an engine's package, a
    CUDA device, a fitted judge's folder): a config read, not run here
    (:func:`validate.machine_checks`)."""
    from credo.train.config.validate import machine_checks

    data = _read_recipe(recipe)
    data.setdefault("recipe", Path(recipe).stem)
    data = apply_overrides(data, overrides or [])
    with machine_checks(machine):
        return Config.from_dict(data)


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-able object (cache keys)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
