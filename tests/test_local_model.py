"""The embedded model (proxy/memory/vectors/local_model.py): read from the installed wheel, never fetched."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from proxy.memory.vectors.local_model import (
    MODEL_NAME, RECENT_TEXT_CHARS, RECENT_TEXTS, WEIGHTS_FILE, LocalModel, package_folder, read_table,
)

# Every way out to the network raises and is recorded; then the script's body runs.
BLOCKED = """
import json, socket, sys
tried = []
def blocked(*args, **kwargs):
    tried.append(repr(args[:2]))
    raise OSError("network blocked by the test")
socket.socket.connect = blocked
socket.socket.connect_ex = blocked
socket.getaddrinfo = blocked
socket.create_connection = blocked
"""

LOAD_AND_EMBED = BLOCKED + """
import asyncio
from proxy.memory.vectors.local_model import LocalModel
model = LocalModel()
vectors = asyncio.run(model(["I keep my notes in plain text files.", "What is my dog called?"], 1.0))
print(json.dumps({"tried": tried, "lengths": [len(v) for v in vectors],
                  "hub": sorted(m for m in sys.modules if m.split(".")[0] in ("huggingface_hub", "requests", "wordllama"))}))
"""

WORDLLAMA_OWN_LOADER = BLOCKED + """
from wordllama import WordLlama
try:
    WordLlama.load()
except Exception as exc:
    pass
print(json.dumps({"tried": tried}))
"""


def _run(script: str, home: Path) -> dict[str, object]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "HF_HOME": str(home / "hf")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_model_loads_and_embeds_with_the_network_blocked_and_fetches_nothing(tmp_path: Path) -> None:
    out = _run(LOAD_AND_EMBED, tmp_path)
    assert out == {"tried": [], "lengths": [128 * 4, 128 * 4], "hub": []}
    assert not any(tmp_path.rglob("*")), "nothing is cached under HOME"


def test_the_block_is_real_wordllamas_own_loader_tries_to_download_under_it(tmp_path: Path) -> None:
    out = _run(WORDLLAMA_OWN_LOADER, tmp_path)
    assert out["tried"], "wordllama 0.4.0.post1's load() reaches for the network; the block must catch it"


def _cosine(model: LocalModel, a: str, b: str) -> float:
    va, vb = model.vectors([a, b])
    return float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))


def test_vectors_are_the_mean_of_the_token_rows_and_a_paraphrase_is_nearer_than_an_unrelated_text() -> None:
    model = LocalModel()
    text = "My dog is called Rex"
    ids = model.tokenizer.encode(text, add_special_tokens=False).ids
    (vector,) = model.vectors([text])
    assert np.allclose(vector, model.table[ids].astype(np.float32).mean(axis=0))
    assert np.array_equal(model.vectors([text, "x"])[0], vector)  # a batch gives what a single text does
    assert _cosine(model, text, "what's the name of my pet") > 0.3 > _cosine(model, text, "how do I configure nginx")
    (raw,) = asyncio.run(model([text], 1.0))
    assert np.frombuffer(raw, dtype="<f4").tolist() == vector.tolist()
    assert MODEL_NAME == "local:wordllama-l2_supercat-128"


TEXTS = ["My dog is called Rex", "x", "   ", "What did Caroline say about the adoption agency last week?",
         "request 17: remind me what database we picked for the billing service",
         "naïve café, 日本語 🐝 \u00a0tabs\tand\nlines",
         "bees " * 700,  # past the 512 tokens kept
         *(" ".join(f"word{n * k % 97} thing{k}" for k in range(n)) for n in range(1, 40))]


def test_each_vector_is_bit_for_bit_the_first_128_dimensions_of_the_full_tables_mean() -> None:
    # What the 256-wide model computed (numpy's mean of the float16 rows cast to float32),
    # cut to its first 128 dimensions: the cut and the faster sum change no bit of a vector.
    model = LocalModel()
    full = read_table(package_folder() / WEIGHTS_FILE)
    assert full.shape == (32000, 256) and model.table.shape == (32000, 128)

    def reference(text: str) -> np.ndarray:
        ids = np.asarray(model.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return full[ids].astype(np.float32).mean(axis=0)[:128] if ids.size else np.zeros(128, dtype=np.float32)

    batch = model.vectors(TEXTS)
    for n, text in enumerate(TEXTS):
        assert np.array_equal(model.vectors([text])[0], reference(text)), text
        assert np.array_equal(batch[n], reference(text)), text


def test_an_empty_text_gives_a_zero_vector_not_an_error() -> None:
    model = LocalModel()
    assert not model.vectors([""]).any()
    assert model.vectors([]).shape == (0, 128)


class _Encodings:
    """The model's tokenizer, recording each text it is asked to encode."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.texts: list[str] = []

    def encode(self, text: str, **options: Any) -> Any:
        self.texts.append(text)
        return self.tokenizer.encode(text, **options)


def test_a_text_embedded_again_soon_is_not_encoded_again_and_gets_the_same_vector() -> None:
    model = LocalModel()
    encodings = _Encodings(model.tokenizer)
    model.tokenizer = encodings  # type: ignore[assignment]
    question = "request 3: which tools do I prefer for my projects?"
    (as_query,) = model.vectors([question])
    as_saved, answer = model.vectors([question, "Postgres and vim, you said."])
    assert encodings.texts == [question, "Postgres and vim, you said."]
    assert np.array_equal(as_saved, as_query) and not np.shares_memory(as_saved, as_query)
    # Only the same text: a question said with another space is another text.
    model.vectors([question + " "])
    assert encodings.texts[-1] == question + " "
    # The last RECENT_TEXTS texts are kept, the oldest dropped first; a long text is not kept.
    model.vectors([f"text {n}" for n in range(RECENT_TEXTS)])
    long = "bees " * (RECENT_TEXT_CHARS // 5 + 1)
    model.vectors([question, "text 5", long, long])
    assert encodings.texts[-3:] == [question, long, long]
    assert np.array_equal(model.vectors([question])[0], as_query)
