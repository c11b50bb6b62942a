"""``credo compare`` against its reference recipe: env steps to the reference's final
training success, their ratio, and held-out success paired by seed (hand-worked)."""

from __future__ import annotations

import pytest

from credo.commands.compare import (
    RecipeSummary,
    _token_curve,
    relate_to_reference,
    summary_table_rows,
)


def _summary(recipe: str, final: list[float], curves: list[list[tuple[int, float]]]):
    return RecipeSummary(recipe, final=final, curves=curves, iteration_s=[1.0], update_s=[0.5])


def _summaries() -> list[RecipeSummary]:
    grpo = _summary(
        "grpo",
        [0.5, 0.3, 0.4],
        [[(10, 0.2), (20, 0.4), (30, 0.6)], [(10, 0.0), (20, 0.2), (30, 0.4)],
         [(10, 0.1), (20, 0.3), (30, 0.5)]],
    )  # fmt: skip
    gigpo = _summary(
        "gigpo",
        [0.6, 0.2, 0.45],
        [[(12, 0.4), (24, 0.6), (36, 0.8)], [(8, 0.2), (16, 0.4), (24, 0.6)],
         [(10, 0.3), (20, 0.5), (30, 0.7)]],
    )  # fmt: skip
    flat = _summary("graph", [0.1, 0.1, 0.1], [[(10, 0.1), (20, 0.1), (30, 0.1)]] * 3)
    return [grpo, gigpo, flat]


def test_steps_ratio_and_paired_deltas_are_hand_worked() -> None:
    grpo, gigpo, flat = s = _summaries()
    # seed-mean curves (smooth 1): grpo 0.1 / 0.3 / 0.5 at 10 / 20 / 30 env steps,
    # gigpo 0.3 / 0.5 / 0.7 at 10 / 20 / 30
    threshold = relate_to_reference(s, "grpo", smooth=1)
    assert threshold == pytest.approx(0.5)
    assert (grpo.steps_to_reference, gigpo.steps_to_reference) == (30, 20)
    assert flat.steps_to_reference is None
    assert grpo.steps_ratio == pytest.approx(1.0)
    assert gigpo.steps_ratio == pytest.approx(20 / 30)
    assert flat.steps_ratio is None
    # seed by seed: gigpo reaches grpo's final 0.6 / 0.4 / 0.5 at 24 / 16 / 20 env steps,
    # grpo at 30 on each seed
    assert gigpo.seed_steps_ratio == pytest.approx([24 / 30, 16 / 30, 20 / 30])
    assert grpo.seed_steps_ratio == [1.0, 1.0, 1.0]
    assert flat.seed_steps_ratio == [None, None, None]
    assert (grpo.tokens_ratio, gigpo.tokens_ratio, flat.tokens_ratio) == (None, None, None)
    assert gigpo.delta == pytest.approx([0.1, -0.1, 0.05])
    assert grpo.delta == [0.0, 0.0, 0.0]
    assert gigpo.median == pytest.approx(0.45)


def test_the_table_shows_median_paired_delta_and_steps_ratio() -> None:
    s = _summaries()
    relate_to_reference(s, "grpo", smooth=1)
    cols, rows = summary_table_rows(s)
    row = dict(zip(cols, rows[1]))
    assert row["recipe"] == "gigpo"
    assert row["median"] == "45.0%"
    # mean (10 - 10 + 5) / 3 = +1.7 beside the median +5.0
    delta = "Δ vs reference, points: mean, median (per seed)"
    assert row[delta] == "+1.7, +5.0 (+10.0 -10.0 +5.0)"
    assert row["env steps to reference"] == "20"
    assert row["× reference's env steps"] == "0.67×"
    per_seed = "× reference's env steps, same seed: median (per seed)"
    assert row[per_seed] == "0.67× (0.80× 0.53× 0.67×)"
    flat = dict(zip(cols, rows[2]))
    assert flat["env steps to reference"] == "not reached"
    assert flat["× reference's env steps"] == "—"
    assert flat[per_seed] == "not reached (not reached not reached not reached)"
    # a summary never related to a reference shows dashes, not zeros
    lone = RecipeSummary("grpo", final=[0.5], iteration_s=[1.0], update_s=[0.5])
    cols, rows = summary_table_rows([lone])
    assert dict(zip(cols, rows[0]))[delta] == "—"


def test_a_reference_given_as_a_path_is_found_by_its_stem() -> None:
    s = _summaries()
    relate_to_reference(s, "recipes/grpo.yaml", smooth=1)
    assert s[1].steps_ratio == pytest.approx(20 / 30)


def test_a_seed_that_never_reaches_counts_as_the_slowest() -> None:
    """Two of three seeds reach the reference: the median is the slower of them; one of
    three: not reached."""
    from credo.commands.compare import _per_seed_ratios

    assert _per_seed_ratios([0.5, None, 0.9]) == "0.90× (0.50× not reached 0.90×)"
    assert _per_seed_ratios([0.5, None, None]).startswith("not reached (")
    assert _per_seed_ratios([0.4, 0.8]) == "0.80× (0.40× 0.80×)"  # even count: the higher


def test_the_markdown_table_escapes_the_pipes_of_a_column_name() -> None:
    """``|A| p99`` must not split a row of ``compare.md`` (or a pipeline table) into
    extra cells."""
    from credo.utils.markdown import markdown_table

    text = markdown_table(["recipe", "|A| p99"], [["grpo", "2.47"]])
    assert text == "| recipe | \\|A\\| p99 |\n|---|---|\n| grpo | 2.47 |\n"
    for line in text.splitlines():
        assert len(line.replace("\\|", "").strip("|").split("|")) == 2


def test_the_teacher_cost_column_shows_only_when_a_recipe_logged_it() -> None:
    _, opd, _ = s = _summaries()
    relate_to_reference(s, "grpo", smooth=1)
    cols, _ = summary_table_rows(s)
    assert "teacher s/iteration" not in cols
    opd.health["teacher/seconds"] = [1.5, 2.5]  # two seeds' means over their last iterations
    cols, rows = summary_table_rows(s)
    assert [dict(zip(cols, r))["teacher s/iteration"] for r in rows] == ["—", "2.00", "—"]
    assert all(len(r) == len(cols) for r in rows)


def test_generated_tokens_to_the_reference_are_hand_worked() -> None:
    """Success at equal generation cost: a tree that shares prefixes generates fewer
    tokens per iteration. Per iteration, grpo generates 100 tokens and a tree 60; both
    reach grpo's final success (0.5) on the same iteration, so the tree got there with
    0.6x the tokens; a run that is never reached shows a dash."""
    metrics = [
        [{"rollout/gen_tokens": n, "rollout/success_rate": y} for y in (0.1, 0.3, 0.5)]
        for n in (100, 60)
    ]
    grpo = _summary("grpo", [0.5], [[(10, 0.1), (20, 0.3), (30, 0.5)]])
    tree = _summary("tsbpo", [0.5], [[(10, 0.1), (20, 0.3), (30, 0.5)]])
    flat = _summary("graph", [0.1], [[(10, 0.1), (20, 0.1), (30, 0.1)]])
    grpo.token_curves = [_token_curve(metrics[0])]
    tree.token_curves = [_token_curve(metrics[1])]
    flat.token_curves = [[(100, 0.1), (200, 0.1), (300, 0.1)]]
    assert tree.token_curves == [[(60, 0.1), (120, 0.3), (180, 0.5)]]
    relate_to_reference([grpo, tree, flat], "grpo", smooth=1)
    assert grpo.tokens_ratio == pytest.approx(1.0)
    assert tree.tokens_ratio == pytest.approx(180 / 300)
    assert flat.tokens_ratio is None
    cols, rows = summary_table_rows([grpo, tree, flat])
    col = "× reference's generated tokens"
    assert [dict(zip(cols, r))[col] for r in rows] == ["1.00×", "0.60×", "—"]
