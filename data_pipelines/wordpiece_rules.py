"""The original BERT WordPiece rules as one Rust `tokenizers` pipeline (`build_pipeline`).

`tokenization.WordPieceTokenizer` reproduces google-research/bert's `FullTokenizer` (basic
tokenization, then greedy longest-match-first WordPiece) token for token, but runs as one
Hugging Face `tokenizers` pipeline, so batches are encoded in Rust, off the GIL and on every
core.

The stock `BertNormalizer` + `BertPreTokenizer` pair is close to the original but not equal
to it: its Unicode tables are older than Python's, it deletes private-use characters (the
original keeps them, as [UNK]), one CJK range has a typo (U+2B820..U+2B91F are not isolated),
and it lower-cases a final capital sigma to 'σ' where Python's `str.lower` gives 'ς'. So the
pipeline here is composed of generic `Replace`/`Split` steps whose character classes are read
from the running Python's `unicodedata`, which is what the original consults:

    normalizer     drop NUL, U+FFFD and Cc/Cf (except \\t \\n \\r); Zs and \\t \\n \\r -> ' '
                   if do_lower_case: final Σ -> ς, lower-case, NFD, drop Mn
    pre-tokenizer  split on whitespace; isolate every punctuation and CJK ideograph
    model          WordPiece, '##' continuations, words over 200 characters -> [UNK]

Lower-casing and NFD come from the Rust standard library and crates; on every code point
that Python's Unicode database assigns they agree with Python (checked against the original
over all of Unicode). Code points Python does not know yet (assigned in a later Unicode
version) are never in a vocabulary and come out as [UNK] either way.

Forked workers: batch calls run on a Rust thread pool, which does not survive `fork`. The
pinned `tokenizers` (0.22) handles this itself and silently: a child forked after a parallel
batch call encodes sequentially (earlier releases printed a warning each time). So workers
forked from a process that tokenized are safe with no setting; setting TOKENIZERS_PARALLELISM
to a true value overrides that guard and can deadlock such children, so leave it unset (or
"false") in programs that fork. The module itself sets nothing at import.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import sys
import unicodedata
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from data_pipelines.tokenizer_base import UNK_TOKEN

# The original BERT's limit (transformers' BertTokenizer uses 100).
MAX_INPUT_CHARS_PER_WORD = 200

# The "Chinese character" blocks of the original `_is_chinese_char`, typo-free.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


# ----------------------------------------------------------------------------- Unicode classes


def _class_body(code_points: Iterable[int]) -> str:
    """Sorted code points -> the inside of an Oniguruma bracket expression, as ranges."""
    parts: list[str] = []
    start = prev = None
    for cp in code_points:
        if prev is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append(_range_text(start, prev))
        start = prev = cp
    if start is not None:
        parts.append(_range_text(start, prev))
    return "".join(parts)


def _range_text(lo: int, hi: int) -> str:
    return f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}"


@dataclasses.dataclass(frozen=True)
class _CharClasses:
    """Bracket-expression bodies for the original's character predicates."""

    removed: str  # NUL, U+FFFD, Cc and Cf except \t \n \r: deleted by `_clean_text`
    whitespace: str  # \t, \n, \r and Zs but ' ': turned into ' ' by `_clean_text`
    punctuation: str  # ASCII non-alphanumeric symbols and Unicode P*: split off alone
    cjk: str  # the CJK ideograph blocks: split off alone
    nonspacing_marks: str  # Mn: dropped after NFD when lower-casing
    cased: str  # Cased and not Case_Ignorable (Python's final-sigma rule, see below)
    case_ignorable: str  # Case_Ignorable


def _code_points_to_scan() -> Iterable[int]:
    """Every code point that can be in a class: all but those known to be in none.

    Planes 15-16 are private use (Co) and noncharacters (Cn) by Unicode's stability policy,
    and planes 4-13 have no assigned character up to Unicode 16.0; an unassigned or
    private-use code point is in no class. Skipping them makes the scan ~3x faster. A
    Python with a later Unicode database scans everything.
    """
    if int(unicodedata.unidata_version.split(".")[0]) > 16:
        return range(sys.maxunicode + 1)
    return itertools.chain(range(0x40000), range(0xE0000, 0xF0000))


# Class tables for the Unicode versions of the supported Pythons, written by
# `python -m data_pipelines.wordpiece_rules` and checked against the scan by the tests: the
# scan costs ~0.2 s, paid before any worker can start. Other versions are scanned.
_CLASS_TABLE_DIR = os.path.join(os.path.dirname(__file__), "unicode_classes")


def _class_table_path(unidata_version: str) -> str:
    return os.path.join(_CLASS_TABLE_DIR, f"unicode-{unidata_version}.json")


@functools.cache
def _char_classes() -> _CharClasses:
    """The classes for this interpreter's `unicodedata` (once per process)."""
    path = _class_table_path(unicodedata.unidata_version)
    try:
        with open(path, encoding="utf-8") as f:
            return _CharClasses(**json.load(f))
    except FileNotFoundError:
        return _scan_char_classes()


def _scan_char_classes() -> _CharClasses:
    """Reads the classes from this interpreter's `unicodedata`."""
    removed, whitespace, punctuation, marks, probe = [], [], [], [], []
    for cp in _code_points_to_scan():
        char = chr(cp)
        cat = unicodedata.category(char)
        if cp == 0 or cp == 0xFFFD or (cat in ("Cc", "Cf") and char not in "\t\n\r"):
            removed.append(cp)
        elif (cat == "Zs" or char in "\t\n\r") and char != " ":
            whitespace.append(cp)  # ' ' itself needs no replacing
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            punctuation.append(cp)
        elif cat[0] == "P":
            punctuation.append(cp)
        if cat == "Mn":
            marks.append(cp)
        if cat not in ("Cn", "Co", "Cs"):
            probe.append(cp)
    # Python lower-cases 'Σ' to 'ς' when the first non-case-ignorable character before it is
    # cased and the first one after it is not (Unicode's Final_Sigma). `unicodedata` does not
    # expose Cased/Case_Ignorable, so ask `str.lower` itself: with an uncased '1' in front,
    # 'Σ' after c is final iff c is cased and not ignorable; with a cased 'A' in front it is
    # final iff c is cased or ignorable.
    cased, ignorable = [], []
    for cp in probe:
        char = chr(cp)
        if ("1" + char + "Σ").lower()[-1] == "ς":
            cased.append(cp)
        elif ("A" + char + "Σ").lower()[-1] == "ς":
            ignorable.append(cp)  # includes the few characters that are also cased
    cjk = (cp for lo, hi in sorted(_CJK_RANGES) for cp in range(lo, hi + 1))
    return _CharClasses(
        removed=_class_body(removed),
        whitespace=_class_body(whitespace),
        punctuation=_class_body(punctuation),
        cjk=_class_body(cjk),
        nonspacing_marks=_class_body(marks),
        cased=_class_body(cased),
        case_ignorable=_class_body(ignorable),
    )


def build_pipeline(
    vocab: dict[str, int], do_lower_case: bool, max_input_chars_per_word: int
) -> Tokenizer:
    """The original BasicTokenizer + WordpieceTokenizer as one Rust `Tokenizer`."""
    classes = _char_classes()
    steps = [
        normalizers.Replace(Regex(f"[{classes.removed}]"), ""),
        normalizers.Replace(Regex(f"[{classes.whitespace}]"), " "),
    ]
    if do_lower_case:
        # `Lowercase` maps characters one by one; Python's `str.lower` (the original's) turns
        # a word-final capital sigma into 'ς'. `\K` keeps the context out of the replacement.
        cased, ignorable = classes.cased, classes.case_ignorable
        final_sigma = f"[{cased}][{ignorable}]*\\K\\x{{3A3}}(?![{ignorable}]*[{cased}])"
        steps += [
            normalizers.Replace(Regex(final_sigma), "\u03c2"),
            normalizers.Lowercase(),
            normalizers.NFD(),
            normalizers.Replace(Regex(f"[{classes.nonspacing_marks}]"), ""),
        ]
    tokenizer = Tokenizer(
        models.WordPiece(
            vocab,
            unk_token=UNK_TOKEN,
            max_input_chars_per_word=max_input_chars_per_word,
            continuing_subword_prefix="##",
        )
    )
    tokenizer.normalizer = normalizers.Sequence(steps)
    # Splitting after lower-casing is equivalent to the original's order (isolate CJK, split
    # on whitespace, lower-case each word, split punctuation): lower-casing and NFD neither
    # create nor remove whitespace or punctuation, and NFD maps CJK ideographs to CJK ideographs.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(
                Regex(f"[{classes.punctuation}{classes.cjk}]"), behavior="isolated"
            ),
        ]
    )
    return tokenizer


def write_class_table(directory: str | None = None) -> str:
    """Scans this interpreter's Unicode classes and writes their table into `directory` (by
    default the package's, which ships one per Unicode version); returns its path."""
    directory = _CLASS_TABLE_DIR if directory is None else directory  # read at call time
    path = os.path.join(directory, os.path.basename(_class_table_path(unicodedata.unidata_version)))
    os.makedirs(directory, exist_ok=True)
    with open(path + ".incomplete", "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(_scan_char_classes()), f, indent=1)
        f.write("\n")
    os.replace(path + ".incomplete", path)
    return path


def main(argv: list[str]) -> None:
    """Entry point: writes this interpreter's table (a Python whose Unicode is newer than
    any shipped table's needs one: `unicode-<version>.json`)."""
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    print(f"wrote {write_class_table(flags.FLAGS.output_dir)}")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string(
        "output_dir", _CLASS_TABLE_DIR, "Where to write unicode-<version>.json (default: the "
        "package's unicode_classes/, which the tokenizers read)."
    )  # fmt: skip
    cli.run(main)
