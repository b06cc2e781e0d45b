// Tiled GEMM: C[i, j] = sum_k op(A)[i, k] op(B)[k, j], one task per (i, j, k).
#include "../codelets/codelets.h"
#include "../runtime.h"
#include "ops.h"

#include <memory>
#include <vector>

namespace nntile::ops {

namespace {
// Tiling of op(X) along its rows (which = 0) or columns (which = 1) as (extent, tile size).
std::pair<int64_t, int64_t> op_dim(const TileTensor &x, bool trans, int which) {
    int d = trans ? 1 - which : which;
    return {x.shape()[d], x.tile_shape()[d]};
}
}  // namespace

void gemm(bool trans_a, TileTensor &a, bool trans_b, TileTensor &b, TileTensor &c, float alpha, float beta,
          Precision precision, bool k_over_places, TileTensor *bias, TileTensor *a_source, TileTensor *bias_grad,
          bool bias_grad_of_b, TileTensor *residual) {
    NNTILE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
                 "gemm takes 2-d tile tensors (got " << a.ndim() << ", " << b.ndim() << ", " << c.ndim() << " dims)");
    NNTILE_CHECK(a.dtype() != DType::i64 && b.dtype() != DType::i64 && c.dtype() != DType::i64,
                 "gemm takes float32 or bfloat16 tiles");
    auto m = op_dim(a, trans_a, 0), ka = op_dim(a, trans_a, 1);
    auto kb = op_dim(b, trans_b, 0), n = op_dim(b, trans_b, 1);
    NNTILE_CHECK(ka == kb, "gemm: inner dimensions or their tiles differ (op(A) has " << ka.first << " columns in tiles of "
                                                                                      << ka.second << ", op(B) " << kb.first
                                                                                      << " rows in tiles of " << kb.second
                                                                                      << ")");
    NNTILE_CHECK(c.shape()[0] == m.first && c.shape()[1] == n.first && c.tile_shape()[0] == m.second &&
                     c.tile_shape()[1] == n.second,
                 "gemm: C's shape/tiles (" << c.shape()[0] << "x" << c.shape()[1] << " in " << c.tile_shape()[0] << "x"
                                           << c.tile_shape()[1] << ") do not match op(A) op(B) (" << m.first << "x"
                                           << n.first << " in " << m.second << "x" << n.second << ")");
    NNTILE_CHECK(c.dtype() == DType::f32 || precision != Precision::fp32 || a.dtype() == c.dtype(),
                 "gemm: output dtype " << dtype_name(c.dtype()) << " needs a reduced-precision mode");
    int64_t gm = c.grid()[0], gn = c.grid()[1], gk = (ka.first + ka.second - 1) / ka.second;
    if (bias) {
        NNTILE_CHECK(!k_over_places, "gemm: a bias is added by the forward GEMM only (not with k_over_places)");
        NNTILE_CHECK(bias->dtype() == DType::f32 && c.dtype() == DType::f32,
                     "gemm: a bias needs float32 bias and C tiles (got " << dtype_name(bias->dtype()) << " and "
                                                                         << dtype_name(c.dtype()) << ")");
        NNTILE_CHECK(bias->ndim() == 1 && bias->shape()[0] == n.first && bias->tile_shape()[0] == n.second,
                     "gemm: the bias must be (" << n.first << ",) in tiles of " << n.second
                                               << " like C's columns (got (" << (bias->ndim() ? bias->shape()[0] : 0)
                                               << ",) in tiles of " << (bias->ndim() ? bias->tile_shape()[0] : 0)
                                               << ")");
    }
    if (bias_grad) {
        // dy's stored tiles are (k, width): A when trans_a (width m, C's rows), B when not trans_b (n, C's columns)
        auto width = bias_grad_of_b ? n : m;
        DType tdy = bias_grad_of_b ? b.dtype() : a.dtype();
        NNTILE_CHECK(!bias, "gemm: a bias and a bias gradient in one GEMM");
        // whether cuBLASLt's epilogue scales its vector by alpha is not documented: a dW GEMM's alpha is 1
        NNTILE_CHECK(alpha == 1.f, "gemm: a bias gradient needs alpha 1 (got " << alpha << ")");
        NNTILE_CHECK(bias_grad_of_b ? !trans_b : trans_a,
                     "gemm: a bias gradient sums dy over K, stored (K, N): A transposed or B not (got trans_"
                         << (bias_grad_of_b ? "b true" : "a false") << ")");
        NNTILE_CHECK(tdy == DType::bf16 && bias_grad->dtype() == DType::f32 && c.dtype() == DType::f32,
                     "gemm: a bias gradient needs a bfloat16 dy, a float32 bias gradient and a float32 C (got "
                         << dtype_name(tdy) << ", " << dtype_name(bias_grad->dtype()) << " and "
                         << dtype_name(c.dtype()) << ")");
        NNTILE_CHECK(bias_grad->ndim() == 1 && bias_grad->shape()[0] == width.first &&
                         bias_grad->tile_shape()[0] == width.second,
                     "gemm: the bias gradient must be (" << width.first << ",) in tiles of " << width.second
                                                        << " like dy's columns (got ("
                                                        << (bias_grad->ndim() ? bias_grad->shape()[0] : 0)
                                                        << ",) in tiles of "
                                                        << (bias_grad->ndim() ? bias_grad->tile_shape()[0] : 0) << ")");
    }
    if (residual) {
        NNTILE_CHECK(!k_over_places && !bias_grad,
                     "gemm: a residual is added by a forward GEMM only (not with k_over_places or a bias gradient)");
        NNTILE_CHECK(residual->dtype() == DType::f32 && c.dtype() == DType::f32,
                     "gemm: a residual needs float32 residual and C tiles (got " << dtype_name(residual->dtype())
                                                                                 << " and " << dtype_name(c.dtype())
                                                                                 << ")");
        NNTILE_CHECK(residual->shape() == c.shape() && residual->tile_shape() == c.tile_shape(),
                     "gemm: the residual must have C's shape and tiles");
        NNTILE_CHECK(residual->handle(0) != c.handle(0), "gemm: the residual cannot be C itself");
    }
    // The bias gradient's tile of C's tile (i, j): dy's column tile i (A) or j (B), summed over K by the tasks of
    // one C tile per dy column tile (j == 0, or i == 0), so that each dy tile is summed once.
    auto carries_bias_grad = [&](int64_t i, int64_t j) { return bias_grad && (bias_grad_of_b ? i == 0 : j == 0); };
    auto bias_grad_tile = [&](int64_t i, int64_t j) { return bias_grad->handle(bias_grad_of_b ? j : i); };
    std::vector<char> a_cast;  // per tile of A: written from a_source already
    if (a_source) {
        NNTILE_CHECK(!k_over_places, "gemm: A is cast from a source only in a GEMM whose K stays in one place "
                                     "(not with k_over_places)");
        NNTILE_CHECK(a_source->dtype() == DType::f32 && a.dtype() == DType::bf16,
                     "gemm: A cast from a source needs float32 source and bfloat16 A tiles (got "
                         << dtype_name(a_source->dtype()) << " and " << dtype_name(a.dtype()) << ")");
        NNTILE_CHECK(a_source->shape() == a.shape() && a_source->tile_shape() == a.tile_shape(),
                     "gemm: A's source must have A's shape and tiles");
        a_cast.assign((size_t)a.ntiles(), 0);
    }
    // hbg: the bias gradient tile this task writes (bg_beta 0) or adds to (1), or nullptr
    auto submit = [&](int64_t i, int64_t j, int64_t k, float b0, starpu_data_handle_t hc, DType tc,
                      starpu_data_handle_t hbg = nullptr, float bg_beta = 0.f) {
        kernels::GemmShape s{c.tile_extent(0, i), c.tile_extent(1, j), std::min(ka.second, ka.first - k * ka.second),
                             trans_a, trans_b, alpha, b0};
        int64_t ra = trans_a ? k : i, ca = trans_a ? i : k;  // A's tile in A's own grid
        auto ha = a.handle2(ra, ca);
        auto hb = trans_b ? b.handle2(j, k) : b.handle2(k, j);
        // the bias goes with the task that starts C's tile (k == 0), so it is added once
        starpu_data_handle_t hbias = bias && k == 0 ? bias->handle(j) : nullptr;
        starpu_data_handle_t hsrc = nullptr;
        int64_t a_elements = 0;
        if (a_source && !a_cast[(size_t)(ra * a.grid()[1] + ca)]) {
            a_cast[(size_t)(ra * a.grid()[1] + ca)] = 1;
            hsrc = a_source->handle2(ra, ca);
            a_elements = a.tile_extent(0, ra) * a.tile_extent(1, ca);
        }
        // the residual goes with the task that finishes C's tile (the K chain's last), so it is added once, last
        starpu_data_handle_t hres = residual && k == gk - 1 ? residual->handle2(i, j) : nullptr;
        codelets::submit_gemm(s, precision, a.dtype(), ha, b.dtype(), hb, tc, hc, 0, hbias, hsrc, a_elements, hbg,
                              bias_grad_of_b, bg_beta, hres);
    };
    int64_t places = placement_count();
    if (!k_over_places || places == 1 || gk == 1) {
        // C's row tile i (an activation row tile, or a weight's) runs on place i, the whole K chain there.
        for (int64_t i = 0; i < gm; ++i) {
            OnWorker on(placement_worker(i));
            for (int64_t j = 0; j < gn; ++j)
                for (int64_t k = 0; k < gk; ++k)
                    submit(i, j, k, k == 0 ? beta : 1.f, c.handle2(i, j), c.dtype(),
                           carries_bias_grad(i, j) ? bias_grad_tile(i, j) : nullptr, k == 0 ? 0.f : 1.f);
        }
        c.bump_version();
        if (a_source) a.bump_version();
        if (bias_grad) bias_grad->bump_version();
        return;
    }
    // K runs over row tiles spread over places (a weight gradient: sum over the batch). Place p sums the K
    // tiles k = p (mod places) where they live; C's own place (that of its row tile i, where the optimizer
    // updates it) sums its share into C, the others into partial tiles, which are then added to C in place order.
    // A bias gradient is split the same way, beside C's tile that carries it.
    NNTILE_CHECK(c.dtype() == DType::f32, "gemm: a K split over places needs a float32 C");
    for (int64_t i = 0; i < gm; ++i) {
        int64_t home = i % places;
        for (int64_t j = 0; j < gn; ++j) {
            std::vector<std::unique_ptr<TileTensor>> partial, partial_bg;
            bool with_bg = carries_bias_grad(i, j);
            int64_t bg_extent = with_bg ? bias_grad->tile_extent(0, bias_grad_of_b ? j : i) : 0;
            for (int64_t p = 0; p < std::min(places, gk); ++p) {
                OnWorker on(placement_worker(p));
                TileTensor *t = nullptr;
                starpu_data_handle_t hbg = with_bg ? bias_grad_tile(i, j) : nullptr;
                if (p != home) {
                    partial.push_back(std::make_unique<TileTensor>(
                        std::vector<int64_t>{c.tile_extent(0, i), c.tile_extent(1, j)},
                        std::vector<int64_t>{c.tile_extent(0, i), c.tile_extent(1, j)}, DType::f32, "gemm.partial"));
                    t = partial.back().get();
                    if (with_bg) {
                        partial_bg.push_back(std::make_unique<TileTensor>(std::vector<int64_t>{bg_extent},
                                                                          std::vector<int64_t>{bg_extent}, DType::f32,
                                                                          "gemm.bias_grad_partial"));
                        hbg = partial_bg.back()->handle(0);
                    }
                }
                for (int64_t k = p; k < gk; k += places) {
                    bool first = k == p;
                    if (t)
                        submit(i, j, k, first ? 0.f : 1.f, t->handle(0), DType::f32, hbg, first ? 0.f : 1.f);
                    else
                        submit(i, j, k, first ? beta : 1.f, c.handle2(i, j), c.dtype(), hbg, first ? 0.f : 1.f);
                }
            }
            OnWorker on(placement_worker(home));
            if (home >= std::min(places, gk) && beta == 0.f) {
                // C's place had no K tile of its own: the first partial initializes it
                codelets::submit_add(c.tile_extent(0, i) * c.tile_extent(1, j), 1.f, partial.front()->handle(0), 0.f,
                                     c.handle2(i, j));
                for (size_t q = 1; q < partial.size(); ++q)
                    codelets::submit_add(c.tile_extent(0, i) * c.tile_extent(1, j), 1.f, partial[q]->handle(0), 1.f,
                                         c.handle2(i, j));
                for (size_t q = 0; q < partial_bg.size(); ++q)
                    codelets::submit_add(bg_extent, 1.f, partial_bg[q]->handle(0), q == 0 ? 0.f : 1.f,
                                         bias_grad_tile(i, j));
            } else {
                NNTILE_CHECK(home < std::min(places, gk), "gemm: a K split over places with beta != 0 needs C's place to hold a K tile");
                for (auto &t : partial)
                    codelets::submit_add(c.tile_extent(0, i) * c.tile_extent(1, j), 1.f, t->handle(0), 1.f,
                                         c.handle2(i, j));
                for (auto &t : partial_bg)
                    codelets::submit_add(bg_extent, 1.f, t->handle(0), 1.f, bias_grad_tile(i, j));
            }
        }
    }
    c.bump_version();
    if (bias_grad) bias_grad->bump_version();
}

}  // namespace nntile::ops
