"""Fuzz the third-party adapters (``textarena``, ``gym``, ``textworld``) on their real games:
hostile actions never raise, stay fast and give bounded observations and state keys.

Counts (``CREDO_FUZZ_ACTIONS``, default 10,000): that many random actions (Hypothesis
batches, :mod:`fuzz_util`) per TextArena game and for the Gymnasium text env, plus the
fixed adversarial list (1 MB strings, runs of spaces after a bracket, non-ASCII digits,
broken and nested brackets and JSON, control characters, lone surrogates) played after
0–3 oracle moves. TextWorld plays :data:`TEXTWORLD_ACTIONS` (a tenth: its guided moves
and restores run the game's interpreter, ~30 ms a step on a loaded CPU) plus the full
adversarial list.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
from hypothesis import given

from credo.envs import make_env
from fuzz_util import (
    FUZZ_ACTIONS,
    FuzzBatch,
    FuzzReport,
    adversarial_actions,
    fuzz_batches,
    fuzz_env,
    fuzz_settings,
)
from test_fuzz_envs import _then_oracle
from tw_games import TW_OPTIONS

pytestmark = pytest.mark.slow  # the slow tier: fuzzing third-party envs

TEXTARENA = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Minesweeper-v0-small"]
#: Words of the bracketed forms (TextArena moves are ``[...]``: ``[up]``, ``[a c]``).
TEXTARENA_VERBS = ("up", "a", "move", "guess")
GYM_VERBS = ("flip",)
TEXTWORLD_VERBS = ("go", "take", "open", "put", "unlock", "examine", "look")
#: Random actions for TextWorld (see the module docstring).
TEXTWORLD_ACTIONS = max(200, FUZZ_ACTIONS // 10)
LIMITS = {
    "textarena": dict(max_observation_chars=4000, max_state_key_chars=200),
    "gym": dict(max_observation_chars=200, max_state_key_chars=20),
    "textworld": dict(max_observation_chars=2000, max_state_key_chars=120),
    "sokoban": dict(max_observation_chars=400, max_state_key_chars=60),
    "bfcl": dict(max_observation_chars=12_000, max_state_key_chars=40),
}
SOKOBAN_VERBS = ("up", "down", "left", "right")
#: BFCL's calls: the fuzz's bracketed forms reach the parser as ``[cd (...)]``
BFCL_VERBS = ("cd", "ls", "mkdir", "done")


def _fuzz_random(
    make, verbs, limits, n_actions: int, mostly_invalid: bool = True, **kw
) -> FuzzReport:  # type: ignore[no-untyped-def]
    total = FuzzReport()

    @fuzz_settings(n_actions)
    @given(fuzz_batches(verbs))
    def run(batch: FuzzBatch) -> None:
        fuzz_env(make, batch.actions, seed=batch.seed, report=total, **limits, **kw)

    t0 = time.perf_counter()
    run()
    print(
        f"{total.actions:,} fuzz actions, {total.steps:,} steps, {total.episodes:,} episodes, "
        f"{total.restores:,} restores in {time.perf_counter() - t0:.1f} s; slowest call "
        f"{total.max_cpu_s * 1e3:.1f} ms CPU ({total.slowest}); longest observation "
        f"{total.max_observation_chars}, state key {total.max_state_key_chars}"
    )
    assert total.actions >= n_actions
    if mostly_invalid:  # (BFCL: a reply that is no call list is an answer in words)
        assert total.invalid > total.actions // 2  # most random strings are not moves
    return total


def _fuzz_adversarial(make, verbs, limits, depths: int = 4) -> FuzzReport:  # type: ignore[no-untyped-def]
    actions = adversarial_actions(verbs)
    total = FuzzReport()
    for depth in range(depths):

        def at_depth(depth: int = depth):  # type: ignore[no-untyped-def]
            env = make()
            env.reset = _then_oracle(env.reset, env, depth)
            return env

        fuzz_env(at_depth, actions, seed=depth, guide=0.0, report=total, **limits)
    assert total.actions == len(actions) * depths
    return total


@pytest.mark.parametrize("game", TEXTARENA)
def test_textarena_survives_random_actions(game: str) -> None:
    make = functools.partial(make_env, f"textarena:{game}")
    total = _fuzz_random(make, TEXTARENA_VERBS, LIMITS["textarena"], FUZZ_ACTIONS)
    assert len(total.seen_states) > 5  # the guided moves take the fuzz actions deep


@pytest.mark.parametrize("game", TEXTARENA)
def test_textarena_survives_the_adversarial_list(game: str) -> None:
    make = functools.partial(make_env, f"textarena:{game}")
    total = _fuzz_adversarial(make, TEXTARENA_VERBS, LIMITS["textarena"])
    assert len(total.seen_states) > 3


def test_gym_survives_random_and_adversarial_actions() -> None:
    make = functools.partial(make_env, "gym:credo/TextLights-v0")
    total = _fuzz_random(make, GYM_VERBS, LIMITS["gym"], FUZZ_ACTIONS)
    assert len(total.seen_states) > 20
    _fuzz_adversarial(make, GYM_VERBS, LIMITS["gym"])


def test_textworld_survives_random_and_adversarial_actions(tw_cache: Path) -> None:
    make = functools.partial(make_env, "textworld", cache_dir=str(tw_cache), **TW_OPTIONS)
    # restores replay the game's commands: check a few, and keep the interpreter's steps
    # (guided moves) to a fifth of the fuzz actions
    total = _fuzz_random(
        make,
        TEXTWORLD_VERBS,
        LIMITS["textworld"],
        TEXTWORLD_ACTIONS,
        guide=0.2,
        restore_share=0.03,
        step_limit_s=2.0,
    )
    assert len(total.seen_states) > 5
    _fuzz_adversarial(make, TEXTWORLD_VERBS, {**LIMITS["textworld"], "step_limit_s": 2.0})


def test_sokoban_survives_random_and_adversarial_actions() -> None:
    pytest.importorskip("numpy")
    make = functools.partial(make_env, "sokoban")
    total = _fuzz_random(make, SOKOBAN_VERBS, LIMITS["sokoban"], FUZZ_ACTIONS)
    assert len(total.seen_states) > 20
    _fuzz_adversarial(make, SOKOBAN_VERBS, LIMITS["sokoban"])


def test_bfcl_survives_random_and_adversarial_actions() -> None:
    """Model text reaches ``ast.parse`` (never ``eval``): nested brackets, 1 MB strings,
    huge literals, control characters are answers in words or error results."""
    make = functools.partial(make_env, "bfcl")
    total = _fuzz_random(make, BFCL_VERBS, LIMITS["bfcl"], FUZZ_ACTIONS // 10, mostly_invalid=False)
    assert len(total.seen_states) > 5 and total.invalid > 0  # some calls reached the APIs
    _fuzz_adversarial(make, BFCL_VERBS, LIMITS["bfcl"])
