"""``bfcl``: the Berkeley Function Calling Leaderboard's multi-turn tasks, on its own
executable backends, judged by its own state-based checker.

BFCL (Patil et al., 2025, https://gorilla.cs.berkeley.edu/leaderboard.html) v3+ has
*multi-turn* categories: a user asks for several things in turn (move a file, grep it,
post a tweet about it); the model answers each request with calls to Python APIs that
really run (a file system, a trading bot, a travel-booking service, a vehicle, a
messaging and a ticketing API: ``bfcl_eval``'s ``func_source_code``), in as many steps as
it needs, and a request is done when it answers without calling anything. This env plays
the ``multi_turn_base`` category (200 tasks) of the installed ``bfcl-eval`` package::

    credo eval --env bfcl --model ...            # held-out: 40 of the 200 tasks
    credo check-env --env bfcl

Install with ``pip install --no-deps bfcl-eval==2026.3.23`` (the backends need only
``mpmath``, which torch brings; bfcl-eval's own dependencies are its model clients). A
missing package is one line.

**A task** is one BFCL entry: its user turns, its initial backend state and its ground
truth. The held-out split is every fifth entry (``multi_turn_base_0``, ``_5``, ...: 40
tasks); training tasks are the other 160; ``task.seed`` picks an entry of its split
(modulo its size), so every seed is a real task.

**The instruction** lists the functions of the entry's backends (BFCL's own JSON
documents) and the call format. **An action** is a Python list of calls in BFCL's format,
``[cd(folder='document'), mkdir(dir_name='temp')]`` (a single call without brackets works
too); each call is run on the backends and the observation is their results, one line
each. A reply that is not a call list ends the user's request (BFCL's rule: the model
answers in words), and the observation is the next request. At most ``max_steps`` call
steps per request (default 10, as a budget, BFCL allows 20), then the request ends.

**Safety**: model output is never ``eval``-ed (BFCL's own executor does ``eval``). The
reply is parsed with :mod:`ast`; only a call (or a list of calls) of a plain name with
literal arguments (:func:`ast.literal_eval`: numbers, strings, lists, dicts, ``True``;
JSON's ``true``/``false``/``null`` too) is accepted, integers beyond :data:`MAX_INT` are refused (an API such as ``MathAPI``
would compute with them), and the name must be a public method of one of the entry's
backends; anything else is an error result, as BFCL reports a failed call.

**Success** is BFCL's checker, turn by turn: after each request the ground truth's calls
for it run on a second copy of the backends, then ``state_checker`` (every public
attribute of every backend equal) and ``response_checker`` (the ground truth's results
among the model's results so far) of ``bfcl_eval`` decide; the first request that fails
ends the episode as a failure, as BFCL scores it. Reward: ``"success"`` (0/1, default) or
``"turns"`` (the share of requests passed, on the last step).

**Oracle**: the ground truth's calls for the current request, then a reply in words
(``done``): demonstrations for a warm start (SFT from the ground truth).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import random
import re
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from credo.envs.base import StepResult, Task, register_env
from credo.envs.thirdparty import MissingPackage

__all__ = ["CATEGORY", "MAX_INT", "BfclEnv", "parse_calls"]

#: The BFCL category played (its data file ``BFCL_v4_<category>.json``).
CATEGORY = "multi_turn_base"
#: Integer literals beyond this magnitude are refused (no API needs them; MathAPI would
#: compute with them for ever).
MAX_INT = 10**12
#: Only this many leading characters of a reply are read.
MAX_ACTION_CHARS = 4000
#: Each call's result is cut to this many characters in the observation.
MAX_RESULT_CHARS = 600
#: Every this-many-th entry is held out.
HELDOUT_EVERY = 5
#: What the oracle replies to end a request.
DONE = "done"


def _package_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(
            "env 'bfcl' needs the 'bfcl-eval' package (BFCL's data, backends and checker), "
            "which is not installed: pip install --no-deps bfcl-eval==2026.3.23"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _entries() -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """(training entries, held-out entries), each with its ground truth."""
    data = _package_dir() / "data"

    def rows(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    truth = {
        r["id"]: r["ground_truth"]
        for r in rows(data / "possible_answer" / f"BFCL_v4_{CATEGORY}.json")
    }
    entries = [
        {**r, "ground_truth": truth[r["id"]]} for r in rows(data / f"BFCL_v4_{CATEGORY}.json")
    ]
    train = tuple(e for i, e in enumerate(entries) if i % HELDOUT_EVERY)
    test = tuple(e for i, e in enumerate(entries) if i % HELDOUT_EVERY == 0)
    return train, test


@cache
def _function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = (
        _package_dir()
        / "data"
        / "multi_turn_func_doc"
        / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    )
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


class _LowerConstants(ast.NodeTransformer):
    """``true``/``false``/``none`` (JSON's spelling, and what a lower-casing tokenizer
    writes) read as Python's ``True``/``False``/``None``."""

    NAMES: ClassVar[dict[str, Any]] = {"true": True, "false": False, "none": None, "null": None}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.NAMES:
            return ast.copy_location(ast.Constant(self.NAMES[node.id]), node)
        return node


def _literal(node: ast.expr) -> Any:
    value = ast.literal_eval(_LowerConstants().visit(node))
    stack = [value]
    while stack:  # refuse huge integers anywhere inside
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            raise ValueError(f"the integer {item} is too large")
        if isinstance(item, (list, tuple, set)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend([*item.keys(), *item.values()])
    return value


def parse_calls(text: str) -> list[tuple[str, list[Any], dict[str, Any]]] | None:
    """The calls in a reply, ``[name(args...), ...]`` or one ``name(args...)``, as
    ``(name, positional, keyword)``; ``None`` if the reply is not a call list (an answer
    in words). Arguments must be literals; nothing is evaluated."""
    text = text[:MAX_ACTION_CHARS].strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("python").strip()
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    if not nodes or not all(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) for n in nodes
    ):
        return None
    calls = []
    for node in nodes:
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        try:
            args = [_literal(a) for a in node.args]
            kwargs = {k.arg: _literal(k.value) for k in node.keywords if k.arg is not None}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            calls.append((node.func.id, [], {"__invalid__": True}))
            continue
        if len(kwargs) != len(node.keywords):  # **kwargs
            calls.append((node.func.id, [], {"__invalid__": True}))
            continue
        calls.append((node.func.id, args, kwargs))
    return calls


#: Words as the built-in word-level tokenizer splits them (whitespace, then ``[ ] $ ; : ,
#: .`` on their own); envs do not import the policy package.
_WORDS = re.compile(r"[^\s\[\]$;:,.]+|[\[\]$;:,.]")


def split_words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def _result_text(value: Any) -> str:
    """A call's result as BFCL records it (a str as is, a dict as JSON, else ``str``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class _Backends:
    """One entry's API instances (BFCL's classes, loaded with its initial state)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        from bfcl_eval.constants.executable_backend_config import (
            CLASS_FILE_PATH_MAPPING,
            STATELESS_CLASSES,
        )

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for name in entry["involved_classes"]:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
            if name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(entry["initial_config"].get(name, {})))
            self.instances[name] = instance
            for method, bound in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method.startswith("_"):
                    self.methods[method] = bound

    def run(self, calls: list[tuple[str, list[Any], dict[str, Any]]]) -> list[str]:
        results = []
        for name, args, kwargs in calls:
            if kwargs.get("__invalid__"):
                results.append(f"Error during execution: {name}: arguments must be literal values")
            elif name not in self.methods:
                results.append(f"Error during execution: no function named {name!r}")
            else:
                try:
                    results.append(_result_text(self.methods[name](*args, **kwargs)))
                except Exception as exc:  # the API's own error, as BFCL reports it
                    results.append(f"Error during execution: {exc}")
        return results


@register_env("bfcl")
class BfclEnv:
    """BFCL's multi-turn base category (see the module docstring).

    Args:
        max_steps: call steps per user request before it ends (default 10).
        reward: ``"success"`` (0/1, default) or ``"turns"`` (share of requests passed).
        functions: ``"json"`` (BFCL's JSON documents, default) or ``"compact"`` (one line
            per function: name, parameters, the first sentence of its description; a
            prompt about a quarter as long, for small models).
    """

    def __init__(
        self, *, max_steps: int = 10, reward: str = "success", functions: str = "json"
    ) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"bfcl max_steps must be a positive integer, got {max_steps!r}")
        if reward not in ("success", "turns"):
            raise ValueError(f"bfcl reward must be 'success' or 'turns', got {reward!r}")
        if functions not in ("json", "compact"):
            raise ValueError(f"bfcl functions must be 'json' or 'compact', got {functions!r}")
        _entries()  # a missing package is refused before any episode
        self.max_steps, self.reward_kind, self.functions = max_steps, reward, functions
        self.max_turns = 0
        self.task: Task | None = None
        self.entry: dict[str, Any] = {}

    # ------------------------------------------------------------ episode
    def reset(self, task: Task, seed: int = 0) -> str:
        """The entry of ``task`` (``seed`` is unused), at its first request."""
        train, test = _entries()
        pool = test if task.split == "test" else train
        self.task, self.entry = task, pool[task.seed % len(pool)]
        self.model, self.truth = _Backends(self.entry), _Backends(self.entry)
        self.request, self.steps, self.passed = 0, 0, 0
        self.results: list[str] = []  # the model's results over all requests (BFCL's rule)
        self._done, self.failure = False, ""
        self.max_turns = len(self.entry["question"]) * (self.max_steps + 1)
        return self._request_text()

    def _request_text(self) -> str:
        messages = self.entry["question"][self.request]
        return "\n".join(m["content"] for m in messages if m.get("role") == "user")

    def instruction(self) -> str:
        lines = [
            "You operate the APIs below for a user. To call functions, reply with only a "
            "Python list of calls, [func_name(param=value, ...), ...], and read their "
            "results; when the user's request is done, reply in words (no call).",
            "Functions:",
        ]
        for cls in self.entry["involved_classes"]:
            for doc in _function_docs(cls):
                lines.append(self._doc(doc))
        return "\n".join(lines)

    def _doc(self, doc: dict[str, Any]) -> str:
        if self.functions == "json":
            return json.dumps(doc)
        params = doc.get("parameters", {}).get("properties", {})
        required = set(doc.get("parameters", {}).get("required", []))
        args = ", ".join(
            f"{p}{'' if p in required else '?'}: {v.get('type', '')}" for p, v in params.items()
        )
        what = doc.get("description", "").split("Tool description:")[-1].strip().split(". ")[0]
        return f"{doc['name']}({args}) : {what}"

    def action_format(self) -> str:
        return "Reply with [func_name(param=value, ...)] to call functions, or in words when done."

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        calls = parse_calls(action)
        info: dict[str, Any] = {"valid": True, "request": self.request}
        if calls is not None:
            self.steps += 1
            results = self.model.run(calls)
            self.results.extend(results)
            info["calls"] = len(calls)
            info["valid"] = not any(r.startswith("Error during execution") for r in results)
            text = "\n".join(
                f"{name} : {r[:MAX_RESULT_CHARS]}" for (name, _, _), r in zip(calls, results)
            )
            if self.steps < self.max_steps:
                return StepResult(text, 0.0, False, info)
        return self._end_request(info)

    def _end_request(self, info: dict[str, Any]) -> StepResult:
        """The request is answered: run its ground truth, check as BFCL does."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            response_checker,
            state_checker,
        )

        truth_calls = [
            c for call in self.entry["ground_truth"][self.request] for c in parse_calls(call) or []
        ]
        truth_results = self.truth.run(truth_calls)
        ok = True
        if truth_calls:
            state = state_checker(self.model.instances, self.truth.instances)
            response = response_checker(self.results, truth_results, self.request)
            ok = state["valid"] and response["valid"]
            if not ok:
                self.failure = (state if not state["valid"] else response)["error_type"]
        self.passed += ok
        self.request += 1
        self.steps = 0
        last = self.request >= len(self.entry["question"])
        if ok and not last:
            return StepResult(self._request_text(), 0.0, False, info)
        self._done = True
        success = ok and last
        turns = len(self.entry["question"])
        info.update(success=success, turns_passed=self.passed, requests=turns)
        if self.failure:
            info["failure"] = self.failure
        reward = float(success) if self.reward_kind == "success" else self.passed / turns
        text = (
            "all requests done ." if success else f"request {self.request} failed : {self.failure}"
        )
        return StepResult(text, reward, True, info)

    # ------------------------------------------------------------ state
    def state_key(self) -> str:
        """The request and a digest of the backends' public state."""
        state = {
            name: {k: v for k, v in vars(inst).items() if not k.startswith("_")}
            for name, inst in self.model.instances.items()
        }
        digest = hashlib.sha1(repr(state).encode()).hexdigest()[:16]
        key = f"r{self.request}|{digest}"
        return f"done|{key}" if self._done else key

    def progress(self) -> float:
        return self.passed / max(1, len(self.entry["question"]))

    #: What an episode is: every attribute that ``reset`` and ``step`` change; the task
    #: and its BFCL entry are read-only (the backends load a copy of its state), so a
    #: snapshot shares them and copies the rest.
    _SHARED = ("task", "entry")
    _EPISODE = (
        "model",
        "truth",
        "request",
        "steps",
        "passed",
        "results",
        "_done",
        "failure",
        "max_turns",
    )

    def snapshot(self) -> Any:
        shared = {name: getattr(self, name) for name in self._SHARED}
        return shared, copy.deepcopy({name: getattr(self, name) for name in self._EPISODE})

    def restore(self, snap: Any) -> None:
        shared, own = snap
        for name, value in (*shared.items(), *copy.deepcopy(own).items()):
            setattr(self, name, value)

    # ------------------------------------------------------------ helpers
    def oracle_action(self) -> str:
        """The ground truth's calls for this request (one step), then ``done``."""
        if self.steps == 0 and self.entry["ground_truth"][self.request]:
            return "[" + ", ".join(self.entry["ground_truth"][self.request]) + "]"
        return DONE

    def sample_action(self, rng: random.Random) -> str:
        """A call of a random function of the entry's APIs with no arguments, or done."""
        names = sorted(self.model.methods)
        return DONE if rng.random() < 0.2 or not names else f"[{rng.choice(names)}()]"

    def task_difficulty(self) -> str:
        return f"{len(self.entry['question'])} requests"

    def vocabulary(self) -> list[str]:
        """Words of every entry's requests, function documents and ground truth."""
        words: set[str] = set()
        train, test = _entries()
        classes = set()
        for entry in (*train, *test):
            classes.update(entry["involved_classes"])
            for turn in entry["question"]:
                for message in turn:
                    words.update(split_words(message["content"]))
            for turn in entry["ground_truth"]:
                for call in turn:
                    words.update(split_words(call))
        for cls in classes:
            for doc in _function_docs(cls):
                words.update(split_words(json.dumps(doc)))
        words.update(split_words(self.action_format() + " " + DONE + " all requests done . failed"))
        return sorted(words)
