"""verl plugin: credo's advantage estimators and policy losses inside verl's registries.

Importing this module registers, in verl's own registries
(``verl.trainer.ppo.core_algos``, verl ≥ 0.9):

- every credo estimator as the verl advantage estimator ``credo_<name>``
  (``credo_gigpo``, ``credo_graph``, ``credo_graphpo``, ``credo_proas``, ``credo_tsbpo``,
  ``credo_axpo``, ``credo_grpo``, ``credo_rloo``, ``credo_dr_grpo``, ``credo_return``):
  select one with ``algorithm.adv_estimator=credo_gigpo``;
- credo's policy losses as verl policy losses (``actor.policy_loss.loss_mode``):
  ``credo_holder`` / ``credo_holder_token`` (HölderPO), ``credo_klpo`` /
  ``credo_klpo_seq`` (KLPO, binary KL: verl gives a loss no auxiliary draws),
  ``credo_ppo_turn`` (PPO-clip with the turn-level ratio, one ratio per assistant turn)
  and ``credo_ppo`` (PPO-clip with token ratios, credo's twin of verl's ``vanilla``).

verl imports this module by itself in every process (driver and Ray workers) once credo is
installed beside it: credo declares it as a ``verl.plugins`` entry point, which
``import verl`` loads (``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``).

Advantages. verl calls an estimator with ``token_level_rewards``, ``response_mask``,
``index`` (the ``uid`` groups) and ``config`` (the ``algorithm`` section). A multi-turn
batch needs more per-row arrays (trajectory ids, anchor observations, step rewards...):
they are keyword arguments of the same function (see
:mod:`credo.integrations.verl_batch`), and :func:`compute_credo_advantage` reads them from
a ``DataProto``'s ``non_tensor_batch`` under verl-agent's names. The batch becomes a
:class:`~credo.data.RolloutForest`, credo's estimator runs on it, and each row's
advantage is broadcast to its response tokens. Knobs: :func:`configure` in Python, then
``algorithm.credo`` in the run config (a mapping of the estimator's keyword arguments;
it wins). An estimator with state across iterations (ProAS's reference graph) keeps it
in this process: :func:`estimator_state`.

Losses. verl passes ``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask``,
``loss_agg_mode``, the actor ``config`` and optional ``rollout_is_weights``. The
aggregation becomes credo weights equal to verl's ``agg_loss`` (with the config's
``global_batch_info``, so micro-batches and ranks add up as verl's own losses do);
``rollout_is_weights`` multiply them. Knobs: ``clip_ratio_low`` / ``clip_ratio_high`` /
``clip_ratio_c`` of the actor config map to ``clip_low`` / ``clip_high`` /
``dual_clip`` where the loss has them, and :func:`configure` overrides any knob. verl
does not pass the training step to a loss: :func:`set_training_step` sets the step that
HölderPO's p schedule reads (0 until called).
"""

from __future__ import annotations

try:
    from verl.trainer.ppo import core_algos as _core
except ImportError as _exc:  # pragma: no cover - exercised by the guard test
    raise ImportError(
        "credo.integrations.verl needs verl (pip install 'verl>=0.9,<0.10'), which is not installed"
    ) from _exc

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from credo.credit import (
    compute_advantages,
    estimator_names,
    estimator_state_factory,
    validate_estimator,
)
from credo.integrations.verl_batch import rows_to_token_advantages, verl_batch_to_forest
from credo.integrations.verl_loss import credo_policy_loss, verl_aggregation_weights
from credo.objectives import validate_loss

__all__ = [
    "LOSSES",
    "PREFIX",
    "SETTINGS",
    "PluginSettings",
    "compute_credo_advantage",
    "configure",
    "estimator_state",
    "register",
    "set_training_step",
]

PREFIX = "credo_"

#: verl loss name → (credo loss, fixed knobs, split rows into assistant turns).
LOSSES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "credo_ppo": ("ppo", {"ratio_level": "token"}, False),
    "credo_ppo_turn": ("ppo", {"ratio_level": "turn"}, True),
    "credo_holder": ("holder", {}, False),
    "credo_holder_token": ("holder_token", {}, False),
    "credo_klpo": ("klpo", {"kl": "binary"}, False),
    "credo_klpo_seq": ("klpo_seq", {"kl": "binary"}, False),
}

#: Actor-config keys read as loss knobs (verl name → credo knob), where the loss has it.
_ACTOR_KNOBS = {
    "clip_ratio_low": "clip_low",
    "clip_ratio_high": "clip_high",
    "clip_ratio_c": "dual_clip",
}
_LOSS_KNOBS = {
    "ppo": ("clip_low", "clip_high", "dual_clip"),
    "holder": ("clip_low", "clip_high"),
    "holder_token": ("clip_low", "clip_high"),
    "klpo": (),
    "klpo_seq": (),
}

# verl-agent's non_tensor_batch names → estimator keyword arguments.
_BATCH_KEYS = {
    "uid": "index",
    "traj_uid": "traj_index",
    "parent": "parent",
    "step_index": "step_index",
    "anchor_obs": "anchor_obs",
    "next_anchor_obs": "next_anchor_obs",
    "rewards": "rewards",
    "dones": "dones",
    "success": "success",
    "is_action_valid": "is_action_valid",
    "source": "source",
    "actions": "actions",
}


@dataclass
class PluginSettings:
    """What the plugin keeps in this process between verl's calls: the knobs set by
    :func:`configure`, the estimators' states (:func:`estimator_state`) and the training
    step (:func:`set_training_step`). verl calls the registered functions by name, so
    they read the one instance :data:`SETTINGS`; :meth:`reset` starts it afresh."""

    estimator_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    loss_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: dict[str, Any] = field(default_factory=dict)
    step: int = 0

    def reset(self) -> None:
        """Forget every knob, state and the step."""
        self.estimator_params.clear()
        self.loss_params.clear()
        self.states.clear()
        self.step = 0


#: The plugin's settings in this process.
SETTINGS = PluginSettings()


def configure(
    *,
    estimators: Mapping[str, Mapping[str, Any]] | None = None,
    losses: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Set knobs of the registered estimators / losses in this process.

    Args:
        estimators: verl name (``credo_gigpo``) → credo estimator kwargs
            (e.g. ``{"credo_gigpo": {"gamma": 0.9, "mode": "mean_std_norm"}}``).
        losses: verl loss name (``credo_holder``) → credo loss kwargs.

    Unknown names raise ``KeyError``, unknown knobs ``ValueError``, listing the valid ones.
    """
    for name, params in (estimators or {}).items():
        validate_estimator(_credo_estimator(name), params)
        SETTINGS.estimator_params[name] = dict(params)
    for name, params in (losses or {}).items():
        if name not in LOSSES:
            raise KeyError(f"unknown credo verl loss {name!r}; valid: {', '.join(sorted(LOSSES))}")
        validate_loss(LOSSES[name][0], params)
        SETTINGS.loss_params[name] = dict(params)


def set_training_step(step: int) -> None:
    """Training step read by the losses (HölderPO's p schedule); call it once per step."""
    SETTINGS.step = int(step)


def estimator_state(name: str) -> Any:
    """The state object of estimator ``name`` (``credo_proas``), built on first use."""
    if name not in SETTINGS.states:
        factory = estimator_state_factory(_credo_estimator(name))
        if factory is None:
            raise KeyError(f"estimator {name!r} keeps no state across iterations")
        SETTINGS.states[name] = factory()
    return SETTINGS.states[name]


def _credo_estimator(name: str) -> str:
    if not name.startswith(PREFIX) or name[len(PREFIX) :] not in estimator_names():
        valid = ", ".join(PREFIX + n for n in estimator_names())
        raise KeyError(f"unknown credo verl estimator {name!r}; valid: {valid}")
    return name[len(PREFIX) :]


def _config_params(config: Any) -> dict[str, Any]:
    """``config['credo']`` as a plain dict (DictConfig, dict or verl dataclass config)."""
    if config is None:
        return {}
    try:
        section = config.get("credo", None)
    except (AttributeError, TypeError):
        return {}
    if section is None:
        return {}
    if hasattr(section, "items"):
        return {str(k): _plain(v) for k, v in section.items()}
    raise TypeError(f"algorithm.credo must be a mapping of estimator knobs, got {section!r}")


def _plain(v: Any) -> Any:
    if hasattr(v, "items"):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig":
        return [_plain(x) for x in v]
    return v


def _make_estimator(verl_name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    name = _credo_estimator(verl_name)

    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Any = None,
        config: Any = None,
        *,
        traj_index: Any = None,
        parent: Any = None,
        step_index: Any = None,
        anchor_obs: Any = None,
        next_anchor_obs: Any = None,
        rewards: Any = None,
        dones: Any = None,
        success: Any = None,
        is_action_valid: Any = None,
        source: Any = None,
        actions: Any = None,
        reward_layout: str = "episode",
        reward_baselines: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """credo's estimator on a verl batch → ``(advantages [B, L], returns [B, L])``.

        ``reward_baselines`` (ReMax) is accepted and not used. See
        :mod:`credo.integrations.verl_batch` for the other arguments.
        """
        vf = verl_batch_to_forest(
            token_level_rewards,
            response_mask,
            index=index,
            traj_index=traj_index,
            parent=parent,
            step_index=step_index,
            anchor_obs=anchor_obs,
            next_anchor_obs=next_anchor_obs,
            rewards=rewards,
            dones=dones,
            success=success,
            is_action_valid=is_action_valid,
            source=source,
            actions=actions,
            reward_layout=reward_layout,
        )
        params = {**SETTINGS.estimator_params.get(verl_name, {}), **_config_params(config)}
        validate_estimator(name, params)
        state = estimator_state(verl_name) if estimator_state_factory(name) else None
        adv = compute_advantages(name, vf.forest, params, state=state)
        out = rows_to_token_advantages(adv, vf.order, response_mask)
        out = out.to(token_level_rewards.dtype)
        return out, out

    estimator.__name__ = f"compute_{verl_name}_advantage"
    estimator.__qualname__ = estimator.__name__
    estimator.__credo__ = name  # type: ignore[attr-defined]
    return estimator


def _make_loss(verl_name: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    loss_name, fixed, turns = LOSSES[verl_name]

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """credo's loss with verl's policy-loss signature → ``(loss, metrics)``."""
        info = dict(_get(config, "global_batch_info", None) or {})
        weights = verl_aggregation_weights(
            response_mask.bool(),
            loss_agg_mode,
            dp_size=int(info.get("dp_size") or 1),
            batch_num_tokens=info.get("batch_num_tokens"),
            global_batch_size=info.get("global_batch_size"),
            loss_scale_factor=info.get("loss_scale_factor"),
        )
        if rollout_is_weights is not None:
            weights = weights * rollout_is_weights.detach().to(weights.dtype)
        params = dict(fixed)
        clip = _get(config, "clip_ratio", None)
        for verl_key, knob in _ACTOR_KNOBS.items():
            value = _get(config, verl_key, None)
            if value is None and knob != "dual_clip":
                value = clip  # verl: clip_ratio_low/high default to clip_ratio
            if knob in _LOSS_KNOBS[loss_name] and value is not None:
                params[knob] = float(value)
        params.update(SETTINGS.loss_params.get(verl_name, {}))
        loss, metrics = credo_policy_loss(
            loss_name,
            params,
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            weights=weights,
            turns=turns,
            step=SETTINGS.step,
        )
        total = weights.sum().detach()
        scale = 1.0 / float(total) if float(total) > 0 else 0.0
        out = {
            f"actor/credo/{k}": float(v.detach()) * scale
            for k, v in metrics.items()
            if k != "loss/policy"
        }
        return loss, out

    policy_loss.__name__ = f"compute_policy_loss_{verl_name}"
    policy_loss.__qualname__ = policy_loss.__name__
    policy_loss.__credo__ = loss_name  # type: ignore[attr-defined]
    return policy_loss


def _get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    try:
        return config.get(key, default)
    except (AttributeError, TypeError):
        return getattr(config, key, default)


def register() -> list[str]:
    """Register every credo estimator and loss in verl's registries (idempotent).

    A name already taken by something that is not credo's raises ``ValueError``.

    Returns:
        The verl names registered, estimators first.
    """
    names = []
    for name in estimator_names():
        verl_name = PREFIX + name
        current = _core.ADV_ESTIMATOR_REGISTRY.get(verl_name)
        if current is None:
            _core.register_adv_est(verl_name)(_make_estimator(verl_name))
        elif getattr(current, "__credo__", None) != name:
            raise ValueError(f"verl advantage estimator {verl_name!r} is taken by {current!r}")
        names.append(verl_name)
    for verl_name, (loss_name, _, _) in LOSSES.items():
        current = _core.POLICY_LOSS_REGISTRY.get(verl_name)
        if current is None:
            _core.register_policy_loss(verl_name)(_make_loss(verl_name))
        elif getattr(current, "__credo__", None) != loss_name:
            raise ValueError(f"verl policy loss {verl_name!r} is taken by {current!r}")
        names.append(verl_name)
    return names


def compute_credo_advantage(data: Any, adv_estimator: str, config: Any = None) -> Any:
    """Fill ``data.batch['advantages']`` / ``['returns']`` of a verl ``DataProto``.

    The multi-turn counterpart of verl's ``compute_advantage`` (which passes an estimator
    only ``uid``): it also reads verl-agent's per-row arrays from ``data.non_tensor_batch``
    (``uid``, ``traj_uid``, ``anchor_obs``, ``rewards``, ``is_action_valid``; and
    ``parent``, ``step_index``, ``next_anchor_obs``, ``dones``, ``success``, ``source``,
    ``actions``) and calls the estimator through verl's registry.

    Args:
        data: a ``verl.DataProto`` with ``token_level_rewards`` and ``response_mask``.
        adv_estimator: a registered name, e.g. ``"credo_gigpo"``.
        config: the ``algorithm`` config (its ``credo`` mapping holds knobs).

    Returns:
        ``data``, updated in place.
    """
    fn = _core.get_adv_estimator_fn(adv_estimator)
    if getattr(fn, "__credo__", None) is None:
        raise ValueError(
            f"{adv_estimator!r} is not a credo estimator; use verl's compute_advantage"
        )
    batch = data.batch
    kwargs: dict[str, Any] = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"],
        "config": config,
    }
    nt = data.non_tensor_batch
    for key, arg in _BATCH_KEYS.items():
        if key in nt:
            kwargs[arg] = np.asarray(nt[key])
    adv, ret = fn(**kwargs)
    batch["advantages"] = adv
    batch["returns"] = ret
    return data


register()
