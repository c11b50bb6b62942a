"""``textworld``: Microsoft TextWorld's text adventures behind credo's env protocol.

`TextWorld <https://github.com/microsoft/TextWorld>`_ (Côté et al., 2018,
https://arxiv.org/abs/1806.11532) generates interactive-fiction games from a seed. This
adapter generates a small set of games offline with TextWorld's own generator
(:mod:`credo.envs.textworld_games`: ``tw-make``, cached) and plays them::

    credo play --env textworld                                   # tw-simple games
    credo train --env textworld env.kwargs.challenge=tw-coin_collector \\
        "env.kwargs.settings={level: 5}" env.kwargs.games=8
    credo check-env --env textworld env.kwargs.games=2

Install it with ``pip install 'credo[textworld]'``; without the package the env refuses
to start with one line that says so. ``game_files=[...]`` plays games you already have
(``.z8``/``.ulx`` with their ``.json``) instead of generating any.

**Tasks**: the training tasks cycle through ``games`` generated games (generator seeds
``0 .. games-1``), held-out tasks through ``heldout_games`` other games (seeds from
:data:`HELDOUT_GAME_SEED`), so held-out success is measured on games never trained on:
task seed ``s`` plays game ``s mod n`` of its split.

**Actions** are TextWorld commands (``open antique trunk``, ``go east``). A command is
valid when it is one of the game's *admissible commands* in the current state
(TextWorld's ``admissible_commands``; compared after lower-casing and collapsing spaces,
so the spaced text credo's word-level tokenizer writes is accepted); anything else is an
invalid action (``info["valid"] = False``) that does not reach the game, counts as a turn
and is answered with ``invalid action : ...`` and the last observation.

**Observations** are the game's text (the room on reset, then the feedback to each
command) without the banner and the prompt, then (``show_commands``, default on) the
admissible commands, ``commands : a ; b ; ...``; capped at ``max_observation_chars``.
``instruction()`` is the game's objective.

**Rewards**: the step reward is the change of the game's score divided by its maximum
score (TextWorld's intermediate rewards; they sum to 1 over a won episode);
``reward="success"`` gives 0/1 on the last step instead. **Success** is the game won; a
lost game or the turn limit ends the episode unsolved.

**State keys** come from the game state: the room, the score and a digest of TextWorld's
world facts (``state_key()``), and room + score as the coarse stage
(``abstract_state_key()``); ``progress()`` is score / max score.

**Warm start**: the oracle is TextWorld's own ``policy_commands`` (the walkthrough from
the current state, so it recovers from detours); the random-but-plausible actor picks an
admissible command. **Snapshots** are the commands played since ``reset`` (replayed into
the game on ``restore``: TextWorld games are deterministic).
"""

from __future__ import annotations

import hashlib
import random
import re
import warnings
from pathlib import Path
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env
from credo.envs.textworld_games import game_file
from credo.envs.thirdparty import missing_package

__all__ = ["HELDOUT_GAME_SEED", "MAX_ACTION_CHARS", "TextWorldEnv", "clean_text", "normalize"]

#: Generator seeds of held-out games start here (training games use 0, 1, ...).
HELDOUT_GAME_SEED = 1_000_000
#: Longer actions are invalid without being read (a command is a few words).
MAX_ACTION_CHARS = 200
_PROMPT_TAIL = re.compile(r"\n>[^\n]*$")
_BLANKS = re.compile(r"\n\s*\n+")
_WORDS_EDGE = " \t\n\r\"'.!?"
_END_BANNER = re.compile(
    r"^[ \t]*\*\*\*[^\n]*\*\*\*[ \t]*$|^[^\n]*Would you like to RESTART[^\n]*$", re.MULTILINE
)


def normalize(action: str) -> str:
    """A command as compared with the admissible ones: lower case, words joined by one
    space, quotes and final punctuation dropped (``"  Go  East. "`` → ``"go east"``)."""
    return " ".join(action.lower().strip(_WORDS_EDGE).split())


def clean_text(text: str) -> str:
    """The game's text without the ``>`` prompt and the status line after it, the
    end-of-game banner (``*** The End ***``, ``*** You lost! ***`` and the interpreter's
    "Would you like to RESTART, RESTORE ..." question: an agent cannot answer them) and
    runs of blank lines."""
    text = _PROMPT_TAIL.sub("", text.replace("\r", ""))
    text = _END_BANNER.sub("", text)
    return _BLANKS.sub("\n", text).strip()


def _game_files(name: str, files: Any) -> list[str] | None:
    """``game_files``/``heldout_files`` as a list of paths: one path (a str) is a list of
    one (not its characters); anything else but a list of strs is refused in one line."""
    if files is None or isinstance(files, (str, Path)):
        return None if files is None or str(files) == "" else [str(files)]
    if isinstance(files, (list, tuple)) and all(isinstance(f, (str, Path)) for f in files):
        return [str(f) for f in files]
    raise ValueError(f"textworld {name} must be a game file path or a list of them, got {files!r}")


@register_env("textworld")
class TextWorldEnv:
    """TextWorld games (see the module docstring).

    Args:
        challenge: a TextWorld challenge: ``tw-simple`` (default), ``tw-coin_collector``,
            ``tw-treasure_hunter``.
        settings: the challenge's settings (default: ``tw-simple``: dense rewards and a
            detailed goal; the others: ``level`` 1).
        games: training games (generator seeds ``0 .. games-1``; default 4).
        heldout_games: held-out games (default 2).
        game_files: play these game files (a path or a list of paths) instead of
            generating (training and held-out tasks share them unless ``heldout_files`` is
            given); the per-difficulty breakdown is then by game file.
        heldout_files: held-out game files (with ``game_files``; a path or a list).
        cache_dir: where generated games are kept (default ``$CREDO_CACHE/textworld``).
        max_turns: turn limit (default 20).
        show_commands: list the admissible commands in every observation (default true).
        reward: ``"score"`` (score changes / max score, default) or ``"success"``.
        max_observation_chars: observations are cut to this length (default 2000).
    """

    def __init__(
        self,
        challenge: str = "tw-simple",
        *,
        settings: dict[str, Any] | None = None,
        games: int = 4,
        heldout_games: int = 2,
        game_files: list[str] | str | None = None,
        heldout_files: list[str] | str | None = None,
        cache_dir: str | None = None,
        max_turns: int = 20,
        show_commands: bool = True,
        reward: str = "score",
        max_observation_chars: int = 2000,
    ) -> None:
        try:
            import textworld
        except ImportError:
            raise missing_package("textworld", "textworld", "textworld") from None
        self._tw = textworld
        if reward not in ("score", "success"):
            raise ValueError(f"textworld reward must be 'score' or 'success', got {reward!r}")
        for name, value in (("games", games), ("heldout_games", heldout_games)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"textworld {name} must be a positive integer, got {value!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"textworld max_turns must be a positive integer, got {max_turns!r}")
        game_files = _game_files("game_files", game_files)
        heldout_files = _game_files("heldout_files", heldout_files)
        self.own_games = bool(game_files)
        if game_files:
            train = [self._checked(f) for f in game_files]
            test = [self._checked(f) for f in heldout_files] if heldout_files else train
        else:
            if heldout_files:
                raise ValueError("textworld heldout_files needs game_files too")

            def make(seed: int) -> Path:
                return game_file(challenge, seed, settings, cache_dir=cache_dir)

            train = [make(s) for s in range(games)]
            test = [make(HELDOUT_GAME_SEED + s) for s in range(heldout_games)]
        self.files = {"train": train, "test": test}
        self.challenge = challenge
        self.max_turns = max_turns
        self.show_commands = show_commands
        self.reward_kind = reward
        self.max_observation_chars = max_observation_chars
        self._infos = textworld.EnvInfos(
            admissible_commands=True,
            policy_commands=True,
            score=True,
            max_score=True,
            won=True,
            lost=True,
            objective=True,
            description=True,
            facts=True,
        )
        self._engines: dict[Path, Any] = {}
        self.task: Task | None = None
        self._file: Path | None = None
        self._gs: Any = None
        self._history: list[str] = []
        self._turn, self._done, self._obs, self._text = 0, False, "", ""

    @staticmethod
    def _checked(path: str) -> Path:
        p = Path(path).expanduser()
        if not p.exists() or not p.with_suffix(".json").exists():
            raise ValueError(f"textworld game file {path!r}: needs the game and its .json")
        return p

    # ------------------------------------------------------------ the game
    def _engine(self, path: Path) -> Any:
        if path not in self._engines:
            self._engines[path] = self._tw.start(str(path), request_infos=self._infos)
        return self._engines[path]

    def _game_for(self, task: Task) -> Path:
        files = self.files["test" if task.split == "test" else "train"]
        return files[task.seed % len(files)]

    def _start(self, task: Task) -> None:
        self._file = self._game_for(task)
        with warnings.catch_warnings():  # Jericho's notice, when it loads a game, that it
            warnings.simplefilter("ignore")  # tracks no score: TextWorld's infos keep it
            self._gs = self._engine(self._file).reset()
        self._history, self._turn, self._done = [], 0, False

    def _play(self, command: str) -> None:
        gs, _, _ = self._engine(self._file).step(command)  # type: ignore[arg-type]
        self._gs = gs
        self._history.append(command)

    def _admissible(self) -> list[str]:
        return sorted({normalize(c) for c in self._gs["admissible_commands"] or []})

    def _render(self, text: str) -> str:
        if self.show_commands and not self._done:
            text = f"{text}\ncommands : {' ; '.join(self._admissible())}"
        return text[: self.max_observation_chars]

    def _score(self) -> float:
        return float(self._gs["score"] or 0)

    def _max_score(self) -> float:
        return float(self._gs["max_score"] or 1) or 1.0

    # ------------------------------------------------------------ protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        """Start the game of ``task`` (see the module docstring; ``seed`` is unused)."""
        self.task = task
        self._start(task)
        self._text = clean_text(self._gs["description"] or "")
        self._obs = self._render(self._text)
        return self._obs

    def instruction(self) -> str:
        """The game's objective."""
        return clean_text(self._gs["objective"] or "")

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        self._turn += 1
        command = normalize(action) if len(action) <= MAX_ACTION_CHARS else None
        before = self._score()
        valid = command is not None and command in self._admissible()
        if valid:
            self._play(command)  # type: ignore[arg-type]
            text = self._text = clean_text(self._gs.feedback or "")
        else:
            text = f"invalid action : not a command here .\n{self._text}"
        won, lost = bool(self._gs["won"]), bool(self._gs["lost"])
        self._done = won or lost or self._turn >= self.max_turns
        self._obs = self._render(text)
        delta = (self._score() - before) / self._max_score()
        info: dict[str, Any] = {"valid": valid, "score": self._score()}
        if self._done:
            info.update(success=won, turns=self._turn)
        reward = delta if self.reward_kind == "score" else float(self._done and won)
        return StepResult(self._obs, float(reward), self._done, info)

    def state_key(self) -> str:
        """Room, score and a digest of the world's facts (the exact game state)."""
        facts = sorted(str(f) for f in self._gs["facts"] or [])
        digest = hashlib.blake2b("\n".join(facts).encode(), digest_size=8).hexdigest()
        end = "done|" if self._done else ""
        return f"{end}{self._room()}|{self._score():g}|{digest}"

    def _room(self) -> str:
        m = re.search(r"-=\s*(.*?)\s*=-", self._gs["description"] or "")
        return m.group(1).lower() if m else "?"

    def abstract_state_key(self) -> str:
        """Room and score: the coarse stage of the quest."""
        return f"{self._room()}|{self._score():g}"

    def progress(self) -> float:
        """Score / max score, in [0, 1]."""
        return max(0.0, min(1.0, self._score() / self._max_score()))

    def snapshot(self) -> tuple[Any, ...]:
        """The commands played since ``reset`` and the adapter's counters."""
        return (self.task, tuple(self._history), self._turn, self._done, self._obs, self._text)

    def restore(self, snap: tuple[Any, ...]) -> None:
        """Restart the task's game and replay the recorded commands."""
        task, history, turn, done, obs, text = snap
        self.task = task
        self._start(task)
        for command in history:
            self._play(command)
        self._turn, self._done, self._obs, self._text = turn, done, obs, text

    # ------------------------------------------------------------ helpers
    def oracle_action(self) -> str:
        """The first of TextWorld's ``policy_commands`` (the walkthrough from here)."""
        if self._done:
            raise RuntimeError("the episode is over")
        plan = self._gs["policy_commands"] or []
        return normalize(plan[0]) if plan else self.sample_action(random.Random(self._turn))

    def sample_action(self, rng: random.Random) -> str:
        """A random admissible command (random but plausible)."""
        if self._done:
            raise RuntimeError("the episode is over")
        return rng.choice(self._admissible() or ["look"])

    def privileged_context(self, kind: str) -> str | None:
        """``"oracle"``: :meth:`oracle_action`; ``"solution"``: the remaining walkthrough."""
        if self._done:
            return None
        if kind == "oracle":
            return self.oracle_action()
        if kind == "solution":
            return " ; ".join(normalize(c) for c in self._gs["policy_commands"] or []) or None
        return None

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """Another training task (any seed plays one of the training games)."""
        return Task("train", find_variant_seed(rng, lambda s: True))

    def task_difficulty(self) -> str:
        """The challenge's name (``credo eval``'s per-difficulty breakdown); with your own
        ``game_files``, the current game's file name (``game.z8`` files are named by their
        folder), since the challenge option does not describe them."""
        if not self.own_games:
            return self.challenge
        path = self._file or self.files["train"][0]
        return path.parent.name if path.stem == "game" else path.stem

    def action_format(self) -> str:
        return "Reply with exactly one command from the list of commands (e.g. go east)."

    def vocabulary(self) -> list[str]:
        """The words of every game (TextWorld's vocabulary of the game files) and of the
        texts and commands along each game's walkthrough."""
        from textworld.text_utils import extract_vocab_from_gamefiles

        files = sorted({*self.files["train"], *self.files["test"]})
        with warnings.catch_warnings():  # Jericho's score notice, as in _start
            warnings.simplefilter("ignore")
            words = {w.lower() for w in extract_vocab_from_gamefiles([str(f) for f in files])}
        probe = TextWorldEnv.__new__(TextWorldEnv)
        probe.__dict__.update(self.__dict__)
        probe._engines = {}
        for split, paths in probe.files.items():
            for i in range(len(paths)):
                obs = probe.reset(Task(split, i))
                words.update(obs.lower().split())
                words.update(probe.instruction().lower().split())
                while not probe._done:
                    res = probe.step(probe.oracle_action())
                    words.update(res.observation.lower().split())
        words.update(
            ["invalid", "action", ":", "not", "a", "command", "here", ".", "commands", ";"]
        )
        return sorted(words)
