"""What the benchmarks say about the machine they run on."""
import os


def busy_warning(threads):
    """Other work on the machine: runs with more threads than idle cores are not meaningful
    (intra-op threads wait at every op's barrier for a thread that is descheduled)."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load + max(threads) > cpus + 0.5:
        print(f"# WARNING: load average {load:.1f} on {cpus} CPUs before starting: timings with "
              f"more threads than idle cores ({max(0.0, cpus - load):.1f}) are unreliable")
