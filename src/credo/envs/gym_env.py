"""``gym``: any Gymnasium env whose observations and actions are text, through the standard
``reset``/``step`` API.

`Gymnasium <https://gymnasium.farama.org>`_ is the standard RL env API. This adapter
plays a Gymnasium env as a credo env, given its registered id::

    credo train --env gym:credo/TextLights-v0          # env=gym:ENV_ID
    credo play --env gym env.kwargs.env_id=credo/TextLights-v0
    credo check-env --env gym:my_package:MyTextEnv-v0  # Gymnasium's module:id form

(``env.name=gym:ENV_ID`` in a config file.) Install it with ``pip install
'credo[gym]'``; without the package the env refuses to start with one line that says so.
The package ships one small text env written with Gymnasium's API,
``credo/TextLights-v0`` (:mod:`credo.envs.gym_lights`), registered on first use.

**Spaces** (the documented mapping):

- observations: a :class:`~gymnasium.spaces.Text` space (the observation is the text), or
  a :class:`~gymnasium.spaces.Discrete` one (``"state <n>"``);
- actions: a :class:`~gymnasium.spaces.Text` space: the action text is passed as it is
  (stripped) when the space contains it, else it is an invalid action that never reaches
  the env (too long, a character outside the charset); or a
  :class:`~gymnasium.spaces.Discrete` space with ``action_names`` (one word or phrase per
  action index): the text names an action.

Other spaces are refused at construction with the spaces found.

**Tasks**: ``task.seed`` is the ``seed`` of ``reset`` (train and held-out seeds never
overlap). **Steps**: the env's reward is the step reward; ``done`` is ``terminated or
truncated`` or credo's turn limit (``max_turns``, default: the env's
``max_episode_steps``, else 50); ``info["valid"]`` is the env's own ``info["valid"]``
when it sets one, else True for actions in the space. **Success** (on the last step) is
the env's ``info["success"]`` (or ``info["is_success"]``) when it sets one, else
"terminated with a positive reward".

**Snapshots** are deep copies of the Gymnasium env (with its wrappers and RNG), which
works for envs written in Python. An env that holds a process or a socket should not be
branched (use the group sampler).

**Optional methods**: when the unwrapped env has ``state_key()`` it is the state key
(else the observation is); when it has ``instruction()``, ``oracle_action()``,
``sample_action(rng)`` or ``vocabulary()``, the adapter offers them to credo (the oracle
enables the warm start); with ``Discrete`` actions and ``action_names``, a random
action name is the plausible actor and the names are in the vocabulary. Teacher-only
text (``privileged_context(kind)``, read by self-teachers such as Rényi OPSD's) is the
env's own method when it has one, else the oracle's next action for ``"oracle"``.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env
from credo.envs.thirdparty import missing_package, register_env_scheme

__all__ = ["DEFAULT_ENV_ID", "MAX_OBSERVATION_CHARS", "GymEnv"]

#: The env the adapter plays when no id is given (shipped with credo).
DEFAULT_ENV_ID = "credo/TextLights-v0"
#: Observations are cut to this many characters.
MAX_OBSERVATION_CHARS = 4000
#: Action text longer than this never reaches the env (an invalid action).
MAX_ACTION_CHARS = 10_000
_OPTIONAL = ("instruction", "oracle_action", "sample_action", "vocabulary")
#: Read from the unwrapped env when it has them.
_STATE_KEY = "state_key"


def _gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise missing_package("gymnasium", "gym", "gym") from None
    from credo.envs import gym_lights

    gym_lights.register()
    return gymnasium


@register_env("gym")
class GymEnv:
    """A Gymnasium text env (see the module docstring).

    Args:
        env_id: the Gymnasium id (default :data:`DEFAULT_ENV_ID`); ``module:Id`` imports
            ``module`` first, as ``gymnasium.make`` does.
        max_turns: credo's turn limit (default: the spec's ``max_episode_steps``, else 50).
        action_names: for a ``Discrete`` action space, the text of each action index.
        make_kwargs: keyword arguments for ``gymnasium.make``.
    """

    def __init__(
        self,
        env_id: str = DEFAULT_ENV_ID,
        *,
        max_turns: int | None = None,
        action_names: list[str] | None = None,
        make_kwargs: dict[str, Any] | None = None,
    ) -> None:
        gym = _gymnasium()
        spaces = gym.spaces
        try:
            self._env = gym.make(env_id, **(make_kwargs or {}))
        except gym.error.Error as exc:
            raise ValueError(f"gym: cannot make {env_id!r}: {exc}") from None
        except ImportError as exc:  # ``module:Id`` whose module is not importable
            raise ValueError(
                f"gym: cannot make {env_id!r}: {exc} (the module is looked up on the Python "
                "path, the working folder included)"
            ) from None
        self.env_id = env_id
        obs_space, act_space = self._env.observation_space, self._env.action_space
        if not isinstance(obs_space, (spaces.Text, spaces.Discrete)):
            raise ValueError(
                f"gym env {env_id!r} has observation space {obs_space}; the gym adapter needs "
                "Text (or Discrete, shown as 'state <n>')"
            )
        self._names: list[str] | None = None
        if isinstance(act_space, spaces.Discrete):
            if not action_names or len(action_names) != int(act_space.n):
                raise ValueError(
                    f"gym env {env_id!r} has action space {act_space}: pass action_names, one "
                    f"text per action ({int(act_space.n)} names)"
                )
            self._names = [" ".join(str(n).lower().split()) for n in action_names]
        elif not isinstance(act_space, spaces.Text):
            raise ValueError(
                f"gym env {env_id!r} has action space {act_space}; the gym adapter needs Text "
                "(or Discrete with action_names)"
            )
        spec_limit = getattr(self._env.spec, "max_episode_steps", None)
        turns = max_turns if max_turns is not None else spec_limit or 50
        if not isinstance(turns, int) or turns < 1:
            raise ValueError(f"gym max_turns must be a positive integer, got {turns!r}")
        self.max_turns = turns
        self._turn, self._done = 0, False
        self.task: Task | None = None
        inner = self._env.unwrapped
        for name in _OPTIONAL:  # offered only when the env has them
            if callable(getattr(inner, name, None)):
                setattr(self, name, getattr(self, f"_{name}"))
        if self._names is not None:
            self.sample_action = self._sample_name
            self.vocabulary = self._vocabulary
        if callable(getattr(inner, "privileged_context", None)) or callable(
            getattr(inner, "oracle_action", None)
        ):
            self.privileged_context = self._privileged_context

    def _observe(self, obs: Any) -> str:
        text = obs if isinstance(obs, str) else f"state {int(obs)}"
        return text[:MAX_OBSERVATION_CHARS]

    def reset(self, task: Task, seed: int = 0) -> str:
        """``env.reset(seed=task.seed)`` (``seed`` is unused)."""
        self.task = task
        obs, _ = self._env.reset(seed=task.seed)
        self._turn, self._done = 0, False
        self._last = self._observe(obs)
        return self._last

    def _to_env(self, action: str) -> Any:
        """The env's action for ``action``, or ``None`` if it is not in the space."""
        if len(action) > MAX_ACTION_CHARS:
            return None
        text = " ".join(action.lower().split()) if self._names is not None else action.strip()
        if self._names is not None:
            return self._names.index(text) if text in self._names else None
        return text if self._env.action_space.contains(text) else None

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        self._turn += 1
        move = self._to_env(action)
        if move is None:
            obs, reward, terminated, truncated = self._last_obs(), 0.0, False, False
            info: dict[str, Any] = {"valid": False}
            obs = f"invalid action : not in the action space . {obs}"[:MAX_OBSERVATION_CHARS]
        else:
            raw, reward, terminated, truncated, env_info = self._env.step(move)
            obs = self._observe(raw)
            self._last = obs
            info = {"valid": bool(env_info.get("valid", True))}
            info["success"] = bool(
                env_info.get("success", env_info.get("is_success", terminated and reward > 0))
            )
        self._done = bool(terminated or truncated or self._turn >= self.max_turns)
        if self._done:
            info.setdefault("success", False)
            info["turns"] = self._turn
        else:
            info.pop("success", None)
        return StepResult(obs, float(reward), self._done, info)

    def _last_obs(self) -> str:
        return getattr(self, "_last", "")

    def state_key(self) -> str:
        """The unwrapped env's ``state_key()`` when it has one, else the current
        observation (a text env's state as the agent sees it); prefixed ``done|`` once
        the episode is over."""
        inner = self._env.unwrapped
        key = str(inner.state_key()) if callable(getattr(inner, _STATE_KEY, None)) else None
        key = self._last_obs() if key is None else key
        return f"done|{key}" if self._done else key

    def snapshot(self) -> tuple[Any, ...]:
        return (copy.deepcopy(self._env), self._turn, self._done, self._last_obs())

    def restore(self, snap: tuple[Any, ...]) -> None:
        env, self._turn, self._done, self._last = snap
        self._env = copy.deepcopy(env)

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """Any reset seed is a task of the same env: a fresh seed."""
        return Task("train", find_variant_seed(rng, lambda s: True))

    #: What ``check-env`` advises when no word the env prints is an action: the adapter
    #: reads these methods from the Gymnasium env itself (its ``action_format`` is the
    #: adapter's own, so listing actions there is not the user's option).
    actions_advice = (
        "Add vocabulary() (every word it prints or accepts) or sample_action(rng) (a random "
        "valid action) to the Gymnasium env class (the gym adapter reads them from "
        "env.unwrapped), or use a Discrete action space with env.kwargs.action_names; add "
        "oracle_action() too for a warm start"
    )

    def action_format(self) -> str:
        if self._names is not None:
            return "Reply with exactly one action: " + ", ".join(self._names) + "."
        return "Reply with exactly one action as text."

    # optional methods, bound in __init__ when the env has them
    def _instruction(self) -> str:
        return str(self._env.unwrapped.instruction())

    def _oracle_action(self) -> str:
        return str(self._env.unwrapped.oracle_action())

    def _privileged_context(self, kind: str) -> str | None:
        """The Gymnasium env's own ``privileged_context(kind)`` when it has one; else, for
        ``"oracle"``, its ``oracle_action()`` (the next action of its solver, the text the
        built-in envs give; ``None`` once the episode is over)."""
        inner = self._env.unwrapped
        if callable(getattr(inner, "privileged_context", None)):
            text = inner.privileged_context(kind)
            return None if text is None else str(text)
        if kind != "oracle" or self._done:
            return None
        return str(inner.oracle_action())

    def _sample_action(self, rng: random.Random) -> str:
        return str(self._env.unwrapped.sample_action(rng))

    def _sample_name(self, rng: random.Random) -> str:
        return rng.choice(self._names or [""])

    def _vocabulary(self) -> list[str]:
        inner = self._env.unwrapped
        words = list(inner.vocabulary()) if callable(getattr(inner, "vocabulary", None)) else []
        for name in self._names or []:
            words += name.split()
        return [*words, "invalid", "action", ":", "not", "in", "the", "space", ".", "state"]


register_env_scheme("gym", lambda env_id: lambda **kw: GymEnv(env_id, **kw))
