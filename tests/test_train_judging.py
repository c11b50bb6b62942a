"""SERPO in training: the rubric reward combined with the env's (hand-worked numbers), the
judge's agreement metrics, rubric evolution on fixed pools with the rule-based proposer
(the exact new rubric and its log), the ``judge`` section's checks, the tools env's
free-text closing, and a short end-to-end run whose only reward is the judge's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from credo.data import RolloutForest
from credo.envs.base import Task
from credo.envs.tools import ToolsEnv, format_call
from credo.teachers.judge import JudgeCost
from credo.teachers.judging import (
    CHANGES_FILE,
    Judging,
    combine_row_rewards,
    episode_transcript,
    rank_auc,
    rank_quantiles,
)
from credo.teachers.rubric import ResponsePools, Rubric, RubricEvolver, RubricItem
from credo.train.config import ConfigError, JudgeConfig, load_config
from credo.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.desk_envs


class FixedJudge:
    """A judge whose score of (question, response) is looked up in a table; it checks
    the context it is shown."""

    def __init__(self, table: dict[tuple[str, str], float], context: str | None = None):
        self.table, self.context, self.cost = table, context, JudgeCost()

    def scores(
        self, questions: Sequence[str], responses: Sequence[str], contexts: Sequence[str] | None
    ) -> torch.Tensor:
        if self.context is not None:
            assert contexts is not None and set(contexts) == {self.context}
        self.cost.calls += 1
        self.cost.asked += len(questions)
        return torch.tensor([self.table[(q, r)] for q, r in zip(questions, responses)])


# ------------------------------------------------------------------ pure parts
def test_combine_row_rewards_by_hand() -> None:
    # two episodes sharing root row 0 (a tree): 0 → 1 (leaf), 0 → 2 (leaf)
    reward = torch.tensor([0.2, 1.0, 0.5])
    leaves = torch.tensor([1, 2])
    rubric = torch.tensor([0.5, 0.25], dtype=torch.float64)
    success = torch.tensor([True, False])

    def run(mode: str, coef: float) -> list[float]:
        out = combine_row_rewards(reward, leaves, rubric, success, mode=mode, coef=coef)
        assert out.dtype == reward.dtype
        return out.tolist()

    assert run("add", 2.0) == pytest.approx([0.2, 2.0, 1.0])
    assert run("replace", 1.0) == pytest.approx([0.0, 0.5, 0.25])
    # mix ¼: ¾·env everywhere, ¼·rubric on the leaves
    assert run("mix", 0.25) == pytest.approx([0.15, 0.875, 0.4375])
    # gated: the rubric counts only on the solved episode
    assert run("gated", 1.0) == pytest.approx([0.2, 1.5, 0.5])
    # each episode's return = combine_rewards(env return, rubric)
    env_ret = torch.tensor([1.2, 0.7])
    mixed = torch.tensor(run("mix", 0.25))
    assert (mixed[0] + mixed[1]).item() == pytest.approx(0.75 * 1.2 + 0.25 * 0.5)
    assert env_ret.numel() == 2
    with pytest.raises(ValueError, match=r"judge\.combine must be one of add, replace, mix, gated"):
        run("avg", 1.0)
    with pytest.raises(ValueError, match=r"judge.coef in \[0, 1\]"):
        run("mix", 2.0)


def test_rank_auc_by_hand() -> None:
    assert rank_auc([0.9, 0.4, 0.6, 0.1], [True, False, True, False]) == 1.0
    assert rank_auc([0.2, 0.8, 0.5], [True, False, False]) == 0.0
    assert rank_auc([0.5, 0.5, 0.7], [True, False, False]) == pytest.approx(0.25)  # tie ½
    assert math.isnan(rank_auc([0.1, 0.2], [True, True]))


def test_rubric_files_load_with_safe_load_and_bad_ones_are_named(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("- Is it polite?\n- question: Does it state the amount?\n  weight: 0.5\n")
    assert Rubric.load(f) == Rubric(
        [RubricItem("Is it polite?", 1.0), RubricItem("Does it state the amount?", 0.5)]
    )
    f.write_text("version: 3\nitems:\n  - Is it polite?\n")
    assert Rubric.load(f) == Rubric([RubricItem("Is it polite?", 1.0)], version=3)
    f.write_text("- {question: q, weight: yes}\n")
    with pytest.raises(ValueError, match="item 0 must be a question string"):
        Rubric.load(f)
    f.write_text("!!python/object/apply:os.system [echo hi]\n")
    with pytest.raises(
        ValueError,
        match=r"\(line 1, column 1\): could not determine a constructor for the tag .*os.system",
    ):
        Rubric.load(f)
    with pytest.raises(ValueError, match="no such file"):
        Rubric.load(tmp_path / "none.yaml")


# ------------------------------------------------------------ the tools env
def _tools() -> ToolsEnv:
    return ToolsEnv("easy", closing="respond", families=["refund_by_id"])


def test_tools_respond_closing_states_the_facts_and_reports_its_truth() -> None:
    env = _tools()
    env.reset(Task("train", 0))
    (op,) = env.goal_ops()
    item = env.orders[op[1]].item
    assert env.oracle_message() == f"resolved : refund $ {op[2]} for the {item} ; bye"
    assert env.message_facts() == [("refund", str(op[2]), item)]
    assert env.message_truth(env.oracle_message()) == 1.0
    assert env.message_truth(f"refund for the {item}") == 0.0  # no amount
    steps = []
    while not steps or not steps[-1].done:
        steps.append(env.step(env.oracle_action()))
    assert steps[-1].info["success"] and steps[-1].info["message_truth"] == 1.0
    assert env.free_text(format_call("respond", {"message": "hi there"})) == "hi there"
    assert env.free_text(format_call("done", {})) is None
    assert env.free_text("respond { broken") is None
    # the default closing is unchanged (done{}), and so is its vocabulary
    plain = ToolsEnv("easy", families=["refund_by_id"])
    plain.reset(Task("train", 0))
    assert not plain.offers_free_text() and 'bye"' not in plain.vocabulary()


def _ticket() -> tuple[ToolsEnv, Task, str]:
    """The env reset on training task 0, that task, and the oracle's message for it."""
    env = _tools()
    task = Task("train", 0)
    env.reset(task)
    return env, task, env.oracle_message()


def _forest(env: ToolsEnv, leaf_actions: list[str], rewards: list[float]) -> RolloutForest:
    """One group, one episode per leaf action: root check_policy → leaf action."""
    n = len(leaf_actions)
    parent, actions, reward, success = [], [], [], []
    for i, (a, r) in enumerate(zip(leaf_actions, rewards)):
        parent += [-1, 2 * i]
        actions += ["check_policy { }", a]
        reward += [0.0, r]
        success += [False, r >= 1.0]
    return RolloutForest.from_columns(
        group=[0] * 2 * n, parent=parent, actions=actions, reward=reward, success=success
    )


def _judging(env: ToolsEnv, judge: FixedJudge, rubric: Rubric, tmp: Path, **kw) -> Judging:  # type: ignore[no-untyped-def]
    cfg = JudgeConfig(model="builtin", **kw)
    ev = RubricEvolver(rubric, cfg.proposer, log_path=tmp / CHANGES_FILE, max_items=cfg.max_items)
    ev.log_start(iteration=0)
    pools = ResponsePools(cfg.pool_good, cfg.pool_bad, cfg.pool_size)
    return Judging(cfg, judge, ev, pools, lambda: ToolsEnv("easy", closing="respond",  # type: ignore[arg-type]
                                                            families=["refund_by_id"]))  # fmt: skip


def test_judging_rewards_the_message_on_the_last_step_and_measures_agreement(
    tmp_path: Path,
) -> None:
    env, task, good = _ticket()
    (op,) = env.goal_ops()
    item = env.orders[op[1]].item
    vague = f"resolved : refund for the {item} ; bye"  # no amount: truth 0
    rubric = Rubric([RubricItem("amount?", 0.5), RubricItem("item?", 0.5)])
    table = {("amount?", good): 0.9, ("item?", good): 0.8,
             ("amount?", vague): 0.2, ("item?", vague): 0.6}  # fmt: skip
    judging = _judging(env, FixedJudge(table, env.instruction()), rubric, tmp_path)
    forest = _forest(
        env,
        [format_call("respond", {"message": m}) for m in (good, vague)] + ["done { }"],
        [1.0, 1.0, 0.0],
    )
    step = judging.reward(forest, [task], iteration=0)
    # rubric rewards: 0.5·0.9 + 0.5·0.8 = 0.85 and 0.5·0.2 + 0.5·0.6 = 0.4; done{}: none
    assert step.forest.reward.tolist() == pytest.approx([0.0, 1.85, 0.0, 1.4, 0.0, 0.0])
    m = step.metrics
    assert m["judge/judged_frac"] == pytest.approx(2 / 3)
    assert m["judge/reward_mean"] == pytest.approx(0.625)
    assert m["judge/asked"] == 4 and m["judge/calls"] == 1
    assert m["judge/truth_mean"] == 0.5 and m["judge/truth_auc"] == 1.0
    assert m["judge/truth_corr"] == pytest.approx(1.0)
    assert m["judge/rubric_version"] == 0 and m["judge/rubric_items"] == 2
    # the cost is per iteration
    step2 = judging.reward(forest, [task], iteration=1)
    assert step2.metrics["judge/asked"] == 4 and step2.metrics["judge/calls"] == 1


def test_the_transcript_context_is_the_instruction_then_what_the_policy_acted_on(
    tmp_path: Path,
) -> None:
    env, task, good = _ticket()
    assert episode_transcript("ticket", ["a", "b ; c"]) == "ticket | a | b ; c"
    # root row observed "ticket open", the leaf (the respond call) the policy's result
    forest = RolloutForest.from_columns(
        group=[0, 0], parent=[-1, 0], actions=["check_policy { }",
        format_call("respond", {"message": good})], reward=[0.0, 1.0],
        success=[False, True], observations=["ticket open : no calls yet", "amount $30"],
    )  # fmt: skip
    want = f"{env.instruction()} | ticket open : no calls yet | amount $30"
    judge = FixedJudge({("amount?", good): 0.75}, want)  # asserts the context it is shown
    step = _judging(env, judge, Rubric([RubricItem("amount?", 1.0)]), tmp_path,
                    context="transcript").reward(forest, [task], iteration=0)  # fmt: skip
    assert step.forest.reward.tolist() == pytest.approx([0.0, 1.75])
    # without recorded observations the transcript is the instruction alone
    bare = RolloutForest.from_columns(group=[0], parent=[-1], reward=[1.0], success=[True],
                                      actions=[format_call("respond", {"message": good})])  # fmt: skip
    judge.context = env.instruction()
    _judging(env, judge, Rubric([RubricItem("amount?", 1.0)]), tmp_path,
             context="transcript").reward(bare, [task], iteration=0)  # fmt: skip


def test_rubric_evolution_on_fixed_pools_with_the_contrast_proposer(tmp_path: Path) -> None:
    env, task, good = _ticket()
    (op,) = env.goal_ops()
    item = env.orders[op[1]].item
    bad = f"resolved : refund $ {op[2]} for the order ; bye"  # the item is missing
    rubric = Rubric([RubricItem("amount?", 1.0)])
    table = {("amount?", good): 0.9, ("amount?", bad): 0.9}
    judging = _judging(
        env, FixedJudge(table), rubric, tmp_path, evolve_every=2, proposer="contrast"
    )
    forest = _forest(env, [format_call("respond", {"message": m}) for m in (good, bad)], [1.0, 0.0])
    # pools by the env's return: the solved episode's message is good, the other bad
    step = judging.reward(forest, [task], iteration=0)  # iteration 1 of 2: no evolution
    assert step.metrics["judge/changes"] == 0 and judging.rubric.version == 0
    assert judging.pools.get(task.id, "good") == [good]
    assert judging.pools.get(task.id, "bad") == [bad]
    step = judging.reward(forest, [task], iteration=1)
    # the only word in every good message and no bad one is the item
    assert step.metrics["judge/changes"] == 1
    assert judging.rubric == Rubric(
        [RubricItem("amount?", 1.0), RubricItem(f"Does the response mention {item}?", 1.0)],
        version=1,
    )
    assert step.metrics["judge/rubric_version"] == 1 and step.metrics["judge/rubric_items"] == 2
    log = RubricEvolver.read_log(tmp_path / CHANGES_FILE)
    assert [e["version"] for e in log] == [0, 1]
    assert log[0]["changes"] == [] and log[0]["iteration"] == 0
    assert log[1]["task"] == task.id and log[1]["changes"] == [
        {"kind": "add", "question": f"Does the response mention {item}?", "weight": 1.0,
         "reason": "in 100% of good, no bad"}
    ]  # fmt: skip
    assert Rubric.from_dict(log[1]["rubric"]) == judging.rubric
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind


def test_rank_quantiles_by_hand() -> None:
    # ranks 1, 4, 2.5, 2.5 of 4 (ties share their mean rank): (r - 1) / 3
    assert rank_quantiles([0.2, 0.9, 0.5, 0.5], [0, 0, 0, 0]) == [0.0, 1.0, 0.5, 0.5]
    # two groups apart; a group of one is neutral
    assert rank_quantiles([3.0, 1.0, 2.0, 7.0], [1, 1, 1, 2]) == [1.0, 0.0, 0.5, 0.5]
    assert rank_quantiles([], []) == []


@given(st.lists(st.tuples(st.integers(0, 2), st.floats(-5, 5)), min_size=1, max_size=20))
def test_rank_quantiles_keep_the_order_within_each_group(pairs: list[tuple[int, float]]) -> None:
    groups, values = [g for g, _ in pairs], [v for _, v in pairs]
    q = rank_quantiles(values, groups)
    assert all(0.0 <= x <= 1.0 for x in q)
    for i in range(len(q)):
        for j in range(len(q)):
            if groups[i] == groups[j] and values[i] < values[j]:
                assert q[i] < q[j]
            if groups[i] == groups[j] and values[i] == values[j]:
                assert q[i] == q[j]
    for g in set(groups):  # a group's quantiles average 1/2 (ranks are symmetric)
        mine = [x for x, h in zip(q, groups) if h == g]
        assert sum(mine) / len(mine) == pytest.approx(0.5)


def test_pools_by_rank_need_no_reward_and_the_hack_gap_is_measured(tmp_path: Path) -> None:
    """Reward-free SERPO: the env pays nothing, the rubric reward is the only reward
    (``replace``), and each message is filed by its rank among the task's messages."""
    env, task, good = _ticket()
    (op,) = env.goal_ops()
    vague = f"resolved : refund for the {env.orders[op[1]].item} ; bye"  # no amount
    hello = "hello"
    no_item = f"resolved : refund $ {op[2]} for the order ; bye"
    assert [env.message_truth(m) for m in (good, vague, hello, no_item)] == [1, 0, 0, 0]
    msgs = [good, vague, hello, no_item]
    table = {("q?", good): 0.4, ("q?", vague): 0.9, ("q?", hello): 0.1, ("q?", no_item): 0.6}
    judging = _judging(env, FixedJudge(table), Rubric([RubricItem("q?", 0.5)]), tmp_path,
                       combine="replace", pool_by="rank")  # fmt: skip
    forest = _forest(env, [format_call("respond", {"message": m}) for m in msgs], [0.0] * 4)
    step = judging.reward(forest, [task], iteration=0)
    # replace: the leaves get 0.5 * s, the env's (zero) rewards are dropped
    assert step.forest.reward.tolist() == pytest.approx([0, 0.2, 0, 0.45, 0, 0.05, 0, 0.3])
    # ranks 2, 4, 1, 3 of 4: quantiles 1/3, 1, 0, 2/3; good >= 0.75, bad <= 0.25
    assert judging.pools.get(task.id, "good") == [vague]
    assert judging.pools.get(task.id, "bad") == [hello]
    assert judging.pools.get(task.id, "neutral") == [good, no_item]
    # the judge approves 0.5 on average (s over the weights), the truth is 1/4
    assert step.metrics["judge/hack_gap"] == pytest.approx(0.5 - 0.25)
    assert step.metrics["judge/truth_mean"] == pytest.approx(0.25)


def test_the_serpo_recipe_is_reward_free_and_evolves() -> None:
    cfg = load_config("serpo")
    j = cfg.judge
    assert cfg.env.name == "tools" and cfg.env.kwargs["closing"] == "respond"
    assert (j.combine, j.coef, j.pool_by, j.evolve_every) == ("replace", 1.0, "rank", 1)
    assert (
        j.enabled
        and j.proposer == "judge"
        and cfg.objective.loss == load_config("grpo").objective.loss
    )


# ------------------------------------------------------------ config checks
def test_judge_section_checks(tmp_path: Path) -> None:
    def err(*over: str) -> str:
        with pytest.raises(ConfigError) as e:
            load_config("grpo", list(over))
        return str(e.value)

    tools = ["env.name=tools", "env.kwargs={closing: respond}"]
    assert "judge.combine must be one of add, replace, mix, gated" in err(
        *tools, "judge.model=builtin", "judge.combine=avg"
    )
    assert "judge.coef in [0, 1]" in err(
        *tools, "judge.model=builtin", "judge.combine=mix", "judge.coef=2"
    )
    assert "judge.proposer must be one of contrast, judge, separation" in err(
        *tools, "judge.model=builtin", "judge.proposer=magic"
    )
    assert "judge.proposer_params: rubric proposer 'contrast' has no parameter(s) 'wieght'" in err(
        *tools,
        "judge.model=builtin",
        "judge.proposer=contrast",
        "judge.proposer_params={wieght: 2}",
    )
    assert "has no free text to judge" in err("judge.model=builtin")  # shop
    assert "set env.kwargs.closing=respond" in err("env.name=tools", "judge.model=builtin")
    assert "judge.rubric: rubric file" in err(
        *tools, "judge.model=builtin", f"judge.rubric={tmp_path}/none.yaml"
    )
    assert "judge.model='./nowhere': no such folder" in err(*tools, "judge.model=./nowhere")
    assert "judge.pool_by must be one of env, rubric, rank, got 'score'" in err(
        *tools, "judge.model=builtin", "judge.pool_by=score"
    )
    assert "judge.context must be one of instruction, transcript, got 'episode'" in err(
        *tools, "judge.model=builtin", "judge.context=episode"
    )
    cfg = load_config("grpo", [*tools, "judge.model=builtin", "judge.combine=gated"])
    assert cfg.judge.enabled and cfg.judge.combine == "gated"
    assert not load_config("grpo").judge.enabled


def test_a_judge_this_machine_lacks_is_a_machine_check(tmp_path: Path) -> None:
    """A study read here (its index) names a fitted judge that is not fitted yet: without
    the machine checks the missing folder and rubric file are not asked for, the rest is
    still checked; a rubric that is there still loads."""
    judge = [
        "env.name=tools",
        "env.kwargs={closing: respond}",
        f"judge.model={tmp_path}/judge",
        f"judge.rubric={tmp_path}/judge/rubric.yaml",
    ]
    with pytest.raises(ConfigError, match="no such folder"):
        load_config("serpo", judge)
    assert load_config("serpo", judge, machine=False).judge.enabled
    with pytest.raises(ConfigError, match=r"judge\.proposer must be one of"):
        load_config("serpo", [*judge, "judge.proposer=magic"], machine=False)
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "rubric.yaml").write_text("[]\n")
    with pytest.raises(ConfigError, match="non-empty list of items"):
        load_config("serpo", judge, machine=False)


@pytest.mark.slow
def test_a_fitted_judge_is_saved_and_loaded_as_judge_model(tmp_path: Path) -> None:
    """``benchmarks/serpo_agreement.py --fit-steps N --save DIR`` writes a judge that
    ``examples/serpo_tools.yaml`` takes as ``judge.model``/``judge.rubric`` and scores with
    the transcript context: the path a user follows, end to end."""
    out = tmp_path / "judge"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serpo_agreement.py"), "--judge", "builtin",
         "--context", "transcript", "--tasks", "3", "--fit-tasks", "6", "--fit-steps", "5",
         "--batch", "4", "--width", "16", "--heads", "2", "--save", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "after 5 steps" in proc.stdout and f"judge.model={out}" in proc.stdout
    assert (out / "model.safetensors").exists() and not list(tmp_path.glob(".*tmp"))
    cfg = load_config(str(ROOT / "examples" / "serpo_tools.yaml"),
                      [f"judge.model={out}", f"judge.rubric={out / 'rubric.yaml'}"])  # fmt: skip
    assert cfg.judge.context == "transcript" and cfg.judge.combine == "add"
    judging = Judging.from_run(cfg, lambda: ToolsEnv("easy", closing="respond"), tmp_path)
    assert judging is not None and len(judging.rubric.items) == 1
    env = ToolsEnv("easy", closing="respond")
    env.reset(Task("test", 0))
    s = judging.judge.scores([judging.rubric.items[0].question], [env.oracle_message()],
                             [episode_transcript(env.instruction(), ["ticket open"])])  # fmt: skip
    assert 0.0 < float(s[0]) < 1.0


# ------------------------------------------------------------ end to end
def _reply_cfg(tmp: Path, name: str, iterations: int):  # type: ignore[no-untyped-def]
    return load_config(
        "grpo",
        [
            "env.name=examples.desk_envs:ReplyEnv",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
            "sft.episodes=40", "sft.steps=20", "sft.noisy_episodes=0", "sft.noisy_steps=0",
            "rollout.max_new_tokens=8", "rollout.tasks_per_iter=2", "rollout.group_size=4",
            "train.threads=1", f"train.iterations={iterations}", "eval.episodes=4",
            "judge.model=builtin", "judge.evolve_every=1", "judge.proposer=contrast",
            "judge.pool_by=rubric", "judge.pool_good=0.5", "judge.pool_bad=0.5",
            f"train.runs_dir={tmp}", f"train.name={name}",
        ],
    )  # fmt: skip


def test_a_short_run_learns_from_the_judge_alone(tmp_path: Path) -> None:
    """ReplyEnv's reward is always 0: every advantage and gradient comes from the judge
    (the built-in model; its verdicts differ between replies)."""
    res = train(_reply_cfg(tmp_path, "serpo", 2), quiet=True)
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "judge/judged_frac" in r]
    assert len(recs) == 2
    for r in recs:
        n = round(8 * r["judge/judged_frac"])  # an empty reply has no text to judge
        assert n >= 4
        assert r["judge/asked"] == n * r["judge/rubric_items"] or r["judge/changes"] > 0
        assert r["judge/seconds"] > 0 and r["judge/forwards"] >= 1
        assert 0 < r["judge/reward_mean"] < 1  # Σ w = 1 in the default rubric
        assert r["rollout/return_mean"] == 0.0  # the env pays nothing ...
        assert r["credit/adv_std"] > 0  # ... the judge's reward is the signal
        assert r["policy/grad_norm"] > 0
        assert "judge/truth_mean" in r  # the env's hidden truth is reported
    log = RubricEvolver.read_log(res.run_dir / CHANGES_FILE)
    assert log[0]["version"] == 0 and log[-1]["version"] == recs[-1]["judge/rubric_version"]


def test_resume_keeps_the_rubric_and_the_pools(tmp_path: Path) -> None:
    """A run stopped after 2 iterations and resumed matches the run that never stopped
    (the judge's cache starts empty again, so only its cost differs)."""
    full = train(_reply_cfg(tmp_path, "full", 3), quiet=True)
    part = train(_reply_cfg(tmp_path, "part", 2), quiet=True)
    saved = json.loads((part.run_dir / "checkpoints" / "step_2" / "state.json").read_text())
    assert saved["judge_state"]["rubric"]["version"] == part.metrics[-1]["judge/rubric_version"]
    assert saved["judge_state"]["pools"]
    resumed = train(_reply_cfg(tmp_path, "part", 3), resume=part.run_dir, quiet=True)
    skip = ("time/", "perf/", "judge/seconds", "judge/cached", "judge/forwards", "judge/tokens")

    def stable(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in records]

    assert stable(resumed.metrics) == stable(full.metrics)


@pytest.mark.slow
def test_the_serpo_recipe_trains_on_the_judge_alone(tmp_path: Path) -> None:
    """The recipe as shipped (reward replaced, pools by rank, evolution every iteration),
    with the built-in judge on ReplyEnv (whose reward is always 0): the judge's reward is
    the whole signal, and every iteration files its best and worst replies."""
    cfg = load_config(
        "serpo",
        [
            "env.name=examples.desk_envs:ReplyEnv", "env.kwargs={}",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
            "sft.episodes=40", "sft.steps=20", "sft.noisy_episodes=0", "sft.noisy_steps=0",
            "rollout.max_new_tokens=8", "rollout.tasks_per_iter=2", "rollout.group_size=4",
            "train.threads=1", "train.iterations=2", "eval.episodes=4", "judge.model=builtin",
            "judge.context=instruction", f"train.runs_dir={tmp_path}", "train.name=serpo",
        ],
    )  # fmt: skip
    res = train(cfg, quiet=True)
    recs = [r for r in res.metrics if "judge/judged_frac" in r]
    assert len(recs) == 2
    for r in recs:
        assert r["rollout/return_mean"] == 0.0 and r["credit/adv_std"] > 0
        assert r["policy/grad_norm"] > 0 and 0 < r["judge/reward_mean"] < 1
        assert "judge/hack_gap" in r
    state = json.loads((res.run_dir / "checkpoints" / "step_2" / "state.json").read_text())
    pools = state["judge_state"]["pools"]
    # pools by rank: a task with two or more judged replies has a best and a worst one
    assert any(per["good"] and per["bad"] for per in pools.values())
