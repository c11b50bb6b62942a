"""``shop``: a WebShop-like store generated from a seed.

Each task builds a small catalog of products (category, colour, material, price, sizes
in stock) around one or more goal items, and an instruction such as::

    buy a red wool scarf in size m for at most $40

Pages and actions (the action grammar is strict, see :func:`parse_action`; anything
else, or any action longer than :data:`MAX_ACTION_CHARS` characters, is an invalid
action, answered with a message and counted as a turn)::

    home     search[words]   rank products by BM25 over their titles → results
    results  click[k]        open the k-th result (by rank on screen) → item
             back            → home
    item     choose[size]    pick a size in stock (stays on the item page)
             buy             put the item with its chosen size in the cart; the
                             episode ends when the cart holds as many items as the
                             instruction asks for (else → home)
             back            → results

Reward (WebShop's idea): each goal item is scored by the fraction of its requirements
the bought item meets (category, each named attribute, size, price within budget);
``score`` is the mean over goals (best matching of cart items to goals) and ``success``
means every requirement of every goal is met. The reward given at the last step is
chosen by ``reward``: ``"success"`` (0/1), ``"partial"`` (the score) or ``"mixed"``
(``(success + partial_weight·score)/(1 + partial_weight)``, the default: success-focused
with a little partial credit, which a CPU-sized model learns from best).

With several items (``n_items > 1``, the ``multi`` preset) the task is a shopping list:
``instruction()`` is its next item (k = items in the cart + 1; it changes after each
``buy``, and credo asks for it before every prompt) and every page starts with
``item k of n ;``. Scoring matches cart items to goals in the best order.

Distractors make the oracle need every skill: products with the goal's exact title but
over budget (the budget must be read), products one attribute away (the query must be
copied from the instruction), and in ``multi`` difficulty products with the right title and
price that lack the size (the sizes must be checked on the item page).

Difficulty presets (``difficulty=``) set the knobs below; any knob given explicitly
overrides its preset value.

The optional tool (``tools=True``, config ``env.kwargs.tools=on``; off by default, and
then the shop is exactly as without it): on a results page the bare action ``lookup``
answers ``lookup : result k fits .`` (the first shown result whose title, price and
sizes fit the current goal) or ``lookup : no result fits .``, above the same page; it
costs a turn. Everything it reveals except the sizes can be read off the page (titles
and prices against the instruction), so a policy can learn to do without it: the
SpatialCLI pipeline (``pipelines/spatialcli.yaml``, :mod:`credo.pipeline.internalise`)
trains with it, then removes its calls. With tools off, ``lookup`` is not an action (the
usual invalid-action message). The oracle uses the tool when it is on.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
from dataclasses import dataclass, replace
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env

__all__ = [
    "CATEGORIES",
    "COLORS",
    "DIFFICULTIES",
    "MATERIALS",
    "MAX_ACTION_CHARS",
    "MAX_QUERY_KEY_CHARS",
    "MAX_REPLY_CHARS",
    "SIZES",
    "TOOL_VERB",
    "ShopEnv",
    "parse_action",
]

CATEGORIES = (
    "scarf",
    "shirt",
    "shoes",
    "hat",
    "jacket",
    "bag",
    "dress",
    "socks",
    "gloves",
    "belt",
    "sweater",
    "pants",
)
COLORS = ("red", "blue", "green", "black", "white", "grey", "brown", "pink", "yellow", "purple")
MATERIALS = ("wool", "cotton", "leather", "silk", "denim", "linen", "nylon", "suede")
SIZES = ("xs", "s", "m", "l", "xl")
PRICES = tuple(range(5, 101, 5))
ATTRIBUTES = ("color", "material")

#: Difficulty presets. ``default`` is what ``credo train`` uses.
DIFFICULTIES: dict[str, dict[str, Any]] = {
    "easy": dict(
        catalog_size=20,
        price_distractors=1,
        near_distractors=2,
        size_distractors=0,
        n_items=1,
        max_turns=8,
    ),
    "default": dict(
        catalog_size=40,
        price_distractors=2,
        near_distractors=4,
        size_distractors=0,
        n_items=1,
        max_turns=8,
    ),
    "hard": dict(
        catalog_size=80,
        price_distractors=3,
        near_distractors=6,
        size_distractors=1,
        n_items=1,
        max_turns=10,
    ),
    "multi": dict(
        catalog_size=60,
        price_distractors=2,
        near_distractors=4,
        size_distractors=1,
        n_items=2,
        max_turns=16,
    ),
}

#: Longer actions are invalid ("action longer than ... characters"), before any parsing.
#: Model actions are a few words (16 tokens for the built-in model, 48 for chat models).
MAX_ACTION_CHARS = 1000
#: What :meth:`ShopEnv.abstract_state_key` tells apart (``goal``: progress toward this task's
#: goal, ``off`` otherwise; ``stage``: the page only).
ABSTRACT_STATES = ("goal", "stage")
#: :meth:`ShopEnv.extract_action` reads at most this many characters of a reply (a chat
#: reply is a few hundred; the regex searches cost ~0.1 s per million characters).
MAX_REPLY_CHARS = 100_000
#: A search query longer than this (its sorted words joined) appears in ``state_key()`` as
#: ``#`` + a 32-hex-digit digest, so keys stay short; ordinary queries are a few words.
MAX_QUERY_KEY_CHARS = 256

_ARG_VERBS = ("search", "click", "choose")
_BARE_VERBS = ("back", "buy", "lookup")
#: The optional tool's verb (an action only with ``tools`` on).
TOOL_VERB = "lookup"
_WORD_RE = re.compile(r"[a-z0-9]+")
_FIND_BRACKETED = re.compile(r"\b(search|click|choose)\s*\[[^\[\]]*\]", re.I)
# a line that is just back/buy (optionally after "action"); [^\w\n] keeps every attempt
# inside one line, so the search is linear in the text (a \W* spanning lines was quadratic)
_FIND_BARE = re.compile(r"^[^\w\n]*(?:action[^\w\n]*)?(back|buy)[^\w\n]*$", re.I | re.M)
_FIND_TOOL = re.compile(r"^[^\w\n]*(?:action[^\w\n]*)?(lookup)[^\w\n]*$", re.I | re.M)


def parse_action(text: str) -> tuple[str, str] | None:
    """``"click [ 2 ]"`` → ``("click", "2")``; ``"buy"`` → ``("buy", "")``; else ``None``
    (``"lookup"`` parses too; :meth:`ShopEnv.step` refuses it unless ``tools`` is on).

    Whitespace around brackets is allowed (a word-level tokenizer decodes with spaces);
    anything else around the action is not. The grammar (case-insensitive; whitespace as
    in ``str.isspace``)::

        action := ws* (search|click|choose) ws* "[" ws* arg ws* "]" ws*  |  ws* (back|buy|lookup) ws*

    where ``arg`` is everything between the first ``[`` and the last ``]`` with the
    surrounding whitespace stripped, and holds no line break. Parsed by hand in time
    linear in ``len(text)`` (a backtracking regex took cubic time on long runs of spaces).
    """
    t = text.lower().strip()
    if t in _BARE_VERBS:
        return t, ""
    for verb in _ARG_VERBS:
        if t.startswith(verb):
            rest = t[len(verb) :].lstrip()
            if not (rest.startswith("[") and rest.endswith("]")):
                return None
            arg = rest[1:-1].strip()
            return None if "\n" in arg else (verb, arg)
    return None


@dataclass(frozen=True)
class Product:
    pid: int
    category: str
    color: str
    material: str
    price: int
    sizes: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"{self.color} {self.material} {self.category}"

    def attr(self, name: str) -> str:
        return getattr(self, name)


@dataclass(frozen=True)
class Goal:
    category: str
    attrs: tuple[tuple[str, str], ...]  # (attribute name, value), in instruction order
    size: str
    budget: int

    def words(self) -> list[str]:
        """The oracle's search query: the named attribute values, then the category."""
        return [v for _, v in self.attrs] + [self.category]

    def text(self) -> str:
        return f"a {' '.join(self.words())} in size {self.size} for at most ${self.budget}"

    def looks_right(self, p: Product) -> bool:
        """What the results page can tell: title and budget fit (sizes are not shown)."""
        return (
            p.category == self.category
            and all(p.attr(k) == v for k, v in self.attrs)
            and p.price <= self.budget
        )

    def matches(self, p: Product) -> bool:
        """``p`` can satisfy this goal (title, budget and size in stock)."""
        return self.looks_right(p) and self.size in p.sizes

    def score(self, p: Product, size: str | None) -> float:
        """Fraction of requirements met by buying ``p`` in ``size``."""
        checks = [p.category == self.category]
        checks += [p.attr(k) == v for k, v in self.attrs]
        checks += [size == self.size, p.price <= self.budget]
        return sum(checks) / len(checks)


@dataclass
class _State:
    page: str = "home"  # home | results | item | done
    query: tuple[str, ...] = ()
    results: tuple[int, ...] = ()
    item: int = -1
    size: str | None = None
    cart: tuple[tuple[int, str | None], ...] = ()
    visited: tuple[int, ...] = ()  # items opened so far (the oracle's memory, not shown)
    turn: int = 0
    message: str = ""
    looked: bool = False  # the optional tool's answer is on screen (tools on only)


@register_env("shop")
class ShopEnv:
    """WebShop-like env (see the module docstring).

    Args:
        difficulty: preset name (``easy``, ``default``, ``hard``, ``multi``).
        catalog_size: products per task.
        results_per_page: results shown after a search (the click ranks).
        price_distractors: products with a goal's exact title priced over its budget.
        near_distractors: products one named attribute away from a goal, within budget.
        size_distractors: products matching a goal's title and budget without its size.
        n_items: goal items per task (the ``multi`` preset uses 2).
        n_attributes: named attributes per goal besides the category (0–2; colour first).
        max_turns: turn limit; reaching it ends the episode (the cart is scored as is).
        reward: ``"mixed"`` (default), ``"success"`` or ``"partial"``.
        partial_weight: weight of the partial score in the ``mixed`` reward.
        abstract_states: ``"goal"`` (default) or ``"stage"``: what
            :meth:`abstract_state_key` tells apart (ProAS's progress states).
        tools: offer the optional ``lookup`` tool (see the module docstring): ``True``
            or ``"on"``, ``False`` or ``"off"`` (default off).
    """

    def __init__(
        self,
        difficulty: str = "default",
        *,
        catalog_size: int | None = None,
        results_per_page: int = 5,
        price_distractors: int | None = None,
        near_distractors: int | None = None,
        size_distractors: int | None = None,
        n_items: int | None = None,
        n_attributes: int = 2,
        max_turns: int | None = None,
        reward: str = "mixed",
        partial_weight: float = 0.2,
        abstract_states: str = "goal",
        tools: bool | str = False,
    ) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(
                f"unknown shop difficulty {difficulty!r}; valid: {', '.join(DIFFICULTIES)}"
            )
        if abstract_states not in ABSTRACT_STATES:
            raise ValueError(
                f"unknown shop abstract_states {abstract_states!r}; valid: "
                + ", ".join(ABSTRACT_STATES)
            )
        self.abstract_states = abstract_states
        if reward not in ("mixed", "success", "partial"):
            raise ValueError(f"unknown shop reward {reward!r}; valid: mixed, success, partial")
        if not 0 <= n_attributes <= len(ATTRIBUTES):
            raise ValueError(f"n_attributes must be in 0..{len(ATTRIBUTES)}, got {n_attributes}")
        if tools not in (True, False, "on", "off"):
            raise ValueError(f"shop tools must be on or off (true/false), got {tools!r}")
        self.tools = tools in (True, "on")
        preset = DIFFICULTIES[difficulty]

        def pick(value: int | None, key: str) -> int:
            return preset[key] if value is None else value

        self.difficulty = difficulty
        self.catalog_size = pick(catalog_size, "catalog_size")
        self.results_per_page = results_per_page
        self.price_distractors = pick(price_distractors, "price_distractors")
        self.near_distractors = pick(near_distractors, "near_distractors")
        self.size_distractors = pick(size_distractors, "size_distractors")
        self.n_items = pick(n_items, "n_items")
        self.n_attributes = n_attributes
        self.max_turns = pick(max_turns, "max_turns")
        self.reward_kind = reward
        self.partial_weight = partial_weight
        per_goal = 1 + self.price_distractors + self.near_distractors + self.size_distractors
        if self.catalog_size < self.n_items * per_goal:
            raise ValueError(
                f"catalog_size={self.catalog_size} is too small for {self.n_items} goal(s) with "
                f"{per_goal - 1} distractors each"
            )
        if self.results_per_page < 1 + self.price_distractors + self.size_distractors:
            raise ValueError(
                "results_per_page must exceed the number of same-title distractors, or the "
                "goal item could fall off the results page"
            )
        self.task: Task | None = None
        self.catalog: tuple[Product, ...] = ()
        self.goals: tuple[Goal, ...] = ()
        self._s = _State()
        self._idf: dict[str, float] = {}

    # ----------------------------------------------------------- generation
    def _generate(self, seed: int) -> None:
        rng = random.Random(seed)
        products: list[Product] = []
        goals: list[Goal] = []
        used_titles: set[tuple[str, str, str]] = set()

        def sizes_with(size: str | None, without: str | None = None) -> tuple[str, ...]:
            pool = [s for s in SIZES if s != without]
            k = rng.randint(2, 4)
            chosen = set(rng.sample(pool, min(k, len(pool))))
            if size is not None:
                chosen.add(size)
            return tuple(s for s in SIZES if s in chosen)

        for _ in range(self.n_items):
            while True:
                cat, col, mat = rng.choice(CATEGORIES), rng.choice(COLORS), rng.choice(MATERIALS)
                if (cat, col, mat) not in used_titles:
                    break
            used_titles.add((cat, col, mat))
            price = rng.choice(PRICES[1:-5])  # 10..75, leaves room above the budget
            budget = min(100, price + rng.choice((0, 5, 10, 15)))
            size = rng.choice(SIZES)
            named = ATTRIBUTES[: self.n_attributes]
            goal = Goal(
                cat, tuple((a, {"color": col, "material": mat}[a]) for a in named), size, budget
            )
            goals.append(goal)
            products.append(Product(-1, cat, col, mat, price, sizes_with(size)))
            over = [p for p in PRICES if p > budget]
            for _ in range(self.price_distractors):
                products.append(Product(-1, cat, col, mat, rng.choice(over[:6]), sizes_with(size)))
            for _ in range(self.size_distractors):
                products.append(
                    Product(
                        -1,
                        cat,
                        col,
                        mat,
                        rng.choice([p for p in PRICES if p <= budget]),
                        sizes_with(None, without=size),
                    )
                )
            for _ in range(self.near_distractors):
                # one named attribute (or, with none named, the category) differs
                if named:
                    which = rng.choice(named)
                    c2 = rng.choice([c for c in COLORS if c != col]) if which == "color" else col
                    m2 = (
                        rng.choice([m for m in MATERIALS if m != mat])
                        if which == "material"
                        else mat
                    )
                    cat2 = cat
                else:
                    c2, m2, cat2 = col, mat, rng.choice([c for c in CATEGORIES if c != cat])
                products.append(
                    Product(
                        -1,
                        cat2,
                        c2,
                        m2,
                        rng.choice([p for p in PRICES if p <= max(budget, 10)]),
                        sizes_with(size),
                    )
                )
        while len(products) < self.catalog_size:
            p = Product(
                -1,
                rng.choice(CATEGORIES),
                rng.choice(COLORS),
                rng.choice(MATERIALS),
                rng.choice(PRICES),
                sizes_with(None),
            )
            # a random product never ties with a goal's query (all its words in the title)
            if not any(set(g.words()) <= set(p.title.split()) for g in goals):
                products.append(p)
        rng.shuffle(products)
        self.catalog = tuple(replace(p, pid=i) for i, p in enumerate(products))
        self.goals = tuple(goals)
        # BM25 statistics over titles
        n = len(self.catalog)
        df: dict[str, int] = {}
        for p in self.catalog:
            for w in set(p.title.split()):
                df[w] = df.get(w, 0) + 1
        self._idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def _search(self, words: tuple[str, ...]) -> tuple[int, ...]:
        """BM25 (k1 = 1.2, b = 0.75; all titles have 3 words) over product titles."""
        k1 = 1.2
        scored = []
        for p in self.catalog:
            title = p.title.split()
            s = 0.0
            for w in set(words):
                tf = title.count(w)
                if tf:
                    s += self._idf.get(w, 0.0) * tf * (k1 + 1) / (tf + k1)
            if s > 0:
                scored.append((-s, p.pid))
        scored.sort()
        return tuple(pid for _, pid in scored[: self.results_per_page])

    # ------------------------------------------------------------ protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        """Generate the task's catalog and goals from ``task.seed``; ``seed`` is unused
        (the shop has no randomness after generation)."""
        self.task = task
        self._generate(task.seed)
        self._s = _State()
        return self.observation()

    def instruction(self) -> str:
        """The goal: the next item of the shopping list (the only one with one item)."""
        return f"buy {self._current_goal().text()}"

    def shopping_list(self) -> str:
        """Every item of the task, as a person would read the whole list."""
        return "buy " + " and ".join(g.text() for g in self.goals)

    def observation(self) -> str:
        s = self._s
        prefix = f"{s.message} " if s.message else ""
        cart = ""
        if self.n_items > 1:  # the shopping-list panel: which item of the list is next
            k = min(len(s.cart), self.n_items - 1)
            cart = f"item {k + 1} of {self.n_items} ; "
        if s.page == "home":
            body = "home : search for products"
        elif s.page == "results":
            if not s.results:
                body = "results : no products found ; back to search again"
            else:
                items = " ; ".join(
                    f"{i + 1} {self.catalog[pid].title} ${self.catalog[pid].price}"
                    for i, pid in enumerate(s.results)
                )
                body = f"results : {items}"
        elif s.page == "item":
            p = self.catalog[s.item]
            chosen = f" ; chosen {s.size}" if s.size else ""
            body = f"item : {p.title} ${p.price} ; sizes {' '.join(p.sizes)}{chosen}"
        else:
            body = "done"
        return prefix + cart + body

    def _invalid(self, why: str) -> StepResult:
        self._s.message = f"invalid action : {why} ."
        return self._finish_turn(valid=False)

    def _finish_turn(self, *, valid: bool) -> StepResult:
        s = self._s
        s.turn += 1
        done = s.page == "done" or s.turn >= self.max_turns
        reward, info = 0.0, {"valid": valid}
        if done:
            score, success = self.score()
            info.update(score=score, success=success, turns=s.turn)
            reward = self._reward(score, success)
            s.page = "done"
        return StepResult(self.observation(), reward, done, info)

    def _reward(self, score: float, success: bool) -> float:
        if self.reward_kind == "success":
            return float(success)
        if self.reward_kind == "partial":
            return score
        return (float(success) + self.partial_weight * score) / (1.0 + self.partial_weight)

    def score(self) -> tuple[float, bool]:
        """(mean requirement score over goals, success) of the current cart."""
        cart = [(self.catalog[pid], size) for pid, size in self._s.cart]
        best = 0.0
        # best assignment of cart items to goals (n_items is tiny: try all orders)
        for order in itertools.permutations(range(len(self.goals))):
            total = 0.0
            for gi, (p, size) in zip(order, cart):
                total += self.goals[gi].score(p, size)
            best = max(best, total / len(self.goals))
        return best, best >= 1.0 - 1e-9

    def step(self, action: str) -> StepResult:
        s = self._s
        if s.page == "done":
            raise RuntimeError("step() called after the episode ended; call reset()")
        s.message, s.looked = "", False
        if len(action) > MAX_ACTION_CHARS:
            return self._invalid(f"action longer than {MAX_ACTION_CHARS} characters")
        parsed = parse_action(action)
        if parsed is None or (parsed[0] == TOOL_VERB and not self.tools):
            tool = " , lookup" if self.tools else ""
            return self._invalid(f"use search[...] , click[...] , choose[...]{tool} , back or buy")
        verb, arg = parsed
        if verb == TOOL_VERB:
            if s.page != "results":
                return self._invalid("lookup only on results")
            rank = self._fitting_rank()
            s.message = f"lookup : result {rank} fits ." if rank else "lookup : no result fits ."
            s.looked = True
        elif verb == "search":
            if s.page != "home":
                return self._invalid("search only from home")
            words = tuple(_WORD_RE.findall(arg.lower()))
            if not words:
                return self._invalid("empty search")
            s.query, s.results, s.page = words, self._search(words), "results"
        elif verb == "click":
            if s.page != "results":
                return self._invalid("click only on results")
            # ASCII digits only: str.isdigit() also accepts "²", which int() rejects
            if not (arg.isascii() and arg.isdigit()) or not 1 <= int(arg) <= len(s.results):
                return self._invalid("no such result")
            s.item, s.size, s.page = s.results[int(arg) - 1], None, "item"
            s.visited = (*s.visited, s.item)
        elif verb == "choose":
            if s.page != "item":
                return self._invalid("choose only on an item")
            if arg not in self.catalog[s.item].sizes:
                return self._invalid("size not in stock")
            s.size = arg
        elif verb == "back":
            if s.page == "home":
                return self._invalid("already home")
            s.page = "home" if s.page == "results" else "results"
        else:  # buy
            if s.page != "item":
                return self._invalid("buy only on an item")
            s.cart = (*s.cart, (s.item, s.size))
            s.page = "done" if len(s.cart) >= self.n_items else "home"
            s.query, s.results, s.item, s.size = (), (), -1, None
        return self._finish_turn(valid=True)

    def state_key(self) -> str:
        """Canonical page state: page, query words (sorted), item, size and cart.

        A query longer than :data:`MAX_QUERY_KEY_CHARS` characters is written as ``#``
        and the BLAKE2b digest (16 bytes, hex) of its sorted words, so a key has at most
        ``MAX_QUERY_KEY_CHARS`` + ~10·``n_items`` + 30 characters; shorter queries (every
        query of an oracle or a model) appear verbatim.
        """
        s = self._s
        cart = ",".join(f"{pid}:{size}" for pid, size in s.cart)
        if s.page == "results":
            query = " ".join(sorted(s.query))
            if len(query) > MAX_QUERY_KEY_CHARS:
                query = "#" + hashlib.blake2b(query.encode(), digest_size=16).hexdigest()
            return f"results|{query}|{cart}" + ("|lookup" if s.looked else "")
        if s.page == "item":
            return f"item|{s.item}|{s.size}|{cart}"
        return f"{s.page}|{cart}"

    def abstract_state_key(self) -> str:
        """Progress stage for ProAS's progress graph, relative to this task's goal.

        ``abstract_states="goal"`` (default): ``home``, ``results`` (the page lists an
        item that can satisfy the next goal), ``item`` (looking at such an item),
        ``chosen`` (its goal size chosen), ``done`` (the task solved), and ``off`` for
        every state that is not progress toward *this* goal: results without a fitting
        item, another item, a wrong size chosen, a cart holding a wrong purchase (and
        whatever follows it), a failed end. With several items, ``|k`` adds the number of
        items in the cart. So "buy after choosing a size" is a progress edge only with
        the right item and size, and wandering among wrong items stays ``off``.

        ``"stage"``: the page alone (home / results / item / chosen / done, + cart), the
        earlier key, under which a wrong purchase and a right one were the same edge.
        """
        s = self._s
        k = len(s.cart)
        if self.abstract_states == "stage":
            stage = "chosen" if s.page == "item" and s.size else s.page
        elif not self._cart_on_track():
            stage = "off"
        elif s.page == "done":
            stage = "done" if self.score()[1] else "off"
        elif s.page == "results":
            goal = self._current_goal()
            fits = any(goal.matches(self.catalog[pid]) for pid in s.results)
            stage = "results" if fits else "off"
        elif s.page == "item":
            goal = self._current_goal()
            if not goal.matches(self.catalog[s.item]) or s.size not in (None, goal.size):
                stage = "off"
            else:
                stage = "chosen" if s.size else "item"
        else:
            stage = "home"
        return f"{stage}|{k}" if self.n_items > 1 else stage

    def _cart_on_track(self) -> bool:
        """Every purchase so far fully satisfies a different goal (success still possible)."""
        cart = [(self.catalog[pid], size) for pid, size in self._s.cart]
        if not cart:
            return True
        return any(
            all(self.goals[gi].score(p, size) >= 1.0 - 1e-9 for gi, (p, size) in zip(order, cart))
            for order in itertools.permutations(range(len(self.goals)), len(cart))
        )

    def progress(self) -> float:
        """Stage fraction in [0, 1]: home 0, results ¼, item ½, size chosen ¾, bought 1."""
        s = self._s
        stage = {"home": 0.0, "results": 0.25, "item": 0.5, "done": 1.0}[s.page]
        if s.page == "item" and s.size:
            stage = 0.75
        if s.page == "done":
            return 1.0
        return (len(s.cart) + stage) / self.n_items

    def snapshot(self) -> _State:
        return replace(self._s)

    def restore(self, snap: _State) -> None:
        self._s = replace(snap)

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """A training task like ``task``: every shop task of one env config has the same
        page graph and item count, and the variant also keeps the first goal's category;
        colours, materials, prices, sizes and distractors are new (RODS's variants)."""
        kind = random.Random(task.seed).choice(CATEGORIES)  # _generate's first draw
        return Task(
            "train", find_variant_seed(rng, lambda s: random.Random(s).choice(CATEGORIES) == kind)
        )

    def task_structure(self) -> dict[str, Any]:
        """The current task's structure, what RODS's planner keeps in a variant
        (:mod:`credo.tasks.synthesis`): the list's length, the attributes each goal
        names and the goals' categories (as a multiset: the page graph is the same
        whatever their order). Colours, materials, sizes, budgets, prices and the
        distractors are the entities a variant changes."""
        return {
            "items": len(self.goals),
            "attributes": [a for a, _ in self.goals[0].attrs],
            "categories": sorted(g.category for g in self.goals),
        }

    def is_tool_call(self, action: str) -> bool:
        """``search[...]`` is the shop's tool call (AXPO resamples these)."""
        parsed = parse_action(action)
        return parsed is not None and parsed[0] == "search"

    def is_optional_tool(self, action: str) -> bool:
        """``lookup`` is the shop's optional tool: what SpatialCLI's internalisation
        removes (:func:`credo.pipeline.internalise.remove_tool_calls`)."""
        parsed = parse_action(action)
        return parsed is not None and parsed[0] == TOOL_VERB

    def _fitting_rank(self) -> int:
        """The optional tool's answer: the rank (from 1) of the first shown result that
        fits the current goal (title, price and size in stock), 0 if none does."""
        g = self._current_goal()
        for rank, pid in enumerate(self._s.results):
            if g.matches(self.catalog[pid]):
                return rank + 1
        return 0

    def extract_action(self, text: str) -> str | None:
        """Find the action in a chat model's free-form reply (``None`` if there is none).

        The first ``verb[...]`` anywhere wins; otherwise a line that is just ``back`` or
        ``buy`` (optionally after ``Action:``). The grammar itself stays strict: what is
        found is still parsed by :func:`parse_action` in :meth:`step`.

        Only the first :data:`MAX_REPLY_CHARS` characters are read (for the bare form,
        the whole lines among them), so a runaway reply costs a few milliseconds; both
        searches are linear in what is read.
        """
        head = text[:MAX_REPLY_CHARS]
        m = _FIND_BRACKETED.search(head)
        if m:
            return m.group(0)
        if len(text) > MAX_REPLY_CHARS:  # a line cut at the cap could read as "buy"
            head = head[: head.rfind("\n") + 1]
        m = _FIND_BARE.search(head)
        if m is None and self.tools:
            m = _FIND_TOOL.search(head)
        return m.group(1) if m else None

    def action_format(self) -> str:
        tool = (
            " On a results page, lookup (costs a turn) tells which result fits the goal."
            if self.tools
            else ""
        )
        return (
            "Reply with exactly one action: search[words] on the home page, click[k] to open "
            "the k-th result, choose[size] on an item page, back, or buy." + tool
        )

    # -------------------------------------------------------------- oracle
    def _current_goal(self) -> Goal:
        """The next item of the shopping list (items are bought in list order)."""
        return self.goals[min(len(self._s.cart), len(self.goals) - 1)]

    def oracle_action(self) -> str:
        """A correct next action from the current state (solves every task).

        The oracle acts on what the pages show: on the results it opens the first item
        whose title and price fit the goal and that it has not already found wanting;
        on the item page it goes back if the size is not in stock. So with size
        distractors (``multi``, ``hard``) its demonstrations include checking an item and
        going back — behaviour a policy can learn, since sizes only show on item pages.
        With ``tools`` on, it asks ``lookup`` on every results page and follows the answer.
        """
        s, g = self._s, self._current_goal()
        if s.page == "home":
            return f"search[{' '.join(g.words())}]"
        if s.page == "results" and self.tools:  # the tool's answer, asked for first
            if not s.looked:
                return TOOL_VERB
            rank = self._fitting_rank()
            return f"click[{rank}]" if rank else "back"
        if s.page == "results":
            if s.query == tuple(g.words()):
                for rank, pid in enumerate(s.results):
                    p = self.catalog[pid]
                    found_wanting = pid in s.visited and not g.matches(p)
                    if g.looks_right(p) and not found_wanting:
                        return f"click[{rank + 1}]"
            return "back"
        if s.page == "item":
            if not g.matches(self.catalog[s.item]):
                return "back"
            return "buy" if s.size == g.size else f"choose[{g.size}]"
        raise RuntimeError("the episode is over")

    def privileged_context(self, kind: str) -> str | None:
        """Teacher-only text about the current state (see :mod:`credo.envs.base`):
        ``"oracle"`` gives :meth:`oracle_action` (``None`` once the episode is over);
        other kinds are not offered (``None``). Reads the state only."""
        if kind != "oracle" or self._s.page == "done":
            return None
        return self.oracle_action()

    def sample_action(self, rng: random.Random) -> str:
        """A random *plausible* action for the current page (noisy demonstrations)."""
        s, g = self._s, self._current_goal()
        if s.page == "home":
            words = g.words()
            if len(words) > 1 and rng.random() < 0.5:
                words = [w for i, w in enumerate(words) if i != rng.randrange(len(words))]
            else:
                pools = [*[COLORS, MATERIALS][: len(words) - 1], CATEGORIES]
                i = rng.randrange(len(words))
                words = list(words)
                words[i] = rng.choice(pools[i])
            return f"search[{' '.join(words)}]"
        if s.page == "results":
            options = [f"click[{k + 1}]" for k in range(len(s.results))] + ["back"]
            return rng.choice([*options, TOOL_VERB] if self.tools else options)
        if s.page == "item":
            sizes = self.catalog[s.item].sizes
            return rng.choice([f"choose[{rng.choice(sizes)}]", "buy", "back"])
        raise RuntimeError("the episode is over")

    def vocabulary(self) -> list[str]:
        """Every word the shop can print or accept."""
        words = {
            "buy",
            "a",
            "in",
            "size",
            "for",
            "at",
            "most",
            "$",
            "and",
            "home",
            ":",
            "search",
            "products",
            "results",
            "no",
            "found",
            ";",
            "back",
            "to",
            "again",
            "item",
            "sizes",
            "chosen",
            "done",
            "cart",
            "of",
            "invalid",
            "action",
            "use",
            "[",
            "]",
            ",",
            "click",
            "choose",
            "or",
            "only",
            "from",
            "on",
            "an",
            "empty",
            "such",
            "result",
            "not",
            "stock",
            "already",
            ".",
        }
        words |= set(CATEGORIES) | set(COLORS) | set(MATERIALS) | set(SIZES)
        words |= {str(p) for p in PRICES} | {str(k) for k in range(1, 11)}
        if self.tools:  # only then: a tools-off shop keeps its tokenizer exactly
            words |= {TOOL_VERB, "fits"}
        return sorted(words)
