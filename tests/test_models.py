"""Resolving ``--model``: folders, aliases, the offline order of sources, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.policy.models import (
    MARKER,
    MODEL_ALIASES,
    ModelAlias,
    ModelUnavailableError,
    alias_folder,
    materialise_alias,
    resolve_model,
)

FAKE = ModelAlias(
    name="fake-model",
    hub_id="credo-test/definitely-not-a-repo",
    package="credo_no_such_package",
    gguf_file="fake.gguf",
    install="pip install credo-no-such-package",
)


def test_folders_and_hub_names_pass_through(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("someone/some-model") == "someone/some-model"
    assert "smollm2-135m" in MODEL_ALIASES


def test_a_converted_folder_in_the_cache_is_used_without_asking_anyone() -> None:
    folder = alias_folder(FAKE)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"source": "gguf"}))
    said: list[str] = []
    assert materialise_alias(FAKE, log=said.append) == folder
    assert said == [f"fake-model: using the converted model in {folder}"]


def test_with_the_package_installed_the_hub_is_never_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing downloads at run time where the package is installed: the packaged model
    is converted without asking the hub (which, reachable, would otherwise be tried
    first and give other weights on a machine with network than on one without)."""
    from credo.policy import models

    asked: list[str] = []
    hub = tmp_path / "hub"
    monkeypatch.setattr(models, "_from_hub", lambda alias, log, timeout: asked.append("hub") or hub)
    converted = tmp_path / "converted"
    monkeypatch.setattr(
        models, "convert_gguf_model", lambda alias, folder, log: asked.append("gguf") or converted
    )
    installed = ModelAlias(**{**FAKE.__dict__, "name": "fake-installed", "package": "yaml"})
    assert materialise_alias(installed, log=lambda line: None) == converted
    assert asked == ["gguf"]
    missing = ModelAlias(**{**FAKE.__dict__, "name": "fake-absent"})  # no package: the hub
    assert materialise_alias(missing, log=lambda line: None) == hub
    assert asked == ["gguf", "hub"]


def test_offline_without_the_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake = ModelAlias(**{**FAKE.__dict__, "name": "fake-missing"})
    said: list[str] = []
    with pytest.raises(ModelUnavailableError, match="pip install credo-no-such-package"):
        materialise_alias(fake, log=said.append)
    assert said == ["fake-missing: HF_HUB_OFFLINE is set: not asking the hub"]
    # an incomplete folder (no marker: a conversion that died) is not used
    alias_folder(fake).mkdir(parents=True)
    with pytest.raises(ModelUnavailableError):
        materialise_alias(fake, log=said.append)
