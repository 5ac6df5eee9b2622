"""Word-level tokenizer for the tiny diffusion LMs, trained with ``tokenizers`` on ``train.txt``.

Words, numbers and runs of punctuation are single tokens (``Whitespace`` pre-tokenizer:
``\\w+|[^\\w\\s]+``), so every number 0..99 and ``####`` is one token and a newline is plain
whitespace. Special tokens: ``[PAD] [MASK] [EOS] [BOS] [UNK]`` (ids 0..4 in that order). A
post-processor puts ``[BOS]`` in front of every encoded text when ``add_special_tokens`` is on
(the training documents carry it too). Decoding joins words with spaces and glues ``.``/``?``/
``,`` to the preceding word, so ``decode(encode(" 7"))`` is ``"7"`` and ``"#### 7"`` round-trips.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[EOS]", "[BOS]", "[UNK]")
PAD, MASK, EOS, BOS, UNK = SPECIAL_TOKENS
# A word-piece prefix that no token carries: the WordPiece decoder then only joins with spaces
# and applies its punctuation clean-up ("7 ." -> "7.").
_NO_PREFIX = "\u0001\u0001"


def _pre_tokenizer():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.Whitespace()


def train_tokenizer(texts: Iterable[str], min_frequency: int = 1):
    """Train a WordLevel ``tokenizers.Tokenizer`` on ``texts``.

    The vocabulary is the special tokens, then the numbers 0..99, then every other pre-token
    ordered by descending frequency and then alphabetically, so ids are deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, processors

    pre = _pre_tokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(tok for tok, _ in pre.pre_tokenize_str(text))
    vocab: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    for i in range(100):
        vocab.setdefault(str(i), len(vocab))
    for tok, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if c >= min_frequency and tok not in vocab:
            vocab[tok] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(prefix=_NO_PREFIX, cleanup=True)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])])
    return tok


def wrap_fast(tok):
    """Wrap a ``tokenizers.Tokenizer`` as a ``PreTrainedTokenizerFast`` with the special tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, mask_token=MASK, eos_token=EOS, bos_token=BOS,
        unk_token=UNK, padding_side="left", clean_up_tokenization_spaces=False,
        model_max_length=1024)


def build_tokenizer(train_txt: str | Path, min_frequency: int = 1):
    """Train on ``train.txt`` (one document per line) and return the HF fast tokenizer."""
    lines = Path(train_txt).read_text().splitlines()
    return wrap_fast(train_tokenizer(lines, min_frequency=min_frequency))
