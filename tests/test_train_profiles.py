"""RAPO in training: tasks with a profile (the tools env's option), the plain prompt with
the profile cut out, RAPO's weights on a fixed tiny batch from two fixed reference
scorings (hand-worked, and exact across micro-batches), the config check that accepts
``ppo_rapo`` with profiles and refuses it in one line without, and short runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import credo.teachers.profiles as profiles_mod
from credo.data import RolloutForest
from credo.envs.base import Task
from credo.envs.tools import ToolsEnv
from credo.objectives import LossInputs, get_loss
from credo.objectives.rapo import rapo_extras
from credo.teachers.profiles import attach_profile_reference, plain_instruction
from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from credo.train.parts import rollout_texts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.desk_envs


def test_plain_instruction_cuts_the_profile_and_its_separator() -> None:
    assert plain_instruction("refund my kettle ; profile : likes red", "profile : likes red") == (
        "refund my kettle"
    )
    assert plain_instruction("a ; profile : x ; b", "profile : x") == "a ; b"
    assert plain_instruction("profile : x , then b", "profile : x") == "then b"
    assert plain_instruction("no profile here", "profile : x") == "no profile here"
    assert plain_instruction("a ; b", "") == "a ; b"


def test_tools_profiles_decide_exchanges_and_keep_the_tasks() -> None:
    seen = 0
    for seed in range(30):
        task = Task("train", seed)
        plain, prof = ToolsEnv("hard"), ToolsEnv("hard", profiles=True)
        plain.reset(task)
        prof.reset(task)
        assert prof.goal_ops() == plain.goal_ops()  # same task, same goal
        assert plain.profile() is None and plain.instruction() == plain.ticket
        text = prof.profile()
        assert text is not None and prof.instruction() == f"{prof.ticket} ; {text}"
        assert prof.privileged_context("profile") == text
        exchanges = [r for r in prof.requests if r.tool == "exchange"]
        for r in exchanges[:1]:  # the first exchange takes the profile's colour
            seen += 1
            color = prof.variants[r.value].color
            assert text == f"profile : favourite colour {color}"
            assert color not in prof.ticket.split()  # only the profile names it
            others = [v.color for v in prof.variants.values() if v.oid == r.oid]
            assert len(others) >= 2 and others.count(color) == 1  # the profile decides
    assert seen >= 5
    assert ToolsEnv(profiles=True).provides_profiles() and not ToolsEnv().provides_profiles()


def test_ppo_rapo_is_accepted_with_profiles_and_refused_in_one_line_without() -> None:
    cfg = load_config(
        "grpo", ["env.name=tools", "env.kwargs={profiles: true}", "objective.loss=ppo_rapo"]
    )
    assert cfg.objective.loss == "ppo_rapo"
    assert rollout_texts(cfg) == ("instruction", "profile")
    assert rollout_texts(load_config("grpo")) == ()
    for over in (["env.name=tools"], []):
        with pytest.raises(ConfigError) as e:
            load_config("grpo", [*over, "objective.loss=ppo_rapo"])
        msg = str(e.value)
        assert "\n" not in msg and "needs tasks that carry a profile" in msg
        assert "env.kwargs.profiles=true" in msg


# --------------------------------------------------- weights on a fixed batch
#: The two reference scorings of the two rows' two response tokens (positions 2, 3).
PROFILE = [[0.0, 0.0, -1.0, -2.0], [0.0, 0.0, -0.5, -3.0]]
PLAIN = [[0.0, 0.0, -1.5, -2.0], [0.0, 0.0, -0.5, -1.0]]


class StubRenderer:
    """Renders a goal as one token: 9 with the profile, 8 without."""

    def prompt_ids(self, instruction: str, history: Any, observation: str) -> list[int]:
        return [9] if "profile" in instruction else [8]


def _fixed_batch(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, float]]:
    forest = RolloutForest.from_columns(
        group=[0, 0],
        parent=[-1, -1],
        prompt_ids=[torch.tensor([1, 2]), torch.tensor([1, 2])],
        response_ids=[torch.tensor([3, 4]), torch.tensor([3, 5])],
        old_logprobs=[torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0])],
        observations=["which colour", "which colour"],
        actions=["red", "blue"],
    )
    forest.texts = {
        "instruction": ["pick a colour ; profile : likes red"] * 2,
        "profile": ["profile : likes red"] * 2,
    }
    batch = forest.to_batch(torch.tensor([1.0, -1.0]))

    def fake_score(policy: Any, rows: Any, **kw: Any) -> Any:
        if rows.prompts is None:  # the policy's own prompt: with the profile
            return type("S", (), {"logprobs": torch.tensor(PROFILE)})()
        assert [list(p) for p in rows.prompts] == [[8], [8]]  # re-rendered without it
        return type("S", (), {"logprobs": torch.tensor(PLAIN)})()

    monkeypatch.setattr(profiles_mod, "score_with_policy", fake_score)
    metrics = attach_profile_reference(None, StubRenderer(), forest, batch)  # type: ignore[arg-type]
    return batch, metrics


def _inputs(batch: Any) -> LossInputs:
    mask = batch.loss_mask
    return LossInputs(
        logprobs=batch.old_logprobs.clone(),  # ratio 1
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        mask=mask,
        weights=mask.float() / 4,  # token mean over the 4 response tokens of the batch
        episode=batch.episode,
        turn=batch.turn,
        extras=rapo_extras(batch.token_extras),
    )


def test_rapo_weights_in_training_from_two_fixed_reference_scorings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch, metrics = _fixed_batch(monkeypatch)
    # m = profile − plain on the response tokens: [[0.5, 0], [0, −2]], range (−2, 0.5)
    assert metrics["rapo/signal_min"] == -2.0 and metrics["rapo/signal_max"] == 0.5
    assert metrics["rapo/signal_mean"] == pytest.approx(-1.5 / 4)
    assert metrics["rapo/profile_rows"] == 1.0
    assert batch.token_extras["rapo_range"].shape == (2, 4, 2)
    loss, m = get_loss("ppo_rapo")(_inputs(batch), gamma=1.0)
    # scaled m = (m + 2)/2.5 = [[1, 0.8], [0.8, 0]]
    assert float(m["policy/rapo_signal"]) == pytest.approx((1 + 0.8 + 0.8 + 0) / 4)
    # A = +1: w = 1 + m = [2, 1.8]; A = −1: w = 1/(1 + m) = [1/1.8, 1]
    assert float(m["policy/rapo_weight"]) == pytest.approx((2 + 1.8 + 1 / 1.8 + 1) / 4)
    # ratio 1: ℓ = −A, so loss = (−2 − 1.8 + 1/1.8 + 1)/4
    assert float(loss) == pytest.approx((-2 - 1.8 + 1 / 1.8 + 1) / 4)
    # micro-batches of one row each add up to the whole (one range for the iteration)
    parts = [get_loss("ppo_rapo")(_inputs(batch.index(torch.tensor([i]))), gamma=1.0)[0]
             for i in (0, 1)]  # fmt: skip
    assert float(parts[0] + parts[1]) == pytest.approx(float(loss))


# ------------------------------------------------------------ end to end
def _records(run_dir: Path) -> list[dict[str, Any]]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if "rapo/profile_rows" in r]


TINY = "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}"


def test_a_short_rapo_run_weighs_tokens_by_the_profile(tmp_path: Path) -> None:
    """PickEnv: the reward is for the profile's colour; RAPO's weights move off 1 where
    the advantage is not 0."""
    cfg = load_config(
        "grpo",
        [
            "env.name=examples.desk_envs:PickEnv", TINY,
            "sft.episodes=60", "sft.steps=60", "sft.noisy_episodes=0", "sft.noisy_steps=0",
            "rollout.max_new_tokens=2", "rollout.tasks_per_iter=3", "rollout.group_size=4",
            "objective.loss=ppo_rapo", "objective.params={gamma: 2.0}",
            "train.threads=1", "train.iterations=2", "eval.episodes=4",
            f"train.runs_dir={tmp_path}", "train.name=rapo",
        ],
    )  # fmt: skip
    recs = _records(train(cfg, quiet=True).run_dir)
    assert len(recs) == 2
    for r in recs:
        assert r["rapo/profile_rows"] == 1.0
        assert r["rapo/signal_max"] > r["rapo/signal_min"]
        assert 0 < r["policy/rapo_signal"] <= 1
    moved = [r for r in recs if r["credit/adv_std"] > 0]
    assert moved, "no iteration had a non-zero advantage"
    assert all(r["policy/rapo_weight"] != pytest.approx(1.0) for r in moved)
    assert all(r["policy/grad_norm"] > 0 for r in moved)


def test_rapo_runs_on_the_tools_env_with_profiles(tmp_path: Path) -> None:
    cfg = load_config(
        "grpo",
        [
            "env.name=tools",
            "env.kwargs={difficulty: easy, profiles: true, families: [exchange_by_id]}",
            TINY, "sft.enabled=false", "objective.loss=ppo_rapo",
            "rollout.max_new_tokens=6", "rollout.tasks_per_iter=2", "rollout.group_size=2",
            "rollout.max_turns=2", "train.threads=1", "train.iterations=1", "eval.episodes=2",
            f"train.runs_dir={tmp_path}", "train.name=rapo_tools",
        ],
    )  # fmt: skip
    (r,) = _records(train(cfg, quiet=True).run_dir)
    assert r["rapo/profile_rows"] == 1.0 and r["rapo/signal_max"] > r["rapo/signal_min"]
    assert "policy/rapo_weight" in r
