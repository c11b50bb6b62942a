"""The run's parts: what an iteration runs besides the sampler, credit and the loss.

An iteration is one line (``docs/architecture.md``)::

    tasks ─► sampler ─► forest ─► [rewards] ─► credit ─► [batch transforms] ─► update ─► [after-update] ─► metrics

and each bracket is a list of **parts**, built once per run from the config. A part is a
:class:`Part` that overrides the stages it takes part in:

- :meth:`~Part.reward` changes the forest's rewards before credit (the KL reward
  penalty, a teacher's reward route, SERPO's judge);
- :meth:`~Part.transform` changes or extends the token batch before the update (SERO's
  oracle rows, RAPO's reference, a teacher's token route);
- :meth:`~Part.after_update` follows the new weights (the FSDP sampling copy, an EMA
  teacher);
- :meth:`~Part.report` adds to the iteration's record after it is timed (the periodic
  held-out evaluation);
- the update's own stages (:class:`~credo.train.update.UpdatePart`: the health
  statistics, the sampler/trainer mismatch and truncated IS, SERO's oracle term, the
  trust region).

A part that keeps state saves it with the checkpoints (:attr:`Part.checkpoint_key`,
:meth:`Part.state_dict`, :meth:`Part.write`, :meth:`Part.load`).

A part registers with what it needs::

    @register_part("name", when=lambda cfg: ..., needs={"reference"}, texts=..., check=...)
    class Name(Part):
        def __init__(self, ctx: PartContext) -> None: ...

``when(cfg)`` says whether the config asks for it; ``needs`` (or ``needs(cfg)``) what the
run must prepare for it (``"reference"``: the frozen reference); ``texts(cfg)`` the per-step
texts the sampler must record for it; ``check(cfg, run)`` checks its inputs before any run
folder exists (a teacher's folders against the student); ``unsharded`` (an
:class:`Unsharded`) that it cannot run where accelerate's FSDP or DeepSpeed ZeRO shard the
training state over the processes (the trust region copies the whole optimizer state;
SERO's oracle passes are not padded): such a run leaves it off with one printed line, or
is refused. The run asks the registry (:func:`run_needs`, :func:`rollout_texts`,
:func:`check_parts`, :func:`check_sharded`, :func:`build_parts`), never a part's name.
Within each stage the parts run in the order they registered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from credo.data import RolloutForest, TokenBatch
from credo.engines import Engine
from credo.engines import distributed as dp
from credo.envs.base import Task
from credo.objectives import loss_needs
from credo.rollout import RolloutResult
from credo.train.update import UpdateContext, UpdatePart, UpdateSettings
from credo.utils.registry import Registry

if TYPE_CHECKING:
    from credo.policy.hf import HFPolicy
    from credo.train.run import Run

#: The iteration's stages, in the order it runs them.
STAGES = ("reward", "transform", "after_update", "report")

#: The update's stages (:class:`~credo.train.update.UpdatePart`).
UPDATE_STAGES = (
    "prepare",
    "before_step",
    "weigh",
    "micro_metrics",
    "step_term",
    "step_metrics",
    "after_step",
    "finish",
)


@dataclass
class IterationData:
    """What one iteration's stages pass along; each stage reads and changes it.

    Attributes:
        it: the iteration.
        tasks: its tasks (task ``g`` is group ``g``).
        rollout: the sampler's result (its forest with SERO's oracle rows, if any).
        forest: the RL rows (oracle rows split off); the reward parts change its rewards.
        advantages: ``[N]`` per row, after credit.
        batch: the token batch the update trains on, after credit.
        metrics: what the parts report this iteration (added to its record).
    """

    it: int
    tasks: list[Task]
    rollout: RolloutResult
    forest: RolloutForest
    advantages: torch.Tensor | None = None
    batch: TokenBatch | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PartContext:
    """What a part may use when it is built (once per run).

    Attributes:
        cfg: the run's config (a part reads its own sections).
        run: the run (:class:`~credo.train.run.Run`: the renderer, the env factory, the
            held-out evaluator); ``None`` only for :func:`update_context`, which builds
            the parts that take part in the update alone.
        policy: the policy being trained (the sampling copy under FSDP).
        reference: the frozen reference, when :func:`run_needs` asked for one.
        engine: how the processes share the work.
        run_dir: the run folder (``None`` outside a run).
    """

    cfg: Any
    run: Run
    policy: HFPolicy
    reference: HFPolicy | None
    engine: Engine
    run_dir: Path | None = None


class Part(UpdatePart):
    """A part of the run (module docstring). Every stage is a no-op here."""

    #: The key of its JSON state in a checkpoint's ``state.json`` (``None``: it keeps none).
    checkpoint_key: ClassVar[str | None] = None

    def reward(self, data: IterationData) -> None:
        """Change ``data.forest``'s rewards before credit assignment."""

    def transform(self, data: IterationData) -> None:
        """Change or extend ``data.batch`` before the update."""

    def after_update(self, data: IterationData) -> None:
        """Follow the weights the update just changed."""

    def report(self, data: IterationData) -> None:
        """Add to ``data.metrics`` after the iteration is timed."""

    def state_dict(self) -> dict[str, Any]:
        """Its JSON state for a checkpoint (under :attr:`checkpoint_key`)."""
        return {}

    def write(self, folder: Path) -> None:
        """Write files of its own into checkpoint ``folder``."""

    def load(self, folder: Path, state: dict[str, Any] | None) -> None:
        """Restore what :meth:`state_dict` and :meth:`write` saved in checkpoint ``folder``
        (``state``: its JSON state, ``None`` when the checkpoint has none)."""


@dataclass(frozen=True)
class Unsharded:
    """A part's declaration that it cannot run where the training state is sharded over
    the processes (accelerate's FSDP, DeepSpeed ZeRO: :func:`credo.engines.distributed.sharded`).

    Attributes:
        setting: the config key that asks for the part (``"optim.max_kl"``), for messages.
        off: the value of ``setting`` that turns the part off (``"null"``, ``"0"``).
        why: what it needs that the engine does not give, as messages say it.
        refuse: ``True``: a sharded run with the part is refused before any work;
            ``False``: the part is left off and the run prints one line (a part on by
            default must not stop a sharded run).
    """

    setting: str
    off: str
    why: str
    refuse: bool = False

    def value(self, cfg: Any) -> Any:
        """The setting's value in ``cfg``."""
        for key in self.setting.split("."):
            cfg = getattr(cfg, key)
        return cfg


@dataclass(frozen=True)
class PartSpec:
    """A registered part and what it declared (:func:`register_part`)."""

    name: str
    build: Callable[[PartContext], Part | None]
    when: Callable[[Any], bool]
    needs: Callable[[Any], Iterable[str]]
    texts: Callable[[Any], Iterable[str]]
    check: Callable[[Any, Run], None] | None = None
    unsharded: Unsharded | None = None

    @property
    def update_only(self) -> bool:
        """A part class that takes part in the update's stages only (no iteration stage):
        :func:`update_context` builds it without a run."""
        cls = self.build
        return isinstance(cls, type) and not any(_overrides(cls, m) for m in STAGES)


PARTS: Registry[PartSpec] = Registry("part")


def _always(cfg: Any) -> bool:
    return True


def _nothing(cfg: Any) -> tuple[str, ...]:
    return ()


def register_part(
    name: str,
    *,
    when: Callable[[Any], bool] = _always,
    needs: Iterable[str] | Callable[[Any], Iterable[str]] = (),
    texts: Callable[[Any], Iterable[str]] = _nothing,
    check: Callable[[Any, Run], None] | None = None,
    unsharded: Unsharded | None = None,
) -> Callable[[Callable[[PartContext], Part | None]], Callable[[PartContext], Part | None]]:
    """Decorator: register a part class (or a function ``build(ctx) -> Part | None``).

    Args:
        name: the part's name (checkpoints and messages).
        when: ``when(cfg)``: whether the config asks for it (default: always).
        needs: what the run must prepare for it, or a function of the config giving it.
        texts: ``texts(cfg)``: the per-step texts the sampler must record for it.
        check: ``check(cfg, run)``: raise ``ValueError`` on bad inputs, before any run
            folder exists.
        unsharded: it cannot run on sharded state (:class:`Unsharded`): left off, or
            refused, under FSDP or ZeRO (default: it runs sharded too).
    """
    need_fn = needs if callable(needs) else (lambda cfg, fixed=tuple(needs): fixed)

    def deco(build: Callable[[PartContext], Part | None]) -> Callable[[PartContext], Part | None]:
        PARTS.register(name)(PartSpec(name, build, when, need_fn, texts, check, unsharded))
        return build

    return deco


def _asked(cfg: Any) -> list[PartSpec]:
    """The registered parts the config asks for, in registration order."""
    return [spec for spec in (PARTS.get(n) for n in PARTS.registered()) if spec.when(cfg)]


def _configured(cfg: Any) -> list[PartSpec]:
    """The parts the config asks for that this run can build: on sharded optimizer state,
    without those declared :class:`Unsharded` (refused ones stop at :func:`check_sharded`)."""
    sharded = dp.sharded()
    return [spec for spec in _asked(cfg) if not (sharded and spec.unsharded is not None)]


def check_sharded(cfg: Any, what: str) -> list[str]:
    """For a run whose optimizer state ``what`` (the engine's name) shards: raise for a
    configured part declared ``Unsharded(refuse=True)``, and return one line for each one
    left off (the run prints them once).

    Raises:
        ValueError: in one line, naming the setting and how to turn it off.
    """
    lines = []
    for spec in _asked(cfg):
        rule = spec.unsharded
        if rule is None:
            continue
        asked = f"{rule.setting}={rule.value(cfg)}"
        if rule.refuse:
            raise ValueError(
                f"{asked} ({spec.name}) with {what} is not supported: {rule.why}; use plain "
                f"data parallelism or {rule.setting}={rule.off}"
            )
        lines.append(
            f"{asked} is off with {what}: {rule.why} ({rule.setting}={rule.off} silences this)"
        )
    return lines


def run_needs(cfg: Any) -> set[str]:
    """What the run must prepare: what the loss registered in ``needs``, what the
    configured parts declared, and the reference a KL loss term reads
    (``objective.kl_coef`` > 0)."""
    needs = set(loss_needs(cfg.objective.loss))
    for spec in _configured(cfg):
        needs |= set(spec.needs(cfg))
    if cfg.objective.kl_coef > 0:  # the update's own KL term
        needs.add("reference")
    return needs


def check_parts(cfg: Any, run: Run) -> None:
    """Run the configured parts' checks (before any run folder exists)."""
    for spec in _configured(cfg):
        if spec.check is not None:
            spec.check(cfg, run)


def rollout_texts(cfg: Any) -> tuple[str, ...]:
    """The per-step texts the sampler must record (``SamplerContext.texts``) for the
    configured parts, in their order, without repeats."""
    names: list[str] = []
    for spec in _configured(cfg):
        names += [n for n in spec.texts(cfg) if n not in names]
    return tuple(names)


@dataclass
class Parts:
    """The run's parts, built once (:func:`build_parts`), and each stage's list: the parts
    that override its method, in registration order."""

    all: dict[str, Part]
    reward: list[Part] = field(init=False)
    transform: list[Part] = field(init=False)
    after_update: list[Part] = field(init=False)
    report: list[Part] = field(init=False)
    update: list[Part] = field(init=False)

    def __post_init__(self) -> None:
        for stage in STAGES:
            setattr(self, stage, [p for p in self.all.values() if _overrides(p, stage)])
        # the update's: they override one of its stages or merge metrics of their own
        self.update = [
            p for p in self.all.values() if p.merge or any(_overrides(p, m) for m in UPDATE_STAGES)
        ]

    def get(self, name: str) -> Part | None:
        return self.all.get(name)


def _overrides(part: Part | type, method: str) -> bool:
    cls = part if isinstance(part, type) else type(part)
    return getattr(cls, method) is not getattr(Part, method)


def build_parts(ctx: PartContext) -> Parts:
    """Build the parts ``ctx.cfg`` asks for, in registration order (a build may still
    return ``None``: e.g. the FSDP sampling copy without FSDP)."""
    built = {spec.name: spec.build(ctx) for spec in _configured(ctx.cfg)}
    return Parts({name: part for name, part in built.items() if part is not None})


def update_context(
    cfg: Any,
    policy: HFPolicy,
    optimizer: torch.optim.Optimizer,
    reference: HFPolicy | None = None,
    *,
    engine: Engine | None = None,
) -> UpdateContext:
    """The update's context for ``cfg`` outside a run (tests, benchmarks, other
    frameworks calling :func:`~credo.train.update.policy_update`): its settings and the
    configured parts that take part in the update only (the health statistics, the
    sampler/trainer mismatch and truncated IS, the trust region)."""
    engine = engine if engine is not None else Engine()
    ctx = PartContext(cfg, None, policy, reference, engine)  # type: ignore[arg-type]
    parts = [spec.build(ctx) for spec in _configured(cfg) if spec.update_only]
    return UpdateContext(
        policy,
        optimizer,
        UpdateSettings.from_config(cfg),
        reference,
        engine,
        [p for p in parts if p is not None],
    )
