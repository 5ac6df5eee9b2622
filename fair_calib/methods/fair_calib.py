"""``fair_calib``: FlatQuant's quantizer and transforms, calibrated on the position-weighted
hidden-state MSE with the Stage I prior w_bar (paper Eq. layerwise_loss). Same settings as
``flatquant``; ``weighting`` defaults to ``prior`` (the driver then requires ``--prior``)."""
from __future__ import annotations

from .flatquant import FlatQuantMethod


class FairCalibMethod(FlatQuantMethod):
    type_name = "fair_calib"

    @property
    def weighting(self) -> str:
        return str(self.cfg.get("weighting", "prior"))
