"""``Engine.step``: the optimizer step of one mini-batch, clipped; none on a non-finite
gradient, nor (``optim.zero_grad_step=false``) on an exactly zero one."""

from __future__ import annotations

import copy

import torch

from credo.engines import Engine


def test_a_zero_gradient_takes_no_step_although_adam_has_momentum() -> None:
    """After a step on a real gradient AdamW's moments are non-zero, so a step on a zero
    gradient (a mini-batch whose advantages are all 0) would still move the weights by
    lr · m̂/(√v̂ + ε): measured below on the bare optimizer (and so with the default
    ``step_on_zero=True``). With ``step_on_zero=False`` ``Engine.step`` takes no step
    then, and the weights stay as they are; a later real gradient steps again."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.0)
    w.grad = torch.tensor([1.0, -2.0, 0.5, 3.0])
    opt.step()
    # the bare optimizer on a zero gradient: the weights move (what the fix avoids)
    probe = torch.nn.Parameter(w.detach().clone())
    bare = torch.optim.AdamW([probe], lr=0.1, weight_decay=0.0)
    bare.load_state_dict(copy.deepcopy(opt.state_dict()))  # its own moments
    probe.grad = torch.zeros(4)
    before = probe.detach().clone()
    bare.step()
    assert float((probe.detach() - before).abs().max()) > 0.05
    # Engine.step: no step, no change, norm 0 reported
    w.grad = torch.zeros(4)
    before = w.detach().clone()
    norm = Engine().step([w], opt, grad_clip=1.0, step_on_zero=False)
    assert float(norm) == 0.0
    assert torch.equal(w.detach(), before)
    assert opt.state[w]["step"] == 1  # the moments were not advanced either
    w.grad = torch.tensor([1.0, 1.0, 1.0, 1.0])
    Engine().step([w], opt, grad_clip=1.0, step_on_zero=False)
    assert not torch.equal(w.detach(), before) and opt.state[w]["step"] == 2
    # the default (every result so far): the zero-gradient step is taken, the weights move
    w.grad = torch.zeros(4)
    before = w.detach().clone()
    Engine().step([w], opt, grad_clip=1.0)
    assert not torch.equal(w.detach(), before) and opt.state[w]["step"] == 3


def test_a_non_finite_gradient_takes_no_step() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    w.grad = torch.tensor([1.0, float("nan"), 0.0])
    norm = Engine().step([w], opt, grad_clip=1.0)
    assert not torch.isfinite(norm) and torch.equal(w.detach(), torch.ones(3))
