"""Benchmark workers: our model, transformers' Flax BERT and transformers' PyTorch BERT.

Each peer runs in its own process (`python benchmarks/peers.py SPEC_JSON`), so the three
frameworks never share a thread pool, and the HF Flax peer can run under the older jax
that transformers 4.57.6's Flax code needs (`.bench_venvs/hf-flax`, made by
`ensure_hf_flax_venv`). A worker builds and compiles its cases, warms them up, then
answers one JSON command per line on stdin (`{"case": name, "iters": k}`) with the
wall time of each of `k` steps, so that `bench_model` can interleave the peers step by
step on a noisy shared machine. Only the standard library and numpy are imported at
module level: everything else is imported by the runner that needs it, in its own venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# --- the HF Flax peer's venv ---------------------------------------------------------------

HF_FLAX_VENV = os.path.join(".bench_venvs", "hf-flax")
# transformers 4.57.6 declares jax/jaxlib <= 0.4.13 and flax <= 0.7.0 for its Flax models,
# but its Flax BERT also runs unchanged on jax 0.4.38 + flax 0.10.2, which compiles the
# same step ~2-3x faster on this CPU than jax 0.4.13 (an XLA:CPU two years newer), so the
# peer is measured at its best. jax 0.4.38 is the last 0.4 release and flax 0.10.2 the
# release built against it; optax/chex are pinned to the releases pip resolved with them,
# and numpy < 2.3 keeps every wheel in its tested range. (Tried: jax 0.4.13 + flax 0.7.0
# also works if scipy is pinned < 1.13, but is slower.) Recorded in the output JSON.
HF_FLAX_PINS = (
    "transformers==4.57.6",
    "jax==0.4.38",
    "jaxlib==0.4.38",
    "flax==0.10.2",
    "optax==0.2.5",
    "chex==0.1.90",
    "numpy==2.2.6",
)


def ensure_hf_flax_venv(root: str, log: Callable[[str], None] = print) -> str:
    """Creates `root/.bench_venvs/hf-flax` with HF_FLAX_PINS if needed; returns its python."""
    venv = os.path.join(root, HF_FLAX_VENV)
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".pins")
    wanted = "\n".join(HF_FLAX_PINS)
    if os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read() == wanted:
                return python
    log(f"creating {venv} with {' '.join(HF_FLAX_PINS)} (one-off, a few minutes)")
    subprocess.run(["python3.11", "-m", "venv", "--clear", venv], check=True)
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", *HF_FLAX_PINS],
        capture_output=True,
        text=True,
    )
    if pip.returncode:
        raise RuntimeError(f"pip install into {venv} failed:\n{pip.stderr[-4000:]}")
    with open(stamp + ".tmp", "w", encoding="utf-8") as f:
        f.write(wanted)
    os.replace(stamp + ".tmp", stamp)
    return python


# --- shared helpers --------------------------------------------------------------------------


def mlm_labels(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """(B, T) labels for the HF models: the true id at masked positions, -100 elsewhere."""
    ids = inputs["input_ids"]
    labels = np.full(ids.shape, -100, dtype=np.int64)
    rows = np.arange(ids.shape[0])[:, None]
    real = inputs["masked_lm_weights"] > 0
    row_index = np.broadcast_to(rows, real.shape)[real]
    labels[row_index, inputs["masked_lm_positions"][real]] = inputs["masked_lm_ids"][real]
    return labels


def decays(path_names: list[str]) -> bool:
    """The original BERT rule: no weight decay on biases and LayerNorm parameters."""
    lowered = [n.lower() for n in path_names]
    return not any("bias" in n or "norm" in n for n in lowered)


def _jax_decay_mask(params):
    import jax

    def leaf(path, _):
        names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        return decays(names)

    return jax.tree_util.tree_map_with_path(leaf, params)


def _time_jax(fn: Callable[[], Any], iters: int) -> list[float]:
    import jax

    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times


class _JaxCases:
    """Step bookkeeping shared by the two jax peers: one closure per case, state kept here."""

    def __init__(self):
        self.steps: dict[str, Callable[[], Any]] = {}
        self.first_loss: dict[str, float] = {}

    def add_training(self, name, mode, loss_fn, params, batch, lr: float, key=None):
        """`mode` "fwdbwd": value_and_grad only; "train": plus an optax.adamw update.

        `key` (default `PRNGKey(1)`) is the dropout stream; each step folds its count in.
        """
        import jax
        import optax

        key = jax.random.PRNGKey(1) if key is None else key
        counter = [0]

        if mode == "fwdbwd":
            grad_fn = jax.jit(jax.value_and_grad(loss_fn))

            def step():
                counter[0] += 1
                loss, grads = grad_fn(params, batch, jax.random.fold_in(key, counter[0]))
                return loss, grads

        elif mode == "train":
            tx = optax.adamw(
                lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=_jax_decay_mask
            )

            def train_step(state, batch, rng):
                p, opt_state = state
                loss, grads = jax.value_and_grad(loss_fn)(p, batch, rng)
                updates, opt_state = tx.update(grads, opt_state, p)
                return (optax.apply_updates(p, updates), opt_state), loss

            jitted = jax.jit(train_step, donate_argnums=0)
            # Own copies of the params: the donated state is updated in place.
            state = [(jax.tree_util.tree_map(lambda x: x.copy(), params), tx.init(params))]

            def step():
                counter[0] += 1
                state[0], loss = jitted(state[0], batch, jax.random.fold_in(key, counter[0]))
                return loss, state[0]

        else:
            raise ValueError(f"unknown mode {mode!r}")
        loss, _ = jax.block_until_ready(step())
        self.first_loss[name] = float(loss)
        self.steps[name] = step

    def add_matmul(self, name, n: int, dtype: str):
        """An (n, n) @ (n, n) product in `dtype` accumulating in f32: the peak reference."""
        import jax
        import jax.numpy as jnp

        rng = np.random.default_rng(0)
        a = jnp.asarray(rng.standard_normal((n, n)), dtype)
        b = jnp.asarray(rng.standard_normal((n, n)), dtype)
        mm = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.float32))
        jax.block_until_ready(mm(a, b))
        self.steps[name] = lambda: mm(a, b)

    def run(self, name: str, iters: int) -> list[float]:
        return _time_jax(self.steps[name], iters)


# --- our model ------------------------------------------------------------------------------


def ours_config(dims: dict[str, int], **overrides: Any):
    """The `bert_jax` config of a benchmark size (`dims` as the plan's "model" entry)."""
    from bert_jax.config import BertConfig

    return BertConfig(
        vocab_size=dims["vocab_size"],
        hidden_size=dims["hidden_size"],
        num_hidden_layers=dims["num_layers"],
        num_attention_heads=dims["num_heads"],
        intermediate_size=4 * dims["hidden_size"],
        **overrides,
    )


class OursRunner(_JaxCases):
    """`bert_jax.heads.BertForPreTraining`: MLM logits only at the masked positions."""

    def __init__(self, spec: dict[str, Any], inputs: dict[str, np.ndarray]):
        super().__init__()
        import jax

        # The dropout stream in the implementation a config's `prng_impl` names, as a typed
        # key (training's `run_keys` does the same; the init stays threefry there too).
        prng_impl = spec.get("prng_impl") or "threefry2x32"
        dropout_key = jax.random.key(1, impl=prng_impl)
        import jax.numpy as jnp
        import optax

        import bert_jax
        from bert_jax.heads import BertForPreTraining

        self.versions = {
            "jax": jax.__version__,
            "prng_impl": prng_impl,
            "bert_jax_from": os.path.dirname(os.path.dirname(os.path.abspath(bert_jax.__file__))),
            "device": jax.devices()[0].device_kind,
        }
        batch = {k: jnp.asarray(v) for k, v in inputs.items()}
        dims = spec["model"]
        for case in spec["cases"]:
            name = case["name"]
            if case["mode"] == "matmul":
                self.add_matmul(name, case["n"], case["dtype"])
                continue
            config = ours_config(
                dims,
                dtype=case["dtype"],
                scan_layers=case["scan"],
                remat_policy=case.get("remat", "none"),
            )
            model = BertForPreTraining(config)

            def loss_fn(params, batch, rng, model=model):
                out = model.apply(
                    {"params": params},
                    batch["input_ids"],
                    batch["input_mask"],
                    batch["segment_ids"],
                    batch["masked_lm_positions"],
                    deterministic=False,
                    rngs={"dropout": rng},
                )
                weights = batch["masked_lm_weights"].astype(jnp.float32)
                mlm = optax.softmax_cross_entropy_with_integer_labels(
                    out.mlm_logits.astype(jnp.float32), batch["masked_lm_ids"]
                )
                mlm = jnp.sum(mlm * weights) / (jnp.sum(weights) + 1e-5)
                nsp = optax.softmax_cross_entropy_with_integer_labels(
                    out.nsp_logits.astype(jnp.float32), batch["next_sentence_labels"]
                )
                return mlm + jnp.mean(nsp)

            import flax.linen as nn

            params = model.init(
                {"params": jax.random.PRNGKey(0)},
                batch["input_ids"],
                batch["input_mask"],
                batch["segment_ids"],
                batch["masked_lm_positions"],
            )["params"]
            params = nn.unbox(params)
            self.add_training(
                name, case["mode"], loss_fn, params, batch, spec["lr"], key=dropout_key
            )


# --- transformers' Flax BERT ----------------------------------------------------------------


class HfFlaxRunner(_JaxCases):
    """transformers' `FlaxBertForPreTraining` (MLM logits at every position), in its venv."""

    def __init__(self, spec: dict[str, Any], inputs: dict[str, np.ndarray]):
        super().__init__()
        import flax
        import jax
        import jax.numpy as jnp
        import optax
        import transformers

        self.versions = {
            "jax": jax.__version__,
            "flax": flax.__version__,
            "optax": optax.__version__,
            "transformers": transformers.__version__,
        }
        labels = mlm_labels(inputs).astype(np.int32)
        batch = {k: jnp.asarray(v) for k, v in inputs.items()}
        batch["mlm_labels"] = jnp.asarray(labels)
        for case in spec["cases"]:
            name = case["name"]
            if case["mode"] == "matmul":
                self.add_matmul(name, case["n"], case["dtype"])
                continue
            model = transformers.FlaxBertForPreTraining(
                _hf_config(transformers, spec["model"]),
                input_shape=inputs["input_ids"].shape,
                seed=0,
                dtype=jnp.dtype(case["dtype"]),
            )

            def loss_fn(params, batch, rng, model=model):
                out = model(
                    batch["input_ids"],
                    attention_mask=batch["input_mask"],
                    token_type_ids=batch["segment_ids"],
                    params=params,
                    dropout_rng=rng,
                    train=True,
                )
                labels = batch["mlm_labels"]  # (B, T), -100 where nothing is predicted
                real = labels != -100
                mlm = optax.softmax_cross_entropy_with_integer_labels(
                    out.prediction_logits.astype(jnp.float32), jnp.where(real, labels, 0)
                )
                mlm = jnp.sum(mlm * real) / jnp.sum(real)
                nsp = optax.softmax_cross_entropy_with_integer_labels(
                    out.seq_relationship_logits.astype(jnp.float32),
                    batch["next_sentence_labels"],
                )
                return mlm + jnp.mean(nsp)

            self.add_training(name, case["mode"], loss_fn, model.params, batch, spec["lr"])


def _hf_config(transformers, dims: dict[str, int]):
    return transformers.BertConfig(
        vocab_size=dims["vocab_size"],
        hidden_size=dims["hidden_size"],
        num_hidden_layers=dims["num_layers"],
        num_attention_heads=dims["num_heads"],
        intermediate_size=4 * dims["hidden_size"],
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
    )


# --- transformers' PyTorch BERT and ModernBERT ----------------------------------------------


def _hf_modernbert_config(transformers, dims: dict[str, Any]):
    """ModernBERT of `dims` (the rest ModernBertConfig's defaults, ModernBERT-base's: rotary
    bases 160k/10k, GeGLU, no biases, no dropout), in transformers 4.57 and 5 alike.

    The special ids are the synthetic batches' (pad 0, [CLS] 101, [SEP] 102): the defaults lie
    past a small vocabulary. `sparse_prediction`: the MLM head runs at the labelled positions
    only, as ModernBERT trained (and as ours gathers the masked ones).
    """
    return transformers.ModernBertConfig(
        vocab_size=dims["vocab_size"],
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_layers"],
        num_attention_heads=dims["num_heads"],
        max_position_embeddings=dims["max_position_embeddings"],
        local_attention=dims["local_attention_window"],
        global_attn_every_n_layers=dims["global_attention_every"],
        pad_token_id=0,
        bos_token_id=101,
        cls_token_id=101,
        eos_token_id=102,
        sep_token_id=102,
        sparse_prediction=True,
        attn_implementation="sdpa",  # no flash_attn on the benchmark machines
    )


# family: (transformers' pretraining model, its config, the forward's inputs).
TORCH_MODELS = {
    "bert": (
        "BertForPreTraining",
        _hf_config,
        ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"),
    ),
    # No token types, no NSP: MLM alone.
    "modernbert": (
        "ModernBertForMaskedLM",
        _hf_modernbert_config,
        ("input_ids", "attention_mask", "labels"),
    ),
}


class TorchRunner:
    """transformers' PyTorch `BertForPreTraining` (or the `TORCH_MODELS` entry of
    `spec["model"]["family"]`), eager, loss from `labels`.

    On the GPU when torch sees one (f32 matmuls in TF32, as XLA's default precision does
    on such GPUs), else on every CPU core.
    """

    def __init__(self, spec: dict[str, Any], inputs: dict[str, np.ndarray]):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.versions = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "device": (torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu"),
        }
        self.torch = torch
        self.steps: dict[str, Callable[[], Any]] = {}
        self.first_loss: dict[str, float] = {}
        model_class, make_config, names = TORCH_MODELS[spec["model"].get("family", "bert")]
        values = dict(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["input_mask"],
            token_type_ids=inputs["segment_ids"],
            labels=mlm_labels(inputs),
            next_sentence_label=inputs["next_sentence_labels"],
        )
        kwargs = {
            name: torch.from_numpy(values[name].astype(np.int64)).to(self.device) for name in names
        }
        for case in spec["cases"]:
            name = case["name"]
            if case["mode"] == "matmul":
                self._add_matmul(name, case["n"], case["dtype"])
                continue
            torch.manual_seed(0)
            model = getattr(transformers, model_class)(make_config(transformers, spec["model"]))
            model.to(self.device)
            self.versions["attn_implementation"] = model.config._attn_implementation
            model.train()  # dropout on
            autocast = case["dtype"] == "bfloat16"
            optimizer = None
            if case["mode"] == "train":
                named = list(model.named_parameters())
                groups = [
                    {"params": [p for n, p in named if decays(n.split("."))], "weight_decay": 0.01},
                    {
                        "params": [p for n, p in named if not decays(n.split("."))],
                        "weight_decay": 0.0,
                    },
                ]
                # fused=True is torch's fastest AdamW (one kernel over all tensors).
                optimizer = torch.optim.AdamW(
                    groups,
                    lr=spec["lr"],
                    betas=(0.9, 0.999),
                    eps=1e-6,
                    fused=case.get("fused", True),
                )

            def step(model=model, optimizer=optimizer, autocast=autocast):
                model.zero_grad(set_to_none=True)
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = model(**kwargs).loss  # MLM CE over labels != -100 (BERT: + NSP CE)
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
                return loss

            self.first_loss[name] = float(step())
            self.steps[name] = step

    def _add_matmul(self, name: str, n: int, dtype: str):
        torch = self.torch
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(self.device, getattr(torch, dtype))
        b = torch.randn(n, n, generator=gen).to(self.device, getattr(torch, dtype))
        torch.mm(a, b)
        self.steps[name] = lambda: torch.mm(a, b)

    def run(self, name: str, iters: int) -> list[float]:
        # Eager CPU ops are synchronous; GPU kernels are waited for within each timed step.
        sync = self.torch.cuda.synchronize if self.device.type == "cuda" else lambda: None
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            self.steps[name]()
            sync()
            times.append(time.perf_counter() - start)
        return times


RUNNERS = {"ours": OursRunner, "hf_flax": HfFlaxRunner, "torch": TorchRunner}


def worker_main(spec_json: str) -> None:
    """Builds the cases of one peer, then serves timing commands (see the module doc)."""
    # The protocol owns the real stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = json.loads(spec_json)
    with np.load(spec["inputs"]) as data:
        inputs = {k: data[k] for k in data.files}
    start = time.perf_counter()
    runner = RUNNERS[spec["peer"]](spec, inputs)
    for case in spec["cases"]:  # warm-up, excluded from every figure
        runner.run(case["name"], spec["warmup"])
    proto.write(
        json.dumps(
            {
                "ready": True,
                "build_s": time.perf_counter() - start,
                "versions": runner.versions,
                "first_loss": runner.first_loss,
            }
        )
        + "\n"
    )
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        times = runner.run(command["case"], command["iters"])
        proto.write(json.dumps({"times": times}) + "\n")


USAGE = "usage: python -m benchmarks.peers SPEC_JSON  (bench_model starts it: see its docstring)"


def check_argv(argv: list[str]) -> None:
    """`--help`/`-h`: the usage and this docstring, exit 0; anything but one JSON object:
    the usage and what is wrong in one line, exit 2 (not a traceback of `json.loads`)."""
    if argv[1:] in (["--help"], ["-h"]):
        print(f"{USAGE}\n\n{__doc__}")
        sys.exit(0)
    error = f"expected one argument, SPEC_JSON; got {len(argv) - 1}" if len(argv) != 2 else None
    if error is None:
        try:
            if not isinstance(json.loads(argv[1]), dict):
                error = "SPEC_JSON is not a JSON object"
        except json.JSONDecodeError as e:
            error = f"SPEC_JSON is not JSON ({e})"
    if error:
        sys.stderr.write(f"{USAGE}\npeers: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    check_argv(sys.argv)
    worker_main(sys.argv[1])
