"""Stage I: full-precision teacher probing with random commits.

For each probing prompt the FP teacher decodes a ``K``-token window over ``T`` steps (default
policy ``random_commit``: per-step commit counts by the block rule over the whole window,
positions uniformly at random among masked, tokens by argmax at temperature 0). Per sample and
window position we record

* ``commit_step`` -- the step ``t`` (``T`` = first, fully masked; ``1`` = last) at which the
  position was written (every position is written exactly once), and
* ``rel_prob``, ``rel_negentropy``, ``rel_margin`` -- ``sum_t c~_{t,i} 1{i masked at t}`` over
  the steps at which ``i`` is masked (the commit step included), where ``c~`` is the teacher's
  sharpness at ``i`` (max probability / negative entropy / top1-top2 margin) min-max normalised
  over the row's masked positions at that step (0.5 for every masked position when they all
  score the same, e.g. a single masked position).

Every lambda0 schedule, component ablation and ``N_probe`` subset of the prior is computed from
these columns by ``fair_calib.prior``.

Sharding: samples are cut into global batches of ``batch_size`` consecutive sample ids; batch
``j`` belongs to shard ``j % num_shards``. Each sample has its own random stream (seeded from
``(seed, sample_id)``; in ``trajectory: fixed`` mode one stream seeded from ``seed`` shared by
every sample), so the gathered shards equal a one-shard run bit for bit.
"""
from __future__ import annotations

import argparse
import json
import logging
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from fair_calib.jobs import io

log = logging.getLogger(__name__)

PROBE_SCHEMA = pa.schema([
    ("sample_id", pa.int64()),
    ("position", pa.int32()),
    ("commit_step", pa.int32()),
    ("rel_prob", pa.float64()),
    ("rel_negentropy", pa.float64()),
    ("rel_margin", pa.float64()),
])

SHARPNESS_COLUMNS = {"prob": "rel_prob", "negentropy": "rel_negentropy", "margin": "rel_margin"}
TRAJECTORY_MODES = ("independent", "fixed")
_FIXED_STREAM_TAG = 2**32 + 7     # never a sample id: the shared stream of fixed-trajectory mode


def sharpness_scores(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Teacher sharpness per position of ``logits [B, K, V]``: probability of the argmax token,
    negative entropy (nats) and top1-top2 probability margin, each ``[B, K]`` float64.

    Computed from the log-normaliser without materialising the distribution in float64:
    ``p_v = exp(z_v - lse)`` and ``-H = E_p[z] - lse``. The vocabulary-wide passes run in
    float32 with float64 accumulation (memory-bound, two float32 temporaries instead of several
    float64 copies); the per-position results are float64 and agree with an all-float64
    computation to ~1e-9."""
    z = logits.float()
    m = z.max(dim=-1, keepdim=True).values
    e = torch.exp(z - m)                                   # float32, exp(-inf) = 0
    total = e.sum(-1, dtype=torch.float64)                 # accumulated in float64
    lse = m.squeeze(-1).double() + torch.log(total)        # [B, K]
    # E_p[z], skipping -inf logits (p = 0 there; 0 * -inf would be nan).
    ez = torch.where(e > 0, e * z, torch.zeros((), device=z.device)).sum(-1, dtype=torch.float64)
    top = torch.topk(z, 2, dim=-1).values.double()         # logits of the top-2 tokens
    p_top = torch.exp(top - lse[..., None])
    return {"prob": p_top[..., 0], "negentropy": ez / total - lse,
            "margin": p_top[..., 0] - p_top[..., 1]}


def minmax_over_masked(score: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Min-max normalise ``score [B, K]`` over each row's masked positions; 0 elsewhere.

    A row whose masked positions all score the same (e.g. one masked position) gets 0.5 there:
    there is no ordering to express, and 0.5 is the middle of the normalised range.
    """
    inf = torch.tensor(float("inf"), dtype=score.dtype, device=score.device)
    lo = torch.where(masked, score, inf).min(-1, keepdim=True).values
    hi = torch.where(masked, score, -inf).max(-1, keepdim=True).values
    span = hi - lo
    flat = ~(span > 1e-12)
    norm = (score - lo) / torch.where(flat, torch.ones_like(span), span)
    norm = torch.where(flat.expand_as(norm), torch.full_like(norm, 0.5), norm)
    return torch.where(masked, norm, torch.zeros_like(norm))


class ProbeRecorder:
    """Decoding recorder accumulating commit steps and the three reliability sums.

    Accumulates on the model's device and copies to the host once, in ``finish``: a per-step
    host copy would synchronise every step and stall the GPU between forwards."""

    def start(self, batch: int, gen_length: int, steps: int) -> None:
        self.shape = (batch, gen_length)
        self.commit_step = self.commits = None
        self.rel: dict[str, torch.Tensor] = {}

    def step(self, t: int, logits: torch.Tensor, masked: torch.Tensor, committed: torch.Tensor,
             window: torch.Tensor) -> None:
        if self.commit_step is None:
            dev = logits.device
            self.commit_step = torch.zeros(self.shape, dtype=torch.long, device=dev)
            self.commits = torch.zeros(self.shape, dtype=torch.long, device=dev)
            self.rel = {k: torch.zeros(self.shape, dtype=torch.float64, device=dev)
                        for k in SHARPNESS_COLUMNS}
        for name, score in sharpness_scores(logits).items():
            self.rel[name] += minmax_over_masked(score, masked)
        self.commit_step.masked_fill_(committed, t)
        self.commits += committed.long()

    def finish(self, tokens: torch.Tensor) -> None:
        if self.commit_step is None or not bool((self.commits == 1).all()):
            raise RuntimeError("probe: a window position was not committed exactly once")
        self.commit_step = self.commit_step.cpu()
        self.rel = {k: v.cpu() for k, v in self.rel.items()}


def sample_seed(seed: int, sample_id: int, stream: str = "") -> int:
    """Seed of one sample's random stream, derived from (seed, sample_id[, stream]).

    ``stream`` (the probe's dataset in independent-trajectory mode) makes two corpora draw
    independent commit orders: random commits ignore the model and the prompt, so with one
    shared stream the frontier-hit term of two corpora would coincide by construction."""
    key = [int(seed), int(sample_id)] + ([zlib.crc32(stream.encode())] if stream else [])
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1))


def shard_batches(n_samples: int, batch_size: int, shard: int, num_shards: int) -> list[list[int]]:
    """Sample ids of the global batches that belong to ``shard``."""
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not in 0..{num_shards - 1}")
    if batch_size < 1:
        raise ValueError(f"probe.batch_size must be >= 1, got {batch_size}")
    starts = range(0, n_samples, batch_size)
    return [list(range(s, min(n_samples, s + batch_size)))
            for j, s in enumerate(starts) if j % num_shards == shard]


def encode_prompts(loaded: Any, texts: Sequence[str], instruct: bool,
                   max_prompt_tokens: int | None = None) -> list[list[int]]:
    """Token ids of the prompts: the chat template (generation prompt added, no extra special
    tokens) when the family uses one and the model is an instruct model, else plain encoding.
    ``max_prompt_tokens`` keeps each prompt's first tokens."""
    tok = loaded.tokenizer
    use_chat = bool(instruct and loaded.adapter.chat_template and getattr(tok, "chat_template", None))
    out = []
    for text in texts:
        if use_chat:
            rendered = tok.apply_chat_template([{"role": "user", "content": text}],
                                               add_generation_prompt=True, tokenize=False)
            ids = tok(rendered, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(text)["input_ids"]
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            ids = ids[:max_prompt_tokens]
        out.append([int(i) for i in ids])
    return out


def probe_policy(loaded: Any, p: dict[str, Any]):
    from fair_calib.decoding import make_policy

    return make_policy(loaded.adapter, {
        "policy": p.get("policy", "random_commit"), "steps": int(p["steps"]),
        "gen_length": int(p["gen_length"]), "temperature": float(p.get("temperature", 0.0)),
        "block_length": p.get("block_length")})


@torch.no_grad()
def probe_model(loaded: Any, prompts: Sequence[Sequence[int]], probe_settings: dict[str, Any],
                seed: int, sample_ids: Sequence[int] | None = None,
                batch_ids: Sequence[Sequence[int]] | None = None, progress: bool = True) -> pd.DataFrame:
    """Probe an already-loaded model on tokenised prompts; returns the probe-shard DataFrame.

    ``prompts[i]`` belongs to ``sample_ids[i]`` (default ``0..n-1``); ``batch_ids`` lists the
    sample ids decoded together (default: consecutive batches of ``probe.batch_size``).
    """
    from tqdm.auto import tqdm

    from fair_calib.decoding import generate

    p = probe_settings
    mode = p.get("trajectory", "independent")
    if mode not in TRAJECTORY_MODES:
        raise ValueError(f"probe.trajectory must be one of {list(TRAJECTORY_MODES)}, got {mode!r}")
    policy = probe_policy(loaded, p)
    sample_ids = list(range(len(prompts))) if sample_ids is None else [int(s) for s in sample_ids]
    by_id = dict(zip(sample_ids, prompts))
    if batch_ids is None:
        bs = int(p.get("batch_size", 16))
        batch_ids = [sample_ids[i:i + bs] for i in range(0, len(sample_ids), bs)]
    frames = []
    k = policy.gen_length
    for ids in tqdm(batch_ids, desc="probe", unit="batch", disable=not progress):
        gens = [torch.Generator().manual_seed(
                    sample_seed(seed, _FIXED_STREAM_TAG) if mode == "fixed"
                    else sample_seed(seed, sid, str(p.get("dataset", ""))))
                for sid in ids]
        rec = ProbeRecorder()
        generate(loaded, [by_id[s] for s in ids], policy, generator=gens, recorder=rec)
        frames.append(pd.DataFrame({
            "sample_id": np.repeat(np.asarray(ids, dtype=np.int64), k),
            "position": np.tile(np.arange(k, dtype=np.int32), len(ids)),
            "commit_step": rec.commit_step.numpy().reshape(-1).astype(np.int32),
            **{col: rec.rel[name].numpy().reshape(-1) for name, col in SHARPNESS_COLUMNS.items()},
        }))
    if not frames:
        return pd.DataFrame({f.name: pd.Series(dtype=f.type.to_pandas_dtype()) for f in PROBE_SCHEMA})
    return pd.concat(frames, ignore_index=True)[[f.name for f in PROBE_SCHEMA]]


def _check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    for key in ("seed", "model", "probe"):
        if key not in settings:
            raise ValueError(f"probe settings lack {key!r}")
    p = settings["probe"]
    for key in ("dataset", "n_samples", "steps", "gen_length"):
        if key not in p:
            raise ValueError(f"probe settings lack probe.{key}")
    if "family" not in settings["model"]:
        raise ValueError("probe settings lack model.family")
    if int(p["n_samples"]) < 1:
        raise ValueError(f"probe.n_samples must be >= 1, got {p['n_samples']}")
    return p


def probe(settings: dict[str, Any], model_dir: str | Path, shard: int, num_shards: int,
          out_path: str | Path) -> pd.DataFrame:
    """Run shard ``shard`` of ``num_shards`` of the probe and write it to ``out_path``."""
    from fair_calib.data import probe_prompts
    from fair_calib.models.adapters import load_model

    p = _check_settings(settings)
    torch.manual_seed(int(settings["seed"]))
    mentry = settings["model"]
    n = int(p["n_samples"])
    batches = shard_batches(n, int(p.get("batch_size", 16)), int(shard), int(num_shards))
    # validate the policy before the (possibly slow) model load
    from fair_calib.decoding import make_policy
    make_policy({}, {"policy": p.get("policy", "random_commit"), "steps": p["steps"],
                     "gen_length": p["gen_length"], "block_length": p.get("block_length"),
                     "temperature": p.get("temperature", 0.0)})
    loaded = load_model(model_dir, mentry["family"], settings.get("dtype", "float32"),
                        settings.get("device", "cpu"),
                        trust_remote_code=mentry.get("trust_remote_code"),
                        loader=mentry.get("loader"))
    loaded.replay_graphs()        # the teacher is final: repeated forwards replay on CUDA
    kwargs = {"source": p["source"]} if "source" in p else {}
    texts = probe_prompts(p["dataset"], settings.get("data_dir", ""), settings.get("synthetic_dir", ""),
                          n, p.get("instruction"), **kwargs)
    mine = [s for b in batches for s in b]
    prompts = encode_prompts(loaded, [texts[s] for s in mine], bool(mentry.get("instruct", False)),
                             p.get("max_prompt_tokens"))
    log.info("probe shard %d/%d: %d samples in %d batches (model %s)", shard, num_shards,
             len(mine), len(batches), mentry.get("name", model_dir))
    df = probe_model(loaded, prompts, p, int(settings["seed"]), sample_ids=mine, batch_ids=batches)
    prov = io.provenance(settings, seed=int(settings["seed"]), stage="probe", shard=int(shard),
                         num_shards=int(num_shards), n_samples_in_shard=len(mine),
                         probe_config_hash=io.config_hash(p))
    io.write_parquet(df, out_path, PROBE_SCHEMA, provenance=prov)
    log.info("wrote %s (%d rows)", out_path, len(df))
    return df


def load_settings(arg: str) -> dict[str, Any]:
    """``--settings`` value: a JSON string, or ``@path`` to a JSON file."""
    if arg.startswith("@"):
        return json.loads(Path(arg[1:]).read_text())
    return json.loads(arg)


def run_cli(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib probe",
                                 description="Stage I: random-commit teacher probing (one shard)")
    ap.add_argument("--settings", required=True, help="settings JSON (or @file.json)")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    probe(load_settings(args.settings), args.model_dir, args.shard, args.num_shards, args.out)


if __name__ == "__main__":
    run_cli()
