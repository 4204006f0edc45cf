r"""How much of a TPU step its elementwise ops could be worth at most, by the compiler.

A fused LayerNorm, a cheaper dropout PRNG or a fused GELU can save at most what the op costs
in the compiled step. This compiles a config's train step for its TPU slice (needs libtpu;
nothing is allocated) with each kind of op taken out: the step time of the model without it
bounds what any faster form of it can buy. The variants are not models anyone should train
(a BERT without LayerNorm diverges); they are measuring sticks.

  config         the config as it is
  no_dropout     every dropout rate 0 (no masks drawn, none applied)
  no_layer_norm  every LayerNorm the identity (embeddings, layers, the MLM head)
  no_gelu        the feed-forward activation the identity
  none           all three out

  python -m benchmarks.studies.elementwise_bounds \
      --config=experiments/configs/bert_large_paper.py:phase1
(docs/tpu_elementwise.md, "Dropout masks and fused attention", has the figures.)
"""

from __future__ import annotations

import contextlib
import os
import time
from unittest import mock

import flax.linen as nn
from absl import flags
from ml_collections import config_flags

from data_pipelines import cli

FLAGS = flags.FLAGS

VARIANTS = {  # name: the kinds of op taken out
    "config": (),
    "no_dropout": ("dropout",),
    "no_layer_norm": ("layer_norm",),
    "no_gelu": ("gelu",),
    "none": ("dropout", "layer_norm", "gelu"),
}


class Identity(nn.Module):
    """Stands in for a LayerNorm: returns its input, has no parameters."""

    @nn.compact
    def __call__(self, x):
        return x


@contextlib.contextmanager
def without(config, kinds: tuple[str, ...]):
    """Yields a copy of `config` whose model lacks `kinds` of op (see VARIANTS); the model
    code is patched for the block's duration only."""
    from bert_jax import electra, heads, model

    config = config.copy_and_resolve_references()
    with config.unlocked():
        if "dropout" in kinds:
            config.model.hidden_dropout_prob = 0.0
            config.model.attention_probs_dropout_prob = 0.0
    replacements = {}
    if "layer_norm" in kinds:
        replacements["layer_norm"] = lambda cfg, name, dtype=None: Identity(name=name)
    if "gelu" in kinds:
        replacements["activation"] = lambda cfg: lambda x: x
    with contextlib.ExitStack() as patches:
        for name, replacement in replacements.items():
            for module in (model, heads, electra):  # each module's own name for it
                if hasattr(module, name):
                    patches.enter_context(mock.patch.object(module, name, replacement))
        yield config


def main(argv) -> int:
    del argv
    from benchmarks.studies.bf16_options import step_figures
    from experiments import aot_compile

    config = aot_compile.unrolled(FLAGS.config)
    if FLAGS.layers:
        with config.unlocked():
            config.model.num_hidden_layers = FLAGS.layers
    devices = aot_compile.slice_devices(config.topology)
    print("| variant | ms / step | MFU | peak GiB / core | at most saved |")
    print("| --- | ---: | ---: | ---: | ---: |")
    reference = None
    for name in FLAGS.variants:
        start = time.time()
        with without(config, VARIANTS[name]) as variant:
            ms, mfu, memory, _ = step_figures(variant, devices)
        reference = ms if reference is None else reference
        saved = f"{1 - ms / reference:.1%}" if name != FLAGS.variants[0] else "-"
        print(f"| {name} | {ms:.2f} | {mfu:.1%} | {memory:.2f} | {saved} | "
              f"({time.time() - start:.0f} s to compile)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    # Compile-only use of libtpu, as experiments.aot_compile's: JAX's own backend is the CPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    config_flags.DEFINE_config_file("config", None, "A TPU config (with `topology`).")
    flags.DEFINE_integer("layers", None, "Encoder layers (default: the config's).")
    flags.DEFINE_list("variants", list(VARIANTS), f"Of {', '.join(VARIANTS)}; the first is "
                      "the one the others' savings are from.")  # fmt: skip
    cli.run(main)
