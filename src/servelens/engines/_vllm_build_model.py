"""Build the tiny random-weight Llama model and its tokenizer (run by the vLLM venv's Python).

This file is executed as a script by :func:`servelens.engines.vllm_cpu.build_model` with the
interpreter of the vLLM venv, which has ``torch``, ``transformers`` and ``tokenizers``; it is not
imported by servelens itself. Recipe: /work/shared/real-engine.md ("A tiny model made locally").

Usage: ``python _vllm_build_model.py OUT_DIR TEXT_FILE [TEXT_FILE ...]``. Deterministic: the same
text files (in the given order) and seed give byte-identical tokenizer and weights.
"""

from __future__ import annotations

import json
import os
import sys

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
SEED = 20261129
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: _vllm_build_model.py OUT_DIR TEXT_FILE [TEXT_FILE ...]", file=sys.stderr)
        return 2
    out_dir, files = argv[0], argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)

    # Tokenizer: byte-level BPE, vocab 4096, trained on the given local text files.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    # Model: LlamaForCausalLM, hidden 128, intermediate 256, 2 layers, 2 heads of 64, tied, bf16.
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "servelens-model.json"), "w", encoding="utf-8") as fh:
        json.dump({"seed": SEED, "vocab_size": VOCAB_SIZE, "train_files": files}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
