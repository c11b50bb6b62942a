"""Config validation: everything that can be checked before any compute, one small
function per section.

:func:`validate` runs at load time (:meth:`~credo.train.config.schema.Config.from_dict`),
before a run folder exists. It checks registry names (with "did you mean"), each method's
own knobs (an estimator's, a loss's, an aggregation's, a sampler's ``params``), what a
method declares it needs when it registers (e.g. KLPO's sampler draws: see
:func:`credo.objectives.registry.register_loss`'s ``requires``), numeric ranges,
combinations of settings, that the env can be imported and that a requested device
exists. Every error is a :class:`~credo.train.config.schema.ConfigError` whose message
names the key, the value and what is accepted.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from credo.policy.base import MIN_TEMPERATURE
from credo.train.config.errors import ConfigError
from credo.utils.registry import unknown_name_message

if TYPE_CHECKING:
    from credo.train.config.schema import Config

__all__ = ["RUN_NAME", "machine_checks", "validate"]

#: Whether validation also asks this machine (an engine's package, a CUDA device, a
#: fitted judge's folder and rubric file): on by default; :func:`machine_checks` turns it
#: off where a config is only read, not run (a study index built in credo's own venv for
#: an arm that samples with vLLM, or whose judge is not fitted yet).
_MACHINE: ContextVar[bool] = ContextVar("credo_machine_checks", default=True)


@contextmanager
def machine_checks(on: bool) -> Iterator[None]:
    """Within the block, validation checks this machine's packages, devices and a
    judge's files only if ``on``; everything else (names, values, settings an engine
    refuses) is checked either way."""
    token = _MACHINE.set(on)
    try:
        yield
    finally:
        _MACHINE.reset(token)


#: What ``train.name`` may be: one folder name under ``train.runs_dir`` (letters, digits,
#: ``_``, ``-`` and ``.``, not starting with ``.`` or ``-``), never a path: no separator,
#: no ``..``, nothing absolute.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def validate(cfg: Config) -> None:
    """Check the whole config; raise :class:`ConfigError` at the first problem."""
    for check in SECTION_CHECKS:
        check(cfg)


def _choice(key: str, value: str, valid: Any) -> None:
    if value not in valid:
        raise ConfigError(f"{key} must be one of {', '.join(valid)}, got {value!r}")


def _at_least(bound: float, values: dict[str, float | None]) -> None:
    for key, value in values.items():
        if value is not None and value < bound:
            raise ConfigError(f"{key} must be ≥ {bound:g}, got {value}")


def _in_range(key: str, value: float, low: float, high: float, *, open_low: bool = False) -> None:
    if (value <= low if open_low else value < low) or value > high:
        bracket = "(" if open_low else "["
        raise ConfigError(f"{key} must be in {bracket}{low:g}, {high:g}], got {value}")


def _registered(registry: Any, name: str, params_key: str, check: Callable[[], None]) -> None:
    """``name`` is in ``registry`` ("did you mean" otherwise) and ``check()`` accepts its
    knobs (the error then names ``params_key``)."""
    if name not in registry:
        raise ConfigError(unknown_name_message(registry.kind, name, registry.names()))
    try:
        check()
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{params_key}: {e}") from None


def _env(cfg: Config) -> None:
    from credo.envs.base import ENVS, env_names, resolve_env

    name = cfg.env.name
    if ":" not in name and name not in env_names():
        raise ConfigError(
            unknown_name_message("env", name, ENVS.names()) + " (or an import path 'module:Class')"
        )
    try:
        resolve_env(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"env.name={name!r}: {exc}") from None


def _env_has(cfg: Config, method: str) -> bool:
    """The env class of ``env.name`` has ``method`` (true when it does not resolve:
    :func:`_env` says why)."""
    from credo.envs.base import resolve_env

    try:
        return callable(getattr(resolve_env(cfg.env.name), method, None))
    except Exception:
        return True


def _env_workers(cfg: Config) -> None:
    """``rollout.env_workers`` and its Ray settings (Ray itself is checked when N ≥ 2)."""
    r = cfg.rollout
    for key, value in (("env_workers", r.env_workers), ("env_retries", r.env_retries)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"rollout.{key} must be an integer ≥ 0, got {value!r}")
    t = r.env_timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
        raise ConfigError(f"rollout.env_timeout_s must be a number of seconds > 0, got {t!r}")
    if r.ray_address is not None and (not isinstance(r.ray_address, str) or not r.ray_address):
        raise ConfigError(
            f"rollout.ray_address must be a Ray address (e.g. auto, ray://head:10001) or "
            f"null for a local Ray, got {r.ray_address!r}"
        )
    if r.env_workers < 2:
        return
    if r.step_timeout and t >= r.step_timeout:
        raise ConfigError(
            f"rollout.env_timeout_s={t:g} must be below rollout.step_timeout="
            f"{r.step_timeout:g} (a hung worker is replaced before the episode times out)"
        )
    if r.agent:
        raise ConfigError(
            "rollout.env_workers applies to the env loop; an agent run (rollout.agent) has no "
            "credo envs: set rollout.env_workers=0"
        )
    try:
        from credo.rollout.ray_envs import require_ray

        require_ray(f"rollout.env_workers={r.env_workers}")
    except ImportError as exc:
        raise ConfigError(str(exc)) from None


def _model(cfg: Config) -> None:
    m = cfg.model
    _choice("model.dtype", m.dtype, ("float32", "bfloat16", "float16", "auto"))
    if m.mixed_precision is not None:
        _choice("model.mixed_precision", m.mixed_precision, ("bf16",))
    if m.mixed_precision is not None and m.dtype != "float32":
        raise ConfigError(
            f"model.mixed_precision={m.mixed_precision} keeps float32 weights and runs the "
            f"products in bfloat16, but model.dtype={m.dtype}: set model.dtype=float32 "
            "(or model.mixed_precision=null)"
        )
    if m.device.startswith("cuda"):
        import torch

        if _MACHINE.get() and not torch.cuda.is_available():
            raise ConfigError(
                f"model.device={m.device} but this torch build sees no CUDA device "
                f"(torch {torch.__version__}); use model.device=cpu or auto"
            )
    elif m.device not in ("cpu", "auto") and not m.device.startswith("mps"):
        raise ConfigError(f"model.device must be cpu, cuda, cuda:N or auto, got {m.device!r}")
    if m.name is not None and _looks_like_path(m.name) and not Path(m.name).expanduser().exists():
        raise ConfigError(f"model.name={m.name!r}: no such folder")


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1


#: tokens of the built-in model's context kept for the current observation, the goal and
#: the action when ``rollout.history_tokens`` is set.
HISTORY_ROOM = 128


def _rollout(cfg: Config) -> None:
    import credo.agent  # noqa: F401  (registers the agent sampler)
    from credo.rollout import DIVERGENCE_POLICIES, ORACLE_STARTS, SAMPLERS, sampler_params

    r = cfg.rollout
    if r.sampler not in SAMPLERS:
        raise ConfigError(unknown_name_message("sampler", r.sampler, SAMPLERS.names()))
    try:
        sampler_params(r.sampler, r.sampler_params)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"rollout.sampler_params: {e}") from None
    _choice("rollout.oracle_start", r.oracle_start, ORACLE_STARTS)
    _choice("rollout.on_restore_divergence", r.on_restore_divergence, DIVERGENCE_POLICIES)
    _at_least(
        1,
        {
            "rollout.tasks_per_iter": r.tasks_per_iter,
            "rollout.group_size": r.group_size,
            "rollout.max_new_tokens": r.max_new_tokens,
            "rollout.train_tasks": r.train_tasks,
            "rollout.oracle_per_group": r.oracle_per_group,
            "rollout.max_turns": r.max_turns,
        },
    )
    if 0 < r.temperature < MIN_TEMPERATURE:
        raise ConfigError(
            f"rollout.temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got "
            f"{r.temperature} (the logits are divided by it, and overflow below that)"
        )
    _at_least(
        0,
        {
            "rollout.temperature": r.temperature,
            "rollout.oracle_horizon": r.oracle_horizon,
            "rollout.history_turns": r.history_turns,
            "rollout.history_tokens": r.history_tokens,
            "rollout.chat_examples": r.chat_examples,
            "rollout.aux_samples": r.aux_samples,
            "rollout.topk_logprobs": r.topk_logprobs,
            "rollout.kv_cache_mb": r.kv_cache_mb,
        },
    )
    _in_range("rollout.top_p", r.top_p, 0, 1, open_low=True)
    room = cfg.model.tiny.max_position_embeddings - HISTORY_ROOM
    if cfg.model.name is None and r.history_tokens > room:
        raise ConfigError(
            f"rollout.history_tokens={r.history_tokens} does not fit the built-in model's "
            f"context (model.tiny.max_position_embeddings="
            f"{cfg.model.tiny.max_position_embeddings} leaves {max(0, room)} after "
            f"{HISTORY_ROOM} for the observation, goal and action); lower it or raise "
            f"model.tiny.max_position_embeddings to {r.history_tokens + HISTORY_ROOM}"
        )
    if r.step_timeout is not None and (
        isinstance(r.step_timeout, bool)
        or not isinstance(r.step_timeout, (int, float))
        or not 0 <= r.step_timeout < float("inf")
    ):
        raise ConfigError(
            f"rollout.step_timeout must be a number of seconds ≥ 0 (0 or null: no limit), "
            f"got {r.step_timeout!r}"
        )
    _env_workers(cfg)
    if r.train_tasks < r.tasks_per_iter:
        raise ConfigError(
            f"rollout.train_tasks={r.train_tasks} is smaller than rollout.tasks_per_iter="
            f"{r.tasks_per_iter}: each iteration draws that many distinct training tasks"
        )
    _sampler_needs(cfg)
    _staleness(cfg)
    from credo.policy.engine import check_engine_config

    if problem := check_engine_config(r, machine=_MACHINE.get()):
        raise ConfigError(problem)


def _staleness(cfg: Config) -> None:
    """``rollout.staleness`` (asynchronous rollouts, :mod:`credo.train.async_rollouts`):
    a count ≥ 0; above 0, what the queue can sample ahead without changing results."""
    from credo.policy.engine import engine_in_process, engine_names
    from credo.rollout import sampler_spec

    r = cfg.rollout
    k = r.staleness
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError(
            f"rollout.staleness must be an integer ≥ 0 (0: synchronous, k: rollouts "
            f"sampled by weights up to k updates old), got {k!r}"
        )
    if r.async_worker not in ("thread", "process"):
        raise ConfigError(f"rollout.async_worker must be thread or process, got {r.async_worker!r}")
    if r.async_worker == "process" and "fork" not in multiprocessing.get_all_start_methods():
        raise ConfigError(
            "rollout.async_worker=process forks the trainer, which this platform cannot "
            "do (use rollout.async_worker=thread)"
        )
    if k == 0:
        return
    if r.async_worker == "process" and cfg.model.device != "cpu":
        raise ConfigError(
            f"rollout.async_worker=process samples in a fork of the trainer, which CUDA "
            f"does not allow; model.device={cfg.model.device!r} (use the thread worker, "
            "or model.device=cpu)"
        )
    spec = sampler_spec(r.sampler_in_use)
    if spec.run_state or spec.state is not None:
        raise ConfigError(
            f"rollout.staleness={k} needs a sampler without state across iterations; "
            f"{r.sampler_in_use!r} keeps one (use rollout.sampler=group, single or "
            "resample, or rollout.staleness=0)"
        )
    if (
        r.async_worker == "process"
        and r.engine in engine_names()
        and not engine_in_process(r.engine)
    ):
        raise ConfigError(
            f"rollout.async_worker=process needs an engine that samples with the trainer's "
            f"own model (rollout.engine=hf), got {r.engine!r} (use the thread worker: it "
            "syncs the engine with each version's weights before sampling)"
        )


def _sampler_needs(cfg: Config) -> None:
    """What the sampler in use (``rollout.sampler``, or ``agent`` with ``rollout.agent``)
    registered as its ``check`` of the rest of the config."""
    from credo.rollout import SAMPLERS, sampler_spec

    name = cfg.rollout.sampler_in_use
    if name not in SAMPLERS:
        raise ConfigError(unknown_name_message("sampler", name, SAMPLERS.names()))
    check = sampler_spec(name).check
    if check is not None and (problem := check(cfg)):
        raise ConfigError(problem)


def _tasks(cfg: Config) -> None:
    from credo.tasks import TASK_SOURCES, TaskSourceContext, task_source_check, task_source_params

    t, r = cfg.tasks, cfg.rollout
    _registered(
        TASK_SOURCES, t.source, "tasks.params", lambda: task_source_params(t.source, t.params)
    )
    check = task_source_check(t.source)
    if check is None:
        return
    params = task_source_params(t.source, t.params)
    problem = check(params, TaskSourceContext(r.train_tasks, r.tasks_per_iter), cfg.env.name)
    if problem:
        raise ConfigError(problem)


def _credit(cfg: Config) -> None:
    from credo.credit import ESTIMATORS, estimator_state_factory, validate_estimator

    c = cfg.credit
    _registered(
        ESTIMATORS, c.estimator, "credit.params", lambda: validate_estimator(c.estimator, c.params)
    )
    _choice("credit.seed_graph", c.seed_graph, ("empty", "demonstrations", "teacher"))
    if estimator_state_factory(c.estimator) is None and (c.state or c.seed_graph != "empty"):
        raise ConfigError(
            f"estimator {c.estimator!r} keeps no state: credit.state and "
            "credit.seed_graph apply to stateful estimators (proas) only"
        )
    factory = estimator_state_factory(c.estimator)
    if factory is not None and c.state:  # the state's knobs, checked by building it
        try:
            factory(**c.state)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"credit.state: {exc}") from None
    if c.seed_graph == "teacher" and not c.teacher:
        raise ConfigError("credit.seed_graph=teacher needs credit.teacher=PATH (a policy folder)")
    if c.teacher is not None and not Path(c.teacher).expanduser().exists():
        raise ConfigError(f"credit.teacher={c.teacher!r}: no such folder")
    _at_least(1, {"credit.seed_episodes": c.seed_episodes})


def _objective(cfg: Config) -> None:
    from credo.objectives import (
        AGGREGATIONS,
        KL_ESTIMATORS,
        LOSSES,
        WEIGHT_MODES,
        loss_requirements,
        validate_aggregation,
        validate_loss,
    )

    obj = cfg.objective
    _registered(LOSSES, obj.loss, "objective.params", lambda: validate_loss(obj.loss, obj.params))
    missing = loss_requirements(obj.loss)(obj.params, cfg.rollout)
    if missing:
        raise ConfigError(missing)
    from credo.train.config.env_features import env_feature_problem  # RAPO's profiles

    missing = env_feature_problem(cfg, obj.loss)
    if missing:
        raise ConfigError(missing)
    if obj.aggregation not in AGGREGATIONS:
        raise ConfigError(
            unknown_name_message("aggregation", obj.aggregation, AGGREGATIONS.names())
        )
    try:
        validate_aggregation(obj.aggregation, obj.aggregation_params)
    except ValueError as e:
        raise ConfigError(f"objective.aggregation_params: {e}") from None
    if obj.kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(
            f"unknown objective.kl_estimator {obj.kl_estimator!r}; "
            f"valid: {', '.join(KL_ESTIMATORS)}"
        )
    _choice("objective.oracle_weight", obj.oracle_weight, WEIGHT_MODES)
    _choice("objective.oracle_frozen", obj.oracle_frozen, ("iteration", "reference"))
    if obj.oracle_coef > 0 and cfg.rollout.oracle_horizon < 1:
        raise ConfigError(
            f"objective.oracle_coef = {obj.oracle_coef} needs oracle continuations: set "
            "rollout.oracle_horizon ≥ 1 (the oracle steps per continuation)"
        )
    _in_range("objective.oracle_weight_min", obj.oracle_weight_min, 0, 1)
    _at_least(
        0,
        {
            "objective.kl_coef": obj.kl_coef,
            "objective.kl_reward_coef": obj.kl_reward_coef,
            "objective.oracle_coef": obj.oracle_coef,
            "objective.entropy_coef": obj.entropy_coef,
        },
    )
    if obj.tis_cap is not None:  # truncated IS for the sampler/trainer mismatch
        if isinstance(obj.tis_cap, bool) or not isinstance(obj.tis_cap, (int, float)):
            raise ConfigError(
                f"objective.tis_cap must be a number ≥ 1 or null, got {obj.tis_cap!r}"
            )
        _at_least(1, {"objective.tis_cap": obj.tis_cap})
        if not cfg.optim.recompute_old_logprobs:
            raise ConfigError(
                "objective.tis_cap needs optim.recompute_old_logprobs=true: the weight "
                "π_trainer_old/π_engine needs the trainer's own log-probs of the rollouts"
            )
    if cfg.optim.skip_zero_advantage:
        why = skip_zero_advantage_problems(cfg)
        if why:
            raise ConfigError(
                "optim.skip_zero_advantage=true is exact only when rows with zero "
                f"advantages add no gradient, but {'; '.join(why)}. Accepted: loss ppo, "
                "holder, holder_token or ppo_rapo with no KL loss and no entropy bonus"
            )


def skip_zero_advantage_problems(cfg: Config) -> list[str]:
    """Why ``optim.skip_zero_advantage`` would change this config's update (rows with zero
    advantages that still carry a gradient), one reason per item; empty when it is
    exact: an advantage-weighted loss, no KL loss, no entropy bonus."""
    from credo.objectives import loss_is_advantage_weighted

    obj = cfg.objective
    kept = {"objective.kl_coef": obj.kl_coef, "objective.entropy_coef": obj.entropy_coef}
    why = [f"{k} = {v} (must be 0)" for k, v in kept.items() if v > 0]
    if not loss_is_advantage_weighted(obj.loss):
        why.insert(0, f"objective.loss={obj.loss} has terms besides the advantage's")
    return why


def _optim(cfg: Config) -> None:
    from credo.train.update import LR_SCHEDULES

    o = cfg.optim
    _at_least(
        1,
        {
            "optim.epochs": o.epochs,
            "optim.minibatches": o.minibatches,
            "optim.micro_batch_rows": o.micro_batch_rows,
            "optim.micro_batch_tokens": o.micro_batch_tokens,
        },
    )
    _at_least(0, {"optim.lr": o.lr, "optim.weight_decay": o.weight_decay})
    if o.max_kl is not None and (
        isinstance(o.max_kl, bool) or not isinstance(o.max_kl, (int, float)) or o.max_kl <= 0
    ):
        raise ConfigError(f"optim.max_kl must be a number > 0 or null, got {o.max_kl!r}")
    if o.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"optim.lr_schedule={o.lr_schedule!r}: expected one of {', '.join(LR_SCHEDULES)}"
        )
    if o.grad_clip <= 0:
        raise ConfigError(f"optim.grad_clip must be > 0, got {o.grad_clip}")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(
            f"optim.betas must be two numbers in [0, 1) like [0.9, 0.999], got {o.betas}"
        )


def _sft(cfg: Config) -> None:
    s = cfg.sft
    _at_least(1, {"sft.batch_size": s.batch_size})
    _at_least(
        0,
        {
            "sft.steps": s.steps,
            "sft.noisy_steps": s.noisy_steps,
            "sft.episodes": s.episodes,
            "sft.noisy_episodes": s.noisy_episodes,
            "sft.lr": s.lr,
            "sft.noisy_lr": s.noisy_lr,
            "sft.seed": s.seed,
        },
    )
    _in_range("sft.epsilon", s.epsilon, 0, 1)
    if s.privileged is not None and (not isinstance(s.privileged, str) or not s.privileged):
        raise ConfigError(
            f"sft.privileged must be a kind of the env's privileged_context (e.g. oracle), "
            f"anchor (MT-SDPO's verified episode) or null, got {s.privileged!r}"
        )
    if not 0 < s.privileged_share <= 1:
        raise ConfigError(f"sft.privileged_share must be in (0, 1], got {s.privileged_share}")
    if not isinstance(s.privileged_steps, int) or s.privileged_steps < 0:
        raise ConfigError(
            f"sft.privileged_steps must be an integer >= 0, got {s.privileged_steps!r}"
        )
    if s.privileged_steps and s.privileged is None:
        raise ConfigError(
            "sft.privileged_steps needs sft.privileged (the kind of text to read, e.g. "
            "oracle); set both, or sft.privileged_steps=0"
        )
    if s.agent_reply is not None:  # a warm start through the user's agent
        from credo.agent.demos import check_reply_format

        if cfg.rollout.agent is None:
            raise ConfigError(
                "sft.agent_reply is the reply format of the agent's warm start: it needs "
                "rollout.agent (--agent module:function)"
            )
        if problem := check_reply_format(s.agent_reply):
            raise ConfigError(problem)
        if s.agent_reply == "tool_call" and not _env_has(cfg, "action_as_call"):
            raise ConfigError(
                f"sft.agent_reply=tool_call writes the oracle's actions as tool calls: env "
                f"{cfg.env.name!r} has no action_as_call(action) to turn an action into "
                "(name, arguments) (the tools env has); or give a reply template such as "
                "'Action: {action}'"
            )
        if s.privileged is not None:
            raise ConfigError(
                "sft.agent_reply records the agent's own prompts, which carry no privileged "
                "text: set sft.privileged=null"
            )


def _eval_shifted(cfg: Config) -> None:
    """``eval.shifted``: a list of ``{label, kwargs}`` with distinct labels (each env is
    built from them when the run is, before any compute)."""
    shifted = cfg.eval.shifted
    example = "e.g. eval.shifted=[{label: hard, kwargs: {difficulty: hard}}]"
    if not isinstance(shifted, list):
        raise ConfigError(f"eval.shifted must be a list of {{label, kwargs}}, {example}")
    seen: set[str] = set()
    for i, entry in enumerate(shifted):
        where = f"eval.shifted[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"label", "kwargs"}:
            raise ConfigError(f"{where} must be a mapping with label and kwargs only, {example}")
        label, kwargs = entry.get("label"), entry.get("kwargs", {})
        if not isinstance(label, str) or not RUN_NAME.fullmatch(label) or label in seen:
            raise ConfigError(
                f"{where}.label must be a distinct name of letters, digits, '-', '_' or '.', "
                f"got {label!r}"
            )
        if not isinstance(kwargs, dict):
            raise ConfigError(f"{where}.kwargs must be a mapping of env options, got {kwargs!r}")
        seen.add(label)
    from credo.rollout import SAMPLERS, sampler_spec

    name = cfg.rollout.sampler_in_use
    if shifted and name in SAMPLERS and sampler_spec(name).run_state:
        raise ConfigError(
            f"eval.shifted evaluates with credo's own sampler; the {name} sampler's held-out "
            "evaluation runs through its own session: drop eval.shifted"
        )


def _eval_and_train(cfg: Config) -> None:
    _at_least(
        1,
        {
            "eval.episodes": cfg.eval.episodes,
            "eval.periodic_episodes": cfg.eval.periodic_episodes,
            "train.checkpoint_every": cfg.train.checkpoint_every,
        },
    )
    _at_least(
        0,
        {
            "eval.every": cfg.eval.every,
            "train.iterations": cfg.train.iterations,
            "train.threads": cfg.train.threads,
            "train.keep_checkpoints": cfg.train.keep_checkpoints,
        },
    )
    name = cfg.train.name
    if name is not None and not (isinstance(name, str) and RUN_NAME.fullmatch(name)):
        raise ConfigError(
            f"train.name={name!r} must be one folder name: letters, digits, _, - and . "
            "(not first), at most 128 characters; a run's folder is train.runs_dir/"
            "train.name, so set train.runs_dir to put runs elsewhere"
        )


PRIVILEGED_KINDS = ("oracle", "feedback", "solution", "anchor")


def _teacher(cfg: Config) -> None:
    """The ``teacher`` section: its names and ranges, that the loss and the route fit,
    and that a teacher folder exists and holds a finished model (the vocabulary and
    tokenizer are checked against the student by :func:`credo.teachers.teaching.
    check_teacher_inputs` once the student exists, still before any compute)."""
    from credo.objectives import LOSSES, loss_teacher_requirements
    from credo.objectives.oprd import COMBINE_MODES, VERIFIER_MODES
    from credo.teachers import PLACEMENTS, ROUTES, SANITISERS, TEACHERS, teacher_route
    from credo.teachers.sanitise import validate_sanitiser

    t, loss = cfg.teacher, cfg.objective.loss
    check = loss_teacher_requirements(loss) if loss in LOSSES else None
    if check is not None:
        missing = check(cfg.objective.params, t)
        if missing:
            raise ConfigError(missing)
    if not t.enabled:
        if t.path is not None or t.base_path is not None:
            raise ConfigError(
                "teacher.path is set but teacher.kind is null: set teacher.kind=run (a credo "
                "run or checkpoint) or hf (a Hugging Face model folder)"
            )
        return
    if t.kind not in TEACHERS:
        raise ConfigError(unknown_name_message("teacher", t.kind, TEACHERS.names()))
    if t.route not in ROUTES:
        raise ConfigError(unknown_name_message("teacher route", t.route, ROUTES.names()))
    route = teacher_route(t.route)
    if route.to_loss and check is None:
        others = [n for n in ROUTES.names() if not teacher_route(n).to_loss]
        raise ConfigError(
            f"teacher.route={t.route} needs a distillation loss (objective.loss opd, mt_sdpo "
            f"or renyi_opsd), got objective.loss={loss}; or set teacher.route="
            f"{', '.join(others[:-1])} or {others[-1]}"
        )
    if t.privileged is not None:
        _choice("teacher.privileged", t.privileged, PRIVILEGED_KINDS)
    _choice("teacher.placement", t.placement, PLACEMENTS)
    if "{text}" not in t.template or "{privileged}" not in t.template:
        raise ConfigError(
            f"teacher.template must contain both {{text}} and {{privileged}}, got {t.template!r}"
        )
    _registered(
        SANITISERS,
        t.sanitiser,
        "teacher.sanitiser_params",
        lambda: validate_sanitiser(t.sanitiser, t.sanitiser_params),
    )
    _choice("teacher.reward_reduce", t.reward_reduce, ("sum", "mean"))
    _choice("teacher.oprd.accept", t.oprd.accept, VERIFIER_MODES)
    _choice("teacher.oprd.reduce", t.oprd.reduce, ("sum", "mean"))
    _choice("teacher.oprd.episode_reduce", t.oprd.episode_reduce, ("sum", "mean"))
    _choice("teacher.oprd.combine", t.oprd.combine, COMBINE_MODES)
    if t.oprd.teachers and not route.base:
        raise ConfigError("teacher.oprd.teachers are OPRD teachers: set teacher.route=oprd")
    _at_least(1, {"teacher.micro_batch": t.micro_batch})
    _at_least(0, {"teacher.topk": t.topk, "teacher.context_cache": t.context_cache})
    _in_range("teacher.ema_decay", t.ema_decay, 0, 1)
    for key, value in (
        ("teacher.temperature", t.temperature),
        ("teacher.reward_coef", t.reward_coef),
        ("teacher.oprd.alpha", t.oprd.alpha),
        ("teacher.reward_clip", t.reward_clip),
        ("teacher.oprd.clip", t.oprd.clip),
    ):
        if value is not None and not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    if t.topk > 0 and t.full:
        raise ConfigError("teacher.topk and teacher.full exclude each other: set one")
    if t.context_cache > 0 and t.privileged != "anchor":
        raise ConfigError("teacher.context_cache keeps anchors: it needs teacher.privileged=anchor")
    _anchor_settings(t)
    _teacher_folders(cfg)


def _anchor_settings(t: Any) -> None:
    """MT-SDPO's pool and aggregation: only with anchors; ``all`` on a shared support."""
    _choice("teacher.aggregate", t.aggregate, ("one", "all"))
    _at_least(1, {"teacher.max_contexts": t.max_contexts})
    if not isinstance(t.pool, list) or not all(isinstance(p, str) and p for p in t.pool):
        raise ConfigError(
            f"teacher.pool must be a list of run, checkpoint or model folders, got {t.pool!r}"
        )
    anchored = t.privileged == "anchor"
    if t.pool and not anchored:
        raise ConfigError("teacher.pool gives MT-SDPO anchors: it needs teacher.privileged=anchor")
    if t.aggregate == "all" and not (anchored and t.full):
        raise ConfigError(
            "teacher.aggregate=all mixes the teacher's distributions over several anchors: it "
            "needs teacher.privileged=anchor and teacher.full=true (every context scores the "
            "same ids); or teacher.aggregate=one"
        )
    from credo.teachers import resolve_policy_folder

    for i, path in enumerate(t.pool):
        try:
            resolve_policy_folder(path)
        except ValueError as exc:
            raise ConfigError(f"teacher.pool[{i}]: {exc}") from None


def _teacher_folders(cfg: Config) -> None:
    """A folder teacher's folder (``run``, ``hf``), when given, exists and holds a finished
    model (and OPRD's base too); a teacher made from the student (``self``, ``ema``)
    takes none. A recipe may leave ``teacher.path`` empty (``opd``, ``oprd``):
    :func:`credo.teachers.folders.require_teacher_path` stops a run without it before any
    compute."""
    from credo.teachers import TEACHERS, resolve_policy_folder, teacher_route
    from credo.teachers.folders import oprd_base_path, oprd_teacher_pairs

    t = cfg.teacher
    kind = TEACHERS.meta(t.kind)
    if kind["student"]:
        if t.path is not None or t.base_path is not None:
            raise ConfigError(
                f"teacher.kind={t.kind} is the student itself: drop teacher.path/base_path"
            )
        if kind["privileged"] and t.privileged is None:
            raise ConfigError(
                f"teacher.kind={t.kind} scores with the student's own weights: it needs "
                "teacher.privileged (oracle, feedback, solution or anchor), the context the "
                "student does not see"
            )
        if teacher_route(t.route).base:
            raise ConfigError(
                f"teacher.route={t.route} needs an RL-trained teacher and its base: "
                "teacher.kind=run"
            )
        return
    if not t.path:  # a recipe leaves it to the command line; checked before compute
        return
    try:
        base = oprd_base_path(t)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for key, path in (("teacher.path", t.path), ("teacher.base_path", base)):
        if path is None:
            continue
        try:
            resolve_policy_folder(path)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    try:
        pairs = oprd_teacher_pairs(t)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for i, (rl, base) in enumerate(pairs[1:]):
        for key, path in (("path", rl), ("base_path", base)):
            try:
                resolve_policy_folder(path)
            except ValueError as exc:
                raise ConfigError(f"teacher.oprd.teachers[{i}].{key}: {exc}") from None


def _critic(cfg: Config) -> None:
    """CAST's online verification: a critic folder that exists, a threshold in [0, 1], a
    known flag policy and non-negative knobs."""
    c = cfg.critic
    _choice("critic.on_flag", c.on_flag, ("log", "resample", "penalise"))
    _in_range("critic.threshold", c.threshold, 0.0, 1.0)
    _at_least(0, {"critic.max_resamples": c.max_resamples, "critic.penalty": c.penalty})
    if c.path is None:
        return
    for name in ("critic.json", "critic.safetensors"):
        if not (Path(c.path).expanduser() / name).is_file():
            raise ConfigError(
                f"critic.path={c.path!r} has no {name}; give a critic folder written by the "
                "critic stage (credo.commands.cast.critic_stage), or critic.path=null"
            )
    if cfg.rollout.agent:
        raise ConfigError("critic.path is not supported with rollout.agent (the agent samples)")


def _judge(cfg: Config) -> None:
    """The ``judge`` section (SERPO): names, ranges, the rubric file and that the env
    has free text to judge (:func:`credo.train.config.judge.check_judge_config`)."""
    from credo.train.config.judge import check_judge_config

    problem = check_judge_config(cfg, machine=_MACHINE.get())
    if problem:
        raise ConfigError(problem)


#: The section checks :func:`validate` runs, in order.
SECTION_CHECKS: tuple[Callable[[Config], None], ...] = (
    _env,
    _model,
    _rollout,
    _tasks,
    _credit,
    _objective,
    _optim,
    _sft,
    _eval_and_train,
    _eval_shifted,
    _teacher,
    _critic,
    _judge,
)
