"""Tests of exporters.nvml against the fake NVML, which raises pynvml's real exception classes."""

from __future__ import annotations

import threading

import pynvml
import pytest

from exporters.errors import NvmlUnavailable
from exporters.nvml import NvmlReader, XidWatcher
from tests.fakes.nvml import H200_RESERVED, H200_TOTAL, FakeNvml


def _reader(fake: FakeNvml) -> NvmlReader:
    reader = NvmlReader(fake, clock=lambda: 1_800_000_000.0 + fake.now)
    reader.open()
    return reader


def test_eight_gpus_are_read_in_base_units() -> None:
    """Eight GPUs give bytes, ratios, watts, joules and hertz from NVML's MiB-free raw units."""
    fake = FakeNvml(8)
    snap = _reader(fake).read()
    assert snap.count == 8
    assert [g.index for g in snap.gpus] == list(range(8))
    gpu = snap.gpus[3]
    assert gpu.up
    assert gpu.uuid == fake.gpus[3].uuid
    assert gpu.memory_total == H200_TOTAL
    assert gpu.memory_reserved == H200_RESERVED
    assert gpu.memory_used == 2 * 1024**3
    assert gpu.utilization == 0.5
    assert gpu.power_watts == 350.0
    assert gpu.power_limit_watts == 700.0
    assert gpu.energy_joules == 1000.0
    assert gpu.sm_clock_hertz == 1980e6
    assert gpu.processes == ((1003, 1024**3),)
    assert snap.driver_version == "575.57.08"
    assert snap.cuda_driver_version == "12.9"


def test_a_gpu_lost_mid_run_goes_down_while_the_others_are_served() -> None:
    """After GPU 5 falls off the bus it reads up=0 and is no longer queried; the other seven stay up."""
    fake = FakeNvml(8)
    reader = _reader(fake)
    reader.read()
    fake.lose(5)
    fake.advance(5)
    snap = reader.read()
    assert [g.up for g in snap.gpus] == [True] * 5 + [False] + [True] * 2
    assert snap.gpus[5].uuid == fake.gpus[5].uuid
    calls_before = fake.calls["nvmlDeviceGetPowerUsage"]
    reader.read()
    assert fake.calls["nvmlDeviceGetPowerUsage"] == calls_before + 7
    assert (5, fake.gpus[5].uuid, "device", "NVMLError_GpuIsLost", 1) in snap.errors


def test_unsupported_calls_are_skipped_for_that_gpu_and_counted_once() -> None:
    """A NotSupported or FunctionNotFound call is counted once, omitted, and not tried again on that GPU."""
    fake = FakeNvml(2)
    fake.gpus[1].unsupported.add("nvmlDeviceGetTotalEnergyConsumption")
    fake.gpus[1].missing.add("nvmlDeviceGetMemoryInfo_v2")
    reader = _reader(fake)
    reader.read()
    snap = reader.read()
    assert snap.gpus[1].energy_joules is None
    assert snap.gpus[0].energy_joules == 1000.0
    assert snap.gpus[1].memory_reserved is None
    assert snap.gpus[1].memory_used == fake.gpus[1].used + H200_RESERVED  # v1 counts reserved as used
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2 + 1
    uuid = fake.gpus[1].uuid
    assert (1, uuid, "nvmlDeviceGetTotalEnergyConsumption", 1) in snap.unsupported


def test_process_call_library_mismatch_counts_as_unsupported() -> None:
    """NVMLLibraryMismatchError (not an NVMLError) from the process call is treated as unsupported."""
    fake = FakeNvml(1)
    fake.gpus[0].missing.add("nvmlDeviceGetComputeRunningProcesses_v3")
    snap = _reader(fake).read()
    assert snap.gpus[0].processes == ()
    assert snap.unsupported[0][2] == "nvmlDeviceGetComputeRunningProcesses"


def test_memory_growth_and_energy_follow_the_clock() -> None:
    """Memory grows at the configured rate and energy integrates power over time."""
    fake = FakeNvml(1)
    fake.gpus[0].growth_bytes_per_s = 1024**2
    reader = _reader(fake)
    first = reader.read().gpus[0]
    fake.advance(10)
    second = reader.read().gpus[0]
    assert second.memory_used - first.memory_used == 10 * 1024**2
    assert second.energy_joules - first.energy_joules == pytest.approx(3500.0)


def test_read_energy_reads_only_the_energy_counter() -> None:
    """read_energy gives each opened GPU's joules since driver load, advancing at the counter's own rate."""
    fake = FakeNvml(2)
    fake.gpus[1].energy_rate_mw = 100_000
    reader = _reader(fake)
    reader.read()
    before = fake.calls.copy()
    first = reader.read_energy()
    fake.advance(10)
    second = reader.read_energy()
    assert [(i, uuid) for i, uuid, _ in second] == [(0, fake.gpus[0].uuid), (1, fake.gpus[1].uuid)]
    assert [b[2] - a[2] for a, b in zip(first, second, strict=True)] == pytest.approx([3500.0, 1000.0])
    assert set(fake.calls - before) == {"nvmlDeviceGetTotalEnergyConsumption"}


def test_read_energy_marks_an_unsupported_counter_and_a_lost_gpu() -> None:
    """NotSupported gives None and is counted once and not retried; GpuIsLost gives None and marks the GPU down."""
    fake = FakeNvml(3)
    fake.gpus[1].unsupported.add("nvmlDeviceGetTotalEnergyConsumption")
    reader = _reader(fake)
    reader.read()
    fake.lose(2)
    for _ in range(2):
        readings = reader.read_energy()
        assert [joules is None for _, _, joules in readings] == [False, True, True]
    snap = reader.read()
    assert (1, fake.gpus[1].uuid, "nvmlDeviceGetTotalEnergyConsumption", 1) in snap.unsupported
    # The first read asks all three; later only GPU 0 is asked, plus GPU 2 once, when it is found lost.
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3 + 2 + 1 + 1
    assert not snap.gpus[2].up
    assert (2, fake.gpus[2].uuid, "device", "NVMLError_GpuIsLost", 1) in snap.errors


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_NoPermission],
    ids=["no library", "no driver", "no permission"],
)
def test_no_nvml_raises_nvml_unavailable(error: type[pynvml.NVMLError]) -> None:
    """Every way NVML can fail to initialise becomes one NvmlUnavailable naming the cause."""
    with pytest.raises(NvmlUnavailable, match=error.__name__):
        NvmlReader(FakeNvml(init_error=error)).open()


def test_xid_events_are_counted_by_gpu_and_code() -> None:
    """Queued XID events are counted per GPU and code; XID 79 also marks the GPU lost."""
    fake = FakeNvml(4)
    reader = _reader(fake)
    reader.read()
    watcher = XidWatcher(reader, timeout_ms=1)
    assert watcher.register() == 4
    fake.inject_xid(2, 13, count=3)
    fake.inject_xid(0, 48)
    fake.lose(3)
    while watcher.poll_once():
        pass
    counts = {(x.index, x.xid): x.count for x in reader.xid_counts()}
    assert counts == {(2, 13): 3, (0, 48): 1, (3, 79): 1}
    assert reader.read().gpus[3].up is False


def test_xid_watcher_thread_stops_when_asked() -> None:
    """run() polls until the stop event is set and frees the event set."""
    fake = FakeNvml(1)
    reader = _reader(fake)
    reader.read()
    watcher = XidWatcher(reader, timeout_ms=1)
    fake.inject_xid(0, 94)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
