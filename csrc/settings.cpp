// What nntile reads from and writes into the environment (settings.h).
#include "settings.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "common.h"
#include "kernels/attention.h"

namespace nntile {

// Variables this module set or removed, with the value each had before (restored at shutdown, so that a restart
// starts again from the user's environment).
namespace {
std::vector<std::pair<std::string, std::optional<std::string>>> env_saved;

void remember_env(const char *name) {
    for (auto &e : env_saved)
        if (e.first == name) return;
    const char *old = std::getenv(name);
    env_saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
}

}  // namespace

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

namespace {
// The settings other threads need (watchdog_timeout_us, host_homes_setting), read by read_settings.
std::atomic<int64_t> watchdog_us{120000000};
std::mutex settings_mutex;
std::string host_homes_env;
}  // namespace

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
// training step is submitted ahead of its execution, and on a GPU that the model overfills the scheduler holds memory
// for queued tasks that nothing can evict (docs/DESIGN.md, "Runtime and memory", has the measurements).
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

void restore_env() {
    for (auto &[name, old] : env_saved) {
        if (old)
            setenv(name.c_str(), old->c_str(), 1);
        else
            unsetenv(name.c_str());
    }
    env_saved.clear();
}

int64_t watchdog_timeout_us() { return watchdog_us.load(); }

std::string host_homes_setting() {
    std::lock_guard<std::mutex> lock(settings_mutex);
    return host_homes_env;
}

}  // namespace nntile
