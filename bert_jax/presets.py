"""The named model sizes and architectures: `BertConfig.from_preset` and the experiment configs'
`model.preset` read them (`bert_jax.config.preset_fields` resolves a name to its fields).

BERT's sizes are (layers, hidden, heads) with a 4H feed-forward, the paper's and Google's
compact ones; ModernBERT's state every field they set, its architecture included.
"""

from __future__ import annotations

from typing import Any

# name: (num_hidden_layers, hidden_size, num_attention_heads); intermediate = 4H.
# The compact sizes are the ones Google published with "Well-Read Students Learn Better".
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# ModernBERT's architecture (Warner et al. 2024, answerdotai/ModernBERT-base's config.json):
# rotary positions (base 160k global, 10k local), GeGLU, pre-LN, no biases, a 128-token
# window with every third layer global, no token types, no dropout.
_MODERNBERT = dict(
    vocab_size=50368,
    max_position_embeddings=8192,
    position_encoding="rotary",
    rope_theta=160000.0,
    local_rope_theta=10000.0,
    feed_forward="glu",
    norm_placement="pre",
    linear_bias=False,
    norm_bias=False,
    local_attention_window=128,
    global_attention_every=3,
    type_vocab_size=0,
    layer_norm_eps=1e-5,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
# name: every field the preset sets. "modernbert_tiny" is ours, CPU-sized: layers of both
# kinds (0 and 2 global, 1 and 3 local) and a 32-token window shorter than its 512 positions.
MODERN_PRESETS: dict[str, dict[str, Any]] = {
    "modernbert_base": dict(
        _MODERNBERT,
        num_hidden_layers=22,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=1152,
    ),
    "modernbert_large": dict(
        _MODERNBERT,
        num_hidden_layers=28,
        hidden_size=1024,
        num_attention_heads=16,
        intermediate_size=2624,
    ),
    "modernbert_tiny": dict(
        _MODERNBERT,
        num_hidden_layers=4,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=192,
        max_position_embeddings=512,
        local_attention_window=32,
        global_attention_every=2,
    ),
}
