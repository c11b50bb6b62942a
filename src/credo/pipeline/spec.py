"""A pipeline file: its stages, their configs and references, read and checked before any
compute.

A pipeline is one YAML file (read as bounded safe YAML, :mod:`credo.utils.safe_yaml`)::

    name: spatialcli          # the pipeline's folder under runs_dir (default: file stem)
    runs_dir: runs            # default runs
    recipe: grpo              # every stage's recipe (a stage may name its own)
    overrides:                # every stage's config, key.sub: value
      env.kwargs.tools: on
    stages:
      - name: sft_tools       # the stage's folder; letters, digits, _ and -
        kind: sft             # a registered stage kind (credo.pipeline.registry)
      - name: rl_tools
        kind: rl
        policy: sft_tools     # a reference: that earlier stage's policy
        overrides: {train.iterations: 20}
        params: {trajectories: 64}
      - name: internalise
        kind: internalise
        policy: rl_tools
        trajectories: rl_tools

A reference (``policy:``, ``trajectories:``) names an earlier stage whose kind makes that
output. Command-line overrides ``key.sub=value`` apply to every stage's config;
``stages.NAME.key.sub=value`` to one stage's config, ``stages.NAME.params.KEY=value`` to
its parameters; ``name=`` and ``runs_dir=`` to the pipeline. Every stage's config is
built and validated here (:func:`~credo.train.config.load_config`) and its env made
once, so a wrong key, value, kind or reference stops with one line (:class:`PipelineError`)
before any training.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from credo.pipeline.registry import STAGES, StageKind
from credo.train.config import Config, ConfigError, config_hash, load_config
from credo.train.run import env_factory
from credo.utils.registry import unknown_name_message
from credo.utils.safe_yaml import load_yaml, read_yaml_file, yaml_problem

__all__ = ["PipelineError", "PipelineSpec", "StageSpec", "load_pipeline"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOP_KEYS = ("name", "runs_dir", "recipe", "overrides", "stages")
#: The references a stage may hold (each names an earlier stage that makes that output).
REFERENCES = ("policy", "trajectories", "labels", "critic")
_STAGE_KEYS = ("name", "kind", "recipe", "overrides", "params", *REFERENCES)


class PipelineError(ValueError):
    """A pipeline file or override is wrong; the message (one line) says what is accepted."""


def changed_settings(value: Any, default: Any) -> Any:
    """``value`` without the entries equal to ``default``'s, recursively through
    mappings: what a config sets away from the defaults. A stage's digest hashes this,
    so a field that a later credo adds at its default leaves finished stages valid for
    ``--resume``, while any setting that differs still changes it."""
    if not (isinstance(value, dict) and isinstance(default, dict)):
        return value
    return {
        k: changed_settings(v, default[k]) if k in default else v
        for k, v in value.items()
        if k not in default or v != default[k]
    }


def _default_config() -> dict[str, Any]:
    return Config().to_dict()


def _params_and_defaults(params: Any) -> tuple[Any, Any]:
    """A stage's params as a mapping, and its kind's defaults (``None`` if the params
    have no default instance)."""
    if not dataclasses.is_dataclass(params) or isinstance(params, type):
        return params, None
    try:
        default = dataclasses.asdict(type(params)())
    except TypeError:  # a field without a default
        default = None
    return dataclasses.asdict(params), default


@dataclass(frozen=True)
class StageSpec:
    """One stage, resolved.

    Attributes:
        name: the stage's name (its folder in the pipeline folder).
        kind: its registered kind.
        cfg: its run config (recipe + the pipeline's overrides + its own), validated.
        refs: output name → the earlier stage it comes from (``{"policy": "sft"}``).
        params: the kind's parameters (its ``params`` dataclass, filled in).
        digest: a hash of everything the stage's result depends on (its config's and
            parameters' settings away from their defaults, :func:`changed_settings`; its
            kind; the digests of the stages it reads): a finished stage is skipped on
            ``--resume`` only while it is unchanged.
    """

    name: str
    kind: str
    cfg: Config
    refs: dict[str, str]
    params: Any
    digest: str


@dataclass(frozen=True)
class PipelineSpec:
    """A whole pipeline, resolved: where it runs and its stages in order.

    Attributes:
        name: the pipeline's name.
        folder: the pipeline's run folder (``runs_dir/name``).
        source: the file it was read from.
        stages: the stages, in order.
        raw: the file's mapping with the stage overrides of the command line applied
            (saved in the folder as ``pipeline.yaml``).
        overrides: the command-line overrides, as given.
    """

    name: str
    folder: Path
    source: Path
    stages: list[StageSpec]
    raw: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name``."""
        return next(s for s in self.stages if s.name == name)


def load_pipeline(path: str | Path, overrides: list[str] | None = None) -> PipelineSpec:
    """Read, resolve and check a pipeline file (see the module docstring).

    Args:
        path: the YAML file.
        overrides: ``key.sub=value``, ``stages.NAME.key=value``, ``name=``, ``runs_dir=``.

    Raises:
        PipelineError: anything wrong, in one line naming the file, stage or key and what
            is accepted.
    """
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"pipeline file {path} does not exist (give a .yaml pipeline file)")
    try:
        data = read_yaml_file(path)
    except yaml.YAMLError as exc:
        raise PipelineError(f"pipeline {path}{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise PipelineError(f"pipeline {path} must be a mapping with a `stages:` list")
    data, late = _apply_cli(data, list(overrides or []), path)
    _check_keys(data, _TOP_KEYS, f"pipeline {path}")
    name = str(data.get("name") or path.stem)
    if not _NAME.fullmatch(name):
        raise PipelineError(f"pipeline {path}: name {name!r} must be letters, digits, _ or -")
    folder = Path(str(data.get("runs_dir") or "runs")) / name
    stages_raw = data.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise PipelineError(f"pipeline {path}: `stages:` must be a non-empty list of stages")
    common = _override_list(data.get("overrides"), f"pipeline {path}: overrides")
    recipe = str(data.get("recipe") or "grpo")
    stages: list[StageSpec] = []
    for i, raw in enumerate(stages_raw):
        stages.append(_stage(raw, i, stages, common, late, recipe, path))
    return PipelineSpec(name, folder, path, stages, data, list(overrides or []))


def _stage(
    raw: Any,
    index: int,
    earlier: list[StageSpec],
    common: list[str],
    late: list[str],
    recipe: str,
    path: Path,
) -> StageSpec:
    """Stage ``index`` of ``path`` resolved against the stages before it: its config is
    the recipe, then ``common`` (the file's overrides), its own overrides, ``late`` (the
    command line's), and what its kind sets from its references."""
    where = f"pipeline {path}: stage {index + 1}"
    if not isinstance(raw, dict):
        raise PipelineError(f"{where} must be a mapping with name: and kind:")
    _check_keys(raw, _STAGE_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PipelineError(f"{where}: name {name!r} must be letters, digits, _ or -")
    where = f"pipeline {path}: stage {name!r}"
    if any(s.name == name for s in earlier):
        raise PipelineError(f"{where}: the name is used twice; stage names must be unique")
    kind_name = raw.get("kind")
    if not isinstance(kind_name, str) or kind_name not in STAGES:
        raise PipelineError(
            f"{where}: " + unknown_name_message("stage kind", str(kind_name), STAGES.names())
        )
    kind: StageKind = STAGES.get(kind_name)
    refs: dict[str, str] = {}
    for ref in REFERENCES:
        if ref not in raw:
            continue
        target = raw[ref]
        if ref not in (*kind.needs, *kind.accepts):
            raise PipelineError(
                f"{where}: a {kind_name} stage takes no {ref}: reference "
                f"(it takes: {', '.join((*kind.needs, *kind.accepts)) or 'none'})"
            )
        source = next((s for s in earlier if s.name == target), None)
        if source is None:
            before = ", ".join(s.name for s in earlier) or "none"
            raise PipelineError(
                f"{where}: {ref}: {target!r} is not an earlier stage (earlier stages: {before})"
            )
        made = STAGES.get(source.kind).outputs(source.params)
        if ref not in made:
            raise PipelineError(
                f"{where}: {ref}: stage {target!r} ({source.kind}) makes no {ref} "
                f"(it makes: {', '.join(made) or 'nothing'}; an rl stage makes trajectories "
                "with params.trajectories > 0)"
            )
        refs[ref] = target
    missing = [r for r in kind.needs if r not in refs]
    if missing:
        raise PipelineError(
            f"{where}: a {kind_name} stage needs {' and '.join(f'{r}: STAGE' for r in missing)}"
        )
    own = _override_list(raw.get("overrides"), f"{where}: overrides")
    extra = kind.config_overrides(refs)
    try:
        cfg = load_config(str(raw.get("recipe") or recipe), [*common, *own, *late, *extra])
    except ConfigError as exc:
        raise PipelineError(f"{where}: {exc}") from None
    if cfg.model.lora is not None:
        raise PipelineError(
            f"{where}: model.lora is not supported in pipelines yet (stages pass whole "
            "policies; LoRA saves adapters only)"
        )
    try:
        env_factory(cfg)
    except (TypeError, ValueError, KeyError) as exc:
        raise PipelineError(f"{where}: env: {' '.join(str(exc).split())}") from None
    params = _params(kind, raw.get("params"), where)
    if kind.check is not None:
        try:
            kind.check(cfg, params)
        except ValueError as exc:
            raise PipelineError(f"{where}: {exc}") from None
    upstream = {r: next(s.digest for s in earlier if s.name == t) for r, t in refs.items()}
    digest = config_hash(
        {
            "kind": kind_name,
            "cfg": changed_settings(cfg.to_dict(), _default_config()),
            "params": changed_settings(*_params_and_defaults(params)),
            "upstream": upstream,
        }
    )
    return StageSpec(name, kind_name, cfg, refs, params, digest)


def _params(kind: StageKind, raw: Any, where: str) -> Any:
    """The kind's ``params`` dataclass from the stage's ``params:`` mapping."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise PipelineError(f"{where}: params must be a mapping")
    if kind.params is None:
        if raw:
            raise PipelineError(f"{where}: a {kind.name} stage takes no params")
        return None
    names = [f.name for f in dataclasses.fields(kind.params)]
    bad = [k for k in raw if k not in names]
    if bad:
        raise PipelineError(
            f"{where}: unknown param(s) {', '.join(map(repr, bad))}; "
            f"a {kind.name} stage accepts: {', '.join(names)}"
        )
    try:
        return kind.params(**raw)
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"{where}: params: {exc}") from None


def _check_keys(data: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    bad = [str(k) for k in data if k not in allowed]
    if bad:
        raise PipelineError(
            f"{where}: unknown key(s) {', '.join(map(repr, bad))}; accepted: {', '.join(allowed)}"
        )


def _override_list(raw: Any, where: str) -> list[str]:
    """A ``{key.sub: value}`` mapping as ``key.sub=value`` strings (values as JSON, which
    is YAML)."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise PipelineError(f"{where} must be a mapping of key.sub: value")
    return [f"{k}={json.dumps(v)}" for k, v in raw.items()]


def _apply_cli(
    data: dict[str, Any], overrides: list[str], path: Path
) -> tuple[dict[str, Any], list[str]]:
    """The file's mapping with command-line overrides applied (a deep copy), and the
    overrides of every stage's config, which apply after each stage's own."""
    data = json.loads(json.dumps(data, default=str))
    late: list[str] = []
    stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    for item in overrides:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise PipelineError(f"override {item!r} must look like key.sub=value")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise PipelineError(
                f"override {item!r}: cannot parse the value{yaml_problem(exc)}"
            ) from None
        key = key.strip()
        if key in ("name", "runs_dir"):
            data[key] = value
        elif key.startswith("stages."):
            _, _, rest = key.partition(".")
            stage_name, _, sub = rest.partition(".")
            stage = next(
                (s for s in stages if isinstance(s, dict) and s.get("name") == stage_name), None
            )
            if stage is None or not sub:
                names = ", ".join(str(s.get("name")) for s in stages if isinstance(s, dict))
                raise PipelineError(
                    f"override {item!r}: stages.NAME.key=value names a stage of {path} "
                    f"(stages: {names or 'none'})"
                )
            if sub.startswith("params."):
                stage.setdefault("params", {})[sub.removeprefix("params.")] = value
            else:
                stage.setdefault("overrides", {})[sub] = value
        elif "." in key:
            late.append(f"{key}={json.dumps(value)}")
        else:
            raise PipelineError(
                f"override {item!r}: accepted are key.sub=value (every stage's config), "
                "stages.NAME.key.sub=value, name=NAME and runs_dir=FOLDER"
            )
    return data, late
