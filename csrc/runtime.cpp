// StarPU start-up and shutdown with the project's defaults, memory limits and optional disk node.
#include "runtime.h"

#include <cstring>
#include <execinfo.h>
#include <optional>
#include <omp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
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
#include <iomanip>
#include <mutex>
#include <sstream>
#include <vector>

#include <c10/util/Exception.h>

#include "common.h"
#include "cuda_device.h"
#include "kernels/attention.h"
#include "stall_advice.h"
#include "tiles/tile_tensor.h"

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

// Variables this module set or removed, with the value each had before (restored at shutdown, so that a restart
// starts again from the user's environment).
std::vector<std::pair<std::string, std::optional<std::string>>> env_saved;

void remember_env(const char *name) {
    for (auto &e : env_saved)
        if (e.first == name) return;
    const char *old = std::getenv(name);
    env_saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
}

void set_env(const char *name, const std::string &value) {
    remember_env(name);
    setenv(name, value.c_str(), 1);
}

void unset_env(const char *name) {
    remember_env(name);
    unsetenv(name);
}

void set_env_mib(const char *name, int64_t bytes) {
    if (bytes < 0) return;
    int64_t mib = bytes >> 20;
    NNTILE_CHECK(mib >= 1, name << " must be at least 1 MiB (got " << bytes << " bytes)");
    set_env(name, std::to_string(mib));
}

void set_env_int(const char *name, int value) { set_env(name, std::to_string(value)); }

int env_int(const char *name) {
    const char *v = std::getenv(name);
    return v && *v ? std::atoi(v) : -1;
}

// The settings other threads need (runtime.h: watchdog_timeout_us, host_homes_setting), read by runtime_init.
std::atomic<int64_t> watchdog_us{120000000};
std::mutex settings_mutex;
std::string host_homes_env;

void read_settings() {
    const char *t = std::getenv("STARPU_WATCHDOG_TIMEOUT");
    watchdog_us.store(t && *t ? std::atoll(t) : 120000000LL);
    const char *homes = std::getenv("NNTILE_HOST_HOMES");
    {
        std::lock_guard<std::mutex> lock(settings_mutex);
        host_homes_env = homes ? homes : "";
    }
    const char *attention = std::getenv("NNTILE_ATTENTION");
    const std::string a = attention ? attention : "";
    kernels::set_attention_backend(a == "flash"       ? kernels::kFlash
                                   : a == "efficient" ? kernels::kEfficient
                                   : a == "cudnn"     ? kernels::kCudnn
                                                      : -1);
}

// StarPU 1.3.10 throttles submission (task.c, starpu_task_submit) only when both variables are set (it asserts they
// are not negative): above MAX pending tasks the submitting thread waits until MIN remain. Without a window a whole
// training step is submitted ahead of its execution and the scheduler allocates and prefetches data for the tasks
// it has queued; on a GPU that the model overfills, that held memory nothing could evict: GPT 13B at batch 16 on
// one H200 took step 0 in 47 s and then no step in 106 s; per step with a window of 4,000: no second step in 150 s,
// 2,000: 8.35 s, 1,000: 6.84 s, 500: 6.10 s. GPT-2 XL, which fits, does not notice (tokens/s within 2%).
void set_submission_window(int max_tasks) {
    const char *kMax = "STARPU_LIMIT_MAX_SUBMITTED_TASKS", *kMin = "STARPU_LIMIT_MIN_SUBMITTED_TASKS";
    if (max_tasks == 0) {
        unset_env(kMax);
        unset_env(kMin);
        return;
    }
    if (max_tasks < 0 && env_int(kMax) >= 0) {  // the user's window; their MAX alone would not throttle
        if (env_int(kMin) < 0) set_env_int(kMin, env_int(kMax) * 4 / 5);
        return;
    }
    const int n = max_tasks > 0 ? max_tasks : kDefaultSubmissionWindow;
    set_env_int(kMax, n);
    set_env_int(kMin, n * 4 / 5);
}

// StarPU's CPU workers each run one task at a time; BLAS inside a task must not start its own thread team
// on top of them.
void single_threaded_blas(void *) { omp_set_num_threads(1); }

// A crash in native code (StarPU, a kernel) prints the crashing thread's native backtrace before the process dies:
// the H200 runs beyond GPU memory died of SIGSEGV with nothing in the log. Each worker thread gets an alternate
// signal stack, so that the report survives a stack overflow (the suspected cause there: nested evictions).
struct sigaction previous_segv, previous_bus, previous_abrt;

struct sigaction *previous_action(int sig) {
    return sig == SIGSEGV ? &previous_segv : sig == SIGBUS ? &previous_bus : &previous_abrt;
}
std::atomic<int> crash_reported{0};

void report_crash(int sig, siginfo_t *info, void *) {
    if (crash_reported.exchange(1) != 0) {  // a handler chain that comes back here: let the signal kill
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    char head[200];
    int n = std::snprintf(head, sizeof head,
                          "nntile_torch: fatal signal %d (%s) at address %p in thread %ld; native backtrace:\n", sig,
                          sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "SIGABRT", info != nullptr ? info->si_addr : nullptr,
                          static_cast<long>(syscall(SYS_gettid)));
    if (n > 0) (void)!write(2, head, static_cast<size_t>(n) < sizeof head ? n : sizeof head - 1);
    void *frames[128];
    backtrace_symbols_fd(frames, backtrace(frames, 128), 2);
    sigaction(sig, previous_action(sig), nullptr);  // StarPU's, Python's (faulthandler), or default
    raise(sig);
}

struct AltStack {
    std::vector<char> memory;
    AltStack() : memory(1 << 16) {
        stack_t ss{};
        ss.ss_sp = memory.data();
        ss.ss_size = memory.size();
        sigaltstack(&ss, nullptr);
    }
    ~AltStack() {
        stack_t ss{};
        ss.ss_flags = SS_DISABLE;
        sigaltstack(&ss, nullptr);
    }
};

void alt_stack_here(void *) { static thread_local AltStack stack; }

void install_crash_report() {
    void *warm[1];
    backtrace(warm, 1);  // loads the unwinder now, not inside the handler
    struct sigaction sa {};
    sa.sa_sigaction = report_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    // SIGABRT too: an assertion in StarPU or a C++ exception escaping a worker thread names no frame otherwise
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT}) {
        struct sigaction current {};
        sigaction(sig, nullptr, &current);
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == report_crash) continue;  // still ours
        sigaction(sig, &sa, previous_action(sig));
    }
    alt_stack_here(nullptr);
    starpu_execute_on_each_worker(alt_stack_here, nullptr, STARPU_CPU | STARPU_CUDA);
}
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

std::string stall_advice(const std::vector<NodeTiles> &nodes, bool has_disk, int max_window) {
    // A node is at its limit within 3%; "outside live tiles" counts when it is over a quarter of the node, "only
    // copies" when they fill over 60% of every node at its limit. Thresholds read off the H200 stalls of
    // 2026-12-01 (large_models_v5, _v6): 13B batch 32, GPU 106.9 of 125.8 GiB outside live tiles; 20B batch 8,
    // host 88.0 of 108.0 and GPU 107.5 of 125.8 GiB only copies, 20 and 18 GiB outside.
    auto gib = [](int64_t b) { return (double)b / (1 << 30); };
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    std::vector<const NodeTiles *> full;
    for (const auto &n : nodes)
        if (n.total > 0 && n.used >= n.total - n.total / 33) full.push_back(&n);
    if (full.empty())
        return "No memory node is at its limit, so this is not StarPU failing to evict: a task waits for something "
               "else (STARPU_WATCHDOG_CRASH=1 gives a backtrace).";
    std::string outside;
    for (const auto *n : full) {
        const int64_t other = n->used - n->allocated;
        if (other > n->total / 4) {
            std::ostringstream o;
            o << std::fixed << std::setprecision(1) << (outside.empty() ? "" : ", ") << n->name << " " << gib(other)
              << " of " << gib(n->total) << " GiB";
            outside += o.str();
        }
    }
    bool all_sole = true;
    for (const auto *n : full) all_sole = all_sole && n->sole * 5 > n->total * 3;
    int limited = 0;
    for (const auto &n : nodes) limited += n.total > 0;
    const bool no_room = all_sole && (int)full.size() == limited;  // every limited node full of only copies
    os << "At their limit: ";
    for (size_t i = 0; i < full.size(); ++i) os << (i ? ", " : "") << full[i]->name;
    os << ".";
    if (!outside.empty()) {
        os << " Memory held outside live tiles (buffers of tiles freed while tasks on them are pending, StarPU's "
              "cache of freed buffers): "
           << outside << ". Fewer tasks in flight bound it: a smaller submission window (init(max_submitted_tasks=";
        if (max_window > 0)
            os << max_window / 2 << "), now " << max_window << ").";
        else
            os << "1000), now none).";
    }
    if (no_room) {
        os << " Every limited node is full of the only valid copies of live tiles: the step's data does not fit "
              "with room to move it. ";
        if (!has_disk) os << "Add a disk node (init(disk_path=..., disk_limit=...)) or make";
        else os << "Make";
        os << " it smaller: a smaller batch, AdamW(state_dtype=torch.bfloat16), activation checkpointing.";
    }
    if (outside.empty() && !no_room)
        os << " StarPU 1.3.10 fails to evict there (docs/DESIGN.md, 'Runtime and memory'): use a smaller batch, a "
              "smaller submission window (init(max_submitted_tasks=...)), AdamW(state_dtype=torch.bfloat16) or more "
              "GPUs.";
    return os.str();
}

std::string stall_advice_now() {
    return stall_advice(memory_nodes_tiles(), disk_node_id >= 0, window.first);
}

namespace {
// StarPU's watchdog calls this when no task finished for STARPU_WATCHDOG_TIMEOUT while tasks are pending. On the
// H200, GPT models that overfill the GPU (13B on one, 13B and 20B on two) stalled like that in StarPU 1.3.10
// (its eviction of written tiles to host RAM, and an allocation in host RAM, never completed): say so, with
// what each memory node holds, instead of hanging in silence.
void report_stall(void *) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "nntile_torch: no StarPU task finished for "
       << (double)watchdog_timeout_us() / 1e6 << " s (" << starpu_task_nsubmitted()
       << " tasks pending, " << starpu_task_nready() << " ready). Memory nodes: " << memory_nodes_text() << ". "
       << stall_advice_now()
       << " STARPU_WATCHDOG_CRASH=1 aborts here instead of waiting; STARPU_WATCHDOG_TIMEOUT (microseconds) sets the "
          "delay.\n";
    std::fputs(os.str().c_str(), stderr);
    std::fflush(stderr);
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
    starpu_task_watchdog_set_hook(report_stall, nullptr);
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
    for (auto &[name, old] : env_saved) {
        if (old)
            setenv(name.c_str(), old->c_str(), 1);
        else
            unsetenv(name.c_str());
    }
    env_saved.clear();
    if (!pending.first.empty()) throw_task_error(pending);
    if (!during.first.empty()) throw_task_error(during);
    if (failed) std::rethrow_exception(failed);
}

bool runtime_running() { return running; }
const RuntimeConfig &runtime_config() { return config; }
std::pair<int, int> submission_window() { return window; }
int disk_node() { return disk_node_id; }
void add_shutdown_hook(std::function<void(bool)> hook) { hooks().push_back(std::move(hook)); }

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

int64_t watchdog_timeout_us() { return watchdog_us.load(); }

std::string host_homes_setting() {
    std::lock_guard<std::mutex> lock(settings_mutex);
    return host_homes_env;
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
