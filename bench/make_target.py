"""Build a random-weight Qwen3 target of a chosen size around an existing tokenizer.

    python bench/make_target.py --tokenizer-from ~/.cache/dflash-pipeline/tiny-v1/target \
        --hidden 2048 --layers 24 --out /tmp/qwen3-mid

For throughput runs on a GPU machine that cannot download weights: the architecture and the
loading path are real (save_pretrained, then AutoModelForCausalLM.from_pretrained).
"""

import argparse

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer-from", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=6144)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_from)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=args.hidden,
                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      head_dim=args.head_dim, max_position_embeddings=4096,
                      rope_theta=1e6, tie_word_embeddings=False,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved a random Qwen3 with {n / 1e9:.2f}B parameters to {args.out}")


if __name__ == "__main__":
    main()
