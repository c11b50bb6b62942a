"""How long a prompt is, in tokens, at least: decided without tokenising it.

Tokenising costs time in proportion to the text (the built-in word-level tokenizer: about
0.6 µs a byte on one core, a 30 MB prompt 53 s of CPU on a loaded machine, blocking every
other client of the server), so a server that tokenises whatever arrives before it checks
the model's context can be made to do unbounded work. The engine therefore checks a
rendered prompt against the context with two *lower bounds* on its token count, each
valid only for tokenizers whose construction guarantees it (:meth:`PromptBound.of` reads
the fast tokenizer's own description to decide):

- **bytes**: when every token covers at most ``B`` bytes of the text (byte-level BPE such
  as GPT-2's, SmolLM's and Qwen's, or BPE with byte fallback; no normaliser that can
  shrink the text, no added token that swallows whitespace), a text of ``n`` UTF-8 bytes
  has at least ``ceil(n / B)`` tokens. ``B`` is the longest token's length in bytes.
- **words**: when the pre-tokenizer splits at whitespace (byte-level regex, whitespace,
  BERT and split Metaspace pre-tokenizers) and the model drops nothing (an unknown-token
  or every ASCII letter and digit in the vocabulary), every whitespace-separated run that
  holds an ASCII letter or digit is at least one token of its own. Counting them is a
  C-speed regex scan that stops once it reaches the context.

A prompt whose lower bound reaches the context is refused (400) before it is tokenised:
it certainly leaves no room for a reply, so no request that would fit is refused. Where
no bound caps the bytes (a word-level model's unknown word is one token however long),
the engine also caps the bytes it will tokenise (:data:`FALLBACK_BYTES_PER_TOKEN` per
token of context, or ``EngineConfig.max_prompt_bytes``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["FALLBACK_BYTES_PER_TOKEN", "PromptBound"]

#: Bytes per token of context the engine tokenises at most when the tokenizer gives no
#: certain bound (a prompt longer than ``context × 64`` bytes is refused unread).
FALLBACK_BYTES_PER_TOKEN = 64

#: Characters every supported pre-tokenizer treats as whitespace (Python's ``str.isspace``
#: and Rust's ``char::is_whitespace`` both include these; each side differs elsewhere).
_WS = " \t\n\r\x0b\x0c"
#: A run's first ASCII letter or digit, and the rest of the run: one match per run that
#: holds one (the scan resumes after the run), never backtracking.
_ALNUM_RUN = re.compile(r"[A-Za-z0-9][^ \t\n\r\x0b\x0c]*")
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

#: Pre-tokenizers after which no piece spans a whitespace character.
_WS_SPLITTERS = {"WhitespaceSplit", "Whitespace", "BertPreTokenizer"}
#: Normalizers that never delete an ASCII letter or digit nor remove whitespace between
#: two runs.
_WORD_SAFE_NORMALIZERS = {
    "Lowercase",
    "NFC",
    "NFD",
    "NFKC",
    "NFKD",
    "BertNormalizer",
    "StripAccents",
    "Strip",
    "Prepend",
}


def _flat(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """The components of a (possibly ``Sequence``) normalizer or pre-tokenizer."""
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [c for part in spec.get(key, []) for c in _flat(part, key)]
    return [spec]


def _splits_at_whitespace(pre: dict[str, Any] | None) -> bool:
    for c in _flat(pre, "pretokenizers"):
        kind = c.get("type")
        if kind in _WS_SPLITTERS:
            return True
        if kind == "ByteLevel" and c.get("use_regex", True):
            return True
        if kind == "Metaspace" and c.get("split", True):
            return True
    return False


def _never_shrinks(norm: dict[str, Any] | None) -> bool:
    """The normalizer only adds bytes: none, ``Prepend``, or ``Replace`` of a string by
    one at least as long."""
    for c in _flat(norm, "normalizers"):
        kind = c.get("type")
        if kind == "Prepend":
            continue
        pattern = c.get("pattern", {})
        if (
            kind == "Replace"
            and "String" in pattern
            and len(str(c.get("content", "")).encode()) >= len(str(pattern["String"]).encode())
        ):
            continue
        return False
    return True


@dataclass(frozen=True)
class PromptBound:
    """Which lower bounds on a prompt's tokens hold for a tokenizer (module docstring).

    Attributes:
        words: every whitespace-separated run holding an ASCII letter or digit is at least
            one token.
        bytes_per_token: every token covers at most this many UTF-8 bytes of the text
            (``None``: no such bound).
    """

    words: bool = False
    bytes_per_token: int | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> PromptBound:
        """The bounds that hold for ``tokenizer`` (none for a tokenizer that is not a
        Hugging Face fast tokenizer, or whose description cannot be read)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        try:
            spec = json.loads(backend.to_str()) if backend is not None else None
        except Exception:  # a tokenizer that cannot describe itself gets no bound
            spec = None
        if not isinstance(spec, dict):
            return cls()
        model = spec.get("model") or {}
        vocab = model.get("vocab")
        vocab = vocab if isinstance(vocab, dict) else {}
        added = [a for a in spec.get("added_tokens") or [] if isinstance(a, dict)]
        contents = [str(a.get("content", "")) for a in added]
        pre, norm = spec.get("pre_tokenizer"), spec.get("normalizer")
        keeps_alnum = bool(model.get("unk_token")) or all(ch in vocab for ch in _ALNUM)
        words = (
            _splits_at_whitespace(pre)
            and keeps_alnum
            and all(n.get("type") in _WORD_SAFE_NORMALIZERS for n in _flat(norm, "normalizers"))
            and not any(  # an added token spanning whitespace could join two runs
                any(w in c for w in _WS) and any(ch in _ALNUM for ch in c) for c in contents
            )
        )
        byte_level = any(c.get("type") == "ByteLevel" for c in _flat(pre, "pretokenizers"))
        per_token = None
        if (
            model.get("type") == "BPE"
            and vocab
            and (model.get("byte_fallback") or (byte_level and _has_every_byte(vocab)))
            and _never_shrinks(norm)
            and not any(a.get("lstrip") or a.get("rstrip") for a in added)
        ):
            # byte-level vocabularies spell each byte as one character; others are UTF-8
            # text (an over-estimate of the bytes a token covers, which keeps the bound)
            longest = max(len(t) if byte_level else len(t.encode()) for t in vocab)
            per_token = max([longest, *(len(c.encode()) for c in contents)])
        return cls(words=words, bytes_per_token=per_token)

    def min_tokens(self, text: str, stop: int) -> int:
        """A lower bound on the number of tokens of ``text``, counted up to ``stop`` (the
        count stops there: the caller only asks whether it is reached)."""
        best = 0
        if self.bytes_per_token:
            size = len(text.encode("utf-8", "surrogatepass"))
            best = -(-size // self.bytes_per_token)
            if best >= stop:
                return stop
        if self.words:
            runs = 0
            for _ in _ALNUM_RUN.finditer(text):
                runs += 1
                if runs >= stop:
                    return stop
            best = max(best, runs)
        return best


def _has_every_byte(vocab: dict[str, Any]) -> bool:
    """A byte-level vocabulary holds the character of each of the 256 bytes (else BPE
    would drop a byte it cannot spell, and a text could have fewer tokens than bytes)."""
    from tokenizers.pre_tokenizers import ByteLevel

    return all(ch in vocab for ch in ByteLevel.alphabet())
