"""GPU check: `inferwatch gpu snapshot --json` against `nvidia-smi --query-gpu` on a machine with a GPU.

Passes when, for every GPU (matched by UUID), memory used agrees within 1 % and power draw within 5 %
of the larger of the two readings (floors: 1 GiB and 10 W, so an idle GPU is not judged on noise).
Prints a short table; exit 0 on agreement, 1 on a mismatch, 2 without a GPU, a driver or nvidia-smi.

Run: .venv/bin/python benchmarks/gpu_check.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUERY = "uuid,index,name,memory.used,memory.total,power.draw,temperature.gpu,utilization.gpu,driver_version"
TOLERANCES = {"memory_used": 0.01, "power": 0.05}
"""Relative tolerances: memory used vs the larger of the two readings (floor 1 GiB), power vs the larger."""


def _smi() -> dict[str, dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    rows = {}
    for line in out.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        row = dict(zip(QUERY.split(","), values, strict=True))
        rows[row["uuid"]] = row
    return rows


def _ours() -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "serving.cli", "gpu", "snapshot", "--json"],
        check=False, capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"inferwatch gpu snapshot failed ({out.returncode}): {out.stderr.strip()}")
    return {g["uuid"]: g for g in json.loads(out.stdout)["gpus"]}


def _close(a: float, b: float, tolerance: float, floor: float = 0.0) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b), floor)


def main() -> int:
    """Compare both readings and print the table."""
    if shutil.which("nvidia-smi") is None:
        print("gpu_check: nvidia-smi not found; run this on a machine with an NVIDIA GPU")
        return 2
    try:
        ours = _ours()
        smi = _smi()
    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
        print(f"gpu_check: {err}")
        return 2
    ok = True
    print(f"{'gpu':>3}  {'mem used MiB (ours / smi)':>27}  {'power W (ours / smi)':>22}  result  name")
    for uuid, row in sorted(smi.items(), key=lambda kv: int(kv[1]["index"])):
        g = ours.get(uuid)
        if g is None:
            print(f"{row['index']:>3}  missing from inferwatch's snapshot  FAIL  {row['name']}")
            ok = False
            continue
        mem_ours = float(g["memory_used"] or 0) / 2**20
        mem_smi = float(row["memory.used"])
        pow_ours = float(g["power_watts"]) if g["power_watts"] is not None else float("nan")
        pow_smi = float(row["power.draw"]) if row["power.draw"] not in ("[N/A]", "") else float("nan")
        good = _close(mem_ours, mem_smi, TOLERANCES["memory_used"], floor=1024.0) and \
            _close(pow_ours, pow_smi, TOLERANCES["power"], floor=10.0)
        ok = ok and good
        print(f"{row['index']:>3}  {mem_ours:>12,.0f} / {mem_smi:>12,.0f}  {pow_ours:>10.1f} / {pow_smi:>9.1f}"
              f"  {'ok' if good else 'FAIL':>6}  {row['name']}")
    extra = sorted(set(ours) - set(smi))
    if extra:
        print(f"in inferwatch's snapshot but not in nvidia-smi: {', '.join(extra)}")
        ok = False
    print("gpu_check:", "memory within 1 %, power within 5 %" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
