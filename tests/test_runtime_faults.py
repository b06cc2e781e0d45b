"""The runtime under faults: a task that runs out of memory, a shutdown with an error pending, threads reading what
other threads change (the stall report walking tile handles, getenv beside setenv), a test that hangs. Each runs
in its own process, since a failure here can be a crash or a hang."""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import run_python

# An attention task whose kernel cannot allocate its temporaries: the address space is limited (RLIMIT_AS) to what
# the process has plus 96 MiB once the tiles exist, and the CPU's attention with dropout makes a sequence's
# (heads, seq, seq) scores and probabilities (64 MiB each here) and its mask's int64 indices (128 MiB).
_OOM_IN_A_TASK = """
import os, resource, time, torch, nntile_torch as nt
from nntile_torch import _C
nt.init(ncpus=1, ncuda=0)
seq, heads, c = 2048, 4, 16
qkv = nt.TileTensor.from_dense(torch.randn(seq, 3 * c), (seq, 3 * c))
x = nt.TileTensor.from_dense(torch.ones(seq, c), (seq, c))
y = nt.TileTensor.from_dense(torch.zeros(seq, c), (seq, c))
kept = nt.TileTensor.from_dense(torch.arange(10.0), (10,))
nt.synchronize()
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (vm + (96 << 20), hard))
_C.attention_forward(qkv.tiles, y.tiles, seq, heads, 0.5, False, None, 0.1, 1)
while _C.tasks_pending():
    time.sleep(0.01)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
"""


def test_out_of_memory_in_a_task_is_raised_by_the_next_op_as_torch_oom():
    """The failed allocation surfaces at the next submission, as torch.OutOfMemoryError naming the task; it was a
    RuntimeError raised by whatever waited next, possibly a read of an unrelated tensor much later."""
    code = _OOM_IN_A_TASK + """
try:
    _C.add(1.0, x.tiles, 0.0, y.tiles)  # any op: the next submission raises
except torch.OutOfMemoryError as e:
    print("raised by the next op:", str(e).splitlines()[0][:300])
else:
    print("not raised by the next op")
nt.synchronize()  # raised once, not again
assert torch.equal(kept.materialize(), torch.arange(10.0))
print("ok")
"""
    rc, out, err = run_python(code, 120, what="the out-of-memory script")
    assert rc == 0, err[-3000:]
    assert "raised by the next op: a attention_forward task failed" in out, out
    assert "can't allocate memory" in out and "ok" in out, out


def test_shutdown_with_an_error_pending_stops_the_runtime_and_raises_it():
    """shutdown() finishes its work (StarPU stopped, every tensor saved) and then raises the pending task error;
    init() works again and the tensors kept their values. It threw from the first tensor's copy and left StarPU
    running with some tensors released."""
    code = _OOM_IN_A_TASK + """
try:
    nt.shutdown()
except torch.OutOfMemoryError as e:
    print("shutdown raised:", str(e).splitlines()[0][:200])
print("running after shutdown:", nt.is_running())
nt.init(ncpus=1, ncuda=0)
assert torch.equal(kept.materialize(), torch.arange(10.0))
assert torch.equal(x.materialize(), torch.ones(seq, c))
nt.synchronize()
nt.shutdown()
nt.init(ncpus=1, ncuda=0)
nt.synchronize()  # nothing carried into the next runtime
print("ok")
"""
    rc, out, err = run_python(code, 120, what="the shutdown script")
    assert rc == 0, err[-3000:]
    assert "shutdown raised: a attention_forward task failed" in out, out
    assert "running after shutdown: False" in out and "ok" in out, out


def test_the_stall_report_can_walk_tiles_while_tensors_register_again():
    """memory_nodes() (what the watchdog's stall report prints) walks every live tensor's handles under the
    registry's lock, while tensors kept across a restart register their tiles again on another thread. The
    registration resized the handle list outside that lock, so the walk read null handles (SIGSEGV)."""
    code = """
import threading, torch, nntile_torch as nt
from nntile_torch import _C
nt.init(ncpus=1, ncuda=0)
tensors = [nt.TileTensor.from_dense(torch.arange(3000.0), (1,)) for _ in range(6)]  # 3,000 tiles each
walks = 0
for _ in range(6):
    nt.shutdown()  # the tensors keep their values and drop their handles
    nt.init(ncpus=1, ncuda=0)
    stop = threading.Event()
    def walk():
        global walks
        while not stop.is_set():
            _C.memory_nodes()
            walks += 1
    t = threading.Thread(target=walk)
    t.start()
    for x in tensors:
        assert float(x.tiles.to_dense().sum()) == 2999 * 3000 / 2  # registers 3,000 handles (GIL released)
    stop.set()
    t.join()
print("ok", walks)
"""
    rc, out, err = run_python(code, 240, what="the walk beside registration")
    assert rc == 0, f"exit {rc}: {err[-3000:]}"
    assert out.startswith("ok"), out


_GETENV_SPY = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* Reports getenv of the variables nntile_torch reads, when called off the main thread. */
static char *(*real_getenv)(const char *);
char *getenv(const char *name) {
    if (!real_getenv) real_getenv = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    if (name && syscall(SYS_gettid) != getpid() &&
        ((strncmp(name, "NNTILE_", 7) == 0 && strcmp(name, "NNTILE_DROP_HOST_COPIES") != 0 &&
          strcmp(name, "NNTILE_EVICT_WONT_USE_FIRST") != 0 && strcmp(name, "NNTILE_CUDA_POOL") != 0) ||
         strcmp(name, "STARPU_WATCHDOG_TIMEOUT") == 0)) {
        (void)!write(2, "getenv off the main thread: ", 28);
        (void)!write(2, name, strlen(name));
        (void)!write(2, "\n", 1);
    }
    return real_getenv(name);
}
"""


def test_no_getenv_of_nntile_settings_off_the_main_thread(tmp_path):
    """The settings nntile reads while tasks run (the watchdog's delay, NNTILE_HOST_HOMES, NNTILE_ATTENTION)
    are read once by init, on its thread: a getenv on a worker, watchdog or monitor thread races any setenv in the
    process (the runtime's own at init and shutdown, os.environ's), and glibc's setenv may free the array getenv
    walks. The host-wait monitor thread called getenv on every wait. (StarPU's patched NNTILE_DROP_HOST_COPIES,
    NNTILE_EVICT_WONT_USE_FIRST and NNTILE_CUDA_POOL are read by StarPU itself, once: not checked here.)"""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the getenv spy")
    src = tmp_path / "spy.c"
    src.write_text(_GETENV_SPY)
    lib = tmp_path / "spy.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], check=True)
    code = """
import threading, torch, nntile_torch as nt
nt.init(ncpus=2, ncuda=0, host_memory_limit="256MiB")
w = nt.nn.Linear(64, 64, tile_size=32)
opt = nt.optim.AdamW(w.parameters())
for _ in range(3):
    y = w(torch.randn(16, 64))
    (y * y).sum().backward()
    opt.step()
    float(y.sum())  # host waits: the monitor thread watches them
def other_thread():
    nt.TileTensor.from_dense(torch.ones(100, 100), (10, 10)).materialize()
t = threading.Thread(target=other_thread)
t.start(); t.join()
nt.shutdown()
nt.init(ncpus=1, ncuda=0)
float(w(torch.randn(4, 64)).sum())
print("ok")
"""
    rc, out, err = run_python(code, 180, env=dict(LD_PRELOAD=str(lib)), what="the getenv spy")
    assert rc == 0, err[-3000:]
    assert "ok" in out
    assert "getenv off the main thread" not in err, err[-2000:]


def test_a_hung_script_is_killed_with_its_children_in_bounded_time():
    """run_python (the hangs-as-failures helper: the eviction runs, the strict expected failure on the GPU) kills
    the whole process group and returns within its timeout plus 10 s. subprocess.run(timeout=...) killed the child
    alone and then waited for it without a bound; a child it started lived on."""
    code = """
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(p.pid, flush=True)
time.sleep(600)
"""
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish in 3 s") as failed:
        run_python(code, 3, what="the sleeper")
    assert time.monotonic() - start < 14
    grandchild = int(re.search(r"its output: '(\d+)", str(failed.value)).group(1))
    time.sleep(0.5)
    try:  # gone, or a zombie nobody has reaped yet
        with open(f"/proc/{grandchild}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        state = "gone"
    assert state == "gone" or "Z" in state.split()[1], state
