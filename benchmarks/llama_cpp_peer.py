"""llama.cpp through llama-cpp-python, as the benchmarks compare against it (not a dependency of mlxspec).

    llm = open_gguf(path, threads=2, n_ctx=4096)
    llm.reset(); llm.eval(ids); token = greedy_next(llm)

llama-cpp-python keeps no logits unless the model was opened with logits_all (its `scores` stay zero
otherwise), so the greedy token is read from llama.cpp's own last row (llama_get_logits_ith).
"""

from __future__ import annotations

from pathlib import Path


def open_gguf(path: Path, threads: int, n_ctx: int):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512,
                 n_ubatch=512, verbose=False)  # 512 rows a pass: llama.cpp's defaults


def greedy_next(llm) -> int:
    """The argmax of the logits of the last token llm.eval fed."""
    import llama_cpp
    import numpy as np

    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
    return int(row.argmax())
