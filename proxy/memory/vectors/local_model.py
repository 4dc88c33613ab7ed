"""The embedded embedding model: WordLlama's l2_supercat cut to 128 dimensions, run with numpy.

The weights (a 32,000 x 256 float16 token table, 16 MB) and the tokenizer file ship
inside the `wordllama` wheel; they are read from its installed folder and nothing is ever
downloaded. `wordllama`'s own loader is not used: version 0.4.0.post1 looks for the
tokenizer under a folder name its wheel does not use and then fetches it from a hub.

The table is Matryoshka-trained, so its first 128 dimensions are a model of their own:
they rank LoCoMo dev within 0.2 points of the full 256 (docs/retrieval.md), and half the
width halves the product each query costs against a user's vectors and the memory they
take. Those 128 columns are kept as float32 (16 MB, as the file's float16 table): a
text's rows are then summed as they are gathered, with no cast.

A text's vector is the mean of its tokens' rows (a static model: no attention, so one
query takes tens of microseconds): one gather and one sum, as few numpy calls as that
takes, because each costs microseconds of dispatch with the CPU's caches cold, as they
are in a server between requests. The package is MIT licensed; its l2_supercat table is
derived from Llama 2's token embeddings (docs/retrieval.md).
"""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from proxy.memory.vectors.embedder import EmbeddingFailed, encodable

# The dimensions are in the name: a store's vectors of another width (the former
# `local:wordllama-l2_supercat-256`) are then of another model, filled in again.
MODEL_NAME = "local:wordllama-l2_supercat-128"
DIMENSIONS = 128
WEIGHTS_FILE = "weights/l2_supercat_256.safetensors"
TOKENIZER_FILE = "tokenizers/l2_supercat_tokenizer_config.json"
TENSOR = "embedding.weight"
# Tokens past this many say little more about a text's mean and cost time on the loop.
MAX_TOKENS = 512
# A turn's question is embedded as the request's query, then again, a few milliseconds later,
# as the message its turn saves: the vectors of the texts embedded last are kept by their
# exact text, up to this many, the oldest dropped first (enough for the requests in flight of
# a busy process), and of texts up to this long (a question, rarely a paste).
RECENT_TEXTS = 256
RECENT_TEXT_CHARS = 2000


class ModelMissing(Exception):
    """The wordllama package, or one of its files, is not installed."""


def package_folder() -> Path:
    """The installed `wordllama` folder, found without importing the package (its import pulls pydantic)."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissing("the wordllama package is not installed (pip install wordllama)")
    return Path(next(iter(spec.submodule_search_locations)))


def read_table(path: Path) -> np.ndarray:
    """The token table of a safetensors file: its one float16 tensor, (vocabulary, dimensions)."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        entry = header[TENSOR]
        if entry["dtype"] != "F16" or len(entry["shape"]) != 2:
            raise ModelMissing(f"{path.name}: expected a 2-D float16 {TENSOR}, got {entry['dtype']} {entry['shape']}")
        start, end = entry["data_offsets"]
        f.seek(8 + header_len + start)
        data = f.read(end - start)
    return np.frombuffer(data, dtype="<f2").reshape(entry["shape"])


class LocalModel:
    """Texts in, float32 little-endian vectors out; the async `Embed` shape the app calls."""

    model = MODEL_NAME
    in_process = True

    def __init__(self, folder: Path | None = None) -> None:
        folder = folder if folder is not None else package_folder()
        try:
            self.table = np.ascontiguousarray(read_table(folder / WEIGHTS_FILE)[:, :DIMENSIONS], dtype=np.float32)
            self.tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        except (OSError, KeyError, ValueError) as exc:
            raise ModelMissing(f"the embedded model's files could not be read from {folder}: {exc}") from exc
        if self.tokenizer.get_vocab_size(with_added_tokens=True) > self.table.shape[0]:
            # Every id the tokenizer gives must name a row: the sums index the table unchecked.
            raise ModelMissing(f"the embedded model's tokenizer knows more tokens than its table has rows ({folder})")
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        # Text -> its vector, oldest first (RECENT_TEXTS). Not locked: a model is one app's, called on
        # its event loop's thread only.
        self._recent: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32: each text's mean token row; zeros for a text with no token."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Each text is encoded on this thread: encode_batch hands them to the tokenizer's
        # thread pool, whose threads then spin waiting for more (a commit's two texts cost
        # 0.27 ms of CPU that way, 0.1 ms here), and a batch gains nothing in a server whose
        # other core serves requests.
        recent = self._recent
        for row, text in enumerate(texts):
            known = recent.get(text)
            if known is not None:
                out[row] = known
                continue
            ids = self.tokenizer.encode(encodable(text), add_special_tokens=False).ids
            if ids:
                # The rows' float32 sum, row after row, over their count: what numpy's mean computes.
                np.add.reduce(self.table[ids], axis=0, out=out[row])
                out[row] /= len(ids)
            if len(text) <= RECENT_TEXT_CHARS:
                recent[text] = out[row].copy()
                if len(recent) > RECENT_TEXTS:
                    del recent[next(iter(recent))]
        return out

    async def __call__(self, texts: Sequence[str], timeout_s: float) -> list[bytes]:
        """The Embed call: computed in-process, so the timeout never binds."""
        try:
            return [row.astype("<f4").tobytes() for row in self.vectors(texts)]
        except Exception as exc:  # a tokenizer error must leave the lexical stream standing
            raise EmbeddingFailed(f"the embedded model failed: {type(exc).__name__}: {exc}", retry=False) from None
