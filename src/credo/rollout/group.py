"""The group sampler: G episodes per task, every live episode advanced together.

Each turn, the prompts of all live episodes (of all tasks) go to the policy in one
batched ``generate`` call; each response is turned into an action and stepped in its env.
An env that raises fails its episode (the error is kept in ``Episode.error``) and the
others go on. The result is a :class:`~credo.data.RolloutForest` (one chain per episode,
``group`` = the task's index in the batch) plus the :class:`~credo.data.Episode` list.

The pieces are shared with the branching samplers (:mod:`credo.rollout.tree`,
:mod:`credo.rollout.resample`, :mod:`credo.rollout.oracle`):

- :class:`EpisodeRunner` is one live episode. It may start in the middle of another
  episode (a branch: its ``episode.steps`` then begin with the shared prefix steps and
  its ``history`` with the prefix turns), may keep an env snapshot before every step
  (``snapshots``) so that later branches can restart there, and may be given the first
  tokens of its next response (``forced``: AXPO keeps a step's thinking and re-samples
  only the rest).
- :func:`run_episodes` advances any set of runners together, one ``generate`` call per
  turn; each runner stops at the turn cap counted from the episode's start.
- :class:`Trajectory` records where a runner's episode came from (a root, or a branch of
  an earlier trajectory after ``prefix`` shared steps), and
  :func:`trajectories_to_forest` turns a list of them into one forest in which a branch
  re-uses its prefix's rows (parent pointers) instead of copying them.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.data import Episode, ForestBuilder, RolloutForest, Step
from credo.envs.base import Task, privileged_context, snapshot_env, step_env
from credo.policy.base import SessionPolicy
from credo.rollout.envguard import EnvCallError, check_observation, check_step_result, env_call
from credo.rollout.ray_envs import prefetch
from credo.rollout.render import Turn
from credo.rollout.sampler import SamplerContext, register_sampler

__all__ = [
    "EpisodeRunner",
    "ForcedPrefix",
    "RolloutResult",
    "Trajectory",
    "episodes_to_forest",
    "read_instruction",
    "run_episodes",
    "runners_result",
    "sample_groups",
    "sample_single",
    "start_runners",
    "take_step",
    "trajectories_to_forest",
]


@dataclass
class Trajectory:
    """One root-to-leaf path as a sampler produced it.

    Attributes:
        episode: the whole path, root first (a branch's first ``prefix`` steps are the
            *same* :class:`Step` objects as its source's).
        source: index (in the sampler's trajectory list) of the trajectory this one
            branched from, −1 for a root. A source always comes before its branches.
        prefix: number of leading steps shared with ``source`` (0 for a root; a branch
            with ``prefix = k`` re-sampled the action at depth ``k``).
        runner: the runner that produced it (holds the env snapshots), if kept.
    """

    episode: Episode
    source: int = -1
    prefix: int = 0
    runner: EpisodeRunner | None = None


@dataclass
class RolloutResult:
    """A sampler's output.

    Attributes:
        forest: the rows (steps) of every episode; branches share their prefix rows.
        episodes: one :class:`Episode` per root-to-leaf path of the policy's episodes
            (including episodes that failed at ``reset`` and therefore have no rows);
            oracle continuations are not episodes of the policy and are not listed.
        env_steps: number of env steps taken (recorded rows; replays that verify a
            restore are counted in ``stats["rollout/restore_steps"]`` instead).
        generated_tokens: number of response tokens sampled.
        seconds: wall time.
        stats: sampler-specific numbers for the metrics log (``rollout/...``), e.g. the
            number of branches or of restore divergences.
        trajectories: the paths with their provenance (see :class:`Trajectory`), in
            forest order; add-ons such as oracle continuations branch from them.
    """

    forest: RolloutForest
    episodes: list[Episode]
    env_steps: int
    generated_tokens: int
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    @property
    def success_rate(self) -> float:
        return sum(e.success for e in self.episodes) / max(1, len(self.episodes))

    @property
    def mean_return(self) -> float:
        return sum(e.ret for e in self.episodes) / max(1, len(self.episodes))


@dataclass
class ForcedPrefix:
    """The first tokens of a runner's next response, kept rather than sampled.

    Attributes:
        ids: the token ids.
        logprobs: the log-probs they were originally sampled with (same length).
        token_data: per-token tensors of the original step, cut to these tokens.
    """

    ids: list[int]
    logprobs: list[float]
    token_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeRunner:
    """One live episode: its env, its history and the steps recorded so far.

    Attributes:
        env: the env, at the state where the next action is taken.
        task: the task.
        group: the group id of the episode's rows.
        episode: the steps so far (for a branch: the shared prefix steps first).
        instruction: the goal shown in the next prompt (``env.instruction()``, asked again
            after every step; the first observation for envs without it).
        observation: the current observation.
        history: past turns (for a branch: the prefix turns first).
        done: the episode is over.
        snapshots: ``None`` (default) or a list that receives ``snapshot_env(env)``
            before every step, so that ``snapshots[t]`` is the state in which the action
            at depth ``t`` was taken (a branch starts with its source's snapshots of the
            prefix).
        source: ``Step.source`` of the steps this runner records (``"policy"``,
            ``"resample"`` or ``"oracle"``).
        forced: the first tokens of the next response (used once), or ``None``.
    """

    env: Any
    task: Task
    group: int
    episode: Episode
    instruction: str = ""
    observation: str = ""
    history: list[Turn] = field(default_factory=list)
    done: bool = False
    snapshots: list[Any] | None = None
    source: str = "policy"
    forced: ForcedPrefix | None = None

    def start(self, seed: int) -> None:
        """``reset`` the env on the task (guarded: an env that raises, hangs or returns a
        non-string observation fails this episode, not the run;
        :mod:`credo.rollout.envguard`)."""

        def reset() -> tuple[str, str]:
            obs = check_observation(self.env, self.env.reset(self.task, seed), "reset")
            return obs, read_instruction(self.env, obs)

        try:
            self.observation, self.instruction = env_call(
                reset, task=self.task.id, turn=0, call="reset"
            )
        except EnvCallError as exc:
            self.fail("reset", exc.cause)

    def fail(self, where: str, exc: BaseException) -> None:
        self.episode.error = f"{where}: {type(exc).__name__}: {exc}"
        self.episode.success = False
        self.done = True
        self._trace = "".join(traceback.format_exception(exc, limit=3))


def read_instruction(env: Any, default: str) -> str:
    """``env.instruction()`` (which must return a str), or ``default`` for envs without it."""
    if not hasattr(env, "instruction"):
        return default
    return check_observation(env, env.instruction(), "instruction")


def start_runners(
    make_env: Callable[[], Any],
    tasks: Sequence[Task],
    per_task: int,
    *,
    env_seed: int = 0,
    keep_snapshots: bool = False,
    groups: Sequence[int] | None = None,
) -> list[EpisodeRunner]:
    """``per_task`` fresh runners for each task (task-major order), reset and ready.

    Args:
        make_env: creates a fresh env.
        tasks: the tasks; task ``i`` becomes group ``groups[i]`` (default ``i``).
        per_task: runners per task.
        env_seed: seed passed to ``env.reset``.
        keep_snapshots: record an env snapshot before every step (for branching).
        groups: group id of each task (default: its index).
    """
    runners = []
    for i, task in enumerate(tasks):
        g = i if groups is None else int(groups[i])
        for _ in range(per_task):
            r = EpisodeRunner(
                make_env(),
                task,
                g,
                Episode(group=g, steps=[], task_id=task.id),
                snapshots=[] if keep_snapshots else None,
            )
            runners.append(r)
    # envs in Ray actors reset all at once (credo.rollout.ray_envs); others as they start
    prefetch([(r.env, "reset", (r.task, env_seed), False) for r in runners])
    for r in runners:
        r.start(env_seed)
    return runners


def take_step(
    r: EpisodeRunner,
    action: str,
    *,
    prompt_ids: list[int],
    response_ids: list[int],
    logprobs: list[float],
    token_data: dict[str, Any] | None = None,
    invalid_penalty: float = 0.0,
    texts: dict[str, str] | None = None,
) -> bool:
    """Step ``r``'s env with ``action`` and record the step; False if the env raised.

    Records a :class:`Step` with the given token data and ``r.source``; ``info`` keeps the
    env's info plus ``abstract_state``/``abstract_next_state``/``progress`` when the env
    provides them. Takes the snapshot first when ``r.snapshots`` is a list. The env calls
    are guarded (:func:`~credo.rollout.envguard.env_call`): an env that raises, hangs or
    returns a non-string observation fails the episode (its last recorded step becomes
    terminal); a non-finite reward raises :class:`~credo.rollout.envguard.EnvFailure`.
    """
    turn = len(r.episode.steps) + 1

    def act() -> tuple[Any, str]:
        tr = step_env(r.env, action)
        check_step_result(r.env, tr.result, task=r.task.id, turn=turn)
        return tr, read_instruction(r.env, r.instruction)

    try:
        if r.snapshots is not None:  # its own guarded call: a failure is named `snapshot`
            snap = env_call(lambda: snapshot_env(r.env), task=r.task.id, turn=turn, call="snapshot")
            r.snapshots.append(snap)
        tr, instruction = env_call(act, task=r.task.id, turn=turn, call="step")
    except EnvCallError as exc:
        r.fail(exc.record.call, exc.cause)
        if r.episode.steps:
            r.episode.steps[-1].terminal = True
        return False
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
        source=r.source,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        logprobs=logprobs,
        info=info,
        token_data=token_data or {},
        texts=texts or {},
    )
    r.episode.steps.append(step)
    r.history.append(Turn(r.observation, action))
    r.observation = result.observation
    r.instruction = instruction
    if result.done:
        r.done = True
        r.episode.success = bool(result.info.get("success", False))
    return True


def state_texts(r: EpisodeRunner, names: Sequence[str]) -> dict[str, str]:
    """The texts a teacher asked for (``SamplerContext.texts``) about ``r``'s current
    state, before its action is taken: ``instruction`` is the goal shown in the prompt,
    any other name a privileged kind asked from the env (``""`` when it offers none)."""
    return {
        n: r.instruction if n == "instruction" else (privileged_context(r.env, n) or "")
        for n in names
    }


def run_episodes(
    runners: list[EpisodeRunner],
    ctx: SamplerContext,
    on_turn: Callable[[list[EpisodeRunner]], None] | None = None,
) -> tuple[int, int]:
    """Advance every runner to the end of its episode, one batched generation per turn.

    ``ctx.max_turns`` caps each episode's length counted from its root (a branch that
    starts at depth k has ``max_turns − k`` turns left). A runner with a ``forced`` prefix gets
    it appended to its prompt for that turn; its recorded response is the prefix plus
    the sampled tokens (with the prefix's original log-probs). ``on_turn(live)``, when
    given, sees the live runners before each turn's generation and may end some (set
    ``done``: GraphPO's merging sampler stops a runner that reached a state another has
    expanded). Returns ``(env_steps, generated_tokens)``; steps are appended to each
    runner's ``episode.steps`` (see :func:`take_step`).
    """
    policy, renderer = ctx.policy, ctx.renderer
    # one KV-cache session per runner (multi-turn reuse, credo.policy.kvcache)
    keys = {id(r): object() for r in runners} if isinstance(policy, SessionPolicy) else {}
    env_steps = gen_tokens = 0
    while True:
        for r in runners:
            if not r.done and len(r.episode.steps) >= ctx.max_turns:
                r.done = True  # the sampler's own turn cap ends what the env did not
        live = [r for r in runners if not r.done]
        if on_turn is not None and live:
            on_turn(live)
            live = [r for r in live if not r.done]
        if not live:
            break
        prompts = [renderer.prompt_ids(r.instruction, r.history, r.observation) for r in live]
        inputs = [p + r.forced.ids if r.forced else p for r, p in zip(live, prompts)]
        extra = {"sessions": [keys[id(r)] for r in live]} if keys else {}
        gens = policy.generate(inputs, ctx.sampling, ctx.generator, **extra)
        moves = []
        for r, prompt, gen in zip(live, prompts, gens):
            gen_tokens += len(gen.token_ids)
            response, logprobs, text = list(gen.token_ids), gen.logprobs.tolist(), gen.text
            token_data: dict[str, Any] = {}
            if gen.aux_ids is not None:  # KLPO's auxiliary draws
                token_data.update(aux_ids=gen.aux_ids, aux_old_logprobs=gen.aux_logprobs)
            if gen.topk_ids is not None:  # KLPO's top-K head
                token_data.update(topk_ids=gen.topk_ids, topk_old_logprobs=gen.topk_logprobs)
            if r.forced is not None:
                f, r.forced = r.forced, None
                body = response[:-1] if gen.finished else response
                text = policy.tokenizer.decode(f.ids + body, skip_special_tokens=True).strip()
                response, logprobs = f.ids + response, f.logprobs + logprobs
                token_data = {
                    k: torch.cat([torch.as_tensor(f.token_data[k]), torch.as_tensor(v)])
                    for k, v in token_data.items()
                    if k in f.token_data
                }
            action = renderer.extract_action(text, r.env)
            texts = state_texts(r, ctx.texts) if ctx.texts else None
            moves.append((r, action, prompt, response, logprobs, token_data, texts))
        # envs in Ray actors step all at once (credo.rollout.ray_envs); others one by one
        prefetch([(m[0].env, "step", (m[1],), m[0].snapshots is not None) for m in moves])
        for r, action, prompt, response, logprobs, token_data, texts in moves:
            if take_step(
                r,
                action,
                prompt_ids=prompt,
                response_ids=response,
                logprobs=logprobs,
                token_data=token_data,
                invalid_penalty=ctx.invalid_penalty,
                texts=texts,
            ):
                env_steps += 1
        if keys:  # free the caches of the episodes that just ended
            policy.end_sessions([keys.pop(id(r)) for r in live if r.done])  # type: ignore[attr-defined]
    if keys:
        policy.end_sessions(keys.values())  # type: ignore[attr-defined]
    return env_steps, gen_tokens


def trajectories_to_forest(
    trajectories: Sequence[Trajectory],
) -> tuple[RolloutForest, torch.Tensor]:
    """One forest from trajectories; a branch re-uses its source's first ``prefix`` rows.

    Rows are added in trajectory order, each trajectory's new steps (those after its
    prefix) as a chain under the last shared row (−1 for a root); the leaf gets the
    episode's success. A trajectory without new steps (its env failed at once) adds no
    row. Per-step ``abstract_state``/``abstract_next_state`` (hashed) and ``progress``
    become extra columns when any step has them.

    Returns:
        ``(forest, owner [N])``: ``owner[i]`` is the index of the trajectory that created
        row ``i`` (the one to restore from to branch at that row).
    """
    from credo.data.ops import hash_key

    builder = ForestBuilder()
    steps = [s for tr in trajectories for s in tr.episode.steps[tr.prefix :]]
    want_abstract = any("abstract_state" in s.info for s in steps)
    want_progress = any("progress" in s.info for s in steps)
    rows_of: list[list[int]] = []
    owner: list[int] = []
    for k, tr in enumerate(trajectories):
        e = tr.episode
        if tr.source >= 0:
            if tr.source >= k:
                raise ValueError(f"trajectory {k} branches from a later one ({tr.source})")
            if tr.prefix > len(rows_of[tr.source]):
                raise ValueError(
                    f"trajectory {k} shares {tr.prefix} steps with trajectory {tr.source}, "
                    f"which has only {len(rows_of[tr.source])} rows"
                )
            rows = rows_of[tr.source][: tr.prefix]
        elif tr.prefix:
            raise ValueError(f"trajectory {k} is a root (source −1) with prefix {tr.prefix}")
        else:
            rows = []
        parent = rows[-1] if rows else -1
        for s in e.steps[tr.prefix :]:
            extras: dict[str, float | int] = {}
            if want_abstract:
                extras["abstract_state"] = hash_key(str(s.info.get("abstract_state", "")))
                extras["abstract_next_state"] = hash_key(str(s.info.get("abstract_next_state", "")))
            if want_progress:
                extras["progress"] = float(s.info.get("progress", 0.0))
            parent = builder.add(e.group, parent, s, **extras)
            rows.append(parent)
            owner.append(k)
        if len(e.steps) > tr.prefix:
            builder.mark_success(parent, e.success)
        rows_of.append(rows)
    return builder.build(), torch.tensor(owner, dtype=torch.long)


def episodes_to_forest(episodes: Sequence[Episode]) -> RolloutForest:
    """Chains of the episodes' steps, with the optional per-step extras as columns."""
    return trajectories_to_forest([Trajectory(e) for e in episodes])[0]


@register_sampler("group")
def sample_groups(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: None = None,
    state: None = None,
) -> RolloutResult:
    """Run ``group_size`` episodes of each task (same task, same env seed) together.

    Args:
        ctx: policy, renderer, env factory, sampling, turn cap, RNG (with
            ``ctx.keep_snapshots`` an env snapshot is kept before every step, so that
            add-ons can branch from any step).
        tasks: the tasks of this iteration; task ``i`` becomes group ``i``.
        group_size: G, episodes per task.
        params, state: unused (the group sampler has no knobs and keeps no state).
    """
    start = time.perf_counter()
    runners = start_runners(
        ctx.make_env, tasks, group_size, env_seed=ctx.env_seed, keep_snapshots=ctx.keep_snapshots
    )
    env_steps, gen_tokens = run_episodes(runners, ctx)
    return runners_result(runners, env_steps, gen_tokens, start)


def runners_result(
    runners: Sequence[EpisodeRunner],
    env_steps: int,
    gen_tokens: int,
    start: float,
    stats: dict[str, float] | None = None,
) -> RolloutResult:
    """The :class:`RolloutResult` of finished runners, one root trajectory each (``start``:
    the sampler's ``perf_counter`` at its start)."""
    trajectories = [Trajectory(r.episode, runner=r) for r in runners]
    return RolloutResult(
        forest=trajectories_to_forest(trajectories)[0],
        episodes=[r.episode for r in runners],
        env_steps=env_steps,
        generated_tokens=gen_tokens,
        seconds=time.perf_counter() - start,
        stats=stats or {},
        trajectories=trajectories,
    )


@register_sampler("single")
def sample_single(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int = 1,
    params: None = None,
    state: None = None,
) -> RolloutResult:
    """One episode per task (KLPO): the group sampler with G = 1, whatever
    ``group_size`` says."""
    return sample_groups(ctx, tasks, group_size=1)
