"""`inferwatch gpu snapshot [--json]`: one NVML reading per GPU."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `gpu` command group."""
    parser = subparsers.add_parser("gpu", help="Read the GPUs through NVML.")
    sub = parser.add_subparsers(dest="gpu_command", metavar="SUBCOMMAND", required=True)
    snapshot = sub.add_parser("snapshot", help="One NVML reading per GPU (exit 1 when NVML is unavailable).")
    snapshot.add_argument("--json", action="store_true", help="One JSON object with a list of GPUs.")
    snapshot.set_defaults(func=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    from exporters.errors import NvmlUnavailable
    from exporters.nvml import NvmlReader, load_pynvml

    try:
        reader = NvmlReader(load_pynvml())
        reader.open()
    except NvmlUnavailable as err:
        print(f"inferwatch: {err} (no NVIDIA driver or GPU on this machine?)", file=sys.stderr)
        return 1
    try:
        snap = reader.read()
    finally:
        reader.close()
    if args.json:
        payload = dataclasses.asdict(snap)
        print(json.dumps(payload))
        return 0
    print(f"driver {snap.driver_version}  CUDA {snap.cuda_driver_version}  GPUs {snap.count}")
    print(f"{'gpu':>3}  {'up':>2}  {'memory used / total (MiB)':>26}  {'util':>5}  {'power / limit (W)':>17}  "
          f"{'temp':>4}  name")
    for g in snap.gpus:
        mem = (f"{(g.memory_used or 0) / 2**20:,.0f} / {(g.memory_total or 0) / 2**20:,.0f}"
               if g.memory_total else "-")
        util = f"{g.utilization:.0%}" if g.utilization is not None else "-"
        power = f"{g.power_watts:.0f} / {g.power_limit_watts:.0f}" if g.power_watts is not None and \
            g.power_limit_watts is not None else "-"
        temp = f"{g.temperature_celsius:.0f}" if g.temperature_celsius is not None else "-"
        print(f"{g.index:>3}  {int(g.up):>2}  {mem:>26}  {util:>5}  {power:>17}  {temp:>4}  {g.name}")
    return 0
