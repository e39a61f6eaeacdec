"""Xid codes and what they mean for a node, after NVIDIA's Xid catalog.

Source: NVIDIA, "XID Errors" (docs.nvidia.com/deploy/xid-errors), the catalog of Xid codes, their causes
and recommended actions. `hardware`: the GPU or its links failed, so the node is drained and must pass the
active checks before it takes work again. `application`: the job's own fault (bad memory access, a kernel
exception): the job fails or retries, the node stays in service. Codes not listed here give a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

HARDWARE, APPLICATION, UNKNOWN = "hardware", "application", "unknown"


@dataclass(frozen=True)
class XidInfo:
    code: int
    kind: str  # HARDWARE | APPLICATION | UNKNOWN
    meaning: str


_TABLE: tuple[XidInfo, ...] = (
    XidInfo(
        13, APPLICATION, "graphics engine exception (a kernel faulted: out-of-range access, bad instruction)"
    ),
    XidInfo(31, APPLICATION, "GPU memory page fault (the program accessed memory it does not own)"),
    XidInfo(43, APPLICATION, "GPU stopped processing (the program's channel was reset)"),
    XidInfo(45, APPLICATION, "preemptive cleanup after an earlier error (the program was killed)"),
    XidInfo(68, APPLICATION, "video processor exception (NVDEC/NVJPG, in the program's stream)"),
    XidInfo(48, HARDWARE, "double-bit ECC error (uncorrectable memory error)"),
    XidInfo(54, HARDWARE, "auxiliary power is not connected to the GPU"),
    XidInfo(61, HARDWARE, "internal micro-controller breakpoint/warning"),
    XidInfo(62, HARDWARE, "internal micro-controller halt"),
    XidInfo(63, HARDWARE, "ECC page retirement or row remapping recording event"),
    XidInfo(64, HARDWARE, "ECC page retirement or row remapper recording failure"),
    XidInfo(74, HARDWARE, "NVLink error"),
    XidInfo(79, HARDWARE, "GPU has fallen off the bus"),
    XidInfo(92, HARDWARE, "high single-bit ECC error rate"),
    XidInfo(94, HARDWARE, "contained ECC error (the GPU needs a reset to remap the row)"),
    XidInfo(95, HARDWARE, "uncontained ECC error (the GPU needs a reset)"),
    XidInfo(119, HARDWARE, "GSP RPC timeout (the GPU System Processor stopped answering)"),
    XidInfo(120, HARDWARE, "GSP error"),
    XidInfo(121, HARDWARE, "C2C (chip-to-chip) link error"),
    XidInfo(140, HARDWARE, "unrecovered ECC error"),
    XidInfo(143, HARDWARE, "GPU initialization failure (GSP firmware)"),
    XidInfo(144, HARDWARE, "NVLink: SAW MVB error"),
    XidInfo(145, HARDWARE, "NVLink: RLW error"),
    XidInfo(146, HARDWARE, "NVLink: TLW error"),
    XidInfo(147, HARDWARE, "NVLink: TREX error"),
    XidInfo(148, HARDWARE, "NVLink: NVLPW control error"),
    XidInfo(149, HARDWARE, "NVLink: NETIR error"),
    XidInfo(150, HARDWARE, "NVLink: MSE error"),
)
XIDS: dict[int, XidInfo] = {x.code: x for x in _TABLE}


def classify(code: int) -> XidInfo:
    """What Xid `code` means; codes outside the table are `unknown` (a warning, never a drain)."""
    return XIDS.get(code, XidInfo(code, UNKNOWN, "not in gpupool's Xid table; see NVIDIA's Xid catalog"))
