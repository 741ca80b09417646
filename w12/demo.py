"""The README's demo, last step: the same chat prompts answered by the BF16 checkpoint and by its W12
conversion, loaded through a stock Transformers `from_pretrained` after `w12.patch_transformers()`.

    python -m w12.demo BF16_DIR W12_DIR [--max-new-tokens 32]

Prints both answers and whether the generated token ids are identical (greedy decoding, CPU).
"""

import argparse
import sys
import time

PROMPTS = ["What is the capital of France?", "Write a Python function that returns the square of a number.",
           "Name three primary colors."]


def answer(model, tok, text: str, max_new_tokens: int) -> tuple[list[int], str]:
    import torch

    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[1]:]
    return out.tolist(), tok.decode(out, skip_special_tokens=True).strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bf16_dir", help="the BF16 checkpoint folder (config, tokenizer, safetensors)")
    ap.add_argument("w12_dir", help="its W12 conversion (`w12 convert BF16_DIR W12_DIR`)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import w12
    from w12.runtime.w12_linear import set_cpu_decode_cache

    torch.set_num_threads(1)
    w12.patch_transformers()
    set_cpu_decode_cache(1 << 30)  # decode each W12 layer once (exactly) instead of on every token
    tok = AutoTokenizer.from_pretrained(args.bf16_dir)
    models = {"BF16": AutoModelForCausalLM.from_pretrained(args.bf16_dir).eval(),
              "W12": AutoModelForCausalLM.from_pretrained(args.w12_dir).eval()}
    n_w12 = sum(type(m).__name__ == "W12Linear" for m in models["W12"].modules())
    print(f"W12 model: {n_w12} W12Linear layers")
    same = True
    for text in PROMPTS:
        print(f"\n> {text}")
        got = {}
        for name, model in models.items():
            t = time.perf_counter()
            got[name] = answer(model, tok, text, args.max_new_tokens)
            print(f"  {name:4} ({time.perf_counter() - t:4.1f} s): {got[name][1]!r}")
        equal = got["BF16"][0] == got["W12"][0]
        same &= equal
        print(f"  token ids identical: {equal}")
    print("\nall answers identical" if same else "\nANSWERS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
