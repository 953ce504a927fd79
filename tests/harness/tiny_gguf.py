"""Write a tiny random-weights llama GGUF for the real llama.cpp checks (``make release-check-llamacpp``).

With the ``gguf`` package (the ``gguf-py`` that the llama-cpp-python sdist vendors, or PyPI's) and numpy:
arch ``llama``, hidden 64, 2 layers, 4 heads, context 512, f32, and the tokenizer (GPT-2 style byte-level BPE)
of the tests' tiny model (``~/.cache/inferwatch/tiny-llm/tokenizer.json``). Under a second;
../shared/reference/engines.md §1 has the recipe it follows.

    python tests/harness/tiny_gguf.py TOKENIZER_JSON OUT.gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, FF, CONTEXT = 64, 2, 4, 128, 512


def write(tokenizer_json: Path, out: Path, seed: int = 7) -> None:
    """Write the GGUF to ``out``."""
    import gguf

    model = json.loads(tokenizer_json.read_text())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in vocab]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("inferwatch-tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i < 3 else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", len(tokens), HIDDEN)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    tensor("output.weight", len(tokens), HIDDEN)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"{prefix}.{part}.weight", HIDDEN, HIDDEN)
        tensor(f"{prefix}.ffn_gate.weight", FF, HIDDEN)
        tensor(f"{prefix}.ffn_up.weight", FF, HIDDEN)
        tensor(f"{prefix}.ffn_down.weight", HIDDEN, FF)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    write(Path(sys.argv[1]), Path(sys.argv[2]))
