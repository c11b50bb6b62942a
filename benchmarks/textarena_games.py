"""Which TextArena games credo plays: every game family of the installed ``textarena``
package, built as a single-player credo env (``textarena:<id>``), then ``credo
check-env``'s checks with the built-in model's tokenizer; a table of what loads, what
passes, and, for the rest, the one line credo refuses it with.

For each family the shortest registered id is tried (``Sudoku-v0``, not its variants).
Columns: the spec (``own``: a :class:`~credo.envs.textarena_env.GameSpec` with an oracle;
``generic``: played through :data:`~credo.envs.textarena_env.GENERIC`), the turn limit,
check-env's verdict, and the share of held-out games an oracle wins (own specs only).

    python benchmarks/textarena_games.py [--tasks 4] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import warnings

from _common import print_table

from credo.envs import Task, make_env
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env


def families() -> dict[str, str]:
    """Each TextArena family's shortest registered id (without the ``-raw`` suffix)."""
    from textarena.envs.registration import ENV_REGISTRY

    out: dict[str, str] = {}
    for raw in sorted(ENV_REGISTRY, key=len):
        if raw.endswith("-raw"):
            out.setdefault(raw.split("-v", 1)[0], raw[: -len("-raw")])
    return dict(sorted(out.items()))


def oracle_wins(game: str, episodes: int = 20) -> float:
    env = make_env(f"textarena:{game}")
    wins = 0
    for seed in range(episodes):
        env.reset(Task.make("test", seed))
        while True:
            res = env.step(env.oracle_action())
            if res.done:
                wins += bool(res.info["success"])
                break
    return wins / episodes


def survey(tasks: int) -> list[list[str]]:
    rows = []
    for game in families().values():
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                env = make_env(f"textarena:{game}")
                own = hasattr(env, "oracle_action")
                tokenizer = build_word_tokenizer(env.vocabulary())
                report = check_env(
                    lambda game=game: make_env(f"textarena:{game}"),
                    tasks=tasks,
                    tokenizer=tokenizer,
                )
                verdict = "passes" if report.ok else "; ".join(report.problems + report.errors)
                oracle = f"{oracle_wins(game):.0%}" if own and report.ok else "-"
            rows.append([game, "own" if own else "generic", str(env.max_turns), verdict, oracle])
        except ValueError as exc:
            rows.append([game, "-", "-", f"refused: {exc}".split(": ", 2)[-1][:110], "-"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4, help="check-env tasks per game")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args()
    rows = survey(args.tasks)
    columns = ["game", "spec", "turns", "check-env", "oracle wins"]
    if args.markdown:
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * len(columns))
        for row in rows:
            print("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    else:
        print_table("TextArena games as credo envs", columns, rows)
    played = sum(r[3] == "passes" for r in rows)
    print(f"{played} of {len(rows)} families pass check-env as single-player credo envs")


if __name__ == "__main__":
    main()
