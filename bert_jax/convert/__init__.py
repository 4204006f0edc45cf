r"""Weight conversion: Google TF checkpoints, Hugging Face directories and our params.

Import (`load_pretrained`) reads any of
  * a Hugging Face BERT directory: `config.json` + `model.safetensors` + `vocab.txt`
    (BertModel keys, or BertFor* keys under `bert.`; LayerNorm weight/bias or gamma/beta);
  * a Hugging Face ModernBERT directory (`model_type: "modernbert"`): `config.json` +
    `model.safetensors` (ModernBertModel keys, or ModernBertForMaskedLM's under `model.`),
    read as a config with ModernBERT's switches (rotary, GeGLU, pre-LN; `modernbert`); its
    tokenizer files are copied by the command line, none is required;
  * a google-research/bert TF1 checkpoint: the `bert_model.ckpt` prefix (or its directory)
    with `bert_config.json` and `vocab.txt` beside it (optimiser slots are skipped; the
    config's "gelu" is the original code's tanh GELU, `hidden_act="gelu_tanh"` here);
  * this project's params-only Orbax directory (`save_params`), or a pretraining workdir
    or checkpoint directory (`bert_jax.checkpointing`: the newest readable step's params);
and returns the plain (unboxed) `params` of one of our models, looped or scanned as its
config says. Heads the source lacks start from our model's init, with a warning naming
each. Export: `save_hf` writes a directory `transformers` loads with no missing or
unexpected keys (`hidden_act` "gelu" or, for the tanh form, "gelu_new"; a ModernBERT config
as a ModernBertModel or ModernBertForMaskedLM); `save_params` writes params-only Orbax.
Numpy in, numpy out: no torch.

Usage:
    python -m bert_jax.convert --input=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --output=/tmp/bert-base-uncased-hf --format=hf
    python -m bert_jax.convert --input=/path/to/hf_dir --output=/tmp/params --format=orbax

The package: `names` (BERT's table naming every parameter in our, HF and Google layouts, and
`Family`, what the generic code reads of a family), `modernbert` (ModernBERT's table and
config.json), `families` (which family a config or config.json is), `readers` (the formats
on disk, read as a `Source`, and params-only Orbax), `locations` (which model a location
means, and the rule that a model directory reads only its own files), `load` (`load_pretrained`,
`load_source`: a Source into one of our models) and `export` (HF safetensors);
`python -m bert_jax.convert` is the command line (`__main__`).
"""

from __future__ import annotations

import importlib

# Each public name and its submodule. Both are imported on first use (PEP 562), so that
# `python -m bert_jax.convert -h` answers without loading JAX and Flax.
_EXPORTS = {
    "ConversionError": "names",
    "check_vocab": "readers",
    "detect_format": "readers",
    "load_params": "readers",
    "load_pretrained": "load",
    "load_source": "load",
    "open_source": "readers",
    "save_hf": "export",
    "save_params": "readers",
    "stack_layers": "names",
    "to_hf_state_dict": "export",
    "unstack_layers": "names",
    "writing_dir": "output_dir",
}
_SUBMODULES = (
    "electra",
    "export",
    "families",
    "load",
    "locations",
    "modernbert",
    "names",
    "output_dir",
    "readers",
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
