"""Every registered loss rejects non-finite inputs on unmasked tokens, with one clear line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from _objectives_util import LOSS_CONFIGS, make_inputs
from credo.objectives import get_loss, loss_names

LENGTHS, EPISODES = [3, 2, 4, 1], [0, 0, 1, 2]
#: The distillation losses, on the top-K heads make_inputs builds (teacher = sampler).
DISTILL_CONFIGS: list[tuple[str, dict]] = [("opd", {}), ("mt_sdpo", {}), ("renyi_opsd", {})]
CONFIGS = LOSS_CONFIGS + DISTILL_CONFIGS


def _batch():  # type: ignore[no-untyped-def]
    inp = make_inputs(LENGTHS, EPISODES, mode="seq-mean-token-mean")
    head = inp.extras["topk_logprobs"]
    inp.extras.update(
        student_topk_logprobs=head,
        teacher_topk_logprobs=inp.extras["topk_old_logprobs"],
        ref_topk_logprobs=inp.extras["topk_old_logprobs"],
    )
    return inp


def _with(inputs, field: str, pos: tuple[int, int], value: float):  # type: ignore[no-untyped-def]
    t = getattr(inputs, field).detach().clone()
    t[pos] = value
    if field == "logprobs":
        t.requires_grad_()
    return replace(inputs, **{field: t})


def test_every_registered_loss_is_covered() -> None:
    assert {name for name, _ in CONFIGS} == set(loss_names())


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS)
@pytest.mark.parametrize("field", ["advantages", "logprobs", "old_logprobs"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_input_raises_naming_it(name, kwargs, field, value) -> None:  # type: ignore[no-untyped-def]
    """A NaN advantage used to give a NaN loss and NaN gradients without a word."""
    inp = _with(_batch(), field, (2, 3), value)
    with pytest.raises(ValueError, match=rf"loss {name!r}: inputs\.{field} has 1 non-finite") as e:
        get_loss(name)(inp, **kwargs)
    assert "row 2, position 3" in str(e.value)


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS)
def test_masked_positions_may_hold_anything(name, kwargs) -> None:  # type: ignore[no-untyped-def]
    """Padding is never read: NaN/inf there neither raises nor reaches the loss."""
    clean = _batch()
    inp = clean
    for field, value in [("advantages", float("nan")), ("logprobs", float("-inf"))]:
        inp = _with(inp, field, (3, 2), value)  # row 3 has 1 token: position 2 is padding
    inp = _with(inp, "old_logprobs", (0, 3), float("inf"))
    loss, _ = get_loss(name)(inp, **kwargs)
    ref, _ = get_loss(name)(replace(clean, logprobs=clean.logprobs.detach()), **kwargs)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_the_reference_log_probs_are_checked_too() -> None:
    inp = make_inputs(LENGTHS, EPISODES)
    ref = inp.logprobs.detach().clone()
    ref[1, 0] = float("nan")
    with pytest.raises(
        ValueError, match=r"inputs\.ref_logprobs has 1 non-finite .*row 1, position 0"
    ):
        get_loss("ppo")(replace(inp, ref_logprobs=ref))


def test_the_check_keeps_the_loss_signature() -> None:
    """The registry wraps each loss once; settable knobs are still the function's own."""
    import inspect

    from credo.objectives.hpo import holder

    assert get_loss("holder") is holder
    assert "schedule" in inspect.signature(get_loss("holder")).parameters
    inp = make_inputs(LENGTHS, EPISODES, mode="seq-mean-token-mean")
    assert torch.isfinite(holder(inp, p=0.5, schedule="constant")[0])
