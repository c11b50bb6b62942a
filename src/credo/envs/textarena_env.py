"""``textarena``: TextArena's single-player games behind credo's env protocol.

`TextArena <https://github.com/LeonGuertler/TextArena>`_ (Guertler et al., 2025) is a
collection of text games for LLM agents. This adapter plays every single-player game of
it that runs offline, with any of its registered variants (``TowerOfHanoi-v0-medium``,
``Sudoku-v0-easy``, ...), as credo envs::

    credo play --env textarena env.kwargs.game=TowerOfHanoi-v0
    credo train --env textarena:GuessTheNumber-v0          # the game id after the colon
    credo check-env --env textarena:Mastermind-v0

Install it with ``pip install 'credo[textarena]'``; without the package the env refuses
to start with one line that says so. Nothing is downloaded: the games are built from
the package's own code (``textarena.make(<id>-raw)``, the variant without LLM wrappers).
A game that fetches data when it is built (the word games: Wordle, Hangman, SpellingBee,
... load NLTK word lists), needs an API key (an LLM opponent) or several players is
refused in one line saying which, before anything is fetched (the download is found in
the game's source, which is read, not imported).

Four families have a :class:`GameSpec` of their own (:data:`GAMES`: GuessTheNumber,
TowerOfHanoi, FrozenLake, Minesweeper: move parsing, an oracle, a plausible actor, state
keys and progress); every other game is played through :data:`GENERIC`: the first
bracketed move of the reply reaches the game, which parses and judges it with its own
rules; the game's prompt is the instruction; state keys are a digest of the game's state;
no oracle (so no warm start from demonstrations). :func:`register_game` gives a game your
own oracle, plausible actor or vocabulary (in a module that ``$CREDO_ENV_MODULES`` names).

A **task** is ``(game id, seed)``: the game id is the env's ``game`` option and
``task.seed`` seeds the game's generator (the secret number, the lake, the mines), so
train and held-out tasks never share a board.

**Actions** are what the game expects, in square brackets: ``[7]`` (GuessTheNumber),
``[A C]`` (TowerOfHanoi: source and target tower), ``[up]`` (FrozenLake: up, down,
left, right or w, a, s, d), ``[3 2]`` (Minesweeper: row and column). The adapter parses
them itself (:meth:`GameSpec.parse`), with the spaces credo's word-level tokenizer writes
(``[ 7 ]``, ``[ a c ]``), from the first :data:`MAX_ACTION_CHARS` characters, and hands
the game the canonical form; text it cannot parse reaches the game as an empty move, so
the game's own rules judge it. A move the game rejects (a format error, a repeated guess,
a wall, a bigger disk on a smaller one, a mine) is an **invalid action**:
``info["valid"] = False``, the game's message as the observation, and the game's error
allowance applies: by TextArena's rule a second invalid move in a row ends the game;
``error_allowance=k`` forgives ``k`` in a row.

**Observations** are the game's messages since the last move (boards, hints, results;
the echo of the move is left out), each game adding one line of what its hints have
shown so far where the game prints none (GuessTheNumber: ``the number is from 8 to 12``),
capped at :data:`MAX_OBSERVATION_CHARS`. ``instruction()`` is the game's own prompt (or, with ``instruction="short"``, one line
with the goal and the move format).

**Reward and success**: success is the game's win (TextArena's reward 1); the step reward
is chosen by ``reward``: ``"success"`` (0/1 on the last step, the default) or ``"game"``
(the game's own final reward: its partial credit on a loss, e.g. the share of disks on
tower C).

**Determinism**: TextArena draws from Python's global ``random`` (seeded by ``reset``;
Minesweeper places its mines on the first move). The adapter keeps one random state per
env and swaps it in around every call into the game (under a lock), so an episode depends
on ``task.seed`` and the moves only, and snapshots (a deep copy of the game plus that
state) restore exactly.

Each of the four :data:`GAMES` has an oracle (a correct next move: binary search, the
optimal Hanoi move from any position, a shortest path around the holes, a cell without a
mine) and a
random-but-plausible actor (a legal-looking move) for the warm start, state keys from
the game state, ``progress()`` and ``abstract_state_key()``.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env
from credo.envs.thirdparty import missing_package, register_env_scheme

__all__ = [
    "DEFAULT_TURNS",
    "GAMES",
    "GENERIC",
    "MAX_ACTION_CHARS",
    "MAX_OBSERVATION_CHARS",
    "GameSpec",
    "TextArenaEnv",
    "hanoi_next_move",
    "register_game",
]

#: Only this many leading characters of an action are read (a move is a few characters).
MAX_ACTION_CHARS = 1000
#: Observations are cut to this many characters (boards are a few hundred).
MAX_OBSERVATION_CHARS = 4000

_RANDOM_LOCK = threading.Lock()

# TextArena's ObservationType names kept in observations (the prompt is the instruction;
# PLAYER_ACTION echoes the move).
_SHOWN = {"GAME_MESSAGE", "GAME_ADMIN", "GAME_BOARD", "GAME_ACTION_DESCRIPTION"}


@dataclass(frozen=True)
class GameSpec:
    """What the adapter knows about one TextArena game family.

    Attributes:
        pattern: the move grammar (searched in the action, case-insensitive); its groups
            are the move's parts.
        canonical: the parts → the move as the game expects it (``"[A C]"``).
        oracle: the game object → a correct next move (``None``: no oracle, so no warm
            start from demonstrations).
        sample: (game, rng) → a random plausible move (``None``: none).
        state_key: the game → a canonical state string.
        progress: the game → progress in [0, 1].
        status: the game → a line of what the hints have shown so far (or ``""``).
        turns: default credo turn limit (moves the game rejects count too).
        goal: the game → a one-line goal and move format (``instruction="short"``).
        vocabulary: the game → extra words its moves use (for the built-in word-level
            tokenizer; the prompts' and messages' words are collected anyway).
    """

    pattern: re.Pattern[str]
    canonical: Callable[[tuple[str, ...]], str]
    oracle: Callable[[Any], str] | None
    sample: Callable[[Any, random.Random], str] | None
    state_key: Callable[[Any], str]
    progress: Callable[[Any], float]
    status: Callable[[Any], str]
    turns: Callable[[Any], int]
    goal: Callable[[Any], str]
    vocabulary: Callable[[Any], Iterable[str]] | None = None

    def parse(self, action: str) -> str | None:
        """The canonical move in the first :data:`MAX_ACTION_CHARS` characters of
        ``action``, or ``None``. The patterns have no nested repetition, so a search
        costs time linear in what is read."""
        m = self.pattern.search(action[:MAX_ACTION_CHARS])
        return None if m is None else self.canonical(m.groups())


# ----------------------------------------------------------------- GuessTheNumber
def _guess_range(game: Any) -> tuple[int, int]:
    """The range the hints leave: every guess below the target raised the floor, every
    guess above lowered the ceiling (what the player has been told)."""
    target = game.game_number
    lo = max((g + 1 for g in game.guessed_numbers if g < target), default=game.min_number)
    hi = min((g - 1 for g in game.guessed_numbers if g > target), default=game.max_number)
    return lo, hi


def _guess_sample(game: Any, rng: random.Random) -> str:
    """A legal guess: any number of the game's range not guessed yet (the hints unused)."""
    span = range(game.min_number, game.max_number + 1)
    fresh = [n for n in span if n not in game.guessed_numbers] or [game.min_number]
    return f"[{rng.choice(fresh)}]"


GUESS = GameSpec(
    pattern=re.compile(r"\[\s*([0-9]{1,9})\s*\]"),
    canonical=lambda g: f"[{int(g[0])}]",
    oracle=lambda game: f"[{sum(_guess_range(game)) // 2}]",
    sample=_guess_sample,
    state_key=lambda game: "{}-{}".format(*_guess_range(game)),
    progress=lambda game: (
        1.0
        - (lambda r: (r[1] - r[0]) / max(1, game.max_number - game.min_number))(_guess_range(game))
    ),
    status=lambda game: "the number is from {} to {}".format(*_guess_range(game)),
    turns=lambda game: game.max_turns,
    goal=lambda game: f"guess the number from {game.min_number} to {game.max_number} : reply [n]",
)


# ------------------------------------------------------------------ TowerOfHanoi
def hanoi_next_move(towers: dict[str, list[int]], target: str = "C") -> tuple[str, str] | None:
    """The first move of the shortest solution that stacks every disk on ``target``
    from any legal position (``towers``: peg → disks bottom to top), or ``None`` when
    solved. The largest disk not yet on its destination must move there, so every
    smaller disk must first go to the third peg: recurse on that sub-goal."""
    where = {d: peg for peg, disks in towers.items() for d in disks}

    def solve(k: int, goal: str) -> tuple[str, str] | None:
        while k >= 1 and where[k] == goal:
            k -= 1
        if k == 0:
            return None
        src = where[k]
        spare = next(p for p in towers if p not in (src, goal))
        return solve(k - 1, spare) or (src, goal)

    return solve(len(where), target)


def _hanoi_towers(game: Any) -> dict[str, list[int]]:
    return game.state.game_state["towers"]


def _hanoi_sample(game: Any, rng: random.Random) -> str:
    towers = _hanoi_towers(game)
    legal = [
        (a, b)
        for a in towers
        for b in towers
        if a != b and towers[a] and (not towers[b] or towers[b][-1] > towers[a][-1])
    ]
    a, b = rng.choice(legal)
    return f"[{a} {b}]"


def _hanoi_progress(game: Any) -> float:
    c, n = _hanoi_towers(game)["C"], game.num_disks
    placed = 0
    for want, have in zip(range(n, 0, -1), c):
        if want != have:
            break
        placed += 1
    return placed / n


HANOI = GameSpec(
    pattern=re.compile(r"\[\s*([abc])\s*,?\s*([abc])\s*\]", re.I),
    canonical=lambda g: f"[{g[0].upper()} {g[1].upper()}]",
    oracle=lambda game: "[{} {}]".format(*(hanoi_next_move(_hanoi_towers(game)) or ("A", "C"))),
    sample=_hanoi_sample,
    state_key=lambda game: "|".join(
        f"{p}:{','.join(map(str, d))}" for p, d in _hanoi_towers(game).items()
    ),
    progress=_hanoi_progress,
    status=lambda game: "",
    turns=lambda game: game.max_turns,
    goal=lambda game: f"move the {game.num_disks} disks from tower a to tower c : reply [a c]",
)


# -------------------------------------------------------------------- FrozenLake
_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_WASD = {"w": "up", "a": "left", "s": "down", "d": "right"}


def _lake_path(game: Any) -> list[str]:
    """A shortest list of moves from the player to the goal around the holes (BFS in
    the fixed order up, down, left, right; empty if there is none)."""
    gs = game.state.game_state
    grid, start, goal = gs["grid"], tuple(gs["player_pos"]), tuple(gs["goal_pos"])
    size = len(grid)
    back: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while back[cell] is not None:
                cell, move = back[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            inside = 0 <= nxt[0] < size and 0 <= nxt[1] < size
            if inside and nxt not in back and grid[nxt[0]][nxt[1]] != "H":
                back[nxt] = (cell, move)
                queue.append(nxt)
    return []


def _lake_sample(game: Any, rng: random.Random) -> str:
    gs = game.state.game_state
    r, c = gs["player_pos"]
    size = len(gs["grid"])
    inside = [m for m, (dr, dc) in _MOVES.items() if 0 <= r + dr < size and 0 <= c + dc < size]
    return f"[{rng.choice(inside)}]"


def _lake_progress(game: Any) -> float:
    gs = game.state.game_state
    (r, c), (gr, gc), size = gs["player_pos"], gs["goal_pos"], len(gs["grid"])
    return 1.0 - (abs(gr - r) + abs(gc - c)) / (2 * (size - 1))


LAKE = GameSpec(
    pattern=re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.I),
    canonical=lambda g: f"[{_WASD.get(g[0].lower(), g[0].lower())}]",
    oracle=lambda game: f"[{(_lake_path(game) or ['down'])[0]}]",
    sample=_lake_sample,
    state_key=lambda game: "{},{}".format(*game.state.game_state["player_pos"]),
    progress=_lake_progress,
    status=lambda game: "",
    turns=lambda game: 2 * len(game.state.game_state["grid"]) + 4,
    goal=lambda game: "walk from p to g around the holes h : reply [up] [down] [left] or [right]",
)


# ------------------------------------------------------------------- Minesweeper
def _mine_cells(game: Any) -> list[tuple[int, int]]:
    return [(r, c) for r in range(game.rows) for c in range(game.cols)]


def _mine_oracle(game: Any) -> str:
    """The centre on the first move (mines are placed after it, around a safe start);
    then the first unrevealed cell without a mine next to a revealed one (else any)."""
    if game.first_move:
        return f"[{game.rows // 2} {game.cols // 2}]"
    safe = [
        (r, c) for r, c in _mine_cells(game) if not game.revealed[r][c] and game.grid[r][c] != -1
    ]

    def frontier(rc: tuple[int, int]) -> bool:
        r, c = rc
        return any(
            game.revealed[r + dr][c + dc]
            for dr in (-1, 0, 1)
            for dc in (-1, 0, 1)
            if 0 <= r + dr < game.rows and 0 <= c + dc < game.cols
        )

    r, c = next((rc for rc in safe if frontier(rc)), safe[0] if safe else (0, 0))
    return f"[{r} {c}]"


def _mine_sample(game: Any, rng: random.Random) -> str:
    hidden = [(r, c) for r, c in _mine_cells(game) if not game.revealed[r][c]] or [(0, 0)]
    r, c = rng.choice(hidden)
    return f"[{r} {c}]"


def _mine_progress(game: Any) -> float:
    safe = game.rows * game.cols - game.num_mines
    shown = sum(game.revealed[r][c] for r, c in _mine_cells(game))
    return min(1.0, shown / max(1, safe))


MINES = GameSpec(
    pattern=re.compile(r"\[\s*([0-9]{1,3})\s*[ ,]?\s*([0-9]{1,3})\s*\]"),
    canonical=lambda g: f"[{int(g[0])} {int(g[1])}]",
    oracle=_mine_oracle,
    sample=_mine_sample,
    state_key=lambda game: "/".join(
        "".join("1" if v else "0" for v in row) for row in game.revealed
    ),
    progress=_mine_progress,
    status=lambda game: "",
    turns=lambda game: game.rows * game.cols,
    goal=lambda game: "reveal every cell without a mine : reply [row col]",
)

#: Game families with their own parsing, oracle, state key and progress (the part of a
#: TextArena id before ``-v``); every other single-player game is played through
#: :data:`GENERIC`. :func:`register_game` adds one (your own oracle or vocabulary).
GAMES: dict[str, GameSpec] = {
    "GuessTheNumber": GUESS,
    "TowerOfHanoi": HANOI,
    "FrozenLake": LAKE,
    "Minesweeper": MINES,
}

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _generic_state_key(game: Any) -> str:
    """A digest of the game's state dict (TextArena keeps a game's whole state there);
    object addresses are left out so that a restored copy has the same key."""
    text = _ADDRESS.sub("", repr(getattr(game.state, "game_state", None)))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


#: Any other single-player TextArena game: the first bracketed move of the reply is
#: handed to the game (``[ 1 2 3 ]`` as ``[1 2 3]``), which parses and judges it with
#: its own rules; no oracle, no plausible actor, progress 0 until won.
GENERIC = GameSpec(
    pattern=re.compile(r"\[([^\[\]\n]{1,200})\]"),
    canonical=lambda g: "[" + " ".join(g[0].split()) + "]",
    oracle=None,
    sample=None,
    state_key=_generic_state_key,
    progress=lambda game: 0.0,
    status=lambda game: "",
    turns=lambda game: int(getattr(game.state, "max_turns", None) or DEFAULT_TURNS),
    goal=lambda game: "win the game by its rules : reply with one move in square brackets",
)

#: The turn limit of a game that sets none (2048, Blackjack, PegJump, RushHour, ...).
DEFAULT_TURNS = 50


def register_game(family: str, **fields: Any) -> GameSpec:
    """Play TextArena game ``family`` (``"Mastermind"``) with your own parts: any field
    of :class:`GameSpec` (``oracle``, ``sample``, ``vocabulary``, ``pattern`` with
    ``canonical``, ``state_key``, ``progress``, ``status``, ``turns``, ``goal``); the
    others are :data:`GENERIC`'s. Call it in a module that ``$CREDO_ENV_MODULES`` names
    (or that your ``--env module:...`` imports) so that it runs before the env is built::

        # my_oracles.py
        from credo.envs.textarena_env import register_game
        register_game("Mastermind", oracle=my_mastermind_oracle)

        CREDO_ENV_MODULES=my_oracles credo train --env textarena:Mastermind-v0
    """
    unknown = set(fields) - {f for f in GameSpec.__dataclass_fields__}
    if unknown:
        raise ValueError(
            f"register_game({family!r}): unknown fields {sorted(unknown)}; valid: "
            f"{', '.join(GameSpec.__dataclass_fields__)}"
        )
    spec = GameSpec(**{**GENERIC.__dict__, **fields})
    GAMES[family] = spec
    return spec


def _family(game_id: str) -> str:
    return game_id.split("-v", 1)[0]


def _raw_id(game_id: str) -> str:
    """The registered variant without LLM wrappers: ``<id>-raw``."""
    for suffix in ("-raw", "-train"):
        if game_id.endswith(suffix):
            game_id = game_id[: -len(suffix)]
    return game_id + "-raw"


@register_env("textarena")
class TextArenaEnv:
    """A TextArena single-player game (see the module docstring).

    Args:
        game: a TextArena id of a supported family (default ``GuessTheNumber-v0``).
        max_turns: credo's turn limit, counting moves the game rejects (default: the
            game's own limit; FrozenLake ``2·size + 4``, Minesweeper ``rows·cols``).
        reward: ``"success"`` (0/1, default) or ``"game"`` (TextArena's final reward).
        instruction: ``"game"`` (the game's own prompt, default) or ``"short"`` (one line:
            the goal and the move format; cheaper prompts for small models).
        error_allowance: invalid moves in a row a game forgives (default: the game's
            own, 1: a second invalid move in a row ends it).
    """

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        *,
        max_turns: int | None = None,
        reward: str = "success",
        instruction: str = "game",
        error_allowance: int | None = None,
    ) -> None:
        self.spec = GAMES.get(_family(game), GENERIC)
        if reward not in ("success", "game"):
            raise ValueError(f"textarena reward must be 'success' or 'game', got {reward!r}")
        if instruction not in ("game", "short"):
            raise ValueError(
                f"textarena instruction must be 'game' or 'short', got {instruction!r}"
            )
        self.instruction_kind = instruction
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"textarena max_turns must be a positive integer, got {max_turns!r}")
        try:
            import textarena
        except ImportError:
            raise missing_package("textarena", "textarena", "textarena") from None
        self._ta = textarena
        self.game_id = game
        self._raw = _raw_id(game)
        if self._raw not in textarena.envs.registration.ENV_REGISTRY:
            raise ValueError(f"textarena has no game {game!r} (looked for {self._raw!r})")
        self.reward_kind = reward
        self._max_turns = max_turns
        if error_allowance is not None and (
            isinstance(error_allowance, bool)
            or not isinstance(error_allowance, int)
            or error_allowance < 0
        ):
            raise ValueError(
                f"textarena error_allowance must be an integer >= 0, got {error_allowance!r}"
            )
        self.error_allowance = error_allowance
        probe = self._probe(textarena, game)
        self.max_turns = max_turns or self.spec.turns(probe)
        self.task: Task | None = None
        self._game: Any = probe
        self._rng_state: Any = None
        self._turn = 0
        self._done = self._won = False
        self._prompt = ""
        if self.spec.oracle is not None:  # offered only when the game has one
            self.oracle_action = self._oracle_action
            self.privileged_context = self._privileged_context
        if self.spec.sample is not None:
            self.sample_action = self._sample_action

    def _probe(self, textarena: Any, game: str) -> Any:
        """The game reset once (seed 0), or one line on why it cannot be played here: it
        needs a download (NLTK's word lists), an API key or several players."""
        needs = _downloads(textarena, self._raw)
        if needs:
            raise ValueError(
                f"textarena game {game!r} needs {needs}, which TextArena fetches from the "
                "internet when the game is built; credo never downloads at run time, so it "
                "cannot be played here"
            )
        try:
            probe = textarena.make(self._raw)
            with self._random(random.Random(0).getstate()), _quiet():
                probe.reset(num_players=1, seed=0)
        except LookupError as exc:  # nltk: "Resource 'words' not found"
            found = re.search(r"Resource '?(\w+)'? not found", str(exc))
            what = f"NLTK's {found[1]!r} data" if found else "data"
            raise ValueError(
                f"textarena game {game!r} needs {what}, which TextArena downloads at run time "
                "and credo never does: it cannot be played offline"
            ) from None
        except Exception as exc:
            first = " ".join(str(exc).split())[:200]
            raise ValueError(
                f"textarena game {game!r} cannot be played as a single-player game offline: "
                f"{type(exc).__name__}: {first}"
            ) from None
        if type(probe.state).__name__ != "SinglePlayerState":
            raise ValueError(
                f"textarena game {game!r} is a {type(probe.state).__name__} game, not a "
                "single-player one; credo plays TextArena's single-player games"
            )
        return probe

    # ------------------------------------------------------------ randomness
    @contextmanager
    def _random(self, state: Any = None) -> Iterator[None]:
        """Run a call into the game with this env's own state of the global ``random``
        (``state``, else the one kept since the last call), and keep what it leaves."""
        with _RANDOM_LOCK:
            outside = random.getstate()
            random.setstate(state if state is not None else self._rng_state)
            try:
                yield
            finally:
                self._rng_state = random.getstate()
                random.setstate(outside)

    # ------------------------------------------------------------ protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        """Build the game from ``task.seed`` (``seed`` is unused)."""
        self.task = task
        self._game = self._ta.make(self._raw)
        with self._random(random.Random(task.seed).getstate()), _quiet():
            self._game.reset(num_players=1, seed=task.seed)
        if self.error_allowance is not None:
            self._game.state.error_allowance = self.error_allowance
        self._turn, self._done, self._won = 0, False, False
        messages = self._drain()
        self._prompt = "\n".join(m for kind, m in messages if kind == "PROMPT")
        return self._render([m for kind, m in messages if kind in _SHOWN])

    def instruction(self) -> str:
        """The game's own prompt (its rules and the move format), or with
        ``instruction="short"`` one line: the goal and the move format."""
        return self._prompt if self.instruction_kind == "game" else self.spec.goal(self._game)

    def _drain(self) -> list[tuple[str, str]]:
        """The game's messages to the player since the last call: (type name, text)."""
        _, obs = self._game.get_observation()
        return [(getattr(kind, "name", str(kind)), str(text)) for _, text, kind in obs]

    def _render(self, messages: list[str]) -> str:
        status = self.spec.status(self._game) if not self._done else ""
        text = "\n".join([*messages, *([status] if status else [])]).strip()
        return text[:MAX_OBSERVATION_CHARS]

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        move = self.spec.parse(action)
        state = self._game.state
        errors = state.error_count
        with self._random(), _quiet():
            game_done, _ = self._game.step(move if move is not None else "")
        self._turn += 1
        valid = (
            move is not None
            and state.error_count <= errors
            and not state.game_info[0].get("invalid_move", False)
        )
        messages = [m for kind, m in self._drain() if kind in _SHOWN]
        info: dict[str, Any] = {"valid": valid, "move": move}
        reward = 0.0
        if game_done or self._turn >= self.max_turns:
            self._done = True
            rewards, game_info = self._game.close()
            final = _number(rewards.get(0, 0.0)) if game_done else 0.0
            success = self._won = bool(game_done and final >= 1.0)
            reason = game_info.get(0, {}).get("reason") if game_done else "turn limit reached"
            if reason:
                messages.append(str(reason))
            reward = float(success) if self.reward_kind == "success" else final
            info.update(success=success, turns=self._turn, game_reward=final)
        return StepResult(self._render(messages), reward, self._done, info)

    def state_key(self) -> str:
        """The game state (GuessTheNumber: the range left; Hanoi: the towers; FrozenLake:
        the position; Minesweeper: the revealed cells), plus ``done`` at the end."""
        key = self.spec.state_key(self._game)
        return f"done|{key}" if self._done else key

    def abstract_state_key(self) -> str:
        """Progress in tenths (a coarse stage for ProAS)."""
        return f"{int(10 * self.progress())}"

    def progress(self) -> float:
        """The game's progress in [0, 1] (1 once won)."""
        return 1.0 if self._won else max(0.0, min(1.0, float(self.spec.progress(self._game))))

    def snapshot(self) -> tuple[Any, ...]:
        return (copy.deepcopy(self._game), self._rng_state, self._turn, self._done, self._won)

    def restore(self, snap: tuple[Any, ...]) -> None:
        game, self._rng_state, self._turn, self._done, self._won = snap
        self._game = copy.deepcopy(game)

    # ------------------------------------------------------------ helpers
    # bound in __init__ as oracle_action / sample_action / privileged_context when the
    # game's spec has an oracle (a plausible actor)
    def _oracle_action(self) -> str:
        """A correct next move (see the module docstring)."""
        if self._done:
            raise RuntimeError("the episode is over")
        return self.spec.oracle(self._game)  # type: ignore[misc]

    def _sample_action(self, rng: random.Random) -> str:
        """A random plausible move (legal-looking; it may still lose)."""
        if self._done:
            raise RuntimeError("the episode is over")
        return self.spec.sample(self._game, rng)  # type: ignore[misc]

    def _privileged_context(self, kind: str) -> str | None:
        """``"oracle"``: the oracle's move; other kinds are not offered."""
        return self._oracle_action() if kind == "oracle" and not self._done else None

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """Every seed of one game id is a task of the same structure: a fresh seed."""
        return Task("train", find_variant_seed(rng, lambda s: True))

    def task_difficulty(self) -> str:
        return self.game_id

    def action_format(self) -> str:
        return (
            "Reply with exactly one move in square brackets, as the game's instructions "
            "show (e.g. [7], [A C], [up], [3 2])."
        )

    def vocabulary(self) -> list[str]:
        """Every word of the game's prompts, messages and moves, collected once per game
        id from oracle and random episodes on a few seeds (cached)."""
        return list(_vocabulary(self.game_id, self._max_turns, self.instruction_kind))


_VOCAB: dict[tuple[str, int | None, str], tuple[str, ...]] = {}


def _number(reward: Any) -> float:
    """A game's final reward as a number. Some games (Countdown, Cryptarithm, Slitherlink,
    ThreeCardMonte in textarena 0.7.4) call ``set_invalid_move(progress, reason)`` with
    the arguments swapped, leaving the reason text as the reward of a game lost by invalid
    moves: that is a loss, reward 0."""
    try:
        return float(reward)
    except (TypeError, ValueError):
        return 0.0


#: What a game's source uses that is fetched from the internet when the game is built
#: (found by reading the source, so the download never starts).
_DOWNLOADERS = {
    "nltk": "NLTK data (word lists, a tagger)",
    "EnglishDictionary": "NLTK's word lists",
    "OPENROUTER_API_KEY": "an OpenRouter API key (an LLM opponent or judge)",
}


def _downloads(textarena: Any, raw_id: str) -> str | None:
    """What game ``raw_id``'s module fetches from the internet when it is imported or
    built, read from its source file without importing it; ``None`` when nothing."""
    from pathlib import Path

    entry = textarena.envs.registration.ENV_REGISTRY[raw_id].entry_point
    module = entry.split(":", 1)[0] if isinstance(entry, str) else ""
    if not module.startswith("textarena."):
        return None
    path = Path(textarena.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    source = path.read_text(errors="replace") if path.is_file() else ""
    return next((what for marker, what in _DOWNLOADERS.items() if marker in source), None)


@contextmanager
def _quiet() -> Iterator[None]:
    """Some games print to stdout (boards, debug lines): credo's output is its own."""
    import io
    from contextlib import redirect_stdout

    with redirect_stdout(io.StringIO()):
        yield


def _vocabulary(game_id: str, max_turns: int | None, instruction: str) -> tuple[str, ...]:
    key = (game_id, max_turns, instruction)
    if key not in _VOCAB:
        env = TextArenaEnv(game_id, max_turns=max_turns, instruction=instruction)
        words: set[str] = set()
        rng = random.Random(0)
        oracle, sample = env.spec.oracle is not None, env.spec.sample is not None
        for seed in range(12):
            words.update(env.reset(Task("train", seed)).lower().split())
            words.update(env.instruction().lower().split())
            if env.spec.vocabulary is not None:
                words.update(w.lower() for w in env.spec.vocabulary(env._game))
            if not (oracle or sample):  # a generic game: its prompts and boards only
                continue
            for _ in range(env.max_turns):
                use_oracle = oracle and (seed % 2 == 0 or not sample)
                action = env._oracle_action() if use_oracle else env._sample_action(rng)
                words.update(action.lower().replace("[", " [ ").replace("]", " ] ").split())
                res = env.step(action)
                words.update(res.observation.lower().split())
                if res.done:
                    break
        words.update(str(n) for n in range(0, 101))
        words.update(["[", "]", "a", "b", "c", "up", "down", "left", "right"])
        _VOCAB[key] = tuple(sorted(words))
    return _VOCAB[key]


register_env_scheme("textarena", lambda game: lambda **kw: TextArenaEnv(game, **kw))
