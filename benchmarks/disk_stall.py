"""The 45B disk-node stall (results/h100/large_models_v2) in miniature on CPUs: AdamW steps of `--layers` tanh-Linear
layers (fp32, 256 x 256 tiles) under a host memory limit and a disk node, printing after every step each memory
node's use and what fills it (nt.memory_nodes(): valid, sole, copies = valid but not sole, stale, transfers in,
other = used beyond live tiles), in MiB. When no step ends for `--stall-s` seconds it prints the nodes once more,
"stalled", and exits with 3.

    python -m benchmarks.disk_stall [--host-memory-limit 20MiB] [--disk-limit 18MiB] [--width 640] [--layers 6]
                                    [--steps 4] [--numa2]

`--numa2` lets hwloc see two NUMA nodes (HWLOC_SYNTHETIC, STARPU_USE_NUMA=1), one CPU worker on each, so that host
RAM is two memory nodes, each with half the host limit: a tile can then be valid on a node other than the host
RAM that the disk writes to and reads from, as it is on the GPU of the 45B run. A CPU-only box has one NUMA node
and no GPU, so without it a tile's copies are in host RAM and on the disk only."""
import argparse
import os
import sys
import tempfile
import threading
import time

MIB = 2**20


def nodes_text(nt):
    parts = []
    for n in nt.memory_nodes():
        copies = n["valid_bytes"] - n["sole_bytes"]
        parts.append(f"{n['name']}: used {n['used_bytes'] / MIB:.1f}/{n['total_bytes'] / MIB:.0f}, valid "
                     f"{n['valid_bytes'] / MIB:.1f} (sole {n['sole_bytes'] / MIB:.1f}, copies {copies / MIB:.1f}), "
                     f"stale {n['stale_bytes'] / MIB:.1f}, transfers in {n['requested_bytes'] / MIB:.1f}, other "
                     f"{(n['used_bytes'] - n['allocated_bytes']) / MIB:.1f}")
    return "; ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host-memory-limit", default="20MiB")
    p.add_argument("--disk-limit", default="18MiB")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--stall-s", type=float, default=15.0)
    p.add_argument("--numa2", action="store_true", help="two NUMA nodes of host RAM (see above)")
    args = p.parse_args(argv)
    if args.numa2:
        os.environ["HWLOC_SYNTHETIC"] = "numa:2 pu:1"
        os.environ["STARPU_USE_NUMA"] = "1"
    import torch
    import nntile_torch as nt
    disk = tempfile.mkdtemp(prefix="nt_disk_stall_")
    nt.init(ncpus=2, ncuda=0, host_memory_limit=args.host_memory_limit, disk_path=disk, disk_limit=args.disk_limit,
            scheduler="eager")
    last = [time.monotonic()]

    def guard():
        while time.monotonic() - last[0] < args.stall_s:
            time.sleep(0.2)
        print("stalled:", nodes_text(nt), flush=True)
        os._exit(3)

    threading.Thread(target=guard, daemon=True).start()
    torch.manual_seed(0)
    layers = [nt.nn.Linear(args.width, args.width, tile_size=256) for _ in range(args.layers)]
    opt = nt.optim.AdamW([q for m in layers for q in m.parameters()], lr=1e-2)
    x = torch.randn(48, args.width)
    print(f"patch level {nt.runtime.starpu_patch_level()}; start:", nodes_text(nt), flush=True)
    for step in range(args.steps):
        t0 = time.monotonic()
        y = x
        for m in layers:
            y = torch.tanh(m(y))
        loss = (y * y).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.6f} {time.monotonic() - t0:.2f} s:", nodes_text(nt), flush=True)
        last[0] = time.monotonic()
    print("done")
    nt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
