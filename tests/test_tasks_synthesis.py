"""RODS's synthesiser (``credo.tasks.synthesis``): the planner's reading of hand-picked
``tools`` tasks, variants that keep the structure with new entities (property over
seeds, ``tools`` and ``shop``), the rewrite that keeps the task, every rejection of the
critique, and the buffer that grows only by verified variants."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from examples.custom_env import GuessEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.envs.base import HELDOUT_SEED_OFFSET, VARIANT_SEED_OFFSET, Task
from credo.envs.shop import ShopEnv
from credo.envs.tools import ToolsEnv
from credo.tasks import RodsParams, RodsSource, TaskSourceContext, TaskStats
from credo.tasks.llm_synthesis import PROMPT, LLMSynthesiser, first_json_object, same_shape
from credo.tasks.synthesis import Plan, RuleSynthesiser, action_verb, synthesise, task_key
from test_tasks_rods import _episodes


def test_action_verbs() -> None:
    assert action_verb('refund { "order_id" : 214 , "amount" : 30 }') == "refund"
    assert action_verb("click[2]") == "click"
    assert action_verb("  Search[red hat]") == "search"
    assert action_verb("3") == "3"


def test_the_planner_reads_a_tools_task() -> None:
    # train/2 of `easy`: "please refund order 286 , my headphones": out of its return
    # window, so served by store credit; the ticket names the order, no lookup
    synth = RuleSynthesiser(lambda: ToolsEnv("easy"))
    plan = synth.plan(Task.make("train", 2))
    assert plan.parent == "train/2"
    assert plan.structure == {
        "family": "refund_by_id",
        "requests": [["refund", "store_credit"]],
        "twin_item": False,
        "profile_exchange": False,
    }
    assert plan.skeleton == ("check_policy", "store_credit", "done")
    assert plan.key.splitlines()[0].startswith("please refund order 286 , my headphones")
    # train/5: a cancellation by name: find the customer, list the orders, cancel
    plan = synth.plan(Task.make("train", 5))
    assert plan.skeleton == ("find_customer", "list_orders", "cancel_order", "done")
    assert plan.structure["requests"] == [["cancel", "cancel_order"]]


ENVS = {
    "tools/easy": lambda: ToolsEnv("easy"),
    "tools/default": lambda: ToolsEnv("default"),
    "tools/hard": lambda: ToolsEnv("hard", profiles=True),
    "shop/default": lambda: ShopEnv("default"),
}


@pytest.mark.parametrize("name", sorted(ENVS))
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), draw=st.integers(0, 2**31))
def test_variants_keep_the_structure_with_new_entities(name: str, seed: int, draw: int) -> None:
    synth = RuleSynthesiser(ENVS[name])
    parent = Task.make("train", seed)
    plan = synth.plan(parent)
    proposal = synthesise(synth, plan, random.Random(draw), set())
    assert proposal.reason is None, proposal
    variant = proposal.task
    assert variant is not None and variant.split == "train"
    assert VARIANT_SEED_OFFSET <= variant.seed < HELDOUT_SEED_OFFSET
    again = synth.plan(variant)  # the variant, read as the planner reads a parent
    assert again.structure == plan.structure and again.skeleton == plan.skeleton
    assert again.key == proposal.key != plan.key  # new entities or wording
    env = ENVS[name]()
    env.reset(parent)
    before = env.instruction()
    env.reset(variant)
    assert env.instruction() != before


def test_the_rewrite_keeps_the_task_and_the_vocabulary() -> None:
    env = ToolsEnv("default", profiles=True)
    vocab = set(env.vocabulary())
    rng = random.Random(3)
    changed = 0
    for seed in range(30):
        task = Task.make("train", seed)
        env.reset(task)
        ticket, goal = env.instruction(), env.goal_ops()
        oracle = env.oracle_action()
        customers = dict(env.customers)
        reworded = env.reword(task, rng)
        assert reworded.seed == task.seed and isinstance(reworded.data["wording"], int)
        env.reset(reworded)
        assert env.goal_ops() == goal and env.customers == customers
        assert env.oracle_action() == oracle
        # the same name, city and ids: the signature and every number survive
        assert ticket.rsplit(",", 2)[1:] == env.instruction().rsplit(",", 2)[1:]
        assert sorted(w for w in ticket.split() if w.isdigit()) == sorted(
            w for w in env.instruction().split() if w.isdigit()
        )
        assert set(env.instruction().split()) <= vocab
        changed += env.instruction() != ticket
    assert changed >= 20  # most draws pick other phrases (a few pick the same ones)
    with pytest.raises(ValueError, match="'wording' must be an integer seed"):
        env.reset(Task("train", 0, {"wording": "x"}))


def test_without_wording_a_task_is_what_it_always_was() -> None:
    # train/0 of `easy` as generated before the rewrite existed
    env = ToolsEnv("easy")
    env.reset(Task.make("train", 0))
    assert env.instruction() == (
        'hi , i would like order 263 , the toaster , in pink instead . cheers , "sara frost" , pune'
    )


class _Broken(ToolsEnv):
    """``tools`` whose variants misbehave: ``mode`` picks how."""

    mode = "unsolvable"

    def __init__(self) -> None:
        super().__init__("easy")

    def reset(self, task: Task, seed: int = 0) -> str:
        if self.mode == "raise" and task.seed >= VARIANT_SEED_OFFSET:
            raise RuntimeError("generator broke")
        return super().reset(task, seed)

    def oracle_action(self) -> str:
        if self.mode == "unsolvable" and self.task and self.task.seed >= VARIANT_SEED_OFFSET:
            return "done { }"  # closes the ticket with nothing done
        return super().oracle_action()


@pytest.mark.parametrize(
    ("mode", "params", "reason"),
    [
        ("unsolvable", {}, "unsolvable"),
        ("raise", {}, "env_error"),
        ("ok", {"min_steps": 4}, "trivial"),  # easy's refunds by id take 3 actions
        ("ok", {"tries": 1, "structure": "no such family"}, "no_match"),
    ],
)
def test_each_rejection_of_the_critique(mode: str, params: dict, reason: str) -> None:
    _Broken.mode = mode
    synth = RuleSynthesiser(_Broken, min_steps=params.get("min_steps", 2))
    synth.tries = params.get("tries", synth.tries)
    _Broken.mode = "ok"
    plan = synth.plan(Task.make("train", 1))  # refund_by_id: 3 actions
    _Broken.mode = mode
    if "structure" in params:
        plan = Plan(plan.parent, params["structure"], plan.skeleton, plan.key)
    if mode == "unsolvable":  # the executor matches the skeleton: the oracle's
        # "done" differs from the plan's, so check the critique itself
        variant = Task("train", VARIANT_SEED_OFFSET + 1)
        assert synth.critique(variant, plan, set())[0] == "unsolvable"
        return
    proposal = synthesise(synth, plan, random.Random(0), set())
    assert proposal.task is None and proposal.reason == reason
    if reason == "env_error":
        assert proposal.key == "RuntimeError: generator broke"


def test_off_plan_and_duplicates() -> None:
    synth = RuleSynthesiser(lambda: ToolsEnv("easy"))
    refund = synth.plan(Task.make("train", 1))  # check_policy refund done
    cancel = synth.plan(Task.make("train", 5))  # find_customer list_orders cancel done
    # a task of another topology, judged against the refund's plan
    assert synth.critique(Task.make("train", 5), refund, set())[0] == "off_plan"
    # the parent itself, and a variant already seen
    assert synth.critique(Task.make("train", 5), cancel, set())[0] == "duplicate"
    proposal = synthesise(synth, refund, random.Random(4), set())
    assert proposal.reason is None and proposal.task is not None
    reason, key = synth.critique(proposal.task, refund, {proposal.key})
    assert (reason, key) == ("duplicate", proposal.key)
    # a duplicate is the instruction *and* the oracle's actions: same words, other ids
    assert task_key("guess", ("guess[4]",)) != task_key("guess", ("guess[2]",))


def test_the_buffer_grows_by_verified_variants_only() -> None:
    ctx = TaskSourceContext(train_tasks=10, tasks_per_iter=2, make_env=lambda: ToolsEnv("easy"))
    src = RodsSource(ctx, RodsParams(seed_pool=3, max_pool=10, spawn=2, signal="success"))
    src.pool = [TaskStats("train", s) for s in (1, 2, 5)]
    src.used_seeds = src.seeds_seen = {1, 2, 5}
    tasks = [Task.make("train", s) for s in (1, 2, 5)]
    table = {tasks[0].id: [1, 0, 1, 0], tasks[1].id: [1, 1, 1, 1], tasks[2].id: [0, 1, 0, 0]}
    m = src.observe(tasks, _episodes(table, tasks), seed=0)
    # two boundary parents x spawn 2: four proposals, all verified on tools
    assert m["tasks/proposed"] == 4.0 and m["tasks/spawned"] == 4.0
    assert m["tasks/valid_rate"] == 1.0 and m["tasks/distinct"] == 7.0
    assert m["tasks/boundary_frac"] == pytest.approx(2 / 3)
    children = src.pool[3:]
    assert [c.parent for c in children] == ["train/1", "train/1", "train/5", "train/5"]
    env = ToolsEnv("easy")
    for c in children:
        env.reset(c.task)
        parent_family = {"train/1": "refund_by_id", "train/5": "cancel_by_name"}[c.parent]
        assert env.family == parent_family and "wording" in c.data
    assert len(src.seen) == 2 + 4  # the parents' keys and the variants'
    assert set(src._plans) == {"train/1", "train/5"}
    # train/1 is mastered twice in a row (retire_after 2): it retires, and its plan goes
    mastered = {tasks[0].id: [1, 1, 1, 1]}
    for round_ in (1, 2):
        src.observe(tasks[:1], _episodes(mastered, tasks[:1]), seed=round_)
    assert "train/1" not in {e.id for e in src.pool} and set(src._plans) == {"train/5"}
    # a second round with the env now refusing every variant: proposals, no spawns
    _Broken.mode = "unsolvable"
    src2 = RodsSource(
        TaskSourceContext(10, 2, _Broken),
        RodsParams(seed_pool=3, max_pool=10, signal="success", tries=20),
    )
    src2.pool = [TaskStats("train", s) for s in (1, 2, 5)]
    m = src2.observe(tasks, _episodes(table, tasks), seed=0)
    assert (m["tasks/proposed"], m["tasks/spawned"], m["tasks/valid_rate"]) == (2.0, 0.0, 0.0)
    assert src2.rejected["no_match"] + src2.rejected["unsolvable"] == 2
    # the counters and the seen keys survive a checkpoint
    state = json.loads(json.dumps(src.state_dict()))
    back = RodsSource(ctx, RodsParams(seed_pool=3, max_pool=10, spawn=2, signal="success"))
    back.load_state_dict(state)
    assert back.state_dict() == src.state_dict()


def test_an_env_without_an_oracle_is_refused_in_one_line() -> None:
    class NoOracle:
        def similar_task(self, task: Task, rng: random.Random) -> Task:
            return Task("train", VARIANT_SEED_OFFSET)

    with pytest.raises(ValueError, match=r"has no oracle_action.*synthesiser=similar"):
        RodsSource(TaskSourceContext(10, 2, NoOracle), RodsParams(seed_pool=3))
    RodsSource(TaskSourceContext(10, 2, NoOracle), RodsParams(seed_pool=3, synthesiser="similar"))
    with pytest.raises(ValueError, match="synthesiser must be one of rules, llm, similar"):
        RodsParams(synthesiser="templates")


# ------------------------------------------------------------ the llm synthesiser
def test_first_json_object_and_same_shape_by_hand() -> None:
    assert first_json_object('sure! {"secret": 9} and {"secret": 2}') == {"secret": 9}
    assert first_json_object('{broken {"a": [1, 2]}') == {"a": [1, 2]}
    assert first_json_object("no json here") is None
    assert first_json_object("[1, 2]") is None
    assert same_shape({"secret": 9}, {"secret": 13})
    assert not same_shape({"secret": "9"}, {"secret": 13})  # a string is not an integer
    assert not same_shape({"secret": 9.0}, {"secret": 13})  # nor is a float
    assert not same_shape({"secret": True}, {"secret": 13})  # nor a bool
    assert not same_shape({"secret": 9, "x": 1}, {"secret": 13})  # another key
    assert same_shape({"items": [{"n": 1}, {"n": 2}]}, {"items": [{"n": 5}]})
    assert not same_shape({"items": [{"m": 1}]}, {"items": [{"n": 5}]})


class ScriptedChat:
    """A chat model that replies from a script, and records what it was asked."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.prompts, self.seeds = list(replies), [], []

    def __call__(self, prompt: str, seed: int) -> str:
        self.prompts.append(prompt)
        self.seeds.append(seed)
        return self.replies.pop(0)


def _guess() -> GuessEnv:
    return GuessEnv(high=16, max_turns=5)


def test_the_llm_executor_keeps_the_first_reply_the_env_accepts() -> None:
    # seed 0's secret is 13: the oracle's binary search takes 4 guesses
    chat = ScriptedChat([
        "I cannot do that",  # no JSON
        '{"number": 5}',  # other keys
        '{"secret": 40}',  # out of range: the env's reset refuses it
        '{"secret": 13}',  # the parent itself
        'Here: {"secret": 9}',  # accepted by the executor (9 also takes 4 guesses)
    ])  # fmt: skip
    synth = LLMSynthesiser(_guess, chat, tries=8)
    plan = synth.plan(Task.make("train", 0))
    assert synth.specs[plan.parent] == {"secret": 13} and plan.skeleton == ("guess",) * 4
    task = synth.execute(plan, random.Random(0))
    assert task is not None and task.data == {"spec": {"secret": 9}}
    assert VARIANT_SEED_OFFSET <= task.seed < HELDOUT_SEED_OFFSET
    assert len(chat.prompts) == 5 and '{"secret": 13}' in chat.prompts[0]
    assert chat.prompts[0] == PROMPT.format(spec='{"secret": 13}')
    reason, _ = synth.critique(task, plan, set())
    assert reason is None
    # secret 4 takes 2 guesses, 16 takes 5: off the plan's skeleton of 4
    for secret in (4, 16):
        other = Task("train", VARIANT_SEED_OFFSET + secret, {"spec": {"secret": secret}})
        assert synth.critique(other, plan, set())[0] == "off_plan"
    # secret 8 is found by the first guess: a plan of one step makes trivial variants
    eight = Task("train", VARIANT_SEED_OFFSET + 8, {"spec": {"secret": 8}})
    assert synth.critique(eight, synth.plan(eight), set())[0] == "trivial"
    # no acceptable reply within tries: None
    refusing = LLMSynthesiser(_guess, ScriptedChat(["{}"] * 2), tries=2)
    assert refusing.execute(refusing.plan(Task.make("train", 0)), random.Random(0)) is None
    synth.forget(plan.parent)
    assert plan.parent not in synth.specs


def test_rods_grows_its_buffer_with_llm_variants() -> None:
    """The whole path through RodsSource: a boundary task's variants written by the chat
    model, verified by the oracle, enter the buffer with their spec."""
    ctx = TaskSourceContext(train_tasks=10, tasks_per_iter=2, make_env=_guess)
    params = RodsParams(seed_pool=2, max_pool=10, spawn=0, signal="success", synthesiser="llm")
    src = RodsSource(ctx, params)  # spawn 0: no chat model is loaded here ...
    src.params = dataclasses.replace(params, spawn=2)  # ... the scripted one is given
    src._synth = LLMSynthesiser(_guess, ScriptedChat(['{"secret": 9}', '{"secret": 9}']))
    src.pool = [TaskStats("train", 0)]
    src.used_seeds = src.seeds_seen = {0}
    tasks = [Task.make("train", 0)]
    m = src.observe(tasks, _episodes({tasks[0].id: [1, 0, 1, 0]}, tasks), seed=0)
    # two proposals: secret 9 is verified and enters; 9 again is the critique's duplicate
    assert (m["tasks/proposed"], m["tasks/spawned"]) == (2.0, 1.0)
    assert src.rejected["duplicate"] == 1 and m["tasks/valid_rate"] == 0.5
    (child,) = src.pool[1:]
    assert child.data == {"spec": {"secret": 9}} and child.parent == "train/0"
    env = _guess()
    env.reset(child.task)  # the buffer's task is the one the chat model described
    assert env.task_spec() == {"secret": 9}


def test_the_llm_synthesiser_needs_task_spec() -> None:
    with pytest.raises(ValueError, match=r"has no task_spec\(\).*synthesiser=rules"):
        LLMSynthesiser(lambda: ToolsEnv("easy"), ScriptedChat([]))
    with pytest.raises(ValueError, match="synthesiser must be one of rules, llm, similar"):
        RodsParams(synthesiser="gpt")
    with pytest.raises(ValueError, match="llm_tries must be"):
        RodsParams(llm_tries=0)
