"""The teacher step of an iteration: score the student's rollouts once, then route.

On-policy distillation (``opd``), OPRD, MT-SDPO and Rényi OPSD all learn from a teacher
that scores the tokens the student sampled (docs/algorithms.md#on-policy-distillation).
:class:`Teaching` holds the run's teachers, built once from the ``teacher`` section when
the training state starts (:meth:`Teaching.build`); each iteration
:meth:`Teaching.lesson` scores the iteration's policy rows **once**, right after the
rollouts, in the teacher's own context (with privileged text when
``teacher.privileged`` asks for it), and returns a :class:`Lesson` that the route
``teacher.route`` filled (:mod:`credo.teachers.routes`, where each route registers):

- a per-step reward (``row_reward``, ``oprd``) is added to the forest's rewards before
  credit assignment (:meth:`Lesson.reward`);
- a per-token reward (``token_advantage``) is added to the token batch's advantages
  after it (:meth:`Lesson.attach`);
- on a route whose scores go to the loss (``loss``), the scores ride in
  ``TokenBatch.token_extras`` (:func:`credo.teachers.attach_teacher_scores`) to the
  distillation loss, and the update gathers the student's log-probs of the teacher's
  head in its own forward pass (the teacher's extras provider,
  :mod:`credo.teachers.extras`). Rényi OPSD adds the frozen reference's log-probs of the
  same head ids, in the student's context (``ref_topk_logprobs``).

After each update an ``ema`` teacher follows the student (:meth:`Teaching.after_update`);
its weights and the MT-SDPO context cache are checkpointed with the run
(:meth:`Teaching.write`, :meth:`Teaching.state_dict`, :meth:`Teaching.load`). Bad teacher input (a missing or
unfinished run, another tokenizer or vocabulary size) stops before any compute:
:func:`check_teacher_inputs`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.data import Episode, RolloutForest, TokenBatch
from credo.envs.base import Task
from credo.objectives import candidate_contexts, mixture_logprobs
from credo.policy.hf import HFPolicy
from credo.rollout.render import Renderer, Turn
from credo.teachers.anchors import anchor_sets
from credo.teachers.base import Teacher, TeacherCost, TeacherRows, TeacherScores
from credo.teachers.context_cache import ContextCache
from credo.teachers.ema import EMATeacher
from credo.teachers.extras import attach_teacher_scores
from credo.teachers.folders import oprd_base_path, oprd_teacher_pairs, require_teacher_path
from credo.teachers.loading import check_teacher_folder, load_teacher_policy, resolve_policy_folder
from credo.teachers.pool import PoolPlay, TeacherPool, pool_labels
from credo.teachers.privileged import privileged_prompts
from credo.teachers.registry import make_teacher, teacher_settings, teacher_uses_reference
from credo.teachers.routes import RouteInputs, teacher_route
from credo.teachers.sanitise import sanitise
from credo.teachers.scoring import FULL_MAX_VOCAB

__all__ = ["Lesson", "Teaching", "check_teacher_inputs", "row_histories", "teacher_prompts"]

#: The checkpoint sub-folder of an EMA teacher's weights.
EMA_FOLDER = "teacher_ema"


def check_teacher_inputs(t: Any, student: HFPolicy) -> None:
    """Check the teacher folders the ``teacher`` section ``t`` names against the student
    before any compute: they exist and hold a finished model (no run still training) with
    the student's vocabulary size and tokenizer, and a full distribution fits the
    vocabulary.

    Raises:
        ValueError: one line naming the folder and what is wrong.
    """
    if not t.enabled:
        return
    require_teacher_path(t)
    if t.full and int(student.vocab_size) > FULL_MAX_VOCAB:
        raise ValueError(
            f"teacher.full=true stores whole distributions, for vocabularies of at most "
            f"{FULL_MAX_VOCAB} tokens; this model has {student.vocab_size}: set teacher.full=false "
            "teacher.topk=K (e.g. 16)"
        )
    pairs = oprd_teacher_pairs(t)
    for path in (t.path, oprd_base_path(t), *(p for pair in pairs[1:] for p in pair), *t.pool):
        if path:
            check_teacher_folder(resolve_policy_folder(path), student)


def row_histories(forest: RolloutForest) -> list[list[Turn]]:
    """Per row, the past turns its prompt showed: its ancestors' observations and
    actions, root first (as the sampler's ``EpisodeRunner.history``)."""
    out: list[list[Turn]] = []
    for i in range(forest.num_rows):
        p = int(forest.parent[i])
        out.append([*out[p], Turn(forest.observations[p], forest.actions[p])] if p >= 0 else [])
    return out


def teacher_prompts(
    renderer: Renderer, forest: RolloutForest, texts: Sequence[str | None], t: Any
) -> list[list[int] | None]:
    """Per row, the teacher's prompt: the student's state re-rendered with ``texts[i]``
    (``None`` where a row has no text: it keeps the student's prompt).

    Args:
        renderer: the student's renderer.
        forest: the rows, with ``texts["instruction"]`` recorded by the sampler.
        texts: ``[N]`` the privileged text of each row.
        t: the teacher settings (``placement``, ``template``).
    """
    if "instruction" not in forest.texts:
        raise ValueError(
            "teacher prompts need the goal of every step: the sampler records it when "
            "SamplerContext.texts holds 'instruction' (teacher.privileged sets it)"
        )
    states = [
        (instr, hist, obs)
        for instr, hist, obs in zip(
            forest.texts["instruction"], row_histories(forest), forest.observations
        )
    ]
    return privileged_prompts(
        renderer, states, list(texts), placement=t.placement, template=t.template
    )


@dataclass
class Lesson:
    """One iteration's teacher scores of the policy rows, and how they reach the update.

    Rows are the forest's rows in order (``forest.to_batch`` row order); ``B`` rows ×
    ``L`` positions.

    Attributes:
        route: ``teacher.route``.
        scores: the teacher's scores ``[B, L]`` (and ``[B, L, K]`` head).
        row_mask: ``[B]`` bool, rows with a teacher signal.
        row_reward: ``[B]`` the per-step reward to add before credit (``row_reward``,
            ``oprd``), else ``None``.
        token_reward: ``[B, L]`` the per-token reward to add to the advantages
            (``token_advantage``), else ``None``.
        ref_head: ``[B, L, K]`` the reference's log-probs of the teacher's head ids
            (Rényi OPSD), else ``None``.
        metrics: ``teacher/*`` metrics of the iteration (docs/metrics.md).
    """

    route: str
    scores: TeacherScores
    row_mask: torch.Tensor
    row_reward: torch.Tensor | None = None
    token_reward: torch.Tensor | None = None
    ref_head: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def reward(self, forest: RolloutForest) -> RolloutForest:
        """The forest with this lesson's per-step reward added (reward routes; else
        ``forest`` itself)."""
        if self.row_reward is None:
            return forest
        return forest.with_rewards(forest.reward + self.row_reward.to(forest.reward.dtype))

    def attach(self, batch: TokenBatch) -> None:
        """Apply the token routes to the iteration's token batch (in place): add the
        token reward to the advantages, or attach the scores for the loss."""
        if tuple(batch.input_ids.shape) != tuple(self.scores.logprobs.shape):
            raise ValueError(
                f"teacher scores {list(self.scores.logprobs.shape)} do not match the token "
                f"batch {list(batch.input_ids.shape)}"
            )
        if self.token_reward is not None:
            batch.advantages = batch.advantages + self.token_reward
        if not teacher_route(self.route).to_loss:
            return
        masked = not bool(self.row_mask.all())
        attach_teacher_scores(batch, self.scores, row_mask=self.row_mask if masked else None)
        if self.ref_head is not None:
            batch.token_extras["ref_topk_logprobs"] = self.ref_head


@dataclass
class Teaching:
    """The run's teachers (module docstring), built once by :meth:`build`.

    Attributes:
        cfg: the ``teacher`` section.
        teacher: the teacher (π_T; OPRD's RL teacher; MT-SDPO's EMA; Rényi's self-teacher).
        base: OPRD's base teacher π_T^base, else ``None``.
        reference: the frozen reference policy Rényi OPSD mixes in, else ``None``.
        cache: MT-SDPO's verified contexts per task (``teacher.context_cache`` > 0).
        more: OPRD's further ``(π_T^RL, π_T^base)`` pairs (``teacher.oprd.teachers``).
        pool: MT-SDPO's pool of domain teachers and their eligible sets
            (``teacher.pool``), else ``None``.
    """

    cfg: Any
    teacher: Teacher
    base: Teacher | None = None
    reference: HFPolicy | None = None
    cache: ContextCache | None = None
    more: list[tuple[Teacher, Teacher]] = field(default_factory=list)
    pool: TeacherPool | None = None

    @classmethod
    def build(
        cls,
        t: Any,
        policy: HFPolicy,
        reference: HFPolicy | None,
        *,
        reference_head: bool = False,
        play: PoolPlay | None = None,
    ) -> Teaching | None:
        """The teachers the ``teacher`` section ``t`` describes for the student ``policy``
        (``None`` without a teacher). With ``reference_head`` (the loss registered the need
        ``reference_head``: Rényi OPSD), the loss route also scores the teacher's head
        with ``reference``, the run's frozen reference. ``play``: how a pool member plays
        tasks (needed with ``teacher.pool``)."""
        if not t.enabled or t.kind is None:
            return None
        require_teacher_path(t)
        common: dict[str, Any] = {"micro_batch": t.micro_batch, "temperature": t.temperature}
        params = dict(common)
        params.update({k: getattr(t, k) for k in teacher_settings(t.kind)})
        if teacher_uses_reference(t.kind) and reference is None:
            raise ValueError(f"teacher.kind={t.kind} reads the run's frozen reference: it has none")
        teacher = make_teacher(
            t.kind, reference if teacher_uses_reference(t.kind) else policy, **params
        )
        base_path = oprd_base_path(t)
        base = make_teacher("run", policy, path=base_path, **common) if base_path else None
        more = [
            (
                make_teacher("run", policy, path=rl, **common),
                make_teacher("run", policy, path=b, **common),
            )
            for rl, b in oprd_teacher_pairs(t)[1:]
        ]
        if reference_head and reference is None:
            raise ValueError("the loss mixes in the frozen reference, which the run lacks")
        pool = None
        if t.pool:
            if play is None:
                raise ValueError("teacher.pool needs a way to play its members (play=...)")
            members = [
                (label, load_teacher_policy(path, policy))
                for label, path in zip(pool_labels(t.pool), t.pool)
            ]
            pool = TeacherPool(members, play, t.sanitiser, dict(t.sanitiser_params))
        return cls(
            t,
            teacher,
            base,
            reference if reference_head else None,
            ContextCache(t.context_cache) if t.context_cache > 0 else None,
            more,
            pool,
        )

    # ---------------------------------------------------------------- scoring
    def lesson(
        self,
        renderer: Renderer,
        forest: RolloutForest,
        episodes: Sequence[Episode],
        pad_id: int,
        tasks: Sequence[Task] = (),
    ) -> Lesson:
        """Score the policy rows of ``forest`` once and prepare the route (class docs).

        Args:
            renderer: the student's renderer (privileged prompts).
            forest: the iteration's policy rows (oracle rows split off).
            episodes: the rollout's episodes (their task ids key the context cache).
            pad_id: the student's padding id.
            tasks: the iteration's tasks (task ``i`` is group ``i``): a teacher pool plays
                those whose group has no verified rollout.
        """
        t = self.cfg
        route = teacher_route(t.route)
        tb = forest.to_batch(torch.zeros(forest.num_rows), pad_id=pad_id)
        sets = self._texts(forest, episodes, tasks)
        head = route.to_loss and (t.topk > 0 or t.full)
        cost = TeacherCost()
        if sets is None:
            row_mask = torch.ones(len(tb), dtype=torch.bool)
            rows = TeacherRows.from_batch(tb)
            scores = self.teacher.score(rows, topk=t.topk if head else 0, full=t.full and head)
        else:
            row_mask = torch.tensor([bool(x) for x in sets], dtype=torch.bool)
            rows, scores = self._score_sets(renderer, forest, tb, sets, head, cost)
        cost.add(scores.cost)
        tokens = tb.response_mask & row_mask[:, None]
        lesson = Lesson(t.route, scores, row_mask)
        route.fn(lesson, RouteInputs(t, forest, tb, rows, row_mask, tokens, self, cost))
        lesson.metrics.update(self._metrics(tb, scores, tokens, row_mask, lesson, cost))
        if sets is not None and self.cfg.privileged == "anchor":
            read = [len(x) for x in sets if x]
            lesson.metrics["teacher/contexts"] = sum(read) / len(read) if read else 0.0
        if self.pool is not None:
            lesson.metrics.update(self.pool.metrics())
        return lesson

    def _score_sets(
        self,
        renderer: Renderer,
        forest: RolloutForest,
        tb: TokenBatch,
        sets: list[list[str]],
        head: bool,
        cost: TeacherCost,
    ) -> tuple[TeacherRows, TeacherScores]:
        """The teacher's scores of every row in each of its contexts ``sets[i]`` (a row
        without one keeps the student's prompt), mixed over a row's contexts
        (:func:`credo.objectives.mixture_logprobs`); the first context's rows and the
        mixed scores. Several contexts a row need the full distribution
        (``teacher.aggregate: all`` is checked to have it)."""
        t = self.cfg
        topk, full = (t.topk if head else 0), (t.full and head)
        slots = max([1, *(len(x) for x in sets)])
        first = [x[0] if x else None for x in sets]
        rows = TeacherRows.from_batch(tb, teacher_prompts(renderer, forest, first, t))
        scores = self.teacher.score(rows, topk=topk, full=full)
        if slots == 1:
            return rows, scores
        if scores.topk_logprobs is not None and not full:
            raise ValueError("several anchors per row need teacher.full=true (one shared head)")
        present = torch.zeros(slots, len(tb), dtype=torch.bool)
        present[0] = True
        lps = [scores.logprobs] * slots
        heads = [scores.topk_logprobs] * slots
        for c in range(1, slots):
            texts = [x[c] if len(x) > c else None for x in sets]
            idx = torch.tensor([i for i, x in enumerate(texts) if x is not None])
            prompts = teacher_prompts(renderer, forest, texts, t)
            sub = self.teacher.score(
                TeacherRows.from_batch(tb.index(idx), [prompts[i] for i in idx.tolist()]),
                topk=topk,
                full=full,
            )
            cost.add(sub.cost)
            present[c, idx] = True
            lps[c] = scores.logprobs.index_copy(0, idx, sub.logprobs)
            if scores.topk_logprobs is not None and sub.topk_logprobs is not None:
                heads[c] = scores.topk_logprobs.index_copy(0, idx, sub.topk_logprobs)
        mixed = TeacherScores(
            mixture_logprobs(torch.stack(lps), present),
            scores.topk_ids,
            None if scores.topk_logprobs is None else mixture_logprobs(torch.stack(heads), present),
            scores.cost,
        )
        mask = tb.response_mask
        mixed.logprobs = torch.where(mask, mixed.logprobs, 0.0)
        if mixed.topk_logprobs is not None:
            mixed.topk_logprobs = torch.where(mask[..., None], mixed.topk_logprobs, 0.0)
        return rows, mixed

    def _texts(
        self, forest: RolloutForest, episodes: Sequence[Episode], tasks: Sequence[Task]
    ) -> list[list[str]] | None:
        """Per row, the privileged texts the teacher reads (an empty list: none;
        ``None``: no privileged context at all)."""
        kind = self.cfg.privileged
        if kind is None:
            return None
        if kind == "anchor":
            return self._anchors(forest, episodes, tasks)
        if kind not in forest.texts:
            raise ValueError(
                f"teacher.privileged={kind} but the rollouts recorded no such text "
                "(SamplerContext.texts)"
            )
        return [[x] if x else [] for x in forest.texts[kind]]

    def _anchors(
        self, forest: RolloutForest, episodes: Sequence[Episode], tasks: Sequence[Task]
    ) -> list[list[str]]:
        """MT-SDPO's contexts per row: the verified episodes of the same group
        (self-anchors), else the pool's eligible teachers' and the cache's verified
        contexts of the same task; sanitised; the first one, or up to
        ``teacher.max_contexts`` with ``teacher.aggregate: all``."""
        t = self.cfg
        ep = forest.episodes()
        actions = [[forest.actions[int(i)] for i in ep.path(e)] for e in range(ep.num_episodes)]
        task_of = {g: task.id for g, task in enumerate(tasks)}
        task_of.update({e.group: e.task_id for e in episodes if e.task_id})
        groups = [int(g) for g in ep.group.tolist()]
        verified = {g for g, ok in zip(groups, ep.success.tolist()) if ok}
        if self.pool is not None:  # eligible sets of the tasks whose group failed
            self.pool.ensure([tasks[g] for g in sorted(set(groups) - verified) if g < len(tasks)])
        external: list[str] = []
        external_group: list[int] = []
        for g in sorted(set(groups)):
            tid = task_of.get(g, str(g))
            found = (self.pool.contexts(tid) if self.pool else []) + (
                self.cache.get(tid) if self.cache else []
            )
            for c in dict.fromkeys(found):  # in order, each text once
                external.append(c)
                external_group.append(g)
        own, ext = candidate_contexts(
            ep.group, ep.success, torch.tensor(external_group, dtype=torch.long)
        )
        per_episode = anchor_sets(
            own, ext, actions, external,
            limit=t.max_contexts if t.aggregate == "all" else 1,
            sanitiser=t.sanitiser, **t.sanitiser_params,
        )  # fmt: skip
        if self.cache is not None:
            for e in torch.nonzero(ep.success).flatten().tolist():
                text = sanitise(t.sanitiser, actions[e], **t.sanitiser_params)
                self.cache.add(task_of.get(groups[e], str(groups[e])), text)
        row_ep = forest.row_episode()
        return [per_episode[int(e)] for e in row_ep.tolist()]

    @torch.no_grad()
    def reference_head(self, tb: TokenBatch, ids: torch.Tensor, cost: TeacherCost) -> torch.Tensor:
        """``[B, L, K]`` the frozen reference's log-probs of the teacher's head ids, in the
        student's own context (Rényi OPSD's ``z_ref``), at the teacher's temperature."""
        ref = self.reference
        assert ref is not None
        t0 = time.perf_counter()
        out = torch.zeros(ids.shape, dtype=torch.float32)
        was_training = ref.model.training
        ref.model.eval()
        try:
            for lo in range(0, len(tb), self.cfg.micro_batch):
                idx = torch.arange(lo, min(len(tb), lo + self.cfg.micro_batch))
                sub = tb.index(idx).trim()
                width = sub.input_ids.shape[1]
                sc = ref.score(
                    sub.input_ids,
                    sub.attention_mask,
                    temperature=self.cfg.temperature,
                    extra_ids=ids[idx][:, :width],
                    scored=sub.response_mask,
                )
                assert sc.extra_logprobs is not None
                out[idx, :width] = sc.extra_logprobs.float().cpu()
                cost.tokens += int(sub.attention_mask.sum())
        finally:
            ref.model.train(was_training)
        out = torch.where(tb.response_mask[..., None], out, 0.0)
        cost.seconds += time.perf_counter() - t0
        cost.scored += int(tb.response_mask.sum())
        cost.rows += len(tb)
        cost.calls += 1
        return out

    def _metrics(
        self,
        tb: TokenBatch,
        scores: TeacherScores,
        tokens: torch.Tensor,
        row_mask: torch.Tensor,
        lesson: Lesson,
        cost: TeacherCost,
    ) -> dict[str, float]:
        """Cost (``teacher/seconds``, ``tokens``, ``scored_tokens``, ``rows``), coverage,
        the sampled-token reverse KL estimate and the mean added reward."""
        n = int(tokens.sum())
        k1 = (tb.old_logprobs - scores.logprobs)[tokens]
        out = cost.metrics()
        out["teacher/coverage"] = float(row_mask.float().mean()) if len(tb) else 0.0
        out["teacher/sampled_kl"] = float(k1.sum()) / max(1, n)
        out["teacher/logprob"] = float(scores.logprobs[tokens].sum()) / max(1, n)
        if lesson.row_reward is not None:
            out["teacher/reward_mean"] = float(lesson.row_reward.mean()) if len(tb) else 0.0
        if lesson.token_reward is not None:
            out["teacher/reward_mean"] = float(lesson.token_reward.sum()) / max(1, len(tb))
        if self.cache is not None:
            out["teacher/cached_contexts"] = float(len(self.cache))
        return out

    # ------------------------------------------------------------ after a step
    def after_update(self, policy: HFPolicy) -> None:
        """Move an EMA teacher toward the student after the iteration's update."""
        if isinstance(self.teacher, EMATeacher):
            self.teacher.update(policy)

    # ------------------------------------------------------------ checkpoints
    def write(self, folder: Path) -> None:
        """Write the EMA teacher's weights (safetensors) into checkpoint ``folder``
        (``teacher_ema/``); nothing for other teachers (they do not change)."""
        if isinstance(self.teacher, EMATeacher):
            self.teacher.policy.save(Path(folder) / EMA_FOLDER)

    def state_dict(self) -> dict[str, Any]:
        """The JSON state saved in the checkpoint's ``state.json``: the EMA's update
        count, the context cache and the pool's eligible sets."""
        state: dict[str, Any] = {}
        if isinstance(self.teacher, EMATeacher):
            state["ema_updates"] = self.teacher.updates
        if self.cache is not None:
            state["context_cache"] = self.cache.to_dict()
        if self.pool is not None:
            state["pool"] = self.pool.state_dict()
        return state

    def load(self, folder: Path, state: dict[str, Any] | None) -> None:
        """Restore what :meth:`write` and :meth:`state_dict` saved in checkpoint
        ``folder``."""
        state = state or {}
        if isinstance(self.teacher, EMATeacher):
            path = Path(folder) / EMA_FOLDER
            if not path.is_dir():
                raise ValueError(
                    f"checkpoint {str(folder)!r} has no {EMA_FOLDER}/: it was not written by "
                    "a run with teacher.kind=ema; resume with the run's own config"
                )
            self.teacher.policy.load_weights(path)
            self.teacher.updates = int(state.get("ema_updates", 0))
        if self.cache is not None and state.get("context_cache") is not None:
            self.cache = ContextCache.from_dict(state["context_cache"])
        if self.pool is not None:
            self.pool.load(state.get("pool"))
