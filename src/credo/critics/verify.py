"""CAST's online verification: the critic judges every sampled action before the env
executes it.

:class:`CriticGuard` wraps the policy that a sampler calls (:meth:`CriticGuard.wrap`):
each ``generate`` call samples the responses, scores every (prompt text, response text)
pair with the critic and, by ``on_flag``:

``resample``  re-draws the flagged responses (same prompt, same sampling, the run's
              generator) up to ``max_resamples`` times; the first unflagged draw is kept,
              else the last one (an *unresolved* flag). The kept draw is what the env
              executes and what the update trains on, with its own log-probs (rejection
              sampling: the rollouts then follow the policy restricted to actions the
              critic accepts).
``penalise``  keeps the draw; :meth:`CriticGuard.finish` subtracts ``penalty`` from the
              reward of that step (rows of the forest and ``Step.reward``).
``log``       keeps the draw and only records the flag.

:meth:`CriticGuard.finish` (call it on the sampler's result) writes ``critic_p`` and
``critic_flag`` into each step's ``info``, applies the penalties and adds to
``result.stats``:

- ``critic/flags``: flagged draws (rejected re-draws included);
- ``critic/resamples``: re-draws made;
- ``critic/flagged_steps``: executed steps whose action was flagged;
- ``critic/flag_rate``: flagged_steps / executed policy steps;
- ``critic/false_alarm_proxy``: of the executed flagged steps, the share in episodes that
  succeeded (a flag on a winning path is most likely a false alarm; the labeller's exact
  rate needs the privileged state, :func:`credo.commands.cast.critic_stage`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.policy.base import Generation, SamplingParams

__all__ = ["ON_FLAG", "CriticGuard", "GuardedPolicy", "guard_from_config"]

#: What to do with a flagged action.
ON_FLAG = ("resample", "penalise", "log")


@dataclass
class CriticGuard:
    """The critic and the policy for flagged actions (module docstring).

    Attributes:
        critic: judges (context, action) pairs; anything with ``flag_probs(contexts,
            actions) -> [B]`` (a :class:`~credo.critics.critic.Critic`, or a scripted one
            in tests).
        threshold: flag when p_flag ≥ threshold.
        on_flag: ``resample``, ``penalise`` or ``log``.
        max_resamples: re-draws per flagged action (``resample``).
        penalty: subtracted from a flagged step's reward (``penalise``).
        seen: ``(prompt ids, response ids) → p_flag`` of the draws kept since the last
            :meth:`finish`.
        counts: ``flags``, ``resamples`` since the last :meth:`finish`.
    """

    critic: Any
    threshold: float = 0.5
    on_flag: str = "log"
    max_resamples: int = 2
    penalty: float = 0.1
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"flags": 0, "resamples": 0})

    def __post_init__(self) -> None:
        if self.on_flag not in ON_FLAG:
            raise ValueError(f"critic.on_flag={self.on_flag!r}; accepted: {', '.join(ON_FLAG)}")
        if self.max_resamples < 0:
            raise ValueError(f"critic.max_resamples must be ≥ 0, got {self.max_resamples}")

    def wrap(self, policy: Any) -> GuardedPolicy:
        """``policy`` with every ``generate`` call verified by the critic."""
        return GuardedPolicy(policy, self)

    def judge(
        self, policy: Any, prompts: Sequence[list[int]], gens: Sequence[Generation]
    ) -> list[float]:
        """``p_flag`` of each (prompt, generation): the critic reads the decoded prompt
        and the response text."""
        if not prompts:
            return []
        tok = policy.tokenizer
        contexts = [tok.decode(p, skip_special_tokens=True) for p in prompts]
        p = self.critic.flag_probs(contexts, [g.text for g in gens])
        return [float(x) for x in torch.as_tensor(p).reshape(-1)]

    def finish(self, result: Any) -> Any:
        """Record the flags in ``result`` (a :class:`~credo.rollout.group.RolloutResult`),
        apply the penalties, add the ``critic/...`` stats; resets the guard's records."""
        flagged_steps = steps = in_success = 0
        penalties: dict[int, float] = {}
        for ep in result.episodes:
            for s in ep.steps:
                key = (tuple(s.prompt_ids), tuple(s.response_ids))
                if s.source != "policy" or key not in self.seen:
                    continue
                p = self.seen[key]
                flag = p >= self.threshold
                if "critic_p" not in s.info:
                    steps += 1
                    flagged_steps += flag
                    in_success += flag and ep.success
                    if flag and self.on_flag == "penalise":
                        s.reward -= self.penalty
                        penalties[id(s)] = self.penalty
                s.info["critic_p"], s.info["critic_flag"] = p, bool(flag)
        if penalties:
            result.forest = result.forest.with_rewards(self._forest_rewards(result, penalties))
        result.stats.update(
            {
                "critic/flags": float(self.counts["flags"]),
                "critic/resamples": float(self.counts["resamples"]),
                "critic/flagged_steps": float(flagged_steps),
                "critic/flag_rate": flagged_steps / steps if steps else 0.0,
                "critic/false_alarm_proxy": in_success / flagged_steps if flagged_steps else 0.0,
            }
        )
        self.seen.clear()
        self.counts = {"flags": 0, "resamples": 0}
        return result

    @staticmethod
    def _forest_rewards(result: Any, penalties: dict[int, float]) -> torch.Tensor:
        """The forest's ``[N]`` rewards less the penalties; rows follow the trajectories'
        new steps in order (:func:`credo.rollout.group.trajectories_to_forest`)."""
        reward = result.forest.reward.clone()
        paths = result.trajectories or []
        rows = [s for tr in paths for s in tr.episode.steps[tr.prefix :]]
        if len(rows) != reward.shape[0]:
            raise ValueError(
                f"critic penalise: {len(rows)} trajectory steps for {reward.shape[0]} forest "
                "rows; use on_flag=log or resample with this sampler"
            )
        for i, s in enumerate(rows):
            reward[i] -= penalties.get(id(s), 0.0)
        return reward


class GuardedPolicy:
    """A policy whose ``generate`` is verified by a :class:`CriticGuard`; every other
    attribute is the wrapped policy's."""

    def __init__(self, policy: Any, guard: CriticGuard) -> None:
        self._policy = policy
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> list[Generation]:
        """Sample, judge, and (``resample``) re-draw the flagged responses."""
        g = self._guard
        gens = list(self._policy.generate(prompts, sampling, generator, **kwargs))
        probs = g.judge(self._policy, prompts, gens)
        todo = [i for i, p in enumerate(probs) if p >= g.threshold]
        g.counts["flags"] += len(todo)
        tries = 0
        while todo and g.on_flag == "resample" and tries < g.max_resamples:
            tries += 1
            g.counts["resamples"] += len(todo)
            extra = {k: [v[i] for i in todo] for k, v in kwargs.items() if v is not None}
            redo = self._policy.generate([prompts[i] for i in todo], sampling, generator, **extra)
            redo_p = g.judge(self._policy, [prompts[i] for i in todo], redo)
            still = []
            for i, gen, p in zip(todo, redo, redo_p):
                gens[i], probs[i] = gen, p
                if p >= g.threshold:
                    still.append(i)
            g.counts["flags"] += len(still)
            todo = still
        for prompt, gen, p in zip(prompts, gens, probs):
            g.seen[(tuple(prompt), tuple(gen.token_ids))] = p
        return gens


def guard_from_config(section: Any) -> CriticGuard | None:
    """The guard a run's ``critic`` config section asks for (``None`` when ``path`` is
    unset): the critic loaded from ``section.path`` with the section's knobs."""
    if getattr(section, "path", None) is None:
        return None
    from credo.critics.critic import load_critic

    critic = load_critic(section.path, threshold=section.threshold)
    return CriticGuard(
        critic,
        threshold=section.threshold,
        on_flag=section.on_flag,
        max_resamples=section.max_resamples,
        penalty=section.penalty,
    )
