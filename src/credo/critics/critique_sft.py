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

**Class balance** (``balance="equal"``, :func:`balance_rows`): a policy that succeeds
rarely leaves few behaviour rows and many corrections (one CAST seed had 59 against
2,651 and collapsed to 0 % after the SFT: almost every row it saw was a critique-prefixed
prompt, none its own plain context). ``equal`` repeats the smaller class's rows in order
until both classes have as many rows, so that a shuffled epoch draws each class half of
the time; ``none`` keeps the rows as they are.

The critique comes first so that the plain renderer's layout (goal right before
``action :``) is unchanged. Words outside a word-level vocabulary become ``<unk>``; the
class phrases are mostly env words (:data:`~credo.critics.labels.CRITIQUES`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from credo.critics.labeller import LabelledStep
from credo.critics.labels import critique_text as _critique

T = TypeVar("T")

__all__ = ["BALANCE", "CORRECTIONS_FROM", "balance_rows", "critique_examples", "critique_rows"]

#: Whose error steps become corrections: every episode's, successful ones', or none.
CORRECTIONS_FROM = ("all", "successful", "none")
#: How behaviour rows and corrections are weighed in the SFT (:func:`balance_rows`).
BALANCE = ("equal", "none")


def balance_rows(behaviour: list[T], corrections: list[T], balance: str = "equal") -> list[T]:
    """``behaviour + corrections``; with ``equal`` the smaller class (when it has rows) is
    repeated in order, cycling, until it has as many rows as the larger."""
    if balance not in BALANCE:
        raise ValueError(f"balance={balance!r}; accepted: {', '.join(BALANCE)}")
    if balance == "none" or not behaviour or not corrections:
        return behaviour + corrections
    n = max(len(behaviour), len(corrections))

    def grown(rows: list[T]) -> list[T]:
        return [rows[i % len(rows)] for i in range(n)]

    return grown(behaviour) + grown(corrections)


def critique_examples(
    labels: Sequence[LabelledStep],
    *,
    corrections_from: str = "all",
    critique_text: bool = True,
    balance: str = "none",
) -> list[tuple[str, str]]:
    """The ``(prompt text, target action)`` pairs of the module docstring, behaviour rows
    first, in label order; ``critique_text=False`` drops the critique from corrections;
    ``balance`` as :func:`balance_rows`."""
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
    return balance_rows(good, fixes, balance)


def critique_rows(
    labels: Sequence[LabelledStep],
    encode_prompt: Callable[[str], list[int]],
    encode_response: Callable[[str], list[int]],
    *,
    corrections_from: str = "all",
    critique_text: bool = True,
    balance: str = "none",
) -> list[tuple[list[int], list[int]]]:
    """:func:`critique_examples` as ``(prompt_ids, response_ids)`` rows for
    :func:`credo.train.sft.sft_train` (``encode_response`` adds the end-of-action token,
    as ``Renderer.response_ids`` does)."""
    return [
        (encode_prompt(p), encode_response(a))
        for p, a in critique_examples(
            labels, corrections_from=corrections_from, critique_text=critique_text, balance=balance
        )
    ]
