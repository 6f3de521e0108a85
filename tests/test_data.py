import hashlib
from pathlib import Path

import pytest
import torch

from zerocourse import data
from zerocourse.data import (CORPUS_FILE, CORPUS_SHA256, CharTokenizer, get_batch, load_corpus,
                             load_dataset, load_tokenizer, write_corpus)

SHIPPED = Path(__file__).resolve().parent.parent / "data" / CORPUS_FILE


def test_shipped_file_checksum_and_size():
    raw = SHIPPED.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == CORPUS_SHA256
    assert 100_000 <= len(raw) <= 300_000
    assert load_corpus() == raw.decode("utf-8")


def test_regeneration_reproduces_shipped_file(tmp_path):
    path = write_corpus(tmp_path)
    assert path.read_bytes() == SHIPPED.read_bytes()


def test_splitmix64_known_answer():
    # Reference values of SplitMix64 (Vigna) for seed 0.
    rng = data._SplitMix64(0)
    assert [rng.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_corpus_looks_like_the_grammar():
    lines = load_corpus().splitlines()
    sums = [line for line in lines if "+" in line]
    assert 0.15 < len(sums) / len(lines) < 0.35
    for line in sums[:200]:
        a, rest = line.rstrip(".").split("+")
        b, c = rest.split("=")
        assert int(a) + int(b) == int(c)
    assert all(line[0].isupper() and line.endswith(".") for line in lines if "+" not in line)


def test_env_override_and_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROCOURSE_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m zerocourse.data"):
        load_corpus()
    write_corpus()  # into the override folder
    assert (tmp_path / CORPUS_FILE).exists()
    assert load_corpus() == SHIPPED.read_text(encoding="utf-8")
    with open(tmp_path / CORPUS_FILE, "a", encoding="utf-8") as f:
        f.write("x")
    with pytest.raises(RuntimeError, match="python -m zerocourse.data"):
        load_corpus()


def test_tokenizer_round_trip_and_stable_vocab():
    text = load_corpus()
    tok = CharTokenizer(text)
    assert tok.chars == sorted(set(text)) and tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.decode(torch.tensor(ids[:50])) == text[:50]
    assert tok.encode("\n") == [0]  # newline has the smallest code point
    assert CharTokenizer(text[::-1]).stoi == tok.stoi  # order does not depend on the text order
    assert load_tokenizer().stoi == tok.stoi
    with pytest.raises(ValueError, match="'@'"):
        tok.encode("a@b")


def test_load_dataset_splits():
    text = load_corpus()
    tok = CharTokenizer(text)
    train, val = load_dataset("train"), load_dataset("val")
    assert train.dtype == val.dtype == torch.long and train.dim() == val.dim() == 1
    assert len(train) == int(0.9 * len(text)) and len(train) + len(val) == len(text)
    assert tok.decode(train) + tok.decode(val) == text
    with pytest.raises(ValueError):
        load_dataset("test")


def test_get_batch_shapes_targets_and_determinism():
    d = torch.arange(1000)
    x, y = get_batch(d, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.long
    assert torch.equal(y, x + 1)  # on arange data, the target window is the input shifted by one
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long))
    x2, y2 = get_batch(d, 8, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = get_batch(d, 8, 16, torch.Generator().manual_seed(1))
    assert not torch.equal(x, x3)
    assert x.min() >= 0 and y.max() <= 999
    train = load_dataset("train")
    xt, yt = get_batch(train, 4, 32, torch.Generator().manual_seed(0))
    assert torch.equal(xt[:, 1:], yt[:, :-1])
    with pytest.raises(ValueError):
        get_batch(torch.arange(10), 2, 10)
