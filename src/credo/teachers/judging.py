"""The judge step of an iteration: SERPO's rubric reward on the free text of episodes.

SERPO (``docs/algorithms.md#serpo``, ``docs/rewards.md``) rewards text a verifier
cannot check with a judge's *probability* of "yes" on each item of a rubric::

    r_rubric = Σ_k w_k · s_k,    s_k = p_yes,k / (p_yes,k + p_no,k)

(:class:`~credo.teachers.judge.Judge`, :class:`~credo.teachers.rubric.Rubric`). With a
``judge`` section, :class:`Judging` is built once per run and, every iteration, right
after the rollouts (and any teacher reward route):

1. finds each episode's free text: the env's ``free_text(action)`` of its last action
   (the ``tools`` env with ``closing=respond``: the message of ``respond{"message":
   ...}``); the context the judge reads is the task's ``instruction()``, followed with
   ``judge.context=transcript`` by what the policy saw before each of its actions
   (:func:`episode_transcript`: the tool results a message should report);
2. scores all of them on every rubric item in one batched, cached judge call;
3. combines the rubric reward with the env's on the episode's last step
   (:func:`combine_row_rewards`: ``add``, ``replace``, ``mix`` or ``gated``) before
   credit assignment;
4. files each response in its task's good / neutral / bad pool (``judge.pool_by``: by
   the env's return, by the rubric reward, or by its rank among the task's responses of
   the iteration, :func:`rank_quantiles`, which needs no reward at all) and, every
   ``evolve_every`` iterations, asks the proposer for rubric changes from contrasting
   pools (:class:`~credo.teachers.rubric.RubricEvolver`): each change bumps the rubric's
   version and is appended to ``RUN/rubric_changes.jsonl`` (atomically); checkpoints
   keep the rubric and the pools (:meth:`Judging.state_dict`), so a resume is exact;
5. reports ``judge/*`` metrics: the judge's cost this iteration (calls, pairs asked,
   cache hits, forward passes, tokens, seconds), the share of episodes judged, the mean
   rubric reward, the rubric's version and size, and, where the env knows the hidden
   truth of the text (``message_truth(text)``), its mean and the judge's agreement with
   it (``judge/truth_auc``: the AUC of the rubric reward for fully true vs not fully
   true texts; ``judge/truth_corr``: Pearson's r), and the hacking watch
   ``judge/hack_gap``: the mean rubric reward over ``Σ_k w_k`` minus the mean truth
   (rising over training: the policy pleases the judge more than it tells the truth).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from credo.data import RolloutForest
from credo.policy import HFPolicy
from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.teachers.judge import PLAIN_TEMPLATE, Judge, JudgeCost
from credo.teachers.rubric import (
    COMBINE_MODES,
    ResponsePools,
    Rubric,
    RubricEvolver,
    RubricItem,
)

if TYPE_CHECKING:
    from credo.envs.base import Task

__all__ = [
    "CHANGES_FILE",
    "DEFAULT_RUBRIC",
    "JudgeStep",
    "Judging",
    "combine_row_rewards",
    "episode_transcript",
    "judge_policy",
    "rank_auc",
    "rank_quantiles",
]

#: The run folder's log of rubric versions (one JSON line per version).
CHANGES_FILE = "rubric_changes.jsonl"

#: The rubric used without ``judge.rubric``: a message to a customer about their ticket.
DEFAULT_RUBRIC = Rubric(
    [
        RubricItem(
            "Does the response tell the customer what was done for each request "
            "(refund, store credit, exchange or cancellation)?",
            0.4,
        ),
        RubricItem("Does the response state the amount of every refund or credit?", 0.3),
        RubricItem("Does the response name the item of every request?", 0.3),
    ]
)

#: The built-in judge's size (tests only: its verdicts are noise until trained).
BUILTIN_JUDGE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def combine_row_rewards(
    reward: torch.Tensor,
    leaves: torch.Tensor,
    rubric: torch.Tensor,
    success: torch.Tensor,
    *,
    mode: str,
    coef: float,
) -> torch.Tensor:
    """The per-row rewards after adding the rubric reward on the episodes' last steps.

    The env's step rewards are scaled by ``a`` and the rubric term lands on each leaf::

        r'_i = a·r_i + [i is a leaf]·coef·rubric_e·g_e

    with ``a = 1, g = 1`` (``add``), ``a = 0, g = 1`` (``replace``), ``a = 1 − coef,
    g = 1`` (``mix``) or ``a = 1, g = success`` (``gated``), so that an episode's return
    is :func:`~credo.teachers.rubric.combine_rewards` of its env return and its rubric
    reward. Episodes without free text have ``rubric_e = 0``.

    Args:
        reward: ``[N]`` the rows' env rewards.
        leaves: ``[E]`` the row of each episode's last step.
        rubric: ``[E]`` each episode's rubric reward.
        success: ``[E]`` bool, the env's verdict (``gated``).
        mode: one of :data:`~credo.teachers.rubric.COMBINE_MODES`.
        coef: the rubric's weight (``mix``: in [0, 1]).

    Returns:
        ``[N]`` in ``reward``'s dtype.
    """
    if mode not in COMBINE_MODES:
        raise ValueError(f"judge.combine must be one of {', '.join(COMBINE_MODES)}, got {mode!r}")
    if mode == "mix" and not 0 <= coef <= 1:
        raise ValueError(f"judge.combine=mix needs judge.coef in [0, 1], got {coef}")
    scale = {"add": 1.0, "gated": 1.0, "replace": 0.0, "mix": 1.0 - coef}[mode]
    term = coef * rubric.to(torch.float64)
    if mode == "gated":
        term = term * success.to(torch.float64)
    out = reward.to(torch.float64) * scale
    out = out.index_add(0, leaves.long(), term)
    return out.to(reward.dtype)


def episode_transcript(instruction: str, observations: Sequence[str]) -> str:
    """The judge's context with ``judge.context=transcript``: the task's instruction,
    then every observation the policy acted on, in order, each after a ``|``::

        "<instruction> | <observation 0> | <observation 1> | ..."
    """
    return " | ".join([instruction, *observations])


def rank_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The probability that a random positive scores above a random negative (ties
    count ½): the area under the ROC curve; NaN without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return math.nan
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def rank_quantiles(values: Sequence[float], groups: Sequence[int]) -> list[float]:
    """Each value's rank among the values of its group as a quantile in [0, 1]:
    ``(r − 1) / (n − 1)`` with ``r`` its 1-based rank from the lowest among the group's
    ``n`` values (tied values share their mean rank); a group of one gets 0.5. With
    ``judge.pool_by: rank`` it files each response by how it ranks among its task's
    responses of the iteration (SERPO's good / neutral / bad without any reward)::

        rank_quantiles([0.2, 0.9, 0.5, 0.5], [0, 0, 0, 0]) == [0, 1, 1/2, 1/2]
    """
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(int(g), []).append(i)
    out = [0.5] * len(values)
    for idx in members.values():
        n = len(idx)
        if n < 2:
            continue
        for i in idx:
            below = sum(values[j] < values[i] for j in idx)
            ties = sum(values[j] == values[i] for j in idx)  # itself included
            out[i] = (below + (ties - 1) / 2) / (n - 1)
    return out


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 2:
        return math.nan
    xs, ys = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    xs, ys = xs - xs.mean(), ys - ys.mean()
    den = float(xs.norm() * ys.norm())
    return float((xs * ys).sum()) / den if den > 0 else math.nan


@dataclass
class JudgeStep:
    """One iteration's judging: the forest with the combined rewards and the metrics."""

    forest: RolloutForest
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Judging:
    """The run's judge, rubric (evolving) and response pools (module docstring).

    Attributes:
        cfg: the ``judge`` section.
        judge: the judge.
        evolver: holds the current rubric; applies and logs changes.
        pools: per task, the latest good / neutral / bad responses.
        make_env: a fresh env (to read a task's instruction, free text and truth).
    """

    cfg: Any
    judge: Judge
    evolver: RubricEvolver
    pools: ResponsePools
    make_env: Callable[[], Any]
    _cost: JudgeCost = field(default_factory=JudgeCost)

    @property
    def rubric(self) -> Rubric:
        return self.evolver.rubric

    @classmethod
    def build(
        cls,
        cfg: Any,
        make: Callable[[], Any],
        words: Sequence[str],
        run_dir: Path | None,
        device: torch.device | str = "cpu",
    ) -> Judging | None:
        """The judging ``cfg.judge`` describes (``None`` without a judge).

        Args:
            cfg: the run's config.
            make: the env factory.
            words: the env's words (the built-in judge's vocabulary).
            run_dir: the run folder (``rubric_changes.jsonl``); on resume the rubric is
                its last logged version.
            device: where an HF judge runs.
        """
        j = cfg.judge
        if not j.enabled:
            return None
        rubric = Rubric.load(j.rubric) if j.rubric else DEFAULT_RUBRIC
        log = Path(run_dir) / CHANGES_FILE if run_dir is not None else None
        if log is not None and log.exists():
            versions = RubricEvolver.read_log(log)
            if versions:
                rubric = Rubric.from_dict(versions[-1]["rubric"])
        judge = Judge(judge_policy(j.model, words, rubric, cfg.train.seed, device),
                      micro_batch=j.micro_batch)  # fmt: skip
        evolver = RubricEvolver(
            rubric, j.proposer, log_path=log, max_items=j.max_items, **j.proposer_params
        )
        evolver.log_start(iteration=0)
        pools = ResponsePools(good_at=j.pool_good, bad_at=j.pool_bad, size=j.pool_size)
        return cls(j, judge, evolver, pools, make)

    @classmethod
    def from_run(
        cls,
        cfg: Any,
        make: Callable[[], Any],
        run_dir: Path | None,
        device: torch.device | str = "cpu",
    ) -> Judging | None:
        """:meth:`build` with the env's own words (``vocabulary()``, if it has one)."""
        if not cfg.judge.enabled:
            return None
        env = make()
        words = list(env.vocabulary()) if hasattr(env, "vocabulary") else []
        return cls.build(cfg, make, words, run_dir, device)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The JSON state a checkpoint keeps: the rubric (with its version) and the
        response pools (so a resumed run evolves from the same contrast)."""
        pools = {
            task: {kind: list(q) for kind, q in per.items()}
            for task, per in self.pools.pools.items()
        }
        return {"rubric": self.rubric.to_dict(), "pools": pools}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the checkpoint's rubric wins over the change log's
        last line, which may be newer than the checkpoint)."""
        self.evolver.rubric = Rubric.from_dict(state["rubric"])
        size = self.pools.size
        self.pools.pools = {
            task: {k: deque(per.get(k, []), maxlen=size) for k in ("good", "neutral", "bad")}
            for task, per in state.get("pools", {}).items()
        }

    # ---------------------------------------------------------------- rewards
    def reward(self, forest: RolloutForest, tasks: Sequence[Task], iteration: int) -> JudgeStep:
        """Judge the free text of ``forest``'s episodes and combine the rewards
        (module docstring). ``tasks[g]`` is the task of group ``g``."""
        j = self.cfg
        ep = forest.episodes()
        n_ep = ep.num_episodes
        texts: list[str] = []
        contexts: list[str] = []
        where: list[int] = []  # episode of each text
        truth: list[float | None] = []
        task_ids: list[str] = []
        envs: dict[int, Any] = {}
        for e in range(n_ep):
            g = int(ep.group[e])
            env = envs.get(g)
            if env is None:
                env = envs[g] = self.make_env()
                env.reset(tasks[g], 0)
            text = env.free_text(forest.actions[int(ep.leaf[e])])
            if text is None:
                continue
            texts.append(text)
            instruction = env.instruction() if hasattr(env, "instruction") else ""
            if j.context == "transcript":
                seen = (
                    [forest.observations[int(r)] for r in ep.path(e)] if forest.observations else []
                )
                instruction = episode_transcript(instruction, seen)
            contexts.append(instruction)
            where.append(e)
            truth.append(float(env.message_truth(text)) if hasattr(env, "message_truth") else None)
            task_ids.append(tasks[g].id)
        scores = self.rubric.reward(self.judge, texts, contexts)
        rubric = torch.zeros(n_ep, dtype=torch.float64)
        if where:
            rubric[torch.tensor(where)] = scores.to(torch.float64)
        new_reward = combine_row_rewards(
            forest.reward, ep.leaf, rubric, ep.success, mode=j.combine, coef=j.coef
        )
        # pools, then (maybe) evolution
        total_w = sum(it.weight for it in self.rubric.items) or 1.0
        ranks = rank_quantiles(scores.tolist(), [int(ep.group[e]) for e in where])
        for i, e in enumerate(where):
            value = {
                "env": float(ep.ret[e]),
                "rubric": float(scores[i]) / total_w,
                "rank": ranks[i],
            }[j.pool_by]
            self.pools.observe(task_ids[i], texts[i], value)
        changes = 0
        if j.evolve_every and (iteration + 1) % j.evolve_every == 0:
            changes = self._evolve(task_ids)
        return JudgeStep(
            forest.with_rewards(new_reward),
            self._metrics(n_ep, scores.tolist(), truth, changes, total_w),
        )

    def _evolve(self, task_ids: Sequence[str]) -> int:
        """Ask the proposer on up to ``evolve_tasks`` of this iteration's tasks that have
        both good and bad responses; returns the number of changes applied."""
        asked, applied = 0, 0
        for tid in dict.fromkeys(task_ids):
            good, bad = self.pools.get(tid, "good"), self.pools.get(tid, "bad")
            if not good or not bad:
                continue
            applied += len(self.evolver.evolve(good, bad, judge=self.judge, task=tid))
            asked += 1
            if asked >= self.cfg.evolve_tasks:
                break
        return applied

    def _metrics(
        self,
        n_ep: int,
        scores: list[float],
        truth: list[float | None],
        changes: int,
        total_w: float,
    ) -> dict[str, float]:
        now = self.judge.cost
        out = {
            f"judge/{k}": float(v) - float(getattr(self._cost, k)) for k, v in asdict(now).items()
        }
        self._cost = JudgeCost(**asdict(now))
        out["judge/judged_frac"] = len(scores) / n_ep if n_ep else 0.0
        out["judge/reward_mean"] = sum(scores) / len(scores) if scores else 0.0
        out["judge/rubric_version"] = float(self.rubric.version)
        out["judge/rubric_items"] = float(len(self.rubric.items))
        out["judge/changes"] = float(changes)
        known = [(s, t) for s, t in zip(scores, truth) if t is not None]
        if known:
            s, t = zip(*known)
            out["judge/truth_mean"] = sum(t) / len(t)
            # the hacking watch: how far the judge's approval runs ahead of the truth
            out["judge/hack_gap"] = sum(s) / len(s) / total_w - out["judge/truth_mean"]
            auc = rank_auc(s, [x >= 1.0 for x in t])
            corr = _pearson(s, t)
            if not math.isnan(auc):
                out["judge/truth_auc"] = auc
            if not math.isnan(corr):
                out["judge/truth_corr"] = corr
        return out


def judge_policy(
    model: str,
    words: Sequence[str],
    rubric: Rubric,
    seed: int,
    device: torch.device | str,
    size: TinyModelConfig = BUILTIN_JUDGE,
) -> HFPolicy:
    """The judge's model: a fresh built-in model (``builtin``, of ``size``) over the
    env's words, the prompt's and the rubric's, or an HF model (folder, alias or hub
    name; a fitted built-in judge is a folder, :mod:`credo.teachers.judge_fit`)."""
    if model == "builtin":
        extra = PLAIN_TEMPLATE.replace("{", " ").replace("}", " ").split()
        extra += ["yes", "no", "?", "|"] + [w for it in rubric.items for w in it.question.split()]
        return create_tiny_policy([*words, *extra], size, seed=seed)
    from credo.policy.models import resolve_model

    return HFPolicy.from_pretrained(resolve_model(model), device=str(device))
