"""The teacher's context: the student's prompt re-rendered with privileged text.

The student saw ``renderer.prompt_ids(instruction, history, observation)``; its teacher
reads the same state with extra text the student never sees — the env's feedback on the
step, the oracle's next action (``env.privileged_context(kind)``, see
:mod:`credo.envs.base`), or a verified trajectory of the same task with its answer
stripped (MT-SDPO's ``c*``, :mod:`credo.teachers.sanitise`). :func:`privileged_prompt_ids`
renders that prompt with the student's own renderer (any object with ``prompt_ids``),
putting the text into one field through a template:

- ``placement="instruction"`` (default): the goal becomes ``"{text} ; {privileged}"``.
  With the built-in plain format the goal sits right before ``action :``, so the hint is
  next to the generation point; a chat format shows it in the system and user messages.
- ``placement="observation"``: the current observation gets it instead.

Only the prompt changes: the teacher then scores the student's response ids unchanged
(:class:`credo.teachers.TeacherRows` ``prompts``). The default separator ``;`` and every
word of a shop hint are in the built-in tokenizer's vocabulary; other words map to
``<unk>`` there (chat models' tokenizers cover any text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PLACEMENTS", "privileged_prompt_ids", "privileged_prompts"]

PLACEMENTS = ("instruction", "observation")
DEFAULT_TEMPLATE = "{text} ; {privileged}"


def privileged_prompt_ids(
    renderer: Any,
    instruction: str,
    history: Sequence[Any],
    observation: str,
    privileged: str | None,
    *,
    placement: str = "instruction",
    template: str = DEFAULT_TEMPLATE,
) -> list[int]:
    """The teacher's prompt ids for one state.

    Args:
        renderer: the student's renderer (``prompt_ids(instruction, history, observation)``).
        instruction: the goal the student saw.
        history: the past turns the student saw (the renderer's ``Turn`` objects).
        observation: the current observation.
        privileged: the privileged text, or ``None``/empty for the student's own prompt.
        placement: ``instruction`` (default) or ``observation``: the field that gets it.
        template: how the field and the text combine; must use ``{text}`` and
            ``{privileged}`` (default ``"{text} ; {privileged}"``).
    """
    if placement not in PLACEMENTS:
        raise ValueError(
            f"privileged placement {placement!r} is unknown; valid: {', '.join(PLACEMENTS)}"
        )
    if "{text}" not in template or "{privileged}" not in template:
        raise ValueError(
            f"privileged template {template!r} must contain both {{text}} and {{privileged}}"
        )
    if privileged:
        if placement == "instruction":
            instruction = template.format(text=instruction, privileged=privileged)
        else:
            observation = template.format(text=observation, privileged=privileged)
    return list(renderer.prompt_ids(instruction, history, observation))


def privileged_prompts(
    renderer: Any,
    states: Sequence[tuple[str, Sequence[Any], str]],
    privileged: Sequence[str | None],
    *,
    placement: str = "instruction",
    template: str = DEFAULT_TEMPLATE,
) -> list[list[int] | None]:
    """:func:`privileged_prompt_ids` for many rows; ``None`` where there is no text (the
    row keeps the student's prompt).

    Args:
        renderer: the student's renderer.
        states: per row ``(instruction, history, observation)`` as the student saw them.
        privileged: per row the privileged text or ``None``.
        placement, template: as :func:`privileged_prompt_ids`.
    """
    if len(states) != len(privileged):
        raise ValueError(
            f"privileged_prompts: {len(states)} states but {len(privileged)} privileged texts"
        )
    out: list[list[int] | None] = []
    for (instruction, history, observation), text in zip(states, privileged):
        if not text:
            out.append(None)
            continue
        out.append(
            privileged_prompt_ids(
                renderer,
                instruction,
                history,
                observation,
                text,
                placement=placement,
                template=template,
            )
        )
    return out
