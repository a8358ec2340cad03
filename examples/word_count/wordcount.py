"""word-count's messages and journals: `NGramCount` deltas, as JSON lines.

Gazette's word-count writes `word_count.NGramCount{uuid, n_gram, count}` protobufs in fixed
framing; here the same message is a JSON line in Go's field style:

    {"UUID":"<message UUID>","NGram":"it was","Count":2}

Texts are tokenized as Gazette's `Counter.Publish` does: lowercased, split into runs of
letters, and cut into N-grams padded with START and END tokens (for N=1: every word, and
one END per text). Deltas are mapped to the partitions labeled with the NGramCount message
type by 32-bit FNV-1a of the N-gram, modulo the number of partitions (Gazette's
ModuloMapping), so the N-gram's count lives in exactly one shard: the one reading that
partition.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pygazette.message.json_framing import JSONFraming
from pygazette.message.mapping import MappingFunc, modulo_mapping

__all__ = [
    "DELTAS_SELECTOR",
    "FRAMING",
    "NGRAM_MESSAGE_TYPE",
    "deltas_mapping",
    "ngram_counts",
    "ngrams",
    "tokenize",
]

NGRAM_MESSAGE_TYPE = "word_count.NGramCount"
DELTAS_SELECTOR = f"app.gazette.dev/message-type={NGRAM_MESSAGE_TYPE}"
FRAMING = JSONFraming(uuid_field="UUID")

_LETTERS = re.compile(r"[^\W\d_]+")


def tokenize(text: str) -> list[str]:
    """Lowercased runs of letters (Go: strings.FieldsFunc(ToLower(text), !IsLetter))."""
    return _LETTERS.findall(text.lower())


def ngrams(text: str, n: int = 1) -> list[str]:
    """The N-grams of `text`, as Gazette's Counter.Publish extracts them."""
    if n < 1:
        raise ValueError(f"N must be >= 1 (got {n})")
    words = tokenize(text)
    grams = ["START"] * n
    out: list[str] = []
    for i in range(len(words) + n):
        grams = [*grams[1:], words[i] if i < len(words) else "END"]
        out.append(" ".join(grams))
    return out


def ngram_counts(text: str, n: int = 1) -> list[dict[str, Any]]:
    """NGramCount deltas of `text`: one message per distinct N-gram, with its count."""
    return [
        {"UUID": "", "NGram": gram, "Count": count}
        for gram, count in Counter(ngrams(text, n)).items()
    ]


def deltas_mapping(partitions: Any) -> MappingFunc:
    """NGramCounts to their partition by FNV-1a of the N-gram (works on a bare N-gram
    string too, to find where a query must look)."""
    return modulo_mapping(lambda m: m if isinstance(m, str) else m["NGram"], partitions)
