"""Teachers in ``credo train``: the ``teacher`` section's checks, the four recipes end to
end (the teacher signal moves the student toward the teacher), exact resume with an EMA
teacher, and bad teacher input stopping before any compute."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from credo.cli import main as cli_main
from credo.envs.base import Task
from credo.objectives import mixed_target
from credo.policy import create_tiny_policy
from credo.policy.tiny import TinyModelConfig
from credo.teachers import TeacherRows, score_with_policy
from credo.teachers.teaching import row_histories
from credo.train.config import Config, ConfigError, load_config
from credo.train.iteration import run_iteration
from credo.train.loop import train
from credo.train.parts.base import run_needs
from credo.train.parts.teacher import TeacherPart
from credo.train.progress import Progress
from credo.train.run import Run, build_run, env_vocabulary
from credo.train.state import TrainState
from credo.train.warmstart import start_policy
from small_run import SMALL as SMALL_RUN

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = [*SMALL_RUN, "train.checkpoint_every=2"]

#: End-to-end cases: (recipe, overrides besides SMALL). GuessEnv's answer is its final
#: guess, so MT-SDPO's anchors drop it; MT-SDPO runs on the teacher's signal alone (β = 1,
#: no GRPO term) so that the test measures what the teacher does. The two reward routes
#: of on-policy distillation run with the PPO loss, where the RL reward pulls the student
#: away from the teacher: the test compares them with the same run whose teacher reward is
#: negligible (REWARD_ROUTES). The row reward, whose KL competes with the RL reward in
#: GRPO's group normalisation, runs 8 iterations (in 4 its distance rose, 0.18 -> 0.24,
#: against 1.84 without the teacher).
CASES = {
    "opd": ("opd", []),
    "opd-row_reward": ("opd", ["objective.loss=ppo", "objective.params={}", "teacher.route=row_reward", "teacher.full=false", "train.iterations=8"]),
    "opd-token_advantage": ("opd", ["objective.loss=ppo", "objective.params={}", "teacher.route=token_advantage", "teacher.full=false"]),
    # the recipe's clip and mean bound a step's shift to [-α, α]; α = 10 lets it outweigh
    # the RL reward in 4 iterations, so that the test sees the teacher's signal. Every
    # successful row is rewarded its shift (accept: success): the recipe's accept: agree
    # keeps only the directions the verifier supports, which is not "toward the teacher"
    # (here 0.063 -> 0.087); its rows and teachers are checked by hand above
    "oprd": ("oprd", ["teacher.oprd.alpha=10", "teacher.oprd.accept=success"]),
    "mt_sdpo": ("mt_sdpo", ["teacher.sanitiser=drop_final", "teacher.context_cache=0", "objective.params={beta: 1.0, rl_coef: 0.0}"]),
    # the plain warm start (distance 0.0076 -> 0.0023 in 4 iterations). With the recipe's
    # privileged one (sft.privileged=oracle) GuessEnv's moved only 0.0062 -> 0.0057, not
    # the fifth this test asks; the golden test runs the recipe as it is
    "renyi_opsd": ("renyi_opsd", ["sft.privileged=null"]),
    # the frozen warm start reading the text: only the student moves toward it (0.0076 ->
    # 0.0067 in 4 iterations, 0.0036 in 8; the self-teacher above also moves to the student)
    "renyi_opsd-frozen": ("renyi_opsd", ["sft.privileged=null", "teacher.kind=frozen", "train.iterations=8"]),
}  # fmt: skip
NEEDS_PATH = ("opd", "oprd")
#: The reward routes and the coefficient of their control run (the same run, the teacher's
#: reward scaled to nothing): 4 mini-batch steps per batch of GRPO on GuessEnv take the
#: control's distance from 0.18 to 1.7-1.9 in 4 to 8 iterations.
REWARD_ROUTES = ("row_reward", "token_advantage")
NO_TEACHER = "teacher.reward_coef=1e-9"


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GRPO run on GuessEnv from another seed's warm start, with a KL to its reference
    (so it keeps ``reference/``, OPRD's base)."""
    root = tmp_path_factory.mktemp("teacher")
    cfg = load_config(
        "grpo",
        [
            *SMALL,
            "train.iterations=3",
            "train.seed=1",
            "objective.kl_coef=0.05",
            f"train.runs_dir={root}",
            "train.name=teacher",
        ],
    )
    res = train(cfg, quiet=True)
    assert (res.run_dir / "final_policy").is_dir() and (res.run_dir / "reference").is_dir()
    return res.run_dir


def _overrides(case: str, teacher: Path, tmp: Path) -> list[str]:
    recipe, extra = CASES[case]
    # the routes' mechanism, as calibrated before the trust region became the default
    # (2026-12-06): with optim.max_kl=0.2 row_reward's run went 0.19 -> 0.16 and its
    # control (RL alone) ended at 0.36, where it reaches 1.7-1.9 without the bound
    unguarded = "optim.max_kl=null"
    out = [*SMALL, unguarded, *extra, f"train.runs_dir={tmp}", f"train.name={case}"]
    return out + ([f"teacher.path={teacher}"] if recipe in NEEDS_PATH else [])


# ------------------------------------------------------------------ config checks
def test_teacher_section_checks() -> None:
    def err(recipe: str, *extra: str) -> str:
        with pytest.raises(ConfigError) as e:
            load_config(recipe, list(extra))
        msg = str(e.value)
        assert "\n" not in msg
        return msg

    assert "distils from a teacher" in err("grpo", "objective.loss=opd")
    assert "teacher.route=loss" in err("opd", "teacher.path=/x", "teacher.route=row_reward")
    assert "needs a distillation loss" in err("grpo", "teacher.kind=ema")
    assert "teacher.topk=K" in err("opd", "teacher.path=/x", "teacher.full=false")
    assert "teacher.privileged in anchor" in err("mt_sdpo", "teacher.privileged=oracle")
    assert "needs teacher.privileged" in err("renyi_opsd", "teacher.privileged=null")
    assert "needs teacher.privileged" in err(
        "renyi_opsd", "teacher.kind=frozen", "teacher.privileged=null"
    )
    assert "drop teacher.path" in err("renyi_opsd", "teacher.kind=frozen", "teacher.path=/x")
    frozen = load_config("opd", ["teacher.kind=frozen", "teacher.privileged=oracle"])
    assert "reference" in run_needs(frozen) and "reference" not in run_needs(load_config("opd"))
    assert "exclude each other" in err("renyi_opsd", "teacher.topk=4")
    assert "Did you mean 'ema'" in err("grpo", "teacher.kind=emma", "teacher.route=row_reward")
    assert "does not exist" in err("opd", "teacher.path=/nowhere/at/all")
    assert "teacher.kind is null" in err("grpo", "teacher.path=/x")
    assert "teacher.oprd.accept must be one of" in err(
        "oprd", "teacher.path=/x", "teacher.oprd.accept=maybe"
    )
    assert "teacher.oprd.combine must be one of mean, verifier, likelihood" in err(
        "oprd", "teacher.path=/x", "teacher.oprd.combine=vote"
    )
    assert "teacher.oprd.episode_reduce must be one of sum, mean" in err(
        "oprd", "teacher.path=/x", "teacher.oprd.episode_reduce=max"
    )
    assert "set teacher.route=oprd" in err(
        "opd", "teacher.path=/x", "teacher.oprd.teachers=[{path: /y}]"
    )
    assert "teacher.aggregate must be one of one, all" in err("mt_sdpo", "teacher.aggregate=some")
    assert "needs teacher.privileged=anchor and teacher.full=true" in err(
        "mt_sdpo", "teacher.aggregate=all", "teacher.full=false", "teacher.topk=8"
    )
    assert "teacher.pool gives MT-SDPO anchors" in err("renyi_opsd", "teacher.pool=[/x]")
    assert "teacher.pool[0]" in err("mt_sdpo", "teacher.pool=[/nowhere/at/all]")
    assert "teacher.pool: expected a list" in err("mt_sdpo", "teacher.pool=/x")
    assert "teacher.pool must be a list of run" in err("mt_sdpo", "teacher.pool=['']")
    assert "teacher.max_contexts must be" in err("mt_sdpo", "teacher.max_contexts=0")
    assert "sft.privileged_steps needs sft.privileged" in err("grpo", "sft.privileged_steps=10")
    assert "sft.privileged_steps must be an integer" in err("renyi_opsd", "sft.privileged_steps=-1")
    # the estimators that read only the sampled token need no head
    cfg = load_config(
        "renyi_opsd",
        ["objective.loss=opd", "objective.params={estimator: k1}", "teacher.full=false"],
    )
    assert cfg.teacher.rollout_texts() == ("instruction", "oracle")
    assert load_config("grpo").teacher.rollout_texts() == ()
    # a whole distribution is for small vocabularies (checked against the student)
    from types import SimpleNamespace

    from credo.teachers.teaching import check_teacher_inputs

    with pytest.raises(ValueError, match=r"set teacher\.full=false teacher\.topk=K"):
        check_teacher_inputs(load_config("renyi_opsd").teacher, SimpleNamespace(vocab_size=49152))  # type: ignore[arg-type]
    check_teacher_inputs(load_config("renyi_opsd").teacher, SimpleNamespace(vocab_size=100))  # type: ignore[arg-type]


def test_bad_teacher_folders_stop_before_the_run_folder(tmp_path: Path) -> None:
    """A run still training, another vocabulary size, another tokenizer: one line, no
    run folder, no compute."""
    # still training: checkpoints and fresh metrics, no final_policy
    running = tmp_path / "running"
    (running / "checkpoints" / "step_2").mkdir(parents=True)
    (running / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="still training") as e:
        load_config("opd", [*SMALL, f"teacher.path={running}"])
    assert "\n" not in str(e.value)
    # the student's tokenizer: the built-in model on GuessEnv's words
    cfg = load_config("grpo", SMALL)
    run = build_run(cfg)
    words = env_vocabulary(run.make_env(), run.make_env)
    small = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    create_tiny_policy(words[:-3], small).save(tmp_path / "fewer")
    other = list(words)
    other[0] = "zzzunseen"
    create_tiny_policy(other, small).save(tmp_path / "other")
    runs = tmp_path / "runs"
    for folder, expected in (("fewer", "vocabulary size"), ("other", "another tokenizer")):
        cfg = load_config(
            "opd", [*SMALL, f"teacher.path={tmp_path / folder}", f"train.runs_dir={runs}"]
        )
        with pytest.raises(ValueError, match=expected) as e:
            train(cfg, quiet=True)
        assert "\n" not in str(e.value)
        assert not runs.exists()


def test_cli_reports_a_missing_teacher_path_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recipes leave ``teacher.path`` to the command line (``credo recipes`` loads them);
    a run without it stops before its folder exists."""
    assert load_config("opd").teacher.path is None
    rc = cli_main(["train", "--recipe", "opd", f"train.runs_dir={tmp_path}", *SMALL])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "needs teacher.path" in err, err
    assert not any(tmp_path.iterdir())


# -------------------------------------------------------------------- end to end
def _fixed_rollouts(run: Run, state: TrainState):  # type: ignore[no-untyped-def]
    """The warm start's rollouts on fixed tasks: the rows every measurement uses."""
    tasks = [Task.make("train", 90_000 + i) for i in range(4)]
    gen = torch.Generator().manual_seed(7)
    return run.rollouts(state.policy, tasks, generator=gen, choice_seed=0)


def _distance(run: Run, state: TrainState, rollout, alpha: float) -> float:  # type: ignore[no-untyped-def]
    """How far the student is from its teacher on the fixed rows: the exact mean
    KL(π_θ ‖ target) per response token (target: the teacher in its own context, Rényi:
    q_α), or for OPRD minus the student's expected teacher shift E_π_θ[Δ] (Δ clamped as
    the run's ``teacher.oprd.clip`` clamps it: the shift the reward pays)."""
    part = state.parts.get("teacher")
    assert isinstance(part, TeacherPart)
    teaching = part.teaching
    forest = rollout.forest
    tb = forest.to_batch(torch.zeros(forest.num_rows), pad_id=state.policy.pad_id)
    rows = TeacherRows.from_batch(tb)
    s = score_with_policy(state.policy, rows, full=True).topk_logprobs
    assert s is not None
    if teaching.cfg.route == "oprd":
        assert teaching.base is not None
        rl = teaching.teacher.score(rows, full=True).topk_logprobs
        base = teaching.base.score(rows, full=True).topk_logprobs
        assert rl is not None and base is not None
        m = tb.response_mask
        delta = rl[m] - base[m]
        if teaching.cfg.oprd.clip is not None:
            delta = delta.clamp(-teaching.cfg.oprd.clip, teaching.cfg.oprd.clip)
        return -float((s[m].exp() * delta).sum(-1).mean())
    if teaching.cfg.route != "loss":  # reward routes: the teacher's whole distribution
        t = teaching.teacher.score(rows, full=True).topk_logprobs
        assert t is not None
        m = tb.response_mask
        return float((s[m].exp() * (s[m] - t[m])).sum(-1).mean())
    lesson = teaching.lesson(run.renderer, forest, rollout.episodes, state.policy.pad_id)
    t = lesson.scores.topk_logprobs
    assert t is not None and t.shape == s.shape
    if teaching.reference is not None:  # Rényi OPSD: the target q_α
        assert lesson.ref_head is not None
        t = mixed_target(t, lesson.ref_head, alpha)
    m = tb.response_mask & lesson.row_mask[:, None]
    assert bool(m.any())
    return float((s[m].exp() * (s[m] - t[m])).sum(-1).mean())


def _train_and_measure(
    case: str, teacher_run: Path, tmp_path: Path, *extra: str
) -> tuple[Config, float, float, list[dict]]:
    """Train ``case`` (4 iterations unless it says otherwise) from its warm start; its
    config, the distance to the teacher on fixed rows before and after, and the records."""
    cfg = load_config(
        CASES[case][0], ["train.iterations=4", *_overrides(case, teacher_run, tmp_path), *extra]
    )
    run = build_run(cfg)
    run_dir = tmp_path / (f"{case}-control" if extra else case)
    run_dir.mkdir()
    policy, warm = start_policy(run, run_dir, resuming=False, progress=Progress(enabled=False))
    assert warm is not None and 0 < warm.success_rate < 1
    state = TrainState.start(run, run_dir, policy, None)
    alpha = float(cfg.objective.params.get("alpha", 0.5))
    fixed = _fixed_rollouts(run, state)
    if cfg.teacher.privileged is not None:  # the teacher's prompts re-render the student's
        forest = fixed.forest
        hist = row_histories(forest)
        for i in range(forest.num_rows):
            want = forest.prompt_ids[i].tolist()
            got = run.renderer.prompt_ids(
                forest.texts["instruction"][i], hist[i], forest.observations[i]
            )
            assert got == want
    before = _distance(run, state, fixed, alpha)
    records = [run_iteration(run, state, it) for it in range(cfg.train.iterations)]
    return cfg, before, _distance(run, state, fixed, alpha), records


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_recipe_moves_the_student_toward_its_teacher(
    case: str, teacher_run: Path, tmp_path: Path
) -> None:
    cfg, before, after, records = _train_and_measure(case, teacher_run, tmp_path)
    print(f"{case}: distance {before:.4f} -> {after:.4f}")
    if cfg.teacher.route == "oprd":  # minus the expected shift: any sign
        assert after < before - 0.01, (before, after)
    elif cfg.teacher.route in REWARD_ROUTES:  # closer, and far closer than RL alone
        _, _, control, _ = _train_and_measure(case, teacher_run, tmp_path, NO_TEACHER)
        print(f"{case}: without the teacher's reward {before:.4f} -> {control:.4f}")
        assert after < before and after < 0.25 * control, (before, after, control)
    else:  # a KL
        assert after < 0.8 * before, (before, after)
    for r in records:  # the scoring cost is reported every iteration
        assert r["teacher/seconds"] > 0 and r["teacher/tokens"] > r["teacher/scored_tokens"] > 0
        assert 0 < r["teacher/coverage"] <= 1
    if cfg.teacher.route == "loss":
        assert all(r["distill/coverage"] > 0 for r in records)
    else:
        assert any(r["teacher/reward_mean"] != 0 for r in records)


def _stable(records: list[dict]) -> list[dict]:
    skip = ("time/", "perf/", "teacher/seconds", "teacher/pool_seconds")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in records]


@pytest.mark.slow
def test_resume_with_an_ema_teacher_is_exact(tmp_path: Path, teacher_run: Path) -> None:
    """MT-SDPO keeps an EMA teacher, a context cache and its pool's eligible sets: a run
    stopped after 2 iterations and resumed matches the run that never stopped (the pool:
    one member, a GRPO run; every anchor of an episode read and mixed)."""
    extra = [
        "teacher.sanitiser=drop_final",
        f"teacher.pool=[{teacher_run}]",
        "teacher.aggregate=all",
    ]

    def cfg(name: str, iterations: int):  # type: ignore[no-untyped-def]
        return load_config(
            "mt_sdpo",
            [*SMALL, *extra, f"train.runs_dir={tmp_path}", f"train.name={name}",
             f"train.iterations={iterations}"],
        )  # fmt: skip

    full = train(cfg("full", 3), quiet=True)
    part = train(cfg("part", 2), quiet=True)
    ckpt = part.run_dir / "checkpoints" / "step_2"
    assert (ckpt / "teacher_ema" / "model.safetensors").exists()
    saved = json.loads((ckpt / "state.json").read_text())["teacher_state"]
    assert saved["ema_updates"] == 2 and saved["context_cache"]["tasks"]
    assert saved["pool"]["members"] == ["teacher"] and saved["pool"]["results"]
    resumed = train(cfg("part", 3), resume=part.run_dir, quiet=True)
    assert _stable(resumed.metrics) == _stable(full.metrics)
    assert any(r["teacher/cached_contexts"] > 0 for r in full.metrics)
    assert full.metrics[-1]["teacher/pool_tasks"] > 0
    assert any(r["teacher/contexts"] > 1 for r in full.metrics)  # several anchors mixed
    assert resumed.final is not None and full.final is not None
    assert resumed.final.success_rate == full.final.success_rate


# ------------------------------------------------------- routes on a hand-made forest
_TWO_BY_TWO = ((["guess[4]", "guess[2]"], True), (["guess[5]", "guess[7]"], False))


def _hand_forest(student, episodes=_TWO_BY_TWO):  # type: ignore[no-untyped-def]
    """Episodes of group 0 (default: two of two steps, the first succeeds), rendered as
    the sampler renders them, with the goal and an oracle hint recorded per step."""
    from credo.data import ForestBuilder, Step
    from credo.rollout.render import PlainRenderer, Turn

    renderer = PlainRenderer(student.tokenizer)
    builder = ForestBuilder()
    gen = torch.Generator().manual_seed(0)
    for e, (actions, success) in enumerate(episodes):
        parent, history = -1, []
        last = len(actions) - 1
        for t, action in enumerate(actions):
            obs = f"the secret is from 1 to {8 - t}"
            prompt = renderer.prompt_ids("guess the secret number", history, obs)
            response = renderer.response_ids(action)
            step = Step(
                obs, action, reward=float(success and t == last), terminal=t == last,
                prompt_ids=prompt, response_ids=response,
                logprobs=(-torch.rand(len(response), generator=gen) - 0.1).tolist(),
                texts={"instruction": "guess the secret number", "oracle": "" if e else "guess[3]"},
            )  # fmt: skip
            parent = builder.add(0, parent, step)
            history.append(Turn(obs, action))
        builder.mark_success(parent, success)
    return builder.build(), renderer


def _guess_policy(seed: int):  # type: ignore[no-untyped-def]
    from examples.custom_env import GuessEnv

    from credo.rollout.render import PLAIN_WORDS

    small = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    return create_tiny_policy([*GuessEnv().vocabulary(), *PLAIN_WORDS], small, seed=seed)


def test_forest_texts_follow_select_and_concat() -> None:
    from credo.data import RolloutForest

    forest, _ = _hand_forest(_guess_policy(0))
    assert forest.texts["oracle"] == ["guess[3]", "guess[3]", "", ""]
    sub = forest.select(torch.tensor([2, 3]))
    assert sub.texts["oracle"] == ["", ""]
    both = RolloutForest.concat([sub, forest])
    assert both.texts["instruction"] == ["guess the secret number"] * 6
    assert both.step(2).texts == {"instruction": "guess the secret number", "oracle": "guess[3]"}


def test_reward_and_advantage_routes_by_hand() -> None:
    from credo.teachers import PolicyTeacher
    from credo.teachers.teaching import Teaching
    from credo.train.config import OPRDConfig, TeacherConfig

    student, teacher, base = _guess_policy(0), PolicyTeacher(_guess_policy(1)), _guess_policy(2)
    forest, renderer = _hand_forest(student)
    tb = forest.to_batch(torch.zeros(4), pad_id=student.pad_id)
    rows = TeacherRows.from_batch(tb)
    t_lp = teacher.score(rows).logprobs
    m = tb.response_mask
    k1 = torch.where(m, tb.old_logprobs - t_lp, 0.0)  # [B, L]
    pad = student.pad_id

    cfg = TeacherConfig(kind="run", route="row_reward", reward_coef=0.5)
    lesson = Teaching(cfg, teacher).lesson(renderer, forest, [], pad)
    torch.testing.assert_close(lesson.row_reward, -0.5 * k1.sum(1))
    torch.testing.assert_close(lesson.reward(forest).reward, forest.reward - 0.5 * k1.sum(1))
    assert lesson.metrics["teacher/sampled_kl"] == pytest.approx(float(k1.sum() / m.sum()))
    assert lesson.metrics["teacher/tokens"] == float(tb.attention_mask.sum())

    cfg = TeacherConfig(kind="run", route="token_advantage", reward_coef=2.0, reward_clip=0.5)
    lesson = Teaching(cfg, teacher).lesson(renderer, forest, [], pad)
    batch = forest.to_batch(torch.tensor([1.0, 1.0, -1.0, -1.0]), pad_id=pad)
    before = batch.advantages.clone()
    lesson.attach(batch)
    want = torch.where(m, (-2.0 * k1).clamp(-0.5, 0.5), 0.0)
    torch.testing.assert_close(batch.advantages - before, want)
    assert lesson.reward(forest) is forest and not batch.token_extras

    # OPRD: α·Σ(log π_RL − log π_base) on the rows of the successful episode only
    cfg = TeacherConfig(kind="run", route="oprd", oprd=OPRDConfig(alpha=2.0, accept="success"))
    b_lp = PolicyTeacher(base).score(rows).logprobs
    lesson = Teaching(cfg, teacher, base=PolicyTeacher(base)).lesson(renderer, forest, [], pad)
    delta = torch.where(m, t_lp - b_lp, 0.0).sum(1)
    torch.testing.assert_close(lesson.row_reward, 2.0 * delta * torch.tensor([1.0, 1, 0, 0]))
    assert lesson.metrics["teacher/accepted_frac"] == 0.5

    # oprd_token: α·Δ_t per token on the same rows, added to the advantages after credit
    o = OPRDConfig(alpha=2.0, accept="success", clip=0.5)
    cfg = TeacherConfig(kind="run", route="oprd_token", oprd=o)
    lesson = Teaching(cfg, teacher, base=PolicyTeacher(base)).lesson(renderer, forest, [], pad)
    succ = torch.tensor([True, True, False, False])[:, None]
    want = torch.where(m & succ, 2.0 * (t_lp - b_lp).clamp(-0.5, 0.5), 0.0)
    torch.testing.assert_close(lesson.token_reward, want)
    assert lesson.row_reward is None and want.abs().sum() > 0
    batch = forest.to_batch(torch.tensor([1.0, 1.0, -1.0, -1.0]), pad_id=pad)
    before = batch.advantages.clone()
    lesson.attach(batch)
    torch.testing.assert_close(batch.advantages - before, want)

    # two OPRD teachers: the mean of their shifts, per sample the teacher whose RL policy
    # gives the sample the higher log-likelihood, or the mean over the teachers whose
    # shift agrees with the verifier (teacher.oprd.combine)
    rl2, base2 = PolicyTeacher(_guess_policy(3)), PolicyTeacher(_guess_policy(4))
    r2_lp, b2_lp = rl2.score(rows).logprobs, base2.score(rows).logprobs
    delta2 = torch.where(m, r2_lp - b2_lp, 0.0).sum(1)
    accepted = torch.tensor([1.0, 1, 0, 0])
    for combine in ("mean", "likelihood", "verifier"):
        accept = "agree" if combine == "verifier" else "success"
        o = OPRDConfig(alpha=2.0, combine=combine, accept=accept)
        cfg = TeacherConfig(kind="run", route="oprd", oprd=o)
        two = Teaching(cfg, teacher, base=PolicyTeacher(base), more=[(rl2, base2)])
        lesson = two.lesson(renderer, forest, [], pad)
        if combine == "mean":
            want = 2.0 * (delta + delta2) / 2 * accepted
        elif combine == "verifier":  # every row, with the teachers agreeing with its verdict
            both = torch.stack([delta, delta2])
            ok = both * (2 * accepted - 1) > 0  # up on the successes, down on the failures
            assert ok.any() and not ok.all()  # the hand forest has both kinds
            want = 2.0 * (ok * both).sum(0) / ok.sum(0).clamp(min=1)
            assert lesson.metrics["teacher/agree_frac"] == float(ok.float().mean())
        else:
            first = torch.where(m, t_lp, 0.0).sum(1) >= torch.where(m, r2_lp, 0.0).sum(1)
            assert 0 < int(first.sum()) < 4  # the hand forest exercises both choices
            want = 2.0 * torch.where(first, delta, delta2) * accepted
        torch.testing.assert_close(lesson.row_reward, want)


_THREE = (
    (["guess[4]", "guess[2]"], True),
    (["guess[6]", "guess[3]"], True),
    (["guess[5]", "guess[7]"], False),
)


def test_mt_sdpo_reads_every_verified_sibling_and_mixes_the_teacher() -> None:
    """``teacher.aggregate: all``: the failing episode reads both successes, and its
    target is the mean of the teacher's two distributions; each success reads the other
    success alone (exactly that context's scores)."""
    from credo.objectives import mixture_logprobs
    from credo.teachers import PolicyTeacher
    from credo.teachers.teaching import Teaching, teacher_prompts
    from credo.train.config import TeacherConfig

    student = _guess_policy(0)
    teacher = PolicyTeacher(_guess_policy(1))
    forest, renderer = _hand_forest(student, _THREE)
    cfg = TeacherConfig(kind="self", privileged="anchor", full=True, aggregate="all")
    lesson = Teaching(cfg, teacher).lesson(renderer, forest, [], student.pad_id)
    tb = forest.to_batch(torch.zeros(6), pad_id=student.pad_id)

    def scored(text_per_row: list[str | None]) -> torch.Tensor:
        prompts = teacher_prompts(renderer, forest, text_per_row, cfg)
        return teacher.score(TeacherRows.from_batch(tb, prompts), full=True).topk_logprobs

    a, b = "guess[4] ; guess[2]", "guess[6] ; guess[3]"
    with_a, with_b = scored([b, b, a, a, a, a]), scored([b, b, a, a, b, b])
    # rows 0-1 read b, rows 2-3 read a (each other); rows 4-5 read a and b, mixed
    want = with_a.clone()
    want[:2] = with_b[:2]
    present = torch.ones(2, 2, dtype=torch.bool)
    want[4:] = mixture_logprobs(torch.stack([with_a[4:], with_b[4:]]), present)
    got = lesson.scores.topk_logprobs
    m = tb.response_mask[..., None]
    torch.testing.assert_close(torch.where(m, got, 0.0), torch.where(m, want, 0.0))
    assert not torch.allclose(want[4:], with_a[4:])  # the two contexts differ
    assert lesson.metrics["teacher/contexts"] == pytest.approx((2 + 2 + 4) / 6)
    one = Teaching(TeacherConfig(kind="self", privileged="anchor", full=True), teacher)
    first = one.lesson(renderer, forest, [], student.pad_id).scores.topk_logprobs
    torch.testing.assert_close(torch.where(m, first, 0.0), torch.where(m, with_a, 0.0))  # b, a, a


def test_mt_sdpo_pool_eligible_sets_feed_a_failing_group() -> None:
    """A group with no success reads the eligible pool members' verified episodes of its
    task (sanitised), each member playing each task once; a member that failed the task
    is not eligible; the pool's state round-trips."""
    from credo.teachers import PolicyTeacher
    from credo.teachers.pool import TeacherPool
    from credo.teachers.teaching import Teaching, teacher_prompts
    from credo.train.config import TeacherConfig

    student = _guess_policy(0)
    teacher = PolicyTeacher(_guess_policy(1))
    failing = ((["guess[5]", "guess[7]"], False), (["guess[1]", "guess[2]"], False))
    forest, renderer = _hand_forest(student, failing)
    played: list[list[str]] = []

    def play(policy, tasks):  # type: ignore[no-untyped-def]
        played.append([t.id for t in tasks])
        solved = policy is members[0][1]  # member "strong" solves, "weak" does not
        return [(solved, ["guess[4]", "guess[6]", "guess[3]"]) for _ in tasks]

    members = [("strong", _guess_policy(2)), ("weak", _guess_policy(3))]
    pool = TeacherPool(members, play, sanitiser="drop_final")
    cfg = TeacherConfig(kind="self", privileged="anchor", full=True, pool=["strong", "weak"])
    teaching = Teaching(cfg, teacher, pool=pool)
    task = Task.make("train", 7)
    lesson = teaching.lesson(renderer, forest, [], student.pad_id, [task])
    assert played == [["train/7"], ["train/7"]]  # each member once
    assert pool.eligible("train/7") == ["strong"]
    assert pool.results["train/7"] == {"strong": "guess[4] ; guess[6]", "weak": None}
    assert lesson.row_mask.all()
    tb = forest.to_batch(torch.zeros(4), pad_id=student.pad_id)
    prompts = teacher_prompts(renderer, forest, ["guess[4] ; guess[6]"] * 4, cfg)
    want = teacher.score(TeacherRows.from_batch(tb, prompts), full=True).logprobs
    m = tb.response_mask
    got = torch.where(m, lesson.scores.logprobs, 0.0)
    torch.testing.assert_close(got, torch.where(m, want, 0.0))
    assert lesson.metrics["teacher/pool_eligible"] == 1.0
    assert lesson.metrics["teacher/pool_solved/weak"] == 0.0
    teaching.lesson(renderer, forest, [], student.pad_id, [task])
    assert len(played) == 2  # known task: not played again
    again = TeacherPool(members, play)
    again.load(pool.state_dict())
    assert again.results == pool.results
    with pytest.raises(ValueError, match="is not this run's"):
        TeacherPool(members[:1], play).load(pool.state_dict())


def test_oprd_episode_mean_makes_the_teacher_reward_independent_of_length() -> None:
    """``teacher.oprd.episode_reduce: mean`` divides each step's reward by its episode's
    step count: a 3-step success and a 1-step success each get the mean of their steps'
    shifts, where ``sum`` pays the longer one for its length."""
    from credo.teachers import PolicyTeacher
    from credo.teachers.teaching import Teaching
    from credo.train.config import OPRDConfig, TeacherConfig

    student, teacher, base = _guess_policy(0), PolicyTeacher(_guess_policy(1)), _guess_policy(2)
    episodes = ((["guess[4]", "guess[6]", "guess[2]"], True), (["guess[5]"], True))
    forest, renderer = _hand_forest(student, episodes)
    tb = forest.to_batch(torch.zeros(4), pad_id=student.pad_id)
    rows = TeacherRows.from_batch(tb)
    m = tb.response_mask
    delta = torch.where(
        m, teacher.score(rows).logprobs - PolicyTeacher(base).score(rows).logprobs, 0.0
    ).sum(1)

    def reward(episode_reduce: str) -> torch.Tensor:
        o = OPRDConfig(alpha=2.0, accept="success", episode_reduce=episode_reduce)
        cfg = TeacherConfig(kind="run", route="oprd", oprd=o)
        teaching = Teaching(cfg, teacher, base=PolicyTeacher(base))
        return teaching.lesson(renderer, forest, [], student.pad_id).row_reward

    torch.testing.assert_close(reward("sum"), 2.0 * delta)
    want = 2.0 * delta / torch.tensor([3.0, 3.0, 3.0, 1.0])
    torch.testing.assert_close(reward("mean"), want)
    # per episode: the sum of its rows' rewards is α times the mean of its steps' shifts
    ep_total = torch.stack([reward("mean")[:3].sum(), reward("mean")[3]])
    torch.testing.assert_close(ep_total, torch.stack([2.0 * delta[:3].mean(), 2.0 * delta[3]]))


def test_loss_route_with_privileged_prompts() -> None:
    from credo.teachers import PolicyTeacher, privileged_prompt_ids
    from credo.teachers.teaching import Teaching, teacher_prompts
    from credo.train.config import TeacherConfig

    student = _guess_policy(0)
    forest, renderer = _hand_forest(student)
    hist = row_histories(forest)
    assert [len(h) for h in hist] == [0, 1, 0, 1] and hist[1][0].action == "guess[4]"
    cfg = TeacherConfig(kind="self", privileged="oracle", full=True)
    prompts = teacher_prompts(renderer, forest, [x or None for x in forest.texts["oracle"]], cfg)
    assert prompts[2] is None and prompts[3] is None
    assert prompts[1] == privileged_prompt_ids(
        renderer, "guess the secret number", hist[1], forest.observations[1], "guess[3]"
    )
    lesson = Teaching(cfg, PolicyTeacher(student)).lesson(renderer, forest, [], student.pad_id)
    assert lesson.row_mask.tolist() == [True, True, False, False]
    batch = forest.to_batch(torch.zeros(4), pad_id=student.pad_id)
    lesson.attach(batch)
    ex = batch.token_extras
    assert ex["teacher_topk_ids"].shape[-1] == student.vocab_size
    assert ex["teacher_mask"][:, 0].tolist() == [True, True, False, False]
    # the same rows scored by the student in the teacher's context
    rows = TeacherRows.from_batch(batch, prompts)
    torch.testing.assert_close(ex["teacher_logprobs"], PolicyTeacher(student).score(rows).logprobs)


def test_update_gathers_the_teacher_head_after_the_sampler_sets() -> None:
    """The student's log-probs of the teacher's head ride in the same forward pass as
    KLPO's sampler sets, after them: the distillation loss is the same with or without
    those sets, and equals the exact KL to the teacher (full distributions)."""
    from credo.objectives import aggregation_weights
    from credo.teachers import PolicyTeacher, attach_teacher_scores
    from credo.train.parts import update_context
    from credo.train.update import _micro_loss

    cfg = load_config("renyi_opsd", ["objective.loss=opd", "objective.params={}"])
    student, teacher = _guess_policy(0), PolicyTeacher(_guess_policy(1))
    forest, _ = _hand_forest(student)
    batch = forest.to_batch(torch.zeros(4), pad_id=student.pad_id)
    rows = TeacherRows.from_batch(batch)
    attach_teacher_scores(batch, teacher.score(rows, full=True))
    ctx = update_context(cfg, student, torch.optim.SGD(student.model.parameters(), lr=0.0))
    w = aggregation_weights(batch.loss_mask, "token-mean", episode=batch.episode, turn=batch.turn)
    loss, metrics = _micro_loss(ctx, batch, w, None, 0)
    with_aux = batch.index(torch.arange(4))
    shape = (*batch.input_ids.shape, 3)
    with_aux.token_extras["aux_ids"] = torch.randint(0, student.vocab_size, shape)
    with_aux.token_extras["aux_old_logprobs"] = -torch.rand(shape)
    loss_aux, _ = _micro_loss(ctx, with_aux, w, None, 0)
    torch.testing.assert_close(loss_aux, loss)
    s = score_with_policy(student, rows, full=True).topk_logprobs
    t = teacher.score(rows, full=True).topk_logprobs
    assert s is not None and t is not None
    m = batch.response_mask
    exact = float((s[m].exp() * (s[m] - t[m])).sum(-1).mean())
    assert float(metrics["distill/reverse_kl"]) == pytest.approx(exact, rel=1e-4, abs=1e-6)


def test_oprd_teacher_pairs_default_bases_and_one_line_errors(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from credo.teachers.folders import oprd_teacher_pairs
    from credo.train.config import OPRDConfig

    for name in ("a", "a/reference", "b", "b/reference", "c", "c_base"):
        (tmp_path / name).mkdir()

    def pairs(*more: dict) -> list[tuple[str, str]]:
        oprd = OPRDConfig(teachers=list(more))
        return oprd_teacher_pairs(SimpleNamespace(route="oprd", path=str(tmp_path / "a"),
                                                  base_path=None, oprd=oprd))  # fmt: skip

    a, b, c = (str(tmp_path / x) for x in "abc")
    assert pairs() == [(a, f"{a}/reference")]
    assert pairs({"path": b}, {"path": c, "base_path": f"{c}_base"}) == [
        (a, f"{a}/reference"), (b, f"{b}/reference"), (c, f"{c}_base"),
    ]  # fmt: skip
    for bad, msg in (
        ({"path": c}, r"teachers\[0\]: the teacher's base model .* does not exist"),
        ({"path": b, "colour": 1}, r"teachers\[0\]: unknown key 'colour'"),
        ({"base_path": b}, r"teachers\[0\] must be a mapping"),
    ):
        with pytest.raises(ValueError, match=msg):
            pairs(bad)
