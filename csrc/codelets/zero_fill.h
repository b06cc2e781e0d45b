// The value of a tile read before anything wrote it: zeros (zero_fill.cpp says why).
#pragma once
#include <starpu.h>

namespace nntile {

// StarPU's initializer for a tile handle (starpu_data_set_reduction_methods(h, nullptr, zero_fill_codelet())).
starpu_codelet *zero_fill_codelet();

}  // namespace nntile
