"""The tiny models' training settings where the config's ``models.<name>.train`` leaves one out:
read by the trainer (``fair_calib.models.tiny.train``) and, without torch, by the config checks
before any job (a tiny model's widths, ``fair_calib.checks.model_widths``)."""
from __future__ import annotations

from typing import Any

DEFAULT_TRAIN: dict[str, Any] = {
    "hidden": 128, "layers": 4, "heads": 4, "intermediate": 384,
    "steps": 1500, "batch_size": 32, "lr": 5e-3, "seq_len": 64,
    "warmup": 0.05, "min_lr_ratio": 0.1, "weight_decay": 0.01, "grad_clip": 1.0,
    "eps": 1e-3, "sft_frac": 0.8, "no_bos_frac": 0.1, "no_eos_frac": 0.1,
    "long_frac": 0.15, "short_tail": 6, "t_power": 2.0,
    "loss_norm": "masked_mean", "tie_train": True, "threads": 2,
}
