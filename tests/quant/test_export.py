import torch

from fair_calib.jobs import io
from fair_calib.calibrate import calibrate
from fair_calib.methods import make_method
from fair_calib.quant.export import fp_bf16_bytes, linear_codes, pack_int4, unpack_int4
from fair_calib.quant.qlinear import QuantLinear
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (4, 16), generator=torch.Generator().manual_seed(0))


def test_pack_int4_round_trip_and_layout():
    codes = torch.tensor([[-8, 7, 0, -1, 3]], dtype=torch.int8)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (1, 3)
    assert packed[0, 0].item() == (0x8 | (0x7 << 4))         # low nibble first
    assert torch.equal(unpack_int4(packed, 5), codes)
    r = torch.randint(-8, 8, (7, 33), dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(r), 33), r)


def test_export_sizes_and_codes(tmp_path):
    sizes = {}
    for bits in (4, 8):
        lm = tiny_random_loaded("llama", layers=2, hidden=128, intermediate=256)
        meta = calibrate(lm, make_method({"type": "flatquant", "epochs": 1, "keep_export": True},
                                         bits, bits), IDS, tmp_path / str(bits), batch_size=4,
                         log=lambda s: None)
        sizes[bits] = meta["export_bytes"]
        assert meta["export_bytes"] == (tmp_path / str(bits) / "export.safetensors").stat().st_size
        ql = lm.blocks[0].mlp.down_proj
        assert isinstance(ql, QuantLinear)
        codes, scale = linear_codes(ql)
        assert torch.equal(codes.float() * scale, ql.w_folded)
        t, _ = io.load_tensors(tmp_path / str(bits) / "export.safetensors")
        if bits == 4:
            assert t["model.layers.0.mlp.down_proj.qweight"].shape == (128, 128)   # 256 / 2
            assert torch.equal(unpack_int4(t["model.layers.0.mlp.down_proj.qweight"], 256), codes)
        assert "model.layers.0.mlp.down_proj.linear.weight" not in t
        assert "model.embed_tokens.weight" in t
    fp = fp_bf16_bytes(tiny_random_loaded("llama", layers=2, hidden=128, intermediate=256).model)
    assert meta["fp_bf16_bytes"] == fp
    assert sizes[4] < sizes[8] < fp
    # block linears: 2 layers x (4*128*128 + 3*128*256) weights; 4-bit saves 1/2 byte each vs 8-bit
    n_w = 2 * (4 * 128 * 128 + 3 * 128 * 256)
    assert abs((sizes[8] - sizes[4]) - n_w / 2) < 0.02 * n_w


def test_group_wise_export_holds_codes_scales_and_zero_points(tmp_path):
    """gptq / awq: unsigned codes two per byte, float16 scales and int16 zero points per (row,
    group); g_idx only where the groups are not consecutive (act-order)."""
    from fair_calib.quant.export import pack_uint4, unpack_uint4

    r = torch.randint(0, 16, (5, 33), dtype=torch.uint8)
    assert torch.equal(unpack_uint4(pack_uint4(r), 33), r)
    for cfg in ({"type": "awq", "group_size": 32, "keep_export": True},
                {"type": "gptq", "group_size": 32, "act_order": True, "keep_export": True}):
        lm = tiny_random_loaded("llama", layers=1, hidden=64, intermediate=128)
        out = tmp_path / cfg["type"]
        meta = calibrate(lm, make_method(cfg, 4, 16), IDS, out, batch_size=4, log=lambda s: None)
        t, _ = io.load_tensors(out / "export.safetensors")
        gc = lm.blocks[0].mlp.down_proj._groups
        name = "model.layers.0.mlp.down_proj"
        assert t[f"{name}.qweight"].shape == (64, 64)                 # 128 codes / 2
        assert torch.equal(unpack_uint4(t[f"{name}.qweight"], 128), gc.codes)
        assert t[f"{name}.scales"].shape == (64, 4) and t[f"{name}.zeros"].dtype == torch.int16
        assert torch.equal(t[f"{name}.zeros"].float(), gc.zero)
        assert (f"{name}.g_idx" in t) == bool(cfg.get("act_order"))
        assert f"{name}.linear.weight" not in t
        assert meta["export_bytes"] < meta["fp_bf16_bytes"]


def test_export_of_a_bf16_model(tmp_path):
    """A bf16 model's folded weight is the float32 quantized weight rounded to bf16, off the
    grid: the export takes codes and scales from the float32 weight (every bf16 export was
    refused before, seen when the whole DAG first ran on a lent GPU)."""
    for method in ({"type": "rtn", "keep_export": True},
                   {"type": "flatquant", "epochs": 1, "keep_export": True}):
        lm = tiny_random_loaded("llama", layers=1, hidden=64, intermediate=128)
        lm.model.to(torch.bfloat16)
        out = tmp_path / method["type"]
        calibrate(lm, make_method(method, 4, 4), IDS, out, batch_size=4, log=lambda s: None)
        assert (out / "export.safetensors").exists()
        ql = lm.blocks[0].mlp.down_proj
        codes, scale = linear_codes(ql)
        assert ql.w_folded.dtype == torch.bfloat16
        assert torch.equal((codes.float() * scale).to(torch.bfloat16), ql.w_folded)
