"""A card of its own for every GPU job on one machine without a scheduler.

``snakemake --profile profiles/local --resources gpu=N`` runs up to N GPU jobs at once, but a
job that opens ``cuda`` gets card 0 unless told otherwise. So a stage whose settings say
``device: cuda`` takes a slot before torch initialises CUDA (``fair_calib.cli``): one lock
file per card, ``<lock dir>/<host>/card-<card>.lock``, locked with ``flock``; the first card
whose lock it gets is its own, and ``CUDA_VISIBLE_DEVICES`` is set to that card alone. The lock
lives as long as the job's process: the kernel releases it when the process exits, also after
``kill -9`` or a crash, so no stale slot survives a job.

- The cards are those of a ``CUDA_VISIBLE_DEVICES`` the user set (indices or UUIDs, as given),
  else every card ``nvidia-smi`` lists (indices in PCI bus order, and ``CUDA_DEVICE_ORDER`` is
  set to ``PCI_BUS_ID`` unless the user set it, so an index names the card nvidia-smi shows).
- The lock dir is ``FAIR_CALIB_GPU_LOCK_DIR``, else ``.snakemake/gpu-slots`` in the working
  directory (the checkout, where Snakemake runs jobs).
- When every card is taken (more jobs than cards: ``--resources gpu=`` above the card count,
  or GPU jobs of another run), the job waits for a card and says so in its log.
- ``FAIR_CALIB_GPU_JOBS_PER_CARD`` (default 1; the workflow sets it from the config's
  ``gpu_jobs_per_card``) jobs share a card: small models (the embedded default's) leave a card
  idle between their kernels, so several jobs on one card finish sooner than one at a time.
  Each of a card's slots is a lock of its own (``card-<card>.lock``, ``card-<card>.<k>.lock``).
- Under SLURM (``SLURM_JOB_ID`` set) the scheduler gives each job its cards: no slot is taken.
  ``FAIR_CALIB_GPU_SLOTS=0`` turns slots off.
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Mapping, MutableMapping

LOCK_DIR_ENV = "FAIR_CALIB_GPU_LOCK_DIR"
SWITCH_ENV = "FAIR_CALIB_GPU_SLOTS"
PER_CARD_ENV = "FAIR_CALIB_GPU_JOBS_PER_CARD"
DEFAULT_LOCK_DIR = ".snakemake/gpu-slots"

# Open lock files of this process: closing one (or exiting) frees its card.
_HELD: list[IO] = []


def slots_enabled(environ: Mapping[str, str]) -> bool:
    if environ.get("SLURM_JOB_ID"):
        return False
    return environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def user_cards(environ: Mapping[str, str]) -> list[str] | None:
    """The cards of a ``CUDA_VISIBLE_DEVICES`` the user set (None where it is unset)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    cards = [c.strip() for c in value.split(",") if c.strip()]
    # CUDA stops at the first invalid entry (e.g. -1): the cards before it are the visible ones.
    for i, card in enumerate(cards):
        if card.startswith("-"):
            return cards[:i]
    return cards


def machine_cards() -> list[str]:
    """Indices of the cards ``nvidia-smi`` lists (none where it is absent or fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def lock_dir(environ: Mapping[str, str]) -> Path:
    base = Path(environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    return base / socket.gethostname()


def jobs_per_card(environ: Mapping[str, str]) -> int:
    """How many jobs share one card (``FAIR_CALIB_GPU_JOBS_PER_CARD``, default 1)."""
    value = environ.get(PER_CARD_ENV, "1").strip()
    if not value.isdigit() or int(value) < 1:
        sys.exit(f"error: {PER_CARD_ENV}={value!r} is not valid; give a whole number >= 1 "
                 "(config key gpu_jobs_per_card)")
    return int(value)


def _lock_name(card: str, slot: int = 0) -> str:
    suffix = f".{slot}" if slot else ""
    return "card-" + re.sub(r"[^A-Za-z0-9_.-]", "_", card) + suffix + ".lock"


def try_cards(cards: list[str], folder: Path, per_card: int = 1) -> str | None:
    """Lock the first free slot of ``cards`` (every card's first slot before any card's
    second, so jobs spread over the cards); returns its card (the lock stays held) or None."""
    folder.mkdir(parents=True, exist_ok=True)
    for slot, card in ((k, c) for k in range(per_card) for c in cards):
        handle = open(folder / _lock_name(card, slot), "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")     # who holds it, for a person looking
        handle.flush()
        _HELD.append(handle)
        return card
    return None


def acquire(cards: list[str], folder: Path, poll_s: float = 2.0, log: IO = sys.stderr,
            per_card: int = 1) -> str:
    """A card of ``cards`` for this process, waiting while every slot is taken."""
    card = try_cards(cards, folder, per_card)
    waited = 0.0
    while card is None:
        if waited == 0.0:
            print(f"[gpu-slot] all {len(cards)} cards ({','.join(cards)}) are taken by other "
                  f"jobs ({per_card} a card; locks in {folder}); waiting for one",
                  file=log, flush=True)
        time.sleep(poll_s)
        waited += poll_s
        card = try_cards(cards, folder, per_card)
    if waited:
        print(f"[gpu-slot] waited {waited:.0f} s for a card", file=log, flush=True)
    return card


def assign_card(environ: MutableMapping[str, str] | None = None,
                log: IO = sys.stderr) -> str | None:
    """Take a card for this process and make it the only visible one; returns the card, or
    None where slots are off or there is no card to share. Call before torch uses CUDA."""
    environ = os.environ if environ is None else environ
    if not slots_enabled(environ):
        return None
    cards = user_cards(environ)
    from_user = cards is not None
    if cards is None:
        cards = machine_cards()
    if not cards:
        return None
    folder = lock_dir(environ)
    per_card = jobs_per_card(environ)
    card = acquire(cards, folder, log=log, per_card=per_card)
    if not from_user:
        environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    environ["CUDA_VISIBLE_DEVICES"] = card
    print(f"[gpu-slot] this job runs on card {card} (CUDA_VISIBLE_DEVICES={card}; slots over "
          f"{','.join(cards)}{' from CUDA_VISIBLE_DEVICES' if from_user else ''}, {per_card} "
          f"job(s) a card; locks in {folder})", file=log, flush=True)
    return card
