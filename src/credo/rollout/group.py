"""The group sampler: G episodes per task, every live episode advanced together.

Each turn, the prompts of all live episodes (of all tasks) go to the policy in one
batched ``generate`` call; each response is turned into an action and stepped in its env.
An env that raises fails its episode (the error is kept in ``Episode.error``) and the
others go on. The result is a :class:`~credo.data.RolloutForest` (one chain per episode,
``group`` = the task's index in the batch) plus the :class:`~credo.data.Episode` list.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.data import Episode, ForestBuilder, RolloutForest, Step
from credo.envs.base import Task, step_env
from credo.policy.base import Policy, SamplingParams
from credo.rollout.render import Renderer, Turn

__all__ = ["EpisodeRunner", "RolloutResult", "run_episodes", "sample_groups"]


@dataclass
class RolloutResult:
    """A sampler's output.

    Attributes:
        forest: the rows (steps) of every episode.
        episodes: one :class:`Episode` per root-to-leaf path (including episodes that
            failed at ``reset`` and therefore have no rows).
        env_steps: number of env steps taken.
        generated_tokens: number of response tokens sampled.
        seconds: wall time.
    """

    forest: RolloutForest
    episodes: list[Episode]
    env_steps: int
    generated_tokens: int
    seconds: float

    @property
    def success_rate(self) -> float:
        return sum(e.success for e in self.episodes) / max(1, len(self.episodes))

    @property
    def mean_return(self) -> float:
        return sum(e.ret for e in self.episodes) / max(1, len(self.episodes))


@dataclass
class EpisodeRunner:
    """One live episode: its env, its history and the steps recorded so far."""

    env: Any
    task: Task
    group: int
    episode: Episode
    instruction: str = ""
    observation: str = ""
    history: list[Turn] = field(default_factory=list)
    done: bool = False

    def start(self, seed: int) -> None:
        try:
            self.observation = self.env.reset(self.task, seed)
            self.instruction = (
                self.env.instruction() if hasattr(self.env, "instruction") else self.observation
            )
        except Exception as exc:  # a user env that raises fails its episode, not the run
            self.fail("reset", exc)

    def fail(self, where: str, exc: BaseException) -> None:
        self.episode.error = f"{where}: {type(exc).__name__}: {exc}"
        self.episode.success = False
        self.done = True
        self._trace = traceback.format_exc(limit=3)


def run_episodes(
    runners: list[EpisodeRunner],
    policy: Policy,
    renderer: Renderer,
    sampling: SamplingParams,
    *,
    max_turns: int,
    generator: torch.Generator | None = None,
    invalid_penalty: float = 0.0,
) -> tuple[int, int]:
    """Advance every runner to the end of its episode, one batched generation per turn.

    Returns ``(env_steps, generated_tokens)``. Steps are appended to each runner's
    ``episode.steps`` with token data; ``info`` keeps the env's info plus
    ``abstract_state``/``abstract_next_state``/``progress`` when the env provides them.
    """
    env_steps = gen_tokens = 0
    for _ in range(max_turns):
        live = [r for r in runners if not r.done]
        if not live:
            break
        prompts = [renderer.prompt_ids(r.instruction, r.history, r.observation) for r in live]
        gens = policy.generate(prompts, sampling, generator)
        for r, prompt, gen in zip(live, prompts, gens):
            gen_tokens += len(gen.token_ids)
            action = renderer.extract_action(gen.text, r.env)
            try:
                tr = step_env(r.env, action)
            except Exception as exc:
                r.fail("step", exc)
                if r.episode.steps:
                    r.episode.steps[-1].terminal = True
                continue
            env_steps += 1
            result, info = tr.result, tr.info
            valid = bool(info.get("valid", True))
            step = Step(
                observation=r.observation,
                action=action,
                reward=float(result.reward) - (0.0 if valid else invalid_penalty),
                terminal=bool(result.done),
                valid=valid,
                state=tr.state,
                next_state=tr.next_state,
                prompt_ids=prompt,
                response_ids=gen.token_ids,
                logprobs=gen.logprobs.tolist(),
                info=info,
                token_data=(
                    {"aux_ids": gen.aux_ids, "aux_old_logprobs": gen.aux_logprobs}
                    if gen.aux_ids is not None
                    else {}
                ),
            )
            r.episode.steps.append(step)
            r.history.append(Turn(r.observation, action))
            r.observation = result.observation
            if result.done:
                r.done = True
                r.episode.success = bool(result.info.get("success", False))
    for r in runners:  # the sampler's own turn cap ends what the env did not
        r.done = True
    return env_steps, gen_tokens


def episodes_to_forest(episodes: Sequence[Episode]) -> RolloutForest:
    """Chains of the episodes' steps, with the optional per-step extras as columns."""
    from credo.data.ops import hash_key

    builder = ForestBuilder()
    want_abstract = any("abstract_state" in s.info for e in episodes for s in e.steps)
    want_progress = any("progress" in s.info for e in episodes for s in e.steps)
    for e in episodes:
        parent = -1
        for s in e.steps:
            extras: dict[str, float | int] = {}
            if want_abstract:
                extras["abstract_state"] = hash_key(str(s.info.get("abstract_state", "")))
                extras["abstract_next_state"] = hash_key(str(s.info.get("abstract_next_state", "")))
            if want_progress:
                extras["progress"] = float(s.info.get("progress", 0.0))
            parent = builder.add(e.group, parent, s, **extras)
        if parent >= 0:
            builder.mark_success(parent, e.success)
    return builder.build()


def sample_groups(
    policy: Policy,
    renderer: Renderer,
    make_env: Callable[[], Any],
    tasks: Sequence[Task],
    *,
    group_size: int,
    sampling: SamplingParams,
    max_turns: int,
    generator: torch.Generator | None = None,
    env_seed: int = 0,
    invalid_penalty: float = 0.0,
) -> RolloutResult:
    """Run ``group_size`` episodes of each task (same task, same env seed) together.

    Args:
        policy: samples the actions.
        renderer: builds prompts and parses actions.
        make_env: creates a fresh env (one per episode).
        tasks: the tasks of this iteration; task ``i`` becomes group ``i``.
        group_size: G, episodes per task.
        sampling: sampling parameters.
        max_turns: the sampler's turn cap (envs usually end episodes earlier).
        generator: torch RNG for sampling (deterministic runs).
        env_seed: seed passed to ``env.reset``.
        invalid_penalty: subtracted from the reward of an invalid action (GiGPO's −c).
    """
    start = time.perf_counter()
    runners = []
    for gi, task in enumerate(tasks):
        for _ in range(group_size):
            r = EpisodeRunner(make_env(), task, gi, Episode(group=gi, steps=[], task_id=task.id))
            r.start(env_seed)
            runners.append(r)
    env_steps, gen_tokens = run_episodes(
        runners,
        policy,
        renderer,
        sampling,
        max_turns=max_turns,
        generator=generator,
        invalid_penalty=invalid_penalty,
    )
    episodes = [r.episode for r in runners]
    return RolloutResult(
        forest=episodes_to_forest(episodes),
        episodes=episodes,
        env_steps=env_steps,
        generated_tokens=gen_tokens,
        seconds=time.perf_counter() - start,
    )
