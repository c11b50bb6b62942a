"""``sokoban``: Sokoban rooms from the ``gym-sokoban`` generator, rendered as text the way
RAGEN and verl-agent render them.

Sokoban is the grid puzzle of RAGEN (Wang et al., 2025, https://arxiv.org/abs/2504.20073)
and verl-agent / GiGPO (Feng et al., 2025, https://arxiv.org/abs/2505.10978): the agent
(``P``) pushes every box (``X``) onto a target (``O``); a box moves when the agent walks
into it and the cell behind it is free, and a box pushed into a corner is stuck for good,
so one careless move loses the episode: the credit problem in its plainest form.

**Rooms** come from ``gym-sokoban`` (Schrader, https://github.com/mpSchrader/gym-sokoban),
the generator RAGEN's and verl-agent's envs descend from: its ``generate_room`` draws a
room topology by a random walk, places targets and the player, then plays *in reverse*
(pulling boxes away from their targets) and keeps the placement whose boxes moved
farthest, so every room is solvable. credo calls that function itself with the
package's defaults (``num_steps = 1.7 × (width + height)`` reverse-play steps,
``p_change_directions = 0.35``); the package's gym env is not used (it needs the
retired ``gym`` and ``pkg_resources``): credo plays the rules below on the generated
room. Install it with ``pip install --no-deps gym-sokoban==0.0.6`` (the generator needs
only numpy); without it the env refuses to start with one line saying so. The
generator draws from Python's and numpy's global random states: credo seeds both from
``task.seed`` around the call (under a lock, and puts them back), so a task is one room
on every machine, and train and held-out rooms never share a seed.

**Text** (RAGEN's and verl-agent's grid symbols, one symbol per cell, separated by
spaces so each is one token)::

    # # # # # #        #  wall         O  target        X  box
    # _ _ _ # #        _  floor        √  box on target
    # _ P X O #        P  player       S  player on a target
    # # # # # #

followed by ``boxes on targets : k / n``. **Actions**: ``up``, ``down``, ``left``,
``right`` (any case; the first such word of the reply counts, as RAGEN reads its answer);
anything else is an invalid action (``info["valid"] = False``; the turn is spent,
nothing moves). Walking into a wall or an unmovable box is a valid move that changes
nothing (as in gym-sokoban).

**Reward**: ``reward="success"`` (default): 1 on the step that puts the last box on a
target, else 0. ``reward="sokoban"``: gym-sokoban's shaped reward (−0.1 per step, +1 for
a box pushed onto a target, −1 for one pushed off, +10 when all are on), the reward
RAGEN trains with. Success is all boxes on targets within ``max_turns`` moves (default
15).

**Oracle and progress**: ``oracle_action()`` is the first move of a shortest solution
from the current state (a breadth-first search over player and box positions, capped at
:data:`MAX_SEARCH_STATES` states, ample for 6×6 to 8×8 rooms with up to 3 boxes); from a
state with no solution (a stuck box) it is a move that changes nothing.
``progress()`` is the share of boxes on targets; ``abstract_state_key()`` (ProAS's
stage) is ``k/n`` boxes on targets, or ``off`` once the room cannot be solved.
"""

from __future__ import annotations

import importlib.util
import random
import re
import threading
from collections import OrderedDict, deque
from pathlib import Path
from types import ModuleType
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env
from credo.envs.thirdparty import MissingPackage

__all__ = ["MAX_SEARCH_STATES", "MOVES", "SYMBOLS", "Room", "SokobanEnv", "solve"]

#: The moves and their (row, column) steps, in gym-sokoban's order.
MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
#: RAGEN's and verl-agent's grid symbols.
SYMBOLS = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box_on_target": "√",
    "box": "X",
    "player": "P",
    "player_on_target": "S",
}
#: The solver gives up (no plan) beyond this many visited states.
MAX_SEARCH_STATES = 200_000
#: Rooms kept per env (the most recently used seeds).
ROOM_CACHE = 1024
#: Only this many leading characters of an action are read.
MAX_ACTION_CHARS = 200
_MOVE_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_GENERATOR_LOCK = threading.Lock()
_room_utils: ModuleType | None = None

Cell = tuple[int, int]


def _generator() -> ModuleType:
    """gym-sokoban's ``room_utils`` module, loaded from the installed package's file
    without running the package's ``__init__`` (which imports the retired ``gym`` and
    ``pkg_resources``; the generator needs neither)."""
    global _room_utils
    if _room_utils is None:
        spec = importlib.util.find_spec("gym_sokoban")
        if spec is None or not spec.submodule_search_locations:
            raise MissingPackage(
                "env 'sokoban' needs the 'gym-sokoban' package (its room generator), which is "
                "not installed: pip install --no-deps gym-sokoban==0.0.6"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"
        module_spec = importlib.util.spec_from_file_location("credo_gym_sokoban_rooms", path)
        if module_spec is None or module_spec.loader is None or not path.is_file():
            raise MissingPackage(f"env 'sokoban': gym-sokoban has no room generator at {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        _room_utils = module
    return _room_utils


class Room:
    """A room's fixed layout: walls and targets (the movable parts are the state)."""

    def __init__(self, walls: frozenset[Cell], targets: frozenset[Cell], shape: Cell) -> None:
        self.walls, self.targets, self.shape = walls, targets, shape

    def free(self, cell: Cell, boxes: frozenset[Cell]) -> bool:
        return cell not in self.walls and cell not in boxes

    def move(self, player: Cell, boxes: frozenset[Cell], move: str) -> tuple[Cell, frozenset[Cell]]:
        """The state after ``move`` (unchanged when a wall or an unmovable box is in the
        way)."""
        dr, dc = MOVES[move]
        ahead = (player[0] + dr, player[1] + dc)
        if ahead in self.walls:
            return player, boxes
        if ahead in boxes:
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if not self.free(beyond, boxes):
                return player, boxes
            return ahead, (boxes - {ahead}) | {beyond}
        return ahead, boxes


def solve(room: Room, player: Cell, boxes: frozenset[Cell]) -> list[str] | None:
    """A shortest move sequence that puts every box on a target (``[]`` if they are),
    by breadth-first search; ``None`` if there is none (or more than
    :data:`MAX_SEARCH_STATES` states were visited)."""
    if boxes <= room.targets:
        return []
    parents: dict[tuple[Cell, frozenset[Cell]], tuple[Any, str] | None] = {(player, boxes): None}
    queue = deque([(player, boxes)])
    while queue:
        state = queue.popleft()
        for name in MOVES:
            nxt = room.move(*state, name)
            if nxt in parents:
                continue
            parents[nxt] = (state, name)
            if nxt[1] <= room.targets:
                plan, node = [], nxt
                while parents[node] is not None:
                    node, move = parents[node]  # type: ignore[misc]
                    plan.append(move)
                return plan[::-1]
            if len(parents) > MAX_SEARCH_STATES:
                return None
            queue.append(nxt)
    return None


@register_env("sokoban")
class SokobanEnv:
    """Sokoban (see the module docstring).

    Args:
        size: the room's side (default 6: 6×6 with the outer wall, as RAGEN and
            verl-agent's default); ``width``/``height`` for non-square rooms.
        boxes: the number of boxes (default 1).
        max_turns: the move limit (default 15).
        reward: ``"success"`` (0/1, default) or ``"sokoban"`` (gym-sokoban's shaped
            reward).
        num_steps: the generator's reverse-play steps (default gym-sokoban's
            ``1.7 × (width + height)``).
        coordinates: add a line with the player's, boxes' and targets' row and column
            (default false: the grid alone, as RAGEN and verl-agent show it). For the
            built-in word-level model: its tokenizer drops line breaks, so the grid's rows
            run together and "above" is six tokens back.
    """

    def __init__(
        self,
        size: int = 6,
        *,
        width: int | None = None,
        height: int | None = None,
        boxes: int = 1,
        max_turns: int = 15,
        reward: str = "success",
        num_steps: int | None = None,
        coordinates: bool = False,
    ) -> None:
        width, height = width or size, height or size
        for name, value, low in (("size", width, 5), ("size", height, 5), ("boxes", boxes, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"sokoban {name} must be an integer >= {low}, got {value!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"sokoban max_turns must be a positive integer, got {max_turns!r}")
        if reward not in ("success", "sokoban"):
            raise ValueError(f"sokoban reward must be 'success' or 'sokoban', got {reward!r}")
        _generator()  # a missing package is refused before any episode
        self.shape = (height, width)
        self.num_boxes = boxes
        self.max_turns = max_turns
        self.reward_kind = reward
        self.num_steps = num_steps or int(1.7 * (width + height))
        self.coordinates = bool(coordinates)
        self.task: Task | None = None
        self.room = Room(frozenset(), frozenset(), self.shape)
        self.player: Cell = (0, 0)
        self.boxes: frozenset[Cell] = frozenset()
        self._turn, self._done = 0, False
        # rooms of recent seeds (a group replays its room; the cache is bounded, since a
        # run draws up to rollout.train_tasks seeds)
        self._rooms: OrderedDict[int, tuple[Room, Cell, frozenset[Cell]]] = OrderedDict()

    # ------------------------------------------------------------ generation
    def _generate(self, seed: int) -> tuple[Room, Cell, frozenset[Cell]]:
        """The room of ``seed`` (gym-sokoban's ``generate_room`` under seeded global
        random states; a draw the generator rejects is retried with the next attempt's
        seed)."""
        if seed in self._rooms:
            self._rooms.move_to_end(seed)
            return self._rooms[seed]
        gen = _generator()
        import numpy as np

        with _GENERATOR_LOCK:
            py_state, np_state = random.getstate(), np.random.get_state()
            try:
                for attempt in range(100):
                    mixed = random.Random(f"sokoban|{seed}|{attempt}").getrandbits(32)
                    random.seed(mixed)
                    np.random.seed(mixed)
                    try:
                        fixed, state, _ = gen.generate_room(
                            dim=self.shape, num_steps=self.num_steps, num_boxes=self.num_boxes
                        )
                        break
                    except (RuntimeError, RuntimeWarning):
                        continue
                else:  # pragma: no cover - the generator accepts far sooner
                    raise RuntimeError(f"sokoban: no room generated for seed {seed}")
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)
        cells = [(r, c) for r in range(self.shape[0]) for c in range(self.shape[1])]
        walls = frozenset(rc for rc in cells if fixed[rc] == 0)
        targets = frozenset(rc for rc in cells if fixed[rc] == 2)
        boxes = frozenset(rc for rc in cells if state[rc] in (3, 4))
        player = next(rc for rc in cells if state[rc] == 5)
        self._rooms[seed] = (Room(walls, targets, self.shape), player, boxes)
        if len(self._rooms) > ROOM_CACHE:
            self._rooms.popitem(last=False)
        return self._rooms[seed]

    # ------------------------------------------------------------ protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        """The room of ``task.seed`` (``seed`` is unused)."""
        self.task = task
        self.room, self.player, self.boxes = self._generate(task.seed)
        self._turn, self._done = 0, False
        return self._render()

    def instruction(self) -> str:
        return (
            "push every box ( X ) onto a target ( O ) . you are P ( S when you stand on a "
            "target ) , # is a wall , _ is floor , √ is a box on a target . walking into a box "
            "pushes it when the cell behind it is free ; a box in a corner is stuck . reply "
            "with one move : up , down , left or right ."
        )

    def action_format(self) -> str:
        return "Reply with exactly one move: up, down, left or right."

    def _on_target(self) -> int:
        return len(self.boxes & self.room.targets)

    def _render(self) -> str:
        rows = []
        for r in range(self.shape[0]):
            row = []
            for c in range(self.shape[1]):
                cell = (r, c)
                target = cell in self.room.targets
                if cell in self.room.walls:
                    row.append(SYMBOLS["wall"])
                elif cell == self.player:
                    row.append(SYMBOLS["player_on_target" if target else "player"])
                elif cell in self.boxes:
                    row.append(SYMBOLS["box_on_target" if target else "box"])
                else:
                    row.append(SYMBOLS["target" if target else "floor"])
            rows.append(" ".join(row))
        text = "\n".join(rows) + f"\nboxes on targets : {self._on_target()} / {self.num_boxes}"
        if self.coordinates:
            text += "\n" + self._coordinates()
        return text

    def _coordinates(self) -> str:
        """``player row 2 col 1 ; box row 2 col 2 ; target row 3 col 4`` (rows and
        columns from 0, boxes and targets in reading order)."""

        def at(name: str, cell: Cell) -> str:
            return f"{name} row {cell[0]} col {cell[1]}"

        parts = [at("player", self.player)]
        parts += [at("box", b) for b in sorted(self.boxes)]
        parts += [at("target", t) for t in sorted(self.room.targets)]
        return " ; ".join(parts)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        self._turn += 1
        found = _MOVE_WORD.search(action[:MAX_ACTION_CHARS])
        before = self._on_target()
        if found is None:
            text = "invalid action : reply up , down , left or right .\n" + self._render()
            valid = False
        else:
            self.player, self.boxes = self.room.move(self.player, self.boxes, found[1].lower())
            text, valid = self._render(), True
        solved = self.boxes <= self.room.targets
        self._done = solved or self._turn >= self.max_turns
        if self.reward_kind == "sokoban":  # gym-sokoban's shaped reward
            reward = -0.1 + (self._on_target() - before) + (10.0 if solved else 0.0)
        else:
            reward = float(solved)
        info: dict[str, Any] = {"valid": valid, "boxes_on_targets": self._on_target()}
        if self._done:
            info.update(success=solved, turns=self._turn)
        return StepResult(text, reward, self._done, info)

    def state_key(self) -> str:
        """The player's and the boxes' cells (the room is the task's); ``done|`` once over."""
        boxes = ",".join(f"{r}.{c}" for r, c in sorted(self.boxes))
        key = f"p{self.player[0]}.{self.player[1]}|b{boxes}"
        return f"done|{key}" if self._done else key

    def abstract_state_key(self) -> str:
        """``k/n`` boxes on targets, or ``off`` once the room cannot be solved."""
        if solve(self.room, self.player, self.boxes) is None:
            return "off"
        return f"{self._on_target()}/{self.num_boxes}"

    def progress(self) -> float:
        return self._on_target() / self.num_boxes

    def snapshot(self) -> tuple[Any, ...]:
        return (self.task, self.room, self.player, self.boxes, self._turn, self._done)

    def restore(self, snap: tuple[Any, ...]) -> None:
        self.task, self.room, self.player, self.boxes, self._turn, self._done = snap

    def oracle_action(self) -> str:
        """The first move of a shortest solution; from an unsolvable state, a move that
        changes nothing (or ``up``)."""
        plan = solve(self.room, self.player, self.boxes)
        if plan:
            return plan[0]
        for name in MOVES:
            if self.room.move(self.player, self.boxes, name) == (self.player, self.boxes):
                return name
        return "up"

    def sample_action(self, rng: random.Random) -> str:
        return rng.choice(list(MOVES))

    def privileged_context(self, kind: str) -> str | None:
        return self.oracle_action() if kind == "oracle" else None

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """Another room of the same size and box count: a fresh seed."""
        return Task("train", find_variant_seed(rng, lambda s: True))

    def task_difficulty(self) -> str:
        return f"{self.shape[0]}x{self.shape[1]}-{self.num_boxes}box"

    def vocabulary(self) -> list[str]:
        words = {w.lower() for w in SYMBOLS.values()} | set(MOVES)
        words |= set(self.instruction().split())
        words |= {"boxes", "on", "targets", ":", "/", "invalid", "action", "reply", ",", "or", "."}
        words |= {str(i) for i in range(max(self.num_boxes + 1, *self.shape))}
        words |= {"player", "box", "target", "row", "col", ";"}
        return sorted(words)
