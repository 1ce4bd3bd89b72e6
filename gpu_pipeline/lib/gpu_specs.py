"""GPU model spec table: board power (TDP), typical idle power and achievable dense tensor TFLOPS,
each figure with its source (DESIGN.md 5.5).

What the figures mean
    ``tdp_w``
        The board's default power limit / max board power as the vendor datasheet states it (for
        SKUs with a range, the upper end: that is the default limit the driver reports). It is the
        denominator of PIF only when a sample carries no power limit of its own
        (:mod:`gpu_pipeline.lib.efficiency` prefers the sampled ``power.limit``).
    ``idle_power_w``
        Typical draw of an idle board (no context, persistence mode on). Vendors do not publish it:
        where a public capture of the real tool exists (nvidia-smi ``-q`` idle section, an idle
        dcgm-exporter scrape, HTCondor's ``PowerUsage_mw``) that reading is used; otherwise it is
        an estimate of 12 % of TDP, the middle of what those captures show (10-13 %). It only
        feeds the "held but idle" threshold.
    ``peak_dense_tflops``
        Vendor peak **dense** (no structured sparsity) FP16/BF16 Tensor Core TFLOPS. Where the
        vendor publishes FP16 tensor rates with FP16 and FP32 accumulate separately (GeForce), the
        FP32-accumulate figure is used (that is what mixed-precision training runs at). Boards
        without Tensor Cores (Pascal) carry their best dense non-tensor rate (P100: FP16; GTX 1080
        Ti: FP32, its FP16 runs at 1/64 rate); ``tflops_basis`` says which.
    ``achievable_tflops``
        The figure RFU is computed with. The three seed values of DESIGN.md 5.5 are kept exactly
        (NVIDIA A10G 35, A100-SXM4-40GB 102, H100 80GB HBM3 646) -- users compare with them. They are
        well below peak (ratios 0.50, 0.327, 0.653 of the dense peak), so every other model gets
        ``peak_dense_tflops`` times the ratio of its seeded sibling (same silicon family): Hopper
        (H100/H200 variants) x 646/989.4, GA100 (A100 variants, A30) x 102/312, everything else x
        35/70 = 0.5 (the A10G seed's ratio). So capability weights stay consistent across models
        (an A100-SXM4-80GB is not credited 3x its 40 GB twin). Unknown models get the seed default
        400 W / 100 TFLOPS with ``spec_known = False``.

Matching
    :func:`lookup` normalizes a name the way HTCondor (``GPUs_DeviceName``, ``CUDADeviceName``),
    nvidia-smi (``name``) and DCGM (``modelName``) spell it: lower case, every run of characters
    other than letters, digits and ``.`` becomes one space (``"NVIDIA A100-SXM4-40GB"`` ->
    ``"nvidia a100 sxm4 40gb"``). A pattern matches when its tokens occur as a contiguous run of
    whole tokens (so ``a10`` does not match ``a100``, ``l40`` does not match ``l40s``). The most
    specific match wins: most tokens, then the longest pattern text. A MIG device name
    (``"NVIDIA A100-SXM4-40GB MIG 3g.20gb"``) resolves to its parent board.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa

from gpu_pipeline.lib.schemas import TableSpec, _f

# Ratios of the DESIGN.md 5.5 seed "achievable" figures to the vendors' dense FP16 tensor peaks.
SEED_RATIO_HOPPER = 646.0 / 989.4  # H100 80GB HBM3
SEED_RATIO_GA100 = 102.0 / 312.0  # A100-SXM4-40GB
SEED_RATIO_DEFAULT = 35.0 / 70.0  # A10G, applied to every family without a seeded sibling
IDLE_FRACTION_ESTIMATE = 0.12

DEFAULT_TDP_W = 400.0
DEFAULT_ACHIEVABLE_TFLOPS = 100.0
DEFAULT_MODEL = "unknown"

_SEED = "DESIGN.md 5.5 seed spec table"
_RATIO_NOTE = {
    "hopper": f"x {SEED_RATIO_HOPPER:.4f} (H100 seed ratio 646/989.4)",
    "ga100": f"x {SEED_RATIO_GA100:.4f} (A100-SXM4-40GB seed ratio 102/312)",
    "default": f"x {SEED_RATIO_DEFAULT:.2f} (A10G seed ratio 35/70)",
}
_RATIO = {"hopper": SEED_RATIO_HOPPER, "ga100": SEED_RATIO_GA100, "default": SEED_RATIO_DEFAULT}


@dataclass(frozen=True)
class Spec:
    """One GPU model's figures (see the module docstring for their exact meaning)."""

    model: str
    patterns: tuple[str, ...]
    architecture: str
    tdp_w: float
    tdp_source: str
    idle_power_w: float
    idle_power_source: str
    peak_dense_tflops: float | None
    peak_source: str
    tflops_basis: str
    achievable_tflops: float
    achievable_source: str
    spec_known: bool = True


_TENSOR = "dense FP16/BF16 Tensor Core"
_TENSOR_FP32ACC = "dense FP16 Tensor Core, FP32 accumulate"


def _spec(
    model: str,
    patterns: Iterable[str],
    architecture: str,
    tdp_w: float,
    tdp_source: str,
    peak: float,
    peak_source: str,
    *,
    family: str = "default",
    basis: str = _TENSOR,
    achievable: float | None = None,
    achievable_source: str | None = None,
    idle_w: float | None = None,
    idle_source: str | None = None,
) -> Spec:
    if achievable is None:
        achievable = round(peak * _RATIO[family], 1)
        achievable_source = f"peak {peak:g} TFLOPS {_RATIO_NOTE[family]}"
    if idle_w is None:
        idle_w = float(round(tdp_w * IDLE_FRACTION_ESTIMATE))
        idle_source = (
            f"estimate: {IDLE_FRACTION_ESTIMATE:.0%} of TDP (no vendor idle figure; public idle captures "
            "of H100/H200/A100/T4 read 10-13 % of TDP)"
        )
    return Spec(
        model=model,
        patterns=tuple(patterns),
        architecture=architecture,
        tdp_w=float(tdp_w),
        tdp_source=tdp_source,
        idle_power_w=float(idle_w),
        idle_power_source=idle_source or "",
        peak_dense_tflops=float(peak),
        peak_source=peak_source,
        tflops_basis=basis,
        achievable_tflops=float(achievable),
        achievable_source=achievable_source or "",
    )


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/h100)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/h200)"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/a100)"
_TURING_WP = "NVIDIA Turing GPU Architecture whitepaper, appendix A"

SPECS: tuple[Spec, ...] = (
    # --- Hopper -------------------------------------------------------------------------------
    _spec(
        "NVIDIA H100 80GB HBM3", ("h100 80gb hbm3", "h100 sxm5", "h100 sxm", "h100"), "Hopper",
        700, f"{_SEED}; {_H100_DS}: H100 SXM max TDP up to 700 W",
        989.4, f"{_H100_DS}: H100 SXM FP16/BF16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense)",
        family="hopper", achievable=646.0, achievable_source=_SEED,
        idle_w=70.0, idle_source="observed idle in public captures: nvidia-smi -q 69.85 W, dcgm-exporter "
        "scrape 65.7-68.7 W (NVIDIA H100 80GB HBM3)",
    ),
    _spec(
        "NVIDIA H100 PCIe", ("h100 pcie",), "Hopper",
        350, f"{_H100_DS}: H100 PCIe max TDP 300-350 W (configurable)",
        756.5, f"{_H100_DS}: H100 PCIe FP16 Tensor Core 1,513 TFLOPS with sparsity (756.5 dense)",
        family="hopper",
    ),
    _spec(
        "NVIDIA H100 NVL", ("h100 nvl",), "Hopper",
        400, f"{_H100_DS}: H100 NVL max TDP 350-400 W (configurable)",
        835.5, f"{_H100_DS}: H100 NVL FP16 Tensor Core 1,671 TFLOPS with sparsity (835.5 dense)",
        family="hopper",
    ),
    _spec(
        "NVIDIA H200", ("h200", "h200 sxm"), "Hopper",
        700, f"{_H200_DS}: H200 SXM max TDP up to 700 W",
        989.4, f"{_H200_DS}: H200 SXM FP16/BF16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense)",
        family="hopper",
        idle_w=78.0, idle_source="observed idle in a public capture: nvidia-smi -q 77.67 W (NVIDIA H200)",
    ),
    _spec(
        "NVIDIA H200 NVL", ("h200 nvl",), "Hopper",
        600, f"{_H200_DS}: H200 NVL max TDP up to 600 W",
        835.5, f"{_H200_DS}: H200 NVL FP16 Tensor Core 1,671 TFLOPS with sparsity (835.5 dense)",
        family="hopper",
    ),
    # --- Ampere GA100 -----------------------------------------------------------------------------
    _spec(
        "NVIDIA A100-SXM4-40GB", ("a100 sxm4 40gb", "a100 sxm 40gb", "a100 40gb sxm", "a100"), "Ampere",
        400, f"{_SEED}; {_A100_DS}: A100 SXM max TDP 400 W",
        312.0, f"{_A100_DS}: FP16/BF16 Tensor Core 312 TFLOPS dense (624 with sparsity)",
        family="ga100", achievable=102.0, achievable_source=_SEED,
        idle_w=52.0, idle_source="observed idle in a public capture: HTCondor condor_gpu_discovery "
        "PowerUsage_mw 49.0-54.1 W on 7 idle NVIDIA A100-SXM4-40GB",
    ),
    _spec(
        "NVIDIA A100-SXM4-80GB", ("a100 sxm4 80gb", "a100 sxm 80gb", "a100 80gb sxm"), "Ampere",
        400, f"{_A100_DS}: A100 80GB SXM max TDP 400 W",
        312.0, f"{_A100_DS}: FP16/BF16 Tensor Core 312 TFLOPS dense (624 with sparsity)",
        family="ga100",
    ),
    _spec(
        "NVIDIA A100 80GB PCIe", ("a100 80gb pcie", "a100 pcie 80gb"), "Ampere",
        300, f"{_A100_DS}: A100 80GB PCIe max TDP 300 W",
        312.0, f"{_A100_DS}: FP16/BF16 Tensor Core 312 TFLOPS dense (624 with sparsity)",
        family="ga100",
    ),
    _spec(
        "NVIDIA A100-PCIE-40GB", ("a100 pcie 40gb", "a100 40gb pcie", "a100 pcie"), "Ampere",
        250, "NVIDIA A100 PCIe 40GB datasheet (2020): max TDP 250 W",
        312.0, f"{_A100_DS}: FP16/BF16 Tensor Core 312 TFLOPS dense (624 with sparsity)",
        family="ga100",
    ),
    _spec(
        "NVIDIA A30", ("a30",), "Ampere",
        165, "NVIDIA A30 Tensor Core GPU datasheet: max TDP 165 W",
        165.0, "NVIDIA A30 datasheet: FP16/BF16 Tensor Core 165 TFLOPS dense (330 with sparsity)",
        family="ga100",
    ),
    # --- Ampere GA10x -----------------------------------------------------------------------------
    _spec(
        "NVIDIA A10G", ("a10g",), "Ampere",
        300, f"{_SEED} (AWS EC2 G5 board, 300 W power limit)",
        70.0, "no NVIDIA datasheet (AWS-only SKU): 70 TFLOPS dense FP16 tensor as published in AWS G5 / "
        "third-party A10 vs A10G comparisons (baseten.co)",
        achievable=35.0, achievable_source=_SEED,
    ),
    _spec(
        "NVIDIA A10", ("a10",), "Ampere",
        150, "NVIDIA A10 Tensor Core GPU datasheet: max TDP 150 W",
        125.0, "NVIDIA A10 datasheet: FP16/BF16 Tensor Core 125 TFLOPS dense (250 with sparsity)",
    ),
    _spec(
        "NVIDIA A40", ("a40",), "Ampere",
        300, "NVIDIA A40 datasheet: max power consumption 300 W",
        149.7, "NVIDIA A40 datasheet: peak FP16/BF16 Tensor 149.7 TFLOPS dense (299.4 with sparsity)",
    ),
    _spec(
        "NVIDIA RTX A6000", ("rtx a6000",), "Ampere",
        300, "NVIDIA RTX A6000 datasheet: max power consumption 300 W",
        154.8, "NVIDIA RTX A6000 datasheet: tensor performance 309.7 TFLOPS with sparsity (154.8 dense)",
    ),
    # --- Ada Lovelace -----------------------------------------------------------------------------
    _spec(
        "NVIDIA L40S", ("l40s",), "Ada Lovelace",
        350, "NVIDIA L40S datasheet: max power consumption 350 W",
        362.05, "NVIDIA L40S datasheet: FP16/BF16 Tensor Core 362.05 TFLOPS dense (733 with sparsity)",
    ),
    _spec(
        "NVIDIA L40", ("l40",), "Ada Lovelace",
        300, "NVIDIA L40 datasheet: max power consumption 300 W",
        181.05, "NVIDIA L40 datasheet: FP16/BF16 Tensor Core 181.05 TFLOPS dense (362.1 with sparsity)",
    ),
    _spec(
        "NVIDIA L4", ("l4",), "Ada Lovelace",
        72, "NVIDIA L4 Tensor Core GPU datasheet: max power 72 W",
        121.0, "NVIDIA L4 datasheet: FP16 Tensor Core 242 TFLOPS with sparsity (121 dense)",
    ),
    _spec(
        "NVIDIA RTX 2000 Ada Generation", ("rtx 2000 ada",), "Ada Lovelace",
        70, "NVIDIA RTX 2000 Ada Generation datasheet: total board power 70 W",
        48.0, "NVIDIA RTX 2000 Ada datasheet: tensor performance 191.9 TFLOPS (FP8 with sparsity) / 4 "
        "= 48.0 FP16 dense (the FP8-sparse:FP16-dense ratio of the L40 datasheet)",
    ),
    # --- Turing -----------------------------------------------------------------------------------
    _spec(
        "Tesla T4", ("t4",), "Turing",
        70, "NVIDIA T4 Tensor Core GPU datasheet: max power 70 W",
        65.0, "NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS",
        basis=_TENSOR_FP32ACC,
        idle_w=9.0, idle_source="observed idle in a public capture: dcgm-exporter scrape 8.97 W (Tesla T4)",
    ),
    _spec(
        "NVIDIA GeForce RTX 2080 Ti", ("rtx 2080 ti",), "Turing",
        250, f"{_TURING_WP}: GeForce RTX 2080 Ti reference TDP 250 W",
        53.8, f"{_TURING_WP}: RTX 2080 Ti peak FP16 Tensor TFLOPS with FP32 accumulate 53.8 (107.6 with "
        "FP16 accumulate)",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "NVIDIA GeForce RTX 2080 SUPER", ("rtx 2080 super",), "Turing",
        250, "NVIDIA GeForce RTX 2080 SUPER specifications: graphics card power 250 W",
        44.6, f"derived: 48 SMs x 1815 MHz boost x Turing per-SM tensor rate ({_TURING_WP}), FP32 "
        "accumulate at GeForce half rate = 44.6 (89.2 with FP16 accumulate)",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "NVIDIA TITAN RTX", ("titan rtx",), "Turing",
        280, "NVIDIA TITAN RTX specifications: graphics card power 280 W",
        130.0, "NVIDIA TITAN RTX specifications: 130 Tensor TFLOPS (FP32 accumulate at full rate)",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "Quadro RTX 6000", ("quadro rtx 6000",), "Turing",
        260, "NVIDIA Quadro RTX 6000 datasheet: 295 W max incl. 35 W VirtualLink, board power 260 W "
        "(the driver's default power limit)",
        130.5, "NVIDIA Quadro RTX 6000 datasheet: tensor performance 130.5 TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "Quadro RTX 5000", ("quadro rtx 5000",), "Turing",
        230, "NVIDIA Quadro RTX 5000 datasheet: max power consumption 230 W",
        89.2, "NVIDIA Quadro RTX 5000 datasheet: tensor performance 89.2 TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    # --- Volta ------------------------------------------------------------------------------------
    _spec(
        "Tesla V100-SXM2", ("v100 sxm2", "v100 sxm2 16gb", "v100 sxm2 32gb", "v100 sxm3"), "Volta",
        300, "NVIDIA Tesla V100 datasheet: V100 SXM2 max power 300 W",
        125.0, "NVIDIA Tesla V100 datasheet: V100 SXM2 tensor performance 125 TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "Tesla V100-PCIE", ("v100 pcie", "v100"), "Volta",
        250, "NVIDIA Tesla V100 datasheet: V100 PCIe max power 250 W",
        112.0, "NVIDIA Tesla V100 datasheet: V100 PCIe tensor performance 112 TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "Tesla V100S-PCIE", ("v100s", "v100s pcie"), "Volta",
        250, "NVIDIA V100S datasheet: max power 250 W",
        130.0, "NVIDIA V100S datasheet: tensor performance 130 TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    _spec(
        "NVIDIA TITAN V", ("titan v",), "Volta",
        250, "NVIDIA TITAN V specifications: graphics card power 250 W",
        110.0, "NVIDIA TITAN V specifications: 110 deep learning (tensor) TFLOPS",
        basis=_TENSOR_FP32ACC,
    ),
    # --- Pascal (no Tensor Cores) -------------------------------------------------------------------
    _spec(
        "Tesla P100-SXM2", ("p100 sxm2",), "Pascal",
        300, "NVIDIA Tesla P100 datasheet: P100 SXM2 max power 300 W",
        21.2, "NVIDIA Tesla P100 datasheet: P100 SXM2 half precision 21.2 TFLOPS (no Tensor Cores)",
        basis="dense FP16 (no Tensor Cores)",
    ),
    _spec(
        "Tesla P100-PCIE", ("p100 pcie", "p100"), "Pascal",
        250, "NVIDIA Tesla P100 datasheet: P100 PCIe max power 250 W",
        18.7, "NVIDIA Tesla P100 datasheet: P100 PCIe half precision 18.7 TFLOPS (no Tensor Cores)",
        basis="dense FP16 (no Tensor Cores)",
    ),
    _spec(
        "NVIDIA GeForce GTX 1080 Ti", ("gtx 1080 ti",), "Pascal",
        250, "NVIDIA GeForce GTX 1080 Ti specifications: graphics card power 250 W",
        11.3, "NVIDIA GeForce GTX 1080 Ti: 3584 CUDA cores x 1582 MHz boost x 2 = 11.3 TFLOPS FP32 (no "
        "Tensor Cores; FP16 runs at 1/64 rate)",
        basis="dense FP32 (no Tensor Cores)",
    ),
)

UNKNOWN = Spec(
    model=DEFAULT_MODEL,
    patterns=(),
    architecture="unknown",
    tdp_w=DEFAULT_TDP_W,
    tdp_source=f"{_SEED}: unknown model -> 400 W",
    idle_power_w=float(round(DEFAULT_TDP_W * IDLE_FRACTION_ESTIMATE)),
    idle_power_source=f"estimate: {IDLE_FRACTION_ESTIMATE:.0%} of the default 400 W",
    peak_dense_tflops=None,
    peak_source="unknown model: no datasheet",
    tflops_basis="seed default",
    achievable_tflops=DEFAULT_ACHIEVABLE_TFLOPS,
    achievable_source=f"{_SEED}: unknown model -> 100 TFLOPS",
    spec_known=False,
)

_NORM_RE = re.compile(r"[^a-z0-9.]+")


def normalize_name(name: str | None) -> str:
    """``"NVIDIA A100-SXM4-40GB"`` -> ``"nvidia a100 sxm4 40gb"`` (see the module docstring)."""
    if not name:
        return ""
    return _NORM_RE.sub(" ", name.lower()).strip(" .")


def _pattern_index() -> list[tuple[tuple[str, ...], Spec]]:
    index = []
    for spec in SPECS:
        for pattern in spec.patterns:
            index.append((tuple(normalize_name(pattern).split()), spec))
    # most specific first: most tokens, then the longest text
    index.sort(key=lambda item: (-len(item[0]), -len(" ".join(item[0]))))
    return index


_INDEX = _pattern_index()


def _contains(tokens: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    n = len(pattern)
    return any(tokens[i : i + n] == pattern for i in range(len(tokens) - n + 1))


@lru_cache(maxsize=4096)
def lookup(name: str | None) -> Spec:
    """The spec of a device name (case/whitespace/punctuation-insensitive; most specific pattern wins);
    :data:`UNKNOWN` (400 W / 100 TFLOPS, ``spec_known = False``) when nothing matches."""
    tokens = tuple(normalize_name(name).split())
    if not tokens:
        return UNKNOWN
    for pattern, spec in _INDEX:
        if _contains(tokens, pattern):
            return spec
    return UNKNOWN


GPU_SPECS = TableSpec(
    layer="reference",
    name="gpu_specs",
    description=(
        "GPU model spec table used by the efficiency metrics (DESIGN.md 5.5): TDP, typical idle power, "
        "vendor dense tensor peak and the achievable TFLOPS RFU is computed with, each with its source. "
        "The last row is the default for unknown models (spec_known = false)."
    ),
    key=("model",),
    schema=pa.schema(
        [
            _f("model", pa.string(), "Canonical model name", nullable=False),
            _f("match_patterns", pa.string(), "'|'-separated name patterns (whole-token, case-insensitive)"),
            _f("architecture", pa.string(), "GPU architecture"),
            _f("tdp_w", pa.float64(), "Board power / default power limit (W)", nullable=False),
            _f("tdp_source", pa.string(), "Source of tdp_w", nullable=False),
            _f("idle_power_w", pa.float64(), "Typical idle power (W)", nullable=False),
            _f("idle_power_source", pa.string(), "Source of idle_power_w (observed capture or estimate)",
               nullable=False),
            _f("peak_dense_tflops", pa.float64(), "Vendor peak dense tensor TFLOPS (see tflops_basis)"),
            _f("peak_source", pa.string(), "Source of peak_dense_tflops", nullable=False),
            _f("tflops_basis", pa.string(), "What the TFLOPS figures count (precision, accumulate)"),
            _f("achievable_tflops", pa.float64(), "Achievable TFLOPS used for RFU", nullable=False),
            _f("achievable_source", pa.string(), "Source / derivation of achievable_tflops", nullable=False),
            _f("spec_known", pa.bool_(), "False for the unknown-model default row", nullable=False),
        ]
    ),
)


def all_specs() -> tuple[Spec, ...]:
    """Every model row plus the unknown default (last)."""
    return (*SPECS, UNKNOWN)


def spec_table() -> pa.Table:
    """The ``reference/gpu_specs`` table (one row per model, the unknown default last)."""
    rows = [
        {
            "model": s.model,
            "match_patterns": "|".join(s.patterns),
            "architecture": s.architecture,
            "tdp_w": s.tdp_w,
            "tdp_source": s.tdp_source,
            "idle_power_w": s.idle_power_w,
            "idle_power_source": s.idle_power_source,
            "peak_dense_tflops": s.peak_dense_tflops,
            "peak_source": s.peak_source,
            "tflops_basis": s.tflops_basis,
            "achievable_tflops": s.achievable_tflops,
            "achievable_source": s.achievable_source,
            "spec_known": s.spec_known,
        }
        for s in all_specs()
    ]
    return pa.Table.from_pylist(rows, schema=GPU_SPECS.schema)


NAME_MAP_SCHEMA = pa.schema(
    [
        ("device_name", pa.string()),
        ("model", pa.string()),
        ("tdp_w", pa.float64()),
        ("idle_power_w", pa.float64()),
        ("achievable_tflops", pa.float64()),
        ("spec_known", pa.bool_()),
    ]
)


def name_map(names: Iterable[str | None]) -> pa.Table:
    """One row per distinct device name with its resolved spec, for joining in SQL (a null name maps
    to the unknown default)."""
    rows = []
    for name in sorted({n for n in names if n is not None}):
        s = lookup(name)
        rows.append(
            {
                "device_name": name,
                "model": s.model,
                "tdp_w": s.tdp_w,
                "idle_power_w": s.idle_power_w,
                "achievable_tflops": s.achievable_tflops,
                "spec_known": s.spec_known,
            }
        )
    return pa.Table.from_pylist(rows, schema=NAME_MAP_SCHEMA)
