"""CAST's critique-enriched SFT rows: supervised targets built from labelled trajectories.

Two kinds of rows (prompt text, target action), both encoded with the policy's tokenizer:

1. **Successful behaviour.** Every step labelled ``ok`` of an episode that solved its
   task: ``(context, action)`` — the policy's own good actions, as in rejection-sampling
   SFT.
2. **Critique-conditioned corrections.** Every step labelled as an error (of successful
   episodes only, or of all episodes with ``corrections_from="all"``, the default; none
   with ``corrections_from="none"``, which leaves rejection-sampling SFT, the control):
   ``(critique + " ; " + context, fix)`` where ``critique`` is
   :func:`~credo.critics.labels.critique_text` of the step's class and proposed action
   (``"critic : buy : buy only after the goal size"``) and ``fix`` is the labeller's
   oracle action in that state. The policy learns to act on a critique of its proposal,
   which is what online verification shows it (CAST reports that this halves the
   policy's resistance to feedback).

With ``critique_text=False`` the corrections keep their fix but lose the critique,
``(context, fix)``: the same rows as an imitation of the labeller's fixes (DAgger-like),
the ablation that shows what the critique itself adds.

The critique comes first so that the plain renderer's layout (goal right before
``action :``) is unchanged. Words outside a word-level vocabulary become ``<unk>``; the
class phrases are mostly env words (:data:`~credo.critics.labels.CRITIQUES`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from credo.critics.labeller import LabelledStep
from credo.critics.labels import critique_text as _critique

__all__ = ["CORRECTIONS_FROM", "critique_examples", "critique_rows"]

#: Whose error steps become corrections: every episode's, successful ones', or none.
CORRECTIONS_FROM = ("all", "successful", "none")


def critique_examples(
    labels: Sequence[LabelledStep], *, corrections_from: str = "all", critique_text: bool = True
) -> list[tuple[str, str]]:
    """The ``(prompt text, target action)`` pairs of the module docstring, behaviour rows
    first, in label order; ``critique_text=False`` drops the critique from corrections."""
    if corrections_from not in CORRECTIONS_FROM:
        raise ValueError(
            f"corrections_from={corrections_from!r}; accepted: {', '.join(CORRECTIONS_FROM)}"
        )
    good = [(x.context, x.action) for x in labels if x.ok and x.success]
    fixes = [
        (f"{_critique(x.error, x.action)} ; {x.context}" if critique_text else x.context, x.fix)
        for x in labels
        if not x.ok
        and x.fix
        and corrections_from != "none"
        and (x.success or corrections_from == "all")
    ]
    return good + fixes


def critique_rows(
    labels: Sequence[LabelledStep],
    encode_prompt: Callable[[str], list[int]],
    encode_response: Callable[[str], list[int]],
    *,
    corrections_from: str = "all",
    critique_text: bool = True,
) -> list[tuple[list[int], list[int]]]:
    """:func:`critique_examples` as ``(prompt_ids, response_ids)`` rows for
    :func:`credo.train.sft.sft_train` (``encode_response`` adds the end-of-action token,
    as ``Renderer.response_ids`` does)."""
    return [
        (encode_prompt(p), encode_response(a))
        for p, a in critique_examples(
            labels, corrections_from=corrections_from, critique_text=critique_text
        )
    ]
