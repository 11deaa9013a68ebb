"""KV-cache handoff between two Ray actors on this machine: the object store vs Ray's
tensor transport over a gloo collective group vs ray.util.collective send/recv.

    flock /tmp/wattwise-ray.lock wattwise bench kv-transfer [--sizes-mb 1,4,16,64,256] [--reps 5]

Each transport gets its own producer/consumer pair (an actor joins one collective group
per backend). A transfer is timed from the driver: the producer hands over a float32
tensor of the size (MiB) and the consumer touches it, so latency includes Ray's task
overhead (the ~1 MB row shows that floor). The last lines compare the measured
bandwidths with the link energy/kv_transfer.py assumes for GPU machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

MB = 2**20


def _actor_class():
    import ray
    import torch
    from ray.util import collective
    from ray.util.collective.types import Backend

    # Ray 2.60: a receiver without enable_tensor_transport hangs on RDT refs; ray.remote's
    # typed overloads do not list the option yet.
    @ray.remote(enable_tensor_transport=True)  # type: ignore[call-overload]
    class Endpoint:
        def __init__(self) -> None:
            self.tensor = torch.empty(0)

        def make(self, nbytes: int) -> int:
            self.tensor = torch.ones(nbytes // 4, dtype=torch.float32)
            return self.tensor.numel()

        def via_object_store(self) -> torch.Tensor:
            return self.tensor

        @ray.method(tensor_transport="gloo")
        def via_gloo(self) -> torch.Tensor:
            return self.tensor

        def take(self, tensor: torch.Tensor) -> float:
            return float(tensor[-1]) + tensor.numel()

        def join(self, world_size: int, rank: int, group: str) -> None:
            collective.init_collective_group(world_size, rank, backend=Backend("gloo"), group_name=group)

        def send(self, dst_rank: int, group: str) -> None:
            collective.send(self.tensor, dst_rank, group_name=group)

        def recv(self, numel: int, src_rank: int, group: str) -> float:
            buf = torch.empty(numel, dtype=torch.float32)
            collective.recv(buf, src_rank, group_name=group)
            return float(buf[-1]) + buf.numel()

    return Endpoint


def _time(fn, reps: int) -> list[float]:
    fn()  # warm-up: connections, first allocation
    out = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench kv-transfer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", default="1,4,16,64,256")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-sendrecv", action="store_true", help="skip ray.util.collective send/recv")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.experimental.collective import create_collective_group

    from energy.hardware import MODELS
    from energy.kv_transfer import KVTransferConfig, KVTransferModel

    ray.init(num_cpus=8, object_store_memory=2 * max(sizes) * MB + 256 * MB, include_dashboard=False,
             log_to_driver=False)
    try:
        endpoint = _actor_class()
        store = [endpoint.remote() for _ in range(2)]
        gloo = [endpoint.remote() for _ in range(2)]
        create_collective_group(gloo, backend="torch_gloo")
        pair = [] if args.no_sendrecv else [endpoint.remote() for _ in range(2)]
        if pair:
            ray.get([a.join.remote(2, rank, "kv-sendrecv") for rank, a in enumerate(pair)])
        print(f"{'MiB':>5} {'transport':>22} {'ms p50':>8} {'ms min':>8} {'MiB/s':>8} {'x store':>8}")
        results: dict[str, dict[int, float]] = {}
        for size in sizes:
            numel = ray.get([a.make.remote(size * MB) for a in (store[0], gloo[0], *pair[:1])])[0]
            runs = {
                "object store": lambda: ray.get(store[1].take.remote(store[0].via_object_store.remote())),
                "tensor transport gloo": lambda: ray.get(gloo[1].take.remote(gloo[0].via_gloo.remote())),
            }
            if pair:
                def send_recv(n: int = numel) -> object:
                    return ray.get([pair[0].send.remote(1, "kv-sendrecv"), pair[1].recv.remote(n, 0, "kv-sendrecv")])

                runs["collective send/recv"] = send_recv
            base = None
            for name, fn in runs.items():
                times = _time(fn, args.reps)
                med = statistics.median(times)
                base = base or med
                results.setdefault(name, {})[size] = size / med
                print(f"{size:>5} {name:>22} {med * 1e3:>8.1f} {min(times) * 1e3:>8.1f} {size / med:>8.0f} "
                      f"{base / med:>8.2f}")
    finally:
        ray.shutdown()
    link = KVTransferConfig()
    model = KVTransferModel(MODELS["llama2-70b"], link)
    per_link_mb_s = link.link_gbps * 1e9 / 8 / MB
    prompt_mb = model.bytes_per_link(2048, 8) / MB
    print(f"\nthe simulator's KV model: {link.link_gbps:.0f} Gb/s per GPU link ({per_link_mb_s:.0f} MiB/s), "
          f"8 links in parallel at TP8; a 2048-token Llama2-70B prompt moves {prompt_mb:.0f} MiB per link in "
          f"{model.serialized_s(2048, 8) * 1e3:.1f} ms serialized")
    for name, by_size in results.items():
        top = max(by_size.values())
        print(f"measured here, {name}: up to {top:.0f} MiB/s = {top / per_link_mb_s:.2f}x one modelled link")
    return 0
