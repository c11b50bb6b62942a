"""benchmarks/llm_learns.py's options and benchmarks/llm_item_choice.py's probe, checked
on the built-in model (no SmolLM2 needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import llm_item_choice
import llm_learns

from credo.train.config import ConfigError, load_config
from credo.train.run import build_run


def test_rl_lora_r_is_exclusive_with_lora_r(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        llm_learns.parse_args(["--lora-r", "8", "--rl-lora-r", "8"])
    assert exc.value.code == 2
    assert "give one of them" in capsys.readouterr().err


def test_rl_lora_r_keeps_a_full_warm_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = llm_learns.parse_args(["--rl-lora-r", "8"])
    assert (args.sft_lr, args.rl_lr) == (1e-4, 1e-4)  # full-FT SFT rate, LoRA RL rate
    common = llm_learns.base_overrides(args)
    assert not any(o.startswith("model.lora=") for o in common)  # the SFT stays full
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "cache"))
    (tmp_path / "sft.json").write_text(json.dumps({"key": "abc123"}))
    with pytest.raises(SystemExit, match=r"cached folder .* is gone"):
        llm_learns.rl_adapters(args, tmp_path)
    (tmp_path / "cache" / "warmstart" / "abc123" / "policy").mkdir(parents=True)
    extra = llm_learns.rl_adapters(args, tmp_path)
    assert extra == [
        f"model.name={tmp_path / 'cache' / 'warmstart' / 'abc123' / 'policy'}",
        "sft.enabled=false",
        "model.lora={r: 8, alpha: 16}",
    ]
    cfg = load_config("grpo", [*common, *extra])
    assert cfg.model.lora is not None and cfg.model.lora.r == 8 and not cfg.sft.enabled
    assert llm_learns.rl_adapters(llm_learns.parse_args([]), tmp_path) == []


def test_cheapest_title_rule_by_hand() -> None:
    page = "results : 1 red wool hat $70 ; 2 red wool hat $35 ; 3 red silk hat $20"
    assert llm_item_choice._cheapest_title_is(page, "search[red wool hat]", 2)
    assert not llm_item_choice._cheapest_title_is(page, "search[red wool hat]", 3)
    assert not llm_item_choice._cheapest_title_is(page, "search[blue wool hat]", 2)


def test_results_pages_and_probe_on_the_builtin_model() -> None:
    run = build_run(load_config("grpo", ["env.kwargs.difficulty=default"]))
    try:
        pages = llm_item_choice.results_pages(run, 12)
        assert all(1 <= rank <= 3 for _, rank, _ in pages)  # behind 2 price distractors
        assert all(rule for _, _, rule in pages)  # the distractors are over the budget
        out = llm_item_choice.probe(run.policy, run.renderer, pages)
        assert sum(out["p_rank"]) == pytest.approx(1.0, abs=1e-9)
        # P(right item): the mean over pages of the right rank's probability, here
        # recomputed one reply at a time (no padding)
        by_hand = 0.0
        with torch.no_grad():
            for prompt, rank, _ in pages:
                scores = []
                for k in range(1, 6):
                    ids = torch.tensor([prompt + run.renderer.response_ids(f"click[{k}]")])
                    lp = run.policy.logprobs(ids, torch.ones_like(ids))
                    scores.append(float(lp[0, len(prompt) :].sum()))
                p = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                by_hand += float(p[rank - 1])
        assert out["p_right"] == pytest.approx(by_hand / len(pages), abs=1e-5)
        assert 0.0 <= out["argmax_right"] <= 1.0
    finally:
        run.close()


def test_item_choice_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert llm_item_choice.parse_args(["--steps", "0"]).steps == 0  # probe the model as given
    with pytest.raises(SystemExit) as exc:
        llm_item_choice.parse_args(["--steps", "-1"])
    assert exc.value.code == 2 and "--steps must be at least 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        llm_item_choice.parse_args(["oops"])
    assert "key=value" in capsys.readouterr().err


def test_a_results_folder_from_before_a_new_option_still_resumes() -> None:
    settings = {k: v for k, v in vars(llm_learns.parse_args([])).items() if k != "recipes"}
    older = {k: v for k, v in settings.items() if k != "rl_lora_r"}  # saved before the option
    assert llm_learns.same_settings(older, settings)
    assert not llm_learns.same_settings(older, settings | {"rl_lora_r": 8})
    assert not llm_learns.same_settings(settings | {"iterations": 3}, settings)


def test_a_changed_warm_start_is_redone_not_mixed(tmp_path: Path) -> None:
    """A results folder whose sft.json names another warm start than these settings and
    this credo make (SFT, prompt or env code changed since) must not keep its rows: before
    the check, the RL phase silently trained a new warm start while the table showed the
    old one's evaluation."""
    assert llm_learns.check_warm_start(tmp_path, "new") is None  # nothing saved yet
    (tmp_path / "sft.json").write_text(json.dumps({"phase": "sft", "key": "new"}))
    (tmp_path / "warm-eval.json").write_text("{}")
    assert llm_learns.check_warm_start(tmp_path, "new") is None  # same warm start: kept
    assert (tmp_path / "warm-eval.json").exists()
    line = llm_learns.check_warm_start(tmp_path, "newer")
    assert line is not None and "new -> newer" in line and "redoing sft and warm-eval" in line
    assert not (tmp_path / "sft.json").exists() and not (tmp_path / "warm-eval.json").exists()
    (tmp_path / "sft.json").write_text(json.dumps({"phase": "sft", "key": "old"}))
    (tmp_path / "rl-grpo").mkdir()  # an RL phase begun from the old warm start
    with pytest.raises(SystemExit, match="rl-grpo began from the old one"):
        llm_learns.check_warm_start(tmp_path, "newer")
    assert (tmp_path / "sft.json").exists()  # nothing removed


def test_the_parent_and_the_sft_phase_compute_one_warm_start_key() -> None:
    """main() compares sft.json's key with warm_start_key of the grpo config; every RL
    recipe's config must give that key too, or its phase would redo the SFT."""
    from credo.train.warmstart import warm_start_key

    args = llm_learns.parse_args(["--sft-steps", "7"])
    keys = {
        warm_start_key(load_config(r, llm_learns.base_overrides(args)))
        for r in ("grpo", "gigpo", "rloo", "proas")
    }
    assert len(keys) == 1
    # --rl-seed: RL with its own train.seed from the warm start of --seed
    seeded = llm_learns.parse_args(["--sft-steps", "7", "--rl-seed", "2"])
    rl = [*llm_learns.base_overrides(seeded), *llm_learns.rl_seed(seeded)]
    assert load_config("grpo", rl).train.seed == 2
    assert warm_start_key(load_config("grpo", rl)) in keys
    other = llm_learns.parse_args(["--sft-steps", "8"])
    assert warm_start_key(load_config("grpo", llm_learns.base_overrides(other))) not in keys


EXACT = ("grpo", "gigpo", "rloo", "proas", "hpo")


@pytest.mark.parametrize("recipe", [*EXACT, "klpo", "opd", "mt_sdpo"])
def test_the_rl_phases_skip_zero_advantage_rows_only_where_exact(recipe: str) -> None:
    """The RL phases turn on optim.skip_zero_advantage where the recipe's loss is
    advantage-weighted with no KL loss or entropy bonus; the config check accepts it
    there, and refuses it for the others."""
    common = llm_learns.base_overrides(llm_learns.parse_args([]))
    assert llm_learns.skip_is_exact(load_config(recipe, common)) is (recipe in EXACT)
    skipping = [*common, "optim.skip_zero_advantage=true"]
    if recipe in EXACT:
        assert load_config(recipe, skipping).optim.skip_zero_advantage
    else:
        with pytest.raises(ConfigError, match=r"optim\.skip_zero_advantage=true is exact only"):
            load_config(recipe, skipping)


def test_the_gpu_command_keeps_the_users_dtype_and_device() -> None:
    """``--model DIR model.device=cuda model.dtype=bfloat16`` (the README's GPU command):
    the user's overrides come last and win, and no CPU mixed-precision setting is added
    beside the dtype. Loaded here with ``model.device=cpu`` in place of cuda (no CUDA on
    this machine), the config holds the dtype."""
    args = llm_learns.parse_args(["--model", "DIR", "model.device=cuda", "model.dtype=bfloat16"])
    common = llm_learns.base_overrides(args)
    assert common[0] == "model.name=DIR"
    assert common[-2:] == ["model.device=cuda", "model.dtype=bfloat16"]
    assert not any(o.startswith("model.mixed_precision=") for o in common)
    assert "rollout.tasks_per_iter=16" in common
    cpu = [o if o != "model.device=cuda" else "model.device=cpu" for o in common]
    cfg = load_config("grpo", [o for o in cpu if not o.startswith("model.name=")])
    assert (cfg.model.device, cfg.model.dtype, cfg.model.mixed_precision) == (
        "cpu",
        "bfloat16",
        None,
    )
