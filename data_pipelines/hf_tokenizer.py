"""Any Hugging Face `tokenizer.json` behind the interface of `data_pipelines.tokenization`.

The file is the whole tokenizer (normalizer, pre-tokenizer, model, post-processor), run by
the same `tokenizers` library that transformers' fast tokenizers run, so the ids equal
`transformers.AutoTokenizer.from_pretrained(directory)`'s on any text: byte-level BPE
(ModernBERT, RoBERTa, GPT-2), Unigram (XLM-R, T5) or WordPiece. One setting transformers
changes on loading is changed here the same way: a byte-level pre-tokenizer's
`add_prefix_space` is tokenizer_config.json's (False when it says nothing). A truncation or
padding stored in the file is dropped, as transformers drops it unless asked.

What the file does not say is which token plays which part. Each role is read, first found:

    1. tokenizer_config.json beside the file: `cls_token`, `sep_token`, ... (transformers'
       own source, and what it reports as `cls_token_id` ...);
    2. special_tokens_map.json beside it, the same keys;
    3. the post-processor of tokenizer.json: the token before the text is the classifier
       token, the one after it the separator (BertProcessing, RobertaProcessing and
       TemplateProcessing alike);
    4. the conventional names, if the vocabulary has one: [CLS] <s>, [SEP] </s>,
       [MASK] <mask>, [PAD] <pad>, [UNK] <unk>.

A tokenizer with no mask, separator, classifier or padding token this way cannot make BERT
inputs, and is refused naming the roles it lacks. No unknown token is fine (byte-level BPE
has none): `unk_id` is then None.

Whole-word masking reads word boundaries from the tokenizer's own pre-tokenization
(`encode_batch_with_word_starts`: a token starts a word when its word id differs from the
previous token's), so a word is whatever this tokenizer splits text into before its model
runs, for every model type, with no '##' or '▁' convention assumed.

A model's inputs (one text, or a pair for classification, multiple choice, SQuAD) are laid
out by the file's own post-processor, as transformers lays them out: RoBERTa's
`<s> A </s></s> B </s>`, BERT's and ModernBERT's `[CLS] A [SEP] B [SEP]`; a pair too long
is cut by the library's own longest-first truncation. Token type ids are the
post-processor's, or all 0 where tokenizer_config.json's `model_input_names` leaves
`token_type_ids` out (ModernBERT's: its model has no token-type embeddings).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from tokenizers import Tokenizer as RustTokenizer

from data_pipelines import paths
from data_pipelines.tokenizer_base import (
    ACCEPTED_KINDS,
    Slot,
    Tokenizer,
    VocabError,
    check_texts,
    read_bytes,
)

# The files beside tokenizer.json that name its special tokens, in the order they are read.
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")

# role -> the names it has in published tokenizers, when no file names its token.
CONVENTIONAL_NAMES = {
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}
# Roles BERT inputs cannot do without; `unk` may be absent.
REQUIRED_ROLES = ("mask", "sep", "cls", "pad")
# A config's fallback key for a role that has none of its own (transformers' BOS/EOS names).
_FALLBACK_KEYS = {"cls": "bos_token", "sep": "eos_token"}


def _token_name(value) -> str | None:
    """A config's special-token entry: a string, or an AddedToken dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json_beside(path: str, name: str) -> dict:
    """`name` in the directory of `path`, parsed ({} when absent); a link out of that
    directory (but into a Hugging Face cache's blobs/) is refused (`paths.check_inside`)."""
    directory = os.path.dirname(path)
    beside = os.path.join(directory, name)
    if os.path.lexists(beside):
        paths.check_inside(directory, beside, error=VocabError)
    try:
        data = read_bytes(beside, name)
    except FileNotFoundError:
        return {}
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise VocabError(f"{beside}: not valid JSON ({e})") from None
    if not isinstance(parsed, dict):
        raise VocabError(f"{beside}: expected a JSON object")
    return parsed


def _post_processor_roles(processor: dict | None) -> dict[str, str]:
    """The cls (before the text) and sep (after it) tokens a post-processor adds."""
    if not processor:
        return {}
    kind = processor.get("type")
    if kind in ("BertProcessing", "RobertaProcessing"):
        return {"cls": processor["cls"][0], "sep": processor["sep"][0]}
    if kind == "TemplateProcessing":
        single = processor.get("single", [])
        text = next((i for i, p in enumerate(single) if "Sequence" in p), None)
        roles = {}
        if text is not None and text > 0 and "SpecialToken" in single[text - 1]:
            roles["cls"] = single[text - 1]["SpecialToken"]["id"]
        if text is not None and text + 1 < len(single) and "SpecialToken" in single[text + 1]:
            roles["sep"] = single[text + 1]["SpecialToken"]["id"]
        return roles
    if kind == "Sequence":
        roles = {}
        for inner in processor.get("processors", []):
            roles = {**_post_processor_roles(inner), **roles}
        return roles
    return {}


def _prefix_space_as_transformers(spec: dict, tokenizer_config: dict) -> None:
    """Sets the pre-tokenizer's `add_prefix_space` as transformers' fast tokenizers do on
    loading: to tokenizer_config.json's `add_prefix_space`, False when it has none (a
    byte-level BPE saved with True then encodes "The" as 'The', not 'ĠThe'). Only a
    top-level pre-tokenizer with that field is changed, as there."""
    pre_tokenizer = spec.get("pre_tokenizer")
    if isinstance(pre_tokenizer, dict) and "add_prefix_space" in pre_tokenizer:
        pre_tokenizer["add_prefix_space"] = bool(tokenizer_config.get("add_prefix_space", False))


def resolve_special_tokens(
    path: str, spec: dict, vocab: dict[str, int], configs: list[tuple[str, dict]]
) -> tuple[dict[str, int], dict[str, str]]:
    """(role -> id, role -> where it was found) for the tokenizer.json at `path`, whose
    `configs` are the (name, contents) of its CONFIG_FILES.

    Raises:
        VocabError: a named token not in the vocabulary, or a required role with no token.
    """
    from_processor = _post_processor_roles(spec.get("post_processor"))
    ids: dict[str, int] = {}
    sources: dict[str, str] = {}
    for role, names in CONVENTIONAL_NAMES.items():
        candidates = []
        for file_name, config in configs:
            for key in (f"{role}_token", _FALLBACK_KEYS.get(role)):
                if key and (token := _token_name(config.get(key))) is not None:
                    candidates.append((token, f"{file_name} {key}"))
                    break
        if role in from_processor:
            candidates.append((from_processor[role], "the post-processor"))
        candidates += [(name, "its conventional name") for name in names if name in vocab]
        if not candidates:
            continue
        token, source = candidates[0]
        if token not in vocab:
            raise VocabError(f"{path}: {role} token {token!r} ({source}) is not in the vocabulary")
        ids[role], sources[role] = vocab[token], source
    missing = [role for role in REQUIRED_ROLES if role not in ids]
    if missing:
        raise VocabError(
            f"{path}: no {' / '.join(missing)} token (BERT inputs need [CLS] text [SEP] and a "
            f"mask token): name it in {CONFIG_FILES[0]} as "
            f"{', '.join(f'{r}_token' for r in missing)}"
        )
    return ids, sources


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json` as a BERT tokenizer.

    Attributes:
        vocab: token -> id, added tokens included.
        inv_vocab: id -> token.
        vocab_size: the largest id + 1.
        special_ids: the ids of the roles and of every added token marked special.
        special_sources: role -> where its token was named (for logs and errors).
        do_lower_case: None: the tokenizer's own normalizer decides.
    """

    def __init__(self, path: str, data: bytes | None = None):
        """Loads `path` (a tokenizer.json; `data`: its bytes, when already read)."""
        self.vocab_file = path
        self._setup(read_bytes(path, "tokenizer.json") if data is None else data)

    def _setup(self, data: bytes) -> None:
        path = self.vocab_file
        configs = [(name, _read_json_beside(path, name)) for name in CONFIG_FILES]
        try:
            spec = json.loads(data.decode("utf-8"))
            _prefix_space_as_transformers(spec, configs[0][1])
            self._rust = RustTokenizer.from_str(json.dumps(spec))
        except Exception as e:  # noqa: BLE001 - the Rust parser's errors have many types
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise VocabError(f"{path}: not a readable tokenizer.json ({reason}); "
                             f"{ACCEPTED_KINDS}") from None  # fmt: skip
        # A file may carry a truncation and padding of its own (sentence-transformers' do);
        # transformers turns them off unless asked, and so does this class.
        self._rust.no_truncation()
        self._rust.no_padding()
        self._data = data  # as read: pickling sets the tokenizer up again from it
        self._spec = json.dumps(spec)  # as run (`encode_for_model` builds its copy from it)
        self.do_lower_case = None
        self.vocab = self._rust.get_vocab(with_added_tokens=True)
        self.vocab_size = max(self.vocab.values()) + 1 if self.vocab else 0
        if not self.vocab:
            raise VocabError(f"{path}: the tokenizer has an empty vocabulary")
        self.inv_vocab = [""] * self.vocab_size
        for token, i in self.vocab.items():
            self.inv_vocab[i] = token
        self._roles, self.special_sources = resolve_special_tokens(path, spec, self.vocab, configs)
        added = self._rust.get_added_tokens_decoder()
        self.special_ids = frozenset(
            {i for i, token in added.items() if token.special} | set(self._roles.values())
        )
        # transformers returns token type ids only where model_input_names has them.
        names = configs[0][1].get("model_input_names")
        self.token_types = not isinstance(names, list) or "token_type_ids" in names
        self._model_inputs: RustTokenizer | None = None
        self._templates: dict[bool, tuple[Slot, ...]] = {}

    # Pickling (spawned workers) rebuilds the Rust tokenizer from the file's bytes; the
    # roles are read again from the files beside it.
    def __getstate__(self) -> dict:
        return {"vocab_file": self.vocab_file, "data": self._data}

    def __setstate__(self, state: dict) -> None:
        self.vocab_file = state["vocab_file"]
        self._setup(state["data"])

    @property
    def pad_id(self) -> int:
        return self._roles["pad"]

    @property
    def unk_id(self) -> int | None:
        return self._roles.get("unk")

    @property
    def cls_id(self) -> int:
        return self._roles["cls"]

    @property
    def sep_id(self) -> int:
        return self._roles["sep"]

    @property
    def mask_id(self) -> int:
        return self._roles["mask"]

    def _encode(self, texts: Sequence[str], fast: bool):
        texts = list(texts)
        encode = self._rust.encode_batch_fast if fast else self._rust.encode_batch
        try:
            return encode(texts, add_special_tokens=False)
        except TypeError:
            check_texts(texts)
            raise

    def tokenize(self, text: str) -> list[str]:
        """Text -> the vocabulary's tokens (byte-level BPE's are in its byte alphabet: 'Ġthe').

        The vocabulary's, not the text's: an added token that strips a space (ModernBERT's
        [MASK]) is '[MASK]', as `convert_tokens_to_ids` takes it back.
        """
        return self.tokenize_batch([text])[0]

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """Many texts -> tokens, in parallel in Rust."""
        inv = self.inv_vocab
        return [[inv[i] for i in ids] for ids in self.encode_batch(texts)]

    def encode(self, text: str) -> list[int]:
        """Text -> ids, without special tokens."""
        return self._encode([text], fast=True)[0].ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many texts -> ids, without special tokens, in parallel in Rust."""
        return [e.ids for e in self._encode(texts, fast=True)]

    def encode_words(self, words: Sequence[str], after_space: bool = False) -> list[list[int]]:
        """Each word's ids as the word tokenizes inside the text `" ".join(words)`
        (preceded by a space when `after_space`).

        A word after a space is encoded with the space in front of it: byte-level BPE's
        pieces mark it ('Ġfox', where 'fox' alone gives 'fox'), Metaspace's too whatever
        its prepend_scheme, and pre-tokenizers that drop spaces (BERT's, Whitespace) give
        the bare word's pieces either way. The first word is encoded as a text begins:
        with the prefix space only where the tokenizer adds one to every text
        (tokenizer_config.json's `add_prefix_space`). So the pieces are those of
        transformers' encoding of the joined text and, where `add_prefix_space` is set,
        of its `is_split_into_words=True`; RoBERTa's SQuAD preprocessing gives each
        word its prefix space the same way.
        """
        return self.encode_batch(
            [w if i == 0 and not after_space else " " + w for i, w in enumerate(words)]
        )

    def encode_batch_with_word_starts(
        self, texts: Sequence[str]
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Many texts -> (ids, word starts): 1 on a token whose pre-tokenized word differs
        from the previous token's, else 0 (the pieces after a word's first)."""
        ids, starts = [], []
        for encoding in self._encode(texts, fast=False):
            words = encoding.word_ids
            ids.append(encoding.ids)
            starts.append(
                [int(i == 0 or w is None or w != words[i - 1]) for i, w in enumerate(words)]
            )
        return ids, starts

    def pieces_text(self, pieces: Sequence[str]) -> str:
        """The text the pieces spell, by the tokenizer's own decoder (byte-level BPE's 'Ġ'
        is a space, its bytes become characters again; WordPiece joins '##'); no decoder:
        the pieces joined by spaces."""
        decoder = self._rust.decoder
        text = decoder.decode(list(pieces)) if decoder is not None else " ".join(pieces)
        return " ".join(text.split())

    def is_continuation(self, token: str) -> bool:
        """Always False: a token alone does not say; word starts come from
        `encode_batch_with_word_starts`."""
        del token
        return False

    def _for_model(self, max_length: int | None) -> RustTokenizer:
        """The file's tokenizer as run for model inputs: post-processor on, the library's
        longest-first truncation to `max_length` (None: none), no padding."""
        if self._model_inputs is None:
            self._model_inputs = RustTokenizer.from_str(self._spec)
            self._model_inputs.no_padding()
        rust = self._model_inputs
        if max_length is None:
            rust.no_truncation()
        else:
            rust.enable_truncation(max_length, strategy="longest_first")
        return rust

    def _type_ids(self, type_ids: list[int]) -> list[int]:
        return type_ids if self.token_types else [0] * len(type_ids)

    def encode_for_model(
        self, text: str, pair: str | None = None, max_length: int | None = None
    ) -> tuple[list[int], list[int]]:
        """(input ids, token type ids) with the tokenizer's own special tokens around one
        text or a pair, truncated longest-first to `max_length` (as transformers'
        `tokenizer(text, pair, truncation=True, max_length=...)`)."""
        encoding = self._for_model(max_length).encode(text, pair, add_special_tokens=True)
        return encoding.ids, self._type_ids(encoding.type_ids)

    def encode_for_model_batch(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None, max_length: int
    ) -> list[tuple[list[int], list[int], bool]]:
        """As `Tokenizer.encode_for_model_batch`, by the file's post-processor and the
        library's longest-first truncation (transformers' `truncation=True`)."""
        pairs = self._check_room(texts, pairs, max_length)
        inputs = [
            text if pair is None else (text, pair) for text, pair in zip(texts, pairs, strict=True)
        ]
        try:
            encodings = self._for_model(max_length).encode_batch(inputs, add_special_tokens=True)
        except TypeError:
            check_texts([*texts, *(p for p in pairs if p is not None)])
            raise
        # A cut input keeps what it lost in `overflowing` (stride 0: the rest).
        return [(e.ids, self._type_ids(e.type_ids), bool(e.overflowing)) for e in encodings]

    def template(self, pair: bool) -> tuple[Slot, ...]:
        """The post-processor's slots, read by running it on two probe texts: where their
        pieces land is "A" and "B", every token it added is a special slot."""
        if pair not in self._templates:
            a, b = self._rust.encode_batch(["a", "b"], add_special_tokens=False)
            if not a.ids or not b.ids:
                raise VocabError(f"{self.vocab_file}: the probe texts 'a' and 'b' encode to "
                                 f"nothing; cannot read the post-processor's layout")  # fmt: skip
            out = self._for_model(None).post_process(a, b if pair else None)
            slots: list[Slot] = []
            texts = iter([("A", len(a.ids)), ("B", len(b.ids))] if pair else [("A", len(a.ids))])
            position = 0
            while position < len(out.ids):
                type_id = self._type_ids(out.type_ids)[position]
                if out.special_tokens_mask[position]:
                    slots.append((out.ids[position], type_id))
                    position += 1
                    continue
                name, length = next(texts, ("a third text", 1))
                slots.append((name, type_id))
                position += length
            if [s for s, _ in slots if isinstance(s, str)] != (["A", "B"] if pair else ["A"]):
                raise VocabError(f"{self.vocab_file}: the post-processor does not keep each "
                                 f"text in one piece ({slots})")  # fmt: skip
            self._templates[pair] = tuple(slots)
        return self._templates[pair]
