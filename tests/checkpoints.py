"""Small checkpoints built inside the tests (no hub): tiny random Llama/Qwen3 saved in BF16."""

import os

import torch


def tiny_llama(path, seed=0, max_shard_size=None, layers=2, hidden=128, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return path


def read_tensors(folder):
    """Every tensor of every safetensors file in `folder`, by name."""
    from safetensors import safe_open

    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as g:
                out.update({k: g.get_tensor(k) for k in g.keys()})
    return out
