"""The CPU AdamW kernel's throughput (csrc/kernels/adamw.cpp, what StarPU's CPU workers run for the host blocks'
updates beyond GPU memory), built twice from the sources here: with the x86 clones (NNTILE_CPU_CLONES: AVX-512,
AVX2, baseline, the best picked at load time) and with the baseline alone; on 1 thread and on `--threads` threads at
once (each its own tile, as the workers run them), beside torch's fused CPU AdamW (fp32 states) on the same threads.

    python -m benchmarks.cpu_adamw [--threads 14] [--elements 33554432] [--reps 5] [--json out.json]

Needs g++. Elements per second and the memory traffic they mean: fp32 states with the bf16 copy 30 bytes per
element (gradient, weight, two moments read; weight, moments, copy written), bf16 states 22."""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(os.path.dirname(HERE), "csrc", "kernels")

DRIVER = r"""
#include "adamw.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
using namespace nntile::kernels;
int main(int argc, char **argv) {
    int threads = atoi(argv[1]), reps = atoi(argv[3]);
    int64_t n = atoll(argv[2]);
    AdamWScalars s{0.999f, 0.1f, 0.999f, 0.001f, 1e-3f, 0.5f, 1e-8f};
    struct Tile { std::vector<float> g, p, m, v; std::vector<uint16_t> mb, vb, c; };
    std::vector<Tile> tiles(threads);
    for (auto &t : tiles) {
        t.g.assign(n, 1e-3f); t.p.assign(n, 1.f); t.m.assign(n, 0.f); t.v.assign(n, 0.f);
        t.mb.assign(n, 0); t.vb.assign(n, 0); t.c.assign(n, 0);
        for (int64_t i = 0; i < n; ++i) t.g[i] = (float)(i % 1000) * 1e-6f;
    }
    for (int kind = 0; kind < 2; ++kind)
        for (int r = 0; r < reps; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            std::vector<std::thread> ts;
            for (int k = 0; k < threads; ++k)
                ts.emplace_back([&, k] {
                    Tile &t = tiles[k];
                    if (kind == 0) adamw_cpu(n, s, t.g.data(), t.p.data(), t.m.data(), t.v.data(), t.c.data());
                    else adamw_bf16state_cpu(n, s, 7, t.g.data(), t.p.data(), t.mb.data(), t.vb.data(), t.c.data());
                });
            for (auto &t : ts) t.join();
            double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            printf("%s %.6f\n", kind == 0 ? "fp32" : "bf16", d);
        }
}
"""

BYTES = {"fp32": 30, "bf16": 22}


def build(tmp, clones):
    src = os.path.join(tmp, "driver.cpp")
    with open(src, "w") as f:
        f.write(DRIVER)
    exe = os.path.join(tmp, "clones" if clones else "baseline")
    cmd = ["g++", "-O3", "-std=c++20", "-ffp-contract=off", "-fno-math-errno", "-pthread", f"-I{KERNELS}", src,
           os.path.join(KERNELS, "adamw.cpp"), "-o", exe] + ([] if clones else ["-DNNTILE_CPU_CLONES="])
    subprocess.run(cmd, check=True)
    return exe


def run(exe, threads, n, reps):
    out = subprocess.run([exe, str(threads), str(n), str(reps)], capture_output=True, text=True, check=True).stdout
    times = {}
    for line in out.split("\n"):
        if line:
            kind, s = line.split()
            times.setdefault(kind, []).append(float(s))
    return {k: threads * n / statistics.median(v) for k, v in times.items()}  # elements per second


def torch_fused(threads, n, reps):
    import torch
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.ones(threads * n))
    p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    opt.step()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return threads * n / statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                    help="threads at once (default: the cores less 2, as nt.init's CPU workers beside a GPU)")
    ap.add_argument("--elements", type=int, default=1 << 25, help="elements per thread (default 32M: a 20B tile)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        exes = {"clones": build(tmp, True), "baseline": build(tmp, False)}
        for threads in sorted({1, args.threads}):
            for name, exe in exes.items():
                for kind, eps in run(exe, threads, args.elements, args.reps).items():
                    rows.append({"build": name, "states": kind, "threads": threads, "g_elements_s": eps / 1e9,
                                 "gb_s": eps * BYTES[kind] / 1e9})
            eps = torch_fused(threads, args.elements, args.reps)
            rows.append({"build": "torch fused", "states": "fp32 (no copy)", "threads": threads,
                         "g_elements_s": eps / 1e9, "gb_s": eps * 28 / 1e9})
    print(f"{'build':<12} {'states':<15} {'threads':>7} {'G elements/s':>13} {'GB/s':>7}")
    for r in rows:
        print(f"{r['build']:<12} {r['states']:<15} {r['threads']:>7} {r['g_elements_s']:>13.3f} {r['gb_s']:>7.1f}")
    for threads in sorted({1, args.threads}):
        for kind in ("fp32", "bf16"):
            new, old = ([r["g_elements_s"] for r in rows if r["build"] == b and r["states"] == kind
                         and r["threads"] == threads][0] for b in ("clones", "baseline"))
            print(f"clones / baseline, {kind} states, {threads} thread(s): {new / old:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
