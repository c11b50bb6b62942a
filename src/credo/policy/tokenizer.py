"""A word-level tokenizer built from the envs' vocabulary (for the built-in tiny model).

Words are split on whitespace and on the punctuation ``[ ] $ ; : , .``, lower-cased, and
looked up in a fixed vocabulary; decoding joins tokens with spaces (``click [ 2 ]``),
which every built-in action parser accepts. The result is an ordinary
``PreTrainedTokenizerFast`` saved in a folder that ``AutoTokenizer.from_pretrained`` loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "build_word_tokenizer", "split_words", "user_message_ids"]

SPECIAL_TOKENS = {
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
}
_PUNCT = r"[\[\]\$;:,\.]"


def user_message_ids(tokenizer: Any, text: str, plain: str | None = None) -> list[int]:
    """The prompt ids of one user message ``text``, ready for the reply: the tokenizer's
    chat template (with the generation prompt) where it has one, else ``plain`` (default
    ``text``) encoded as it is (the built-in model's word-level tokenizer)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [
        int(i) for i in tokenizer.encode(text if plain is None else plain, add_special_tokens=False)
    ]


def split_words(text: str) -> list[str]:
    """The words the tokenizer would see in ``text`` (for building vocabularies)."""
    return [w for w, _ in _pre_tokenizer().pre_tokenize_str(text.lower())]


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(_PUNCT), behavior="isolated")]
    )


def build_word_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` plus ``<pad> <unk> <bos> <eos>`` (ids 0–3)."""
    vocab: dict[str, int] = {}
    for tok in SPECIAL_TOKENS.values():
        vocab[tok] = len(vocab)
    for w in sorted({w.lower() for w in words}):
        for piece in split_words(w):
            if piece not in vocab:
                vocab[piece] = len(vocab)
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    fast.padding_side = "left"
    return fast
