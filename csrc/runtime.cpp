// StarPU start-up and shutdown with the project's defaults, memory limits and optional disk node.
#include "runtime.h"

#include <cstring>
#include <omp.h>
// StarPU 1.3's starpu_disk.h lacks its own extern "C" guard (starpu.h includes it outside its own), so it must
// be seen first, inside one.
extern "C" {
#include <starpu_config.h>
#include <starpu_util.h>
#include <starpu_disk.h>
}
#include <starpu.h>
#ifdef NNTILE_USE_CUDA
#include <starpu_cublas_v2.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <vector>

#include <c10/util/Exception.h>

#include "common.h"
#include "cuda_device.h"
#include "crash_report.h"
#include "settings.h"

namespace nntile {

namespace {
bool running = false;
RuntimeConfig config;
int disk_node_id = -1;
std::pair<int, int> window{-1, -1};
std::atomic<int64_t> n_tasks{0}, n_waits{0};
std::vector<std::function<void(bool)>> &hooks() {
    static std::vector<std::function<void(bool)>> h;
    return h;
}


// StarPU's CPU workers each run one task at a time; BLAS inside a task must not start its own thread team
// on top of them.
void single_threaded_blas(void *) { omp_set_num_threads(1); }

}  // namespace

namespace {
std::vector<starpu_codelet *> &codelet_registry() {
    static std::vector<starpu_codelet *> c;
    return c;
}

void place(starpu_codelet *cl) {
#ifdef NNTILE_USE_CUDA
    if (cl->cuda_funcs[0] != nullptr && cl->cpu_funcs[0] != nullptr)
        cl->where = cpu_tasks_allowed() ? (STARPU_CPU | STARPU_CUDA) : STARPU_CUDA;
#else
    (void)cl;
#endif
}
}  // namespace

namespace {
std::vector<int> place_workers;  // worker id of each place; empty = no pinning
thread_local int current_hint = -1;

void set_up_places(const RuntimeConfig &cfg) {
    place_workers.clear();
    int ncuda = starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
    int places = cfg.places >= 1 ? cfg.places : (ncuda >= 2 ? ncuda : 1);
    if (places <= 1) return;
    auto kind = ncuda > 0 ? STARPU_CUDA_WORKER : STARPU_CPU_WORKER;
    int n = starpu_worker_get_count_by_type(kind);
    std::vector<int> ids(n);
    starpu_worker_get_ids_by_type(kind, ids.data(), n);
    for (int p = 0; p < places; ++p) place_workers.push_back(ids[p % n]);
}
}  // namespace

int placement_count() { return place_workers.empty() ? 1 : (int)place_workers.size(); }
int placement_worker(int64_t i) {
    return place_workers.empty() ? -1 : place_workers[(size_t)(i % (int64_t)place_workers.size())];
}
OnWorker::OnWorker(int worker) : previous_(current_hint) { current_hint = worker; }
OnWorker::~OnWorker() { current_hint = previous_; }

namespace {
thread_local bool host_tasks = false;
}  // namespace

int hinted_worker() {
    // Under set_host_tasks(true) a task runs on a CPU worker: a place that is a GPU's worker (places are the CUDA
    // workers when there are two or more: two GPUs, or two streams per GPU) would leave it no worker (ENODEV),
    // so StarPU picks the CPU worker.
    if (host_tasks && current_hint >= 0 && starpu_worker_get_type(current_hint) != STARPU_CPU_WORKER) return -1;
    return current_hint;
}

bool set_host_tasks(bool host) {
    bool previous = host_tasks;
    host_tasks = host;
    return previous;
}

unsigned long long hinted_where() {
    // -1 leaves starpu_task::where unset, so StarPU takes the codelet's (runtime placement rules).
    return host_tasks ? (unsigned long long)STARPU_CPU : (unsigned long long)-1;
}

bool cpu_tasks_allowed() {
    if (!running || config.cpu_tasks == 1) return true;
    if (config.cpu_tasks == 0) return false;
    return starpu_cuda_worker_get_count() == 0;
}

void register_codelet(starpu_codelet *cl) {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    codelet_registry().push_back(cl);
    place(cl);
}

namespace {
void apply_placement() {
    for (auto *cl : codelet_registry()) place(cl);
}
}  // namespace


void runtime_init(const RuntimeConfig &cfg) {
    NNTILE_CHECK(!running, "StarPU runtime is already running");
    KeepCudaDevice keep;
    setenv("STARPU_SILENT", "1", 0);
    // StarPU's default keeps 5-10% of a limited memory node's buffers "clean" by copying dirty ones to host RAM
    // ahead of need. Activation and gradient tiles live only on the GPU and are dropped soon after: on GPT-2 XL
    // that meant ~500 device-to-host copies per step into freshly pinned host buffers (cudaHostAlloc, ~9 ms
    // each), 4 of the 4.8 s step. Eviction still writes a dirty buffer back when the memory is really needed.
    // A value the user sets in the environment wins.
    setenv("STARPU_MINIMUM_CLEAN_BUFFERS", "0", 0);
    setenv("STARPU_TARGET_CLEAN_BUFFERS", "0", 0);
    // A stall is reported after 2 minutes (report_stall). StarPU 1.3 reads an unset STARPU_WATCHDOG_CRASH as -1
    // and aborts: the default here is to report and keep waiting.
    setenv("STARPU_WATCHDOG_TIMEOUT", "120000000", 0);
    setenv("STARPU_WATCHDOG_CRASH", "0", 0);
    // The patched StarPU's settings (NNTILE_DROP_HOST_COPIES, NNTILE_EVICT_WONT_USE_FIRST, NNTILE_CUDA_POOL) are
    // decided by nntile_torch/runtime.py's init, which puts them into the environment before this runs: one place
    // that Python code (AdamW) asks too.
    set_env_mib("STARPU_LIMIT_CUDA_MEM", cfg.cuda_memory_limit);
    set_env_mib("STARPU_LIMIT_CPU_MEM", cfg.host_memory_limit);
    set_submission_window(cfg.max_submitted_tasks);
    read_settings();  // the last getenv of nntile's before StarPU's threads start
    window = {env_int("STARPU_LIMIT_MAX_SUBMITTED_TASKS"), env_int("STARPU_LIMIT_MIN_SUBMITTED_TASKS")};
    if (window.first < 0 || window.second < 0) window = {-1, -1};
    // Host buffers StarPU allocates for tiles come 64-byte aligned, as torch's own CPU tensors do (plain malloc
    // otherwise: 16 bytes, or whatever the heap gives). MKL takes different code paths for differently aligned
    // operands, so a CPU GEMM on the same values could round differently depending on where StarPU put a tile:
    // with this, results do not depend on allocation history (host homes, eviction, a restart).
    starpu_malloc_set_align(64);
    starpu_conf conf;
    NNTILE_STARPU_CHECK(starpu_conf_init(&conf), "starpu_conf_init");
    conf.ncpus = cfg.ncpus;
    conf.ncuda = cfg.ncuda;
    conf.nopencl = 0;
    config = cfg;
    if (!cfg.scheduler.empty()) conf.sched_policy_name = config.scheduler.c_str();
    int rc = starpu_init(&conf);
    NNTILE_CHECK(rc == 0, "starpu_init failed (returned " << rc
                                                       << (rc == -19 ? ": no worker available, check ncpus/ncuda" : "")
                                                       << ")");
    running = true;
    if (stall_report()) starpu_task_watchdog_set_hook(stall_report(), nullptr);
    if (cfg.cpu_tasks == 0 && starpu_cuda_worker_get_count() == 0) {
        runtime_shutdown(false);
        NNTILE_CHECK(false, "cpu_tasks=False needs a CUDA worker (none started)");
    }
    apply_placement();
    set_up_places(cfg);
    starpu_execute_on_each_worker(single_threaded_blas, nullptr, STARPU_CPU);
    install_crash_report();  // after starpu_init, which installs StarPU's own SIGSEGV handler (chained to)
#ifdef NNTILE_USE_CUDA
    if (starpu_cuda_worker_get_count() > 0) starpu_cublas_init();
#endif
    if (!cfg.disk_path.empty()) {
        disk_node_id = starpu_disk_register(&starpu_disk_unistd_ops, (void *)config.disk_path.c_str(),
                                            (starpu_ssize_t)cfg.disk_limit);
        if (disk_node_id < 0) {
            runtime_shutdown(false);
            NNTILE_CHECK(false, "could not register disk node at '" << cfg.disk_path << "' with limit "
                                                                    << cfg.disk_limit << " bytes (returned "
                                                                    << disk_node_id << ")");
        }
    }
}

namespace {
std::mutex task_error_mutex;
std::string task_error;  // first failure since the last raise
// What Python sees it as: RuntimeError, torch.OutOfMemoryError (a failed allocation), IndexError (an index
// check: torch raises IndexError for an out-of-range index too).
enum class TaskErrorKind { other, out_of_memory, index };
TaskErrorKind task_error_kind = TaskErrorKind::other;
std::atomic<bool> task_failed{false};  // task_error is set: checked on every submission without the lock

// Takes the recorded error (empty when none) and its kind.
std::pair<std::string, TaskErrorKind> take_task_error() {
    std::lock_guard<std::mutex> lock(task_error_mutex);
    std::pair<std::string, TaskErrorKind> e{std::move(task_error), task_error_kind};
    task_error.clear();
    task_error_kind = TaskErrorKind::other;
    task_failed.store(false);
    return e;
}

[[noreturn]] void throw_task_error(const std::pair<std::string, TaskErrorKind> &e) {
    if (e.second == TaskErrorKind::index)
        TORCH_CHECK_WITH(IndexError, false, e.first, " (results written by that task are undefined)");
    if (e.second == TaskErrorKind::out_of_memory)
        TORCH_CHECK_WITH(OutOfMemoryError, false, e.first,
                         " (out of memory inside the task's kernel: on a GPU that is torch's share, what "
                         "init(cuda_memory_limit=...) leaves it; on the host, RAM. Use smaller tiles or batch, or leave "
                         "torch more of the GPU. Results written by that task are undefined)");
    NNTILE_CHECK(false, e.first << " (results written by that task are undefined)");
}
}  // namespace

void runtime_shutdown(bool keep_data) {
    if (!running) return;
    KeepCudaDevice keep;
    // Every step runs even when one fails (a tensor whose values cannot be saved, a task error): StarPU is stopped
    // and the environment restored, so that init() works again; then the first error is raised. (It threw from the
    // first tile tensor's copy and left StarPU running, some tensors released and the rest not.) A task error
    // still pending is raised here rather than by the next runtime's first wait, where it would name a task that
    // no longer relates to anything.
    starpu_task_wait_for_all();
    const auto pending = take_task_error();
    std::exception_ptr failed;
    for (auto &h : hooks()) {
        try {
            h(keep_data);
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
    }
    starpu_task_wait_for_all();
    const auto during = take_task_error();  // of tasks still running the hooks waited for
#ifdef NNTILE_USE_CUDA
    if (starpu_cuda_worker_get_count() > 0) starpu_cublas_shutdown();
#endif
    starpu_shutdown();
    place_workers.clear();
    running = false;
    disk_node_id = -1;
    restore_env();
    if (!pending.first.empty()) throw_task_error(pending);
    if (!during.first.empty()) throw_task_error(during);
    if (failed) std::rethrow_exception(failed);
}

bool runtime_running() { return running; }
const RuntimeConfig &runtime_config() { return config; }
std::pair<int, int> submission_window() { return window; }
int disk_node() { return disk_node_id; }
void add_shutdown_hook(std::function<void(bool)> hook) { hooks().push_back(std::move(hook)); }

void (*&stall_report())(void *) {
    static void (*report)(void *) = nullptr;
    return report;
}
void set_stall_report(void (*report)(void *)) {
    stall_report() = report;
    if (running) starpu_task_watchdog_set_hook(report, nullptr);
}

namespace {
// Whether a kernel's error is a failed allocation: torch's CUDA allocator throws c10::OutOfMemoryError ("CUDA out of
// memory"), its CPU allocator a plain c10::Error ("can't allocate memory"), the C++ runtime std::bad_alloc.
bool is_out_of_memory(const std::string &what) {
    for (const char *s : {"out of memory", "can't allocate memory", "not enough memory", "Cannot allocate memory",
                          "std::bad_alloc"})
        if (what.find(s) != std::string::npos) return true;
    return false;
}
}  // namespace

void record_task_error(const char *op, const char *what) {
    std::lock_guard<std::mutex> lock(task_error_mutex);
    if (!task_error.empty()) return;
    std::string message = what;
    const size_t trace = message.find("\nException raised from");  // c10's C++ backtrace, when it has one
    if (trace != std::string::npos) message.resize(trace);
    task_error_kind = std::strcmp(op, "index_check") == 0 ? TaskErrorKind::index
                      : is_out_of_memory(message)       ? TaskErrorKind::out_of_memory
                                                        : TaskErrorKind::other;
    task_error = std::string("a ") + op + " task failed: " + message;
    task_failed.store(true);
}

void raise_task_error() {
    if (!task_failed.load()) return;
    const auto e = take_task_error();
    if (!e.first.empty()) throw_task_error(e);
}

// Every submission passes here: a task that failed since is raised now, by the next op of the submitting thread,
// instead of at a later wait that may read unrelated tensors (and after more tasks computed on its undefined
// results).
void count_task() {
    n_tasks.fetch_add(1, std::memory_order_relaxed);
    if (task_failed.load(std::memory_order_relaxed)) raise_task_error();
}
void count_wait() { n_waits.fetch_add(1, std::memory_order_relaxed); }
int64_t tasks_submitted() { return n_tasks.load(); }
int64_t blocking_waits() { return n_waits.load(); }

void wait_all() {
    NNTILE_CHECK(running, "StarPU runtime is not running");
    count_wait();
    NNTILE_STARPU_CHECK(starpu_task_wait_for_all(), "starpu_task_wait_for_all");
    raise_task_error();
}

}  // namespace nntile
