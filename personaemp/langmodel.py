"""py3langid's naive Bayes model, read with numpy instead of a per-byte Python loop.

py3langid finds its features (byte n-grams) by walking an Aho-Corasick automaton one byte
at a time in Python: about 0.2 µs a byte, most of the cost of naming a user's language.
In that automaton the state after a byte is the longest suffix of the text read so far
that is a node of the n-gram trie, and no node is longer than DEPTH bytes, so the state at
byte i depends on bytes i-DEPTH+1..i alone. `Model.features` starts DEPTH walks of
DEPTH bytes at once, one per end position, as DEPTH array lookups: the same features, the
same counts, in the same order (tests/test_language.py holds it to py3langid's own walk,
and checks DEPTH and the suffix property on every transition of the installed model).

Scoring is py3langid's too (log1p of the counts times the feature rows, plus the class
prior, script aliases folded), on a float32 copy of the table limited to the languages
asked for; `Model.best` returns what `rank(text)[0]` names, or None where every language
scores the same (no feature of the model in the text).
"""

from __future__ import annotations

import unicodedata

import numpy as np

DEPTH = 6  # bytes of the longest n-gram node in py3langid's shipped model
FLOOR = float(np.finfo(np.float32).min)  # the score of a folded alias column
RESET = 0xFF
PAD = bytes([RESET]) * (DEPTH - 1)


class Model:
    def __init__(self, identifier, languages: list[str]):
        """`identifier`: a py3langid LanguageIdentifier (its arrays are copied, not kept)."""
        identifier.set_languages(languages)
        moves = identifier.tk_nextmove  # state -> its 256 next states, rows shared between states
        states = np.frombuffer(moves, dtype=np.dtype(moves.typecode)).astype(np.int32)
        row_start = np.asarray(identifier.tk_row, dtype=np.int32) * 256
        # Indexed by row start + byte: where the next state's row starts, and the feature that
        # state emits (-1: none). One lookup per byte instead of two or three.
        self.next_row = row_start[states]
        self.next_feature = np.asarray(identifier.tk_output, dtype=np.int32)[states]
        self.start = int(row_start[0])
        self.first_row = self.next_row[self.start : self.start + 256].copy()
        # A byte no n-gram holds (0xFF never occurs in UTF-8) leads back to the start and
        # emits nothing: DEPTH - 1 of them before a text let every position look DEPTH bytes
        # back, the first ones starting afresh as the real walk does, with no edge cases.
        if (self.next_row[RESET::256] != self.start).any() or (self.next_feature[RESET::256] >= 0).any():
            raise RuntimeError("py3langid's model has n-grams holding byte 0xFF: langmodel.py cannot read it")
        # set_languages leaves a column slice of a float16 table: a contiguous float32 copy
        # gathers and multiplies (BLAS) far faster and gives the same answers.
        self.table = np.ascontiguousarray(identifier.nb_ptc, dtype=np.float32)
        self.prior = np.asarray(identifier.nb_pc, dtype=np.float32)
        self.labels = list(identifier.nb_classes)
        first: dict[str, int] = {}
        self.aliases = []  # (first column, later column) of a label listed twice (srl -> sr)
        for column, label in enumerate(self.labels):
            if label in first:
                self.aliases.append((first[label], column))
            else:
                first[label] = column
        self.distinct = sorted(first.values())

    @staticmethod
    def encode(text: str) -> bytes:
        """The bytes py3langid reads for a text: all-capital text lower-cased, NFC, UTF-8
        (lone surrogates kept, as py3langid keeps them)."""
        if text.isupper():
            text = text.lower()
        return unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass")

    def features(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(feature ids, counts), each feature once, in the order of its first occurrence."""
        # Few numpy calls: in the filter, between users' reading, each costs microseconds.
        codes = np.frombuffer(PAD + data, dtype=np.uint8)
        size = len(data)
        # row[i]: the row of the state reached from the start by the DEPTH - 1 bytes before
        # byte i, read one lag at a time, the farthest first.
        row = self.first_row.take(codes[:size])  # from the start: its row, 256 entries
        for back in range(1, DEPTH - 1):
            np.take(self.next_row, row + codes[back : back + size], out=row, mode="clip")
        found = np.take(self.next_feature, row + codes[DEPTH - 1 :], mode="clip")
        positions = np.flatnonzero(found >= 0)
        if not len(positions):
            return positions, positions
        # Sorted by feature, then position: each feature's run gives its count and its first
        # position. Returned in first-occurrence order because the score's float sum follows
        # the order, and py3langid's (a Counter's) is the one to match bit for bit.
        keys = found[positions].astype(np.int64) << 32 | positions
        keys.sort()
        features = keys >> 32
        starts = np.flatnonzero(np.concatenate(([True], features[1:] != features[:-1])))
        counts = np.diff(starts, append=len(keys))
        order = np.argsort(keys[starts] & 0xFFFFFFFF)
        return features[starts][order], counts[order]

    def scores(self, text: str) -> np.ndarray | None:
        """Log-score per label column (py3langid's, aliases unfolded), or None when the text
        holds none of the features."""
        ids, counts = self.features(self.encode(text))
        if not len(ids):
            return None
        return np.log1p(counts.astype(np.float32)) @ self.table.take(ids, axis=0) + self.prior

    def best(self, text: str) -> str | None:
        """The top language, None where all score alike (no evidence either way): what
        py3langid's rank(text) puts first, ties to the first label."""
        scores = self.scores(text)
        if scores is None:
            return None
        values = scores.tolist()  # exact (float32 to float), and cheaper than numpy scalars
        for first, later in self.aliases:  # a label listed twice scores its better column
            values[first] = max(values[first], values[later])
            values[later] = FLOOR
        distinct = [values[column] for column in self.distinct]
        top = max(distinct)
        if top == min(distinct):
            return None
        return self.labels[values.index(top)]
