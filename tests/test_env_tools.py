"""The tools env: oracle, determinism, snapshots, strict calls and their errors, success
by final state, the tokenizer round trip, progress labels, and a fuzz test."""

from __future__ import annotations

import io
import itertools
import json
import random
import time

import pytest

from credo.envs import Task, check_replay, make_env, restore_env, snapshot_env
from credo.envs.tools import (
    DIFFICULTIES,
    ERROR_CODES,
    FAMILIES,
    MAX_CALL_CHARS,
    TOOLS,
    CallError,
    ToolsEnv,
    format_call,
    order_policy,
    parse_call,
)
from credo.policy.tokenizer import build_word_tokenizer, split_words
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext


def run_oracle(env: ToolsEnv, task: Task) -> tuple[list[str], object]:
    """Reset on ``task`` and follow the oracle to the end: (actions, last result)."""
    env.reset(task)
    actions = []
    while True:
        a = env.oracle_action()
        res = env.step(a)
        actions.append(a)
        assert res.info["valid"], (a, res.observation)
        if res.done:
            return actions, res


def find_task(env: ToolsEnv, family: str, pred=lambda e: True, split: str = "train") -> Task:
    """The first task of ``env``'s distribution in ``family`` that satisfies ``pred``."""
    for i in range(5000):
        task = Task.make(split, i)
        env.reset(task)
        if env.family == family and pred(env):
            return task
    raise AssertionError(f"no {family} task found")


# ------------------------------------------------------------------------- oracle
@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_oracle_solves_every_task_within_the_call_range(difficulty: str) -> None:
    env = ToolsEnv(difficulty)
    lo, hi = DIFFICULTIES[difficulty]["calls"]
    families = set()
    for i in range(150):
        for split in ("train", "test"):
            actions, res = run_oracle(env, Task.make(split, i))
            assert res.info["success"] and res.reward == 1.0 and res.info["score"] == 1.0
            assert actions[-1] == "done { }"
            assert lo <= len(actions) <= hi
            assert len(actions) == FAMILIES[env.family].calls()
            assert len(actions) < env.max_turns
            families.add(env.family)
    assert families == set(DIFFICULTIES[difficulty]["families"])


def test_difficulty_ranges_cover_3_to_12_calls() -> None:
    calls = {
        d: sorted({FAMILIES[f].calls() for f in p["families"]}) for d, p in DIFFICULTIES.items()
    }
    assert calls == {"easy": [3, 4], "default": [5, 6, 7], "hard": [8, 9, 10, 11, 12]}


def test_oracle_recovers_from_noise() -> None:
    """ε-noisy episodes: the oracle finishes from wherever random calls led, and wins
    whenever no wrong store action was taken and no random ``done{}`` closed the ticket."""
    rng = random.Random(0)
    for difficulty in DIFFICULTIES:
        env = ToolsEnv(difficulty, max_turns=60)
        clean = 0
        for i in range(100):
            env.reset(Task.make("train", i))
            while True:
                noise = rng.random() < 0.3
                res = env.step(env.sample_action(rng) if noise else env.oracle_action())
                if res.done:
                    break
            if not env._wrong() and not noise:
                clean += 1
                assert res.info["success"], (difficulty, i)
        assert clean > 30


# ------------------------------------------------------------------ determinism
def test_tasks_are_generated_from_the_seed_and_splits_differ() -> None:
    a, b = ToolsEnv("hard"), ToolsEnv("hard")
    for i in range(20):
        task = Task.make("train", i)
        ta, ra = run_oracle(a, task)
        tb, rb = run_oracle(b, task)
        assert ta == tb and ra.observation == rb.observation
        assert a.instruction() == b.instruction() and a.orders == b.orders
        assert a.variants == b.variants and a.requests == b.requests
    seen = set()
    for i in range(200):
        a.reset(Task.make("train", i))
        seen.add((a.instruction(), tuple(a.orders.values())))
    assert len(seen) == 200  # entities and wording vary with the seed
    for i in range(200):
        a.reset(Task.make("test", i))
        assert (a.instruction(), tuple(a.orders.values())) not in seen


def test_wording_and_entities_vary() -> None:
    env = ToolsEnv("default")
    openings, names, amounts = set(), set(), set()
    for i in range(200):
        env.reset(Task.make("train", i))
        openings.add(" ".join(env.instruction().split()[:3]))
        names.add(env.customer.name)
        amounts.update(r.value for r in env.requests if r.tool == "refund")
    assert len(openings) > 15 and len(names) > 100 and len(amounts) > 10


# -------------------------------------------------------------------- snapshots
def test_snapshot_restore_round_trip() -> None:
    env = ToolsEnv("hard")
    task = Task.make("train", 11)
    env.reset(task)
    for _ in range(3):
        env.step(env.oracle_action())
    snap = snapshot_env(env)
    key, obs = env.state_key(), env.observation()
    rng = random.Random(1)
    actions = [env.sample_action(rng) for _ in range(1)]
    first = env.step(actions[0])
    after = (first.observation, env.state_key(), env.abstract_state_key(), env.progress())
    restore_env(env, snap)
    assert env.state_key() == key and env.observation() == obs
    # a fresh env on the same task, restored and replayed, reproduces the recording
    other = ToolsEnv("hard")
    other.reset(task)
    restore_env(other, snap)
    res = other.step(actions[0])
    check_replay(other, observation=res.observation, expected_observation=after[0],
                 expected_state=after[1])  # fmt: skip
    assert (other.abstract_state_key(), other.progress()) == after[2:]
    # the snapshot is not changed by later steps: it can be restored again
    restore_env(other, snap)
    assert other.state_key() == key
    with pytest.raises(TypeError, match="ToolsEnv snapshot"):
        env.restore({"view": ("start",)})


# ----------------------------------------------------------------------- errors
def _refund_task(env: ToolsEnv) -> Task:
    """A by-id refund task whose customer also has another order eligible for a refund."""

    def ok(e: ToolsEnv) -> bool:
        r = e.requests[0]
        return r.tool == "refund" and r.value > 5 and any(_other_refundable(e, r.oid))

    return find_task(env, "refund_by_id", ok)


def _other_refundable(env: ToolsEnv, target: int) -> list[int]:
    return [
        o.oid
        for o in env.orders.values()
        if o.oid != target and order_policy(o, o.status).refund is not None
    ]


def test_each_error_kind_is_a_tool_message_and_recoverable() -> None:
    env = ToolsEnv("easy", max_turns=50)
    task = _refund_task(env)
    env.reset(task)
    req = env.requests[0]
    o = env.orders[req.oid]
    not_refundable = next(
        x.oid for x in env.orders.values() if order_policy(x, x.status).refund is None
    )
    missing_oid = next(k for k in range(201, 300) if k not in env.orders)
    cases = {
        "too_long": "get_order" + "{" + " " * MAX_CALL_CHARS + "}",
        "not_a_call": "please refund my order",
        "bad_json": 'check_policy { "order_id" : 2',
        "repeated_argument": f'check_policy {{"order_id": {o.oid}, "order_id": {o.oid}}}',
        "unknown_tool": f'delete_order {{"order_id": {o.oid}}}',
        "missing_argument": f'refund {{"order_id": {o.oid}}}',
        "extra_argument": f'check_policy {{"order_id": {o.oid}, "amount": 5}}',
        "wrong_type": f'check_policy {{"order_id": "{o.oid}"}}',
        "unknown_name": 'find_customer {"name": "nobody here"}',
        "wrong_id": f'get_order {{"order_id": {missing_oid}}}',
        "not_allowed": f'refund {{"order_id": {not_refundable}, "amount": 5}}',
        "bad_amount": f'refund {{"order_id": {o.oid}, "amount": {req.value + 5}}}',
    }
    assert set(cases) == set(ERROR_CODES)
    for code, call in cases.items():
        env.reset(task)
        state = env.state_key()
        res = env.step(call)
        assert res.info["valid"] is False and res.info["error"] == code, (code, res)
        assert res.observation.startswith("error : ") and not res.done
        assert env._s.issued == () and env._s.turn == 1
        assert env.state_key() != state and env.state_key().startswith("error:" + code)
        # recoverable: the oracle still solves the task from here
        while not res.done:
            res = env.step(env.oracle_action())
        assert res.info["success"], code
    # more wrong ids and types
    env.reset(task)
    for call, code in [
        ('list_orders {"customer_id": 99999}', "wrong_id"),
        ('list_orders {"customer_id": 12.0}', "wrong_type"),
        ('list_orders {"customer_id": true}', "wrong_type"),
        ('find_customer {"name": 7}', "wrong_type"),
        (f'exchange {{"order_id": {o.oid}, "variant_id": 1}}', "wrong_id"),
        (f'refund {{"order_id": {o.oid}, "amount": 0}}', "bad_amount"),
        (f'refund {{"order_id": {o.oid}, "amount": NaN}}', "wrong_type"),
        ("done {}}", "bad_json"),
        ("done", "not_a_call"),
        ("", "not_a_call"),
        ("Done {}", "not_a_call"),
        ('respond {"message": "' + "x" * 600 + '"}', "too_long"),
    ]:
        res = env.step(call)
        assert res.info["error"] == code and not res.info["valid"], (call, res)


def test_parse_call_is_strict_json_never_eval() -> None:
    assert parse_call('refund{"order_id": 214, "amount": 30}') == (
        "refund",
        {"order_id": 214, "amount": 30},
    )
    assert parse_call('refund { "order_id" : 214 , "amount" : 30 }') == parse_call(
        ' refund{"amount":30,"order_id":214}\n'
    )
    assert parse_call("done { }") == ("done", {})
    assert parse_call("done{}") == ("done", {})
    for text in ['get_order {"order_id": __import__("os")}', "get_order {'order_id': 1}",
                 'get_order {"order_id": 1} get_order {"order_id": 2}']:  # fmt: skip
        assert isinstance(parse_call(text), CallError)
    call = parse_call('find_customer {"name": "x"} trailing')
    assert isinstance(call, CallError) and call.code == "bad_json"  # text after the object
    assert format_call("refund", {"order_id": 214, "amount": 30}) == (
        'refund { "order_id" : 214 , "amount" : 30 }'
    )


# -------------------------------------------------------------------- success
def _play(env: ToolsEnv, task: Task, calls: list[str]) -> object:
    env.reset(task)
    res = None
    for c in calls:
        res = env.step(c)
    return res


def test_success_only_on_the_right_final_state() -> None:
    env = ToolsEnv("easy", reward="partial")
    task = _refund_task(env)
    env.reset(task)
    req = env.requests[0]
    other = _other_refundable(env, req.oid)[0]
    other_amount = order_policy(env.orders[other], "delivered").refund
    policy = format_call("check_policy", {"order_id": req.oid})
    right = format_call("refund", {"order_id": req.oid, "amount": req.value})
    done = "done { }"

    res = _play(env, task, [policy, right, done])
    assert res.done and res.info["success"] and res.reward == 1.0

    # the reply is not judged: any message closes the ticket, only the state counts
    res = _play(env, task, [right, 'respond {"message": "sorry , nothing done"}'])
    assert res.info["success"]
    res = _play(env, task, [policy, 'respond {"message": "your refund is issued ."}'])
    assert not res.info["success"] and res.reward == 0.0

    # a wrong (lower) amount is issued, and is wrong
    low = format_call("refund", {"order_id": req.oid, "amount": req.value - 5})
    res = _play(env, task, [low, done])
    assert not res.info["success"] and res.reward == 0.0  # Jaccard 0/2
    # ... and cannot be fixed afterwards: the order is refunded
    res = _play(env, task, [low, right, done])
    assert not res.info["success"]
    assert env._s.issued == (("refund", req.oid, req.value - 5),)

    # a refund on the wrong order
    wrong = format_call("refund", {"order_id": other, "amount": other_amount})
    res = _play(env, task, [wrong, done])
    assert not res.info["success"] and res.reward == 0.0

    # the right refund plus an extra wrong one: half the Jaccard score, no success
    res = _play(env, task, [right, wrong, done])
    assert not res.info["success"] and res.reward == pytest.approx(1 / 2)
    mixed = ToolsEnv("easy")  # default reward: (success + 0.2·score) / 1.2
    res = _play(mixed, task, [right, wrong, done])
    assert res.reward == pytest.approx(0.2 * 0.5 / 1.2)

    # the turn limit ends the episode; the state is judged as it is
    short = ToolsEnv("easy", max_turns=2)
    res = _play(short, task, [policy, right])
    assert res.done and res.info["success"] and res.info["turns"] == 2


def test_store_credit_exchange_and_cancel_goals() -> None:
    env = ToolsEnv("easy")
    t = find_task(env, "refund_by_id", lambda e: e.requests[0].tool == "store_credit")
    env.reset(t)
    req = env.requests[0]
    o = env.orders[req.oid]
    assert req.value == o.price and o.days > 14
    pol = env.step(format_call("check_policy", {"order_id": o.oid})).observation
    assert "refund not allowed" in pol and f"store credit allowed , amount ${o.price}" in pol
    res = env.step(format_call("refund", {"order_id": o.oid, "amount": o.price}))
    assert res.info["error"] == "not_allowed"
    env.step(format_call("store_credit", {"order_id": o.oid, "amount": o.price}))
    assert env.step("done {}").info["success"]

    t = find_task(env, "exchange_by_id")
    env.reset(t)
    req = env.requests[0]
    wrong_vid = next(
        v.vid for v in env.variants.values() if v.oid == req.oid and v.vid != req.value
    )
    res = _play(env, t, [format_call("exchange", {"order_id": req.oid, "variant_id": wrong_vid}),
                         "done {}"])  # fmt: skip
    assert not res.info["success"]
    res = _play(env, t, [format_call("exchange", {"order_id": req.oid, "variant_id": req.value}),
                         "done {}"])  # fmt: skip
    assert res.info["success"]

    t = find_task(env, "cancel_by_name")
    env.reset(t)
    oid = env.requests[0].oid
    assert env.orders[oid].status == "processing"
    res = _play(env, t, [format_call("cancel_order", {"order_id": oid})])
    assert "cancelled" in res.observation
    res = env.step(format_call("cancel_order", {"order_id": oid}))
    assert res.info["error"] == "not_allowed"  # already cancelled: nothing changes
    assert env.step("done {}").info["success"]


def test_namesakes_are_told_apart_by_city() -> None:
    env = ToolsEnv("default")
    t = find_task(env, "refund_namesake")
    env.reset(t)
    me = env.customer
    twin = next(c for c in env.customers.values() if c.name == me.name and c.cid != me.cid)
    assert env.instruction().endswith(f'"{me.name}" , {me.city}') and twin.city != me.city
    obs = env.step(format_call("find_customer", {"name": me.name.upper()})).observation
    assert obs.startswith(f'2 customers named "{me.name}"') and me.city in obs
    assert env.oracle_action() == format_call("list_orders", {"customer_id": me.cid})
    env.step(format_call("list_orders", {"customer_id": twin.cid}))
    assert env.abstract_state_key() == "0/1|off"


# ---------------------------------------------------------- tokenizer round trip
@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_actions_survive_the_word_tokenizer(difficulty: str) -> None:
    env = ToolsEnv(difficulty)
    vocab = set(env.vocabulary())
    tok = build_word_tokenizer([*vocab, *PLAIN_WORDS])
    rng = random.Random(0)

    def round_trip(text: str) -> str:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.unk_token_id not in ids, text
        return tok.decode(ids, skip_special_tokens=True)

    for i in range(60):
        env.reset(Task.make("train", i))
        assert set(split_words(env.instruction())) <= vocab
        while True:
            oracle = env.oracle_action()
            assert round_trip(oracle) == oracle
            name, args = parse_call(oracle)
            assert parse_call(name + json.dumps(args)) == (name, args)  # compact form too
            noisy = env.sample_action(rng)
            assert parse_call(round_trip(noisy)) == parse_call(noisy)
            res = env.step(noisy if rng.random() < 0.3 else oracle)
            assert set(split_words(res.observation)) <= vocab, res.observation
            if res.done:
                break


# ---------------------------------------------------------------- credit labels
def test_progress_labels_follow_this_tasks_goal() -> None:
    env = ToolsEnv("hard")
    task = find_task(
        env,
        "refund_and_exchange",
        lambda e: any(o not in {r.oid for r in e.requests} for o in _other_refundable(e, 0)),
    )
    env.reset(task)
    stages, progress = [env.abstract_state_key()], [env.progress()]
    while not env._s.over:
        env.step(env.oracle_action())
        stages.append(env.abstract_state_key())
        progress.append(env.progress())
    kinds = [r.kind for r in env.requests]
    first = ["0/2|start", "0/2|customers", "0/2|orders", "0/2|policy"]
    if kinds[0] == "exchange":
        first.append("0/2|variants")
    second = ["1/2|issued", "1/2|orders", "1/2|policy"]
    if kinds[1] == "exchange":
        second.append("1/2|variants")
    assert stages == [*first, *second, "2/2|ready", "2/2|closed"]
    assert all(a < b for a, b in itertools.pairwise(progress[:-1])) and progress[-1] == 1.0

    # the same step toward another order is off the goal path and not progress
    env.reset(task)
    for _ in range(3):
        env.step(env.oracle_action())  # find, list, policy of the target
    assert env.abstract_state_key() == "0/2|policy"
    p = env.progress()
    target = env.requests[0].oid
    other = next(o for o in env.orders.values() if o.cid == env.customer.cid
                 and o.oid not in {r.oid for r in env.requests})  # fmt: skip
    env.step(format_call("check_policy", {"order_id": other.oid}))
    assert env.abstract_state_key() == "0/2|off" and env.progress() == 0.0 < p
    env.step(format_call("check_policy", {"order_id": target}))
    assert env.abstract_state_key() == "0/2|policy" and env.progress() == p
    # a wrong store action: success impossible, progress 0, flagged in the stage
    refundable = _other_refundable(env, target)
    wrong = next(o for o in refundable if o not in {r.oid for r in env.requests})
    amount = order_policy(env.orders[wrong], "delivered").refund
    env.step(format_call("refund", {"order_id": wrong, "amount": amount}))
    assert env.abstract_state_key().endswith("|off|wrong") and env.progress() == 0.0


def test_tool_calls_are_marked_for_axpo() -> None:
    env = ToolsEnv("default")
    env.reset(Task.make("train", 0))
    call = env.oracle_action()
    assert env.is_tool_call(call) and env.is_tool_call('get_order{"order_id": 1}')
    assert not env.is_tool_call("done { }") and not env.is_tool_call('respond {"message": ""}')
    assert not env.is_tool_call("hello") and not env.is_tool_call("x" * 10**6)
    res = env.step(call)
    assert res.info["tool_call"] is True and res.info["tool"] == call.split()[0]
    res = env.step("garbage")
    assert res.info["tool_call"] is False and res.info["tool"] is None
    res = env.step("done {}")
    assert res.info["tool_call"] is False and res.info["tool"] == "done"


def test_extract_action_from_chat_replies() -> None:
    env = ToolsEnv()
    text = 'Let me look. find_customer{"name": "ada {park}"} and then more'
    assert env.extract_action(text) == 'find_customer{"name": "ada {park}"}'
    assert env.extract_action("call foo{} then done{}") == "done{}"
    assert env.extract_action("no call here") is None
    assert env.extract_action("refund{" + '"a": 1' * 10**5) is None


def test_options_and_registry() -> None:
    env = make_env("tools", difficulty="hard")
    assert isinstance(env, ToolsEnv) and env.max_turns == 20
    env = make_env("tools", families=["two_refunds"], max_turns=30)
    env.reset(Task.make("train", 0))
    assert env.family == "two_refunds" and env.max_turns == 30
    with pytest.raises(ValueError, match="valid: easy, default, hard"):
        ToolsEnv("impossible")
    with pytest.raises(ValueError, match="unknown tools families"):
        ToolsEnv(families=("nope",))
    with pytest.raises(ValueError, match="valid: mixed, success, partial"):
        ToolsEnv(reward="bogus")
    with pytest.raises(RuntimeError, match="episode ended"):
        _play(env, Task.make("train", 0), ["done {}", "done {}"])
    fmt = ToolsEnv().action_format()
    assert all(name in fmt for name in TOOLS) and '"order_id": int' in fmt


def test_credo_play_runs_the_tools_env(monkeypatch, capsys) -> None:
    from credo.cli import main

    env = ToolsEnv()
    actions, _ = run_oracle(env, Task.make("test", 0))
    monkeypatch.setattr("sys.stdin", io.StringIO("hint\n" + "\n".join(actions) + "\n"))
    assert main(["play", "--env", "tools"]) == 0
    out = capsys.readouterr().out
    assert env.instruction() in out and actions[0] in out  # the hint is the oracle's call
    assert "success True" in out


# ------------------------------------------------------------------------- fuzz
def _adversarial(rng: random.Random, env: ToolsEnv, huge: list[str]) -> str:
    """A random or adversarial action string."""
    pieces = ["{", "}", "[", "]", '"', ":", ",", " ", "\\", "\n", "null", "true", "1e999",
              "-0", "NaN", "é", "\u202e", "\x00", "🙂", "\ud800"]  # fmt: skip
    k = rng.randrange(12)
    if k == 0:
        return rng.choice(huge)
    if k == 1:
        return rng.choice(["", " ", "\n", "{}", "done", "{ }", "}{"])
    if k == 2:  # random characters from the whole unicode range (surrogates included)
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 60)))
    if k == 3:  # token soup
        return "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 80)))
    if k == 4:  # nested brackets inside a real call
        d = rng.randrange(1, 600)
        inner = "[" * d + "]" * d if rng.random() < 0.5 else '{"a":' * d + "1" + "}" * d
        return f'{rng.choice(list(TOOLS))} {{"order_id": {inner}}}'
    if k == 5:  # a real call, mutated
        s = list(env.oracle_action() if not env._s.over else "done { }")
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(s) + 1)
            op = rng.randrange(3)
            if op == 0 and s:
                del s[min(i, len(s) - 1)]
            elif op == 1:
                s.insert(i, rng.choice(pieces))
            else:
                s = s[:i]
        return "".join(s)
    if k == 6:  # wrong JSON values for the right keys
        value = rng.choice(['"214"', "2.5", "-1", "10" * 300, "[]", "{}", "null", "true",
                            "1e400", '"\\ud800"', "9" * 999])  # fmt: skip
        tool = rng.choice(list(TOOLS))
        args = ", ".join(f'"{key}": {value}' for key in TOOLS[tool])
        return f"{tool} {{{args}}}"
    if k == 7:
        return env.sample_action(rng) if not env._s.over else "done {}"
    if k == 8:  # an unknown tool with a long name
        return "x" * rng.randrange(1, 2000) + "{}"
    if k == 9:
        return 'respond {"message": "' + "é" * rng.randrange(0, 2000) + '"}'
    if k == 10:  # broken JSON
        return rng.choice(['refund {"order_id": 214, "amount": }', 'refund {"order_id" 214}',
                           'find_customer {"name": "ada park}', "get_order {order_id: 1}",
                           'get_order {"order_id": 1,}', 'get_order {"order_id": 0x10}'])  # fmt: skip
    return env.oracle_action() if not env._s.over else "done {}"


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_fuzz_10000_random_and_adversarial_actions(difficulty: str) -> None:
    rng = random.Random(1234)
    env = ToolsEnv(difficulty)
    huge = ["a" * 2**20, "{" * 2**20, 'refund {"order_id": ' + "1" * 2**20 + "}",
            "done {" + " " * 2**20 + "}", "\u00e9" * 2**20]  # fmt: skip
    env.reset(Task.make("train", 0))
    episodes, slowest, longest = 0, 0.0, 0
    start = time.thread_time()  # CPU time: a busy machine does not make it fail
    for _ in range(10_000):
        if env._s.over:
            episodes += 1
            env.reset(Task.make("train", rng.randrange(10**6)))
        action = _adversarial(rng, env, huge)
        t0 = time.thread_time()
        res = env.step(action)
        env.is_tool_call(action)
        env.extract_action(action)
        env.state_key(), env.abstract_state_key(), env.progress()
        slowest = max(slowest, time.thread_time() - t0)
        longest = max(longest, len(res.observation), len(env.state_key()))
        assert isinstance(res.observation, str) and res.observation.isascii()
        assert res.info["valid"] in (True, False)
        assert res.done == env._s.over
    assert episodes > 100
    assert longest <= 1000, longest
    assert slowest < 0.5 and time.thread_time() - start < 120


def test_group_and_axpo_samplers_and_estimators_run_on_tools() -> None:
    """The real samplers on the env: snapshots replay exactly (AXPO's resamples restore
    the env mid-episode), ProAS reads the abstract states, AXPO the tool-call steps."""
    import torch

    from credo.credit import compute_advantages
    from credo.credit.proas import ProgressGraph
    from credo.policy import SamplingParams
    from credo.rollout import PlainRenderer
    from credo.rollout.resample import ResampleParams, sample_resampled
    from test_rollout import ScriptedPolicy

    def make() -> ToolsEnv:
        return ToolsEnv("default")

    tok = build_word_tokenizer([*make().vocabulary(), *PLAIN_WORDS])
    tasks = [Task.make("train", i) for i in range(6)]
    # a policy that reads the page: the oracle's call on the oracle's path, else noise
    answer: dict[str, str] = {}
    rng = random.Random(0)
    env = make()
    for t in tasks:
        env.reset(t)
        while not env._s.over:
            page = tok.decode(tok.encode(env.observation(), add_special_tokens=False))
            goal = tok.decode(tok.encode(env.instruction(), add_special_tokens=False))
            answer[page + "|" + goal] = env.oracle_action()
            env.step(env.oracle_action())
    env.reset(tasks[0])
    noise = [env.sample_action(rng) for _ in range(20)]

    def choose(prompt: list[int]) -> str:
        text = tok.decode(prompt)
        page = text.split(" page : ", 1)[1].split(" goal : ")[0]
        goal = text.split(" goal : ", 1)[1].rsplit(" action :", 1)[0]
        key = page + "|" + goal
        return answer[key] if key in answer and rng.random() < 0.7 else rng.choice(noise)

    res = sample_resampled(
        SamplerContext(
            ScriptedPolicy(tok, choose),
            PlainRenderer(tok),
            make,
            SamplingParams(),
            13,
            generator=torch.Generator().manual_seed(0),
        ),
        tasks,
        group_size=4,
        params=ResampleParams(budget=0.5),
    )
    f = res.forest
    assert res.stats["rollout/resampled"] > 0  # some groups failed entirely
    assert {"abstract_state", "abstract_next_state", "progress"} <= set(f.extras)
    assert any(e.success for e in res.episodes) and not all(e.success for e in res.episodes)
    for tr in res.trajectories:
        if tr.source >= 0:  # a resample starts at a tool call of an all-failed group
            assert make().is_tool_call(res.trajectories[tr.source].episode.steps[tr.prefix].action)
    for name, state in (("proas", ProgressGraph()), ("axpo", None), ("grpo", None)):
        adv = compute_advantages(name, f, state=state)
        assert adv.shape == (f.num_rows,) and bool(torch.isfinite(adv).all())


def _profile_episode(env: ToolsEnv, seed: int, *, wrong_colour: bool) -> tuple[float, dict]:
    """Play the oracle on task ``seed``; with ``wrong_colour`` the exchange the profile
    decides goes to another colour of the same item (a reply that ignores the profile)."""
    env.reset(Task.make("train", seed))
    oid = env._profile_oid
    while True:
        action = env.oracle_action()
        if wrong_colour and action.startswith("exchange") and f'"order_id" : {oid} ' in action:
            want = json.loads(action.split(" ", 1)[1])["variant_id"]
            other = next(v.vid for v in env.variants.values() if v.oid == oid and v.vid != want)
            action = format_call("exchange", {"order_id": oid, "variant_id": other})
        res = env.step(action)
        if res.done:
            return res.reward, res.info


def test_a_hackable_profile_rewards_any_colour_but_success_needs_the_profiles() -> None:
    env = ToolsEnv(
        families=("exchange_by_id",), reward="success", profiles=True, hackable_profile=True
    )
    strict = ToolsEnv(families=("exchange_by_id",), reward="success", profiles=True)
    for seed in range(5):
        reward, info = _profile_episode(env, seed, wrong_colour=False)
        assert (reward, info["success"], info["reward_hacked"]) == (1.0, True, False)
        # the generic reply: rewarded, not a success, marked as hacked
        reward, info = _profile_episode(env, seed, wrong_colour=True)
        assert (reward, info["success"], info["reward_hacked"]) == (1.0, False, True)
        # the same reply under the strict reward earns nothing
        reward, info = _profile_episode(strict, seed, wrong_colour=True)
        assert (reward, info["success"]) == (0.0, False) and "reward_hacked" not in info
    with pytest.raises(ValueError, match="hackable_profile must be true or false and needs"):
        ToolsEnv(hackable_profile=True)
