"""``fair_calib``: FlatQuant's quantizer and transforms, calibrated on the position-weighted
hidden-state MSE with the Stage I prior w_bar (paper Eq. layerwise_loss). Same settings as
``flatquant``; ``weighting`` defaults to ``prior`` (the driver then requires ``--prior``).

``propagate`` defaults to ``teacher``: the paper's Eq. layerwise_loss writes the quantized hidden
state as h^q_l(x, y; theta_<=l), "layers < l already calibrated and frozen", and its Algorithm
runs a "teacher-forcing forward through M* and current M^q": block l is fed the quantized
model's hidden state (earlier blocks calibrated) and matched to the FP teacher's h*_l. FlatQuant
itself (``propagate: fp``) feeds FP inputs; ``propagate: fp`` with ``weighting: uniform`` gives
exactly FlatQuant.
"""
from __future__ import annotations

from .flatquant import FlatQuantMethod


class FairCalibMethod(FlatQuantMethod):
    type_name = "fair_calib"

    @property
    def weighting(self) -> str:
        return str(self.cfg.get("weighting", "prior"))

    def training_settings(self):
        s = super().training_settings()
        s["propagate"] = str(self.cfg.get("propagate", "teacher"))
        return s
