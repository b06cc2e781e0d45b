// What nntile reads from and writes into the environment. The runtime sets StarPU's variables from its config before
// starpu_init (remembering each one's value, restored at shutdown, so that a restart starts again from the user's
// environment) and reads nntile's own once, on the thread that starts it.
#pragma once
#include <cstdint>
#include <string>

namespace nntile {

// Sets (or removes) a variable, remembering its value before for restore_env().
void set_env(const char *name, const std::string &value);
void unset_env(const char *name);
void set_env_mib(const char *name, int64_t bytes);  // bytes as whole MiB; nothing when negative; at least 1 MiB
void set_env_int(const char *name, int value);
int env_int(const char *name);  // -1 when unset or empty
// The environment as before the first set_env/unset_env since the last restore (runtime_shutdown).
void restore_env();

// StarPU's submission window (runtime.h, RuntimeConfig::max_submitted_tasks): 0 removes it, -1 keeps the user's
// STARPU_LIMIT_MAX_SUBMITTED_TASKS (adding a MIN it lacks) or sets kDefaultSubmissionWindow, n > 0 sets n.
void set_submission_window(int max_tasks);
constexpr int kDefaultSubmissionWindow = 1000;

// Reads what nntile takes from the environment while the runtime runs: the watchdog delay, NNTILE_HOST_HOMES and the
// attention kernel (NNTILE_ATTENTION: flash, efficient, cudnn; torch's choice otherwise). Called by runtime_init on
// the thread that starts it, before StarPU's threads exist. Worker, watchdog and monitor threads use the accessors
// below, never getenv: glibc's setenv (the user's, os.environ's, or the runtime's own at init and shutdown) may free
// the array a concurrent getenv walks.
void read_settings();
int64_t watchdog_timeout_us();     // STARPU_WATCHDOG_TIMEOUT as StarPU's watchdog read it (default 2 minutes)
std::string host_homes_setting();  // NNTILE_HOST_HOMES ("" when unset)

}  // namespace nntile
