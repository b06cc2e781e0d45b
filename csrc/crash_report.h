// The native crash report (crash_report.cpp).
#pragma once

namespace nntile {

// Installs the SIGSEGV, SIGBUS and SIGABRT handler that prints the crashing thread's native backtrace, then chains to
// the handler it replaced (StarPU's, Python's faulthandler, or the default), and gives this thread and every StarPU
// worker an alternate signal stack. Called by runtime_init after starpu_init; a second call keeps the handler.
void install_crash_report();

}  // namespace nntile
