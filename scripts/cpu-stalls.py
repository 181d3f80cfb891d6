#!/usr/bin/env python3
"""cpu-stalls.py: takes the CPUs away in bursts, as a hypervisor's steal does on a shared VM.

One process per CPU, pinned to it, at SCHED_FIFO priority 99 (above PulseAudio's real-time
threads and everything else): it sleeps a random 100..PERIOD_MS ms, then spins a random
5..MAX_MS ms, until SECONDS have passed. Nothing on that CPU runs during a spin, so audio
callbacks, the engine thread and the sound server all stall at random moments, as they did in CI.
Needs root (or CAP_SYS_NICE). Used to compare live-audio settings (docs/audio.md):

    python3 scripts/cpu-stalls.py 25 400 30 &   # MAX_MS PERIOD_MS SECONDS
    JITTER_MS=30 bash scripts/e2e-chat.sh 40
"""
import os
import random
import signal
import sys
import time


def stall_cpu(cpu, max_ms, period_ms, seconds):
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))
    rng = random.Random(cpu * 7919 + time.time_ns())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(100, period_ms) / 1e3)
        spin_until = time.monotonic() + rng.uniform(5, max_ms) / 1e3
        while time.monotonic() < spin_until:
            pass


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: cpu-stalls.py MAX_MS PERIOD_MS SECONDS")
    max_ms, period_ms, seconds = (float(a) for a in sys.argv[1:])
    if not (5 <= max_ms and 100 <= period_ms and seconds > 0):
        sys.exit(f"cpu-stalls.py: need MAX_MS >= 5, PERIOD_MS >= 100, SECONDS > 0; got {sys.argv[1:]}")
    children = []
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            try:
                stall_cpu(cpu, max_ms, period_ms, seconds)
            except PermissionError as e:
                print(f"cpu-stalls.py: SCHED_FIFO refused ({e}): run as root", file=sys.stderr)
                os._exit(1)
            os._exit(0)
        children.append(pid)

    def stop(_signum, _frame):
        for child in children:
            os.kill(child, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    for pid in children:
        status |= os.waitpid(pid, 0)[1]
    sys.exit(1 if status else 0)


if __name__ == "__main__":
    main()
