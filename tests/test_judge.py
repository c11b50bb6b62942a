"""Judges and rubric rewards (SERPO): verdict probabilities from fixed logits, batching
and caching, rubric rewards, reward mixing and rubric evolution."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.teachers.judge import Judge, verdict_ids, verdict_margins, verdict_scores
from credo.teachers.judge_fit import JudgeExample, fit_judge, verdict_loss
from credo.teachers.rubric import (
    PROPOSERS,
    ResponsePools,
    Rubric,
    RubricEvolver,
    RubricItem,
    combine_rewards,
)

WORDS = ["yes", "no", "question", "context", "response", "verdict", ":", "is", "it", "polite"]
WORDS += ["thanks", "refund", "issued", "go", "away", "does", "the", "mention", "?"]


def _judge(**kw) -> Judge:  # type: ignore[no-untyped-def]
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return Judge(create_tiny_policy(WORDS, cfg, seed=0), **kw)


def test_verdict_score_is_p_yes_over_p_yes_plus_p_no() -> None:
    logits = torch.tensor(
        [
            [0.0, 2.0, 0.0, 5.0],  # yes = id 1 (z 2), no = id 2 (z 0): σ(2)
            [0.0, 0.0, math.log(2.0), -1.0],  # p_yes ∝ 1, p_no ∝ 2: 1/3
            [9.0, 1.0, 1.0, 9.0],  # tokens outside the verdicts do not count: ½
        ]
    )
    s = verdict_scores(logits, [1], [2])
    assert s.tolist() == pytest.approx([1 / (1 + math.exp(-2)), 1 / 3, 0.5], abs=1e-6)
    # several spellings add up: yes ∝ e^0 + e^ln2 = 3, no ∝ e^0 = 1 → ¾
    two = torch.tensor([[0.0, math.log(2.0), 0.0, 0.0]])
    assert verdict_scores(two, [0, 1], [2]).item() == pytest.approx(0.75, abs=1e-6)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=4, max_size=4), st.floats(-5, 5))
def test_verdict_scores_ignore_a_shift_and_complement_when_swapped(
    z: list[float], c: float
) -> None:
    logits = torch.tensor([z], dtype=torch.float64)
    s = verdict_scores(logits, [0], [1])
    assert verdict_scores(logits + c, [0], [1]).item() == pytest.approx(s.item(), abs=1e-9)
    assert verdict_scores(logits, [1], [0]).item() == pytest.approx(1 - s.item(), abs=1e-9)
    assert 0.0 <= s.item() <= 1.0


def test_a_tokenizer_without_a_verdict_word_is_refused_in_one_line() -> None:
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = create_tiny_policy(["yes", "maybe"], cfg)
    with pytest.raises(ValueError, match="no single token for 'no'"):
        verdict_ids(policy.tokenizer)
    with pytest.raises(ValueError, match="no single token for 'no'"):
        Judge(policy)


def test_judge_scores_match_one_by_one_and_are_cached() -> None:
    judge = _judge(micro_batch=3)
    qs = ["is it polite ?"] * 4 + ["does the response mention refund ?"] * 3
    rs = ["thanks", "go away", "refund issued", "thanks", "refund issued", "go away", "thanks"]
    batched = judge.scores(qs, rs)
    assert judge.cost.forwards == 2  # 6 distinct pairs (one repeated) in micro-batches of 3
    assert judge.cost.asked == 7 and judge.cost.cached == 0
    assert batched[0] == batched[3]  # the repeated pair
    one = _judge(micro_batch=1)
    singles = torch.cat([one.scores([q], [r]) for q, r in zip(qs, rs)])
    torch.testing.assert_close(batched, singles, atol=1e-5, rtol=0)
    # by hand: the model's next-token logits at the end of the prompt
    ids = judge.prompt_ids(qs[1], rs[1])
    with torch.no_grad():
        logits = judge.policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
    y, n = judge.yes, judge.no
    expect = torch.sigmoid(torch.logsumexp(logits[y], 0) - torch.logsumexp(logits[n], 0))
    assert batched[1].item() == pytest.approx(expect.item(), abs=1e-5)
    again = judge.scores(qs, rs)
    assert torch.equal(again, batched)
    assert judge.cost.cached == 7 and judge.cost.forwards == 2  # nothing re-scored
    assert set(judge.cost.metrics()) >= {"judge/forwards", "judge/cached", "judge/seconds"}


def test_the_context_is_part_of_the_question() -> None:
    judge = _judge()
    a = judge.scores(["is it polite ?"], ["thanks"], ["refund"])
    b = judge.scores(["is it polite ?"], ["thanks"], ["go away"])
    assert judge.cost.cached == 0 and a.item() != b.item()


class FixedJudge:
    """Scores by a table: (question, response) → score."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table = table

    def scores(self, questions, responses, contexts=None):  # type: ignore[no-untyped-def]
        return torch.tensor([self.table[(q, r)] for q, r in zip(questions, responses)])


def test_rubric_reward_is_the_weighted_sum_of_item_scores() -> None:
    rubric = Rubric([RubricItem("polite?", 0.5), RubricItem("refund?", 0.25)])
    judge = FixedJudge(
        {("polite?", "a"): 0.8, ("refund?", "a"): 0.4, ("polite?", "b"): 0.0, ("refund?", "b"): 1.0}
    )
    assert rubric.reward(judge, ["a", "b"]).tolist() == pytest.approx([0.5, 0.25])
    assert Rubric([]).reward(judge, ["a"]).tolist() == [0.0]
    assert Rubric.from_dict(rubric.to_dict()) == rubric


def test_combine_rewards() -> None:
    env, rub = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.25])
    assert combine_rewards(env, rub, mode="add", coef=2.0).tolist() == [2.0, 0.5]
    assert combine_rewards(env, rub, mode="replace").tolist() == [0.5, 0.25]
    assert combine_rewards(env, rub, mode="mix", coef=0.25).tolist() == [0.875, 0.0625]
    with pytest.raises(ValueError, match="mode must be one of add, replace, mix"):
        combine_rewards(env, rub, mode="avg")
    with pytest.raises(ValueError, match="coef in"):
        combine_rewards(env, rub, mode="mix", coef=2)


def test_pools_sort_responses_by_reward() -> None:
    pools = ResponsePools(good_at=0.75, bad_at=0.25, size=2)
    assert [pools.observe("t", r, x) for r, x in (("a", 1.0), ("b", 0.5), ("c", 0.0))] == [
        "good",
        "neutral",
        "bad",
    ]
    pools.observe("t", "d", 0.9)
    pools.observe("t", "e", 0.8)
    assert pools.get("t", "good") == ["d", "e"]  # the two most recent
    assert pools.get("other", "good") == []


def test_separation_reweights_and_removes_items_that_do_not_separate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rubric = Rubric([RubricItem("sep?", 1.0), RubricItem("flat?", 1.0), RubricItem("weak?", 0.08)])
    table = {}
    for r, sep, flat, weak in (("g1", 0.9, 0.5, 0.5), ("g2", 0.7, 0.5, 0.5), ("b1", 0.1, 0.5, 0.5)):
        table.update({("sep?", r): sep, ("flat?", r): flat, ("weak?", r): weak})
    ev = RubricEvolver(rubric, "separation", log_path=tmp_path / "rubric.jsonl")
    applied = ev.evolve(["g1", "g2"], ["b1"], judge=FixedJudge(table), task="t0")
    # sep?: 0.8 − 0.1 = 0.7 ≥ 0.1 kept; flat?: 0 → weight 0.5; weak?: 0.04 < floor → removed
    assert [(c.kind, c.question, c.weight) for c in applied] == [
        ("reweight", "flat?", 0.5),
        ("remove", "weak?", 0.0),
    ]
    assert ev.rubric == Rubric([RubricItem("sep?", 1.0), RubricItem("flat?", 0.5)], version=1)
    log = RubricEvolver.read_log(tmp_path / "rubric.jsonl")
    assert [e["version"] for e in log] == [1] and log[0]["task"] == "t0"
    assert Rubric.from_dict(log[0]["rubric"]) == ev.rubric
    assert ev.evolve([], ["b1"], judge=FixedJudge(table)) == []  # no contrast: no change


def test_contrast_adds_a_question_about_a_word_only_good_responses_use() -> None:
    rubric = Rubric([RubricItem("Does the response mention thanks?", 1.0)])
    good = ["refund issued, thanks", "thanks: refund issued today", "your refund issued"]
    bad = ["go away", "no refund for you"]
    ch = PROPOSERS.get("contrast")(rubric, good, bad)
    # 'issued' is in 3/3 good and no bad; 'thanks' is asked already; 'refund' is in a bad one
    assert [(c.kind, c.question) for c in ch] == [("add", "Does the response mention issued?")]
    assert PROPOSERS.get("contrast")(rubric, good, ["refund issued"]) == []


def test_the_judge_proposer_keeps_only_a_short_question() -> None:
    judge = _judge()
    ch = PROPOSERS.get("judge")(Rubric([]), ["thanks"], ["go away"], judge=judge)
    assert all(c.kind == "add" and c.question.endswith("?") for c in ch)
    ev = RubricEvolver(Rubric([]), "judge", max_items=0)
    assert ev.evolve(["thanks"], ["go away"], judge=judge) == []  # the cap holds


# ------------------------------------------------------------------ fitting a judge
def test_verdict_margins_and_loss_by_hand() -> None:
    # yes = ids {0, 1}, no = id 2: d = log(e^0 + e^ln3) − 0 = log 4; second row d = −2
    logits = torch.tensor([[0.0, math.log(3.0), 0.0, 7.0], [1.0, -5.0, 3.0, 0.0]])
    d = verdict_margins(logits, [0, 1], [2])
    lse = math.log(math.exp(1.0) + math.exp(-5.0))
    assert d.tolist() == pytest.approx([math.log(4.0), lse - 3.0], abs=1e-6)
    # BCE: label 1 on p = σ(log 4) = 0.8 → −log 0.8; soft label 0.25 on p = σ(d2)
    p2 = 1 / (1 + math.exp(-(lse - 3.0)))
    want = (-math.log(0.8) - (0.25 * math.log(p2) + 0.75 * math.log(1 - p2))) / 2
    assert verdict_loss(d, torch.tensor([1.0, 0.25])).item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="margins"):
        verdict_loss(d, torch.tensor([1.0]))


def test_fit_judge_gradient_moves_the_verdict_toward_the_label() -> None:
    # one Adam step on one example lowers its loss and raises its "yes" score
    judge = _judge()
    ex = [JudgeExample("is it polite ?", "", "thanks", 1.0)]
    before = judge.scores(["is it polite ?"], ["thanks"]).item()
    losses = fit_judge(judge, ex, steps=3, lr=1e-2, batch_size=1)
    assert losses[2] < losses[0]
    assert judge.scores(["is it polite ?"], ["thanks"]).item() > before  # cache was cleared


def test_fit_judge_refuses_a_nan_step() -> None:
    judge = _judge()
    with torch.no_grad():
        judge.policy.model.get_output_embeddings().weight[0, 0] = float("nan")
    before = {k: v.clone() for k, v in judge.policy.model.state_dict().items()}
    ex = [JudgeExample("is it polite ?", "", "thanks", 1.0)]
    with pytest.raises(
        FloatingPointError, match=r"judge fitting step 1 of 3: the loss is .* gradient norm nan"
    ):
        fit_judge(judge, ex, steps=3, lr=1e-2, batch_size=1)
    for k, v in judge.policy.model.state_dict().items():
        assert torch.equal(before[k].nan_to_num(), v.nan_to_num()), k


def test_fit_judge_learns_a_verdict_the_untrained_judge_does_not_know() -> None:
    judge = _judge()
    q = "is it polite ?"
    polite = ["thanks", "thanks it is", "it is thanks", "thanks thanks"]
    rude = ["go away", "go away it is", "it is go away", "away go"]
    examples = [JudgeExample(q, "", r, 1.0) for r in polite]
    examples += [JudgeExample(q, "", r, 0.0) for r in rude]
    held_polite, held_rude = ["is it thanks"], ["away it is go"]

    def gap() -> float:
        s = judge.scores([q] * 2, held_polite + held_rude)
        return float(s[0] - s[1])

    assert abs(gap()) < 0.05  # the untrained judge does not tell them apart
    losses = fit_judge(judge, examples, steps=150, lr=3e-3, batch_size=8, seed=1)
    assert sum(losses[-10:]) / 10 < 0.1 < sum(losses[:10]) / 10
    assert gap() > 0.8  # held-out responses it never saw, scored through the same prompt


def test_fit_judge_rejects_bad_input() -> None:
    judge = _judge()
    ok = [JudgeExample("is it polite ?", "", "thanks", 1.0)]
    with pytest.raises(ValueError, match="labels must be in"):
        fit_judge(judge, [JudgeExample("q", "", "r", 2.0)], steps=1)
    with pytest.raises(ValueError, match="batch_size"):
        fit_judge(judge, ok, steps=1, batch_size=0)
    with pytest.raises(ValueError, match="needs examples"):
        fit_judge(judge, [], steps=1)
