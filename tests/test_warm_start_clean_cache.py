"""The warm start's clean phase is cached, as the warm start without a noisy phase: warm
starts that differ only in the noisy phase's length or learning rate (``sft.noisy_steps``,
``sft.noisy_lr``) train the clean phase once and get the weights a warm start from
scratch gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from credo.train.config import load_config
from credo.train.run import build_run
from credo.train.warmstart import clean_phase_key, warm_start, warm_start_folder, warm_start_key

TINY = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    *("sft.episodes=20", "sft.noisy_episodes=10", "sft.steps=4", "sft.noisy_steps=2"),
    "train.threads=1",
]


def _warm(overrides: list[str]) -> tuple[list[torch.Tensor], list[str]]:
    """The warm start's weights and the phases it trained (as its progress reports)."""
    phases: list[str] = []
    run = build_run(load_config("grpo", [*TINY, *overrides]))
    try:
        policy, _ = warm_start(run, on_step=lambda phase, *_: phases.append(phase))
    finally:
        run.close()
    return [p.detach().clone() for p in policy.model.parameters()], phases


def test_the_clean_key_is_the_key_of_the_warm_start_without_a_noisy_phase() -> None:
    base = load_config("grpo", TINY)
    key = clean_phase_key(base)
    assert key == warm_start_key(load_config("grpo", [*TINY, "sft.noisy_steps=0"]))
    for noisy in ("sft.noisy_steps=5", "sft.noisy_lr=3e-4"):
        other = load_config("grpo", [*TINY, noisy])
        assert clean_phase_key(other) == key, noisy
        assert warm_start_key(other) not in (key, warm_start_key(base)), noisy
    # the noisy demonstrations (their success is recorded) and the clean phase's settings
    for other in ("sft.epsilon=0.1", "sft.noisy_episodes=7", "sft.steps=5", "sft.lr=3e-4"):
        assert clean_phase_key(load_config("grpo", [*TINY, other])) != key, other
    assert clean_phase_key(load_config("grpo", [*TINY, "sft.seed=1"])) != key


def test_a_noisy_variant_reuses_the_cached_clean_phase_with_identical_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    _, phases = _warm([])
    assert phases.count("clean demos") == 4 and phases.count("noisy demos") == 2
    clean = warm_start_folder(clean_phase_key(load_config("grpo", TINY)))
    assert (clean / "warmstart.json").exists() and (clean / "policy").is_dir()
    # it is the warm start without a noisy phase: that run loads it
    no_noise, phases = _warm(["sft.noisy_steps=0"])
    assert phases == []
    fresh, _ = _warm(["sft.noisy_steps=0", "sft.cache=false"])
    assert all(torch.equal(a, b) for a, b in zip(no_noise, fresh, strict=True))

    variant = ["sft.noisy_steps=3", "sft.noisy_lr=3e-3"]
    reused, phases = _warm(variant)
    assert phases == ["noisy demos"] * 3  # the clean phase was loaded, not trained
    fresh, phases = _warm([*variant, "sft.cache=false"])
    assert phases.count("clean demos") == 4
    assert all(torch.equal(a, b) for a, b in zip(reused, fresh, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(reused, no_noise, strict=True))


def test_without_a_cache_or_a_noisy_phase_nothing_more_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    _warm(["sft.noisy_steps=0"])  # the warm start is its clean phase: stored once
    _warm(["sft.cache=false", "sft.seed=3"])
    names = [p.name for p in (tmp_path / "warmstart").iterdir()]
    assert names == [warm_start_key(load_config("grpo", [*TINY, "sft.noisy_steps=0"]))]
