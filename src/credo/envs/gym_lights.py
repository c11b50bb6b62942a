"""``credo/TextLights-v0``: a small text env written with Gymnasium's API, for the ``gym``
adapter's tests and as an example of a text env any Gymnasium user can write.

A row of 3–6 lamps, some off (drawn from the reset seed); the agent flips one lamp per
step (``flip 3``) and wins when every lamp is on; flipping a lamp that is on turns it
off. Observations and actions are :class:`gymnasium.spaces.Text`::

    observation  "lamps : 1 on 2 off 3 off 4 on"
    action       "flip 2"      (lower-case letters, digits and spaces, at most 32)

``step`` returns reward 1 and ``terminated`` on the win, ``info["success"]`` and
``info["valid"]`` (False for text that is not ``flip <k>`` with a lamp number k; nothing
changes then). The episode is truncated (``truncated``) after ``lamps + 2`` steps.

Optional methods the credo adapter uses when an env has them: ``instruction()``,
``state_key()`` (the lamps as bits), ``oracle_action()`` (flip the first lamp that is
off), ``sample_action(rng)`` (flip a random lamp) and ``vocabulary()``. Gymnasium's
``TimeLimit`` ends an episode after 8 steps (``max_episode_steps``).

Importing this module needs ``gymnasium``; :func:`register` adds the id to Gymnasium's
registry (the ``gym`` adapter calls it).
"""

from __future__ import annotations

import random
import string
from typing import Any, ClassVar

import gymnasium
from gymnasium import spaces

__all__ = ["ENV_ID", "TextLightsEnv", "register"]

#: The id this env is registered under in Gymnasium.
ENV_ID = "credo/TextLights-v0"
_CHARSET = string.ascii_lowercase + string.digits + " "


class TextLightsEnv(gymnasium.Env):
    """Turn every lamp on (see the module docstring).

    Args:
        min_lamps, max_lamps: the number of lamps is drawn from this range per episode.
        vocabulary_lamps: the lamp numbers ``vocabulary()`` lists, 1 to this (default
            ``max_lamps``); 9 lets a model trained on fewer lamps be evaluated on more
            (``eval.shifted``), since a word-level tokenizer knows only listed words.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self, min_lamps: int = 3, max_lamps: int = 6, vocabulary_lamps: int | None = None
    ) -> None:
        if not 1 <= min_lamps <= max_lamps <= 9:
            raise ValueError(f"need 1 <= min_lamps <= max_lamps <= 9, got {min_lamps}, {max_lamps}")
        listed = max_lamps if vocabulary_lamps is None else vocabulary_lamps
        if not max_lamps <= listed <= 9:
            raise ValueError(f"need max_lamps <= vocabulary_lamps <= 9, got {vocabulary_lamps}")
        self.min_lamps, self.max_lamps, self.vocabulary_lamps = min_lamps, max_lamps, listed
        self.observation_space = spaces.Text(max_length=128, charset=_CHARSET + ":.")
        self.action_space = spaces.Text(max_length=32, min_length=1, charset=_CHARSET)
        self.lamps: list[bool] = []
        self.steps = 0

    def _obs(self) -> str:
        return "lamps : " + " ".join(
            f"{i + 1} {'on' if on else 'off'}" for i, on in enumerate(self.lamps)
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        n = int(self.np_random.integers(self.min_lamps, self.max_lamps + 1))
        while True:
            self.lamps = [bool(b) for b in self.np_random.integers(0, 2, size=n)]
            if not all(self.lamps):
                break
        self.steps = 0
        return self._obs(), {"valid": True}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        words = action.split()
        ok = len(words) == 2 and words[0] == "flip" and words[1].isascii() and words[1].isdigit()
        ok = ok and 1 <= int(words[1]) <= len(self.lamps)
        if ok:
            k = int(words[1]) - 1
            self.lamps[k] = not self.lamps[k]
        won = all(self.lamps)
        truncated = not won and self.steps >= len(self.lamps) + 2
        info = {"valid": ok, "success": won}
        obs = self._obs() if ok else "invalid action : use flip and a lamp number . " + self._obs()
        return obs, float(won), won, truncated, info

    # optional methods the credo adapter uses
    def instruction(self) -> str:
        return "turn every lamp on : flip k switches lamp k"

    def state_key(self) -> str:
        return "".join("1" if on else "0" for on in self.lamps)

    def oracle_action(self) -> str:
        return f"flip {self.lamps.index(False) + 1}"

    def sample_action(self, rng: random.Random) -> str:
        return f"flip {rng.randint(1, len(self.lamps))}"

    def vocabulary(self) -> list[str]:
        words = "lamps : on off invalid action use flip and a lamp number . turn every k switches"
        return [*words.split(), *(str(i) for i in range(1, self.vocabulary_lamps + 1))]


def register() -> None:
    """Add :data:`ENV_ID` to Gymnasium's registry (once)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=TextLightsEnv, max_episode_steps=8)
