"""Names the config grid is validated against, importable without torch (the Snakefile reads
them at parse time). ``tests/test_registry.py`` checks they equal the real registries."""

# Model families (fair_calib.models.adapters.ADAPTERS).
FAMILIES = ("llada", "dream", "tiny-llada", "tiny-dream")
# Families whose released checkpoints load through a hub layout (fair_calib.models.hub).
HUB_FAMILIES = ("llada", "dream")
# How a hub family's checkpoint is loaded (fair_calib.models.adapters.LOADERS).
LOADERS = ("native", "remote")

# Calibration/quantization method types (fair_calib.methods.REGISTRY). A config ``methods:``
# entry names one of these in its ``type`` key; ``fp`` is the unquantized reference.
METHOD_TYPES = ("fp", "rtn", "quarot", "flatquant", "fair_calib", "qdrop")

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
