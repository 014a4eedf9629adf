"""personaemp.langmodel reads py3langid's model with array lookups: the same features, counts,
scores and answers as py3langid's own byte-by-byte walk, for any text."""

from __future__ import annotations

import numpy as np
import pytest
from py3langid.langid import MODEL_FILE, LanguageIdentifier, visit_counts

from personaemp import langmodel
from personaemp.language import _identifier

TEXTS = [
    "",
    "a",
    "Hi",
    "I feel awful about the argument with my sister, what should I do?",
    "HELLO WORLD, ALL CAPITALS ARE LOWER-CASED FIRST",
    "Привет! Как дела? Я не знаю, что делать с работой.",
    "我和妹妹又吵架了，我觉得很难过。",
    "今日はとても疲れました。どうすればいいですか？",
    "안녕하세요, 오늘 기분이 좋지 않아요.",
    "مرحبا، كيف حالك؟ أنا حزين اليوم.",
    "Γεια σου, πώς είσαι; Είμαι λυπημένος σήμερα.",
    "שלום, מה שלומך? אני עצוב היום.",
    "สวัสดีครับ วันนี้ผมเศร้ามาก",
    "नमस्ते, आप कैसे हैं? मैं आज दुखी हूँ।",
    "Ça va? Je suis très fatigué aujourd'hui, vraiment.",
    "Cafe\u0301 de\u0301ja\u0300 vu: combining accents are composed (NFC) first",
    "emoji 😀😀😀 and flags 🇫🇷 between words 👍🏽",
    "a lone surrogate \ud800 and another \udfff in the text",
    "\ud83d",
    "tabs\tand\nnew lines\r\nand \x00 NUL and \x7f DEL",
    "x" * 7,
    "abcabcabcabcabcabc",
    "mixed English и русский и 中文 in one message",
    "def f(x):\n    return {x: [1, 2, 3]}  # code is text too",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 400),  # about 18,000 bytes
    "".join(chr(c) for c in range(32, 2000)),  # every byte pattern of one- and two-byte UTF-8
]


@pytest.fixture(scope="module")
def reference() -> LanguageIdentifier:
    """py3langid itself, limited to the same languages, on the same float32 table."""
    model = _identifier()
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier.set_languages(sorted(set(model.labels)))
    identifier.nb_ptc = np.ascontiguousarray(identifier.nb_ptc, dtype=np.float32)
    return identifier


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_features_scores_and_answer_equal_py3langids(text, reference):
    model = _identifier()
    data = langmodel.Model.encode(text)
    assert data == reference._encode(text)
    ids, counts = model.features(data)
    walked = visit_counts(reference.tk_nextmove, reference._rowbase, reference.tk_output, data) or {}
    # Same features, same counts, same order (the score's float sum follows it).
    assert list(zip(ids.tolist(), counts.tolist(), strict=True)) == list(walked.items())
    scores = model.scores(text)
    if not walked:
        assert scores is None and model.best(text) is None
        return
    assert np.array_equal(scores, reference._raw_score(data))  # bit for bit
    ranked = reference.rank(text)
    assert model.best(text) == (None if ranked[0][1] == ranked[-1][1] else ranked[0][0])


def test_random_bytes_walk_like_py3langid(reference):
    """Arbitrary bytes (not only UTF-8): every state the walk can reach is exercised."""
    model = _identifier()
    generator = np.random.default_rng(7)
    for size in (1, 2, 5, 6, 7, 50, 3000):
        for _ in range(20):
            data = bytes(generator.integers(0, 256, size, dtype=np.uint8))
            ids, counts = model.features(data)
            walked = visit_counts(reference.tk_nextmove, reference._rowbase, reference.tk_output, data) or {}
            assert list(zip(ids.tolist(), counts.tolist(), strict=True)) == list(walked.items())


def test_the_installed_model_is_an_aho_corasick_automaton_no_deeper_than_depth(reference):
    """Why looking at the last DEPTH bytes is enough, proved on every transition of the model.

    Nodes are named by breadth-first search from the start state. In an Aho-Corasick
    automaton a state's row equals its failure state's row except at its trie children; then
    the state after any text is the longest suffix of it that is a node, so it depends on the
    last DEPTH bytes alone when no node is longer than DEPTH."""
    moves = np.frombuffer(reference.tk_nextmove, dtype=np.dtype(reference.tk_nextmove.typecode))
    rows = moves.reshape(-1, 256)[np.asarray(reference.tk_row)].astype(np.int64)  # state -> 256 states
    states = len(rows)
    depth = np.full(states, -1)
    parent = np.full(states, -1)
    fail = np.zeros(states, dtype=np.int64)
    depth[0], frontier, level = 0, np.array([0]), 0
    while len(frontier):
        level += 1
        targets = rows[frontier]
        new = depth[targets] < 0
        children = targets[new]
        sources = np.broadcast_to(frontier[:, None], targets.shape)[new]
        symbols = np.broadcast_to(np.arange(256), targets.shape)[new]
        first = np.unique(children, return_index=True)[1]  # each new state once, its first way in
        children, sources, symbols = children[first], sources[first], symbols[first]
        depth[children], parent[children] = level, sources
        # The failure state of a node: where its parent's failure state goes on the same byte.
        fail[children] = 0 if level == 1 else rows[fail[sources], symbols]
        frontier = children
    assert (depth >= 0).all()
    assert depth.max() <= langmodel.DEPTH
    differ = rows != rows[fail]
    differ[0] = True  # the start state is its own failure state: its row is all trie edges
    source, symbol = np.nonzero(differ)
    target = rows[source, symbol]
    trie_edge = (parent[target] == source) & (depth[target] == depth[source] + 1)
    assert trie_edge[source != 0].all()
    assert np.count_nonzero(trie_edge) == states - 1  # every node but the start has its edge


def test_texts_walked_together_score_as_each_alone(reference):
    """The filter decides its kept users a batch at a time: no text's features, scores or
    answer depend on its neighbours (more texts than one batch holds)."""
    model = _identifier()
    texts = TEXTS * 11  # 286: past langmodel.BATCH
    answers = model.best_of_many(texts)
    for text, scores, answer in zip(texts, model.scores_of_many(texts), answers, strict=True):
        data = reference._encode(text)
        walked = visit_counts(reference.tk_nextmove, reference._rowbase, reference.tk_output, data)
        if not walked:
            assert scores is None and answer is None
            continue
        assert np.array_equal(scores, reference._raw_score(data))
        ranked = reference.rank(text)
        assert answer == (None if ranked[0][1] == ranked[-1][1] else ranked[0][0])
