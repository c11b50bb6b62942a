"""The policy's state embeddings for the trajectory graph's embedding merge
(``credit.params.similarity: embedding``, :mod:`credo.credit.state_graph`): after the
rollouts and before credit, every row's prompt is read by the policy being trained and
its last hidden layer, averaged over the prompt's tokens, becomes the forest's extra
column ``state_embedding`` ``[N, d]`` (:meth:`~credo.policy.HFPolicy.embed`). The
estimator declares the need when it registers; the cost is one forward pass over the
prompts, reported as ``credit/embed_seconds``, and ``credit/embed_merged`` is the share
of the exact state nodes the merge removes at the configured threshold (0: none merged;
a guide for choosing ``similarity_threshold``)."""

from __future__ import annotations

import time
from dataclasses import replace

from credo.credit import estimator_needs
from credo.credit.state_graph import EMBEDDING, state_nodes
from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["StateEmbeddings"]


def _wanted(cfg: object) -> bool:
    c = cfg.credit  # type: ignore[attr-defined]
    return "state_embeddings" in estimator_needs(c.estimator, c.params)


@register_part("state_embeddings", when=_wanted)
class StateEmbeddings(Part):
    """Add ``forest.extras["state_embedding"]`` before credit (module docstring)."""

    def __init__(self, ctx: PartContext) -> None:
        self.policy = ctx.policy
        self.threshold = float(ctx.cfg.credit.params["similarity_threshold"])

    def reward(self, data: IterationData) -> None:
        start = time.perf_counter()
        forest = data.forest
        vectors = self.policy.embed([p.tolist() for p in forest.prompt_ids])
        data.forest = replace(forest, extras={**forest.extras, EMBEDDING: vectors})
        data.metrics["credit/embed_seconds"] = time.perf_counter() - start
        exact = state_nodes(forest).num_nodes
        merged = state_nodes(
            data.forest, similarity_threshold=self.threshold, similarity="embedding"
        )
        data.metrics["credit/embed_merged"] = 1.0 - merged.num_nodes / exact if exact else 0.0
