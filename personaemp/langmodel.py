"""py3langid's naive Bayes model, read with numpy instead of a per-byte Python loop.

py3langid finds its features (byte n-grams) by walking an Aho-Corasick automaton one byte
at a time in Python: about 0.2 µs a byte, most of the cost of naming a user's language.
In that automaton the state after a byte is the longest suffix of the text read so far
that is a node of the n-gram trie, and no node is longer than DEPTH bytes, so the state at
byte i depends on bytes i-DEPTH+1..i alone. `Model.features_of_many` starts a walk of
DEPTH bytes at every position of every text at once, as DEPTH array lookups: the same
features, the same counts, in the same order (tests/unit/test_langmodel.py holds it to
py3langid's own walk, and checks DEPTH and the suffix property on every transition of the
installed model). Many texts go through the same numpy calls: inside the filter each call
costs microseconds, so its kept users are decided a batch at a time.

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
BATCH = 256  # texts walked together at most: their indexes fit in the keys' top 11 bits
# A sort key packs (text, feature, position): positions of a batch below 2**32 bytes,
# feature ids below 2**20 (py3langid's model has about 100,000).
POSITION_BITS, FEATURE_BITS = 32, 20
TEXT_SHIFT = POSITION_BITS + FEATURE_BITS
POSITION_MASK, FEATURE_MASK = (1 << POSITION_BITS) - 1, (1 << FEATURE_BITS) - 1
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
        if len(identifier.nb_ptc) > FEATURE_MASK:
            raise RuntimeError("py3langid's model has more features than langmodel.py's keys hold")
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
        return self.features_of_many([data])[0]

    def features_of_many(self, datas: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`features` of each text, all texts walked and counted by the same numpy calls:
        inside the filter each call costs microseconds (the reading between users evicts the
        caches), so a batch of users pays them once."""
        if len(datas) > BATCH:  # the keys below hold the index of BATCH texts at most
            return [
                found
                for start in range(0, len(datas), BATCH)
                for found in self.features_of_many(datas[start : start + BATCH])
            ]
        # The texts one after the other, PAD before each: a walk crossing it starts afresh.
        codes = np.frombuffer(PAD + PAD.join(datas), dtype=np.uint8)
        size = len(codes) - len(PAD)
        # row[i]: the row of the state reached from the start by the DEPTH - 1 bytes before
        # byte i, read one lag at a time, the farthest first.
        row = self.first_row.take(codes[:size])  # from the start: its row, 256 entries
        for back in range(1, DEPTH - 1):
            np.take(self.next_row, row + codes[back : back + size], out=row, mode="clip")
        found = np.take(self.next_feature, row + codes[DEPTH - 1 :], mode="clip")
        positions = np.flatnonzero(found >= 0)
        if not len(positions):
            return [(positions, positions)] * len(datas)
        ends = np.cumsum([len(data) + len(PAD) for data in datas])
        text = np.searchsorted(ends, positions, side="right")
        # Sorted by text, feature, then position: each (text, feature) run gives its count and
        # its first position. Kept in first-occurrence order because the score's float sum
        # follows the order, and py3langid's (a Counter's) is the one to match bit for bit.
        keys = text << TEXT_SHIFT | found[positions].astype(np.int64) << POSITION_BITS | positions
        keys.sort()
        groups = keys >> POSITION_BITS
        starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
        counts = np.diff(starts, append=len(keys))
        firsts = keys[starts]
        order = np.argsort(firsts >> TEXT_SHIFT << POSITION_BITS | firsts & POSITION_MASK)
        firsts, counts = firsts[order], counts[order]
        bounds = np.searchsorted(firsts >> TEXT_SHIFT, np.arange(len(datas) + 1)).tolist()
        ids = groups[starts][order] & FEATURE_MASK
        return [(ids[a:b], counts[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]

    def scores(self, text: str) -> np.ndarray | None:
        """Log-score per label column (py3langid's, aliases unfolded), or None when the text
        holds none of the features."""
        return self.scores_of_many([text])[0]

    def scores_of_many(self, texts: list[str]) -> list[np.ndarray | None]:
        matrix, scored = self._score_matrix(texts)
        return [row if has else None for row, has in zip(matrix, scored, strict=True)]

    def _score_matrix(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """One row of scores per text, and whether the text held any feature."""
        found = self.features_of_many([self.encode(text) for text in texts])
        counted = [len(ids) for ids, _ in found]
        matrix = np.zeros((len(texts), len(self.labels)), dtype=np.float32)
        if any(counted):
            ids = np.concatenate([ids for ids, _ in found])
            weights = np.log1p(np.concatenate([counts for _, counts in found]).astype(np.float32))
            rows = self.table.take(ids, axis=0)
            start = 0
            for text, size in enumerate(counted):
                # One product per text, on its own rows: the same BLAS call py3langid makes.
                end = start + size
                if size:
                    np.matmul(weights[start:end], rows[start:end], out=matrix[text])
                start = end
            matrix += self.prior
        return matrix, [size > 0 for size in counted]

    def best(self, text: str) -> str | None:
        """The top language, None where all score alike (no evidence either way): what
        py3langid's rank(text) puts first, ties to the first label."""
        return self.best_of_many([text])[0]

    def best_of_many(self, texts: list[str]) -> list[str | None]:
        answers: list[str | None] = []
        for start in range(0, len(texts), BATCH):
            matrix, scored = self._score_matrix(texts[start : start + BATCH])
            if self.aliases:  # a label listed twice scores its better column
                firsts, laters = (list(columns) for columns in zip(*self.aliases, strict=True))
                matrix[:, firsts] = np.maximum(matrix[:, firsts], matrix[:, laters])
                matrix[:, laters] = FLOOR
            distinct = matrix[:, self.distinct]
            alike = (distinct.max(axis=1) == distinct.min(axis=1)).tolist()
            tops = matrix.argmax(axis=1).tolist()  # the first column holding the best score
            for top, same, has in zip(tops, alike, scored, strict=True):
                answers.append(self.labels[top] if has and not same else None)
        return answers
