"""The language a user writes in, decided from their own words.

Two steps:

1. `own_words(turns)` keeps what the user wrote themselves and drops what they brought
   along: code (fenced blocks, inline code, code-looking lines), URLs and e-mail addresses,
   quoted passages ("...", “...”, «...», 「...」), the text after "translate:" (in any of
   the languages below), the turns pasted after a bare "translate" request, and, in a turn
   that mixes writing systems, a long block in one system framed by a few words in another
   ("переведи на русский <Greek post>", "<English letter> 请帮我回复").
2. `detect_language(text)` names the language of a text: py3langid's model (naive Bayes
   over byte n-grams, shipped inside its wheel), limited to ISO 639-1 languages, after a
   writing-system shortcut for the scripts only one language here uses.

`user_language(turns)` chains them. bench/dataset/language_bench.py measures it against a
hand-checked list of users (README: "Language detection").
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable

import msgspec

from personaemp.errors import PersonaempError

# Writing systems. Greek, Hebrew, Thai and Hangul name their language outright; Han + kana
# ("cjk"), Cyrillic, Arabic and Latin are shared by several languages and go to the model.
_SCRIPT_CHARS = {
    "latin": "A-Za-z\u00c0-\u024f\u1e00-\u1eff",
    "cyrillic": "\u0400-\u04ff",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "arabic": "\u0600-\u06ff\u0750-\u077f",
    "hebrew": "\u0590-\u05ff",
    "devanagari": "\u0900-\u097f",
    "thai": "\u0e00-\u0e7f",
    "hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "cjk": "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
}
_SCRIPT_LANGUAGE = {"greek": "el", "hebrew": "he", "thai": "th", "hangul": "ko"}
# A run: letters of one script, with the spaces, digits and punctuation between them.
_RUN = re.compile(
    "|".join(rf"(?P<{name}>[{chars}]+(?:[\W\d_]*[{chars}]+)*)" for name, chars in _SCRIPT_CHARS.items())
)
_ASCII_LETTER = re.compile("[A-Za-z]")
_KANA = re.compile("[\u3040-\u30ff]")
# Sizes are in characters; a Han or Hangul character carries about a short word.
_WEIGHT = {"cjk": 2, "hangul": 2}

# Code blocks, inline code, URLs and e-mail addresses, quoted passages: one pass drops them
# all. Each kind with the marks it cannot match without: a turn's pass tries only the kinds
# whose marks it holds, which finds the same matches (an absent kind never matches) at a
# fifth of the cost (the e-mail kind alone tried every position of every turn with a quote).
_BROUGHT_ALONG = (
    (("`",), r"```.*?(?:```|\Z)"),
    (("`",), r"`[^`\n]{1,200}`"),
    (("://", "www."), r"\b(?:https?://|www\.)\S+"),
    (("@",), r"\S+@\S+\.\w+"),
    (('"',), r'"[^"]{1,3000}"'),
    (("“",), r"“[^”]{1,3000}”"),
    (("„",), r"„[^“”]{1,3000}[“”]"),
    (("«",), r"«[^»]{1,3000}»"),
    (("「",), r"「[^」]{1,3000}」"),
    (("『",), r"『[^』]{1,3000}』"),
)
_CODE_CHARS = re.compile(r"[{}\[\]();:.=<>_\\|$#@*&^~/+]")
# "translate" in the languages AlpsBench users write in, with the language of the word
# (None: shared by several): a turn that asks for a translation brings text that is not
# (necessarily) the user's, and a user whose own words are only that request ("Translate"
# above quoted Japanese) writes the request's language.
_TRANSLATE_WORDS = {
    "translat": "en", "перевед": "ru", "перевод": "ru", "翻译": "zh", "翻譯": "zh", "翻訳": "ja",
    "übersetz": "de", "번역": "ko", "ترجم": "ar", "tłumacz": "pl", "przetłum": "pl", "çevir": "tr",
    "vertaal": "nl", "översätt": "sv", "tradu": None,
}  # fmt: skip
_TRANSLATE = re.compile("|".join(_TRANSLATE_WORDS))  # on lower-cased text: re.I is slow here
_AFTER_COLON = re.compile(r"[:：]\s*\S.*", re.S)

# Sizes below are weighted characters of runs (see _WEIGHT).
MIN_LETTERS = 3  # less than this: no language (None)
PASTED = 100  # a block this long beside a few words in another script was pasted
FRAME_MIN = 4  # what a frame needs (a word or two; a lone "我" is a mention)
OWN_WORDS_LIMIT = 600  # characters of own words read: enough to decide (bench: same answers as 1,200
# for 1,191 of 1,200 users), at half the cost
TURN_LIMIT = 200  # characters of one turn: a long pasted message weighs no more than a short one


def _runs(text: str) -> list[tuple[str, int]]:
    """Consecutive stretches of one writing system: [(script, weighted size)]."""
    if text.isascii():
        # Half the turns: every ASCII character that is not a letter may sit inside a run,
        # so _RUN would find one Latin run from the first letter to the last.
        first = _ASCII_LETTER.search(text)
        if first is None:
            return []
        return [("latin", len(text) - _ASCII_LETTER.search(text[::-1]).start() - first.start())]
    runs: list[tuple[str, int]] = []
    for match in _RUN.finditer(text):
        script = match.lastgroup
        size = (match.end() - match.start()) * _WEIGHT.get(script, 1)
        if runs and runs[-1][0] == script:
            runs[-1] = (script, runs[-1][1] + size)
        else:
            runs.append((script, size))
    return runs


def _sizes(runs: list[tuple[str, int]]) -> Counter[str]:
    sizes: Counter[str] = Counter()
    for script, size in runs:
        sizes[script] += size
    return sizes


def _strip_foreign_block(text: str, runs: list[tuple[str, int]]) -> str:
    """In a turn mixing writing systems, drop a long block framed by a few words in another.

    The frame is the script of both ends when they agree (the block sits between them),
    else the smaller of the two ends' scripts; the rest is dropped when it is long
    (PASTED) and the frame has at least FRAME_MIN.
    """
    if len(runs) < 2:
        return text  # one writing system (most turns)
    runs = [run for run in runs if run[1] >= 2]  # a lone "я" or "A1": noise, not a run
    sizes = _sizes(runs)
    if len(sizes) < 2:
        return text
    first, last = runs[0][0], runs[-1][0]
    frame = first if first == last else min((first, last), key=lambda script: sizes[script])
    block = sum(size for script, size in sizes.items() if script != frame)
    if block < PASTED or sizes[frame] < FRAME_MIN or (first != last and sizes[frame] >= block):
        return text
    return _RUN.sub(lambda match: match.group() if match.lastgroup == frame else " ", text)


def _looks_like_code(line: str) -> bool:
    """Code, stack traces, file paths: symbols where words would be."""
    symbols = len(_CODE_CHARS.findall(line))
    return symbols >= 3 and symbols >= 0.1 * len(line.strip())


_MARKS = re.compile(r'[`@"“„«「『]|://|www\.')


@functools.lru_cache(maxsize=256)
def _brought_along(kinds: tuple[int, ...]) -> re.Pattern:
    return re.compile("|".join(_BROUGHT_ALONG[kind][1] for kind in kinds), re.S)


def _clean(text: str) -> str:
    if marks := set(_MARKS.findall(text)):
        kinds = tuple(kind for kind, (needs, _) in enumerate(_BROUGHT_ALONG) if not marks.isdisjoint(needs))
        text = _brought_along(kinds).sub(" ", text)
    lines = text.splitlines()
    symbols = len(_CODE_CHARS.findall(text))
    if symbols < 3:
        return "\n".join(lines)  # no line can look like code: skip the test of each
    if len(lines) == 1:  # the text's symbols are the line's
        return "" if symbols >= 0.1 * len(lines[0].strip()) else lines[0]
    return "\n".join(line for line in lines if not _looks_like_code(line))


def _ends(text: str) -> str:
    """A long turn's head and tail: frames sit at the ends, and the cost stays bounded."""
    return text if len(text) <= 2000 else f"{text[:1500]}\n{text[-500:]}"


def own_words(turns: Iterable[str], limit: int = OWN_WORDS_LIMIT) -> str:
    """The user's own words from their turns (see the module doc), at most `limit` characters."""
    kept: list[str] = []
    seen: set[str] = set()
    size = 0
    pasting = None  # script of a bare "translate" request: later turns in other scripts are pasted
    for turn in turns:
        text = _clean(_ends(turn))
        runs = _runs(text)
        if pasting is not None:
            if all(script != pasting for script, _ in runs):
                continue
            pasting = None
        request = _TRANSLATE.search(text.lower())
        if request:
            text = text[: request.start()] + _AFTER_COLON.sub(" ", text[request.start() :])
            runs = _runs(text)
        text = _strip_foreign_block(text, runs)
        if request and len(scripts := _sizes(_runs(text))) == 1:
            pasting = next(iter(scripts))
        text = " ".join(text.split())
        if not text or text in seen:
            continue  # users often send the same message again
        seen.add(text)
        kept.append(text[: min(TURN_LIMIT, limit - size)])
        size += len(kept[-1]) + 1
        if size >= limit:
            break
    return "\n".join(kept)


_LOADING = threading.Lock()


def _identifier():
    # Imported here: loading the model takes about half a second, which `personaemp
    # --help` and the commands that never guess a language should not pay. Loaded under a
    # lock: functools.cache alone let 32 threads of a server load it 32 times at once.
    with _LOADING:
        return _load_identifier()


@functools.cache
def _load_identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    from personaemp.langmodel import Model

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    # ISO 639-1 codes only: the model also knows Cantonese, Wu, Ancient Greek, Nigerian
    # Pidgin..., which it would pick for short Chinese, Greek or English text.
    return Model(identifier, [code for code in identifier.labels if len(code) == 2 and code != "zxx"])


def release_model() -> None:
    """Let the model's memory go (about 120 MB): the worker holds its own from now on."""
    with _LOADING:
        _load_identifier.cache_clear()


def load_in_background() -> None:
    """Start loading the model in a thread, for a process that will soon need it (`run`'s
    filter child; gen-queries' checks in `run`): half a second, most of it LZMA
    decompression, which runs beside the caller's work instead of stopping it."""
    threading.Thread(target=_identifier, name="personaemp-language", daemon=True).start()


def _by_script(text: str) -> str | None | bool:
    """The language a text's writing system names, None for too little text, False when
    the model must decide."""
    sizes = _sizes(_runs(text[:OWN_WORDS_LIMIT]))
    total = sum(sizes.values())
    if total < MIN_LETTERS:
        return None
    script, size = sizes.most_common(1)[0]
    if size >= 0.6 * total:
        if script in _SCRIPT_LANGUAGE:
            return _SCRIPT_LANGUAGE[script]
        if script == "cjk":
            # Japanese puts kana between the Han characters; Chinese has none.
            return "ja" if len(_KANA.findall(text)) >= 0.1 * size / _WEIGHT["cjk"] else "zh"
    return False


def detect_languages(texts: list[str]) -> list[str | None]:
    """`detect_language` of each text; the model reads those it must decide all at once."""
    found = [_by_script(text) for text in texts]
    undecided = [index for index, language in enumerate(found) if language is False]
    if undecided:
        # None: not one of the model's n-grams in the text ("translate", "Hi")
        answers = _identifier().best_of_many([texts[index][:OWN_WORDS_LIMIT] for index in undecided])
        for index, answer in zip(undecided, answers, strict=True):
            found[index] = answer
    return found


def detect_language(text: str) -> str | None:
    """Return an ISO 639-1 code, or None when the text gives too little to go on."""
    return detect_languages([text])[0]


def user_languages(histories: Iterable[Iterable[str]]) -> list[str | None]:
    """The language each user writes in: `detect_language` of their `own_words`, else the
    language of their request to translate when that is all they wrote themselves."""
    words = [own_words(turns) for turns in histories]
    found = detect_languages(words)
    for index, language in enumerate(found):
        if language is None and (request := _TRANSLATE.search(words[index].lower())):
            found[index] = _TRANSLATE_WORDS[request.group().lower()]
    return found


# The worker: a plain `python -c` child (not multiprocessing, whose spawn re-runs a script
# that calls the library without a __main__ guard). It ignores Ctrl-C (the parent kills it
# on the way out) and ends when its stdin closes: the parent ended, or died (kill -9: gone
# once its batch is done, measured within 4 s; PR_SET_PDEATHSIG too, where it works).
_WORKER = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "from personaemp.language import serve_languages\n"
    "serve_languages(sys.stdin.buffer, sys.stdout.buffer)\n"
)
_LENGTH = 8  # bytes of a frame's length, big-endian


def _write_frame(stream, value) -> None:
    payload = msgspec.msgpack.encode(value)
    stream.write(len(payload).to_bytes(_LENGTH, "big") + payload)
    stream.flush()


def _read_frame(stream):
    header = stream.read(_LENGTH)
    if len(header) < _LENGTH:
        return None
    return msgspec.msgpack.decode(stream.read(int.from_bytes(header, "big")))


def serve_languages(requests, replies) -> None:
    """The worker's loop: each frame of histories answered by a frame of their languages."""
    from personaemp.parallel import die_with_parent

    die_with_parent()
    _identifier()
    while (histories := _read_frame(requests)) is not None:
        _write_frame(replies, user_languages(histories))


class LanguageWorker:
    """`user_languages` in a second process: a big input's reader goes on while the other
    core decides the languages of the users it kept (a third of the filter's work). Batches
    are answered in the order they were sent; its start (imports, the model: about a
    second) is spent on that other core."""

    def __init__(self) -> None:
        from personaemp.parallel import python_child

        self._process = python_child(_WORKER)
        # A batch is larger than the pipe: written from a thread (blocked in the write, it
        # lets the reader run), so the reader never waits for the worker to take it.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_all, name="personaemp-languages", daemon=True)
        self._sender.start()

    def _send_all(self) -> None:
        while (histories := self._outbox.get()) is not None:
            # Only the head and tail of a long turn travel: what own_words reads of it.
            with contextlib.suppress(BrokenPipeError, ValueError):  # died: `receive` says so
                _write_frame(self._process.stdin, [[_ends(turn) for turn in turns] for turns in histories])
        with contextlib.suppress(OSError):
            self._process.stdin.close()  # the worker's loop ends

    def send(self, histories: list[list[str]]) -> None:
        """Queue a batch for the worker."""
        self._outbox.put(histories)

    def receive(self) -> list[str | None]:
        """The languages of the oldest batch sent and not yet received."""
        found = _read_frame(self._process.stdout)
        if found is None:
            raise PersonaempError(
                f"the language worker ended (exit code {self._process.wait()})",
                "run again; if it recurs, report it",
            )
        return found

    def __enter__(self) -> LanguageWorker:
        return self

    def __exit__(self, error_type, *_) -> None:
        """Done: the worker ends when its input does. Stopped (an error, Ctrl-C): killed."""
        if error_type is not None:
            self._process.kill()
        self._outbox.put(None)
        self._sender.join(5)
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()

    @staticmethod
    def worth_it() -> bool:
        """A second core to run on (and POSIX pipes and process groups)."""
        if os.name != "posix":
            return False
        try:
            return len(os.sched_getaffinity(0)) >= 2
        except AttributeError:  # not Linux
            return (os.cpu_count() or 1) >= 2


def user_language(turns: Iterable[str]) -> str | None:
    """`user_languages` of one user."""
    return user_languages([turns])[0]


LANGUAGE_NAMES = {
    "en": "English", "zh": "Chinese", "ru": "Russian", "es": "Spanish", "pt": "Portuguese",
    "fr": "French", "de": "German", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "ar": "Arabic", "tr": "Turkish", "pl": "Polish", "nl": "Dutch", "id": "Indonesian",
    "vi": "Vietnamese", "el": "Greek", "hi": "Hindi", "he": "Hebrew", "th": "Thai",
    "uk": "Ukrainian", "sv": "Swedish", "fa": "Persian", "cs": "Czech", "ro": "Romanian",
}  # fmt: skip
_NAMES = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}


def normalize_language(value: object) -> str | None:
    """Map a source's language field ('English', 'en', 'EN-us') to an ISO 639-1 code."""
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip().lower()
    return _NAMES.get(value) or value.split("-")[0].split("_")[0][:3]
