"""Fine-tuning and feature inputs laid out as the tokenizer's model expects them.

Classification, multiple choice, SQuAD and `extract_features` build each input through the
tokenizer (`Tokenizer.encode_for_model_batch`, `with_special_tokens`); the reference is
transformers' `AutoTokenizer.from_pretrained(directory)(a, b, truncation=True,
max_length=T)` on the same texts:

* a RoBERTa-style byte-level BPE built here with a `RobertaProcessing` post-processor
  (`<s> A </s></s> B </s>`), and our ModernBERT-style BPE (`[CLS] A [SEP] B [SEP]`, no
  token type ids in its model_input_names);
* BERT's vocab.txt (all-MiniLM-L6-v2's), unchanged: the original BERT's truncation, which
  transformers' slow `BertTokenizer` keeps (its fast one gives the extra piece of an odd
  cut to B instead of A).
"""

from __future__ import annotations

import os

import pytest
from finetune_fixtures import minilm_vocab

from data_pipelines.tasks.classification_features import encode_sentences
from data_pipelines.tasks.formats import SentenceExample
from data_pipelines.tasks.multiple_choice import MultipleChoiceExample, encode_choices
from data_pipelines.tasks.squad import SquadExample, encode_squad
from data_pipelines.tokenization import load_tokenizer
from experiments import extract_features as ef
from tests.test_hf_tokenizer import _modern_bpe, _roberta_bpe

transformers = pytest.importorskip("transformers")

PAIRS = [
    ("the fox", "a lazy dog jumps over"),
    ("Unbelievable things happen in the forest, said the fox.", "no"),
    ("The quick brown fox jumps over the lazy dog.", "The quick brown fox jumps over the dog!"),
    ("x", "Tokenizers split unbelievably long words into several pieces."),
]
SINGLES = ["The unbelievable fox jumps.", "Naïve café owners serve crème brûlée to the dog!"]
LENGTHS = (7, 10, 13, 64)  # odd and even cuts, and no cut


def _bert_vocab(directory) -> str:
    os.makedirs(directory, exist_ok=True)
    os.symlink(minilm_vocab(), directory / "vocab.txt")
    return str(directory)


KINDS = {"roberta_bpe": _roberta_bpe, "modern_bpe": _modern_bpe, "bert_vocab_txt": _bert_vocab}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request, tmp_path_factory):
    """(name, our tokenizer, transformers' reference tokenizer)."""
    directory = KINDS[request.param](tmp_path_factory.mktemp(request.param))
    ours = load_tokenizer(directory)
    if request.param == "bert_vocab_txt":  # the original's truncation: the slow tokenizer's
        ref = transformers.BertTokenizer(os.path.join(directory, "vocab.txt"))
    else:
        ref = transformers.AutoTokenizer.from_pretrained(directory)
        assert ref.is_fast
    return request.param, ours, ref


def _expected(ref, a, b, max_length) -> tuple[list[int], list[int]]:
    """transformers' ids and token types (all 0 where it gives none, as our features)."""
    out = ref(a, b, truncation=True, max_length=max_length)
    ids = out["input_ids"]
    return ids, out.get("token_type_ids", [0] * len(ids))


def _row(features, *index) -> tuple[list[int], list[int]]:
    n = int(features.input_mask[index].sum())
    return features.input_ids[index][:n].tolist(), features.segment_ids[index][:n].tolist()


def _padded_with(features, pad_id) -> bool:
    """Every masked position holds `pad_id` (RoBERTa's <pad> is 1; its 0 is <s>)."""
    return bool((features.input_ids[features.input_mask == 0] == pad_id).all())


def test_the_pad_ids_are_the_tokenizers_own(kind):
    """What the padding checks below rest on: RoBERTa's pad id is not BERT's 0."""
    name, ours, ref = kind
    assert ours.pad_id == ref.pad_token_id
    assert (ours.pad_id != 0) == (name == "roberta_bpe")


def test_the_layouts_are_each_tokenizer_s_own(kind):
    name, ours, _ = kind
    a, b = ours.encode("the fox"), ours.encode("a dog")
    cls, sep = ours.cls_id, ours.sep_id
    ids, _, b_start = ours.with_special_tokens(a, b)
    if name == "roberta_bpe":  # <s> A </s></s> B </s>
        assert ids == [cls, *a, sep, sep, *b, sep] and ours.num_special_tokens(True) == 4
    else:
        assert ids == [cls, *a, sep, *b, sep] and ours.num_special_tokens(True) == 3
    assert ids[b_start : b_start + len(b)] == b


@pytest.mark.parametrize("max_length", LENGTHS)
def test_classification_pairs_and_singles_equal_transformers(kind, max_length):
    _, ours, ref = kind
    examples = [SentenceExample(str(i), a, b, "x") for i, (a, b) in enumerate(PAIRS)]
    examples += [SentenceExample(f"s{i}", a, None, "x") for i, a in enumerate(SINGLES)]
    features = encode_sentences(examples, ours, max_length, ("x",))
    cut = 0
    for row, example in enumerate(examples):
        expected = _expected(ref, example.text_a, example.text_b, max_length)
        assert _row(features, row) == expected, (example, max_length)
        untruncated = _expected(ref, example.text_a, example.text_b, None)[0]
        cut += len(untruncated) > max_length
        assert features.input_ids[row, len(expected[0]) :].tolist() == [ours.pad_id] * (
            max_length - len(expected[0])
        )
    assert features.num_truncated == cut


@pytest.mark.parametrize("max_length", LENGTHS)
def test_multiple_choice_and_extracted_features_equal_transformers(kind, max_length):
    _, ours, ref = kind
    contexts = [a for a, _ in PAIRS]
    endings = tuple(b for _, b in PAIRS)
    examples = [MultipleChoiceExample(str(i), c, endings, 0) for i, c in enumerate(contexts)]
    features = encode_choices(examples, ours, max_length)
    for row, context in enumerate(contexts):
        for choice, ending in enumerate(endings):
            expected = _expected(ref, context, ending, max_length)
            assert _row(features, row, choice) == expected, (context, ending, max_length)
    assert _padded_with(features, ours.pad_id)

    lines = [ef.Example(i, a, b) for i, (a, b) in enumerate(PAIRS)]
    lines += [ef.Example(len(lines) + i, a, None) for i, a in enumerate(SINGLES)]
    for feature, line in zip(ef.convert_examples(lines, ours, max_length), lines, strict=True):
        ids, type_ids = _expected(ref, line.text_a, line.text_b, max_length)
        assert (feature.input_ids, feature.input_type_ids) == (ids, type_ids), line
        assert feature.tokens == ref.convert_ids_to_tokens(ids)
    features = ef.convert_examples(lines, ours, max_length)
    for chunk, ids, mask, types in ef._batches(features, 4, max_length, ours.pad_id):
        assert (ids[mask == 0] == ours.pad_id).all() and (types[mask == 0] == 0).all()
        for row, feature in enumerate(chunk):
            n = len(feature.input_ids)
            assert ids[row, :n].tolist() == feature.input_ids and mask[row, :n].all()


def test_squad_windows_are_the_tokenizer_s_pairs_and_answers_point_into_them(kind):
    """A one-word context (so its pieces are the same whether tokenized as a word or as a
    text, for byte-level BPE too): the window is transformers' pair, the answer's start and
    end its first and last context piece."""
    _, ours, ref = kind
    question, context = "Who splits long words?", "Tokenizers"
    example = SquadExample(
        "q1", question, context, (context,), (0,), context, 0, 0, False, (context,)
    )  # fmt: skip
    features = encode_squad([example], ours, max_seq_length=32, is_training=True)
    ids, type_ids = _expected(ref, question, context, 32)
    assert _row(features, 0) == (ids, type_ids) and _padded_with(features, ours.pad_id)
    pieces = ours.encode(context)
    assert len(pieces) > 1  # a word of several pieces: the span is not trivially one token
    start, end = int(features.start_positions[0]), int(features.end_positions[0])
    assert ids[start : end + 1] == pieces
    assert features.tokens[0] == ref.convert_ids_to_tokens(ids)
    assert set(features.token_to_word[0]) == set(range(start, end + 1))


def test_a_length_with_no_room_beside_the_special_tokens_is_refused(kind):
    _, ours, _ = kind
    room = ours.num_special_tokens(True)
    with pytest.raises(ValueError, match=f"max_length={room} leaves no room"):
        ours.encode_for_model_batch(["a"], ["b"], room)
    # A single text has room there (fewer special tokens), and is cut to fit it.
    ids, _, cut = ours.encode_for_model_batch(["the lazy dog jumps over the fox"], None, room)[0]
    assert cut and len(ids) == room and ids[0] == ours.cls_id and ids[-1] == ours.sep_id
