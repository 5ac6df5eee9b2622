"""Activation outliers of the trained tiny models (docs/benchmarks.md, "Why W2A4").

For every linear layer's input (LM head excluded): the largest channel's max|x| over the median
channel's max|x|, on the first 32 calibration texts. Real LLMs reach 100-1000x at a few layers
("massive activations"); per-token 4-bit activations lose little without them.

    PYTHONPATH=. python benchmarks/tiny_outliers.py [resources/models] [resources/data/calib.jsonl]
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def channel_ratios(model_dir: str, texts: list[str]) -> dict[str, float]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ratios: dict[str, float] = {}

    def hook(name):
        def fn(mod, inp, out):
            amax = inp[0].detach().reshape(-1, inp[0].shape[-1]).abs().amax(0)
            ratios[name] = max(ratios.get(name, 0.0), float(amax.max() / amax.median()))
        return fn

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            mod.register_forward_hook(hook(name))
    batch = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=40)
    with torch.no_grad():
        model(**batch)
    return ratios


def main(models_dir: str = "resources/models", calib: str = "resources/data/calib.jsonl"):
    torch.set_num_threads(1)
    texts = [json.loads(line)["text"] for line in open(calib)][:32]
    for name in ("tiny-llada", "tiny-dream"):
        r = channel_ratios(f"{models_dir}/{name}", texts)
        top = sorted(r.items(), key=lambda kv: -kv[1])[:3]
        med = sorted(r.values())[len(r) // 2]
        print(json.dumps({"model": name, "median_over_layers": round(med, 2),
                          "top": [[k, round(v, 2)] for k, v in top]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
