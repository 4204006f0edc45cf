"""Word-level tasks (SQuAD's whitespace words, a tagger's words) tokenize each word as it
reads in its text (`Tokenizer.encode_words`), so a byte-level BPE's words after the first
keep their prefix space ('Ġfox', not 'fox').

The references are transformers' fast tokenizers on the same directories: its encoding of
the whole text (offsets say which pieces belong to which word), and `is_split_into_words=True`
where tokenizer_config.json sets `add_prefix_space` (what transformers asks of RoBERTa for
word-level input). WordPiece's word-level results are checked against the original BERT in
test_finetune_squad.py and test_task_readers.py, unchanged.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from data_pipelines.tasks.formats import TaggingExample
from data_pipelines.tasks.squad import encode_squad, parse_articles
from data_pipelines.tasks.squad_predictions import postprocess
from data_pipelines.tasks.tagging_features import encode_tagged
from data_pipelines.tokenization import load_tokenizer
from tests.test_hf_tokenizer import _modern_bpe, _roberta_bpe, _unigram

transformers = pytest.importorskip("transformers")

KINDS = {"modern_bpe": _modern_bpe, "roberta_bpe": _roberta_bpe, "unigram": _unigram}

CONTEXT = (
    "The quick brown fox jumps over the lazy dog, said Tokenizers (1895-1943). "
    "Unbelievably, the fox's café answers: no."
)
# (answer text, its character offset in CONTEXT): at the context's start, after a space,
# inside a word, and two words ending in punctuation.
ANSWERS = [("The quick", 0), ("brown fox", 10), ("1895", 62), ("fox's café", 92)]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog .".split(),
    "Unbelievably , Tokenizers split naïve words (1895-1943) into pieces !".split(),
    ["fox"],
]


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request, tmp_path_factory):
    """(name, directory, our tokenizer, transformers' fast tokenizer)."""
    directory = KINDS[request.param](tmp_path_factory.mktemp(request.param))
    ref = transformers.AutoTokenizer.from_pretrained(directory)
    assert ref.is_fast
    return request.param, directory, load_tokenizer(directory), ref


def _words_of_pieces(offsets, text) -> list[int]:
    """The whitespace word of `text` each piece (its offsets) belongs to, by the piece's
    last character; a piece of spaces alone belongs to the word after it."""
    word_of_char, w = [], -1
    for i, char in enumerate(text):
        w += not char.isspace() and (i == 0 or text[i - 1].isspace())
        word_of_char.append(w + 1 if char.isspace() else w)
    return [word_of_char[end - 1 if end > start else start] for start, end in offsets]


def _squad(context, answers):
    qas = [{"id": f"q{i}", "question": "Who jumps over the dog?",
            "answers": [{"text": text, "answer_start": at}]}
           for i, (text, at) in enumerate(answers)]  # fmt: skip
    articles = [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]
    return parse_articles(articles, "test", is_training=True)


def test_squad_windows_read_the_context_as_transformers_does(kind):
    name, _, ours, ref = kind
    for text, at in ANSWERS:
        assert CONTEXT[at : at + len(text)] == text
    examples = _squad(CONTEXT, ANSWERS)
    features = encode_squad(examples, ours, max_seq_length=128, is_training=True)
    assert len(features) == len(ANSWERS)  # one window each: the whole context
    question = examples[0].question
    expected = ref(question, CONTEXT, return_offsets_mapping=True)
    n = int(features.input_mask[0].sum())
    assert features.input_ids[0, :n].tolist() == expected["input_ids"], name
    if name != "unigram":  # the piece that lost its space before: a word after the first
        assert "Ġfox" in features.tokens[0] and "fox" not in features.tokens[0]
    # Each answer's start and end: the first and last context piece covering its characters.
    in_context = [i for i, s in enumerate(expected.sequence_ids()) if s == 1]
    for row, (text, at) in enumerate(ANSWERS):
        covering = [i for i in in_context
                    if expected["offset_mapping"][i][1] > at
                    and expected["offset_mapping"][i][0] < at + len(text)]  # fmt: skip
        start, end = int(features.start_positions[row]), int(features.end_positions[row])
        s, e = expected["offset_mapping"][start]
        if not CONTEXT[s:e].strip():  # a lone space piece ('▁', 'Ġ') begins the word's pieces
            start += 1
        assert (start, end) == (covering[0], covering[-1]), (name, text)
        # and the words those pieces belong to, by transformers' offsets
        words = _words_of_pieces([expected["offset_mapping"][i] for i in in_context], CONTEXT)
        first = in_context[0]
        assert {p: words[p - first] for p in in_context} == features.token_to_word[row]


@pytest.mark.parametrize("prefix_space", [False, True])
def test_tagged_words_have_transformers_pieces(kind, tmp_path, prefix_space):
    name, directory, ours, ref = kind
    if prefix_space:  # a copy whose config asks every word, the first too, for its space
        config = os.path.join(directory, "tokenizer_config.json")
        with open(config) as f:
            settings = {**json.load(f), "add_prefix_space": True}
        for file in os.listdir(directory):
            if file != "tokenizer_config.json":
                # copied: a model directory reads no file linked from outside it
                shutil.copy(os.path.join(directory, file), tmp_path / file)
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
        ours = load_tokenizer(str(tmp_path))
        ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    examples = [TaggingExample(f"s{i}", tuple(w), ("O",) * len(w)) for i, w in
                enumerate(SENTENCES)]  # fmt: skip
    features = encode_tagged(examples, ours, 64, ("O",))
    assert (features.input_ids[features.input_mask == 0] == ref.pad_token_id).all()
    for row, words in enumerate(SENTENCES):
        n = int(features.input_mask[row].sum())
        ids = features.input_ids[row, :n].tolist()
        text = " ".join(words)
        whole = ref(text, return_offsets_mapping=True)
        assert ids == whole["input_ids"], (name, prefix_space, words)
        inner = [i for i, s in enumerate(whole.sequence_ids()) if s == 0]
        of = _words_of_pieces([whole["offset_mapping"][i] for i in inner], text)
        firsts = [inner[of.index(w)] for w in range(len(words))]
        assert features.word_positions[row].tolist() == firsts
        if prefix_space:  # every word after a space: transformers' word-level input
            split = ref(list(words), is_split_into_words=True)
            assert ids == split["input_ids"]
            word_ids = split.word_ids()
            assert firsts == [word_ids.index(w) for w in range(len(words))]
        elif name != "unigram" and len(words) > 1:
            pieces = ours.convert_ids_to_tokens(ids)
            assert pieces[1] == words[0] or not pieces[1].startswith("Ġ")  # first: no space
            assert pieces[features.word_positions[row][1]].startswith("Ġ")


def test_a_predicted_span_reads_as_the_pieces_spell_it(kind):
    """A span's answer text is what its pieces spell by the tokenizer's own decoder, also
    when it ends inside a word ('Unbeliev' of 'Unbelievably'): WordPiece's '##' rule alone
    turned a BPE span into the whole words it touches."""
    name, _, ours, ref = kind
    examples = _squad(CONTEXT, ANSWERS[:1])
    features = encode_squad(examples, ours, max_seq_length=128, is_training=False)
    tokens = features.tokens[0]
    context = [p for p in features.token_to_word[0]]
    # Every span of one to four context pieces: the pieces' text, as transformers spells them.
    for s in context:
        for e in range(s, min(s + 4, context[-1] + 1)):
            expected = " ".join(ref.convert_tokens_to_string(tokens[s : e + 1]).split())
            assert ours.pieces_text(tokens[s : e + 1]) == expected, (name, tokens[s : e + 1])
    # And postprocess answers with it: a span that ends inside a word of several pieces.
    word = CONTEXT.split().index("Unbelievably,")
    pieces = [p for p in context if features.token_to_word[0][p] == word]
    assert len(pieces) > 2, (name, [tokens[p] for p in pieces])
    starts = np.full((1, 128), -10.0, np.float32)
    ends = np.full((1, 128), -10.0, np.float32)
    starts[0, pieces[0]], ends[0, pieces[1]] = 10.0, 10.0
    predictions = postprocess(
        examples, features, starts, ends, n_best_size=2, max_answer_length=8,
        do_lower_case=False, pieces_text=ours.pieces_text,
    )  # fmt: skip
    spelled = ours.pieces_text([tokens[pieces[0]], tokens[pieces[1]]])
    assert predictions.answers[examples[0].qas_id] == spelled
    assert "Unbelievably".startswith(spelled) and spelled != "Unbelievably", (name, spelled)
