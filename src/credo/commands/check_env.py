"""``credo check-env``: an env's protocol checks (:mod:`credo.rollout.envcheck`) with the
tokenizer and renderer a run of the config would send its actions through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from credo.policy.models import model_problem
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import EnvCheck, check_env
from credo.rollout.render import Renderer, make_renderer
from credo.train.config import Config
from credo.train.run import env_factory, env_vocabulary, history_turns

__all__ = ["check_env_of", "check_tokenizer"]


def check_env_of(cfg: Config, *, tasks: int) -> EnvCheck:
    """Every check of :func:`credo.rollout.envcheck.check_env` on ``tasks`` training tasks
    of ``cfg``'s env, with the tokenizer and renderer of ``cfg``'s model."""
    make = env_factory(cfg)
    tokenizer, renderer = check_tokenizer(cfg, make)
    return check_env(make, tasks=tasks, tokenizer=tokenizer, renderer=renderer)


def check_tokenizer(cfg: Config, make: Callable[[], Any]) -> tuple[Any, Renderer]:
    """The tokenizer and renderer ``credo check-env`` sends actions through: the built-in
    word tokenizer over the env's vocabulary (:func:`env_vocabulary`), or ``model.name``'s
    tokenizer with the chat renderer."""
    env = make()
    if cfg.model.name is None:
        tokenizer = build_word_tokenizer(
            env_vocabulary(env, make, history_tokens=cfg.rollout.history_tokens)
        )
        builtin = True
    else:
        from transformers import AutoTokenizer

        from credo.policy.models import resolve_model

        if problem := model_problem(cfg.model.name):
            raise ValueError(problem)

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name))
        builtin = False
    renderer = make_renderer(
        tokenizer,
        builtin=builtin,
        history_turns=history_turns(cfg, builtin=builtin),
        env=env,
        history_tokens=cfg.rollout.history_tokens,
    )
    return tokenizer, renderer
