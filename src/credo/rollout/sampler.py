"""The sampler registry and the context every sampler shares.

A sampler turns a list of tasks into a :class:`~credo.rollout.group.RolloutResult` (a
forest of steps plus the episodes). Every sampler is a function

.. code-block:: python

    @register_sampler("name", params=NameParams, state=make_state)
    def sample_name(ctx: SamplerContext, tasks, *, group_size, params=None, state=None):
        ...

``ctx`` (:class:`SamplerContext`) is what all samplers share: the policy, the renderer,
the env factory, the sampling parameters, the turn cap and the random streams.
``group_size`` is the config's ``rollout.group_size`` (G episodes per task, or the tree's
budget of leaves). ``params`` is the sampler's own knobs object, built from
``rollout.sampler_params`` by :func:`sampler_params` (a dataclass; unknown keys fail at
config load). A sampler that learns across iterations declares ``state=factory``:
``factory(params)`` returns an object with ``state_dict()``/``load_state_dict()`` (or
``None`` when these params keep no state); the trainer builds it once, passes it on every
call and saves it in checkpoints.

What else a sampler declares when it registers (:class:`SamplerSpec`), so that the
trainer asks the registry instead of the sampler's name:

- ``branches=True``: it restarts episodes from env snapshots (``tree``, ``resample``), so
  the env's snapshot round trip is checked before any compute;
- ``check=fn``: ``fn(cfg) -> message | None``, what it needs from the rest of the config,
  checked at load;
- ``configure=fn``: ``fn(cfg) -> params``, its knobs from config fields of its own
  (the ``agent`` sampler's ``rollout.agent*``) instead of ``rollout.sampler_params``;
- ``run_state=True``: its state lives as long as the run, not the training state (the
  agent's policy server): the run builds it once, evaluates through it
  (``evaluate(policy, sampling, episodes=, seed=)``), tells it of new weights
  (``weights_updated()``) and closes it (``close()``).

Adding a sampler is one file with a registered function (imported by
``credo/rollout/__init__.py``, or by your own code before the config loads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from credo.policy.base import Policy, SamplingParams
from credo.utils.registry import Registry, check_kwargs

if TYPE_CHECKING:
    from credo.envs.base import Task
    from credo.rollout.group import RolloutResult
    from credo.rollout.render import Renderer

__all__ = [
    "SAMPLERS",
    "SamplerContext",
    "SamplerSpec",
    "make_sampler_state",
    "register_sampler",
    "sample",
    "sampler_names",
    "sampler_params",
    "sampler_spec",
]

Sampler = Callable[..., "RolloutResult"]
SAMPLERS: Registry[Sampler] = Registry("sampler")


@dataclass
class SamplerContext:
    """What every sampler needs besides its tasks.

    Attributes:
        policy: samples the actions.
        renderer: builds prompts and parses actions.
        make_env: creates a fresh env (one per episode or branch).
        sampling: sampling parameters of the policy.
        max_turns: the turn cap of every path, counted from its root (envs usually end
            episodes earlier).
        generator: torch RNG of the policy's sampling (``None``: torch's global RNG).
        choices: torch RNG of the sampler's own random choices (branch nodes, oracle
            start states), kept apart from ``generator`` so that an add-on never changes
            the policy's samples (default: seeded with 0).
        invalid_penalty: subtracted from the reward of an invalid action (GiGPO's −c).
        on_divergence: what branching samplers do when a restored env does not
            reproduce the recorded observation: ``error`` or ``skip``
            (:mod:`credo.rollout.branch`).
        env_seed: seed passed to ``env.reset``.
        keep_snapshots: keep an env snapshot before every step in the result's
            trajectories, so that add-ons (oracle continuations) can branch from any step.
        texts: names of the per-step texts to record in ``Step.texts`` (and the forest's
            ``texts``) for a teacher (default none): ``instruction`` (the goal shown), or
            a privileged kind asked from the env before the action (``oracle``,
            ``feedback``, ``solution``; :func:`credo.envs.base.privileged_context`).
    """

    policy: Policy
    renderer: Renderer
    make_env: Callable[[], Any]
    sampling: SamplingParams
    max_turns: int
    generator: torch.Generator | None = None
    choices: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    invalid_penalty: float = 0.0
    on_divergence: str = "error"
    env_seed: int = 0
    keep_snapshots: bool = False
    texts: tuple[str, ...] = ()


def register_sampler(
    name: str,
    *,
    params: type | None = None,
    state: Callable[[Any], Any] | None = None,
    branches: bool = False,
    check: Callable[[Any], str | None] | None = None,
    configure: Callable[[Any], Any] | None = None,
    run_state: bool = False,
) -> Callable[[Sampler], Sampler]:
    """Decorator: make ``fn`` available as ``rollout.sampler: <name>`` in configs.

    Args:
        name: the config name.
        params: the dataclass of its knobs (``rollout.sampler_params``), or ``None``.
        state: ``factory(params) -> state | None`` for a sampler that keeps state across
            iterations.
        branches: it restarts episodes from env snapshots (module docstring).
        check: ``check(cfg) -> message | None``, checked at config load.
        configure: ``configure(cfg) -> params``, its knobs from its own config fields.
        run_state: its state lives as long as the run (module docstring).
    """
    return SAMPLERS.register(
        name,
        params=params,
        state=state,
        branches=branches,
        check=check,
        configure=configure,
        run_state=run_state,
    )


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampler declared when it registered (:func:`register_sampler`)."""

    name: str
    params: type | None
    state: Callable[[Any], Any] | None
    branches: bool
    check: Callable[[Any], str | None] | None
    configure: Callable[[Any], Any] | None
    run_state: bool


def sampler_spec(name: str) -> SamplerSpec:
    """The declarations of sampler ``name`` (a ``KeyError`` naming the valid ones
    otherwise)."""
    return SamplerSpec(name, **SAMPLERS.meta(name))


def sampler_names() -> list[str]:
    return SAMPLERS.names()


def sampler_params(name: str, params: Mapping[str, Any]) -> Any:
    """``rollout.sampler_params`` → the sampler's knobs object (``None`` for samplers
    without knobs). Raises ``ValueError`` naming the bad key or value and the accepted
    keys."""
    cls = SAMPLERS.meta(name)["params"]
    if cls is None:
        if params:
            raise ValueError(f"sampler {name!r} has no sampler_params; got {sorted(params)}")
        return None
    check_kwargs("sampler", name, cls, params)
    return cls(**params)


def make_sampler_state(name: str, params: Any) -> Any | None:
    """The state sampler ``name`` keeps across iterations with these ``params`` (from
    :func:`sampler_params`), or ``None``."""
    factory = SAMPLERS.meta(name)["state"]
    return factory(params) if factory is not None else None


def sample(
    name: str,
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: Any = None,
    state: Any = None,
) -> RolloutResult:
    """Run sampler ``name`` on ``tasks``; task ``i`` becomes group ``i``."""
    if params is None and SAMPLERS.meta(name)["params"] is not None:
        params = SAMPLERS.meta(name)["params"]()
    return SAMPLERS.get(name)(ctx, tasks, group_size=group_size, params=params, state=state)
