"""The capstone's dataset: a small, generated, character-level text corpus.

Nothing is downloaded. The corpus is produced by a seeded toy grammar (short English-like
sentences) mixed with two-digit additions ("17+25=42."), written once to data/tiny_corpus.txt
and shipped with the course. Its SHA-256 is recorded below, so a corrupted or edited file is
caught instead of silently changing everyone's results. To rebuild it:

    python -m zerocourse.data            # writes data/tiny_corpus.txt (or into $ZEROCOURSE_DATA_DIR)

A TinyGPT trained on it for a few hundred steps on a laptop CPU already samples real words,
sentence shapes and well-formed sums, which makes learning visible.

    load_corpus() -> str                           the verified text
    CharTokenizer(text)                            .encode(str) -> list[int], .decode(ids) -> str
    load_tokenizer() -> CharTokenizer              the tokenizer of the whole corpus
    load_dataset(split="train") -> LongTensor      (N,) token ids: first 90% train, last 10% val
    get_batch(data, batch_size, block_size, generator=None) -> (x, y)   each (B, block_size)
    data_dir() -> Path                             $ZEROCOURSE_DATA_DIR, else <repo root>/data
"""
import argparse
import hashlib
import os
from pathlib import Path

import torch

CORPUS_FILE = "tiny_corpus.txt"
CORPUS_SHA256 = "3750e450a0862ab5e8d371b51ccbfeb8ff5fb0d9a63e260bcdd951ecf2bf1bcc"
CORPUS_SEED = 1910  # ZeRO is arXiv 1910.02054
CORPUS_CHARS = 200_000
TRAIN_FRACTION = 0.9


def data_dir():
    """Folder of the shipped data: $ZEROCOURSE_DATA_DIR if set, else data/ next to zerocourse/."""
    override = os.environ.get("ZEROCOURSE_DATA_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "data"


# -----------------------------------------------------------------------------
# generation


class _SplitMix64:
    """A tiny, fully specified random generator: the corpus must be identical on every Python.

    (Python's random module only promises a stable random(); choice() and friends may change.)
    """

    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def choice(self, options):
        return options[self.below(len(options))]


NOUNS = ["cat", "dog", "bird", "fox", "girl", "boy", "king", "queen", "robot", "teacher", "baker", "horse"]
ADJECTIVES = ["small", "big", "old", "young", "red", "blue", "happy", "sleepy", "clever", "brave"]
TRANSITIVE = ["sees", "likes", "finds", "follows", "helps", "chases", "draws", "calls", "meets"]
INTRANSITIVE = ["sleeps", "sings", "runs", "waits", "laughs", "dances", "reads", "swims"]
PLACES = ["in the garden", "near the river", "at school", "on the hill", "under the tree",
          "in the house", "by the sea"]
TIMES = ["today", "at night", "every morning", "in winter", "after lunch"]


def _noun_phrase(rng):
    det = rng.choice(["the", "a"])
    words = [rng.choice(ADJECTIVES), rng.choice(NOUNS)] if rng.below(2) else [rng.choice(NOUNS)]
    if det == "a" and words[0][0] in "aeiou":
        det = "an"  # a pattern the model can pick up: "an old fox", "a young fox"
    return " ".join([det] + words)


def _sentence(rng):
    subject = _noun_phrase(rng)
    form = rng.below(4)
    if form == 0:    # the small cat sees a bird near the river.
        s = f"{subject} {rng.choice(TRANSITIVE)} {_noun_phrase(rng)} {rng.choice(PLACES)}"
    elif form == 1:  # a dog chases the old fox.
        s = f"{subject} {rng.choice(TRANSITIVE)} {_noun_phrase(rng)}"
    elif form == 2:  # the queen sings at night.
        s = f"{subject} {rng.choice(INTRANSITIVE)} {rng.choice(PLACES + TIMES)}"
    else:            # a robot helps the king and laughs.
        s = f"{subject} {rng.choice(TRANSITIVE)} {_noun_phrase(rng)} and {rng.choice(INTRANSITIVE)}"
    return s[0].upper() + s[1:] + "."


def _addition(rng):
    a, b = rng.below(100), rng.below(100)
    return f"{a}+{b}={a + b}."


def generate_corpus(seed=CORPUS_SEED, num_chars=CORPUS_CHARS):
    """The corpus text: lines of sentences, one line in four an addition.

    Args:
        seed: generator seed; the shipped file uses CORPUS_SEED.
        num_chars: stop after the first line that reaches this many characters.
    """
    rng = _SplitMix64(seed)
    lines, size = [], 0
    while size < num_chars:
        line = _addition(rng) if rng.below(4) == 0 else _sentence(rng)
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def write_corpus(folder=None):
    """Generate the corpus and write it to folder (default data_dir()); returns the file's path."""
    folder = Path(folder) if folder is not None else data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CORPUS_FILE
    # newline="\n": the same bytes (and checksum) on Windows.
    path.write_text(generate_corpus(), encoding="utf-8", newline="\n")
    return path


# -----------------------------------------------------------------------------
# loading


def load_corpus():
    """The shipped corpus text, after checking its SHA-256."""
    path = data_dir() / CORPUS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"Corpus file {path} not found. Regenerate it with `python -m zerocourse.data`, "
            f"or point ZEROCOURSE_DATA_DIR to the folder that holds {CORPUS_FILE}.")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != CORPUS_SHA256:
        raise RuntimeError(
            f"Corpus file {path} has SHA-256 {digest}, expected {CORPUS_SHA256}: it was modified or "
            f"damaged. Regenerate it with `python -m zerocourse.data`.")
    return raw.decode("utf-8")


class CharTokenizer:
    """One token per character; the vocabulary is the text's characters in code point order.

    Args:
        text: the text whose characters form the vocabulary.
    """

    def __init__(self, text):
        self.chars = sorted(set(text))          # sorted: the same ids on every run
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.itos = dict(enumerate(self.chars))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        """str -> list of token ids; ValueError for a character outside the vocabulary."""
        try:
            return [self.stoi[c] for c in s]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary "
                             f"({self.vocab_size} characters)") from None

    def decode(self, ids):
        """list (or 1-D tensor) of token ids -> str."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.itos[i] for i in ids)


def load_tokenizer():
    """The CharTokenizer of the whole shipped corpus (train and val share it)."""
    return CharTokenizer(load_corpus())


def load_dataset(split="train"):
    """The corpus as token ids: the first 90% for "train", the rest for "val".

    Returns:
        (N,) int64 tensor.
    """
    if split not in ("train", "val"):
        raise ValueError(f'split must be "train" or "val", got {split!r}')
    text = load_corpus()
    # The dataset stays on the host (as a data loader's does); get_batch moves batches.
    data = torch.tensor(CharTokenizer(text).encode(text), dtype=torch.long, device="cpu")  # (N,)
    n = int(TRAIN_FRACTION * len(data))
    return data[:n].clone() if split == "train" else data[n:].clone()


def get_batch(data, batch_size, block_size, generator=None, device=None):
    """Random windows of the data, and the same windows shifted by one token as targets.

    Args:
        data: (N,) int64 token ids, N > block_size.
        batch_size: number of windows B.
        block_size: window length.
        generator: optional torch.Generator; the same generator state gives the same batch.
        device: where the batch goes (default: where a tensor created without a device lands).

    Returns:
        (x, y): two (B, block_size) int64 tensors, y[b, t] = data[start_b + t + 1].
    """
    if len(data) <= block_size:
        raise ValueError(f"data has {len(data)} tokens, need more than block_size={block_size}")
    target = torch.device(device) if device is not None else torch.empty(0).device
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator,
                       device="cpu")                                               # (B,)
    x = torch.stack([data[i:i + block_size] for i in ix.tolist()])                 # (B, block)
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])         # (B, block)
    return x.to(target), y.to(target)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Regenerate the course's text corpus.")
    parser.add_argument("--out", default=None, help="folder to write into (default: data_dir())")
    path = write_corpus(parser.parse_args().out)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    status = "matches" if digest == CORPUS_SHA256 else "DIFFERS FROM"
    print(f"wrote {path} ({path.stat().st_size} bytes), sha256 {digest} {status} CORPUS_SHA256")
