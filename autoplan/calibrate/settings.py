"""What a calibration measures: message sizes, shapes and repeats, per device type.

Stage: input to every measuring module of :mod:`autoplan.calibrate`.
Input: a device type (``"cpu"``, ``"cuda"``), or the fields themselves (tests shrink them).
Output: a frozen, validated :class:`Settings`.
Why: the sizes decide what the fits can see (a latency needs tiny messages, a bandwidth
large ones) and the repeats decide how long a calibration takes; both differ by orders of
magnitude between 4 gloo ranks sharing two CPU cores and a node of GPUs. The CPU defaults
keep a 2x2 gloo calibration on a 2-core machine under a minute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autoplan.core.errors import PlanError

__all__ = ["DEVICES", "TURN_NUMEL", "Settings", "human_bytes"]

DEVICES = ("cpu", "cuda")
MiB = 1 << 20
TURN_NUMEL = 4**8
"""Pointwise and reduction ops of at most this many elements are timed in the rotation
of tiny ops (:mod:`autoplan.calibrate.compute`): their dispatch is a sizable share of
their time."""


@dataclass(frozen=True)
class Settings:
    """Sizes, shapes and repeats of one calibration."""

    comm_min_bytes: int = 16
    """Smallest collective message (nccl-tests' size), bytes: prices the latency."""
    comm_max_bytes: int = 32 * MiB
    """Largest collective message, bytes: prices the bandwidth."""
    comm_factor: int = 8
    """Each message size is this many times the one before."""
    repeat_bytes: int = 64 * MiB
    """A size is timed ``repeat_bytes / size`` times, within ``min_repeats..max_repeats``:
    small messages are cheap and noisy, large ones slow and steady."""
    min_repeats: int = 3
    max_repeats: int = 25
    """Small messages get the most: the slowest of several ranks sharing cores varies by
    a factor of ten from one call to the next, and only many repeats pin its median."""
    matmul_n: int = 256
    """Shape classes of matmuls (m, k, n): (n/4)^3, n^3, (2n)^3, (8n, n, n) (tokens times
    a weight) and (n, 8n, n) (a weight's gradient, contracting over tokens); the last
    three are the large ones the peak is read from."""
    pointwise_numels: tuple[int, ...] = tuple(4**k for k in range(4, 12))
    """Element counts of the float32 pointwise (add, mul) and reduction (sum) ops."""
    compute_repeats: int = 5
    compute_min_us: int = 40_000
    """A compute op runs as often as it takes to last this long inside one timed repeat
    (at most ``max_inner`` times), so every rank runs it at once (:mod:`.timing`)."""
    max_inner: int = 50_000
    cold_bytes: int = 64 * MiB
    """Pointwise and reduction operands cycle through buffers of this many bytes in all,
    twice a CPU's last-level cache: a step's ops read values written long before, from
    memory, not from a cache a repeated call keeps warm."""
    sync_burst_calls: int = 2
    """The compute before a collective when its arrival wait is measured
    (:mod:`.sync`): this many square matmuls of ``matmul_n``, about a millisecond, the
    compute between two collectives of a tensor-parallel step, and then 4 and 16 times
    as many (the wait grows with the compute since the ranks last met)."""
    sync_repeats: int = 25

    def __post_init__(self) -> None:
        ints = (
            "comm_min_bytes", "comm_max_bytes", "comm_factor", "repeat_bytes", "min_repeats",
            "max_repeats", "matmul_n", "compute_repeats", "compute_min_us", "max_inner",
            "cold_bytes", "sync_burst_calls", "sync_repeats",
        )  # fmt: skip
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"Settings.{name} ({value!r}) must be an int >= 1.")
        if self.comm_factor < 2:
            raise PlanError(f"Settings.comm_factor ({self.comm_factor}) must be >= 2.")
        if self.comm_max_bytes < self.comm_min_bytes:
            raise PlanError(
                f"Settings.comm_max_bytes ({self.comm_max_bytes}) must be >= comm_min_bytes "
                f"({self.comm_min_bytes})."
            )
        if self.max_repeats < self.min_repeats:
            raise PlanError(
                f"Settings.max_repeats ({self.max_repeats}) must be >= min_repeats "
                f"({self.min_repeats})."
            )
        if self.matmul_n % 4:
            raise PlanError(f"Settings.matmul_n ({self.matmul_n}) must be a multiple of 4.")
        if not self.pointwise_numels or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.pointwise_numels
        ):
            raise PlanError(
                f"Settings.pointwise_numels ({self.pointwise_numels!r}) must be ints >= 1."
            )

    @staticmethod
    def for_device(device: str, **changes: Any) -> Settings:
        """The defaults for ``device`` (``cpu``: gloo ranks sharing a CPU; ``cuda``: GPUs,
        messages to 512 MiB and matmuls 8x larger), with ``changes`` applied."""
        if device not in DEVICES:
            raise PlanError(f"device {device!r} is not one calibrate measures; allowed: cpu, cuda.")
        base = Settings()
        if device == "cuda":
            base = replace(
                base,
                comm_max_bytes=256 * MiB,
                repeat_bytes=2048 * MiB,
                matmul_n=2048,
                pointwise_numels=tuple(4**k for k in range(5, 15)),
                compute_repeats=10,
                compute_min_us=2_000,
                cold_bytes=256 * MiB,  # an H100's L2 is 50 MB
                sync_burst_calls=30,
            )
        return replace(base, **changes)

    def comm_sizes(self) -> list[int]:
        """The message sizes, smallest first."""
        sizes, size = [], self.comm_min_bytes
        while size <= self.comm_max_bytes:
            sizes.append(size)
            size *= self.comm_factor
        return sizes

    def repeats(self, nbytes: int) -> int:
        """Timed repeats of one message size."""
        return max(self.min_repeats, min(self.max_repeats, self.repeat_bytes // max(nbytes, 1)))

    def matmul_shapes(self) -> list[tuple[str, tuple[int, int, int], bool]]:
        """(class, (m, k, n), large) for each matmul shape class."""
        n = self.matmul_n
        return [
            ("small", (n // 4, n // 4, n // 4), False),
            ("square", (n, n, n), False),
            ("large", (2 * n, 2 * n, 2 * n), True),
            ("tokens", (8 * n, n, n), True),
            ("wgrad", (n, 8 * n, n), True),
        ]

    def attention_shapes(self) -> list[tuple[int, int, int, int]]:
        """(batch, heads, sequence, head dim) of the attention samples: a short sequence
        of narrow heads, and ``matmul_n`` tokens of 64- and 128-wide heads."""
        n = self.matmul_n
        return [(2, 8, n // 2, 32), (2, 8, n, 64), (2, 8, n, 128)]

    def sync_bursts(self) -> list[int]:
        """The matmul calls before each measured collective: ``sync_burst_calls`` x 1, 4, 16."""
        return [self.sync_burst_calls * 4**k for k in range(3)]

    def describe(self) -> str:
        """One line for a topology file's header."""
        sizes = self.comm_sizes()
        return (
            f"collectives at {len(sizes)} sizes, {human_bytes(sizes[0])} to {human_bytes(sizes[-1])} "
            f"(x{self.comm_factor}), {self.min_repeats}-{self.max_repeats} repeats; "
            f"float32 and bfloat16 matmuls at {len(self.matmul_shapes())} shapes "
            f"(n = {self.matmul_n}); add, mul, sum at {len(self.pointwise_numels)} "
            f"sizes on operands cycling through {human_bytes(self.cold_bytes)}; causal "
            f"attention at {len(self.attention_shapes())} shapes; 7 tiny ops, 6 views and the "
            f"pointwise ops of at most {TURN_NUMEL // 1024} Ki elements in turn; "
            f"{self.compute_repeats} repeats each; a collective's arrival wait on every "
            f"group after {', '.join(map(str, self.sync_bursts()))} matmuls, "
            f"{self.sync_repeats} repeats"
        )


def human_bytes(n: float) -> str:
    """``8 B``, ``32 KiB``, ``512 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
