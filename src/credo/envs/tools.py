"""``tools``: a customer-service desk served through a small API, generated from a seed.

The agent reads a support ticket (the instruction) and serves it by calling tools. A call
is ``name{json arguments}``; the tools form a dependency graph (an id one tool returns is
the argument of the next)::

    find_customer{"name": str}                      → customer id (and city), or the
                                                      namesakes when the name is shared
    list_orders{"customer_id": int}                 → order ids, items, status, age
    get_order{"order_id": int}                      → price, category, status, customer
    check_policy{"order_id": int}                   → what the store allows for the order
    list_variants{"order_id": int}                  → variant ids of the ordered item
    refund{"order_id": int, "amount": int}          ┐
    store_credit{"order_id": int, "amount": int}    │ actions that change the store
    exchange{"order_id": int, "variant_id": int}    │ (each order at most once)
    cancel_order{"order_id": int}                   ┘
    respond{"message": str}  or  done{}             close the ticket (ends the episode)

Store rules (:func:`order_policy`, shown by ``check_policy``): a delivered order is
refunded within its category's return window, less the category's restocking fee; after
the window and up to 90 days it gets store credit of its full price instead; it can be
exchanged for another variant up to 60 days; an order still processing can only be
cancelled; a shipped or already handled order allows nothing. A refund request is served
by whichever of refund and store credit the policy allows.

Calls are parsed strictly (:func:`parse_call`: at most :data:`MAX_CALL_CHARS`
characters, ``json.loads`` of one JSON object, never ``eval``): a malformed call, an
unknown tool, a missing, extra, repeated or mistyped argument, an unknown customer, order
or variant id, and an action the policy forbids are answered by an ``error : ...`` tool
message with ``info["valid"] = False`` (and ``info["error"]``, a code from
:data:`ERROR_CODES`). Nothing changes, so every such mistake is recoverable. An error
message never repeats the agent's text, so observations stay short whatever it sends.

The word-level tokenizer of the built-in model lower-cases text and decodes with spaces
between tokens; the oracle therefore writes calls in a spaced form that survives that
round trip unchanged (``refund { "order_id" : 214 , "amount" : 30 }``), names are lower
case, ids and amounts are integers (single number tokens), and names are compared after
lower-casing and collapsing spaces. The compact form ``refund{"order_id": 214,
"amount": 30}`` is accepted as well.

Success is a verifiable final state, never a reading of the reply: the set of store
actions issued (kind, order, amount or variant) must equal the ticket's goal set exactly
— the right refunds or credits with the right amounts, the right exchanges and
cancellations, and nothing else. The reward is chosen by ``reward``: ``"success"``
(0/1), ``"partial"`` (the Jaccard overlap of the issued and goal sets) or ``"mixed"``
(``(success + partial_weight·score) / (1 + partial_weight)``, the default, as ``shop``).

Task families (:data:`FAMILIES`) fix the dependency topology: how the customer is found
(the ticket gives the order id; the name; a name two customers share, told apart by the
city) and which requests the ticket makes (refund, exchange, cancel; one to three).
Entities, names, ids, amounts, distractor orders and wording vary with the task seed.
Difficulties (:data:`DIFFICULTIES`) draw from families whose oracle needs 3–4 calls
(``easy``), 5–7 (``default``) or 8–12 (``hard``), the closing ``done{}`` included.

Two options add text a verifier cannot judge and context a policy must read:

- ``closing="respond"``: the ticket is closed with a message to the customer,
  ``respond{"message": ...}`` (``done{}`` still closes it, without one). The oracle writes
  ``"resolved : refund $ 30 for the kettle ; bye"`` (one clause per request). The
  message never changes the env's reward; its **hidden truth** is the share of the
  ticket's requests whose facts it states (:meth:`ToolsEnv.message_facts`: refund → the
  word ``refund``, the amount and the item; store credit → ``credit``, the amount and
  the item; exchange → ``exchange``, the item and the colour; cancel → ``cancelled``
  and the item), reported as ``info["message_truth"]`` on the closing step and by
  :meth:`ToolsEnv.message_truth`, so a judge's agreement with it can be measured
  (SERPO, :mod:`credo.teachers.judging`). :meth:`ToolsEnv.free_text` returns the message
  of a ``respond`` call.
- ``profiles=True``: every task carries a customer profile (``profile : favourite
  colour blue``) appended to the ticket (:meth:`ToolsEnv.profile`, also offered as
  ``privileged_context("profile")``). The ticket's first exchange request then names
  no colour ("please exchange my kettle for my favourite colour"; a second one still
  names its own): of the order's two or three variants,
  all of which the store would accept, only the profile's colour serves the ticket (RAPO,
  :mod:`credo.teachers.profiles`). Tasks without an exchange carry a profile that does not
  matter.

For credit assignment: ``abstract_state_key()`` is the stage of the ticket *relative to
this task's goal* (``"1/2|policy"``: one of two requests served, looking at the policy
of the order the next request is about), and any view of another order or customer is
``off``, so progress toward a wrong entity is not progress (ProAS); ``progress()`` is the
fraction of the goal path covered (0 once a wrong store action makes success
impossible); ``is_tool_call(action)`` and ``info["tool_call"]`` mark API calls (AXPO's
resampling points).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from typing import Any

from credo.envs.base import StepResult, Task, find_variant_seed, register_env

__all__ = [
    "ACTION_TOOLS",
    "DIFFICULTIES",
    "ERROR_CODES",
    "FAMILIES",
    "MAX_CALL_CHARS",
    "TOOLS",
    "CallError",
    "Family",
    "ToolsEnv",
    "format_call",
    "order_policy",
    "parse_call",
]

FIRST_NAMES = (
    "ada", "ben", "cara", "dev", "eli", "fay", "gus", "hana", "ivan", "june",
    "kai", "lena", "milo", "nora", "omar", "pia", "raj", "sara", "tom", "vera",
)  # fmt: skip
LAST_NAMES = (
    "park", "stone", "reed", "hale", "moss", "lane", "frost", "wade", "cole", "banks",
    "marsh", "finch", "holt", "quinn", "rowe", "snow", "vance", "webb", "york", "drake",
)  # fmt: skip
CITIES = ("oslo", "lima", "rome", "kyiv", "doha", "pune", "turin", "leeds", "cork", "perth")
#: item → category
ITEMS: dict[str, str] = {
    "kettle": "kitchen", "toaster": "kitchen", "blender": "kitchen", "mixer": "kitchen",
    "lamp": "home", "rug": "home", "pillow": "home", "clock": "home",
    "scarf": "clothing", "jacket": "clothing", "shoes": "clothing", "hat": "clothing",
    "phone": "electronics", "headphones": "electronics", "charger": "electronics",
    "camera": "electronics",
    "tent": "outdoor", "backpack": "outdoor", "bottle": "outdoor", "stove": "outdoor",
}  # fmt: skip
#: category → return window in days
WINDOWS = {"kitchen": 30, "home": 45, "clothing": 60, "electronics": 14, "outdoor": 30}
#: category → restocking fee in dollars
FEES = {"kitchen": 0, "home": 5, "clothing": 0, "electronics": 10, "outdoor": 5}
COLORS = ("red", "blue", "green", "black", "white", "grey", "pink", "yellow")
PRICES = tuple(range(15, 101, 5))
CREDIT_DAYS = 90  # store credit up to this age
EXCHANGE_DAYS = 60  # exchanges up to this age
CUSTOMER_IDS = range(101, 200)
ORDER_IDS = range(201, 300)
VARIANT_IDS = range(301, 400)

#: The longest call text :func:`parse_call` reads (longer: ``too_long``).
MAX_CALL_CHARS = 1000
_MAX_MESSAGE_CHARS = 500

#: tool → (argument name → type), in the order the oracle writes them.
TOOLS: dict[str, dict[str, type]] = {
    "find_customer": {"name": str},
    "list_orders": {"customer_id": int},
    "get_order": {"order_id": int},
    "check_policy": {"order_id": int},
    "list_variants": {"order_id": int},
    "refund": {"order_id": int, "amount": int},
    "store_credit": {"order_id": int, "amount": int},
    "exchange": {"order_id": int, "variant_id": int},
    "cancel_order": {"order_id": int},
    "respond": {"message": str},
    "done": {},
}
#: The tools that change the store (their calls are what success is judged on).
ACTION_TOOLS = ("refund", "store_credit", "exchange", "cancel_order")
_CLOSING = ("respond", "done")
_STATUS_AFTER = {
    "refund": "refunded",
    "store_credit": "credited",
    "exchange": "exchanged",
    "cancel_order": "cancelled",
}

#: ``info["error"]`` codes of invalid calls.
ERROR_CODES = (
    "too_long",
    "not_a_call",
    "bad_json",
    "repeated_argument",
    "unknown_tool",
    "missing_argument",
    "extra_argument",
    "wrong_type",
    "unknown_name",
    "wrong_id",
    "not_allowed",
    "bad_amount",
)


@dataclass(frozen=True)
class Family:
    """A task family: the dependency topology of a ticket.

    Attributes:
        lookup: how the orders are found: ``"id"`` (the ticket names the order id),
            ``"name"`` (find the customer by name, then list the orders) or
            ``"namesake"`` (as ``name``, but two customers share the name; the city in
            the ticket's signature tells them apart).
        requests: the ticket's requests in a fixed multiset (``refund``, ``exchange``,
            ``cancel``); their order in the ticket is drawn per task.
    """

    lookup: str
    requests: tuple[str, ...]

    def calls(self) -> int:
        """The oracle's number of calls, closing ``done{}`` included."""
        cost = {"refund": 2, "exchange": 3, "cancel": 1}
        find = 0 if self.lookup == "id" else 2
        return find + sum(cost[r] for r in self.requests) + len(self.requests) - 1 + 1


FAMILIES: dict[str, Family] = {
    "refund_by_id": Family("id", ("refund",)),
    "exchange_by_id": Family("id", ("exchange",)),
    "cancel_by_name": Family("name", ("cancel",)),
    "refund_by_name": Family("name", ("refund",)),
    "refund_namesake": Family("namesake", ("refund",)),
    "exchange_by_name": Family("name", ("exchange",)),
    "cancel_and_refund": Family("name", ("cancel", "refund")),
    "two_refunds": Family("name", ("refund", "refund")),
    "refund_and_exchange": Family("namesake", ("refund", "exchange")),
    "two_exchanges": Family("name", ("exchange", "exchange")),
    "cancel_refund_exchange": Family("name", ("cancel", "refund", "exchange")),
    "two_refunds_and_exchange": Family("namesake", ("refund", "refund", "exchange")),
}

#: Difficulty presets: the families drawn from (uniformly) and the turn limit.
DIFFICULTIES: dict[str, dict[str, Any]] = {
    "easy": dict(
        families=("refund_by_id", "exchange_by_id", "cancel_by_name"), calls=(3, 4), max_turns=8
    ),
    "default": dict(
        families=("refund_by_name", "refund_namesake", "exchange_by_name", "cancel_and_refund"),
        calls=(5, 7),
        max_turns=12,
    ),
    "hard": dict(
        families=(
            "two_refunds",
            "refund_and_exchange",
            "two_exchanges",
            "cancel_refund_exchange",
            "two_refunds_and_exchange",
        ),
        calls=(8, 12),
        max_turns=20,
    ),
}

_REFUND_WORDS = (
    "please refund my {item}",
    "i want my money back for the {item}",
    "i would like a refund for my {item}",
    "can you refund the {item} i bought",
)
_REFUND_DAYS_WORDS = (
    "please refund the {item} i got {days} days ago",
    "i want my money back for the {item} from {days} days ago",
)
_EXCHANGE_WORDS = (
    "please exchange my {item} for a {color} one",
    "i would like the {item} in {color} instead",
    "can i swap my {item} for the {color} one",
)
_CANCEL_WORDS = (
    "please cancel my {item} order",
    "i no longer want the {item} , please cancel it",
    "cancel the {item} i ordered",
)
_REFUND_ID_WORDS = (
    "please refund order {oid} , my {item}",
    "i want my money back for order {oid} , the {item}",
)
_EXCHANGE_ID_WORDS = (
    "please exchange order {oid} , my {item} , for a {color} one",
    "i would like order {oid} , the {item} , in {color} instead",
)
_EXCHANGE_PROFILE_WORDS = (
    "please exchange my {item} for my favourite colour",
    "i would like the {item} in my favourite colour instead",
    "can i swap my {item} for one in my favourite colour",
)
_EXCHANGE_ID_PROFILE_WORDS = (
    "please exchange order {oid} , my {item} , for my favourite colour",
    "i would like order {oid} , the {item} , in my favourite colour instead",
)
#: The oracle's message clause per store action (``respond``).
_MESSAGE_CLAUSES = {
    "refund": "refund $ {value} for the {item}",
    "store_credit": "store credit $ {value} for the {item}",
    "exchange": "exchange of the {item} for {color}",
    "cancel_order": "the {item} order is cancelled",
}
#: The first and last words of the oracle's message (inside the JSON string's quotes,
#: so the built-in tokenizer reads them as ``"resolved`` and ``bye"``).
_MESSAGE_OPEN, _MESSAGE_CLOSE = "resolved :", "; bye"
_PROFILE_TEXT = "profile : favourite colour {color}"
_MESSAGE_SPLIT = re.compile(r"[\s\"$;:,.\[\]]+")
_GREETINGS = ("", "hi , ", "hello , ", "good morning , ", "dear support , ")
_SIGN_OFFS = ("thanks", "regards", "best wishes", "cheers", "thank you")


# ------------------------------------------------------------------ the call syntax
@dataclass(frozen=True)
class CallError:
    """A call that cannot be executed: ``code`` (one of :data:`ERROR_CODES`) and the
    tool message shown to the agent (never containing the agent's own text)."""

    code: str
    message: str


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Repeated
    return dict(pairs)


class _Repeated(ValueError):
    pass


_CALL_RE = re.compile(r"\A\s*([a-z_]+)\s*(\{.*)\Z", re.S)


def parse_call(text: str) -> tuple[str, dict[str, Any]] | CallError:
    """``'refund { "order_id" : 214 , "amount" : 30 }'`` → ``("refund", {...})``.

    Strict: one tool name (lower case), then one JSON object and nothing else; at most
    :data:`MAX_CALL_CHARS` characters; the arguments must be exactly the tool's (none
    missing, extra or repeated) with the right JSON types (integers are JSON integers,
    not strings, floats or booleans). Returns a :class:`CallError` otherwise.
    """
    if len(text) > MAX_CALL_CHARS:
        return CallError("too_long", f"error : a call has at most {MAX_CALL_CHARS} characters")
    m = _CALL_RE.match(text)
    if m is None:
        return CallError(
            "not_a_call", "error : write one call : a tool name , then its json arguments"
        )
    name, body = m.group(1), m.group(2)
    if name not in TOOLS:
        return CallError("unknown_tool", "error : unknown tool ; tools : " + " , ".join(TOOLS))
    try:
        args = json.loads(body, object_pairs_hook=_no_repeats)
    except _Repeated:
        return CallError("repeated_argument", "error : an argument is given twice")
    except (ValueError, RecursionError):
        return CallError("bad_json", "error : the arguments are not valid json")
    # the text after the name starts with "{", so valid JSON there is an object
    schema = TOOLS[name]
    for key in schema:
        if key not in args:
            return CallError("missing_argument", f'error : {name} needs "{key}"')
    for key in args:
        if key not in schema:
            takes = " , ".join(f'"{k}"' for k in schema) or "no arguments"
            return CallError("extra_argument", f"error : {name} takes {takes}")
    for key, kind in schema.items():
        value = args[key]
        ok = (type(value) is int) if kind is int else isinstance(value, str)
        if not ok:
            what = "an integer" if kind is int else "a string"
            return CallError("wrong_type", f'error : "{key}" must be {what}')
    return name, args


def _overlap(goal: frozenset[Any], done: frozenset[Any]) -> tuple[float, bool]:
    """``(|done ∩ goal| / |done ∪ goal|, done == goal)`` (1.0 when both are empty)."""
    union = goal | done
    return (len(goal & done) / len(union) if union else 1.0), done == goal


def format_call(name: str, args: dict[str, Any]) -> str:
    """The canonical spaced form: ``refund { "order_id" : 214 , "amount" : 30 }``.

    It is unchanged by the word-level tokenizer's encode/decode round trip (for the
    lower-case names and integers the env uses) and is valid JSON after the name.
    """
    if not args:
        return f"{name} {{ }}"
    inner = " , ".join(f"{json.dumps(k)} : {json.dumps(v)}" for k, v in args.items())
    return f"{name} {{ {inner} }}"


def _norm_name(name: str) -> str:
    return " ".join(name.lower().split())


# ---------------------------------------------------------------- the store's data
@dataclass(frozen=True)
class Customer:
    cid: int
    name: str
    city: str


@dataclass(frozen=True)
class Order:
    """An order as generated (its status may change during the episode).

    ``status``: ``delivered`` (``days`` ago), ``shipped`` or ``processing``; or
    ``refunded`` (handled before the ticket)."""

    oid: int
    cid: int
    item: str
    price: int
    status: str
    days: int = 0

    @property
    def category(self) -> str:
        return ITEMS[self.item]


@dataclass(frozen=True)
class Variant:
    vid: int
    oid: int
    color: str


@dataclass(frozen=True)
class Policy:
    """What the store allows for an order now (see :func:`order_policy`).

    Attributes:
        refund: the largest refund (``None``: no refund).
        credit: the largest store credit (``None``: none).
        exchange: an exchange is allowed.
        cancel: a cancellation is allowed.
        text: the ``check_policy`` message body.
    """

    refund: int | None
    credit: int | None
    exchange: bool
    cancel: bool
    text: str


def order_policy(order: Order, status: str) -> Policy:
    """The store rules (module docstring) for ``order`` in its current ``status``."""
    if status == "processing":
        return Policy(None, None, False, True, "not delivered yet ; cancel allowed")
    if status == "shipped":
        return Policy(None, None, False, False, "on its way ; nothing allowed until delivered")
    if status != "delivered":
        return Policy(None, None, False, False, f"already {status} ; nothing allowed")
    window, fee = WINDOWS[order.category], FEES[order.category]
    parts = []
    refund = credit = None
    if order.days <= window:
        refund = order.price - fee
        fee_text = f" after a ${fee} fee" if fee else ""
        parts.append(f"refund allowed , amount ${refund}{fee_text}")
    else:
        parts.append(f"refund not allowed after {window} days")
        if order.days <= CREDIT_DAYS:
            credit = order.price
            parts.append(f"store credit allowed , amount ${credit}")
        else:
            parts.append(f"store credit not allowed after {CREDIT_DAYS} days")
    exchange = order.days <= EXCHANGE_DAYS
    parts.append(
        "exchange allowed" if exchange else f"exchange not allowed after {EXCHANGE_DAYS} days"
    )
    return Policy(refund, credit, exchange, False, " ; ".join(parts))


@dataclass(frozen=True)
class Request:
    """One request of the ticket and the store action that serves it.

    Attributes:
        kind: ``refund``, ``exchange`` or ``cancel`` (what the customer asks).
        oid: the order it is about.
        tool: the store action that serves it (``refund``, ``store_credit``,
            ``exchange`` or ``cancel_order``).
        value: the amount (refund, credit), the variant id (exchange) or 0 (cancel).
    """

    kind: str
    oid: int
    tool: str
    value: int

    @property
    def op(self) -> tuple[str, int, int]:
        return (self.tool, self.oid, self.value)


@dataclass(frozen=True)
class _State:
    """Everything that changes during an episode (the snapshot).

    ``view``: what the last observation shows, as a tuple ``(kind, id)`` — kinds
    ``start``, ``error``, ``customer``, ``customers``, ``orders``, ``order``, ``policy``,
    ``variants``, ``issued``, ``closed`` (``id``: the customer or order, or the
    namesakes' ids); ``issued``: the store actions taken, in order."""

    view: tuple[Any, ...] = ("start",)
    issued: tuple[tuple[str, int, int], ...] = ()
    turn: int = 0
    observation: str = "ticket open : no calls yet"
    over: bool = False


# -------------------------------------------------------------------------- the env
@register_env("tools")
class ToolsEnv:
    """A tool-calling customer-service env (see the module docstring).

    Args:
        difficulty: preset name (``easy``, ``default``, ``hard``).
        families: the task families to draw from (default: the preset's); any names
            of :data:`FAMILIES`.
        max_turns: turn limit (default: the preset's); reaching it ends the episode and
            the store's state is judged as it is.
        reward: ``"mixed"`` (default), ``"success"`` or ``"partial"``.
        partial_weight: weight of the partial score in the ``mixed`` reward.
        closing: how the oracle closes a ticket: ``"done"`` (default: ``done{}``) or
            ``"respond"`` (a message to the customer stating what was done; its hidden
            truth is reported, see the module docstring).
        profiles: every task carries a customer profile that decides exchanges (module
            docstring; default false).
        hackable_profile: a reward a generic reply can earn (RAPO's reward hacking; needs
            ``profiles``): the reward counts an exchange of the profile's order for *any*
            of its colours as the one the ticket asks for, while ``info["success"]`` (the
            truth the held-out evaluation reports) still needs the profile's colour; the
            final step's ``info["reward_hacked"]`` marks an episode the reward calls solved
            that is not. With ``reward: success`` the mean return minus the success rate is
            the hacking rate. Default false.
    """

    #: Warm-start steps this env asks for (``sft.steps: null``). The lookups (the id
    #: beside a named item in a tool result) come late in SFT: after the shared default
    #: of 2,500 the built-in model picked such an order id 33 % of the time and the
    #: warm start solved 0.5 % of held-out tasks; after 6,000, 2.8 %, from which GRPO
    #: learns (README, "The tools environment").
    sft_steps = 6000

    def __init__(
        self,
        difficulty: str = "default",
        *,
        families: tuple[str, ...] | list[str] | None = None,
        max_turns: int | None = None,
        reward: str = "mixed",
        partial_weight: float = 0.2,
        closing: str = "done",
        profiles: bool = False,
        hackable_profile: bool = False,
    ) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(
                f"unknown tools difficulty {difficulty!r}; valid: {', '.join(DIFFICULTIES)}"
            )
        if reward not in ("mixed", "success", "partial"):
            raise ValueError(f"unknown tools reward {reward!r}; valid: mixed, success, partial")
        preset = DIFFICULTIES[difficulty]
        fams = tuple(preset["families"] if families is None else families)
        bad = [f for f in fams if f not in FAMILIES]
        if bad or not fams:
            raise ValueError(
                f"unknown tools families {bad or '(none given)'}; valid: {', '.join(FAMILIES)}"
            )
        if closing not in _CLOSING:
            raise ValueError(f"unknown tools closing {closing!r}; valid: done, respond")
        if not isinstance(profiles, bool):
            raise ValueError(f"tools profiles must be true or false, got {profiles!r}")
        if not isinstance(hackable_profile, bool) or (hackable_profile and not profiles):
            raise ValueError(
                f"tools hackable_profile must be true or false and needs profiles: true, got "
                f"hackable_profile={hackable_profile!r}, profiles={profiles!r}"
            )
        turns = preset["max_turns"] if max_turns is None else max_turns
        if not isinstance(turns, int) or turns < 1:
            raise ValueError(f"max_turns must be a positive integer, got {turns!r}")
        self.difficulty = difficulty
        self.families = fams
        self.max_turns = turns
        self.reward_kind = reward
        self.partial_weight = partial_weight
        self.closing = closing
        self.profiles = profiles
        self.hackable_profile = hackable_profile
        self._profile = ""
        self._profile_oid: int | None = None  # the order whose exchange the profile decides
        self._twin = False  # a second order of the ticket's item, told apart by its age
        self.task: Task | None = None
        self.family = ""
        self.customer = Customer(0, "", "")
        self.customers: dict[int, Customer] = {}
        self.orders: dict[int, Order] = {}
        self.variants: dict[int, Variant] = {}
        self.requests: tuple[Request, ...] = ()
        self.ticket = ""
        self._s = _State()

    # ------------------------------------------------------------- generation
    def _generate(self, seed: int, wording: int | None = None) -> None:
        """Build the task (customers, orders, variants, requests, ticket) from ``seed``;
        ``wording`` (a seed) draws the ticket's phrases, greeting and sign-off afresh
        from the same templates, the task itself unchanged (:meth:`reword`)."""
        rng = random.Random(seed)
        self.family = rng.choice(self.families)
        fam = FAMILIES[self.family]
        cids = rng.sample(CUSTOMER_IDS, 5)
        oids = iter(rng.sample(ORDER_IDS, len(ORDER_IDS)))
        vids = iter(rng.sample(VARIANT_IDS, len(VARIANT_IDS)))
        names = [f"{f} {last}" for f in FIRST_NAMES for last in LAST_NAMES]
        name, *others = rng.sample(names, 3)
        city, twin_city = rng.sample(CITIES, 2)
        me = Customer(cids[0], name, city)
        people = [me]
        if fam.lookup == "namesake":
            people.append(Customer(cids[1], name, twin_city))
        people += [Customer(cids[2 + i], n, rng.choice(CITIES)) for i, n in enumerate(others)]
        orders: list[Order] = []

        def delivered(oid: int, cid: int, item: str, lo: int, hi: int) -> Order:
            return Order(oid, cid, item, rng.choice(PRICES), "delivered", rng.randint(lo, hi))

        def distractor(oid: int, cid: int, item: str) -> Order:
            status = rng.choice(("delivered", "delivered", "delivered", "shipped", "processing",
                                 "refunded"))  # fmt: skip
            if status == "delivered":
                return delivered(oid, cid, item, 1, 120)
            return Order(oid, cid, item, rng.choice(PRICES), status)

        kinds = list(fam.requests)
        rng.shuffle(kinds)
        items = rng.sample(sorted(ITEMS), len(kinds) + 4)
        targets: list[Order] = []
        for kind, item in zip(kinds, items):
            if kind == "cancel":
                o = Order(next(oids), me.cid, item, rng.choice(PRICES), "processing")
            elif kind == "exchange":
                o = delivered(next(oids), me.cid, item, 1, EXCHANGE_DAYS)
            else:
                window = WINDOWS[ITEMS[item]]
                if rng.random() < 0.25:  # outside the refund window: store credit
                    o = delivered(next(oids), me.cid, item, window + 1, CREDIT_DAYS)
                else:
                    o = delivered(next(oids), me.cid, item, 1, window)
            targets.append(o)
        orders += targets
        # a second order of the same item, told apart by its age (single refunds by name)
        twin_item = fam.lookup != "id" and kinds == ["refund"] and rng.random() < 0.4
        self._twin = twin_item
        if twin_item:
            t = targets[0]
            days = rng.choice([d for d in range(1, 121) if d != t.days])
            orders.append(Order(next(oids), me.cid, t.item, rng.choice(PRICES), "delivered", days))
        spare = items[len(kinds) :]
        for item in spare[: rng.randint(1, 3)]:
            orders.append(distractor(next(oids), me.cid, item))
        for p in people[1:]:
            # other customers' orders, sometimes of the same items as the ticket's
            for _ in range(rng.randint(1, 3)):
                item = rng.choice(items if rng.random() < 0.5 else sorted(ITEMS))
                orders.append(distractor(next(oids), p.cid, item))
        rng.shuffle(orders)
        variants: list[Variant] = []
        for o in orders:
            for color in rng.sample(COLORS, rng.randint(2, 3)):
                variants.append(Variant(next(vids), o.oid, color))
        self.customer = me
        self.customers = {c.cid: c for c in people}
        self.orders = {o.oid: o for o in sorted(orders, key=lambda o: o.oid)}
        requests: list[Request] = []
        # each request's phrase: its template pool, its fields and the phrase drawn (at
        # once, so the task's random stream is what it always was)
        clauses: list[tuple[tuple[str, ...], dict[str, Any], str]] = []

        def say(pool: tuple[str, ...], draw: random.Random = rng, **fields: Any) -> None:
            clauses.append((pool, fields, draw.choice(pool).format(**fields)))

        profile_color = ""
        self._profile_oid = None
        for kind, o in zip(kinds, targets):
            if kind == "cancel":
                requests.append(Request(kind, o.oid, "cancel_order", 0))
                say(_CANCEL_WORDS, item=o.item)
            elif kind == "exchange":
                mine = [v for v in variants if v.oid == o.oid]
                want = rng.choice(mine)
                requests.append(Request(kind, o.oid, "exchange", want.vid))
                pool = _EXCHANGE_ID_WORDS if fam.lookup == "id" else _EXCHANGE_WORDS
                say(pool, item=o.item, color=want.color, oid=o.oid)
                if self.profiles and not profile_color:  # the first exchange's colour
                    # moves to the profile (own RNG, so the task is the same)
                    by_id = fam.lookup == "id"
                    prof = _EXCHANGE_ID_PROFILE_WORDS if by_id else _EXCHANGE_PROFILE_WORDS
                    side = random.Random(seed * 7919 + o.oid)
                    clauses.pop()
                    say(prof, side, item=o.item, oid=o.oid)
                    profile_color = want.color
                    self._profile_oid = o.oid
            else:
                pol = order_policy(o, o.status)
                if pol.refund is not None:
                    requests.append(Request(kind, o.oid, "refund", pol.refund))
                else:
                    assert pol.credit is not None
                    requests.append(Request(kind, o.oid, "store_credit", pol.credit))
                if fam.lookup == "id":
                    say(_REFUND_ID_WORDS, item=o.item, oid=o.oid)
                elif twin_item:
                    say(_REFUND_DAYS_WORDS, item=o.item, days=o.days)
                else:
                    say(_REFUND_WORDS, item=o.item)
        self.variants = {v.vid: v for v in sorted(variants, key=lambda v: v.vid)}
        self.requests = tuple(requests)
        # signed at the end: the name and city sit at a fixed distance from the action
        # in the built-in model's prompt (goal last), which a small model copies easily
        words = [phrase for _, _, phrase in clauses]
        greeting, sign_off = rng.choice(_GREETINGS), rng.choice(_SIGN_OFFS)
        if wording is not None:  # RODS's rewrite: the same requests in other words
            say_again = random.Random(wording)
            words = [say_again.choice(pool).format(**fields) for pool, fields, _ in clauses]
            greeting, sign_off = say_again.choice(_GREETINGS), say_again.choice(_SIGN_OFFS)
        self.ticket = f'{greeting}{" ; ".join(words)} . {sign_off} , "{name}" , {city}'
        self._profile = ""
        if self.profiles:  # a task without an exchange gets a colour that does not matter
            color = profile_color or random.Random(seed * 7919 + 1).choice(COLORS)
            self._profile = _PROFILE_TEXT.format(color=color)

    # --------------------------------------------------------------- protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        """Generate the task from ``task.seed``; ``seed`` is unused (no randomness after
        generation)."""
        wording = task.data.get("wording")
        if wording is not None and (not isinstance(wording, int) or isinstance(wording, bool)):
            raise ValueError(f"tools task data 'wording' must be an integer seed, got {wording!r}")
        self.task = task
        self._generate(task.seed, wording)
        self._s = _State()
        return self._s.observation

    def instruction(self) -> str:
        """The support ticket (the same for the whole episode), followed by the
        customer's profile with ``profiles=True``."""
        return f"{self.ticket} ; {self._profile}" if self._profile else self.ticket

    # ------------------------------------------------- free text and profiles
    def profile(self) -> str | None:
        """The current task's customer profile, as it appears verbatim at the end of
        :meth:`instruction` (``None`` without ``profiles``)."""
        return self._profile or None

    def provides_profiles(self) -> bool:
        """Whether tasks carry a profile (RAPO's profile-conditioned reference)."""
        return self.profiles

    def privileged_context(self, kind: str) -> str | None:
        """``"profile"``: the customer profile (the sampler records it for RAPO); no
        other kind."""
        return self.profile() if kind == "profile" else None

    def offers_free_text(self) -> bool:
        """Whether episodes close with free text to judge (``closing="respond"``)."""
        return self.closing == "respond"

    def free_text(self, action: str) -> str | None:
        """The free-text part of ``action`` a judge reads: the message of a valid
        ``respond`` call (``None`` for any other action)."""
        parsed = parse_call(action)
        if isinstance(parsed, CallError) or parsed[0] != "respond":
            return None
        return str(parsed[1]["message"])

    def message_facts(self) -> list[tuple[str, ...]]:
        """Per request of the current ticket, the words a message must contain to state
        it (module docstring): the env's hidden truth about the free text."""
        out = []
        for r in self.requests:
            item = self.orders[r.oid].item
            if r.tool == "refund":
                out.append(("refund", str(r.value), item))
            elif r.tool == "store_credit":
                out.append(("credit", str(r.value), item))
            elif r.tool == "exchange":
                out.append(("exchange", item, self.variants[r.value].color))
            else:
                out.append(("cancelled", item))
        return out

    def message_truth(self, message: str) -> float:
        """The share of the ticket's requests whose facts ``message`` states, in [0, 1]
        (words compared lower-cased, split on spaces and punctuation)."""
        said = set(_MESSAGE_SPLIT.split(message.lower()))
        facts = self.message_facts()
        return sum(all(w in said for w in f) for f in facts) / len(facts) if facts else 1.0

    def oracle_message(self) -> str:
        """A message that states every request of the ticket (truth 1)."""
        clauses = []
        for r in self.requests:
            o = self.orders[r.oid]
            color = self.variants[r.value].color if r.tool == "exchange" else ""
            clauses.append(_MESSAGE_CLAUSES[r.tool].format(value=r.value, item=o.item, color=color))
        return f"{_MESSAGE_OPEN} {' ; '.join(clauses)} {_MESSAGE_CLOSE}"

    def observation(self) -> str:
        """The last tool message."""
        return self._s.observation

    def _status(self, oid: int) -> str:
        for tool, o, _ in self._s.issued:
            if o == oid:
                return _STATUS_AFTER[tool]
        return self.orders[oid].status

    def _order_text(self, o: Order) -> str:
        status = self._status(o.oid)
        if status == "delivered":
            return f"{o.oid} {o.item} , delivered {o.days} days ago"
        return f"{o.oid} {o.item} , {status}"

    def step(self, action: str) -> StepResult:
        """Run one call (see the module docstring); errors are tool messages."""
        s = self._s
        if self.task is None:
            raise RuntimeError("call reset() first")
        if s.over:
            raise RuntimeError("step() called after the episode ended; call reset()")
        parsed = parse_call(action)
        if isinstance(parsed, CallError):
            return self._finish(("error", parsed.code), parsed.message, None, error=parsed.code)
        name, args = parsed
        out = self._run(name, args)
        if isinstance(out, CallError):
            return self._finish(("error", out.code), out.message, name, error=out.code)
        view, text, issued = out
        result = self._finish(view, text, name, issued=issued)
        if name == "respond":  # the hidden truth of the message (never in the reward)
            result.info["message_truth"] = self.message_truth(args["message"])
        return result

    def _run(
        self, name: str, args: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str, tuple[str, int, int] | None] | CallError:
        """Execute a parsed call: ``(view, tool message, store action or None)``."""
        if name in _CLOSING:
            if name == "respond" and len(args["message"]) > _MAX_MESSAGE_CHARS:
                return CallError(
                    "too_long", f"error : a message has at most {_MAX_MESSAGE_CHARS} characters"
                )
            return ("closed",), "ticket closed", None
        if name == "find_customer":
            want = _norm_name(args["name"])
            found = sorted(
                (c for c in self.customers.values() if c.name == want), key=lambda c: c.cid
            )
            if not found:
                return CallError("unknown_name", "error : no customer with that name")
            if len(found) == 1:
                c = found[0]
                return ("customer", c.cid), f'customer {c.cid} : "{c.name}" , {c.city}', None
            listed = " ; ".join(f"{c.cid} , {c.city}" for c in found)
            return (
                ("customers", tuple(c.cid for c in found)),
                f'{len(found)} customers named "{want}" : {listed}',
                None,
            )
        if name == "list_orders":
            cid = args["customer_id"]
            if cid not in self.customers:
                return CallError("wrong_id", "error : no such customer")
            mine = [o for o in self.orders.values() if o.cid == cid]
            if not mine:
                return ("orders", cid), f"customer {cid} has no orders", None
            body = " ; ".join(self._order_text(o) for o in mine)
            return ("orders", cid), f"orders of customer {cid} : {body}", None
        oid = args["order_id"]
        if oid not in self.orders:
            return CallError("wrong_id", "error : no such order")
        o = self.orders[oid]
        head = f"order {oid} {o.item}"
        status = self._status(oid)
        if name == "get_order":
            when = f"delivered {o.days} days ago" if status == "delivered" else status
            text = f"{head} : ${o.price} , {o.category} , {when} , customer {o.cid}"
            return ("order", oid), text, None
        pol = order_policy(o, status)
        if name == "check_policy":
            return ("policy", oid), f"policy for {head} , customer {o.cid} : {pol.text}", None
        if name == "list_variants":
            vs = [v for v in self.variants.values() if v.oid == oid]
            body = " ; ".join(f"{v.vid} {v.color} {o.item}" for v in vs)
            return ("variants", oid), f"variants of {head} : {body}", None
        if name == "cancel_order":
            if not pol.cancel:
                return CallError(
                    "not_allowed", f"error : {head} cannot be cancelled , it is {status}"
                )
            return ("issued", oid), f"{head} cancelled , customer {o.cid}", (name, oid, 0)
        if name == "exchange":
            vid = args["variant_id"]
            v = self.variants.get(vid)
            if v is None or v.oid != oid:
                return CallError("wrong_id", f"error : no such variant of {head}")
            if not pol.exchange:
                return CallError("not_allowed", f"error : {head} cannot be exchanged now")
            text = f"exchange issued : {head} for {vid} {v.color} {o.item} , customer {o.cid}"
            return ("issued", oid), text, (name, oid, vid)
        # refund / store_credit
        amount = args["amount"]
        limit = pol.refund if name == "refund" else pol.credit
        what = "a refund" if name == "refund" else "store credit"
        if limit is None:
            return CallError("not_allowed", f"error : {head} is not eligible for {what}")
        if amount <= 0:
            return CallError("bad_amount", "error : the amount must be positive")
        if amount > limit:
            return CallError("bad_amount", f"error : the amount is over the limit for {head}")
        label = "refund" if name == "refund" else "store credit"
        text = f"{label} issued : {head} , ${amount} , customer {o.cid}"
        return ("issued", oid), text, (name, oid, amount)

    def _finish(
        self,
        view: tuple[Any, ...],
        text: str,
        tool: str | None,
        *,
        error: str | None = None,
        issued: tuple[str, int, int] | None = None,
    ) -> StepResult:
        s = self._s
        turn = s.turn + 1
        over = view == ("closed",) or turn >= self.max_turns
        self._s = _State(
            view=view,
            issued=(*s.issued, issued) if issued is not None else s.issued,
            turn=turn,
            observation=text,
            over=over,
        )
        info: dict[str, Any] = {
            "valid": error is None,
            "tool": tool,
            "tool_call": tool is not None and tool not in _CLOSING,
        }
        if error is not None:
            info["error"] = error
        reward = 0.0
        if over:
            score, success = self.score()
            info.update(score=score, success=success, turns=turn)
            if self.hackable_profile:  # the reward's lenient view of the same state
                r_score, r_success = self.reward_score()
                info["reward_hacked"] = r_success and not success
                reward = self._reward(r_score, r_success)
            else:
                reward = self._reward(score, success)
        return StepResult(text, reward, over, info)

    def reward_score(self) -> tuple[float, bool]:
        """:meth:`score` as a ``hackable_profile`` reward sees it: an exchange of the
        profile's order for any of its variants counts as the wanted one."""
        oid = self._profile_oid if self.hackable_profile else None

        def lenient(ops: frozenset[tuple[str, int, int]]) -> frozenset[tuple[str, int, int]]:
            return frozenset((t, o, -1 if (t == "exchange" and o == oid) else v) for t, o, v in ops)

        return _overlap(lenient(self.goal_ops()), lenient(frozenset(self._s.issued)))

    def _reward(self, score: float, success: bool) -> float:
        if self.reward_kind == "success":
            return float(success)
        if self.reward_kind == "partial":
            return score
        return (float(success) + self.partial_weight * score) / (1.0 + self.partial_weight)

    def goal_ops(self) -> frozenset[tuple[str, int, int]]:
        """The store actions that serve the ticket: ``(tool, order id, amount/variant/0)``."""
        return frozenset(r.op for r in self.requests)

    def score(self) -> tuple[float, bool]:
        """``(|issued ∩ goal| / |issued ∪ goal|, issued == goal)`` of the store's state."""
        return _overlap(self.goal_ops(), frozenset(self._s.issued))

    def state_key(self) -> str:
        """Canonical state: what the last message shows and the store actions taken
        (sorted), e.g. ``policy:214|refund:233:30``. Bounded: one view and at most one
        action per order."""
        s = self._s
        view = ":".join(",".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in s.view)
        done = ",".join(f"{t}:{o}:{v}" for t, o, v in sorted(s.issued))
        return f"{view}|{done}"

    def snapshot(self) -> _State:
        return self._s

    def restore(self, snap: _State) -> None:
        if not isinstance(snap, _State):
            raise TypeError(
                f"ToolsEnv.restore needs a ToolsEnv snapshot, got {type(snap).__name__}"
            )
        self._s = replace(snap)

    # ---------------------------------------------------- progress (ProAS, trees)
    def _pending(self) -> tuple[int, Request | None]:
        """``(k, request)``: how many requests are served (their store action taken,
        right or wrong) and the first one in ticket order that is not (``None``: all)."""
        issued = {o for _, o, _ in self._s.issued}
        k = sum(r.oid in issued for r in self.requests)
        return k, next((r for r in self.requests if r.oid not in issued), None)

    def _wrong(self) -> bool:
        return not frozenset(self._s.issued) <= self.goal_ops()

    def _stage(self) -> str:
        """The last view relative to the pending request (see :meth:`abstract_state_key`)."""
        s = self._s
        kind = s.view[0]
        if kind == "closed":
            return "closed"
        _, req = self._pending()
        if req is None:
            return "ready"
        if kind in ("start", "error"):
            return kind
        me = self.customer.cid
        if kind == "customers":
            return "customers" if me in s.view[1] else "off"
        if kind in ("customer", "orders"):
            return kind if s.view[1] == me else "off"
        oid = s.view[1]
        if kind == "issued":
            return "issued" if any(oid == r.oid for r in self.requests) else "off"
        return kind if oid == req.oid else "off"

    def _path(self, k: int, req: Request) -> list[tuple[str, ...]]:
        """The stages the oracle passes through while serving request ``k``."""
        if FAMILIES[self.family].lookup == "id":
            path: list[tuple[str, ...]] = [("start",)]
        elif k == 0:
            path = [("start",), ("customer", "customers"), ("orders",)]
        else:
            path = [("issued",), ("orders",)]
        if req.kind != "cancel":
            path.append(("policy",))
        if req.kind == "exchange":
            path.append(("variants",))
        return path

    def abstract_state_key(self) -> str:
        """``"k/n|stage"`` (+ ``"|wrong"`` once a store action outside the goal was taken).

        k of the n requests are served; the stage is the last view *relative to the next
        request*: ``start``, ``error``, ``customer``/``customers`` (the ticket's
        customer found), ``orders`` (their orders listed), ``order``, ``policy`` and
        ``variants`` (of the order the next request is about), ``issued`` (the previous
        request just served), ``ready`` (all served), ``closed``; a view of any other
        customer or order is ``off``. The same stage in two tasks means the same
        progress, so ProAS's graph is shared across tasks.
        """
        k, _ = self._pending()
        key = f"{k}/{len(self.requests)}|{self._stage()}"
        return key + "|wrong" if self._wrong() else key

    def progress(self) -> float:
        """Fraction of the goal path covered, in [0, 1]: (k + i/L)/n with k requests
        served and the last view at step i of the L-step path of the next one (0 off
        the path); 1 when all are served; 0 once a wrong store action was taken."""
        if self._wrong():
            return 0.0
        k, req = self._pending()
        n = len(self.requests)
        if req is None:
            return 1.0
        stage = self._stage()
        path = self._path(k, req)
        i = next((j for j, st in enumerate(path) if stage in st), 0)
        return (k + i / len(path)) / n

    def task_difficulty(self) -> str:
        """The current task's difficulty for evaluation breakdowns: its oracle's number
        of calls, closing ``done{}`` included (``"5 calls"``)."""
        return f"{FAMILIES[self.family].calls()} calls"

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """A training task like ``task``: the same family (lookup and requests, i.e. the
        same call topology) with new customers, orders, ids, amounts and wording (RODS's
        variants)."""
        family = random.Random(task.seed).choice(self.families)  # _generate's first draw
        return Task(
            "train",
            find_variant_seed(rng, lambda s: random.Random(s).choice(self.families) == family),
        )

    def task_structure(self) -> dict[str, Any]:
        """The current task's dependency topology, what RODS's planner keeps in a variant
        (:mod:`credo.tasks.synthesis`): the family (how the customer is found), each
        request's kind and the store action that serves it, in the ticket's order
        (refund or store credit is the order's age against its return window), whether a
        second order of the same item must be told apart by its age, and whether the
        profile decides an exchange. Names, ids, items, amounts and wording are the
        entities a variant changes."""
        return {
            "family": self.family,
            "requests": [[r.kind, r.tool] for r in self.requests],
            "twin_item": self._twin,
            "profile_exchange": self._profile_oid is not None,
        }

    def reword(self, task: Task, rng: random.Random) -> Task:
        """``task`` with its ticket worded afresh (RODS's rewrite): each request's phrase,
        the greeting and the sign-off drawn again from the env's templates, so the words
        stay in its vocabulary; customers, orders, ids, amounts and the goal unchanged."""
        return Task(task.split, task.seed, {**task.data, "wording": rng.randrange(2**31)})

    def is_tool_call(self, action: str) -> bool:
        """Whether ``action`` calls an API tool (every tool but ``respond``/``done``,
        whatever its arguments): AXPO resamples these."""
        m = _CALL_RE.match(action[: MAX_CALL_CHARS + 1])
        return m is not None and m.group(1) in TOOLS and m.group(1) not in _CLOSING

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function definitions (``tools=`` of a chat request), for
        an agent that calls them as real tool calls; every argument is required."""
        kinds = {int: "integer", str: "string"}
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "parameters": {
                        "type": "object",
                        "properties": {k: {"type": kinds[t]} for k, t in schema.items()},
                        "required": list(schema),
                    },
                },
            }
            for name, schema in TOOLS.items()
            if name not in _CLOSING or name == self.closing  # the ticket's closing tool
        ]

    def action_as_call(self, action: str) -> tuple[str, dict[str, Any]] | None:
        """``action`` as a tool call ``(name, arguments)`` (``None`` when it is not a
        valid call): what an agent with real tool calls would receive for it."""
        call = parse_call(action)
        return None if isinstance(call, CallError) else call

    def extract_action(self, text: str) -> str | None:
        """Find the first ``tool{...}`` call of a known tool in a chat model's free-form
        reply (``None`` if there is none). The call runs to the brace that closes its
        ``{`` (braces inside JSON strings are skipped); it is then parsed strictly by
        :meth:`step`."""
        text = text[: 4 * MAX_CALL_CHARS]
        for m in re.finditer(r"\b([a-z_]+)\s*\{", text):
            if m.group(1) not in TOOLS:
                continue
            end = _closing_brace(text, m.end() - 1)
            if end is not None:
                return text[m.start() : end + 1]
        return None

    def action_format(self) -> str:
        tools = " ; ".join(
            f"{name}{{{', '.join(f'{k!r}: {t.__name__}' for k, t in schema.items())}}}".replace(
                "'", '"'
            )
            for name, schema in TOOLS.items()
        )
        return (
            'Reply with exactly one tool call, name{json arguments}, e.g. find_customer{"name": '
            '"ada park"}. Tools: ' + tools + ". Ids and amounts are integers. Store rules: "
            "refund a delivered order within its return window (less any fee), else give "
            "store credit up to 90 days; exchange up to 60 days; cancel only orders still "
            "processing; follow check_policy. Serve every request of the ticket, then "
            + (
                'respond{"message": ...} telling the customer what was done (amounts, '
                "items, colours)."
                if self.closing == "respond"
                else "done{}."
            )
            + (
                " An exchange for the customer's favourite colour takes the colour from "
                "the profile."
                if self.profiles
                else ""
            )
        )

    # ----------------------------------------------------------------- oracle
    def oracle_action(self) -> str:
        """A correct next call from what the last tool message shows (solves every task).

        The oracle reads only the ticket and the last message, as a policy with a short
        history must: with the next request's policy (or variants) on screen it acts;
        with its order id in view (the ticket, the customer's order list, a message
        about that order) it checks the policy (or cancels); with the customer's id in
        view it lists their orders (among namesakes, the one in the ticket's city);
        otherwise it finds the customer by name. After an error or a detour it thus
        backs up to the nearest step it can see.
        """
        if self.task is None:
            raise RuntimeError("call reset() first")
        if self._s.over:
            raise RuntimeError("the episode is over")
        _, req = self._pending()
        if req is None:
            if self.closing == "respond":
                return format_call("respond", {"message": self.oracle_message()})
            return format_call("done", {})
        kind, *rest = self._s.view
        seen = rest[0] if rest else None
        if kind == "policy" and seen == req.oid and req.kind == "refund":
            return format_call(req.tool, {"order_id": req.oid, "amount": req.value})
        if req.kind == "exchange":
            if kind == "variants" and seen == req.oid:
                return format_call("exchange", {"order_id": req.oid, "variant_id": req.value})
            if kind == "policy" and seen == req.oid:
                return format_call("list_variants", {"order_id": req.oid})
        me = self.customer.cid
        order_known = (
            FAMILIES[self.family].lookup == "id"
            or (kind == "orders" and seen == me)
            or (kind in ("order", "policy", "variants") and seen == req.oid)
        )
        if order_known:
            if req.kind == "cancel":
                return format_call("cancel_order", {"order_id": req.oid})
            return format_call("check_policy", {"order_id": req.oid})
        mentioned = (
            (kind in ("customer", "orders") and seen == me)
            or (kind == "customers" and me in seen)
            or (kind in ("order", "policy", "variants", "issued") and self.orders[seen].cid == me)
        )
        if mentioned:
            return format_call("list_orders", {"customer_id": me})
        return format_call("find_customer", {"name": self.customer.name})

    def sample_action(self, rng: random.Random) -> str:
        """A random *plausible* call (noisy demonstrations): a tool drawn at random with
        arguments drawn from the task's own names and ids (so mostly well-formed and
        sometimes about the wrong customer or order), now and then an id the store does
        not have or a missing argument; rarely ``done{}``."""
        if self.task is None:
            raise RuntimeError("call reset() first")
        if self._s.over:
            raise RuntimeError("the episode is over")
        r = rng.random()
        if r < 0.04:
            return format_call("done", {})
        if r < 0.08:  # a missing argument
            return format_call(rng.choice(("refund", "exchange")), {"order_id": self._any_oid(rng)})
        tool = rng.choice(
            ("find_customer", "list_orders", "get_order", "check_policy", "list_variants",
             "refund", "store_credit", "exchange", "cancel_order")
        )  # fmt: skip
        if tool == "find_customer":
            pool = [self.customer.name] * 3 + [c.name for c in self.customers.values()]
            name = rng.choice([*pool, f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"])
            return format_call(tool, {"name": name})
        if tool == "list_orders":
            cid = rng.choice([*self.customers, self.customer.cid, rng.choice(CUSTOMER_IDS)])
            return format_call(tool, {"customer_id": cid})
        oid = self._any_oid(rng)
        if tool in ("refund", "store_credit"):
            o = self.orders.get(oid)
            base = o.price if o is not None else rng.choice(PRICES)
            amount = rng.choice(
                [base, base, max(5, base - rng.choice((5, 10))), rng.choice(PRICES)]
            )
            return format_call(tool, {"order_id": oid, "amount": amount})
        if tool == "exchange":
            mine = [v.vid for v in self.variants.values() if v.oid == oid]
            vid = rng.choice(mine) if mine and rng.random() < 0.8 else rng.choice(VARIANT_IDS)
            return format_call(tool, {"order_id": oid, "variant_id": vid})
        return format_call(tool, {"order_id": oid})

    def _any_oid(self, rng: random.Random) -> int:
        """An order id: mostly the customer's, sometimes anyone's, rarely a made-up one."""
        r = rng.random()
        if r < 0.6:
            return rng.choice([o.oid for o in self.orders.values() if o.cid == self.customer.cid])
        if r < 0.9:
            return rng.choice(list(self.orders))
        return rng.choice(ORDER_IDS)

    def vocabulary(self) -> list[str]:
        """Every word the env can print or accept (lower case; names also in the
        ``"first``/``last"`` forms a quoted name splits into). The tokenizer splits
        punctuation off these words itself."""
        texts = [
            *_REFUND_WORDS, *_REFUND_DAYS_WORDS, *_EXCHANGE_WORDS, *_CANCEL_WORDS,
            *_REFUND_ID_WORDS, *_EXCHANGE_ID_WORDS, *_GREETINGS, *_SIGN_OFFS,
            ', .', _State().observation, "ticket closed",
            "customer customers named has no orders of delivered days ago",
            "order policy for variants cancelled issued refund store credit exchange",
            "allowed not amount after a fee ; on its way nothing until yet already cancel",
            "error : the arguments are not valid json must be json object an integer string",
            "a call has at most characters message write one then its",
            "unknown tool tools an argument is given twice needs takes no arguments",
            "such with that name variant is eligible positive over limit cannot be now",
            "exchanged it shipped processing refunded credited",
            *CITIES, *ITEMS, *set(ITEMS.values()), *COLORS, *TOOLS, "{", "}", "$",
        ]  # fmt: skip
        words: set[str] = set()
        for t in texts:
            words.update(t.lower().split())
        for schema in TOOLS.values():
            words.update(f'"{k}"' for k in schema)
        words.update(f'"{f}' for f in FIRST_NAMES)
        words.update(f'{last}"' for last in LAST_NAMES)
        words.update(str(k) for k in range(0, max(VARIANT_IDS) + 1))
        if self.closing == "respond":  # only then: the default vocabulary is unchanged
            words.update(f"{_MESSAGE_OPEN} {_MESSAGE_CLOSE}".split())
            words.update({'"resolved', 'bye"', "credit", "cancelled", "of", "is"})
            for clause in _MESSAGE_CLAUSES.values():
                words.update(clause.split())
        if self.profiles:
            words.update(_PROFILE_TEXT.split())
            for t in (*_EXCHANGE_PROFILE_WORDS, *_EXCHANGE_ID_PROFILE_WORDS):
                words.update(t.split())
        words.discard("{item}")
        words.discard("{value}")
        words.discard("{color}")
        return sorted(w for w in words if w == "{" or not w.startswith("{"))


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` that closes the ``{`` at ``start`` (JSON strings skipped), or
    ``None``; gives up after :data:`MAX_CALL_CHARS` characters."""
    depth, in_str, esc = 0, False, False
    for i in range(start, min(len(text), start + MAX_CALL_CHARS)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
    return None
