"""NVML readings -> :class:`GpuSnapshot`, field by field, with the ``pynvml`` module injected.

Error policy (shared/reference/gpu.md §2.1): a call that a GPU does not support
(``NVMLError_NotSupported``, ``NVMLError_FunctionNotFound``, ``NVMLError_NoPermission``,
``NVMLLibraryMismatchError``) is remembered, counted once and not tried again on that GPU;
``NVMLError_GpuIsLost`` marks the GPU down (``gpu_up`` 0) and it is no longer queried while the other
GPUs go on; any other ``NVMLError`` is counted by function and class and the reading is omitted for
this collection. No NVML at all raises :class:`~exporters.errors.NvmlUnavailable` from :meth:`open`.
XID errors come from :class:`XidWatcher`, whose :meth:`XidWatcher.run` is meant for a thread.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporters.errors import NvmlUnavailable

CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1), ("applications_clocks", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("sync_boost", 0x10), ("sw_thermal", 0x20), ("hw_thermal", 0x40), ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)
"""Bits of nvmlDeviceGetCurrentClocksEventReasons, with the ``reason`` label each gets."""

_UNSUPPORTED = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment; None where the GPU does not say."""

    index: int
    uuid: str
    up: bool
    name: str = ""
    pci_bus_id: str = ""
    memory_used: int | None = None
    memory_total: int | None = None
    memory_free: int | None = None
    memory_reserved: int | None = None
    utilization: float | None = None
    memory_copy_utilization: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_events: tuple[tuple[str, bool], ...] = ()
    ecc_errors: tuple[tuple[str, int], ...] = ()
    remapped_rows: tuple[tuple[str, int], ...] = ()
    row_remap_pending: bool | None = None
    processes: tuple[tuple[int, int | None], ...] = ()


@dataclass(frozen=True, slots=True)
class XidCount:
    """XID errors of one code on one GPU."""

    index: int
    uuid: str
    xid: int
    count: int
    last_timestamp: float


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """Every GPU at one collection, plus the exporter's own counters so far."""

    driver_version: str
    cuda_driver_version: str
    count: int
    gpus: tuple[GpuReading, ...]
    unsupported: tuple[tuple[int, str, str, int], ...] = ()
    errors: tuple[tuple[int, str, str, str, int], ...] = ()
    xids: tuple[XidCount, ...] = ()
    duration_seconds: float = 0.0


def load_pynvml() -> Any:
    """Import the real ``pynvml`` (from nvidia-ml-py); NvmlUnavailable when it is not installed.

    The import loads no driver; only ``nvmlInit`` does (see :meth:`NvmlReader.open`).
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError as err:
        raise NvmlUnavailable("NVML is unavailable: the nvidia-ml-py package is not installed") from err


class _LostError(Exception):
    """Internal: the GPU answered NVMLError_GpuIsLost."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _events(reasons: int | None) -> tuple[tuple[str, bool], ...]:
    if reasons is None:
        return ()
    return tuple((reason, bool(reasons & bit)) for reason, bit in CLOCK_EVENT_REASONS)


def _class_name(err: BaseException) -> str:
    return type(err).__name__


class NvmlReader:
    """Reads every GPU through an injected ``pynvml``-like module; keeps handles and static facts."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.time) -> None:
        self.nvml = nvml
        self._clock = clock
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._static: dict[int, tuple[str, str, str]] = {}
        self._lost: set[int] = set()
        self._skip: set[tuple[int, str]] = set()
        self._unsupported: dict[tuple[int, str], int] = {}
        self._errors: dict[tuple[int, str, str], int] = {}
        self._xids: dict[tuple[int, int], tuple[int, float]] = {}
        self.driver_version = ""
        self.cuda_driver_version = ""
        self._open = False

    # ---- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML; raises NvmlUnavailable when there is no library, driver or permission."""
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML is unavailable: {_class_name(err)}: {err}") from err
        except OSError as err:
            raise NvmlUnavailable(f"NVML is unavailable: {err}") from err
        self._open = True
        self.driver_version = _text(self._system("nvmlSystemGetDriverVersion") or "")
        cuda = self._system("nvmlSystemGetCudaDriverVersion")
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else ""

    def close(self) -> None:
        """Shut NVML down (errors ignored)."""
        if self._open:
            self._open = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    def _system(self, name: str) -> Any:
        try:
            return getattr(self.nvml, name)()
        except (self.nvml.NVMLError, AttributeError):
            return None

    # ---- per-call policy -----------------------------------------------------------------------
    def _call(self, index: int, name: str, *args: Any, key: str = "", **kwargs: Any) -> Any:
        """Call ``nvml.<name>`` for a GPU under the error policy; ``key`` names the call when it differs."""
        key = key or name
        if (index, key) in self._skip:
            return None
        try:
            return getattr(self.nvml, name)(*args, **kwargs)
        except self.nvml.NVMLError as err:
            cls = _class_name(err)
            if cls == "NVMLError_GpuIsLost":
                raise _LostError from err
            if cls in _UNSUPPORTED:
                self.note_unsupported(index, key)
            else:
                with self._lock:
                    self._errors[(index, key, cls)] = self._errors.get((index, key, cls), 0) + 1
            return None
        except (self.nvml.NVMLLibraryMismatchError, AttributeError):
            self.note_unsupported(index, key)
            return None

    def note_unsupported(self, index: int, name: str) -> None:
        """Remember that a GPU does not support a call, count it, and skip the call from now on."""
        with self._lock:
            self._skip.add((index, name))
            self._unsupported[(index, name)] = self._unsupported.get((index, name), 0) + 1

    # ---- reading -------------------------------------------------------------------------------
    def uuid_of(self, index: int) -> str:
        """The UUID of a GPU seen before, else ``""``."""
        return self._static.get(index, ("", "", ""))[0]

    def handles(self) -> dict[int, Any]:
        """Handles of the GPUs opened so far and not lost."""
        return {i: h for i, h in self._handles.items() if i not in self._lost}

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                return None
            self._handles[index] = handle
            uuid = _text(self._call(index, "nvmlDeviceGetUUID", handle) or "")
            name = _text(self._call(index, "nvmlDeviceGetName", handle) or "")
            pci = self._call(index, "nvmlDeviceGetPciInfo", handle)
            bus = _text(getattr(pci, "busId", "")) if pci is not None else ""
            self._static[index] = (uuid, name, bus)
        return self._handles[index]

    def read(self) -> GpuSnapshot:
        """Collect every GPU once; never raises for one GPU's failure."""
        started = time.perf_counter()
        count = self._system("nvmlDeviceGetCount")
        count = count if isinstance(count, int) and count >= 0 else len(self._handles)
        gpus = []
        for index in range(count):
            gpus.append(self._read_one(index))
        with self._lock:
            unsupported = tuple(
                (i, self.uuid_of(i), call, n) for (i, call), n in sorted(self._unsupported.items())
            )
            errors = tuple(
                (i, self.uuid_of(i), call, cls, n) for (i, call, cls), n in sorted(self._errors.items())
            )
        return GpuSnapshot(
            self.driver_version, self.cuda_driver_version, count, tuple(gpus), unsupported, errors,
            self.xid_counts(), time.perf_counter() - started,
        )

    def _read_one(self, index: int) -> GpuReading:
        if index in self._lost:
            return GpuReading(index, self.uuid_of(index), up=False, name=self._static.get(index, ("", "", ""))[1])
        try:
            handle = self._handle(index)
            if handle is None:
                return GpuReading(index, self.uuid_of(index), up=False)
            return self._measure(index, handle)
        except _LostError:
            self._mark_lost_now(index)
            return GpuReading(index, self.uuid_of(index), up=False, name=self._static.get(index, ("", "", ""))[1])

    def read_energy(self) -> tuple[tuple[int, str, float | None], ...]:
        """(index, uuid, joules since driver load) of every GPU opened so far, from the energy counter alone.

        Cheap enough to call with every engine scrape, so that energy and token deltas share a window.
        None for a GPU that is lost (it is marked lost here if it just fell off the bus), that lacks the
        counter (NVMLError_NotSupported before Volta: remembered and counted like any unsupported call)
        or whose call failed this time.
        """
        out = []
        for index, handle in sorted(self._handles.items()):
            joules = None
            if index not in self._lost:
                try:
                    energy = self._call(index, "nvmlDeviceGetTotalEnergyConsumption", handle)
                except _LostError:
                    self._mark_lost_now(index)
                else:
                    joules = energy / 1000 if energy is not None else None
            out.append((index, self.uuid_of(index), joules))
        return tuple(out)

    def _mark_lost_now(self, index: int) -> None:
        self._lost.add(index)
        with self._lock:
            key = (index, "device", "NVMLError_GpuIsLost")
            self._errors[key] = self._errors.get(key, 0) + 1

    def _measure(self, index: int, h: Any) -> GpuReading:
        nv = self.nvml
        uuid, name, bus = self._static[index]
        errors_before = sum(self._errors.values())
        mem = self._call(
            index, "nvmlDeviceGetMemoryInfo", h, key="nvmlDeviceGetMemoryInfo_v2", version=nv.nvmlMemory_v2
        )
        reserved = getattr(mem, "reserved", None) if mem is not None else None
        if mem is None:
            mem = self._call(index, "nvmlDeviceGetMemoryInfo", h)
        util = self._call(index, "nvmlDeviceGetUtilizationRates", h)
        power = self._call(index, "nvmlDeviceGetPowerUsage", h)
        limit = self._call(index, "nvmlDeviceGetEnforcedPowerLimit", h)
        energy = self._call(index, "nvmlDeviceGetTotalEnergyConsumption", h)
        temp = self._call(index, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        sm = self._call(index, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM, key="nvmlDeviceGetClockInfo_sm")
        memclk = self._call(index, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM, key="nvmlDeviceGetClockInfo_mem")
        reasons = self._call(index, "nvmlDeviceGetCurrentClocksEventReasons", h)
        ecc = []
        for label, kind in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            value = self._call(index, "nvmlDeviceGetTotalEccErrors", h, kind, nv.NVML_VOLATILE_ECC)
            if isinstance(value, int):
                ecc.append((label, value))
        rows = self._call(index, "nvmlDeviceGetRemappedRows", h)
        procs = self._call(index, "nvmlDeviceGetComputeRunningProcesses", h)
        got_nothing = mem is None and util is None and power is None and sum(self._errors.values()) > errors_before
        return GpuReading(
            index=index, uuid=uuid, up=not got_nothing, name=name, pci_bus_id=bus,
            memory_used=getattr(mem, "used", None), memory_total=getattr(mem, "total", None),
            memory_free=getattr(mem, "free", None), memory_reserved=reserved,
            utilization=util.gpu / 100 if util is not None else None,
            memory_copy_utilization=util.memory / 100 if util is not None else None,
            power_watts=power / 1000 if power is not None else None,
            power_limit_watts=limit / 1000 if limit is not None else None,
            energy_joules=energy / 1000 if energy is not None else None,
            temperature_celsius=float(temp) if temp is not None else None,
            sm_clock_hertz=sm * 1e6 if sm is not None else None,
            memory_clock_hertz=memclk * 1e6 if memclk is not None else None,
            clock_events=_events(reasons),
            ecc_errors=tuple(ecc),
            remapped_rows=(("correctable", int(rows[0])), ("uncorrectable", int(rows[1]))) if rows else (),
            row_remap_pending=bool(rows[2]) if rows else None,
            processes=tuple((int(p.pid), p.usedGpuMemory) for p in procs) if procs is not None else (),
        )

    # ---- XID bookkeeping -----------------------------------------------------------------------
    def record_xid(self, index: int, xid: int) -> None:
        """Count one XID event of a GPU (called by the event thread)."""
        now = self._clock()
        with self._lock:
            count, _ = self._xids.get((index, xid), (0, 0.0))
            self._xids[(index, xid)] = (count + 1, now)

    def mark_lost(self, index: int) -> None:
        """Mark a GPU lost (the event thread saw NVMLError_GpuIsLost or XID 79)."""
        self._lost.add(index)

    def xid_counts(self) -> tuple[XidCount, ...]:
        """XID counts so far, by GPU and code."""
        with self._lock:
            return tuple(
                XidCount(i, self.uuid_of(i), xid, n, ts) for (i, xid), (n, ts) in sorted(self._xids.items())
            )


class XidWatcher:
    """Waits for NVML XID events and counts them on the reader; :meth:`run` is a thread's loop body."""

    def __init__(self, reader: NvmlReader, timeout_ms: int = 500) -> None:
        self.reader = reader
        self.timeout_ms = timeout_ms
        self._set: Any = None

    def register(self) -> int:
        """Create the event set and register every GPU for XID events; returns how many registered."""
        nv = self.reader.nvml
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            self._set = None
            return 0
        registered = 0
        for index, handle in self.reader.handles().items():
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._set)
                registered += 1
            except nv.NVMLError:
                self.reader.note_unsupported(index, "nvmlDeviceRegisterEvents")
        return registered

    def poll_once(self) -> bool:
        """Wait up to ``timeout_ms`` for one event and count it; False when none came."""
        nv = self.reader.nvml
        if self._set is None:
            return False
        try:
            data = nv.nvmlEventSetWait_v2(self._set, self.timeout_ms)
        except nv.NVMLError as err:
            if _class_name(err) != "NVMLError_Timeout":
                time.sleep(self.timeout_ms / 1000)  # a failing wait must not spin the thread
            return False
        index = self._index_of(data.device)
        if index is None:
            return False
        xid = int(data.eventData)
        self.reader.record_xid(index, xid)
        if xid == 79:  # "GPU has fallen off the bus"
            self.reader.mark_lost(index)
        return True

    def _index_of(self, device: Any) -> int | None:
        for index, handle in self.reader.handles().items():
            if handle is device:
                return index
        nv = self.reader.nvml
        try:
            return int(nv.nvmlDeviceGetIndex(device))
        except (nv.NVMLError, AttributeError, TypeError, ValueError):
            return None

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; frees the event set at the end."""
        if self._set is None and self.register() == 0:
            return
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self.close()

    def close(self) -> None:
        """Free the event set."""
        nv = self.reader.nvml
        if self._set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._set)
            self._set = None
