"""Rubric rewards and their evolution (SERPO; docs/algorithms.md#serpo). [recon]

A rubric is a list of weighted yes/no questions. A judge
(:class:`~credo.teachers.judge.Judge`) scores a response against each, and the reward is

    r = Σ_k w_k · s_k,    s_k = p_yes,k / (p_yes,k + p_no,k)

:func:`combine_rewards` mixes it with the env's own reward. Where a verifier cannot judge
(a free-text reply to a customer), the rubric is the reward; where it can, the rubric
adds shaping.

Evolution: per task, keep pools of good, neutral and bad responses (by the env's reward
or the rubric's own); a *proposer* looks at contrasting pools and returns changes (add an
item, reweight one, remove one). :class:`RubricEvolver` applies them, bumps the rubric's
version and appends every change to a JSON-lines log, so a run's rubric history can be
read back. Proposers are registered by name: ``separation`` (reweights items by how well
their scores separate good from bad responses), ``contrast`` (adds a question about a
word good responses use and bad ones do not) and ``judge`` (asks the judge model itself
to write a question that tells the pools apart; the text is only ever used as a
question, never executed).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from credo.utils.atomic import write_text_atomic
from credo.utils.registry import Registry

__all__ = [
    "COMBINE_MODES",
    "PROPOSERS",
    "ResponsePools",
    "Rubric",
    "RubricChange",
    "RubricEvolver",
    "RubricItem",
    "Scorer",
    "combine_rewards",
    "register_proposer",
]


class Scorer(Protocol):
    """Anything that scores ``(question, response, context)`` triples in [0, 1] (a
    :class:`~credo.teachers.judge.Judge`; tests give tables)."""

    def scores(
        self,
        questions: Sequence[str],
        responses: Sequence[str],
        contexts: Sequence[str] | None = None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class RubricItem:
    """One yes/no question and its weight."""

    question: str
    weight: float = 1.0


@dataclass
class Rubric:
    """Weighted questions; ``version`` counts the changes applied so far."""

    items: list[RubricItem]
    version: int = 0

    def scores(
        self, judge: Scorer, responses: Sequence[str], contexts: Sequence[str] | None = None
    ) -> torch.Tensor:
        """``[N, K]`` the judge's score of each response on each item (one batched call)."""
        n, k = len(responses), len(self.items)
        if k == 0 or n == 0:
            return torch.zeros((n, k))
        qs = [it.question for _ in responses for it in self.items]
        rs = [r for r in responses for _ in self.items]
        cs = None if contexts is None else [c for c in contexts for _ in self.items]
        return judge.scores(qs, rs, cs).reshape(n, k)

    def reward(
        self, judge: Scorer, responses: Sequence[str], contexts: Sequence[str] | None = None
    ) -> torch.Tensor:
        """``[N]`` rubric rewards ``Σ_k w_k s_k``."""
        w = torch.tensor([it.weight for it in self.items], dtype=torch.float32)
        return (
            self.scores(judge, responses, contexts) @ w
            if self.items
            else torch.zeros(len(responses))
        )

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "items": [asdict(it) for it in self.items]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rubric:
        return cls([RubricItem(**it) for it in data["items"]], int(data.get("version", 0)))

    @classmethod
    def load(cls, path: str | Path) -> Rubric:
        """A rubric from a YAML file (bounded safe YAML, :mod:`credo.utils.safe_yaml`): a
        list of items, or a mapping with ``items`` (and optionally ``version``); an item
        is a question string or ``{question: str, weight: float}`` (weight 1 by default).
        ``ValueError`` in one line naming what is wrong."""
        import yaml

        from credo.utils.safe_yaml import read_yaml_file, yaml_problem

        p = Path(path).expanduser()
        if not p.is_file():
            raise ValueError(f"rubric file {str(p)!r}: no such file")
        try:
            data = read_yaml_file(p)
        except yaml.YAMLError as e:
            raise ValueError(f"rubric file {str(p)!r}{yaml_problem(e)}") from None
        raw = data.get("items") if isinstance(data, dict) else data
        if not isinstance(raw, list) or not raw:
            raise ValueError(
                f"rubric file {str(p)!r}: expected a non-empty list of items (question "
                "strings or {question: ..., weight: ...}), or a mapping with 'items'"
            )
        items = []
        for i, it in enumerate(raw):
            if isinstance(it, str):
                it = {"question": it}
            ok = (
                isinstance(it, dict)
                and set(it) <= {"question", "weight"}
                and isinstance(it.get("question"), str)
                and it["question"].strip()
                and isinstance(it.get("weight", 1.0), (int, float))
                and not isinstance(it.get("weight", 1.0), bool)
                and math.isfinite(float(it.get("weight", 1.0)))
            )
            if not ok:
                raise ValueError(
                    f"rubric file {str(p)!r}: item {i} must be a question string or "
                    f"{{question: str, weight: number}}, got {it!r}"
                )
            items.append(RubricItem(it["question"].strip(), float(it.get("weight", 1.0))))
        version = int(data.get("version", 0)) if isinstance(data, dict) else 0
        return cls(items, version)


#: How :func:`combine_rewards` mixes the env's reward with the rubric's.
COMBINE_MODES = ("add", "replace", "mix", "gated")


def combine_rewards(
    env_reward: torch.Tensor,
    rubric_reward: torch.Tensor,
    *,
    mode: str = "add",
    coef: float = 1.0,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reward training sees.

    ``add``: ``env + coef·rubric``; ``replace``: ``coef·rubric``; ``mix``:
    ``(1 − coef)·env + coef·rubric`` (``coef`` in [0, 1]); ``gated``: ``env +
    coef·rubric·gate`` (the rubric counts only where ``gate``, e.g. the env's verifier
    says the task was solved; ``gate`` a bool tensor like the rewards, required).
    """
    if mode == "gated":
        if gate is None:
            raise ValueError("combine_rewards: mode gated needs a gate (bool, like the rewards)")
        return env_reward + coef * rubric_reward * gate.to(rubric_reward.dtype)
    if mode == "add":
        return env_reward + coef * rubric_reward
    if mode == "replace":
        return coef * rubric_reward
    if mode == "mix":
        if not 0 <= coef <= 1:
            raise ValueError(f"combine_rewards: mix needs coef in [0, 1], got {coef}")
        return (1 - coef) * env_reward + coef * rubric_reward
    raise ValueError(
        f"combine_rewards: mode must be one of {', '.join(COMBINE_MODES)}, got {mode!r}"
    )


@dataclass
class ResponsePools:
    """Per task, the latest good / neutral / bad responses.

    A response with reward ≥ ``good_at`` is good, ≤ ``bad_at`` bad, else neutral; each
    pool keeps its ``size`` most recent responses.
    """

    good_at: float = 0.75
    bad_at: float = 0.25
    size: int = 16
    pools: dict[str, dict[str, deque[str]]] = field(default_factory=dict)

    def observe(self, task: str, response: str, reward: float) -> str:
        """File ``response``; returns the pool it went to."""
        kind = "good" if reward >= self.good_at else "bad" if reward <= self.bad_at else "neutral"
        per = self.pools.setdefault(
            task, {k: deque(maxlen=self.size) for k in ("good", "neutral", "bad")}
        )
        per[kind].append(response)
        return kind

    def get(self, task: str, kind: str) -> list[str]:
        return list(self.pools.get(task, {}).get(kind, ()))


@dataclass(frozen=True)
class RubricChange:
    """A proposed change: ``add`` a question, ``reweight`` or ``remove`` one."""

    kind: str
    question: str
    weight: float = 1.0
    reason: str = ""


Proposer = Callable[..., list[RubricChange]]
PROPOSERS: Registry[Proposer] = Registry("rubric proposer")


def register_proposer(name: str) -> Callable[[Proposer], Proposer]:
    """Decorator: ``fn(rubric, good, bad, *, judge, **knobs) -> [RubricChange]``."""
    return PROPOSERS.register(name)


@register_proposer("separation")
def separation_proposer(
    rubric: Rubric,
    good: Sequence[str],
    bad: Sequence[str],
    *,
    judge: Scorer,
    min_separation: float = 0.1,
    decay: float = 0.5,
    floor: float = 0.05,
) -> list[RubricChange]:
    """Items whose mean score on good responses is not at least ``min_separation`` above
    the bad ones' lose weight (× ``decay``); below ``floor`` they are removed."""
    if not good or not bad or not rubric.items:
        return []
    sep = rubric.scores(judge, good).mean(0) - rubric.scores(judge, bad).mean(0)
    out = []
    for it, s in zip(rubric.items, sep.tolist()):
        if s >= min_separation:
            continue
        w = it.weight * decay
        why = f"separation {s:+.3f} < {min_separation}"
        out.append(
            RubricChange("remove", it.question, 0.0, why)
            if w < floor
            else RubricChange("reweight", it.question, w, why)
        )
    return out


_WORD = re.compile(r"[a-z][a-z0-9_-]{2,30}")


@register_proposer("contrast")
def contrast_proposer(
    rubric: Rubric,
    good: Sequence[str],
    bad: Sequence[str],
    *,
    judge: Scorer | None = None,
    min_share: float = 0.75,
    weight: float = 1.0,
    template: str = "Does the response mention {word}?",
) -> list[RubricChange]:
    """Adds one question about the word found in the largest share (≥ ``min_share``) of
    good responses and in no bad one, if the rubric does not ask about it yet."""
    if not good or not bad:
        return []

    def words(texts: Sequence[str]) -> Counter[str]:
        return Counter(w for t in texts for w in set(_WORD.findall(t.lower())))

    in_good, in_bad = words(good), words(bad)
    asked = " ".join(it.question.lower() for it in rubric.items)
    best = sorted(
        ((c / len(good), w) for w, c in in_good.items() if w not in in_bad and w not in asked),
        key=lambda x: (-x[0], x[1]),
    )
    if not best or best[0][0] < min_share:
        return []
    share, word = best[0]
    return [
        RubricChange("add", template.format(word=word), weight, f"in {share:.0%} of good, no bad")
    ]


@register_proposer("judge")
def judge_proposer(
    rubric: Rubric,
    good: Sequence[str],
    bad: Sequence[str],
    *,
    judge: Any,
    weight: float = 1.0,
    max_new_tokens: int = 32,
    max_chars: int = 200,
) -> list[RubricChange]:
    """Asks the judge's own model, greedily, for one yes/no question that the good
    response satisfies and the bad one does not; keeps the reply only if it is one short
    line ending in ``?`` that the rubric does not already have."""
    if not good or not bad:
        return []
    from credo.policy.base import SamplingParams
    from credo.policy.tokenizer import user_message_ids

    policy = judge.policy
    text = (
        "Good response: "
        + good[-1][:400]
        + "\nBad response: "
        + bad[-1][:400]
        + "\nWrite one yes/no question that the good response passes and the bad one fails."
    )
    ids = user_message_ids(policy.tokenizer, text, plain=text + " question :")
    gen = policy.generate(
        [list(ids)], SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    )
    reply = gen[0].text.strip().splitlines()[0].strip() if gen and gen[0].text.strip() else ""
    known = {it.question for it in rubric.items}
    if not reply.endswith("?") or len(reply) > max_chars or len(reply) < 8 or reply in known:
        return []
    return [RubricChange("add", reply, weight, "proposed by the judge model")]


class RubricEvolver:
    """Applies a proposer's changes to a rubric, versioned and logged.

    Args:
        rubric: the starting rubric.
        proposer: a :data:`PROPOSERS` name.
        log_path: a JSON-lines file every change is appended to (``None``: no log).
        max_items: the rubric never grows past this many items (default 16).
        **knobs: the proposer's keyword arguments.
    """

    def __init__(
        self,
        rubric: Rubric,
        proposer: str = "separation",
        *,
        log_path: Path | None = None,
        max_items: int = 16,
        **knobs: Any,
    ) -> None:
        self.rubric = rubric
        self.proposer = PROPOSERS.get(proposer)
        self.proposer_name = proposer
        self.log_path = Path(log_path) if log_path is not None else None
        self.max_items = max_items
        self.knobs = knobs

    def evolve(
        self, good: Sequence[str], bad: Sequence[str], *, judge: Any, task: str = ""
    ) -> list[RubricChange]:
        """Ask the proposer once; apply and log its changes; return those applied."""
        applied = []
        items = list(self.rubric.items)
        for ch in self.proposer(self.rubric, good, bad, judge=judge, **self.knobs):
            idx = next((i for i, it in enumerate(items) if it.question == ch.question), None)
            if ch.kind == "add" and idx is None and len(items) < self.max_items:
                items.append(RubricItem(ch.question, ch.weight))
            elif ch.kind == "reweight" and idx is not None and math.isfinite(ch.weight):
                items[idx] = RubricItem(ch.question, ch.weight)
            elif ch.kind == "remove" and idx is not None:
                items.pop(idx)
            else:
                continue
            applied.append(ch)
        if applied:
            self.rubric = Rubric(items, self.rubric.version + 1)
            self._log(applied, task)
        return applied

    def log_start(self, **fields: Any) -> None:
        """Log the starting rubric (no changes) when the log has nothing yet, so the
        log holds every version from the first; ``fields`` are added to the line."""
        if self.log_path is not None and not self.log_path.exists():
            self._log([], "", **fields)

    def _log(self, changes: list[RubricChange], task: str, **fields: Any) -> None:
        """Append one line (the version, the task, the changes and the whole rubric),
        atomically: the file is rewritten to a temporary sibling and renamed over the
        log, so a reader or a crash never sees a torn line."""
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(
            {
                "version": self.rubric.version,
                "task": task,
                "proposer": self.proposer_name,
                "changes": [asdict(c) for c in changes],
                "rubric": self.rubric.to_dict(),
                **fields,
            }
        )
        old = self.log_path.read_text() if self.log_path.exists() else ""
        write_text_atomic(self.log_path, old + line + "\n")

    @staticmethod
    def read_log(path: Path) -> list[dict[str, Any]]:
        """The logged versions (a torn last line is ignored)."""
        out = []
        for line in Path(path).read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out
