"""Which Hadamard orders exist here and how a width splits into one times a power of two:
integer arithmetic only, no torch, so the config checks read it before any job
(``fair_calib.checks.method_shapes``) with the very rules the rotations are built by
(``fair_calib.quant.hadamard``: its module docstring says where each construction comes from).
"""
from __future__ import annotations

# QuaRot's get_hadK order, then 148 (ours, for Dream's 18944).
HADAMARD_ORDERS = (172, 156, 140, 108, 60, 52, 36, 28, 40, 20, 12, 148)
# QuaRot's Williamson-type tables: not constructed here, so their widths are refused.
QUAROT_ONLY_ORDERS = (172, 156, 52)


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def hadamard_recipe(k: int) -> tuple[str, int]:
    """How ``hadamard(k)`` builds order k: ("sylvester", k), ("paley1", q), ("paley2", q) or
    ("double", k / 2); ValueError where none of these constructions gives order k."""
    if is_pow2(k):
        return "sylvester", k
    if is_prime(k - 1) and (k - 1) % 4 == 3:
        return "paley1", k - 1
    if k % 2 == 0 and is_prime(k // 2 - 1) and (k // 2 - 1) % 4 == 1:
        return "paley2", k // 2 - 1
    if k % 2 == 0 and k // 2 % 4 == 0 and has_hadamard(k // 2):
        return "double", k // 2
    raise ValueError(f"no Hadamard construction of order {k} here (Paley I/II, doubling)")


def has_hadamard(k: int) -> bool:
    try:
        hadamard_recipe(k)
    except ValueError:
        return False
    return True


def hadamard_split(n: int) -> tuple[int, int, bool]:
    """(K, 2^j, exact) with n = K * 2^j: K from QuaRot's orders (then 148), else the odd part
    of n with ``exact`` False (no Hadamard matrix: random orthogonal factor). ValueError where
    QuaRot would use one of its Williamson tables (52, 156, 172), which are not built here."""
    if is_pow2(n):
        return 1, n, True
    for k in HADAMARD_ORDERS:
        if n % k == 0 and is_pow2(n // k):
            if k in QUAROT_ONLY_ORDERS:
                raise ValueError(f"width {n} = {k} x {n // k}: QuaRot rotates it with its "
                                 f"order-{k} table, which is not reproduced here")
            return k, n // k, True
    p = n & -n
    return n // p, p, False
