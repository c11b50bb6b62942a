"""CAST's labeller: replay stored trajectories in the env and label every action from
privileged information (the oracle, the goal state).

A label rule is a function ``rule(env, action) -> StepLabel`` that judges ``action`` in
``env``'s current state without changing it; rules are registered per env name
(:data:`LABEL_RULES`: ``shop``, ``tools``). :func:`label_episodes` resets a fresh env on
each episode's task, checks that the env shows the recorded observation, labels the
action and executes it, step by step. The output is one :class:`LabelledStep` per action
with the step-local context the policy saw (the critic's input) and the privileged label
(its target).

Who labels is a :data:`LABELLERS` name (:func:`make_labeller`): ``rules`` (above) or
``model``, a privileged language model asked one yes/no question per error class with the
goal and the oracle's next action in view (:mod:`credo.critics.model_labeller`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from credo.critics.labels import CLASSES, StepLabel
from credo.critics.shop_rules import label_shop_action
from credo.critics.tools_rules import label_tools_action
from credo.data import Episode
from credo.envs.base import Task
from credo.rollout.render import Turn
from credo.utils.atomic import write_text_atomic
from credo.utils.registry import Registry

__all__ = [
    "LABELLERS",
    "LABEL_RULES",
    "LabelledStep",
    "Labeller",
    "label_counts",
    "label_episodes",
    "load_labels",
    "make_labeller",
    "register_label_rule",
    "save_labels",
    "task_of",
]

LabelRule = Callable[[Any, str], StepLabel]
LABEL_RULES: Registry[LabelRule] = Registry("label rule")


def register_label_rule(env_name: str) -> Callable[[LabelRule], LabelRule]:
    """Decorator: label the actions of env ``env_name`` with ``rule(env, action)``."""
    return LABEL_RULES.register(env_name)


register_label_rule("shop")(label_shop_action)
register_label_rule("tools")(label_tools_action)

#: A labeller: ``(env, action, context) -> StepLabel``, the env in the state the action was
#: taken in (not stepped), ``context`` the prompt the policy saw.
Labeller = Callable[[Any, str, str], StepLabel]

#: Who labels (``label.labeller``): the env's hand-written ``rules``, or a privileged
#: ``model`` (:mod:`credo.critics.model_labeller`).
LABELLERS = ("rules", "model")


def make_labeller(
    kind: str,
    env_name: str,
    *,
    model: str | None = None,
    threshold: float = 0.5,
    device: str = "cpu",
) -> Labeller:
    """The labeller ``kind`` names for env ``env_name``: ``rules`` (its registered rule,
    which reads no context) or ``model`` (``model``: an alias such as ``smollm2-135m``, an
    HF folder or name, or a run's policy folder; asked about the env's error classes).
    ValueError in one line naming what is accepted."""
    if kind == "rules":
        rule = LABEL_RULES.get(env_name)
        return lambda env, action, context: rule(env, action)
    if kind != "model":
        raise ValueError(f"labeller must be one of {', '.join(LABELLERS)}, got {kind!r}")
    if not model:
        raise ValueError(
            "the model labeller needs a model: an alias (smollm2-135m), an HF folder or name, "
            "or a run's policy folder"
        )
    from credo.critics.model_labeller import ENV_CLASSES, ModelLabeller
    from credo.policy import HFPolicy
    from credo.policy.models import resolve_model
    from credo.teachers.judge import Judge

    policy = HFPolicy.from_pretrained(resolve_model(model), device=device)
    return ModelLabeller(Judge(policy), ENV_CLASSES.get(env_name), threshold)


@dataclass(frozen=True)
class LabelledStep:
    """One labelled action.

    Attributes:
        task_id: the episode's task (``split/seed``).
        episode: index of the episode in the labelled list.
        t: the step's index in its episode.
        context: the step-local context: the prompt text the policy saw.
        action: the action text.
        error: ``"ok"`` or an error class (:data:`~credo.critics.labels.CLASSES`).
        rationale: the labeller's reason.
        fix: the oracle's action in that state.
        success: the episode solved its task.
    """

    task_id: str
    episode: int
    t: int
    context: str
    action: str
    error: str
    rationale: str
    fix: str
    success: bool

    @property
    def ok(self) -> bool:
        return self.error == "ok"


def task_of(task_id: str) -> Task:
    """``"train/12"`` (or ``"shop/train/12"``, with the env's name first) → ``Task("train",
    12)`` (ValueError naming the accepted form)."""
    split, _, seed = "/".join(task_id.split("/")[-2:]).partition("/")
    if split not in ("train", "test") or not seed.lstrip("-").isdigit():
        raise ValueError(f"task id {task_id!r}: expected 'train/SEED' or 'test/SEED'")
    return Task(split, int(seed))


def label_episodes(
    env_name: str,
    make_env: Callable[[], Any],
    episodes: Sequence[Episode],
    *,
    decode: Callable[[list[int]], str] | None = None,
    render: Callable[[str, list[Turn], str], str] | None = None,
    env_seed: int = 0,
    labeller: Labeller | None = None,
) -> list[LabelledStep]:
    """Label every action of ``episodes`` (see the module docstring).

    Args:
        env_name: the env's registry name: picks the rule (``shop``, ``tools``).
        make_env: makes a fresh env of the configuration the episodes were sampled in.
        episodes: the trajectories (``task_id`` ``split/seed``; steps with ``action``,
            ``observation`` and, for the context, ``prompt_ids`` or ``info["prompt"]``).
        decode: token ids → text (the policy's tokenizer), for steps with ``prompt_ids``.
        render: ``(instruction, history, observation) → prompt text`` for steps with
            neither (text-only trajectory files): the prompt is rebuilt from the replay
            (the instruction the env shows, the past turns, the observation); without
            it such a step's context is its observation.
        env_seed: the seed passed to ``env.reset``.
        labeller: ``labeller(env, action, context) -> StepLabel`` in the state before the
            action (:func:`make_labeller`); ``None``: the env's label rule.

    Returns:
        One :class:`LabelledStep` per step, episode by episode. Steps after an env error
        are not labelled.

    Raises:
        ValueError: no rule for ``env_name``; a replayed observation differs from the
            recorded one (the episodes come from another env configuration).
    """
    rule = LABEL_RULES.get(env_name) if labeller is None else None
    out: list[LabelledStep] = []
    for i, ep in enumerate(episodes):
        env = make_env()
        obs = env.reset(task_of(ep.task_id), env_seed)
        history: list[Turn] = []
        for t, step in enumerate(ep.steps):
            if step.observation and step.observation != obs:
                raise ValueError(
                    f"episode {i} ({ep.task_id}) step {t}: the env shows {obs[:60]!r} but the "
                    f"trajectory recorded {step.observation[:60]!r}; label with the env "
                    "configuration the trajectories were sampled in"
                )
            if "prompt" in step.info:
                context = str(step.info["prompt"])
            elif step.prompt_ids and decode is not None:
                context = decode(step.prompt_ids)
            elif render is not None:
                instruction = env.instruction() if hasattr(env, "instruction") else obs
                context = render(instruction, history, obs)
            else:
                context = obs
            label = (
                rule(env, step.action) if labeller is None else labeller(env, step.action, context)
            )
            out.append(
                LabelledStep(
                    ep.task_id,
                    i,
                    t,
                    context,
                    step.action,
                    label.error,
                    label.rationale,
                    label.fix,
                    bool(ep.success),
                )
            )
            result = env.step(step.action)
            history.append(Turn(obs, step.action))
            obs = result.observation
            if result.done:
                break
    return out


def label_counts(labels: Iterable[LabelledStep]) -> dict[str, int]:
    """How many steps carry each class (every class listed, zeros included)."""
    counts = dict.fromkeys(CLASSES, 0)
    for lab in labels:
        counts[lab.error] += 1
    return counts


def save_labels(path: str | Path, labels: Sequence[LabelledStep]) -> None:
    """Write ``labels`` as JSONL (one object per step), atomically."""
    write_text_atomic(Path(path), "".join(json.dumps(asdict(x)) + "\n" for x in labels))


def load_labels(path: str | Path) -> list[LabelledStep]:
    """Read a labels JSONL file written by :func:`save_labels` (ValueError naming the line
    and the field that is wrong)."""
    out = []
    names = list(LabelledStep.__dataclass_fields__)
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or sorted(obj) != sorted(names):
            raise ValueError(f"{path}:{n}: a label needs exactly the keys {', '.join(names)}")
        if obj["error"] not in CLASSES:
            raise ValueError(f"{path}:{n}: unknown label {obj['error']!r}")
        out.append(LabelledStep(**obj))
    return out
