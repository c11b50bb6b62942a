"""The warm start: SFT on the env's oracle demonstrations, cached by config hash, and
its held-out evaluation, cached beside it.

:func:`warm_start` trains (or loads from the cache) the policy RL starts from.
:func:`start_policy` is what ``train`` calls: the warm start of a fresh run with its
held-out result (or, on ``--resume``, what the run folder recorded), written to
``warmstart.json`` in the run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from credo.engines import distributed as dp
from credo.envs.base import resolve_env
from credo.eval.evaluate import EvalResult
from credo.policy.hf import HFPolicy
from credo.policy.lora import merge_lora
from credo.rollout.render import Turn
from credo.teachers import privileged_prompt_ids
from credo.teachers.sanitise import sanitise
from credo.train.config import Config, config_hash
from credo.train.progress import Progress
from credo.train.run import Run, add_adapters, history_turns, max_new_tokens
from credo.train.sft import Demonstrations, collect_demonstrations, sft_train
from credo.utils.atomic import remove_leftovers, temp_path, write_text_atomic
from credo.utils.cache import cache_dir
from credo.utils.code_text import code_text
from credo.utils.imports import user_code_digest

__all__ = [
    "WarmStart",
    "start_policy",
    "warm_start",
    "warm_start_folder",
    "warm_start_key",
]


@dataclass
class WarmStart:
    """What the warm start did (or found in the cache).

    Attributes:
        key: config hash identifying the warm start.
        cached: loaded from the cache rather than trained.
        demo_success: success rate of the noisy demonstrations.
        seconds: time spent training (0 when cached).
        path: the cached policy folder.
    """

    key: str
    cached: bool
    demo_success: float
    seconds: float
    path: Path


#: ``sft.steps: null`` means the env's ``sft_steps`` attribute, else this many steps.
DEFAULT_SFT_STEPS = 2500


def sft_steps(cfg: Config) -> int:
    """``sft.steps``, or its env-dependent default: the env's optional ``sft_steps``
    attribute (``tools``: 6000), else :data:`DEFAULT_SFT_STEPS`."""
    if cfg.sft.steps is not None:
        return cfg.sft.steps
    return int(getattr(resolve_env(cfg.env.name), "sft_steps", DEFAULT_SFT_STEPS))


def warm_start_key(cfg: Config) -> str:
    """Hash of everything the warm start depends on, the code included. Model and prompt
    settings enter only when they differ from their defaults (the built-in model's keys
    stay short and stable)."""
    tiny = asdict(cfg.model.tiny)
    if tiny["tie_embeddings"]:  # the default adds nothing to the key
        del tiny["tie_embeddings"]
    model: dict[str, Any] = {"name": cfg.model.name, "tiny": tiny}
    if cfg.model.lora is not None:
        model["lora"] = asdict(cfg.model.lora)
    if cfg.model.dtype != "float32":
        model["dtype"] = cfg.model.dtype
    if cfg.model.mixed_precision is not None:
        model["mixed_precision"] = cfg.model.mixed_precision
    # SFT settings outside the key: the cache switch, and the privileged-text settings
    # while sft.privileged is off (keys of earlier warm starts stay valid)
    # sft.seed: resolved below (null and the seed it means share a key)
    skip = {"cache", "seed"}
    skip |= {"privileged", "privileged_share"} if cfg.sft.privileged is None else set()
    skip |= {"privileged_steps"} if not cfg.sft.privileged_steps else set()
    skip |= {"agent_reply"} if cfg.sft.agent_reply is None else set()
    if cfg.sft.privileged is not None:  # the privileged rows are rendered as the teacher's
        t = cfg.teacher
        reading: dict[str, Any] = {"placement": t.placement, "template": t.template}
        if cfg.sft.privileged == "anchor":
            reading.update(sanitiser=t.sanitiser, sanitiser_params=t.sanitiser_params)
    key: dict[str, Any] = {
        "env": asdict(cfg.env),
        "model": model,
        "sft": {
            **{k: v for k, v in asdict(cfg.sft).items() if k not in skip},
            "steps": sft_steps(cfg),  # resolved: null and the number it means share a key
        },
        # the built-in model's resolved (null and the number it means share a key); a
        # model folder's as written (a tiny one there counts as built-in when it loads)
        "history_turns": (
            history_turns(cfg, builtin=True)
            if cfg.model.name is None
            else cfg.rollout.history_turns
        ),
        "seed": cfg.warm_start_seed,
        "code": _code_fingerprint(cfg),
    }
    if cfg.sft.privileged is not None:
        key["reading"] = reading
    if cfg.sft.agent_reply is not None and cfg.rollout.agent:  # the agent writes the prompts
        key["agent"] = {
            "spec": cfg.rollout.agent,
            "code": user_code_digest(cfg.rollout.agent.rpartition(":")[0]),
        }
    prompt = {
        k: getattr(cfg.rollout, k)
        for k in ("system_prompt", "user_prompt")
        if getattr(cfg.rollout, k) is not None
    }
    if cfg.rollout.chat_examples:
        prompt["chat_examples"] = cfg.rollout.chat_examples
    if cfg.rollout.history_tokens:
        prompt["history_tokens"] = cfg.rollout.history_tokens
    if prompt:
        key["prompt"] = prompt
    return config_hash(key)


def clean_phase_key(cfg: Config) -> str:
    """The key of the warm start's clean phase: that of the same warm start without a
    noisy phase (``sft.noisy_steps=0``, ``sft.noisy_lr`` at its default), which is the
    clean phase itself. Warm starts that differ only in ``sft.noisy_steps`` or
    ``sft.noisy_lr`` share it: :func:`warm_start` loads it from the cache and trains
    only the noisy phase. (``sft.epsilon`` and ``sft.noisy_episodes`` stay in the key:
    they make the noisy demonstrations whose success the warm start records.)"""
    return warm_start_key(dataclasses.replace(cfg, sft=_without_noisy_phase(cfg.sft)))


def _without_noisy_phase(sft: Any) -> Any:
    """``sft`` as the warm start without a noisy phase has it: ``noisy_steps=0`` and
    ``noisy_lr`` at its default (the settings the clean phase does not read)."""
    return dataclasses.replace(sft, noisy_steps=0, noisy_lr=type(sft)().noisy_lr)


def _code_fingerprint(cfg: Config) -> str:
    """Hash of the code a warm start depends on: the env's module, the prompt renderer,
    the demonstrations/SFT code and the built-in model. Editing any of them (e.g. your
    env's observations) invalidates cached warm starts instead of silently reusing them;
    editing their docstrings, comments or blank lines does not (:func:`code_text`), so
    that a recorded warm start is still found after a reworded docstring."""
    import hashlib
    import inspect

    from credo.policy import tiny, tokenizer
    from credo.rollout import render
    from credo.train import sft

    modules = [render, sft, tiny, tokenizer]
    try:
        env_module = inspect.getmodule(resolve_env(cfg.env.name))
        if env_module is not None:
            modules.append(env_module)
    except (TypeError, ValueError):
        pass
    digest = hashlib.sha256()
    for m in modules:
        try:
            digest.update(code_text(inspect.getsource(m)).encode())
        except (OSError, TypeError):
            digest.update(m.__name__.encode())
    return digest.hexdigest()[:16]


def warm_start_folder(key: str) -> Path:
    """The cache folder of the warm start with key ``key`` (:func:`warm_start_key`); it
    holds ``warmstart.json`` once the warm start is complete."""
    return cache_dir() / "warmstart" / key


def warm_start(
    run: Run,
    policy: HFPolicy | None = None,
    *,
    on_step: Callable[[str, int, int, float], None] | None = None,
) -> tuple[HFPolicy, WarmStart]:
    """SFT on clean, then on ε-noisy oracle demonstrations; cached by config hash.

    The clean phase is cached too, as the warm start without a noisy phase
    (:func:`clean_phase_key`): a warm start that differs from a cached one only in
    ``sft.noisy_steps`` or ``sft.noisy_lr`` loads that clean phase and trains only its
    own noisy phase, with the weights a warm start trained from scratch gets.

    With ``model.lora`` the warm start trains LoRA adapters and merges them into the
    weights at the end: the result (and the cached folder) is always a plain model, on
    which RL then trains fresh adapters. A cached warm start is loaded into the policy
    itself (its dtype, device and gradient checkpointing stay as built).

    Args:
        run: the run's parts (config, env factory, renderer).
        policy: the policy to start from (default: the run's, as built).
        on_step: ``on_step(phase, step, total, loss)`` reports progress.

    Returns:
        The (possibly reloaded) policy and what happened.
    """
    cfg = run.cfg
    policy = policy if policy is not None else run.policy
    key = warm_start_key(cfg)
    folder = warm_start_folder(key)
    meta_path = folder / "warmstart.json"
    if cfg.sft.cache and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        policy.load_weights(folder / "policy")
        _name_base(policy, folder / "policy")
        return policy, WarmStart(key, True, meta["demo_success"], 0.0, folder / "policy")
    policy = add_adapters(cfg, policy)
    sft = dataclasses.replace(cfg.sft, steps=sft_steps(cfg))
    start = time.perf_counter()
    teach: dict[str, Any] = {}
    if sft.privileged is not None:  # rows whose prompt carries the env's privileged text
        t = cfg.teacher

        def render(instruction: str, history: list[Turn], obs: str, text: str) -> list[int]:
            return privileged_prompt_ids(
                run.renderer, instruction, history, obs, text,
                placement=t.placement, template=t.template,
            )  # fmt: skip

        teach = {"privileged": sft.privileged, "privileged_prompt": render}
        if sft.privileged == "anchor":  # MT-SDPO's verified context, as the teacher reads it
            teach["anchor"] = lambda actions: sanitise(t.sanitiser, actions, **t.sanitiser_params)
    # the clean phase of a warm start that differs only in its noisy phase, if cached
    # (not under LoRA: there both phases train the same adapters, merged at the end)
    reuse = cfg.sft.cache and sft.noisy_steps > 0 and cfg.model.lora is None
    clean_folder = warm_start_folder(clean_phase_key(cfg))
    have_clean = reuse and (clean_folder / "warmstart.json").exists()
    if sft.agent_reply is not None:  # through the user's agent, the oracle replying
        clean, noisy = _agent_demonstrations(run, policy, sft, with_clean=not have_clean)
    else:
        clean = Demonstrations([], 0.0)
        if not have_clean:
            clean = collect_demonstrations(
                run.make_env, run.renderer, episodes=sft.episodes, epsilon=0.0,
                seed=cfg.warm_start_seed, **teach,
            )  # fmt: skip
        noisy = collect_demonstrations(
            run.make_env,
            run.renderer,
            episodes=sft.noisy_episodes,
            epsilon=sft.epsilon,
            seed=cfg.warm_start_seed + 1,
            first_task=sft.episodes,
            **teach,
        )
    torch.manual_seed(cfg.warm_start_seed)
    reading = sft.privileged_steps if clean.privileged else 0
    total = reading + sft.steps + sft.noisy_steps

    def train(
        rows: list, steps: int, lr: float, seed: int, name: str, offset: int, **kw: Any
    ) -> None:
        if steps:
            sft_train(
                policy, rows, steps=steps, batch_size=sft.batch_size, lr=lr, seed=seed,
                on_step=lambda step, loss: (
                    on_step(name, offset + step + 1, total, loss) if on_step else None
                ),
                **kw,
            )  # fmt: skip

    if have_clean:
        policy.load_weights(clean_folder / "policy")
    else:
        # the privileged rows alone first (sft.privileged_steps): reading the text
        train(clean.privileged, reading, sft.lr, cfg.warm_start_seed + 2, "text demos", 0)
        rows = _with_privileged(clean, sft)
        train(rows, sft.steps, sft.lr, cfg.warm_start_seed, "clean demos", reading)
        if reuse:  # as the warm start without a noisy phase would store it
            meta = {"demo_success": noisy.success_rate, "seconds": time.perf_counter() - start}
            _store(policy, clean_folder, {**meta, "config": asdict(_without_noisy_phase(sft))})
    train(
        _with_privileged(noisy, sft), sft.noisy_steps, sft.noisy_lr, cfg.warm_start_seed + 1,
        "noisy demos", reading + sft.steps, warmup=0,
    )  # fmt: skip
    policy = merge_lora(policy)
    seconds = time.perf_counter() - start
    if cfg.sft.cache:
        _store(
            policy,
            folder,
            {"demo_success": noisy.success_rate, "seconds": seconds, "config": asdict(sft)},
        )
    return policy, WarmStart(key, False, noisy.success_rate, seconds, folder / "policy")


def _agent_demonstrations(
    run: Run, policy: HFPolicy, sft: Any, *, with_clean: bool = True
) -> tuple[Demonstrations, Demonstrations]:
    """The clean and noisy demonstrations of ``sft.agent_reply``: the user's agent run
    with the env's oracle replying (:mod:`credo.agent.demos`); the clean ones keep the
    episodes the agent solved. Without ``with_clean`` (the clean phase is loaded from the
    cache) no clean episode is run and the clean set is empty.

    Raises:
        ValueError: the agent solved none of its clean episodes (its parser does not read
            replies written as ``sft.agent_reply``).
    """
    from credo.agent import agent_params
    from credo.agent.demos import collect_agent_demonstrations

    cfg = run.cfg
    a = agent_params(cfg)
    common = {
        "reply": sft.agent_reply,
        "env_data": {"env": a.env, "env_kwargs": dict(a.env_kwargs)},
        "timeout_s": a.timeout_s,
        "max_concurrency": a.max_concurrency,
    }
    clean, solved = [], 0.0
    if with_clean:
        clean, solved = collect_agent_demonstrations(
            a.agent, policy, run.make_env, episodes=sft.episodes, epsilon=0.0,
            seed=cfg.warm_start_seed, **common,
        )  # fmt: skip
        if not any(e.success for e in clean):
            raise ValueError(
                f"the agent {a.agent} solved none of {len(clean)} tasks with the env's "
                f"oracle replying as sft.agent_reply={sft.agent_reply!r}: its parser does "
                "not read those replies (write the format its prompt asks for)"
            )
    noisy, noisy_solved = collect_agent_demonstrations(
        a.agent, policy, run.make_env, episodes=sft.noisy_episodes, epsilon=sft.epsilon,
        seed=cfg.warm_start_seed + 1, first_task=sft.episodes, **common,
    )  # fmt: skip
    return (
        Demonstrations([e for e in clean if e.success], solved),
        Demonstrations(noisy, noisy_solved),
    )


def _with_privileged(demos: Demonstrations, sft: Any) -> list[tuple[list[int], list[int]]]:
    """The demonstrations' rows, plus a ``sft.privileged_share`` of their privileged rows
    (drawn with a fixed seed)."""
    rows = demos.rows()
    if not demos.privileged:
        return rows
    rng = random.Random(len(rows))
    return rows + [r for r in demos.privileged if rng.random() < sft.privileged_share]


def _store(policy: HFPolicy, folder: Path, meta: dict[str, Any]) -> None:
    """Save a warm start into the cache: written under a fresh temporary name (so that
    concurrent writers never share one), then renamed into place. The temporary folders
    of writers that were killed (as large as the model) are removed first; a live
    writer's are kept."""
    remove_leftovers(folder.parent)
    tmp = temp_path(folder)
    try:
        policy.save(tmp / "policy")
        (tmp / "warmstart.json").write_text(json.dumps(meta))
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another writer put the same warm start there first
            if not (folder / "warmstart.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _name_base(policy, folder / "policy")


def _name_base(policy: HFPolicy, path: Path) -> None:
    """Record ``path`` as where the model's weights live (LoRA adapters saved later name
    it as their base model)."""
    policy.model.name_or_path = str(path)
    policy.model.config._name_or_path = str(path)


#: Rollout settings that only training reads: the held-out evaluation samples one episode
#: per task with neither KLPO's auxiliary draws nor the top-K head, no oracle
#: continuations and no invalid-action penalty (:meth:`~credo.train.run.Run.evaluate`),
#: and builds its env locally; these do not enter the key of its cache.
EVAL_IGNORES_ROLLOUT = (
    "sampler",
    "sampler_params",
    "tasks_per_iter",
    "group_size",
    "train_tasks",
    "invalid_penalty",
    "aux_samples",
    "topk_logprobs",
    "oracle_horizon",
    "oracle_per_group",
    "oracle_start",
    "on_restore_divergence",
    "kv_reuse",  # the same next-token logits but for float rounding (docs/llm.md)
    "kv_cache_mb",
    "env_workers",
    "ray_address",
    "env_timeout_s",
    "env_retries",
)


def eval_cache_name(cfg: Config, warm_key: str, *, builtin: bool) -> str:
    """The key of the held-out evaluation of warm start ``warm_key`` under ``cfg``: a
    hash of the warm start, ``cfg.eval`` and the rollout settings an evaluation reads
    (every field but :data:`EVAL_IGNORES_ROLLOUT`, with the resolved response cap), so
    that runs differing only in training settings (tasks per iteration, group size,
    sampler) share one evaluation. A new rollout field enters the key until it is listed
    there: a needless re-evaluation, never a stale result. An agent run's evaluation
    goes through the agent, so its key holds the agent's code too (a digest of its
    module's source and the files beside it), not only the ``--agent`` name: an agent
    edited in place is evaluated afresh."""
    rollout = asdict(cfg.rollout)
    rollout["max_new_tokens"] = max_new_tokens(cfg, builtin=builtin)
    rollout["history_turns"] = history_turns(cfg, builtin=builtin)
    if cfg.rollout.agent:
        rollout["agent_code"] = user_code_digest(cfg.rollout.agent.rpartition(":")[0])
    for k in EVAL_IGNORES_ROLLOUT:
        del rollout[k]
    return config_hash({"warm": warm_key, "eval": asdict(cfg.eval), "rollout": rollout})


def _eval_cache(run: Run, key: str) -> Path:
    """Where the held-out evaluation of warm start ``key`` is cached."""
    name = eval_cache_name(run.cfg, key, builtin=run.builtin)
    return warm_start_folder(key) / f"eval-{name}.json"


def start_policy(
    run: Run, run_dir: Path, *, resuming: bool, progress: Progress
) -> tuple[HFPolicy, EvalResult | None]:
    """The policy RL starts from and its held-out result.

    A fresh run warm-starts (``sft.enabled``; else the policy as built), evaluates that
    policy on the held-out tasks (both cached by config hash) and records both in
    ``run_dir/warmstart.json``. A resumed run reads the result back from there; its
    weights come from the checkpoint, except under LoRA, whose checkpoints hold only
    the adapters: the warm start is then rebuilt as their base (from the cache;
    recomputed identically if the cache was cleared).
    """
    cfg, policy = run.cfg, run.policy
    info_path = run_dir / "warmstart.json"
    ws: WarmStart | None = None
    if cfg.sft.enabled and (not resuming or cfg.model.lora is not None):
        phase = "warm start (SFT)" + (" as the adapters' base" if resuming else "")
        with progress.phase(phase) as tick:
            policy, ws = warm_start(
                run, on_step=lambda ph, s, n, loss: tick(s, n, f"{ph} loss {loss:.3f}")
            )
    if not dp.is_main():  # with several processes, rank 0 evaluates and records it
        return policy, None
    if resuming:
        meta = json.loads(info_path.read_text()) if info_path.exists() else {}
        return policy, EvalResult(**meta["eval"]) if meta.get("eval") else None
    meta: dict[str, Any] = {"key": None, "cached": False}
    cache = None
    if ws is not None:
        meta = {
            "key": ws.key,
            "cached": ws.cached,
            "demo_success": ws.demo_success,
            "seconds": ws.seconds,
        }
        cache = _eval_cache(run, ws.key) if cfg.sft.cache else None
    if cache is not None and cache.exists():
        warm_eval = EvalResult(**json.loads(cache.read_text()))
    else:
        with progress.phase(f"held-out eval of the warm start ({cfg.eval.episodes} episodes)"):
            warm_eval = run.evaluate(policy)
        if cache is not None:
            write_text_atomic(cache, json.dumps(warm_eval.to_dict()))
    meta["eval"] = warm_eval.to_dict()
    write_text_atomic(info_path, json.dumps(meta, indent=1))
    return policy, warm_eval
