"""Does the GPU watch tell a process that holds an idle CUDA context from one that works? (measure/device.py)

An H100 run once made every case inconclusive, and exited 0, because another process kept an idle CUDA context
open. This starts, one at a time: nothing (the control), a process that creates a CUDA context and sleeps, and
a process that runs matmuls in a loop (benchmarks/gpu_load.py). Beside each, a watcher process times its own
matmuls for `--seconds` under Disturbances (start, a block every ~50 ms, stop), then asks wait_quiet for up to
2 s; the table shows what it reported and NVML's per-process samples of the window (where the FOREIGN_UTIL
threshold is judged: an idle context should read 0% or have no sample).

The watcher is a process of its own: the loads are this script's children, and Disturbances never counts the
processes of its own session or those it started (device._sibling).

    python benchmarks/idle_context_gpu.py [--device cuda:0] [--seconds 3]

Exit status: 0 when the idle context was not reported and the matmul loop was, named, by the watch and by
wait_quiet; 1 when not; 2 when the control was disturbed or a load never reached the GPU (no verdict); 0 with
a message where there is no GPU, torch or nvidia-ml-py (pynvml).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IDLE = (
    "import sys, time, torch; torch.zeros(1, device=sys.argv[1]); torch.cuda.synchronize(sys.argv[1]); time.sleep(600)"
)
BLOCK_S = 0.05  # about what one block of a small case takes: the watch reads NVML once per block


def watch(device: str, seconds: float) -> dict[str, Any]:
    """The watcher: its own matmuls for `seconds` under Disturbances, as the plugin times a case."""
    import torch

    sys.path.insert(0, str(ROOT))
    from pytest_perfguard.research import Disturbances

    if not torch.cuda.is_available():
        return {"skip": "torch sees no CUDA device"}
    a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    b = torch.randn_like(a)
    (a @ b).sum().item()
    d = Disturbances.open(device)
    if d is None:
        return {"error": "NVML did not open this GPU (Disturbances.open gave None)"}
    d.start()
    first, disturbed, blocks = "", 0, 0
    raw: dict[str, list[int]] = {}  # pid: samples, max SM %, max memory %
    raw_last = d.last_seen
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        while time.monotonic() - t0 < BLOCK_S:
            for _ in range(8):
                a @ b
            torch.cuda.synchronize(device)
        blocks += 1
        raw_last = tally(d, raw, raw_last)
        message = d.block()
        if message:
            disturbed += 1
            first = first or message
    at_stop = d.stop()
    first = first or (at_stop[0] if at_stop else "")
    newest = tally(d, raw, raw_last)
    try:
        holders = sorted(int(p.pid) for p in d.nv.nvmlDeviceGetComputeRunningProcesses(d.handle))
    except Exception:
        holders = []
    stamp_minus_wall = round(newest / 1e6 - time.time(), 3) if newest else None
    quiet, waited, seen = d.wait_quiet(2.0, poll_s=0.25)
    return {
        "pid": os.getpid(),
        "blocks": blocks,
        "disturbed": disturbed,
        "first": first,
        "stop": at_stop,
        "samples": raw,
        "holders": holders,
        # NVML's time stamp against the wall clock: whether they are one clock (us since the epoch)
        "stamp_minus_wall_s": stamp_minus_wall,
        "quiet": quiet,
        "waited_s": round(waited, 2),
        "seen": seen,
    }


def tally(d: Any, raw: dict[str, list[int]], last: int) -> int:
    """Adds NVML's samples newer than `last` to `raw`, read apart from the watch's own reads; the newest stamp.
    NVML answers with each process's newest sample alone, so this reads once per block as the watch does."""
    try:
        samples = d.nv.nvmlDeviceGetProcessUtilization(d.handle, last)
    except Exception:  # NotFound: no process did anything NVML sampled
        return last
    for s in samples:
        n, sm, mem = raw.get(str(s.pid), [0, 0, 0])
        raw[str(s.pid)] = [n + 1, max(sm, int(s.smUtil)), max(mem, int(s.memUtil))]
        last = max(last, int(s.timeStamp))
    return last


def listed(nv: Any, handle: Any, pid: int) -> bool:
    try:
        return pid in {int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:
        return False


def run_watcher(device: str, seconds: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PERFGUARD_SESSION_PIDS")}
    out = subprocess.run(
        [sys.executable, __file__, "--watch", "--device", device, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=seconds + 120,
    )
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": f"watcher exited {out.returncode}: {out.stderr.strip()[-400:]}"}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seconds", type=float, default=3.0, help="the timed window beside each load")
    ap.add_argument("--watch", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.watch:
        print(json.dumps(watch(args.device, args.seconds)))
        return 0

    # This process starts no CUDA context (no torch here): it would be one more idle holder on the GPU.
    if importlib.util.find_spec("torch") is None:
        print("idle_context_gpu: skipped: torch is not installed")
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        if int(pynvml.nvmlDeviceGetCount()) == 0:
            raise RuntimeError("NVML sees no GPU")
    except Exception as exc:
        print(f"idle_context_gpu: skipped: no GPU through NVML ({type(exc).__name__}: {exc})")
        return 0
    index = int(args.device.split(":")[1]) if ":" in args.device else 0
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)  # NVML's order: the script assumes no CUDA_VISIBLE_DEVICES

    scenarios: list[tuple[str, list[str] | None]] = [
        ("nothing else", None),
        ("idle CUDA context", [sys.executable, "-c", IDLE, args.device]),
        ("matmul loop", [sys.executable, str(ROOT / "benchmarks" / "gpu_load.py"), "--device", args.device]),
    ]
    rows, verdict = [], 0
    for name, command in scenarios:
        load = None if command is None else subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            if load is not None:
                deadline = time.monotonic() + 90
                while not listed(pynvml, handle, load.pid) and load.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not listed(pynvml, handle, load.pid):
                    print(f"{name}: pid {load.pid} never showed on the GPU (NVML in another PID namespace?)")
                    verdict = max(verdict, 2)
                    continue
                time.sleep(1.0)  # the loop past its first allocations
            r = run_watcher(args.device, args.seconds)
        finally:
            if load is not None:
                load.terminate()
                try:
                    load.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    load.kill()
                    load.wait()
        if "skip" in r:
            print(f"idle_context_gpu: skipped: {r['skip']}")
            return 0
        if "error" in r:
            print(f"{name}: {r['error']}")
            verdict = max(verdict, 2)
            continue
        pid = None if load is None else load.pid
        named = pid is not None and f"pid {pid} " in r["first"]
        if command is None:
            ok, problem = not r["first"] and r["quiet"], "the control was disturbed: the GPU is not free"
            verdict = max(verdict, 0 if ok else 2)
        elif name.startswith("idle"):
            ok, problem = not named and r["quiet"] and f"pid {pid} " not in r["seen"], "the idle context was reported"
            verdict = max(verdict, 0 if ok else 1)
        else:
            ok = named and not r["quiet"] and f"pid {pid} " in r["seen"]
            problem = "the matmul loop was not reported, named, by both"
            verdict = max(verdict, 0 if ok else 1)
        rows.append((name, pid, r, ok, problem))

    print(f"\n{'load':<18} {'pid':>7}  {'blocks':>13}  {'wait_quiet':<16} first report")
    for name, pid, r, ok, _problem in rows:
        blocks = f"{r['disturbed']}/{r['blocks']} disturbed"
        wait = f"{'quiet' if r['quiet'] else 'not quiet'} {r['waited_s']:.1f} s"
        print(f"{name:<18} {pid or '-':>7}  {blocks:>13}  {wait:<16} {r['first'] or '-'}{'' if ok else '  <- WRONG'}")
    print("\nNVML per-process samples of each window (pid: samples, max SM %, max memory %; watcher pid in []):")
    for name, _pid, r, _ok, _problem in rows:
        samples = ", ".join(f"{p}: {n}, {sm}%, {mem}%" for p, (n, sm, mem) in sorted(r["samples"].items()))
        print(f"  {name:<18} [{r['pid']}] {samples or 'none'}; holding a context: {r['holders']}")
    print(f"NVML's newest time stamp minus the wall clock (s): {[r['stamp_minus_wall_s'] for _, _, r, _, _ in rows]}")
    for name, _pid, r, ok, problem in rows:
        if not ok:
            print(f"{name}: {problem} (wait_quiet saw: {r['seen'] or 'nothing'})")
    print("verdict:", {0: "ok", 1: "WRONG", 2: "no verdict"}[verdict])
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
