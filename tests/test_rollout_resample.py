"""The resample sampler (AXPO): which steps, how many, and the forest shape axpo reads."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.credit import compute_advantages
from credo.credit.axpo import resample_branches
from credo.data import SOURCES, Step
from credo.envs import Task
from credo.policy import Generation, SamplingParams, build_word_tokenizer
from credo.rollout import PlainRenderer, sample_groups
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.resample import (
    ResampleParams,
    action_confidence,
    resample_points,
    sample_resampled,
    thinking_length,
)
from credo.rollout.sampler import SamplerContext
from test_rollout import ScriptedPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.custom_env import GuessEnv

RESAMPLE = SOURCES.index("resample")


class ToolGuess(GuessEnv):
    """GuessEnv where ``guess[...]`` counts as a tool call."""

    def is_tool_call(self, action: str) -> bool:
        return action.replace(" ", "").startswith("guess[")


def _tok():  # type: ignore[no-untyped-def]
    return build_word_tokenizer(
        [*GuessEnv().vocabulary(), *PLAIN_WORDS, "<think>", "</think>", "hmm"]
    )


def test_resample_points_by_hand() -> None:
    # candidates (group, confidence): 0:(0, .9) 1:(0, .2) 2:(0, .5) 3:(1, .1) 4:(1, .3)
    # ranked: 3 (.1), 1 (.2), 4 (.3), 2 (.5), 0 (.9); at most 2 per group → 0 is out
    # (third in group 0); 2 per point, budget 5: 3 → 2, 1 → 2, 4 → 1 (budget spent), 2 → 0
    counts = resample_points(
        torch.tensor([0, 0, 0, 1, 1]),
        torch.tensor([0.9, 0.2, 0.5, 0.1, 0.3]),
        budget=5,
        per_point=2,
        max_points_per_group=2,
    )
    assert counts.tolist() == [0, 2, 0, 2, 1]
    assert resample_points(torch.zeros(0, dtype=torch.long), torch.zeros(0), budget=3,
                           per_point=2, max_points_per_group=2).numel() == 0  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(0, 1)), max_size=30),
    st.integers(0, 40),
    st.integers(1, 4),
    st.integers(1, 5),
)
def test_resample_points_stay_within_budget_and_caps(
    cands: list, budget: int, per_point: int, cap: int
) -> None:
    group = torch.tensor([g for g, _ in cands], dtype=torch.long)
    conf = torch.tensor([c for _, c in cands], dtype=torch.float64)
    counts = resample_points(
        group, conf, budget=budget, per_point=per_point, max_points_per_group=cap
    )
    assert bool((counts >= 0).all()) and bool((counts <= per_point).all())
    chosen = counts > 0
    per_group = torch.bincount(group[chosen], minlength=5) if cands else torch.zeros(5)
    assert bool((per_group <= cap).all())
    allowed = sum(min(cap, int((group == g).sum())) for g in range(5))
    assert int(counts.sum()) == min(budget, per_point * allowed)
    # the lowest confidences of a group are served first
    for g in range(5):
        m = group == g
        if bool(chosen[m].any()) and bool((~chosen[m]).any()):
            assert float(conf[m][chosen[m]].max()) <= float(conf[m][~chosen[m]].min())


def test_confidence_is_the_mean_token_probability() -> None:
    step = Step("o", "a", logprobs=[0.0, -0.6931471805599453, -1.3862943611198906])
    # probabilities 1, ½, ¼ → mean 7/12; after a 1-token kept prefix: (½ + ¼)/2 = 3/8
    assert action_confidence(step) == pytest.approx(7 / 12)
    assert action_confidence(step, skip=1) == pytest.approx(3 / 8)
    assert action_confidence(Step("o", "a")) == 1.0


def _sample(policy, tok, *, tasks: int = 8, group_size: int = 4, **kw):  # type: ignore[no-untyped-def]
    ctx = SamplerContext(
        policy, PlainRenderer(tok), ToolGuess, SamplingParams(), 4, torch.Generator().manual_seed(0)
    )
    return sample_resampled(
        ctx, [Task.make("train", i) for i in range(tasks)], group_size=group_size, **kw
    )


def guessing_policy(tok, seed: int = 0):  # type: ignore[no-untyped-def]
    """Guesses 1..8 at random, with a made-up log-prob per guess (its confidence)."""
    rng = random.Random(seed)

    class P(ScriptedPolicy):
        def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
            out = super().generate(prompts, sampling, generator)
            for g in out:
                g.logprobs = -torch.rand(len(g.token_ids), generator=generator)
            return out

    return P(tok, lambda p: f"guess[{rng.randint(1, 8)}]")


def test_resampling_touches_only_all_failed_groups_within_budget() -> None:
    tok = _tok()
    res = _sample(guessing_policy(tok), tok)
    base = sample_groups(
        SamplerContext(
            guessing_policy(tok),
            PlainRenderer(tok),
            ToolGuess,
            SamplingParams(),
            4,
            generator=torch.Generator().manual_seed(0),
        ),
        [Task.make("train", i) for i in range(8)],
        group_size=4,
    )
    f, b = res.forest, base.forest
    n = b.num_rows
    # the originals are exactly the group sampler's episodes, rows first and unchanged
    assert torch.equal(f.parent[:n], b.parent) and f.actions[:n] == b.actions
    assert bool((f.source[:n] == 0).all()) and bool((f.source[n:] == RESAMPLE).all())
    ok = {e.group for e in base.episodes if e.success}
    failed = set(range(8)) - ok
    assert ok and failed  # the example has both kinds of group
    touched = set(f.group[n:].tolist())
    assert touched and touched <= failed
    # the budget: ⌊0.25 · 32⌋ = 8 extra episodes at most, 2 per chosen step
    assert res.stats["rollout/resampled"] == len(res.episodes) - 32 <= 8
    assert res.stats["rollout/resampled"] == min(8, 2 * res.stats["rollout/resample_points"])
    assert res.env_steps == f.num_rows
    assert res.generated_tokens == sum(r.numel() for r in f.response_ids)


def test_forest_shape_is_what_axpo_reads() -> None:
    tok = _tok()
    res = _sample(guessing_policy(tok, 1), tok, params=ResampleParams(budget=0.5))
    f = res.forest
    in_branch, branch_parent = resample_branches(f)
    assert torch.equal(in_branch, f.source == RESAMPLE)
    for tr in res.trajectories:
        if tr.source < 0:
            continue
        src = res.trajectories[tr.source].episode
        first = tr.episode.steps[tr.prefix]
        assert first.source == "resample" and src.steps[tr.prefix].source == "policy"
        # resampled at a tool call, with the prompt the original had there
        assert ToolGuess().is_tool_call(src.steps[tr.prefix].action)
        assert first.prompt_ids == src.steps[tr.prefix].prompt_ids
        assert tr.episode.steps[: tr.prefix] == src.steps[: tr.prefix]
    # each resample's first row hangs under the original's row before the tool call
    # (−1 at depth 0); every resample row sees that branch point
    firsts = torch.nonzero(
        (f.source == RESAMPLE) & ((f.parent < 0) | (f.source[f.parent.clamp(min=0)] != RESAMPLE)),
        as_tuple=False,
    ).flatten()
    assert firsts.numel() == res.stats["rollout/resampled"]
    assert torch.equal(branch_parent[firsts], f.parent[firsts])
    adv = compute_advantages("axpo", f)
    assert bool(torch.isfinite(adv).all())


def test_lowest_confidence_steps_are_resampled_first() -> None:
    tok = _tok()
    params = ResampleParams(budget=0.125, per_point=1, max_points_per_group=2)
    res = _sample(guessing_policy(tok, 2), tok, params=params)
    chosen = {(tr.source, tr.prefix) for tr in res.trajectories if tr.source >= 0}
    # by hand: every tool call of the all-failed groups, lowest confidence first, at
    # most 2 per group, until ⌊0.125 · 32⌋ = 4 resamples (one per step) are placed
    originals = res.trajectories[:32]
    ok = {tr.episode.group for tr in originals if tr.episode.success}
    cands = [
        (action_confidence(s), k, d)
        for k, tr in enumerate(originals)
        if tr.episode.group not in ok
        for d, s in enumerate(tr.episode.steps)
    ]
    expected, per_group = set(), {}
    for _, k, d in sorted(cands):
        g = originals[k].episode.group
        if len(expected) < 4 and per_group.get(g, 0) < 2:
            expected.add((k, d))
            per_group[g] = per_group.get(g, 0) + 1
    assert len(cands) > 4 and chosen == expected


class ThinkingPolicy:
    """Thinks ``hmm </think>`` then guesses; continues after a given ``</think>``."""

    def __init__(self, tok) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = tok
        self.end = tok.convert_tokens_to_ids("</think>")
        self.seen: list[list[int]] = []

    def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        out = []
        for p in prompts:
            self.seen.append(list(p))
            text = "guess[5]" if p[-1] == self.end else "hmm </think> guess[2]"
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            out.append(Generation(ids, torch.full((len(ids),), -0.5), text, True))
        return out


class ThinkRenderer(PlainRenderer):
    def extract_action(self, text: str, env) -> str:  # type: ignore[no-untyped-def]
        return text.split("</think>")[-1].strip()


def test_keep_thinking_resamples_only_the_tool_call() -> None:
    tok = _tok()
    policy = ThinkingPolicy(tok)
    step = Step(
        "o", "guess[2]", response_ids=[*tok.encode("hmm </think> guess[2]"), tok.eos_token_id]
    )
    assert thinking_length(step, tok, "</think>") == 2
    res = sample_resampled(
        SamplerContext(policy, ThinkRenderer(tok), ToolGuess, SamplingParams(), 1),
        [Task.make("train", 0)],
        group_size=2,
        params=ResampleParams(budget=0.5),
    )
    assert not any(e.success for e in res.episodes[:2])
    new = [tr for tr in res.trajectories if tr.source >= 0]
    assert len(new) == 1
    row = new[0].episode.steps[0]
    think = tok.encode("hmm </think>")
    # the kept thinking opens the response, with its original log-probs; the policy was
    # asked to continue after it; the tool call is new
    assert row.response_ids[:2] == think and row.logprobs[:2] == [-0.5, -0.5]
    assert policy.seen[-1] == row.prompt_ids + think
    assert row.action == "guess [ 5 ]" and row.source == "resample"
