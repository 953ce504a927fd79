# ruff: noqa: N802, N815  (the fake mirrors pynvml's camelCase names)
"""A fake ``pynvml`` for tests: N GPUs, lost GPUs, unsupported calls, XID events, memory growth.

It raises pynvml's *real* exception classes (importable without a driver) and re-exports its real
constants, so the exporter's ``except`` clauses are exercised for real. Time is a number the test
advances with :meth:`FakeNvml.advance`: the energy counter advances at each GPU's ``energy_rate_mw``
(its power reading when unset) and memory grows at its ``growth_bytes_per_s``;
:meth:`FakeNvml.reload_driver` starts every energy counter again from zero. Nothing sleeps.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

H200_TOTAL = 150_754_820_096
H200_RESERVED = 614 * 1024 * 1024


@dataclass
class FakeGpu:
    """One fake GPU's state (an H200 profile by default)."""

    index: int
    uuid: str
    name: str = "NVIDIA H200"
    total: int = H200_TOTAL
    reserved: int = H200_RESERVED
    used: int = 2 * 1024**3
    growth_bytes_per_s: float = 0.0
    util_gpu: int = 50
    util_memory: int = 20
    power_mw: int = 350_000
    limit_mw: int = 700_000
    energy_mj: float = 1_000_000.0
    energy_rate_mw: float | None = None
    """Millijoules per second the energy counter gains; None: the power reading (``power_mw``)."""
    temperature: int = 45
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    reasons: int = 0
    ecc: tuple[int, int] = (0, 0)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    lost: bool = False


class FakeNvml:
    """Module-like object with the ``nvml*`` functions the exporter calls."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, count: int = 8, *, init_error: type[pynvml.NVMLError] | None = None) -> None:
        self.gpus = [
            FakeGpu(i, f"GPU-{i:08x}-0000-4000-8000-{i:012x}", processes=[(1000 + i, 1024**3)])
            for i in range(count)
        ]
        self.init_error = init_error
        self.initialised = 0
        self.now = 0.0
        self.calls: collections.Counter[str] = collections.Counter()
        self.events: collections.deque[tuple[int, int]] = collections.deque()
        self.registered: set[int] = set()

    # ---- test controls -------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move time on: energy += energy rate (else power) x dt, memory += growth x dt."""
        self.now += seconds
        for gpu in self.gpus:
            if not gpu.lost:
                gpu.energy_mj += (gpu.power_mw if gpu.energy_rate_mw is None else gpu.energy_rate_mw) * seconds
                gpu.used = min(gpu.total - gpu.reserved, int(gpu.used + gpu.growth_bytes_per_s * seconds))

    def reload_driver(self) -> None:
        """The driver is reloaded: every energy counter (millijoules since driver load) starts from zero."""
        for gpu in self.gpus:
            gpu.energy_mj = 0.0

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: an XID 79 is queued and every later call raises GpuIsLost."""
        self.gpus[index].lost = True
        self.events.append((index, 79))

    def inject_xid(self, index: int, xid: int, count: int = 1) -> None:
        """Queue XID events for a GPU."""
        self.events.extend([(index, xid)] * count)

    # ---- helpers -------------------------------------------------------------------------------
    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        self.calls[call] += 1
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        gpu: FakeGpu = handle.gpu
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if call in gpu.missing:
            raise pynvml.NVMLError_FunctionNotFound()
        if call in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    # ---- lifecycle and system ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "575.57.08"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12090

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        if self.gpus[index].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return SimpleNamespace(gpu=self.gpus[index])

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return int(handle.gpu.index)

    # ---- device queries ------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=f"00000000:{0x18 + gpu.index * 0x10:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if version is not None:
            gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo_v2")
            free = gpu.total - gpu.reserved - gpu.used
            return SimpleNamespace(version=version, total=gpu.total, reserved=gpu.reserved, free=free, used=gpu.used)
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        free = gpu.total - gpu.reserved - gpu.used
        return SimpleNamespace(total=gpu.total, free=free, used=gpu.total - free)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return gpu.sm_mhz if clock == pynvml.NVML_CLOCK_SM else gpu.mem_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc[error_type]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        if "nvmlDeviceGetComputeRunningProcesses_v3" in gpu.missing:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in gpu.processes
        ]

    # ---- events --------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        return SimpleNamespace(kind="event-set")

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        self.registered.add(gpu.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        while self.events:
            index, xid = self.events.popleft()
            if index in self.registered:
                handle = SimpleNamespace(gpu=self.gpus[index])
                return SimpleNamespace(
                    device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
                    gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF,
                )
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        return None
