"""Names the config grid is validated against, importable without torch (the Snakefile reads
them at parse time). ``tests/test_registry.py`` checks they equal the real registries."""

# Model families (fair_calib.models.adapters.ADAPTERS).
FAMILIES = ("llada", "dream", "tiny-llada", "tiny-dream")
# The adapters' default ``exact_below`` (fair_calib.models.adapters: ``likelihood``): a target
# with fewer maskable tokens is scored exactly, by enumeration, so ``mc_num`` does not touch it.
EXACT_BELOW = {"llada": 2, "dream": 0, "tiny-llada": 2, "tiny-dream": 2}
# Families whose tokenizer makes every word one token (fair_calib.models.tiny.tokenizer): the
# synthetic multiple-choice answers (one word each, fair_calib.models.tiny.corpus) are one token.
WORD_TOKENIZER_FAMILIES = ("tiny-llada", "tiny-dream")
# Families whose released checkpoints load through a hub layout (fair_calib.models.hub).
HUB_FAMILIES = ("llada", "dream")
# How a hub family's checkpoint is loaded (fair_calib.models.adapters.LOADERS).
LOADERS = ("native", "remote")

# Calibration/quantization method types (fair_calib.methods.REGISTRY). A config ``methods:``
# entry names one of these in its ``type`` key; ``fp`` is the unquantized reference.
METHOD_TYPES = ("fp", "rtn", "quarot", "flatquant", "fair_calib", "qdrop", "gptq", "awq", "smoothquant",
                "duquant", "tmas", "mcs")

# Method types that quantize weights only (their bits need a_bits 16).
WEIGHT_ONLY_TYPES = ("gptq", "awq")

# Stage II propagation modes (fair_calib.calibrate.PROPAGATE) and FlatQuant's o_proj transforms
# (fair_calib.methods.flatquant.O_TRANS); the schema's enums list the same names.
PROPAGATE = ("fp", "quant", "teacher")
O_TRANS = ("heads", "kron")

# Decoding policies (fair_calib.decoding).
POLICIES = ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy",
            "random_commit")

# Prior variants (fair_calib.prior).
PRIOR_SCHEDULES = ("early_boost", "uniform", "late_boost", "none")
PRIOR_COMPONENTS = ("hit", "rel")
SHARPNESS_SCORES = ("prob", "negentropy", "margin")

# QDLM's baselines' ``arithmetic`` setting: ``authors`` (the default) computes what the authors'
# code computes, dtype and order included; ``precise`` the project's higher-precision variant
# (docs/fidelity.md, "QDLM's baselines"). The schema's enum lists the same names.
ARITHMETICS = ("authors", "precise")


def check_arithmetic(arithmetic: str, method_type: str) -> str:
    """``arithmetic`` if it is one of :data:`ARITHMETICS`, else a one-line error naming it."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"{method_type}: arithmetic must be one of {ARITHMETICS}, "
                         f"got {arithmetic!r}")
    return arithmetic


# The settings a ``methods:`` entry may hold, declared once per method type: a key not listed
# for the entry's type is rejected before any job (a misspelled ``epoch: 1`` would otherwise be
# ignored and the default run). A method that reads a new setting adds its name here, in the
# tuple of its type (and of the types that inherit it); nothing else needs to change.
# ``fair_calib.checks.config.validate_config`` checks configs and stage --settings against it.
METHOD_COMMON_SETTINGS = ("type", "label", "latex_label", "seeds")
# every quantizing method: Stage II data, its overrides, the job's batch size, packed export
_QUANT_SETTINGS = ("calibration", "calibration_by_family", "batch_size", "export", "keep_export")
# learnable-transform / reconstruction methods (their optimiser and position weighting)
_TRAINED_SETTINGS = ("prior", "weighting", "epochs", "lr", "propagate", "weight_decay",
                     "clip_lr_mult", "eta_min_ratio", "normalize_loss", "shuffle")
# FlatQuant's transforms and learnable clipping (FAIR-Calib is FlatQuant with a weighted loss)
_FLATQUANT_SETTINGS = ("alpha", "kron", "smooth", "init", "w_clip", "a_clip", "clip_init_logit",
                       "o_trans", "w_clip_init")
METHOD_SETTINGS: dict[str, tuple[str, ...]] = {
    "fp": (),
    "rtn": _QUANT_SETTINGS + ("a_clip_ratio", "w_clip_ratio"),
    "quarot": _QUANT_SETTINGS + ("a_clip_ratio", "w_clip_ratio", "w_clip", "online_hadamard",
                                 "damp", "propagate"),
    "flatquant": _QUANT_SETTINGS + _TRAINED_SETTINGS + _FLATQUANT_SETTINGS,
    "fair_calib": _QUANT_SETTINGS + _TRAINED_SETTINGS + _FLATQUANT_SETTINGS,
    "qdrop": _QUANT_SETTINGS + _TRAINED_SETTINGS + ("drop_prob",),
    # QDLM's baselines (issue 31): group-wise weight grids with zero points
    "gptq": _QUANT_SETTINGS + ("group_size", "sym", "act_order", "damp", "propagate",
                               "arithmetic"),
    "awq": _QUANT_SETTINGS + ("group_size", "propagate", "arithmetic"),
    "smoothquant": _QUANT_SETTINGS + ("alpha", "propagate", "arithmetic"),
    # DuQuant: SmoothQuant's smoothing, then rotations + zigzag permutation, fixed clip ratios
    "duquant": _QUANT_SETTINGS + ("alpha", "propagate", "block_size", "max_rotation_step",
                                  "lac", "swc", "arithmetic"),
    # the field's dLLM calibration data (issue 48) on FlatQuant's calibration: DLLMQuant's
    # Temporal-Mask Adaptive Sampling, Quant-dLLM's Masked Calibration Simulation
    "tmas": _QUANT_SETTINGS + _TRAINED_SETTINGS + _FLATQUANT_SETTINGS
            + ("prompt_ratio", "stage_proportions", "decoding"),
    "mcs": _QUANT_SETTINGS + _TRAINED_SETTINGS + _FLATQUANT_SETTINGS
           + ("timesteps", "prefix_ratio"),
}


def method_setting_names(method_type: str) -> tuple[str, ...]:
    """Every key a ``methods:`` entry of this type may hold."""
    return METHOD_COMMON_SETTINGS + METHOD_SETTINGS[method_type]
