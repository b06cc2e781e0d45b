// Tiled tensor: handle registration, dense conversion and the registry used at runtime shutdown.
#include "tile_tensor.h"

#include <mutex>
#include <unordered_set>

#include "../runtime.h"

namespace nntile {

namespace {

std::unordered_set<TileTensor *> &live() {
    static std::unordered_set<TileTensor *> s;
    return s;
}

void install_shutdown_hook() {
    static bool done = [] {
        add_shutdown_hook([](bool keep_data) {
            for (TileTensor *t : live()) t->release_handles(keep_data);
        });
        return true;
    }();
    (void)done;
}

at::ScalarType scalar_type(DType t) { return t == DType::f32 ? at::kFloat : at::kBFloat16; }

// The dense sub-block that tile `index` covers.
torch::Tensor block_of(torch::Tensor dense, const std::vector<int64_t> &index, const std::vector<int64_t> &tile_shape,
                       const std::vector<int64_t> &extents) {
    for (size_t d = 0; d < index.size(); ++d) dense = dense.narrow((int64_t)d, index[d] * tile_shape[d], extents[d]);
    return dense;
}

}  // namespace

TileTensor::TileTensor(std::vector<int64_t> shape, std::vector<int64_t> tile_shape, DType dtype, std::string name)
    : shape_(std::move(shape)), tile_shape_(std::move(tile_shape)), dtype_(dtype), name_(std::move(name)) {
    NNTILE_CHECK(shape_.size() == tile_shape_.size(), "tile shape must have one entry per dimension (shape has "
                                                          << shape_.size() << ", tile shape " << tile_shape_.size()
                                                          << ")");
    NNTILE_CHECK(!shape_.empty(), "a tile tensor needs at least one dimension");
    for (size_t d = 0; d < shape_.size(); ++d) {
        NNTILE_CHECK(shape_[d] > 0, "every dimension must be positive (got " << shape_[d] << " in dim " << d << ")");
        NNTILE_CHECK(tile_shape_[d] > 0,
                     "every tile size must be positive (got " << tile_shape_[d] << " in dim " << d << ")");
        tile_shape_[d] = std::min(tile_shape_[d], shape_[d]);
        grid_.push_back((shape_[d] + tile_shape_[d] - 1) / tile_shape_[d]);
    }
    int64_t tile_elems = 1;
    for (auto t : tile_shape_) tile_elems *= t;
    NNTILE_CHECK(tile_elems < (int64_t(1) << 32), "a tile must hold fewer than 2^32 elements (got " << tile_elems << ")");
    install_shutdown_hook();
    ensure_handles();
    live().insert(this);
}

TileTensor::~TileTensor() {
    live().erase(this);
    if (runtime_running())
        for (auto h : handles_) starpu_data_unregister_submit(h);
}

int64_t TileTensor::ntiles() const {
    int64_t n = 1;
    for (auto g : grid_) n *= g;
    return n;
}

int64_t TileTensor::numel() const {
    int64_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
}

int64_t TileTensor::tile_extent(int64_t d, int64_t index) const {
    return std::min(tile_shape_[d], shape_[d] - index * tile_shape_[d]);
}

std::vector<int64_t> TileTensor::tile_index(int64_t linear) const {
    std::vector<int64_t> idx(grid_.size());
    for (int64_t d = (int64_t)grid_.size() - 1; d >= 0; --d) {
        idx[d] = linear % grid_[d];
        linear /= grid_[d];
    }
    return idx;
}

std::vector<int64_t> TileTensor::tile_extents(int64_t linear) const {
    auto idx = tile_index(linear);
    std::vector<int64_t> ext(idx.size());
    for (size_t d = 0; d < idx.size(); ++d) ext[d] = tile_extent((int64_t)d, idx[d]);
    return ext;
}

void TileTensor::ensure_handles() {
    if (!handles_.empty()) return;
    NNTILE_CHECK(runtime_running(), "the nntile_torch runtime is not running (call nntile_torch.init() first)");
    handles_.resize(ntiles());
    for (int64_t t = 0; t < ntiles(); ++t) {
        int64_t n = 1;
        for (auto e : tile_extents(t)) n *= e;
        starpu_vector_data_register(&handles_[t], -1, 0, (uint32_t)n, dtype_size(dtype_));
    }
    if (saved_.defined()) {
        torch::Tensor saved = saved_;
        saved_ = torch::Tensor();
        from_dense(saved);
    }
}

starpu_data_handle_t TileTensor::handle(int64_t linear) {
    ensure_handles();
    NNTILE_CHECK(linear >= 0 && linear < ntiles(), "tile index out of range (got " << linear << ", tensor has "
                                                                                     << ntiles() << " tiles)");
    return handles_[linear];
}

bool TileTensor::same_tiling(const TileTensor &o) const {
    return shape_ == o.shape_ && tile_shape_ == o.tile_shape_ && dtype_ == o.dtype_;
}

void TileTensor::from_dense(const torch::Tensor &src) {
    NNTILE_CHECK(src.sizes().vec() == shape_, "dense tensor of shape " << src.sizes() << " does not match tile tensor "
                                                                        << "shape " << c10::IntArrayRef(shape_));
    NNTILE_CHECK(src.is_floating_point(), "expected a floating-point tensor (got " << src.scalar_type() << ")");
    ensure_handles();
    torch::Tensor dense = src.detach().to(torch::kCPU, scalar_type(dtype_)).contiguous();
    for (int64_t t = 0; t < ntiles(); ++t) {
        auto h = handles_[t];
        NNTILE_STARPU_CHECK(starpu_data_acquire_on_node(h, STARPU_MAIN_RAM, STARPU_W), "acquiring a tile to write it");
        auto ext = tile_extents(t);
        torch::Tensor tile = torch::from_blob((void *)starpu_vector_get_local_ptr(h), ext,
                                              torch::TensorOptions().dtype(scalar_type(dtype_)));
        tile.copy_(block_of(dense, tile_index(t), tile_shape_, ext));
        starpu_data_release(h);
    }
    bump_version();
}

torch::Tensor TileTensor::to_dense() {
    ensure_handles();
    count_wait();
    torch::Tensor out = torch::empty(shape_, torch::TensorOptions().dtype(scalar_type(dtype_)));
    for (int64_t t = 0; t < ntiles(); ++t) {
        auto h = handles_[t];
        NNTILE_STARPU_CHECK(starpu_data_acquire_on_node(h, STARPU_MAIN_RAM, STARPU_R), "acquiring a tile to read it");
        auto ext = tile_extents(t);
        torch::Tensor tile = torch::from_blob((void *)starpu_vector_get_local_ptr(h), ext,
                                              torch::TensorOptions().dtype(scalar_type(dtype_)));
        block_of(out, tile_index(t), tile_shape_, ext).copy_(tile);
        starpu_data_release(h);
    }
    return out;
}

void TileTensor::wont_use() {
    for (auto h : handles_) starpu_data_wont_use(h);
}

void TileTensor::invalidate() {
    for (auto h : handles_) starpu_data_invalidate_submit(h);
}

void TileTensor::release_handles(bool keep_data) {
    if (handles_.empty()) return;
    if (keep_data) saved_ = to_dense();
    for (auto h : handles_) starpu_data_unregister(h);
    handles_.clear();
}

}  // namespace nntile
