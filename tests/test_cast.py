"""CAST: label rules on fixed shop and tools trajectories, the critic's metrics and class
weights by hand, a critic that learns to separate ok from error actions, the online
guard's resample / penalise / log policies on a scripted critic, the critique SFT rows,
the file formats, and the ``critic`` config section."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from credo.critics import (
    CLASSES,
    CriticGuard,
    LabelledStep,
    balance_rows,
    class_weights,
    critic_metrics,
    critique_examples,
    evaluate_critic,
    label_episodes,
    load_critic,
    load_labels,
    load_trajectories,
    make_labeller,
    new_critic,
    save_labels,
    save_trajectories,
    split_by_task,
    train_critic,
)
from credo.critics.model_labeller import ENV_CLASSES, QUESTIONS, ModelLabeller
from credo.data import Episode, Step
from credo.envs.base import Task
from credo.envs.shop import ShopEnv
from credo.envs.tools import ToolsEnv
from credo.policy.base import Generation
from credo.policy.tiny import TinyModelConfig
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.group import RolloutResult, Trajectory, trajectories_to_forest
from credo.train.config import ConfigError, load_config

torch.set_num_threads(1)


def _episode(task: Task, actions: list[str]) -> Episode:
    return Episode(0, [Step("", a) for a in actions], task_id=task.id)


def _labels(env_name: str, make, actions: list[str], task: Task) -> list[tuple[str, str]]:
    out = label_episodes(env_name, make, [_episode(task, actions)])
    return [(x.action, x.error) for x in out]


# ------------------------------------------------------------------ label rules
def test_shop_rules_on_a_fixed_trajectory() -> None:
    # easy task 0: "buy a brown wool dress in size l for at most $45"; results of the
    # goal's query: 1 brown wool dress $30 (sizes m l xl) ; 2 brown wool dress $55 ;
    # 3 brown linen dress $15 ; 4 brown denim dress $45 ; 5 black wool hat $45
    expected = [
        ("search[brown dress]", "wrong_query"),  # a word missing
        ("back", "ok"),  # nothing of the wrong query fits: the oracle goes back too
        ("search[wool brown dress]", "ok"),  # the goal's words in another order
        ("click[2]", "wrong_item"),  # $55 > $45
        ("back", "ok"),  # the item does not fit
        ("click[9]", "invalid_action"),  # 5 results
        ("click[1]", "ok"),  # the oracle's choice
        ("choose[m]", "wrong_size"),
        ("choose[l]", "ok"),
        ("choose[l]", "unnecessary_step"),  # already chosen
        ("back", "unnecessary_backtrack"),  # this item fits
        ("click[1]", "ok"),
        ("buy", "premature_buy"),  # reopened: no size chosen
    ]
    got = _labels(
        "shop",
        lambda: ShopEnv("easy", max_turns=20),
        [a for a, _ in expected],
        Task("train", 0),
    )
    assert got == expected


def test_tools_rules_on_fixed_trajectories() -> None:
    # easy task 2: refund order 286 (headphones, delivered 61 days ago, $50) for eli reed
    # (customer 112): past the refund window, so store credit of $50 is due
    make = lambda: ToolsEnv("easy", max_turns=20)  # noqa: E731
    task = Task("train", 2)
    expected = [
        ('refund { "order_id" : 286 , "amount" : 50 }', "wrong_tool"),  # refund not allowed
        ('refund { "order_id" : 286 }', "invalid_action"),  # missing amount
        ('get_order { "order_id" : 233 }', "wrong_argument"),  # their other order
        ('get_order { "order_id" : 286 }', "unnecessary_step"),  # oracle: check_policy
        ('check_policy { "order_id" : 286 }', "ok"),
        ('store_credit { "order_id" : 286 , "amount" : 60 }', "wrong_argument"),  # > $50
        ('store_credit { "order_id" : 286 , "amount" : 50 }', "ok"),
        ("done { }", "ok"),
    ]
    assert _labels("tools", make, [a for a, _ in expected], task) == expected
    assert _labels("tools", make, ["done { }"], task) == [("done { }", "premature_close")]


def test_labeller_checks_the_replay_and_the_env() -> None:
    ep = Episode(0, [Step("not the shop's home page", "back")], task_id="train/0")
    with pytest.raises(ValueError, match="trajectory recorded"):
        label_episodes("shop", lambda: ShopEnv("easy"), [ep])
    with pytest.raises(KeyError, match="label rule"):
        label_episodes("nope", lambda: ShopEnv("easy"), [ep])
    with pytest.raises(ValueError, match="train/SEED"):
        label_episodes("shop", lambda: ShopEnv("easy"), [Episode(0, [], task_id="x")])


# ------------------------------------------------------- the privileged model labeller
class TableJudge:
    """Scores (question, action) from a table (default 0.1) and records every context."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table, self.contexts = table, []

    def scores(self, questions, responses, contexts=None):  # type: ignore[no-untyped-def]
        self.contexts += list(contexts or [])
        return torch.tensor([self.table.get((q, r), 0.1) for q, r in zip(questions, responses)])


def test_the_model_labeller_takes_the_likeliest_error_over_the_threshold() -> None:
    make = lambda: ToolsEnv("easy", max_turns=20)  # noqa: E731
    task = Task("train", 2)
    refund = 'refund { "order_id" : 286 , "amount" : 50 }'
    look = 'get_order { "order_id" : 286 }'
    judge = TableJudge({
        (QUESTIONS["wrong_tool"], refund): 0.9,  # the likeliest error of the refund
        (QUESTIONS["wrong_argument"], refund): 0.7,
        (QUESTIONS["unnecessary_step"], look): 0.45,  # under the threshold of 0.5
    })  # fmt: skip
    labeller = ModelLabeller(judge, ENV_CLASSES["tools"], threshold=0.5)
    env = make()
    env.reset(task)
    oracle = env.oracle_action()
    actions = [refund, look, oracle]
    got = label_episodes("tools", make, [_episode(task, actions)], labeller=labeller)
    assert [x.error for x in got] == ["wrong_tool", "ok", "ok"]
    assert all(x.fix for x in got) and got[0].fix == oracle  # the fix is the oracle's action
    # the model read the privileged facts: the goal and the oracle's next action
    assert f"The correct next action is: {oracle}" in judge.contexts[0]
    assert env.instruction() in judge.contexts[0]
    # five tools classes asked for each of the first two actions; the oracle's own
    # action is ok without asking
    assert len(judge.contexts) == 2 * len(ENV_CLASSES["tools"])
    lower = ModelLabeller(judge, ENV_CLASSES["tools"], threshold=0.4)
    got = label_episodes("tools", make, [_episode(task, actions)], labeller=lower)
    assert [x.error for x in got] == ["wrong_tool", "unnecessary_step", "ok"]


def test_a_model_labels_through_make_labeller(tmp_path: Path) -> None:
    """A saved policy folder (here a small built-in model) is a labelling model: every
    label is a class the env can show, the oracle's own actions are ok."""
    from credo.policy.tiny import create_tiny_policy

    env = ToolsEnv("easy", max_turns=20)
    words = [*env.vocabulary(), "yes", "no", "goal", "correct", "next", "action", "is"]
    create_tiny_policy(words, TinyModelConfig(32, 1, 2, 64), seed=0).save(tmp_path / "m")
    labeller = make_labeller("model", "tools", model=str(tmp_path / "m"))
    task = Task("train", 2)
    actions = ['get_order { "order_id" : 233 }', 'check_policy { "order_id" : 286 }']
    got = label_episodes("tools", lambda: ToolsEnv("easy", max_turns=20),
                         [_episode(task, actions)], labeller=labeller)  # fmt: skip
    assert len(got) == 2 and {x.error for x in got} <= {"ok", *ENV_CLASSES["tools"]}
    assert got[1].error == "ok"  # the oracle's action


def test_labeller_choices_are_checked_in_one_line() -> None:
    from credo.pipeline.cast import LabelParams

    with pytest.raises(ValueError, match="labeller must be one of rules, model"):
        make_labeller("llm", "shop")
    with pytest.raises(ValueError, match="needs a model"):
        make_labeller("model", "shop")
    with pytest.raises(ValueError, match="threshold must be in"):
        ModelLabeller(TableJudge({}), threshold=0.0)
    with pytest.raises(ValueError, match="error classes of"):
        ModelLabeller(TableJudge({}), ["ok"])
    with pytest.raises(ValueError, match="labeller must be one of rules, model"):
        LabelParams(labeller="oracle")
    with pytest.raises(ValueError, match="needs labeller_model"):
        LabelParams(labeller="model")
    # rules read no context and give the same labels as label_episodes' default
    make = lambda: ShopEnv("easy", max_turns=20)  # noqa: E731
    ep = _episode(Task("train", 0), ["search[brown dress]", "back"])
    assert label_episodes("shop", make, [ep], labeller=make_labeller("rules", "shop")) == (
        label_episodes("shop", make, [ep])
    )


# ---------------------------------------------------------------------- metrics
def test_critic_metrics_by_hand() -> None:
    # flags 1 1 0 0 1 0 against errors 1 0 1 0 1 0: TP = 2 (0, 4), FP = 1 (1), FN = 1 (2),
    # TN = 2 (3, 5)
    m = critic_metrics([1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 1, 0])
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 1, 2)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["false_alarm"] == pytest.approx(1 / 3)
    assert m["accuracy"] == pytest.approx(4 / 6)
    none = critic_metrics([0, 0], [0, 0])  # no flags, no errors: 0 by convention
    assert (none["precision"], none["recall"], none["false_alarm"]) == (0.0, 0.0, 0.0)


def test_class_weights_by_hand() -> None:
    # N = 10, n_ok = 6, two error classes present (2 and 2): w_ok = 10 / (2·6),
    # w_c = 10 / (2·2·2); ok and errors each weigh N/2 = 5 in all
    w = class_weights([6, 2, 0, 2])
    assert w.tolist() == pytest.approx([10 / 12, 1.25, 0.0, 1.25])
    counts = torch.tensor([6.0, 2.0, 0.0, 2.0])
    assert float(w[0] * counts[0]) == pytest.approx(5.0)
    assert float((w[1:] * counts[1:]).sum()) == pytest.approx(5.0)
    # no ok steps: every present class equally, N / (K · n_c) = 4 / (2·2)
    assert class_weights([0, 2, 2]).tolist() == pytest.approx([0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="no labelled steps"):
        class_weights([0, 0])


def _lab(task: str, action: str, error: str, context: str = "page : home", success=True):
    return LabelledStep(task, 0, 0, context, action, error, "", "fix", success)


def test_split_keeps_tasks_whole() -> None:
    labels = [_lab(f"train/{i // 3}", "a", "ok") for i in range(60)]
    train, held = split_by_task(labels, 0.25, seed=1)
    assert len(train) + len(held) == 60 and held and train
    assert not {x.task_id for x in train} & {x.task_id for x in held}


# ----------------------------------------------------------------- the critic
def _toy_labels(n: int, seed: int) -> list[LabelledStep]:
    """Shop-like steps: on an item page ``buy`` is an error when no size is chosen."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        chosen = rng.random() < 0.5
        size = rng.choice(["s", "m", "l"])
        page = f"page : item : red wool scarf $ 20 ; sizes s m l{' ; chosen ' + size if chosen else ''}"
        action = "buy" if rng.random() < 0.7 else f"choose [ {size} ]"
        error = "premature_buy" if action == "buy" and not chosen else "ok"
        out.append(_lab(f"train/{i}", action, error, context=f"{page} action :"))
    return out


def test_critic_training_refuses_a_nan_step() -> None:
    """A NaN loss stops the critic's training before the step (which would make every
    weight NaN): one line naming the step; no weight moved."""
    words = ["page", ":", "item", "red", "wool", "scarf", "$", "20", ";", "sizes", "s", "m"]
    words += ["l", "chosen", "action", "buy", "choose", "[", "]"]
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    critic = new_critic(build_word_tokenizer(words), cfg, seed=0, max_len=64)
    with torch.no_grad():
        critic.head.weight[0, 0] = float("nan")
    before = {k: v.clone() for k, v in critic.state_dict().items()}
    with pytest.raises(FloatingPointError, match=r"critic training step 1 of 5: the loss is nan"):
        train_critic(critic, _toy_labels(16, seed=0), steps=5, batch_size=8, lr=3e-3)
    for k, v in critic.state_dict().items():
        assert torch.equal(before[k].nan_to_num(), v.nan_to_num()), k


@pytest.mark.slow
def test_critic_learns_to_separate_ok_from_error(tmp_path: Path) -> None:
    words = ["page", ":", "item", "red", "wool", "scarf", "$", "20", ";", "sizes", "s", "m"]
    words += ["l", "chosen", "action", "buy", "choose", "[", "]"]
    tok = build_word_tokenizer(words)
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    critic = new_critic(tok, cfg, seed=0, max_len=64)
    data = _toy_labels(240, seed=0)
    train, held = split_by_task(data, 0.25, seed=0)
    stats = train_critic(critic, train, steps=150, batch_size=32, lr=3e-3, seed=0)
    assert stats.counts[0] > 0 and stats.counts[CLASSES.index("premature_buy")] > 0
    m = evaluate_critic(critic, held)
    balanced = (m["recall"] + 1 - m["false_alarm"]) / 2
    assert balanced > 0.8, m  # chance is 0.5
    critic.save(tmp_path / "critic")
    again = load_critic(tmp_path / "critic")
    ctx, act = [x.context for x in held[:5]], [x.action for x in held[:5]]
    assert torch.allclose(again.probs(ctx, act), critic.probs(ctx, act), atol=1e-6)
    with pytest.raises(ValueError, match=r"has no critic\.json"):
        load_critic(tmp_path)


# ------------------------------------------------------- online verification
@dataclass
class _Tok:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))


class _ScriptedPolicy:
    """Returns the scripted responses of each prompt in turn (text = the word)."""

    def __init__(self, script: dict[int, list[str]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.tokenizer = _Tok()
        self.calls = 0

    def generate(self, prompts, sampling, generator=None):
        self.calls += 1
        out = []
        for p in prompts:
            word = self.script[p[0]].pop(0)
            out.append(
                Generation([hash(word) % 1000, len(self.script[p[0]])], torch.zeros(2), word, True)
            )
        return out


class _ScriptedCritic:
    def flag_probs(self, contexts, actions):
        return torch.tensor([0.9 if a == "bad" else 0.1 for a in actions])


def _guarded(on_flag: str, max_resamples: int = 2):
    guard = CriticGuard(
        _ScriptedCritic(), threshold=0.5, on_flag=on_flag, max_resamples=max_resamples
    )
    policy = _ScriptedPolicy({1: ["bad", "bad", "good"], 2: ["good"], 3: ["bad", "bad"]})
    return guard, guard.wrap(policy), policy


def test_resample_redraws_flagged_actions() -> None:
    guard, wrapped, _ = _guarded("resample", max_resamples=2)
    gens = wrapped.generate([[1], [2]], None)
    assert [g.text for g in gens] == ["good", "good"]  # prompt 1: bad, bad, then good
    assert guard.counts == {"flags": 2, "resamples": 2}  # 2 flagged draws, 2 re-draws
    guard, wrapped, _ = _guarded("resample", max_resamples=1)
    gens = wrapped.generate([[1], [3]], None)
    # both flagged, each re-drawn once, both still flagged: kept unresolved
    assert [g.text for g in gens] == ["bad", "bad"]
    assert guard.counts == {"flags": 4, "resamples": 2}


@pytest.mark.parametrize("on_flag", ["penalise", "log"])
def test_penalise_and_log(on_flag: str) -> None:
    guard, wrapped, _ = _guarded(on_flag)
    gens = wrapped.generate([[1], [2]], None)
    assert [g.text for g in gens] == ["bad", "good"]  # never re-drawn
    steps = [
        Step("o", g.text, reward=r, prompt_ids=[p], response_ids=g.token_ids)
        for p, g, r in zip((1, 2), gens, (0.0, 1.0))
    ]
    eps = [Episode(0, [steps[0]], "train/0", success=True), Episode(1, [steps[1]], "train/1")]
    trajs = [Trajectory(e) for e in eps]
    result = RolloutResult(trajectories_to_forest(trajs)[0], eps, 2, 4, 0.0, trajectories=trajs)
    guard.finish(result)
    penalty = 0.1 if on_flag == "penalise" else 0.0
    assert result.forest.reward.tolist() == pytest.approx([0.0 - penalty, 1.0])
    assert eps[0].ret == pytest.approx(-penalty)
    assert steps[0].info["critic_flag"] and not steps[1].info["critic_flag"]
    assert result.stats["critic/flags"] == 1 and result.stats["critic/flagged_steps"] == 1
    assert result.stats["critic/flag_rate"] == 0.5
    assert result.stats["critic/false_alarm_proxy"] == 1.0  # the flagged step's episode won
    assert guard.counts == {"flags": 0, "resamples": 0} and not guard.seen


# -------------------------------------------------------- critique SFT, files
def test_critique_examples() -> None:
    labels = [
        _lab("train/0", "search [ red ]", "ok", "page : home action :"),
        _lab("train/0", "buy", "premature_buy", "page : item action :"),
        _lab("train/1", "back", "ok", "page : results action :", success=False),
        _lab("train/1", "click [ 9 ]", "invalid_action", "page : results action :", success=False),
    ]
    rows = critique_examples(labels)
    assert rows == [
        ("page : home action :", "search [ red ]"),  # ok step of a success
        ("critic : buy : buy only after the goal size ; page : item action :", "fix"),
        ("critic : click [ 9 ] : invalid action ; page : results action :", "fix"),
    ]
    assert len(critique_examples(labels, corrections_from="successful")) == 2
    # the control: behaviour rows only (rejection-sampling SFT)
    assert critique_examples(labels, corrections_from="none") == rows[:1]
    with pytest.raises(ValueError, match="accepted: all, successful, none"):
        critique_examples(labels, corrections_from="some")
    # the ablation: the same fixes without the critique
    assert critique_examples(labels, critique_text=False) == [
        ("page : home action :", "search [ red ]"),
        ("page : item action :", "fix"),
        ("page : results action :", "fix"),
    ]
    # balanced: the one behaviour row repeated to the two corrections' count
    assert critique_examples(labels, balance="equal") == [rows[0], rows[0], rows[1], rows[2]]


def test_balance_rows_repeats_the_smaller_class_in_order() -> None:
    assert balance_rows([1, 2], [10, 11, 12, 13, 14]) == [1, 2, 1, 2, 1, 10, 11, 12, 13, 14]
    assert balance_rows([1, 2, 3], [9]) == [1, 2, 3, 9, 9, 9]
    assert balance_rows([1, 2], [9], "none") == [1, 2, 9]
    assert balance_rows([], [9, 8]) == [9, 8]  # nothing to repeat
    with pytest.raises(ValueError, match="accepted: equal, none"):
        balance_rows([1], [2], "half")
    # 59 behaviour rows against 2,651 corrections (the seed that collapsed): half each
    good, fixes = [("g", i) for i in range(59)], [("f", i) for i in range(2651)]
    out = balance_rows(good, fixes)
    assert sum(r[0] == "g" for r in out) == sum(r[0] == "f" for r in out) == 2651


def test_files_round_trip(tmp_path: Path) -> None:
    ep = Episode(
        0,
        [Step("home", "search[red]", reward=0.5, prompt_ids=[4, 5], info={"prompt": "p"})],
        "train/3",
        success=True,
    )
    save_trajectories(tmp_path / "t.jsonl", [ep])
    (back,) = load_trajectories(tmp_path / "t.jsonl")
    assert (back.task_id, back.success, back.steps[0].action, back.steps[0].prompt_ids) == (
        "train/3",
        True,
        "search[red]",
        [4, 5],
    )
    assert back.steps[0].info["prompt"] == "p"
    labels = [_lab("train/0", "buy", "premature_buy")]
    save_labels(tmp_path / "l.jsonl", labels)
    assert load_labels(tmp_path / "l.jsonl") == labels
    (tmp_path / "bad.jsonl").write_text(
        '{"task_id": "train/0", "steps": [{"prompt_ids": "x", "action": "a"}]}\n'
    )
    with pytest.raises(ValueError, match=r"bad\.jsonl:1 step 0: 'prompt_ids' must be a list"):
        load_trajectories(tmp_path / "bad.jsonl")


# ---------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("critic.path=/no/such/critic", "critic.path='/no/such/critic' has no critic.json"),
        ("critic.on_flag=ignore", "critic.on_flag must be one of log, resample, penalise"),
        ("critic.threshold=1.5", "critic.threshold must be in [0, 1]"),
        ("critic.max_resamples=-1", "critic.max_resamples must be ≥ 0"),
    ],
)
def test_critic_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("grpo", [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_text_only_trajectories_get_their_prompt_rebuilt() -> None:
    # a pipeline-style record: env-prefixed task id, no prompt, no token ids
    ep = Episode(0, [Step("", "search[brown wool dress]"), Step("", "click[1]")], "shop/train/0")
    render = lambda i, h, o: f"{' ; '.join(t.action for t in h) or 'none'} | {o} | {i}"  # noqa: E731
    out = label_episodes("shop", lambda: ShopEnv("easy"), [ep], render=render)
    assert [x.error for x in out] == ["ok", "ok"]
    goal = "buy a brown wool dress in size l for at most $45"
    assert out[0].context == f"none | home : search for products | {goal}"
    assert out[1].context.startswith("search[brown wool dress] | results : 1 brown wool dress $30")
