"""SpatialCLI's internalisation: successful trajectories rewritten so that the policy
states what its tool returned, then SFT on them.

SpatialCLI (three stages: SFT on tool-using demonstrations, agentic RL with the tools,
then SFT on the successful RL trajectories rewritten without the tool, evaluated with the
tools off) teaches a policy to use a tool, then to do without it. See
``docs/algorithms.md#spatialcli`` (paper: SpatialCLI, Zhejiang University and others; no
link) and ``docs/pipelines.md#spatialcli``.

Two rewrites of one trajectory, pure functions (``params.rewrite``):

- :func:`state_tool_results` (``state``, the default and the paper's mechanism): each
  tool-call step is dropped and **its answer moves into the agent's own next turn**: the
  step after it is shown the observation the call was made on (the page without the
  tool's answer) and its response states the answer as a note before the action (the
  plain format's ``<note> action : <action>``, a line before the action in a chat reply),
  so the model learns to produce what the tool gave, then act on it. The answer is what
  the call added to the page (the part of the next observation before the page it was
  called on; the whole next observation when the page changed).
- :func:`remove_tool_calls` (``remove``, the former rewrite): the call and its answer
  are deleted; the next step only sees the page without the answer.

In both the dropped steps' rewards move to the next kept step (the return is unchanged).
:func:`sft_rows` renders a trajectory's prompts anew (the history window then holds no
tool calls either). The ``internalise`` stage trains the input policy on those rows; a
policy that states notes is evaluated with ``rollout.notes=true``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from credo.data import Episode
from credo.pipeline.registry import StageContext, StageResult, register_stage
from credo.pipeline.stages import save_policy
from credo.pipeline.trajectories import read_trajectories, write_trajectories
from credo.rollout.render import Renderer, Turn
from credo.train.config import Config
from credo.train.run import build_run, env_factory
from credo.train.sft import sft_train

__all__ = [
    "REWRITES",
    "InternaliseParams",
    "remove_tool_calls",
    "sft_rows",
    "state_tool_results",
    "tool_answer",
]

#: The rewrites of ``params.rewrite``.
REWRITES = ("state", "remove")


def remove_tool_calls(episode: Episode, is_tool: Callable[[str], bool]) -> Episode:
    """``episode`` with every tool-call step and its result removed (a new episode;
    the input is not changed).

    Step ``t`` kept after a run of dropped tool calls ``t-k .. t-1`` gets the observation
    of step ``t-k`` (the one the first call was made on) and the rewards of the dropped
    steps added to its own. Tool calls at the end (after the last kept step) give their
    rewards to the last kept step, which also takes the episode's terminal flag. Kept
    steps lose their token ids, log-probs and token data (the prompts change; render them
    again with :func:`sft_rows`); everything else is kept.

    Args:
        episode: the trajectory.
        is_tool: whether an action is a call of the tool being internalised (e.g. the
            shop's ``is_optional_tool``).
    """
    kept = []
    carried_obs: str | None = None
    carried_reward = 0.0
    for step in episode.steps:
        if is_tool(step.action):
            if carried_obs is None:
                carried_obs = step.observation
            carried_reward += step.reward
            continue
        kept.append(
            dataclasses.replace(
                step,
                observation=step.observation if carried_obs is None else carried_obs,
                reward=step.reward + carried_reward,
                prompt_ids=[],
                response_ids=[],
                logprobs=[],
                token_data={},
                info=dict(step.info),
                texts=dict(step.texts),
            )
        )
        carried_obs, carried_reward = None, 0.0
    if kept and carried_obs is not None:  # trailing tool calls
        last = kept[-1]
        kept[-1] = dataclasses.replace(
            last,
            reward=last.reward + carried_reward,
            terminal=last.terminal or episode.steps[-1].terminal,
        )
    return dataclasses.replace(episode, steps=kept)


def tool_answer(before: str, after: str) -> str:
    """What a tool call added to the observation it was made on: the part of ``after``
    before ``before`` when ``after`` ends with it (the answer shown above the same
    page), else all of ``after``."""
    if before and after.endswith(before):
        return after[: len(after) - len(before)].strip()
    return after.strip()


def state_tool_results(episode: Episode, is_tool: Callable[[str], bool]) -> Episode:
    """``episode`` with every tool-call step removed and its answer stated by the agent
    (a new episode; the input is not changed).

    As :func:`remove_tool_calls`, and the step kept after a run of calls also gets
    ``texts["note"]``: the answers of those calls (:func:`tool_answer` of each call's
    observation and the next one), joined by spaces, which :func:`sft_rows` renders
    before its action. Calls at the end have no next observation: no answer to state.

    Args:
        episode: the trajectory.
        is_tool: whether an action is a call of the tool being internalised.
    """
    steps = episode.steps
    notes: dict[int, list[str]] = {}
    pending: list[str] = []
    for t, step in enumerate(steps):
        if is_tool(step.action):
            if t + 1 < len(steps):
                pending.append(tool_answer(step.observation, steps[t + 1].observation))
            continue
        if pending:
            notes[t] = pending
            pending = []
    kept_index = [t for t, s in enumerate(steps) if not is_tool(s.action)]
    out = remove_tool_calls(episode, is_tool)
    for k, t in enumerate(kept_index):
        answer = " ".join(a for a in notes.get(t, []) if a)
        if answer:
            out.steps[k].texts["note"] = answer
    return out


def sft_rows(episode: Episode, renderer: Renderer) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, response_ids)`` per step of ``episode``, prompts rendered from its
    steps' instructions (``Step.texts["instruction"]``), observations and the history of
    its own earlier actions (the renderer keeps its window), as the sampler renders them.

    A step with ``texts["note"]`` (:func:`state_tool_results`) answers with the note
    stated before its action (the renderer's ``note_response_ids``).

    Args:
        episode: a trajectory whose steps carry their instruction.
        renderer: the policy's renderer.
    """
    rows, history = [], []
    for step in episode.steps:
        instruction = step.texts.get("instruction", "")
        note = step.texts.get("note")
        if note:
            if not callable(getattr(renderer, "note_response_ids", None)):
                raise ValueError(
                    f"{type(renderer).__name__} cannot state a note before an action (no "
                    "note_response_ids); use params.rewrite=remove"
                )
            response = renderer.note_response_ids(note, step.action)  # type: ignore[attr-defined]
        else:
            response = renderer.response_ids(step.action)
        rows.append((renderer.prompt_ids(instruction, history, step.observation), response))
        history.append(Turn(step.observation, step.action))
    return rows


@dataclass
class InternaliseParams:
    """Knobs of the ``internalise`` stage.

    Attributes:
        steps: SFT optimizer steps on the rewritten trajectories (default 200).
        batch_size: rows per step (default 32).
        lr: peak learning rate (default 3e-4; cosine-decayed, 20 warm-up steps).
        success_only: train on successful trajectories only (default true, as in
            SpatialCLI).
        rewrite: ``state`` (default: the tool's answer moves into the agent's own turn,
            :func:`state_tool_results`) or ``remove`` (the call and its answer deleted,
            :func:`remove_tool_calls`).
    """

    steps: int = 200
    batch_size: int = 32
    lr: float = 3e-4
    success_only: bool = True
    rewrite: str = "state"

    def __post_init__(self) -> None:
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ValueError(f"steps must be an integer ≥ 1, got {self.steps!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be an integer ≥ 1, got {self.batch_size!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be a number > 0, got {self.lr!r}")
        if self.rewrite not in REWRITES:
            raise ValueError(f"rewrite must be one of {', '.join(REWRITES)}, got {self.rewrite!r}")


def _check(cfg: Config, params: Any) -> None:
    """The env must say which actions are its optional tool's."""
    env = env_factory(cfg)()
    if not callable(getattr(env, "is_optional_tool", None)):
        raise ValueError(
            f"env {cfg.env.name!r} has no is_optional_tool(action): internalise removes the "
            "calls of an env's optional tool (the shop's lookup, env.kwargs.tools=on)"
        )


@register_stage(
    "internalise",
    needs=("policy", "trajectories"),
    makes=("policy", "trajectories"),
    params=InternaliseParams,
    check=_check,
)
def internalise_stage(ctx: StageContext) -> StageResult:
    """SFT of the input policy on the input trajectories (the successful ones by
    default) with the env's tool calls removed; writes ``internalised.jsonl`` (the
    rewritten trajectories) and ``policy/``."""
    p: InternaliseParams = ctx.params
    run = build_run(ctx.cfg, policy_path=ctx.inputs["policy"])
    try:
        is_tool = run.make_env().is_optional_tool
        episodes = read_trajectories(ctx.inputs["trajectories"])
        chosen = [e for e in episodes if e.success or not p.success_only]
        if not chosen:
            raise ValueError(
                f"stage {ctx.name!r}: none of the {len(episodes)} trajectories in "
                f"{ctx.inputs['trajectories']} is successful; nothing to internalise (more "
                "RL, more trajectories, or params.success_only=false)"
            )
        rewrite = state_tool_results if p.rewrite == "state" else remove_tool_calls
        rewritten = [rewrite(e, is_tool) for e in chosen]
        write_trajectories(ctx.folder / "internalised.jsonl", rewritten)
        rows = [row for e in rewritten for row in sft_rows(e, run.renderer)]
        torch.manual_seed(ctx.cfg.train.seed)
        stats = sft_train(
            run.policy,
            rows,
            steps=p.steps,
            batch_size=p.batch_size,
            lr=p.lr,
            seed=ctx.cfg.train.seed,
            warmup=min(20, p.steps),
        )
        save_policy(run.policy, ctx.folder / "policy")
    finally:
        run.close()
    calls = sum(len(e.steps) for e in chosen) - sum(len(e.steps) for e in rewritten)
    notes = sum("note" in s.texts for e in rewritten for s in e.steps)
    return StageResult(
        outputs={"policy": "policy", "trajectories": "internalised.jsonl"},
        table=[
            ("trajectories read", len(episodes)),
            ("trajectories used", len(chosen)),
            ("tool calls removed", calls),
            ("answers stated by the agent", notes),
            ("tool calls per used trajectory", round(calls / len(chosen), 3)),
            ("SFT rows (steps kept)", len(rows)),
            ("SFT steps", stats.steps),
            ("final SFT loss", round(stats.final_loss, 4)),
        ],
        summary={
            "tool_calls_removed": calls,
            "answers_stated": notes,
            "trajectories_used": len(chosen),
        },
    )
