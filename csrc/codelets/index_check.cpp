// Codelet for the range check of an integer tile (kernels/index_check.h): a bad value becomes a task error.
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "../kernels/index_check.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct IndexCheckArgs {
    int64_t n, lo, hi, ignore;
    char what[96];  // names the check in the error ("Embedding", "cross_entropy")
};

uint32_t index_check_footprint(starpu_task *task) { return hash_ints({args_of<IndexCheckArgs>(task).n}); }

template <bool Cuda>
void func(void *b[], void *cl_arg) {  // ids
    auto *a = static_cast<IndexCheckArgs *>(cl_arg);
    auto bad = kernels::index_check(where<Cuda>(), a->n, a->lo, a->hi, a->ignore,
                                    (const int64_t *)STARPU_VECTOR_GET_PTR(b[0]));
    if (bad) {
        std::ostringstream os;
        os << a->what << ": index " << *bad << " is out of range [" << a->lo << ", " << a->hi << ")";
        throw std::runtime_error(os.str());
    }
}

starpu_codelet *cl() {
    static starpu_codelet *c = new_codelet<func<false>, NNTILE_CUDA_IMPL(func<true>)>("index_check", "nntile_index_check",
                                                                                      index_check_footprint);
    return c;
}

}  // namespace

void submit_index_check(int64_t n, int64_t lo, int64_t hi, int64_t ignore, const std::string &what,
                        starpu_data_handle_t ids) {
    IndexCheckArgs args{n, lo, hi, ignore, {}};
    std::strncpy(args.what, what.c_str(), sizeof(args.what) - 1);
    // RW although it only reads: the tasks reading the ids after it (lookups, the loss) then wait for the check, so
    // a host wait on their results sees its error.
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl(), STARPU_RW, ids, STARPU_CL_ARGS, cl_args(args), sizeof(IndexCheckArgs),
                                           STARPU_NAME, "index_check", 0),
                        "submitting index_check n=" << n);
    count_task();
}

}  // namespace nntile::codelets
