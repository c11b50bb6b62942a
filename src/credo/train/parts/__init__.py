"""The run's parts (:mod:`credo.train.parts.base`): what an iteration and its update run
besides the sampler, credit and the loss, each registered with what it needs and built
once per run from the config. Importing this package registers the built-in parts; within
a stage they run in this order:

- ``sampling_copy`` (:mod:`~credo.train.parts.sampling_copy`): FSDP's sampling copy follows
  the trainer after each update;
- ``state_embeddings`` (:mod:`~credo.train.parts.state_embeddings`): the policy's state
  embeddings, for the trajectory graph's embedding merge;
- ``kl_reward_penalty`` (:mod:`~credo.train.parts.kl_penalty`): the KL reward penalty;
- ``teacher`` (:mod:`~credo.train.parts.teacher`): the teachers and their route;
- ``judge`` (:mod:`~credo.train.parts.judge`): SERPO's rubric reward;
- ``oracle_rows`` (:mod:`~credo.train.parts.sero`): SERO's oracle rows and loss term;
- ``profile_reference`` (:mod:`~credo.train.parts.profiles`): RAPO's reference scorings;
- ``engine_mismatch`` (:mod:`~credo.train.parts.mismatch`): the sampler/trainer mismatch
  and truncated IS;
- ``update_health`` (:mod:`~credo.train.parts.update_health`): the ratio's extremes and the
  KL to the sampler;
- ``trust_region`` (:mod:`~credo.train.parts.trust_region`): ``optim.max_kl``;
- ``periodic_eval`` (:mod:`~credo.train.parts.periodic_eval`): ``eval.every``.

A new part is one file with a registered :class:`Part` (imported before the run is built).
"""

import importlib

from credo.train.parts.base import (
    PARTS,
    STAGES,
    UPDATE_STAGES,
    IterationData,
    Part,
    PartContext,
    Parts,
    Unsharded,
    build_parts,
    check_parts,
    check_sharded,
    register_part,
    rollout_texts,
    run_needs,
    update_context,
)

#: The built-in parts' modules, imported (so registered) in this order: their order within
#: each stage.
BUILT_IN = (
    "sampling_copy",
    "state_embeddings",
    "kl_penalty",
    "teacher",
    "judge",
    "sero",
    "profiles",
    "mismatch",
    "update_health",
    "trust_region",
    "periodic_eval",
)
for _module in BUILT_IN:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = [
    "BUILT_IN",
    "PARTS",
    "STAGES",
    "UPDATE_STAGES",
    "IterationData",
    "Part",
    "PartContext",
    "Parts",
    "Unsharded",
    "build_parts",
    "check_parts",
    "check_sharded",
    "register_part",
    "rollout_texts",
    "run_needs",
    "update_context",
]
