"""Warm start: supervised fine-tuning on the env's (noisy) oracle demonstrations.

Demonstrations follow ``env.oracle_action()`` but take ``env.sample_action(rng)`` (a
random plausible action) with probability ε, and the oracle then recovers from wherever
that led. The policy is trained on *all* demonstrated actions, noise included, so that
the warm-start policy has the skills but also the noise: it is mediocre, and RL has room
to remove the noise.

With ``privileged`` (``sft.privileged``: a kind of the env's ``privileged_context``), each
oracle step also yields a row whose prompt carries the env's privileged text, rendered as
a teacher's prompt is: a model trained from scratch (the built-in one) never saw such
text otherwise, so a self-teacher reading it (Rényi OPSD) would be out of its
distribution.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.data import Episode, Step
from credo.envs.base import Task, step_env
from credo.policy.hf import HFPolicy
from credo.rollout.envguard import (
    EnvCallError,
    EnvFailure,
    check_observation,
    check_step_result,
    env_call,
    env_phase,
)
from credo.rollout.group import read_instruction
from credo.rollout.render import Renderer, Turn
from credo.utils.finite import check_step

__all__ = ["Demonstrations", "SFTStats", "collect_demonstrations", "pad_rows", "sft_train"]


@dataclass
class Demonstrations:
    """Demonstration episodes and their (prompt, response) token rows.

    Attributes:
        episodes: the demonstrated episodes (steps carry prompt and response ids).
        success_rate: how often the noisy demonstrator solved its task.
        privileged: ``(prompt with the env's privileged text, response)`` of every oracle
            step whose env offered that text (empty without ``privileged``).
    """

    episodes: list[Episode]
    success_rate: float
    privileged: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def rows(self) -> list[tuple[list[int], list[int]]]:
        return [(s.prompt_ids, s.response_ids) for e in self.episodes for s in e.steps]


def collect_demonstrations(
    make_env: Callable[[], Any],
    renderer: Renderer,
    *,
    episodes: int,
    epsilon: float,
    seed: int = 0,
    max_turns: int = 64,
    first_task: int = 0,
    privileged: str | None = None,
    privileged_prompt: Callable[[str, list[Turn], str, str], list[int]] | None = None,
    anchor: Callable[[list[str]], str] | None = None,
) -> Demonstrations:
    """Roll out the ε-noisy oracle on training tasks ``first_task ..``.

    With ``privileged`` (a kind of ``env.privileged_context``) and ``privileged_prompt``
    (``(instruction, history, observation, text) → prompt ids``), every step that takes
    the oracle's action and whose env offers that text also gives a
    :attr:`Demonstrations.privileged` row. With ``privileged="anchor"`` (MT-SDPO's
    verified context) the text is ``anchor(actions)`` of the episode itself once it
    succeeded (the sanitised demonstration: the teacher learns to follow a verified
    trajectory of the task), on each of its oracle steps; a failed episode gives none.

    Every env call is guarded (:mod:`credo.rollout.envguard`, phase ``warm start``): an
    episode whose env raises, hangs past ``rollout.step_timeout`` or returns a
    non-string observation is left out (and recorded), and the env is built afresh for
    the next one, since its state is unknown. Failed episodes count as unsolved in
    ``success_rate``.

    Raises:
        ValueError: the env has no ``oracle_action`` (a warm start needs one; disable
            it with ``sft.enabled=false`` for such envs).
        EnvFailure: every episode failed (the message shows the env's first error), or
            the env returned a non-finite reward.
    """
    rng = random.Random(seed)
    out, wins = [], 0
    extra: list[tuple[list[int], list[int]]] = []
    env = make_env()
    if not hasattr(env, "oracle_action"):
        raise ValueError(
            f"{type(env).__name__} has no oracle_action(): the warm start needs demonstrations "
            "(set sft.enabled=false to train from the model as it is)"
        )
    if privileged == "anchor" and anchor is None:
        raise ValueError("sft.privileged=anchor needs the sanitiser that makes an anchor")
    if privileged not in (None, "anchor") and not hasattr(env, "privileged_context"):
        raise ValueError(
            f"sft.privileged={privileged} but {type(env).__name__} has no "
            "privileged_context(kind): drop sft.privileged or add the method"
        )
    teach = (privileged, privileged_prompt, anchor) if privileged and privileged_prompt else None
    noisy = epsilon > 0 and hasattr(env, "sample_action")
    first_error: EnvCallError | None = None
    for i in range(episodes):
        task = Task.make("train", first_task + i)
        try:
            with env_phase("warm start"):
                ep, rows = _demonstrate(
                    env, renderer, task, i, rng, epsilon if noisy else 0.0, max_turns, teach
                )
        except EnvCallError as exc:
            first_error = first_error or exc
            env = make_env()
            continue
        wins += ep.success
        out.append(ep)
        extra += rows
    if not out and first_error is not None:
        raise EnvFailure(
            f"every one of the {episodes} warm-start demonstration episodes failed in the "
            f"env; the first: {first_error.record.line()}"
        )
    return Demonstrations(out, wins / max(1, episodes), extra)


def _demonstrate(
    env: Any,
    renderer: Renderer,
    task: Task,
    group: int,
    rng: random.Random,
    epsilon: float,
    max_turns: int,
    teach: tuple[str, Callable[[str, list[Turn], str, str], list[int]], Any] | None = None,
) -> tuple[Episode, list[tuple[list[int], list[int]]]]:
    """One ε-noisy oracle episode of ``task`` in ``env`` (every env call guarded), and
    the privileged rows of its oracle steps (``teach``: the kind, the renderer and, for
    ``anchor``, the sanitiser of the episode's actions)."""
    by_anchor = teach is not None and teach[0] == "anchor"
    oracle_states: list[tuple[str, list[Turn], str, str]] = []

    def reset() -> tuple[str, str]:
        obs = check_observation(env, env.reset(task, 0), "reset")
        return obs, read_instruction(env, obs)

    obs, instruction = env_call(reset, task=task.id, turn=0, call="reset")
    history: list[Turn] = []
    ep = Episode(group=group, steps=[], task_id=task.id)
    rows: list[tuple[list[int], list[int]]] = []
    for turn in range(1, max_turns + 1):

        def act(
            turn: int = turn, instruction: str = instruction
        ) -> tuple[str, Any, str, str | None]:
            explore = epsilon > 0 and rng.random() < epsilon
            text: str | None = None
            if teach is not None and not explore:  # an anchor is known once the episode ends
                text = "" if by_anchor else env.privileged_context(teach[0])
            action = env.sample_action(rng) if explore else env.oracle_action()
            tr = step_env(env, action)
            check_step_result(env, tr.result, task=task.id, turn=turn)
            return action, tr, read_instruction(env, instruction), text

        prompt = renderer.prompt_ids(instruction, history, obs)
        action, tr, next_instruction, text = env_call(act, task=task.id, turn=turn, call="step")
        if text:  # only with teach, on an oracle step
            assert teach is not None
            rows.append(
                (teach[1](instruction, list(history), obs, text), renderer.response_ids(action))
            )
        elif text == "":  # an anchor's oracle step
            oracle_states.append((instruction, list(history), obs, action))
        res = tr.result
        ep.steps.append(
            Step(
                observation=obs,
                action=action,
                reward=res.reward,
                terminal=res.done,
                valid=bool(res.info.get("valid", True)),
                state=tr.state,
                next_state=tr.next_state,
                source="oracle",
                prompt_ids=prompt,
                response_ids=renderer.response_ids(action),
                info=tr.info,
            )
        )
        history.append(Turn(obs, action))
        obs, instruction = res.observation, next_instruction  # the goal may change
        if res.done:
            ep.success = bool(res.info.get("success", False))
            break
    if by_anchor and ep.success:
        assert teach is not None
        text = teach[2]([s.action for s in ep.steps])
        rows += [
            (teach[1](instr, hist, o, text), renderer.response_ids(a))
            for instr, hist, o, a in oracle_states
            if text
        ]
    return ep, rows


@dataclass
class SFTStats:
    steps: int
    final_loss: float
    seconds: float
    tokens: int


def pad_rows(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """``(ids, attention, target)``, each ``[B, L]``: the ``(prompt_ids, response_ids)``
    rows concatenated and right-padded with ``pad_id``; ``target`` marks the response
    tokens (the ones SFT learns, and the ones to score)."""
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.bool)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, :n] = torch.as_tensor(p + r, dtype=torch.long)
        attn[i, :n] = True
        target[i, len(p) : n] = True
    return ids, attn, target


def sft_train(
    policy: HFPolicy,
    rows: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    warmup: int = 20,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    on_step: Callable[[int, float], None] | None = None,
) -> SFTStats:
    """Cross-entropy on the response tokens, AdamW with warmup and cosine decay.

    Args:
        policy: the model to train (in place).
        rows: ``(prompt_ids, response_ids)`` pairs.
        steps: optimizer steps.
        batch_size: rows per step (sampled without replacement, epoch by epoch).
        lr: peak learning rate.
        seed: shuffling seed.
        warmup: linear warm-up steps.
        weight_decay: AdamW weight decay.
        grad_clip: max gradient norm.
        on_step: called with ``(step, loss)`` after every step (progress display).

    Raises:
        FloatingPointError: a step's loss or gradient norm is not finite (the step is
            not taken: one such AdamW step turns every weight into NaN).
    """
    if not rows:
        raise ValueError("no demonstration rows to train on")
    model = policy.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # the adapters under LoRA
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    rng = random.Random(seed)
    order: list[int] = []
    start = time.perf_counter()
    tokens = 0
    loss_val = float("nan")
    for step in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(rows)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[:batch_size], order[batch_size:]
        ids, attn, target = pad_rows([rows[i] for i in idx], policy.pad_id)
        lp = policy.score(ids, attn, scored=target).logprobs
        mask = target.to(lp.device)
        loss = -(lp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        check_step(  # a NaN step would make every weight NaN, and be cached
            loss,
            params,
            grad_clip,
            f"SFT step {step + 1} of {steps}",
            "Nothing is cached. Lower sft.lr, or train in float32 (model.dtype=float32) or "
            "mixed precision (model.mixed_precision=bf16) instead of bfloat16 weights",
        )
        opt.step()
        sched.step()
        tokens += int(attn.sum())
        loss_val = float(loss.detach())
        if on_step is not None:
            on_step(step, loss_val)
    return SFTStats(steps, loss_val, time.perf_counter() - start, tokens)
