"""Generation engines: what samples the rollouts, kept apart from what trains.

The trainer always scores and trains with its own :class:`~credo.policy.hf.HFPolicy`. The
*engine* (``rollout.engine``) is what generates the rollouts' responses:

``hf`` (default)
    the trainer's policy itself, in process (:class:`HFEngine`): today's sampler,
    unchanged, with its multi-turn KV reuse. Its sampling log-probs are the trainer's own
    up to floating-point summation order.
``vllm``
    a ``vllm.LLM`` built from the trainer's weights and re-synced after every update
    (:mod:`credo.policy.vllm_engine`; needs the ``vllm`` extra and a CUDA GPU).

Every engine implements :class:`GenerationEngine`: ``generate`` (prompt token ids →
:class:`~credo.policy.base.Generation` with the engine's own sampling log-probs),
``sync_weights`` (make the engine sample from the trainer's current weights; called once
after every update, before the next generation) and ``close``. Samplers never see the
engine directly: they get :class:`EngineView`, the trainer's policy whose ``generate``
goes through the engine (the ``hf`` engine hands out the policy itself).

Because the engine and the trainer are different programs (kernels, precision, batch
shapes), their log-probs of the same tokens differ; the trainer logs that mismatch every
iteration and can correct for it with truncated importance sampling
(:mod:`credo.objectives.tis`).

Adding an engine is one class registered with :func:`register_engine` (from its own
module, or here for the built-in ones), with a ``params`` dataclass of its knobs (``rollout.engine_params``) and a ``problem`` function
that says, without building anything, why it cannot run here (checked at config load).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from credo.policy.base import Generation, SamplingParams
from credo.policy.vllm_engine import VLLMEngine, VLLMParams, vllm_problem
from credo.utils.registry import Registry, check_kwargs, unknown_name_message

__all__ = [
    "ENGINES",
    "EngineView",
    "GenerationEngine",
    "HFEngine",
    "check_engine_config",
    "engine_in_process",
    "engine_names",
    "engine_params",
    "engine_problem",
    "make_engine",
    "register_engine",
]


@runtime_checkable
class GenerationEngine(Protocol):
    """What generates the rollouts' responses.

    Attributes:
        name: the registry name (``rollout.engine``).
    """

    name: str

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt (token id lists), all in one batch.

        Returns one :class:`Generation` per prompt: ``token_ids`` (the stop token included
        when one was produced) and ``logprobs`` ``[len(token_ids)]``, the engine's own
        log-probs of those tokens under the temperature-scaled distribution. Everything
        random derives from ``generator`` (same stream → same samples, on one engine)."""
        ...

    def sync_weights(self, policy: Any) -> None:
        """Make later ``generate`` calls sample from ``policy``'s current weights (full
        weights, or the base plus LoRA adapters)."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond Python memory (GPU memory, temp files)."""
        ...


EngineFactory = Callable[..., GenerationEngine]
ENGINES: Registry[EngineFactory] = Registry("engine")


def _no_problem(rollout: Any = None) -> str | None:
    return None


def register_engine(
    name: str,
    *,
    params: type | None = None,
    problem: Callable[[Any], str | None] = _no_problem,
    in_process: bool = False,
) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator: make a class (or factory) available as ``rollout.engine: <name>``.

    Args:
        name: the config name.
        params: the dataclass of its knobs (``rollout.engine_params``), or ``None``; the
            factory is called as ``factory(params_object)`` (``factory()`` without).
        problem: ``problem(rollout)`` says in one line why the engine cannot run with the
            config's ``rollout`` section (``None``: not checking settings) or on this
            machine (a missing package, no GPU), or returns ``None``; checked at config
            load, before compute. Settings come first: with settings it accepts, the
            line is the machine's, as with ``None``.
        in_process: it samples with the policy object it is given, nothing of its own
            (default false): asynchronous rollouts (``rollout.staleness``) then sample with
            copies of the trainer's weights.
    """
    return ENGINES.register(name, params=params, problem=problem, in_process=in_process)


def engine_in_process(name: str) -> bool:
    """Whether engine ``name`` samples with the policy object it is given (its
    registration's ``in_process``)."""
    return bool(ENGINES.meta(name)["in_process"])


def engine_names() -> list[str]:
    """The registered engine names."""
    return ENGINES.names()


def engine_params(name: str, params: Mapping[str, Any]) -> Any:
    """``rollout.engine_params`` → the engine's knobs object (``None`` for engines without
    knobs). Raises ``KeyError`` for an unknown engine and ``ValueError`` naming a bad key
    and the accepted ones."""
    cls = ENGINES.meta(name)["params"]
    if cls is None:
        if params:
            raise ValueError(f"engine {name!r} has no engine_params; got {sorted(params)}")
        return None
    check_kwargs("engine", name, cls, params)
    return cls(**params)


def engine_problem(name: str, rollout: Any = None) -> str | None:
    """Why engine ``name`` cannot run with these ``rollout`` settings (the config's
    ``rollout`` section; ``None``: the machine only) or on this machine, in one line, or
    ``None``."""
    return ENGINES.meta(name)["problem"](rollout)


def check_engine_config(rollout: Any, *, machine: bool = True) -> str | None:
    """The config check of ``rollout.engine`` and ``rollout.engine_params`` (one line, or
    ``None``): a registered name ("did you mean" otherwise), knobs its params class
    accepts, settings it supports, and (with ``machine``) a machine it can run on.

    Without ``machine`` the machine's own line is dropped: a ``problem`` function names
    the settings it refuses before the machine (see :func:`register_engine`), so a line
    that equals the machine-only answer is the machine's."""
    if rollout.engine not in ENGINES:
        return unknown_name_message("engine", rollout.engine, ENGINES.names())
    try:
        engine_params(rollout.engine, rollout.engine_params)
    except (ValueError, TypeError) as exc:
        return f"rollout.engine_params: {exc}"
    problem = engine_problem(rollout.engine, rollout)
    if not machine and problem is not None and problem == engine_problem(rollout.engine):
        return None
    return problem


def make_engine(name: str, params: Mapping[str, Any] | None = None) -> GenerationEngine:
    """Build engine ``name`` with ``rollout.engine_params`` ``params`` (no weights yet:
    the first :meth:`GenerationEngine.sync_weights` loads them).

    Raises:
        RuntimeError: the engine cannot run here (:func:`engine_problem`'s line).
    """
    knobs = engine_params(name, params or {})
    if problem := engine_problem(name, None):
        raise RuntimeError(problem)
    factory = ENGINES.get(name)
    return factory(knobs) if knobs is not None else factory()


@register_engine("hf", in_process=True)
class HFEngine:
    """The trainer's own policy as the engine (``rollout.engine: hf``, the default).

    Generation is :meth:`HFPolicy.generate <credo.policy.hf.HFPolicy.generate>` on the
    trainer's weights, so there is nothing to copy: :meth:`sync_weights` only points the
    engine at the policy object the trainer holds now (the warm start or LoRA may have
    replaced it). Samplers get the policy itself (:meth:`view`), so the default path is
    exactly today's, KV reuse included.
    """

    name = "hf"

    def __init__(self) -> None:
        self.policy: Any = None

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """The policy's own ``generate`` (see :class:`GenerationEngine`)."""
        if self.policy is None:
            raise RuntimeError("the hf engine has no policy yet: call sync_weights(policy)")
        return self.policy.generate(prompts, sampling, generator)

    def sync_weights(self, policy: Any) -> None:
        """Generate with ``policy`` from now on (its weights are shared, not copied)."""
        self.policy = policy

    def view(self, policy: Any) -> Any:
        """What samplers receive: the policy itself."""
        self.sync_weights(policy)
        return policy

    def close(self) -> None:
        """Nothing to release."""
        self.policy = None


# the vLLM engine (its module imports vLLM only when an engine is built)
register_engine("vllm", params=VLLMParams, problem=vllm_problem)(VLLMEngine)


class EngineView:
    """The trainer's policy as samplers see it when another engine generates.

    ``generate`` goes to the engine; the tokenizer, the pad id, the stop ids and
    ``logprobs`` are the trainer's. It offers no KV sessions (the engine keeps its own
    prefix cache), so samplers call ``generate`` without ``sessions``.

    Args:
        policy: the trainer's policy (an :class:`~credo.policy.hf.HFPolicy`).
        engine: the engine, already synced with ``policy``'s weights.
    """

    def __init__(self, policy: Any, engine: GenerationEngine) -> None:
        self.policy = policy
        self.engine = engine
        self.tokenizer = policy.tokenizer

    @property
    def pad_id(self) -> int:
        """The trainer's pad token id."""
        return int(self.policy.pad_id)

    @property
    def stop_ids(self) -> list[int]:
        """The token ids that end an action (the trainer's)."""
        return list(self.policy.stop_ids)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample with the engine (see :meth:`GenerationEngine.generate`)."""
        return self.engine.generate(prompts, sampling, generator)

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
    ) -> torch.Tensor:
        """The trainer's log-probs (see :meth:`Policy.logprobs`)."""
        return self.policy.logprobs(input_ids, attention_mask, temperature=temperature)
