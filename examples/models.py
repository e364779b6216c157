"""GPT-2-style causal LMs built from a config with random weights: no hub, no network.

Sizes are chosen for three jobs: ``tiny`` (~0.22 M parameters) for CI, where a training
step must take milliseconds on a CPU; ``small`` (~3.3 M) for demos that should visibly
learn in minutes; ``medium`` (~25.6 M) for benchmarks where the gradient payload is
large enough for communication to matter. All use the byte vocabulary of
:mod:`examples.shakespeare` by default and tie the LM head to the token
embedding (Hugging Face's GPT-2 default), so each weight is counted once.

Reproducibility: weights are a function of ``seed`` alone (drawn under a forked RNG, so
building a model neither depends on nor disturbs the caller's global RNG); dropout is 0
by default so two runs, or two modes that should agree, compute the same losses step for
step. ``attn_implementation`` defaults to ``"eager"`` (plain matmul + softmax), which is
deterministic on CPU and CUDA. ``"sdpa"`` (transformers 5's own default) gives the same
losses to ~1e-6 and is also bitwise repeatable on CPU, and is faster, but on CUDA its
memory-efficient backward kernel is not deterministic; pick it for throughput benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from examples.shakespeare import EOS_ID, VOCAB_SIZE


@dataclass(frozen=True)
class GPTSize:
    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int
    """Default context length (``seq_len`` in :func:`build_gpt` overrides it)."""


SIZES = {
    "tiny": GPTSize(n_layer=4, n_embd=64, n_head=4, n_positions=128),
    "small": GPTSize(n_layer=4, n_embd=256, n_head=4, n_positions=256),
    "medium": GPTSize(n_layer=8, n_embd=512, n_head=8, n_positions=512),
}
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: got {value!r}; allowed: an integer >= {minimum}")
    return value


def gpt_config(
    size: str = "tiny",
    vocab_size: int = VOCAB_SIZE,
    seq_len: Optional[int] = None,
    *,
    dropout: float = 0.0,
    attn_implementation: str = "eager",
) -> GPT2Config:
    """The config :func:`build_gpt` uses; exposed so launchers can log or tweak it."""
    if size not in SIZES:
        raise ValueError(f"size: got {size!r}; allowed: {', '.join(map(repr, SIZES))}")
    _check_int("vocab_size", vocab_size, 1)
    if seq_len is not None:
        _check_int("seq_len", seq_len, 1)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: got {dropout!r}; allowed: a number in [0, 1)")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: got {attn_implementation!r}; "
            f"allowed: {', '.join(map(repr, ATTN_IMPLEMENTATIONS))}"
        )
    shape = SIZES[size]
    # GPT-2's default BOS/EOS id (50256) lies outside a byte vocabulary and makes
    # transformers warn; point them at our EOS when it exists.
    special = EOS_ID if EOS_ID < vocab_size else None
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=seq_len if seq_len is not None else shape.n_positions,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=float(dropout),
        embd_pdrop=float(dropout),
        attn_pdrop=float(dropout),
        bos_token_id=special,
        eos_token_id=special,
        use_cache=False,  # training only: no KV cache objects built in forward
        attn_implementation=attn_implementation,
    )


def build_gpt(
    size: str = "tiny",
    vocab_size: int = VOCAB_SIZE,
    seq_len: Optional[int] = None,
    seed: int = 0,
    *,
    dropout: float = 0.0,
    attn_implementation: str = "eager",
) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 LM of a named size (see :data:`SIZES`), in train mode.

    ``seq_len`` is the longest context the model accepts (``n_positions``); ``None`` keeps
    the size's default. ``model(input_ids=x, labels=x).loss`` is the mean next-token loss
    (the model shifts ``labels`` itself).
    """
    _check_int("seed", seed, 0)
    config = gpt_config(
        size, vocab_size, seq_len, dropout=dropout, attn_implementation=attn_implementation
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    # transformers 5 derives the loss from the class name; "GPT2LMHeadModel" matches no
    # entry, so it warns once and falls back to the causal-LM loss. Say so explicitly.
    model.loss_type = "ForCausalLM"
    return model.train()


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct parameter elements; tied weights (LM head = embedding) count once,
    because ``Module.parameters()`` deduplicates shared tensors."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
