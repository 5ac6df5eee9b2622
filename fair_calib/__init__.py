"""FAIR-Calib: frontier-aware post-training quantization for diffusion language models."""
__version__ = "0.1.0"
