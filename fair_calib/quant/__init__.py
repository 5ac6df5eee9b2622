"""Fake-quantization building blocks shared by all calibration methods.

``quantizers``: symmetric uniform quantizers with straight-through rounding and FlatQuant's learnable clipping.
``trace``: which linear is the value projection and which group is o_proj (run the block).
``transforms``: FlatQuant-style learnable invertible transforms (diagonal scale + Kronecker affine).
``hadamard``: Hadamard rotations (Paley/Sylvester constructions) of the widths QuaRot handles.
``qlinear``: the quantized linear layer and the per-input-group quantizer it shares with siblings.
``discovery``: find the linears of a transformer block and group those that read the same input.
``blockio``: capture the inputs of block 0 and call a block with captured args/kwargs.
``gptq``: GPTQ weight quantization of one matrix.
``export``: packed integer deployment file (4-bit: two codes per byte).
``toy``: tiny random Llama/Qwen2 models as ``LoadedModel`` (tests, smoke runs).
"""
