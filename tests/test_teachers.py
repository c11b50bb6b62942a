"""Teachers: scoring equals the policy's own, privileged context, EMA, loading errors."""

from __future__ import annotations

import os
import time

import pytest
import torch

from credo.data import TokenBatch
from credo.envs.shop import ShopEnv
from credo.policy import HFPolicy, TinyModelConfig, create_tiny_policy
from credo.rollout.render import PLAIN_WORDS, PlainRenderer, Turn
from credo.teachers import (
    SANITISERS,
    ContextCache,
    EMATeacher,
    PolicyTeacher,
    SelfTeacher,
    TeacherRows,
    make_teacher,
    privileged_prompt_ids,
    privileged_prompts,
    resolve_policy_folder,
    sanitise,
    teacher_names,
)

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
WORDS = [*ShopEnv().vocabulary(), *PLAIN_WORDS]


def _policy(seed: int = 0, words: list[str] | None = None) -> HFPolicy:
    return create_tiny_policy(words or WORDS, SMALL, seed=seed)


def _rows(policy: HFPolicy) -> tuple[TeacherRows, list[list[int]], list[list[int]]]:
    """Three right-padded rows with different prompt and response lengths."""
    enc = lambda s: policy.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    eos = policy.tokenizer.eos_token_id
    prompts = [
        enc("history : none page : home goal : red shirt action :"),
        enc("page : results goal : blue action :"),
        enc("goal : a action :"),
    ]
    responses = [[*enc(a), eos] for a in ("search [ red shirt ]", "click [ 2 ]", "buy")]
    width = max(len(p) + len(r) for p, r in zip(prompts, responses)) + 2
    ids = torch.full((3, width), policy.pad_id, dtype=torch.long)
    attn = torch.zeros((3, width), dtype=torch.bool)
    resp = torch.zeros((3, width), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = True
        resp[i, len(p) : len(p) + len(r)] = True
    return TeacherRows(ids, attn, resp), prompts, responses


def _batch(rows: TeacherRows) -> TokenBatch:
    b, length = rows.input_ids.shape
    z = torch.zeros((b, length))
    ar = torch.arange(b)
    return TokenBatch(
        rows.input_ids, rows.attention_mask, rows.response_mask, z, z.clone(), ar, ar, ar * 0,
        ar, torch.ones(b, dtype=torch.bool),
    )  # fmt: skip


def test_teacher_logprobs_equal_policy_score() -> None:
    policy = _policy(seed=1)
    rows, _, _ = _rows(policy)
    want = policy.score(rows.input_ids, rows.attention_mask).logprobs
    for mb in (1, 2, 16):
        got = PolicyTeacher(policy, micro_batch=mb).score(TeacherRows.from_batch(_batch(rows)))
        m = rows.response_mask
        torch.testing.assert_close(got.logprobs[m], want[m], atol=2e-5, rtol=0)
        assert bool((got.logprobs[~m] == 0).all())


def test_topk_and_full_distributions() -> None:
    policy = _policy(seed=2)
    rows, _, _ = _rows(policy)
    teacher = PolicyTeacher(policy, micro_batch=2)
    full = teacher.score(rows, full=True)
    top = teacher.score(rows, topk=4)
    m = rows.response_mask
    v = policy.vocab_size
    assert full.topk_logprobs is not None and full.topk_ids is not None
    assert full.topk_logprobs.shape == (*m.shape, v)
    # every response position holds a normalised distribution over the whole vocabulary
    torch.testing.assert_close(full.topk_logprobs[m].logsumexp(-1), torch.zeros(int(m.sum())))
    assert bool((full.topk_ids[m] == torch.arange(v)).all())
    # the sampled token's log-prob is that distribution at the token id
    nxt = rows.input_ids[m]
    torch.testing.assert_close(
        full.topk_logprobs[m].gather(-1, nxt[:, None]).squeeze(-1), full.logprobs[m]
    )
    # the top-4 head is the 4 largest entries of the full distribution
    assert top.topk_logprobs is not None and top.topk_ids is not None
    best = full.topk_logprobs[m].topk(4, -1)
    torch.testing.assert_close(top.topk_logprobs[m], best.values, atol=1e-6, rtol=0)
    assert bool((top.topk_ids[m] == best.indices).all())
    extras = top.extras()
    assert set(extras) == {"teacher_logprobs", "teacher_topk_logprobs"}
    assert set(top.extras("ref")) == {"ref_logprobs", "ref_topk_logprobs"}


def test_privileged_context_changes_the_prompt_not_the_response() -> None:
    policy = _policy(seed=3)
    rows, prompts, responses = _rows(policy)
    renderer = PlainRenderer(policy.tokenizer)
    hist = [Turn("home", "search [ red shirt ]")]
    plain = renderer.prompt_ids("red shirt", hist, "results")
    hinted = privileged_prompt_ids(renderer, "red shirt", hist, "results", "click [ 2 ]")
    assert hinted != plain
    text = policy.tokenizer.decode(hinted)
    assert "goal : red shirt ; click [ 2 ] action :" in text
    obs = privileged_prompt_ids(
        renderer, "red shirt", hist, "results", "click [ 2 ]", placement="observation"
    )
    assert "page : results ; click [ 2 ] goal" in policy.tokenizer.decode(obs)
    assert privileged_prompt_ids(renderer, "red shirt", hist, "results", None) == plain
    with pytest.raises(ValueError, match="placement 'goal' is unknown"):
        privileged_prompt_ids(renderer, "x", [], "y", "z", placement="goal")

    teacher_prompts = privileged_prompts(
        renderer, [("red shirt", hist, "results")] * 3, ["click [ 2 ]", None, "buy"]
    )
    assert teacher_prompts[1] is None
    rows_t = TeacherRows(rows.input_ids, rows.attention_mask, rows.response_mask, teacher_prompts)
    got = SelfTeacher(policy).score(rows_t)
    m = rows.response_mask
    # row 0 and 2: the teacher's sequence is its own prompt + the *same* response ids
    for i in (0, 2):
        seq = torch.tensor([teacher_prompts[i] + responses[i]])
        ref = policy.score(seq, torch.ones_like(seq, dtype=torch.bool)).logprobs[0]
        torch.testing.assert_close(
            got.logprobs[i, m[i]], ref[-len(responses[i]) :], atol=2e-5, rtol=0
        )
    # row 1 kept the student's prompt
    own = policy.score(rows.input_ids, rows.attention_mask).logprobs
    torch.testing.assert_close(got.logprobs[1, m[1]], own[1, m[1]], atol=2e-5, rtol=0)
    assert not torch.allclose(got.logprobs[0, m[0]], own[0, m[0]], atol=1e-3)
    assert got.cost.tokens == sum(len(p) + len(r) for p, r in zip(
        [teacher_prompts[0], prompts[1], teacher_prompts[2]], responses
    ))  # fmt: skip
    assert got.cost.scored == int(m.sum()) and got.cost.rows == 3 and got.cost.seconds > 0


def test_scoring_builds_no_graph_and_restores_train_mode() -> None:
    policy = _policy(seed=4)
    policy.model.train()
    rows, _, _ = _rows(policy)
    teacher = SelfTeacher(policy)
    with torch.enable_grad():
        out = teacher.score(rows, topk=3)
    for t in (out.logprobs, out.topk_logprobs):
        assert t is not None and not t.requires_grad and t.grad_fn is None
    assert policy.model.training
    assert all(p.grad is None for p in policy.model.parameters())
    assert teacher.cost_total.calls == 1
    teacher.score(rows)
    assert teacher.cost_total.calls == 2 and teacher.cost_total.scored == 2 * int(
        rows.response_mask.sum()
    )
    assert set(teacher.cost_total.metrics()) == {
        "teacher/seconds", "teacher/tokens", "teacher/scored_tokens", "teacher/rows"
    }  # fmt: skip


def test_ema_update_math() -> None:
    student = _policy(seed=5)
    ema = EMATeacher(student, decay=0.9)
    assert all(not p.requires_grad for p in ema.policy.model.parameters())
    before = {n: p.detach().clone() for n, p in ema.policy.model.named_parameters()}
    with torch.no_grad():
        for p in student.model.parameters():
            p.add_(0.5)
    new = {n: p.detach().clone() for n, p in student.model.named_parameters()}
    ema.update(student)
    for n, p in ema.policy.model.named_parameters():
        torch.testing.assert_close(p, 0.9 * before[n] + 0.1 * new[n])
    ema.update(student, decay=1.0)  # frozen
    after_one = {n: p.detach().clone() for n, p in ema.policy.model.named_parameters()}
    for n, p in ema.policy.model.named_parameters():
        assert torch.equal(p, after_one[n])
    ema.update(student, decay=0.0)  # a copy: scores equal the student's
    rows, _, _ = _rows(student)
    torch.testing.assert_close(
        ema.score(rows).logprobs, PolicyTeacher(student).score(rows).logprobs, atol=1e-6, rtol=0
    )
    assert ema.updates == 3
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\], got 1.5"):
        ema.update(student, decay=1.5)


def test_loading_run_checkpoint_and_hf_folders(tmp_path) -> None:
    student = _policy(seed=6)
    teacher_policy = _policy(seed=7)
    run = tmp_path / "run"
    teacher_policy.save(run / "final_policy")
    step = tmp_path / "run2" / "checkpoints" / "step_3"
    teacher_policy.save(step / "policy")
    assert resolve_policy_folder(run) == run / "final_policy"
    assert resolve_policy_folder(step) == step / "policy"
    assert resolve_policy_folder(run / "final_policy") == run / "final_policy"
    rows, _, _ = _rows(student)
    want = PolicyTeacher(teacher_policy).score(rows, topk=2)
    for kind, path in (("run", run), ("run", step), ("hf", run / "final_policy")):
        t = make_teacher(kind, student, path=str(path), micro_batch=2)
        got = t.score(rows, topk=2)
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-6, rtol=0)
        assert got.topk_ids is not None and want.topk_ids is not None
        assert torch.equal(got.topk_ids, want.topk_ids)
    assert sorted(teacher_names()) == ["ema", "frozen", "hf", "run", "self"]
    assert make_teacher("ema", student, ema_decay=0.5).decay == 0.5  # type: ignore[attr-defined]


def test_bad_teacher_input_gives_one_line_errors(tmp_path) -> None:
    student = _policy(seed=8)

    def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
        msg = str(exc.value)
        assert "\n" not in msg
        return msg

    with pytest.raises(ValueError) as e:
        make_teacher("run", student, path=str(tmp_path / "nowhere"))
    assert "does not exist" in one_line(e)
    with pytest.raises(ValueError, match=r"needs teacher\.path"):
        make_teacher("run", student)
    # a run that has not finished: checkpoints but no final_policy
    run = tmp_path / "running"
    _policy(seed=9).save(run / "checkpoints" / "step_2" / "policy")
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError) as e:
        make_teacher("run", student, path=str(run))
    msg = one_line(e)
    assert "no final_policy/" in msg and "still training" in msg and "step_2" in msg
    old = time.time() - 3600
    os.utime(run / "metrics.jsonl", (old, old))
    with pytest.raises(ValueError, match="still training or interrupted; pass a checkpoint"):
        make_teacher("run", student, path=str(run))
    # another vocabulary size
    small = create_tiny_policy(WORDS[:-5], SMALL, seed=0)
    small.save(tmp_path / "small")
    with pytest.raises(ValueError) as e:
        make_teacher("hf", student, path=str(tmp_path / "small"))
    assert (
        f"vocabulary size {small.vocab_size} but the student has {student.vocab_size}"
        in one_line(e)
    )
    # same size, another tokenizer (one word replaced)
    other_words = sorted(set(w.lower() for w in WORDS))
    other_words[0] = "zzzzunseen"
    other = create_tiny_policy(other_words, SMALL, seed=0)
    assert other.vocab_size == student.vocab_size
    other.save(tmp_path / "other")
    with pytest.raises(ValueError) as e:
        make_teacher("hf", student, path=str(tmp_path / "other"))
    assert "uses another tokenizer than the student" in one_line(e)
    # a folder without a model; hf kind on a run folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no model"):
        make_teacher("run", student, path=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"use teacher\.kind=run"):
        make_teacher("hf", student, path=str(run))
    with pytest.raises(KeyError, match="Did you mean 'ema'"):
        make_teacher("emma", student)
    with pytest.raises(ValueError, match="has no parameter"):
        make_teacher("self", student, path="x")
    # scoring input errors
    rows, _, _ = _rows(student)
    with pytest.raises(ValueError, match="2 teacher prompts for 3 rows"):
        TeacherRows(rows.input_ids, rows.attention_mask, rows.response_mask, [[1], [2]])
    with pytest.raises(ValueError, match="empty teacher prompt"):
        PolicyTeacher(student).score(
            TeacherRows(rows.input_ids, rows.attention_mask, rows.response_mask, [[], None, None])
        )
    gap = rows.response_mask.clone()
    gap[0, int(gap[0].nonzero()[1])] = False
    with pytest.raises(ValueError, match="not contiguous"):
        PolicyTeacher(student).score(TeacherRows(rows.input_ids, rows.attention_mask, gap))


def test_sanitisers_and_context_cache(tmp_path) -> None:
    actions = ["search[red shirt]", "click[2]", "choose[m]", "buy"]
    assert sanitise("none", actions) == "search[red shirt] ; click[2] ; choose[m] ; buy"
    assert sanitise("drop_final", actions) == "search[red shirt] ; click[2] ; choose[m]"
    assert sanitise("drop_final", actions, n=3) == "search[red shirt]"
    assert sanitise("shop", [*actions, "back", "search [ blue hat ]"]) == (
        "search[red shirt] ; search [ blue hat ]"
    )
    assert sorted(SANITISERS.names()) == ["drop_final", "none", "shop"]
    with pytest.raises(ValueError, match="has no parameter"):
        sanitise("shop", actions, n=1)

    cache = ContextCache(max_per_task=2)
    for c in ("a", "b", "a", "c"):
        cache.add("shop/train/1", c)
    assert cache.get("shop/train/1") == ["a", "c"]  # 'a' refreshed, 'b' oldest dropped
    assert cache.get("shop/train/2") == [] and len(cache) == 2
    cache.save(tmp_path / "cache.json")
    assert not (tmp_path / "cache.json.tmp").exists()
    again = ContextCache.load(tmp_path / "cache.json")
    assert again.get("shop/train/1") == ["a", "c"] and again.max_per_task == 2
    with pytest.raises(ValueError, match="cannot read it"):
        ContextCache.load(tmp_path / "missing.json")


def test_env_privileged_context_reaches_the_teacher_prompt() -> None:
    from credo.envs.base import Task, privileged_context

    env = ShopEnv()
    obs = env.reset(Task.make("train", 3), 0)
    key = env.state_key()
    hint = privileged_context(env, "oracle")
    assert hint == env.oracle_action() and hint.startswith("search[")
    assert env.state_key() == key  # asking changes nothing
    assert privileged_context(env, "feedback") is None
    assert privileged_context(object(), "oracle") is None
    policy = _policy()
    ids = privileged_prompt_ids(PlainRenderer(policy.tokenizer), env.instruction(), [], obs, hint)
    assert policy.tokenizer.unk_token_id not in ids  # every word of the hint is known
    done = env.step(hint).done
    while not done:  # invalid or useless actions until the turn limit ends the episode
        done = env.step("back").done
    assert privileged_context(env, "oracle") is None


def _exact_kl(student: HFPolicy, teacher: PolicyTeacher, rows: TeacherRows) -> float:
    """Mean exact KL(student ‖ teacher) over the response tokens (full distributions)."""
    s = PolicyTeacher(student).score(rows, full=True).topk_logprobs
    t = teacher.score(rows, full=True).topk_logprobs
    assert s is not None and t is not None
    m = rows.response_mask
    return float((s[m].exp() * (s[m] - t[m])).sum(-1).mean())


@pytest.mark.parametrize(("topk", "full"), [(0, True), (8, False)])
def test_opd_pieces_move_the_student_toward_the_teacher(topk: int, full: bool) -> None:
    """Teacher scores → token extras → the student's gather → ``opd`` loss → a step."""
    from credo.objectives import LossInputs, aggregation_weights, get_loss
    from credo.teachers import attach_teacher_scores, teacher_extra_ids, teacher_loss_extras

    torch.manual_seed(0)
    student, teacher = _policy(seed=10), PolicyTeacher(_policy(seed=11))
    rows, _, _ = _rows(student)
    batch = _batch(rows)
    attach_teacher_scores(batch, teacher.score(rows, topk=topk, full=full))
    before = _exact_kl(student, teacher, rows)
    opt = torch.optim.Adam(student.model.parameters(), lr=1e-2)
    estimates = []
    for _ in range(25):
        sub = batch.index(torch.arange(len(batch))).trim()
        ids = teacher_extra_ids(sub.token_extras)
        sc = student.score(sub.input_ids, sub.attention_mask, extra_ids=ids)
        mask = sub.response_mask
        w = aggregation_weights(mask, "token-mean", episode=sub.episode, turn=sub.turn)
        inputs = LossInputs(
            sc.logprobs, sc.logprobs.detach(), torch.zeros_like(sc.logprobs), mask, w,
            sub.episode, sub.turn, extras=teacher_loss_extras(sub.token_extras, sc.extra_logprobs),
        )  # fmt: skip
        loss, metrics = get_loss("opd")(inputs)
        estimates.append(float(metrics["distill/reverse_kl"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = _exact_kl(student, teacher, rows)
    # the optimised estimate falls; with the full distribution it *is* the exact KL
    assert estimates[-1] < 0.3 * estimates[0], estimates
    if full:
        assert estimates[0] == pytest.approx(before, rel=1e-4)
        assert after < 0.1 * before, (before, after)
    else:
        # a top-K head matches the head and the tail's total mass only, not the tail's
        # shape: with a flat random teacher the exact KL barely moves, but never rises
        assert after <= before, (before, after)


def test_anchor_sets_from_the_candidates() -> None:
    from credo.objectives import candidate_contexts
    from credo.teachers import anchor_sets

    group = torch.tensor([0, 0, 0, 1, 2])
    success = torch.tensor([True, False, True, False, False])
    own, ext = candidate_contexts(group, success, torch.tensor([3, 3, 3]).sub(2))
    actions = [
        ["search[red shirt]", "click[1]", "buy"], ["back"], ["search[red top]", "buy"],
        ["search[hat]"], ["buy"],
    ]  # fmt: skip
    external = ["search[blue hat]", "search[cap]", ""]
    one = anchor_sets(own, ext, actions, external, sanitiser="shop")
    # sample 1 reads the first verified sibling (sanitised: its search only); 0 and 2
    # read each other; sample 3 the first external context of its group; 4 none
    assert one == [["search[red top]"], ["search[red shirt]"], ["search[red shirt]"],
                   ["search[blue hat]"], []]  # fmt: skip
    every = anchor_sets(own, ext, actions, external, limit=4, sanitiser="shop")
    # every candidate, in order; the empty external context gives nothing
    assert every[1] == ["search[red shirt]", "search[red top]"]
    assert every[3] == ["search[blue hat]", "search[cap]"] and every[4] == []
    assert anchor_sets(own, ext, actions, external, limit=1)[1] == [
        "search[red shirt] ; click[1] ; buy"
    ]
    with pytest.raises(ValueError, match="3 external candidates for 2 external contexts"):
        anchor_sets(own, ext, actions, external[:2])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        anchor_sets(own, ext, actions, external, limit=0)


def test_renyi_pieces_with_a_self_teacher_and_a_frozen_reference() -> None:
    """Self-teacher with a hint (full distribution) + frozen reference on the same ids →
    ``renyi_opsd``: the divergence to the fixed target q_α falls."""
    from credo.objectives import LossInputs, aggregation_weights, get_loss
    from credo.teachers import attach_teacher_scores, teacher_extra_ids, teacher_loss_extras

    torch.manual_seed(0)
    student = _policy(seed=12)
    # the reference is usually the frozen start of the student; another model here, so
    # that the target q_α starts far from the student
    reference = PolicyTeacher(_policy(seed=13))
    rows, _, _ = _rows(student)
    renderer = PlainRenderer(student.tokenizer)
    hint = privileged_prompts(renderer, [("red shirt", [], "home")] * 3, ["click [ 2 ]"] * 3)
    batch = _batch(rows)
    teacher_rows = TeacherRows(rows.input_ids, rows.attention_mask, rows.response_mask, hint)
    attach_teacher_scores(batch, SelfTeacher(student).score(teacher_rows, full=True))
    attach_teacher_scores(batch, reference.score(rows, full=True), prefix="ref", head_only=True)
    assert set(batch.token_extras) == {
        "teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs", "ref_topk_logprobs"
    }  # fmt: skip
    opt = torch.optim.Adam(student.model.parameters(), lr=1e-2)
    values = []
    for _ in range(15):
        sc = student.score(
            batch.input_ids, batch.attention_mask, extra_ids=teacher_extra_ids(batch.token_extras)
        )
        mask = batch.response_mask
        w = aggregation_weights(mask, "token-mean", episode=batch.episode, turn=batch.turn)
        extras = teacher_loss_extras(batch.token_extras, sc.extra_logprobs)
        inputs = LossInputs(
            sc.logprobs, sc.logprobs.detach(), torch.zeros_like(sc.logprobs), mask, w,
            batch.episode, batch.turn, extras=extras,
        )  # fmt: skip
        loss, metrics = get_loss("renyi_opsd")(inputs, alpha=0.5, rho=2.0)
        values.append(float(metrics["distill/renyi"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert values[-1] < 0.5 * values[0], values


def test_a_frozen_teacher_keeps_the_warm_starts_reading() -> None:
    """``teacher.kind: frozen`` scores with the run's frozen reference: after the student
    moves, its scores are the warm start's, where the self-teacher's moved with it."""
    student = _policy(seed=5)
    reference = student.frozen_copy()
    rows, _, _ = _rows(student)
    renderer = PlainRenderer(student.tokenizer)
    hint = privileged_prompts(renderer, [("red shirt", [], "home")] * 3, ["click [ 2 ]"] * 3)
    teacher_rows = TeacherRows(rows.input_ids, rows.attention_mask, rows.response_mask, hint)
    frozen, own = make_teacher("frozen", reference), make_teacher("self", student)
    before = frozen.score(teacher_rows).logprobs
    torch.testing.assert_close(before, own.score(teacher_rows).logprobs)  # equal at the start
    with torch.no_grad():  # the student takes a step
        for p in student.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m = rows.response_mask
    assert bool((frozen.score(teacher_rows).logprobs[m] == before[m]).all())
    assert float((own.score(teacher_rows).logprobs[m] - before[m]).abs().max()) > 1e-3
    assert "frozen" in teacher_names()
