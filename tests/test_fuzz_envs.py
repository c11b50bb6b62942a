"""Fuzz every built-in env (shop, tools, recall) and difficulty: hostile actions never raise, stay
fast and small.

``CREDO_FUZZ_ACTIONS`` (default 10,000) random actions per env and difficulty, drawn by
Hypothesis, plus a fixed adversarial list (1 MB strings, regex-hostile runs of spaces,
non-ASCII digits, broken and nested brackets, control characters) played at every depth of
an oracle episode. See :mod:`fuzz_util` for what is checked after each call.
"""

from __future__ import annotations

import functools
import re
import time

import pytest
from hypothesis import given

from credo.envs import make_env
from credo.envs.base import restore_env, snapshot_env
from credo.envs.recall import DIFFICULTIES as RECALL_DIFFICULTIES
from credo.envs.shop import DIFFICULTIES, MAX_ACTION_CHARS, MAX_QUERY_KEY_CHARS
from credo.envs.tools import DIFFICULTIES as TOOLS_DIFFICULTIES
from credo.envs.tools import TOOLS
from fuzz_util import (
    FUZZ_ACTIONS,
    FuzzBatch,
    FuzzReport,
    adversarial_actions,
    fuzz_batches,
    fuzz_env,
    fuzz_settings,
)

pytestmark = pytest.mark.slow  # the slow tier: fuzzing the built-in envs

#: Tool messages are capped; the longest are order lists and policies.
TOOLS_LIMITS = dict(max_observation_chars=2000, max_state_key_chars=400)
SHOP_VERBS = ("search", "click", "choose", "back", "buy")
#: The shop's pages are short: the longest is a results page of five products.
SHOP_LIMITS = dict(max_observation_chars=400, max_state_key_chars=MAX_QUERY_KEY_CHARS + 64)
#: recall's observations are one short line.
RECALL_LIMITS = dict(max_observation_chars=120, max_state_key_chars=40)
#: Every built-in env: its action verbs, difficulties, bounds, and how many oracle moves
#: the adversarial list is played after (one depth per page kind).
ENVS = {
    "shop": (SHOP_VERBS, sorted(DIFFICULTIES), SHOP_LIMITS, 4),
    "tools": (tuple(TOOLS), sorted(TOOLS_DIFFICULTIES), TOOLS_LIMITS, 4),
    "recall": (("walk", "open"), sorted(RECALL_DIFFICULTIES), RECALL_LIMITS, 4),
}
CASES = [(env, d) for env, (_, diffs, _, _) in ENVS.items() for d in diffs]


@pytest.mark.parametrize(("env_name", "difficulty"), CASES)
def test_env_survives_random_actions(env_name: str, difficulty: str) -> None:
    verbs, difficulties, limits, _ = ENVS[env_name]
    make = functools.partial(make_env, env_name, difficulty=difficulty)
    # extract_action/is_tool_call read only the text: fuzzed with the first difficulty
    extract = difficulty == difficulties[0]
    total = FuzzReport()

    @fuzz_settings()
    @given(fuzz_batches(verbs))
    def run(batch: FuzzBatch) -> None:
        fuzz_env(make, batch.actions, seed=batch.seed, extract=extract, report=total, **limits)

    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    assert total.actions >= FUZZ_ACTIONS
    assert total.invalid > total.actions // 2  # most random strings are not actions
    assert len(total.seen_states) > 20  # the guided moves take the fuzz actions deep
    print(
        f"{env_name}/{difficulty}: {total.actions:,} fuzz actions, {total.steps:,} steps, "
        f"{total.episodes:,} episodes, {total.restores:,} restores in {seconds:.1f} s; "
        f"slowest call {total.max_cpu_s * 1e3:.1f} ms CPU ({total.slowest}), "
        f"{total.max_wall_s * 1e3:.1f} ms wall; longest observation "
        f"{total.max_observation_chars}, state key {total.max_state_key_chars}"
    )


def test_shop_fuzz_reaches_every_page() -> None:
    total = FuzzReport()
    shop = functools.partial(make_env, "shop")
    fuzz_env(shop, [f"x{i}" for i in range(2000)], seed=3, report=total, **SHOP_LIMITS)
    assert {key.split("|", 1)[0] for key in total.seen_states} == {
        "home",
        "results",
        "item",
        "done",
    }


@pytest.mark.parametrize(("env_name", "difficulty"), CASES)
def test_env_survives_the_adversarial_list_at_every_depth(env_name: str, difficulty: str) -> None:
    """Each hostile action is played after 0, 1, ... oracle moves (for ``shop``: home,
    results, item, size chosen)."""
    verbs, _, limits, depths = ENVS[env_name]
    actions = adversarial_actions(verbs)
    total = FuzzReport()
    for depth in range(depths):

        def at_depth(depth: int = depth):  # type: ignore[no-untyped-def]
            env = make_env(env_name, difficulty=difficulty)
            env.reset = _then_oracle(env.reset, env, depth)  # every episode starts at depth
            return env

        # extract_action does not depend on the state: checked once, below
        fuzz_env(at_depth, actions, seed=depth, guide=0.0, extract=False, report=total, **limits)
    assert total.actions == len(actions) * depths
    assert len(total.seen_states) > depths


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_extract_action_survives_the_adversarial_list(env_name: str) -> None:
    verbs, _, limits, _ = ENVS[env_name]
    total = fuzz_env(functools.partial(make_env, env_name), adversarial_actions(verbs), **limits)
    assert total.actions == len(adversarial_actions(verbs))
    print(
        f"{env_name} extract_action: slowest call {total.max_cpu_s * 1e3:.1f} ms ({total.slowest})"
    )


def _then_oracle(reset, env, depth: int):  # type: ignore[no-untyped-def]
    """``reset`` followed by up to ``depth`` oracle moves, stopping before a move that
    would end the episode (undone through a snapshot)."""

    def wrapped(task, seed=0):  # type: ignore[no-untyped-def]
        obs = reset(task, seed)
        for _ in range(depth):
            snap = snapshot_env(env)
            res = env.step(env.oracle_action())
            if res.done:
                restore_env(env, snap)
                break
            obs = res.observation
        return obs

    return wrapped


def test_the_fuzzer_catches_what_it_should() -> None:
    """The fuzzer itself: an env that raises, a slow parser, an unbounded key, a
    non-string observation are each reported with the action that caused them."""
    from credo.envs.shop import ShopEnv

    class Raises(ShopEnv):
        def step(self, action):  # type: ignore[no-untyped-def]
            if "²" in action:
                raise ValueError("invalid literal")
            return super().step(action)

    class Slow(ShopEnv):
        def step(self, action):  # type: ignore[no-untyped-def]
            t = time.process_time()
            while "slow" in action and time.process_time() - t < 0.05:
                pass
            return super().step(action)

    class Hangs(ShopEnv):
        def step(self, action):  # type: ignore[no-untyped-def]
            while "hang" in action:
                pass
            return super().step(action)

    class Backtracks(ShopEnv):
        """The shop's first action regex: cubic on a bracket and a run of spaces."""

        def step(self, action):  # type: ignore[no-untyped-def]
            re.match(r"^\s*(search|click|choose)\s*\[\s*(.*?)\s*\]\s*$", action)
            return super().step(action)

    class LongKey(ShopEnv):
        def state_key(self):  # type: ignore[no-untyped-def]
            return super().state_key() * 10_000

    class BytesObs(ShopEnv):
        def step(self, action):  # type: ignore[no-untyped-def]
            res = super().step(action)
            res.observation = res.observation.encode()
            return res

    cases = [
        (Raises, ["ok", "click[²]"], {}, r"step\(\) raised ValueError.*'click\[²\]'"),
        (Slow, ["slow down"], {"step_limit_s": 0.04}, r"step\(\) took 0\.0\d+ s CPU .*'slow down'"),
        (Hangs, ["ok", "hang"], {"step_limit_s": 0.1}, r"step\(\) was stopped after 0\.2 s CPU"),
        (Backtracks, ["search[" + " " * 8000], {"step_limit_s": 0.1}, r"stopped .*8,007 chars"),
        (LongKey, ["x"], {}, r"state_key\(\) has [\d,]+ characters"),
        (BytesObs, ["x"], {}, r"step\(\) returned a bytes observation"),
    ]
    for cls, actions, kwargs, message in cases:
        with pytest.raises(AssertionError, match=message):
            fuzz_env(cls, actions, guide=0.0, **kwargs)
    assert fuzz_env(ShopEnv, ["x" * (MAX_ACTION_CHARS + 1)], guide=0.0).invalid == 1
