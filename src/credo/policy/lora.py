"""LoRA adapters (through ``peft``) and the reference policy that shares their weights.

With LoRA, each targeted linear layer ``W`` (frozen) gets a trainable low-rank update,
``y = W x + (α / r) · B A x`` with ``A ∈ R^{r×d_in}`` (random init) and
``B ∈ R^{d_out×r}`` (zero init), so the wrapped model starts out equal to the base
model and only ``A``, ``B`` are trained (Hu et al., 2021, https://arxiv.org/abs/2106.09685).
Optimizer state and checkpoints then hold the adapters only.

The frozen reference of a KL-regularised run is the base model itself: the same module
objects run with the adapters switched off (peft's ``disable_adapter()``), instead of a
second copy of the weights (:func:`shared_reference`).

A warm start trained with LoRA is merged into the base weights (:func:`merge_lora`), and
RL then trains fresh adapters on top: the reference (adapters off) is then exactly the
warm-start policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from credo.policy.hf import HFPolicy, require_peft

__all__ = [
    "LLAMA_PROJECTIONS",
    "LoRAConfig",
    "apply_lora",
    "merge_lora",
    "require_peft",
    "shared_reference",
    "trainable_parameters",
]

#: The linear layers of Llama-style blocks (SmolLM2, the built-in model, Qwen, Mistral ...).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRAConfig:
    """LoRA adapters for ``model.lora`` (``None`` there = full fine-tuning).

    Attributes:
        r: rank of each update ``B A`` (default 8).
        alpha: scale numerator; the update is multiplied by ``alpha / r`` (default 16).
        dropout: dropout on the adapter input (default 0.0; any dropout makes the
            trainer's train-mode log-probs noisy, so RL usually keeps it at 0).
        target_modules: names of the linear layers to adapt (default: every projection of
            a Llama-style block, :data:`LLAMA_PROJECTIONS`; other architectures name
            their layers differently, e.g. ``[c_attn, c_proj]`` for GPT-2).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(LLAMA_PROJECTIONS))

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"model.lora.r must be ≥ 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules must name at least one layer")


def apply_lora(policy: HFPolicy, cfg: LoRAConfig, *, seed: int = 0) -> HFPolicy:
    """Wrap ``policy.model`` with fresh LoRA adapters (base weights frozen).

    Args:
        policy: a policy whose model is not yet a peft model.
        cfg: rank, scale, dropout and target layers.
        seed: seeds the random init of the ``A`` matrices (the global RNG is untouched).

    Returns:
        A policy over the wrapped model (same tokenizer and device).

    Raises:
        ValueError: no layer of the model matches ``cfg.target_modules``, or the model
            already has adapters.
    """
    if policy.is_peft:
        raise ValueError("the policy already has LoRA adapters")
    peft = require_peft()
    names = {name.rsplit(".", 1)[-1] for name, _ in policy.model.named_modules()}
    if not set(cfg.target_modules) & names:
        raise ValueError(
            f"model.lora.target_modules {cfg.target_modules} match no layer of "
            f"{type(policy.model).__name__}; its linear layers include: "
            + ", ".join(sorted(n for n, m in _linear_names(policy.model)))
        )
    lora = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.get_peft_model(policy.model, lora)
    return HFPolicy(model, policy.tokenizer, device=policy.device)


def _linear_names(model: torch.nn.Module) -> set[tuple[str, str]]:
    return {
        (name.rsplit(".", 1)[-1], type(m).__name__)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }


def merge_lora(policy: HFPolicy) -> HFPolicy:
    """Fold the adapters into the base weights (``W ← W + (α/r)·B A``) and drop them;
    a policy without adapters is returned as is."""
    if not policy.is_peft:
        return policy
    model = policy.model.merge_and_unload()
    for p in model.parameters():
        p.requires_grad_(True)
    return HFPolicy(model, policy.tokenizer, device=policy.device)


def shared_reference(policy: HFPolicy) -> HFPolicy:
    """The frozen reference of a LoRA policy: the same model with adapters switched off
    (no second copy of the weights). Its log-probs are those of the base model."""
    if not policy.is_peft:
        raise ValueError("shared_reference needs a LoRA policy; copy the model otherwise")
    return HFPolicy(policy.model, policy.tokenizer, device=policy.device, adapters_disabled=True)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters the optimizer updates: all of them, or only the adapters under LoRA."""
    return [p for p in model.parameters() if p.requires_grad]
