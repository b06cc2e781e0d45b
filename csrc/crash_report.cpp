// The native crash report: a fatal signal in native code (StarPU, a kernel) prints the crashing thread's backtrace.
#include "crash_report.h"

#include <atomic>
#include <cstdio>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

#include <starpu.h>

namespace nntile {

namespace {
// A crash in native code (StarPU, a kernel) prints the crashing thread's native backtrace before the process dies:
// without it, runs beyond GPU memory that died of SIGSEGV left nothing in the log. Each worker thread gets an alternate
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

}  // namespace

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

}  // namespace nntile
