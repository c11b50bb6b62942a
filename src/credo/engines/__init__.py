"""Training engines: how one update runs over several processes.

- :mod:`~credo.engines.distributed`: data parallelism under ``torchrun`` / ``accelerate
  launch`` (groups split across processes, forests gathered before credit, micro-batches
  split and gradients summed; every helper is the identity in one process);
- :mod:`~credo.engines.fsdp`: an accelerate FSDP config (the trainer sharded with
  ``fully_shard``, a full sampling copy refreshed after each update);
- :mod:`~credo.engines.zero`: an accelerate DeepSpeed config (credo's AdamW in a ZeRO-1/2
  engine);
- :mod:`~credo.engines.engine`: :class:`Engine`, what the iteration and the update ask of
  them (the rollouts' share, the micro-batches' share, the backward pass, the step).

Depends on :mod:`credo.data`, :mod:`credo.policy`, :mod:`credo.rollout` and
:mod:`credo.utils` only: the trainer (:mod:`credo.train`) calls them, never the reverse.
"""

from credo.engines.engine import Engine

__all__ = ["Engine"]
