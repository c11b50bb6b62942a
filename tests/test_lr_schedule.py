"""``optim.lr_schedule``: the learning rate per iteration, by hand; an annealed update is
the constant-rate update at that iteration's rate, to the bit; the rate is logged; a
resumed run continues the schedule exactly; an annealed run is not extended."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from credo.cli import main
from credo.train.config import Config, ConfigError, load_config, schema
from credo.train.parts import update_context
from credo.train.update import policy_update, scheduled_lr
from small_run import TINY_RUN
from test_cli import VOLATILE
from test_distributed import cut_after
from test_update import _batch, _policy


def test_the_rates_by_hand() -> None:
    assert [scheduled_lr(0.1, "linear", it, 4) for it in range(4)] == pytest.approx(
        [0.1, 0.075, 0.05, 0.025], rel=1e-12
    )
    assert [scheduled_lr(0.1, "constant", it, 4) for it in range(4)] == [0.1] * 4
    assert scheduled_lr(3e-4, "linear", 99, 100) == pytest.approx(3e-6, rel=1e-12)
    with pytest.raises(ConfigError, match=r"^optim.lr_schedule='cosine': expected one of co"):
        load_config("grpo", ["optim.lr_schedule=cosine"])


def _update(overrides: list[str], lr: float, iteration: int) -> tuple[list[torch.Tensor], float]:
    pol = _policy()
    cfg = load_config("grpo", ["sft.enabled=false", "optim.max_kl=null", *overrides])
    opt = torch.optim.AdamW(pol.model.parameters(), lr=lr)
    ctx = update_context(cfg, pol, opt)
    out = policy_update(ctx, _batch(), iteration=iteration, generator=torch.Generator())
    weights = [p.detach().clone() for p in pol.model.parameters()]
    return weights, out.get("optim/lr", float("nan"))


def test_an_annealed_update_is_the_constant_update_at_its_rate() -> None:
    """Iteration 3 of 10 at lr 0.05, linear: the same weights, bit for bit, as a constant
    run whose optimizer was built with 0.05 · 0.7 = 0.035; a constant schedule leaves the
    optimizer's own rate (0.123 here, not the config's 0.05) untouched."""
    linear = ["optim.lr=0.05", "optim.lr_schedule=linear", "train.iterations=10"]
    annealed, logged = _update(linear, lr=0.05, iteration=3)
    assert logged == pytest.approx(0.035, rel=1e-12)
    by_hand, _ = _update(["optim.lr=0.05"], lr=scheduled_lr(0.05, "linear", 3, 10), iteration=3)
    assert all(torch.equal(a, b) for a, b in zip(annealed, by_hand))
    untouched, no_rate = _update(["optim.lr=0.05"], lr=0.123, iteration=3)
    assert math.isnan(no_rate)  # optim/lr is not logged: nothing is scheduled
    reference, _ = _update(["optim.lr=0.123"], lr=0.123, iteration=0)
    assert all(torch.equal(a, b) for a, b in zip(untouched, reference))
    assert not all(torch.equal(a, b) for a, b in zip(annealed, untouched))


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_a_resumed_annealed_run_continues_exactly_and_is_not_extended(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = [*TINY_RUN, "train.iterations=3", "optim.lr_schedule=linear", "optim.lr=0.01"]
    cfg += ["train.checkpoint_every=1", "train.keep_checkpoints=3", f"train.runs_dir={tmp_path}"]
    assert main(["train", *cfg, "train.name=full", "--quiet"]) == 0
    full = tmp_path / "full"
    rates = [r["optim/lr"] for r in _metrics(full)]
    assert rates == pytest.approx([0.01, 0.01 * 2 / 3, 0.01 / 3], rel=1e-12)
    cut = cut_after(full, tmp_path, 3)
    assert main(["train", "--resume", str(cut), "--quiet"]) == 0
    assert _metrics(cut) == _metrics(full)
    assert json.loads((cut / "final_eval.json").read_text()) == json.loads(
        (full / "final_eval.json").read_text()
    )
    capsys.readouterr()
    assert main(["train", "--resume", str(cut), "train.iterations=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "anneals its learning rate over 3 iterations" in err[0]


def test_a_saved_config_from_before_a_key_keeps_the_behaviour_it_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Config.from_saved`` fills a key the file predates with the value of the behaviour
    the run had (``ADDED_LATER``), where ``from_dict`` fills today's default: shown with
    the trust region (0.2 by default, none before it), then the schedule itself."""
    data = load_config("grpo").to_dict()
    del data["optim"]["max_kl"], data["optim"]["lr_schedule"]
    monkeypatch.setitem(schema.ADDED_LATER, ("optim", "max_kl"), None)
    assert Config.from_dict(data).optim.max_kl == 0.2
    assert Config.from_saved(data).optim.max_kl is None
    assert Config.from_saved(data).optim.lr_schedule == "constant"
    assert "lr_schedule" not in data["optim"]  # the caller's mapping is left as it was
    data["optim"]["lr_schedule"] = "linear"  # a key the file has is kept
    assert Config.from_saved(data).optim.lr_schedule == "linear"
