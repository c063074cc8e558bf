"""Peak dense 16-bit (bf16 = fp16 on these parts) tensor FLOP/s per device, for MFU without user input.

Figures are the vendors' dense (not 2:4 sparse) numbers. Rows are searched in order, first match
wins, so narrower names (GH200, H100 NVL) stand before the broader ones they contain (H200, H100).
`metrics.peak_flops` overrides the table. No torch import: the table is pure data.
"""

from __future__ import annotations

import re

# (pattern searched in the lower-cased torch.cuda.get_device_name(), an example name, FLOP/s)
PEAK_FLOPS_TABLE: tuple[tuple[str, str, float], ...] = (
    (r"gb200", "NVIDIA GB200", 2500e12),
    (r"b200", "NVIDIA B200", 2250e12),
    (r"b100", "NVIDIA B100", 1750e12),
    (r"gh200", "NVIDIA GH200 480GB", 989e12),
    (r"h200 nvl", "NVIDIA H200 NVL", 835e12),
    (r"h200", "NVIDIA H200", 989e12),
    (r"h100 nvl", "NVIDIA H100 NVL", 835e12),
    (r"h100 pcie", "NVIDIA H100 PCIe", 756e12),
    (r"h100", "NVIDIA H100 80GB HBM3", 989e12),  # SXM
    (r"h800", "NVIDIA H800", 989e12),
    (r"h20\b", "NVIDIA H20", 148e12),
    (r"a100", "NVIDIA A100-SXM4-80GB", 312e12),  # SXM and PCIe alike
    (r"a800", "NVIDIA A800-SXM4-80GB", 312e12),
    (r"a10g", "NVIDIA A10G", 70e12),  # AWS's variant of the A10
    (r"a10\b", "NVIDIA A10", 125e12),
    (r"l40s", "NVIDIA L40S", 362e12),
    (r"l40\b", "NVIDIA L40", 181e12),
    (r"\bl4\b", "NVIDIA L4", 121e12),
    (r"rtx a6000", "NVIDIA RTX A6000", 155e12),
    (r"mi300x", "AMD Instinct MI300X", 1307e12),
    (r"mi250x", "AMD Instinct MI250X", 383e12),
)


def peak_flops_for(device_name: str) -> float | None:
    """The table's peak for a device name (torch.cuda.get_device_name), or None when not listed."""
    name = device_name.lower()
    for pattern, _, peak in PEAK_FLOPS_TABLE:
        if re.search(pattern, name):
            return peak
    return None


def device_peak_flops(configured: float, device_name: str | None) -> float:
    """The configured peak when set (> 0), else the table's for this device; 0 when unknown."""
    if configured > 0:
        return configured
    if device_name is None:
        return 0.0
    return peak_flops_for(device_name) or 0.0
