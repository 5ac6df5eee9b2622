"""Train an embedded tiny diffusion LM on the synthetic corpus.

Two family styles, both plain transformers classes with bidirectional attention
(``is_causal=False``) and an untied LM head:

* ``tiny-llada``: ``LlamaForCausalLM`` without biases; the logits at position ``i`` predict
  token ``i`` (no shift).
* ``tiny-dream``: ``Qwen2ForCausalLM`` (q/k/v projections carry a bias); trained so that the
  logits at ``i-1`` predict token ``i``, exactly the alignment ``LoadedModel.logits`` undoes.

Objective (masked diffusion): per sequence draw ``t ~ U(eps, 1)`` (stratified over the batch),
mask each maskable token independently with probability ``t`` and minimise the masked-token
cross-entropy, averaged over sequences: ``loss_norm="elbo"`` is the LLaDA/MDLM bound
``sum_masked CE / t / n_maskable``; the default ``"masked_mean"`` (``sum_masked CE / n_masked``)
has the same expectation at each ``t`` without the ``1/t`` weight, whose variance at small ``t``
dominates a short small-batch CPU run. Position 0 (``[BOS]``) is never
masked. Every document is followed by a random number of ``[EOS]`` tokens that are part of the
sequence and of the loss (LLaDA-style end padding), so a fixed-length generation window ends in
``[EOS]``: a share ``long_frac`` of batches fills rows to ``seq_len`` with ``[EOS]`` (the shape of
prompt + generation window), the rest use short tails and are trimmed to their longest row. The
remainder of a row is ``[PAD]`` with attention mask 0 and no loss. For
question-answer documents a share ``sft_frac`` of rows masks only the answer and its ``[EOS]``
tail (the SFT form of the same objective).

With ``tie_train`` (default) the LM head shares the embedding matrix during training, which
teaches copying numbers from the question much faster at this scale; the saved model has an
untied head (initialised to the trained shared matrix), like the real checkpoints.

The result is a Hugging Face folder (``save_pretrained`` + tokenizer) plus ``fair_calib.json``
and ``train_log.parquet``; it is written under a temporary name and renamed into place.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from fair_calib.jobs import io, numerics
from fair_calib.models.tiny.defaults import DEFAULT_TRAIN
from fair_calib.models.tiny.tokenizer import BOS, EOS, MASK, PAD, build_tokenizer

FAMILIES = {
    # family -> (architecture, logit_shift)
    "tiny-llada": ("llama", False),
    "tiny-dream": ("qwen2", True),
}


def _log_schema():
    import pyarrow as pa
    return pa.schema([("step", pa.int64()), ("loss", pa.float64()), ("lr", pa.float64()),
                      ("seconds", pa.float64())])


def model_max_positions(train: Mapping[str, Any]) -> int:
    """The tiny model's context: twice its training length, at least 256."""
    return max(256, 2 * int(train["seq_len"]))


def build_model(family: str, vocab_size: int, train: dict, special_ids: dict[str, int],
                tied: bool = False):
    """A freshly initialised bidirectional Llama / Qwen2 model for ``family``.

    ``tied=True`` shares the LM head with the embedding (used only during training, see
    :func:`untie`); the saved models always have an untied head."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch, _ = FAMILIES[family]
    hidden, heads = int(train["hidden"]), int(train["heads"])
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=int(train["intermediate"]),
        num_hidden_layers=int(train["layers"]), num_attention_heads=heads,
        num_key_value_heads=heads, max_position_embeddings=model_max_positions(train),
        rms_norm_eps=1e-5, tie_word_embeddings=tied, use_cache=False, is_causal=False,
        pad_token_id=special_ids[PAD], bos_token_id=special_ids[BOS],
        eos_token_id=special_ids[EOS], initializer_range=0.02,
    )
    if arch == "llama":
        cfg = LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(use_sliding_window=False, **common)
        model = Qwen2ForCausalLM(cfg)
    return model


def untie(model, family: str, vocab_size: int, train: dict, special_ids: dict[str, int]):
    """A copy of ``model`` with an untied LM head (initialised to the shared matrix)."""
    if not model.config.tie_word_embeddings:
        return model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone()
    fresh = build_model(family, vocab_size, train, special_ids, tied=False)
    fresh.load_state_dict(state, strict=True)
    return fresh.to(next(model.parameters()).dtype)


def aligned_logits(logits: torch.Tensor, shift: bool) -> torch.Tensor:
    """Same alignment as ``LoadedModel.logits``: result ``[:, i]`` predicts token ``i``."""
    if shift:
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


class Batcher:
    """Turns tokenized documents into padded training rows with their maskable positions."""

    def __init__(self, docs: list[list[int]], answer_starts: list[int], seq_len: int,
                 ids: dict[str, int], train: dict, seed: int):
        self.docs, self.answer_starts = docs, answer_starts
        self.seq_len, self.ids, self.train = seq_len, ids, train
        self.rng = random.Random(f"batches-{seed}")
        self.order: list[int] = []

    def _next_index(self) -> int:
        if not self.order:
            self.order = list(range(len(self.docs)))
            self.rng.shuffle(self.order)
        return self.order.pop()

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch. A share ``long_frac`` of batches pads every row with ``[EOS]`` up to
        ``seq_len`` (the shape of a prompt plus a fixed generation window); the others give each
        row a short ``[EOS]`` tail (1..``short_tail``) and are trimmed to their longest row, which
        keeps most steps short and the loss focused on the documents."""
        L = self.seq_len
        pad, eos = self.ids[PAD], self.ids[EOS]
        long_batch = self.rng.random() < self.train["long_frac"]
        rows: list[tuple[list[int], int]] = []
        for _ in range(batch_size):
            j = self._next_index()
            doc, ans = self.docs[j], self.answer_starts[j]
            if self.rng.random() < self.train["no_bos_frac"] and len(doc) > 2:
                doc, ans = doc[1:], (max(ans - 1, 1) if ans >= 0 else ans)
            doc = doc[: L - 1]
            room = L - len(doc)
            if self.rng.random() < self.train["no_eos_frac"]:
                n_eos = 0
            elif long_batch:
                n_eos = self.rng.randint(max(1, room // 2), room)
            else:
                n_eos = self.rng.randint(1, min(room, int(self.train["short_tail"])))
            start = 1
            if 0 <= ans < len(doc) and self.rng.random() < self.train["sft_frac"]:
                start = ans
            rows.append((doc + [eos] * n_eos, start))
        width = max(len(r) for r, _ in rows)
        input_ids = torch.full((batch_size, width), pad, dtype=torch.long)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        maskable = torch.zeros((batch_size, width), dtype=torch.bool)
        for r, (row, start) in enumerate(rows):
            input_ids[r, : len(row)] = torch.tensor(row)
            attn[r, : len(row)] = 1
            maskable[r, start: len(row)] = True
        return input_ids, attn, maskable


def _answer_start(ids: list[int], answer_id: int, colon_id: int | None) -> int:
    """Index of the first answer token after ``Answer :``; -1 when the doc has none."""
    for i in range(len(ids) - 1):
        if ids[i] == answer_id and (colon_id is None or ids[i + 1] == colon_id):
            return i + 2
    return -1


def lr_at(step: int, total: int, base: float, warmup_frac: float, min_ratio: float) -> float:
    warm = max(1, int(round(warmup_frac * total)))
    if step < warm:
        return base * (step + 1) / warm
    prog = (step - warm) / max(1, total - warm)
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(prog, 1.0))))


def diffusion_loss(model, input_ids, attn, maskable, mask_id: int, shift: bool, eps: float,
                   generator: torch.Generator, norm: str = "elbo",
                   t_power: float = 1.0) -> torch.Tensor:
    """Masked-diffusion loss averaged over rows.

    ``norm="elbo"``: ``sum_masked CE / t / n_maskable`` (the LLaDA / MDLM bound);
    ``norm="masked_mean"``: ``sum_masked CE / n_masked``, the same quantity in expectation over
    the masking at a given ``t`` but without the ``1/t`` weight, whose variance at small ``t``
    dominates a short small-batch run. ``t = s ** t_power`` with ``s`` stratified uniform:
    ``t_power > 1`` draws more lightly-masked rows, where most of the answer is visible and the
    model learns to copy and look up facts (with ``"masked_mean"`` this only reweights noise
    levels; with ``"elbo"`` keep ``t_power=1``).
    """
    B, L = input_ids.shape
    u = torch.rand((), generator=generator)
    s = (u + torch.arange(B, dtype=torch.float32) / B) % 1.0  # stratified uniform
    t = s ** t_power * (1 - eps) + eps
    # The masking is drawn on the CPU generator on every device, so a card trains on the same
    # masks as the CPU (and the CPU's recorded models keep their bits).
    masked = (torch.rand((B, L), generator=generator) < t[:, None]).to(maskable.device) & maskable
    t = t.to(maskable.device)
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    out = model(input_ids=noisy, attention_mask=attn)
    logits = aligned_logits(out.logits, shift).float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * L, -1), input_ids.reshape(-1),
                                           reduction="none").view(B, L)
    if norm == "elbo":
        per_row = (ce * masked).sum(1) / t / maskable.sum(1).clamp(min=1)
    elif norm == "masked_mean":
        per_row = (ce * masked).sum(1) / masked.sum(1).clamp(min=1)
    else:
        raise ValueError(f"unknown loss_norm {norm!r}; use 'elbo' or 'masked_mean'")
    return per_row.mean()


def _train_loop(model, opt, batcher, bar, train: dict, ids: dict, shift: bool, gen,
                device) -> list[dict]:
    """The optimisation steps of ``bar``; a record per step (loss, lr, seconds so far)."""
    log, t0 = [], time.perf_counter()
    steps, bs = int(train["steps"]), int(train["batch_size"])
    for step in bar:
        lr = lr_at(step, steps, float(train["lr"]), float(train["warmup"]),
                   float(train["min_lr_ratio"]))
        for g in opt.param_groups:
            g["lr"] = lr
        x, attn, maskable = batcher.batch(bs)
        loss = diffusion_loss(model, x.to(device), attn.to(device), maskable.to(device),
                              ids[MASK], shift, float(train["eps"]), gen,
                              norm=str(train["loss_norm"]), t_power=float(train["t_power"]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if train["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(train["grad_clip"]))
        opt.step()
        val = float(loss.detach())
        if not math.isfinite(val):
            raise FloatingPointError(f"train-tiny: loss became {val} at step {step}")
        log.append({"step": step, "loss": val, "lr": lr, "seconds": time.perf_counter() - t0})
        if step % 20 == 0:
            bar.set_postfix(loss=f"{val:.3f}")
    return log


def train_tiny(settings: dict, data_dir: Path, out_dir: Path, progress: bool = True) -> dict:
    """Train one tiny model from ``data_dir/train.txt`` and save it as an HF folder at ``out_dir``."""
    from tqdm import tqdm

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    seed = int(settings.get("seed", 0))
    mcfg = settings["model"]
    family = mcfg.get("family", mcfg.get("name"))
    if family not in FAMILIES:
        raise ValueError(f"train-tiny: unknown tiny family {family!r}; known {sorted(FAMILIES)}")
    _, shift = FAMILIES[family]
    train = {**DEFAULT_TRAIN, **(mcfg.get("train") or {})}
    device = settings.get("device", "cpu")
    # `train.dtype`: a model trained in float32 and evaluated in the config's bfloat16 (the
    # GPU-width models, config/gpu_trained.yaml); default the config's dtype
    dtype = getattr(torch, train.pop("dtype", None) or settings.get("dtype", "float32"))
    # `train.matmul: tf32`: a card's float32 matmuls on TF32 tensor cores (a 1,024-wide model
    # trains several times faster; weights and optimiser stay float32); no effect on a CPU
    tf32 = train.pop("matmul", "highest") == "tf32"
    if train.get("threads"):
        torch.set_num_threads(int(train["threads"]))

    random.seed(seed)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)

    tokenizer = build_tokenizer(data_dir / "train.txt")
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in (PAD, MASK, EOS, BOS)}
    lines = [ln for ln in (data_dir / "train.txt").read_text().splitlines() if ln.strip()]
    docs = tokenizer(lines, add_special_tokens=True)["input_ids"]
    answer_id = tokenizer.convert_tokens_to_ids("Answer")
    colon_id = tokenizer.convert_tokens_to_ids(":")
    answer_starts = [_answer_start(d, answer_id, colon_id) for d in docs]
    seq_len = int(train["seq_len"])
    batcher = Batcher(docs, answer_starts, seq_len, ids, train, seed)

    # Training with a tied head teaches copying much faster at this scale; the saved model has
    # an untied head like the real checkpoints.
    model = build_model(family, len(tokenizer), train, ids, tied=bool(train["tie_train"]))
    model = model.to(device=device, dtype=dtype)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(train["weight_decay"])},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(train["lr"]), betas=(0.9, 0.98), eps=1e-8)

    steps = int(train["steps"])
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=f"train {mcfg.get('name', family)}", disable=not progress,
               mininterval=5.0)
    was_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with numerics.deterministic_attention(device):
            log = _train_loop(model, opt, batcher, bar, train, ids, shift, gen, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was_tf32
    seconds = time.perf_counter() - t0
    model = untie(model, family, len(tokenizer), train, ids).to(device)
    model.eval()

    n_params = sum(p.numel() for p in model.parameters())
    tail = [r["loss"] for r in log[-max(1, steps // 10):]]
    summary = {
        "family": family, "name": mcfg.get("name", family), "logit_shift": shift,
        "architecture": type(model).__name__, "n_params": n_params, "vocab_size": len(tokenizer),
        "steps": steps, "train_seconds": seconds, "final_loss": sum(tail) / len(tail),
        "train": train, "mask_token": MASK, "mask_id": ids[MASK],
    }
    prov = io.provenance({"model": mcfg, "train": train}, seed=seed, numerics=numerics.describe())
    from fair_calib.models.finite import check_finite_weights

    check_finite_weights(model, f"{out_dir} (trained)", "training diverged and nothing was "
                         "written; lower train.lr or train.grad_clip")
    with io.atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # the weights' fingerprint: docs/benchmarks.md and .ci/run compare it across machines
        summary["model_sha256"] = io.file_sha256(tmp / "model.safetensors")
        io.write_json(tmp / "fair_calib.json", {**summary, "provenance": prov})
        import pandas as pd
        io.write_parquet(pd.DataFrame(log), tmp / "train_log.parquet", _log_schema(), prov)
    return summary


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib train-tiny",
                                 description="train an embedded tiny diffusion LM")
    ap.add_argument("--settings", required=True,
                    help='JSON: {seed, device, dtype, model: {name, family, train: {...}}}')
    ap.add_argument("--data", required=True, help="folder written by make-data")
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    # a process of its own (the pipeline's job): deterministic kernels, oneDNN off; in-process
    # callers (tests) keep their torch settings
    numerics.pin_torch(torch)
    summary = train_tiny(json.loads(args.settings), Path(args.data), Path(args.out),
                         progress=not args.no_progress)
    print(json.dumps({k: summary[k] for k in ("name", "family", "n_params", "steps",
                                              "train_seconds", "final_loss", "model_sha256")}))
