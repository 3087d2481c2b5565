"""The bare cost of one trip into a one-thread pool and back (``run_in_executor`` of a no-op):

    python -m benchmarks.thread_hop [N]

the floor of a plain ``def`` handler's cost per job (BENCHMARKS.md, "Plain def handlers").
Prints the wall and CPU time per trip in microseconds, after 100 warm-up trips.
"""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def _nothing() -> None:
    return None


async def main(n: int) -> None:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        for _ in range(100):
            await loop.run_in_executor(pool, _nothing)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await loop.run_in_executor(pool, _nothing)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"per trip: wall {wall / n * 1e6:.1f} us, CPU {cpu / n * 1e6:.1f} us")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
