// The extension module nntile_torch._C: runtime, tile tensors and ops.
#include <starpu.h>
#include <torch/extension.h>

#include "kernels/adamw_q8.h"
#include "kernels/attention.h"
#include "ops/ops.h"
#include "runtime.h"
#include "tiles/stall_advice.h"
#include "task_trace.h"
#include "tiles/tile_tensor.h"

namespace py = pybind11;
using namespace nntile;

namespace {

DType parse_dtype(const std::string &s) {
    if (s == "float32") return DType::f32;
    if (s == "bfloat16") return DType::bf16;
    if (s == "int64") return DType::i64;
    throw std::invalid_argument("tile dtype must be 'float32', 'bfloat16' or 'int64' (got '" + s + "')");
}

const char *node_kind_name(enum starpu_node_kind k) {
    switch (k) {
        case STARPU_CPU_RAM: return "cpu";
        case STARPU_CUDA_RAM: return "cuda";
        case STARPU_DISK_RAM: return "disk";
        default: return "other";
    }
}

py::dict info() {
    NNTILE_CHECK(runtime_running(), "the nntile_torch runtime is not running");
    int major, minor, release;
    starpu_get_version(&major, &minor, &release);
    py::dict d;
    d["starpu_version"] = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
    py::dict workers;
    workers["cpu"] = starpu_cpu_worker_get_count();
    workers["cuda"] = starpu_cuda_worker_get_count();
    d["workers"] = workers;
    py::list nodes;
    for (unsigned n = 0; n < starpu_memory_nodes_get_count(); ++n) {
        char name[64];
        starpu_memory_node_get_name(n, name, sizeof(name));
        py::dict node;
        node["id"] = n;
        node["kind"] = node_kind_name(starpu_node_get_kind(n));
        node["name"] = std::string(name);
        node["total_bytes"] = (int64_t)starpu_memory_get_total(n);
        node["available_bytes"] = (int64_t)starpu_memory_get_available(n);
        nodes.append(node);
    }
    d["memory_nodes"] = nodes;
    auto *policy = starpu_sched_ctx_get_sched_policy(0);
    d["scheduler"] = std::string(policy && policy->policy_name ? policy->policy_name : "unknown");
    auto window = submission_window();
    if (window.first >= 0)
        d["submission_window"] = py::make_tuple(window.first, window.second);
    else
        d["submission_window"] = py::none();
    return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "nntile_torch native core: StarPU runtime, tiled tensors and tile ops";
#ifdef NNTILE_USE_CUDA
    m.attr("built_with_cuda") = true;
#else
    m.attr("built_with_cuda") = false;
#endif

    m.def(
        "init",
        [](int ncpus, int ncuda, int64_t cuda_limit, int64_t host_limit, std::string disk_path, int64_t disk_limit,
           std::string scheduler, int cpu_tasks, int places, int max_submitted_tasks) {
            RuntimeConfig c;
            c.ncpus = ncpus;
            c.ncuda = ncuda;
            c.cuda_memory_limit = cuda_limit;
            c.host_memory_limit = host_limit;
            c.disk_path = disk_path;
            c.disk_limit = disk_limit;
            c.scheduler = scheduler;
            c.cpu_tasks = cpu_tasks;
            c.places = places;
            c.max_submitted_tasks = max_submitted_tasks;
            py::gil_scoped_release nogil;
            runtime_init(c);
        },
        py::arg("ncpus"), py::arg("ncuda"), py::arg("cuda_memory_limit"), py::arg("host_memory_limit"),
        py::arg("disk_path"), py::arg("disk_limit"), py::arg("scheduler"), py::arg("cpu_tasks") = -1,
        py::arg("places") = -1, py::arg("max_submitted_tasks") = -1);
    m.def(
        "shutdown",
        [](bool keep_data) {
            py::gil_scoped_release nogil;
            runtime_shutdown(keep_data);
        },
        py::arg("keep_data") = true);
    m.def("running", &runtime_running);
    m.def("set_host_tasks", &set_host_tasks, py::arg("host"),
          "While set, tasks this thread submits run on CPU workers; returns the previous setting");
    m.def("places", [] {
        std::vector<int> w;
        if (placement_count() > 1)
            for (int p = 0; p < placement_count(); ++p) w.push_back(placement_worker(p));
        return w;
    });
    m.def("info", &info);
    m.def("attention_forwards", &kernels::attention_forwards);
    m.def("attention_dropout_keep", &kernels::attention_dropout_keep, py::arg("nseq"), py::arg("nheads"),
          py::arg("seq"), py::arg("p"), py::arg("seed"), py::arg("first_seq") = 0);
    m.def("tasks_submitted", &tasks_submitted);
    m.def("tasks_pending", [] { return starpu_task_nsubmitted(); });
    m.def("task_trace_start", [] {
        NNTILE_CHECK(runtime_running(), "the nntile_torch runtime is not running");
        task_trace_start();
    });
    m.def("task_trace_stop", [] {
        py::list out;
        for (const auto &r : task_trace_stop()) {
            py::dict d;
            d["name"] = r.name;
            d["worker"] = r.worker;
            d["kind"] = r.worker < 0 ? "" : starpu_worker_get_type(r.worker) == STARPU_CUDA_WORKER ? "cuda" : "cpu";
            const std::pair<const char *, double> times[] = {
                {"submit", r.submit},         {"push_start", r.push_start},     {"push_end", r.push_end},
                {"pop_start", r.pop_start},   {"pop_end", r.pop_end},           {"acquire_start", r.acquire_start},
                {"acquire_end", r.acquire_end}, {"start", r.start},             {"end", r.end},
                {"release_start", r.release_start}, {"release_end", r.release_end}, {"callback", r.callback},
                {"func_enter", r.func_enter}, {"func_exit", r.func_exit}};
            for (const auto &t : times) d[t.first] = t.second >= 0 ? py::object(py::float_(t.second)) : py::none();
            out.append(d);
        }
        return out;
    });
    m.def("cuda_memory_nodes", [] {  // the memory node of each GPU that runs CUDA workers, in worker order
        std::vector<int> nodes;
        for (unsigned w = 0; w < starpu_worker_get_count(); ++w)
            if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER) {
                int node = (int)starpu_worker_get_memory_node(w);
                if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
            }
        return nodes;
    });
    m.def("tile_bytes", &tile_bytes);
    m.def("peak_tile_bytes", &peak_tile_bytes);
    m.def("torch_stream_syncs", &torch_stream_syncs);
    m.def("reset_peak_tile_bytes", &reset_peak_tile_bytes);
    m.def("live_tile_tensors", [] {
        py::list out;
        for (const auto &t : live_tile_tensors()) out.append(py::make_tuple(t.name, t.dtype, t.bytes));
        return out;
    });
    m.def("memory_nodes", [] {
        py::list out;
        for (const auto &n : memory_nodes_tiles()) {
            py::dict d;
            d["name"] = n.name;
            d["total_bytes"] = n.total;
            d["used_bytes"] = n.used;
            d["allocated_bytes"] = n.allocated;
            d["valid_bytes"] = n.valid;
            d["sole_bytes"] = n.sole;
            d["stale_bytes"] = n.stale;
            d["home_bytes"] = n.homes;
            d["requested_bytes"] = n.requested;
            out.append(d);
        }
        return out;
    });
    m.def("memory_nodes_report", &memory_nodes_text);
    m.def("stall_advice_now", &stall_advice_now);
    // The advice for given nodes (dicts as memory_nodes() returns; missing byte counts are 0): what tests feed it.
    m.def(
        "stall_advice",
        [](const py::list &nodes, bool has_disk, int max_window) {
            std::vector<NodeTiles> v;
            for (const auto &item : nodes) {
                auto d = item.cast<py::dict>();
                auto get = [&](const char *k, int64_t dflt) {
                    return d.contains(k) ? d[k].cast<int64_t>() : dflt;
                };
                NodeTiles n;
                n.name = d["name"].cast<std::string>();
                n.total = get("total_bytes", -1);
                n.used = get("used_bytes", -1);
                n.allocated = get("allocated_bytes", 0);
                n.valid = get("valid_bytes", 0);
                n.sole = get("sole_bytes", 0);
                n.stale = get("stale_bytes", 0);
                n.homes = get("home_bytes", 0);
                n.requested = get("requested_bytes", 0);
                v.push_back(n);
            }
            return stall_advice(v, has_disk, max_window);
        },
        py::arg("nodes"), py::arg("has_disk"), py::arg("max_window"));
    m.def("host_home_budget", &host_home_budget);
    m.def("host_homed_bytes", &host_homed_bytes);
    m.def("blocking_waits", &blocking_waits);
    m.def("count_wait", &count_wait, "counts one host wait made outside nntile's C++ (a read of a GPU tensor)");
    m.def("wait_all", [] {
        py::gil_scoped_release nogil;
        wait_all();
    });

    // dynamic_attr: Python may mark tiles, e.g. logical_dtype = "float32" on the bf16 tiles of a bf16 master weight
    // (nntile_torch/tensor.py), which every TileTensor made over them then reports
    py::class_<TileTensor, TileTensorPtr>(m, "TileTensor", py::dynamic_attr())
        .def(py::init([](std::vector<int64_t> shape, std::vector<int64_t> tile_shape, const std::string &dtype,
                         const std::string &name, bool persistent) {
                 return std::make_shared<TileTensor>(shape, tile_shape, parse_dtype(dtype), name, persistent);
             }),
             py::arg("shape"), py::arg("tile_shape"), py::arg("dtype") = "float32", py::arg("name") = "",
             py::arg("persistent") = false)
        .def_property_readonly("persistent", &TileTensor::persistent)
        .def_property_readonly("host_homed", &TileTensor::host_homed)
        .def_property_readonly("shape", &TileTensor::shape)
        .def_property_readonly("tile_shape", &TileTensor::tile_shape)
        .def_property_readonly("grid", &TileTensor::grid)
        .def_property_readonly("ntiles", &TileTensor::ntiles)
        .def_property_readonly("dtype", [](const TileTensor &t) { return std::string(dtype_name(t.dtype())); })
        .def_property_readonly("version", &TileTensor::version)
        .def_property_readonly("name", &TileTensor::name)
        .def("same_tiling", &TileTensor::same_tiling)
        .def(
            "valid_nodes",
            [](TileTensor &t) {
                // Per tile, the StarPU memory nodes holding a valid copy (0 is host RAM): where tiles live.
                std::vector<std::vector<unsigned>> out;
                for (int64_t i = 0; i < t.ntiles(); ++i) {
                    std::vector<unsigned> nodes;
                    for (unsigned n = 0; n < starpu_memory_nodes_get_count(); ++n)
                        if (starpu_data_is_on_node(t.handle(i), n)) nodes.push_back(n);
                    out.push_back(nodes);
                }
                return out;
            },
            "per tile, the memory nodes with a valid copy (0: host RAM; GPUs after)")
        .def("from_dense", &TileTensor::from_dense, py::call_guard<py::gil_scoped_release>())
        .def("to_dense", &TileTensor::to_dense, py::arg("device") = py::none(),
             py::call_guard<py::gil_scoped_release>())
        .def("wont_use", &TileTensor::wont_use)
        .def("prefetch", &TileTensor::prefetch, py::arg("node"))
        .def("fetch", &TileTensor::fetch, py::arg("node"))
        .def("wait_written", &TileTensor::wait_written, py::call_guard<py::gil_scoped_release>())
        .def("invalidate", &TileTensor::invalidate);

    // Ops only submit tasks, but the submitting thread waits inside starpu_task_submit while the submission window
    // is full (runtime.h): without the GIL, so that the caller's other Python threads (data loading, progress,
    // the harness's slow-step report) run meanwhile.
    const auto nogil = py::call_guard<py::gil_scoped_release>();
    m.def(
        "gemm",
        [](bool ta, TileTensor &a, bool tb, TileTensor &b, TileTensor &c, float alpha, float beta,
           const std::string &precision, bool k_over_places, TileTensor *bias, TileTensor *a_source,
           TileTensor *bias_grad, const std::string &bias_grad_of, TileTensor *residual) {
            NNTILE_CHECK(bias_grad_of == "a" || bias_grad_of == "b",
                         "gemm: bias_grad_of must be 'a' or 'b' (got '" << bias_grad_of << "')");
            ops::gemm(ta, a, tb, b, c, alpha, beta, parse_precision(precision), k_over_places, bias, a_source,
                      bias_grad, bias_grad_of == "b", residual);
        },
        nogil, py::arg("trans_a"), py::arg("a"), py::arg("trans_b"), py::arg("b"), py::arg("c"),
        py::arg("alpha") = 1.f, py::arg("beta") = 0.f, py::arg("precision") = "fp32", py::arg("k_over_places") = false,
        py::arg("bias") = nullptr, py::arg("a_source") = nullptr, py::arg("bias_grad") = nullptr,
        py::arg("bias_grad_of") = "a", py::arg("residual") = nullptr);
    m.def("bias_grad", &ops::bias_grad, nogil, py::arg("dy"), py::arg("db"), py::arg("beta") = 0.f);
    m.def("add", &ops::add, nogil, py::arg("alpha"), py::arg("x"), py::arg("beta"), py::arg("y"));
    m.def("add_into", &ops::add_into, nogil, py::arg("alpha"), py::arg("x"), py::arg("beta"), py::arg("y"),
          py::arg("z"));
    m.def("gelu_forward", &ops::gelu_forward, nogil, py::arg("x"), py::arg("y"), py::arg("tanh_approx"));
    m.def("gelu_backward", &ops::gelu_backward, nogil, py::arg("dy"), py::arg("x"), py::arg("dx"),
          py::arg("tanh_approx"));
    m.def("layer_norm_forward", &ops::layer_norm_forward, nogil, py::arg("x"), py::arg("weight"), py::arg("bias"),
          py::arg("eps"), py::arg("y"), py::arg("mean"), py::arg("rstd"));
    m.def("layer_norm_backward", &ops::layer_norm_backward, nogil, py::arg("dy"), py::arg("x"), py::arg("mean"),
          py::arg("rstd"), py::arg("weight"), py::arg("dx"), py::arg("dweight"), py::arg("dbias"));
    m.def("rmsnorm_forward", &ops::rmsnorm_forward, nogil, py::arg("x"), py::arg("weight"), py::arg("eps"),
          py::arg("y"), py::arg("rstd"));
    m.def("rmsnorm_backward", &ops::rmsnorm_backward, nogil, py::arg("dy"), py::arg("x"), py::arg("rstd"),
          py::arg("weight"), py::arg("dx"), py::arg("dweight"));
    m.def("silu_mul_forward", &ops::silu_mul_forward, nogil, py::arg("g"), py::arg("u"), py::arg("y"));
    m.def("silu_mul_backward", &ops::silu_mul_backward, nogil, py::arg("dy"), py::arg("g"), py::arg("u"),
          py::arg("dg"), py::arg("du"));
    m.def("rope", &ops::rope, nogil, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("y"), py::arg("head_dim"),
          py::arg("backward") = false);
    m.def("attention_forward", &ops::attention_forward, nogil, py::arg("qkv"), py::arg("y"), py::arg("seq"),
          py::arg("nheads"), py::arg("scale"), py::arg("bf16") = false, py::arg("mask") = nullptr,
          py::arg("dropout_p") = 0.0f, py::arg("seed") = 0, py::arg("stats") = nullptr);
    m.def("attention_backward", &ops::attention_backward, nogil, py::arg("dy"), py::arg("qkv"), py::arg("dqkv"),
          py::arg("seq"), py::arg("nheads"), py::arg("scale"), py::arg("bf16") = false, py::arg("mask") = nullptr,
          py::arg("dropout_p") = 0.0f, py::arg("seed") = 0, py::arg("y") = nullptr, py::arg("stats") = nullptr);
    m.def("gqa_attention_forward", &ops::gqa_attention_forward, nogil, py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("y"), py::arg("seq"), py::arg("nheads"), py::arg("kv_heads"), py::arg("scale"),
          py::arg("bf16") = false, py::arg("mask") = nullptr, py::arg("dropout_p") = 0.0f, py::arg("seed") = 0,
          py::arg("stats") = nullptr);
    m.def("gqa_attention_backward", &ops::gqa_attention_backward, nogil, py::arg("dy"), py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("seq"), py::arg("nheads"),
          py::arg("kv_heads"), py::arg("scale"), py::arg("bf16") = false, py::arg("mask") = nullptr,
          py::arg("dropout_p") = 0.0f, py::arg("seed") = 0, py::arg("y") = nullptr, py::arg("stats") = nullptr);
    m.def("cached_attention_forward", &ops::cached_attention_forward, nogil, py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("mask"), py::arg("y"), py::arg("q_len"), py::arg("kv_len"), py::arg("nheads"), py::arg("kv_heads"),
          py::arg("hd"), py::arg("q_col"), py::arg("k_col"), py::arg("v_col"), py::arg("scale"),
          py::arg("bf16") = false, py::arg("kv_rows") = 0);
    m.def("index_check", &ops::index_check, nogil, py::arg("ids"), py::arg("lo"), py::arg("hi"), py::arg("ignore"),
          py::arg("what"));
    m.def("embedding_forward", &ops::embedding_forward, nogil, py::arg("ids"), py::arg("table"), py::arg("out"));
    m.def("dropout", &ops::dropout, nogil, py::arg("x"), py::arg("y"), py::arg("p"), py::arg("seed"));
    m.def("add_blocks", &ops::add_blocks, nogil, py::arg("src"), py::arg("dst"));
    m.def("sum_blocks", &ops::sum_blocks, nogil, py::arg("src"), py::arg("dst"));
    m.def("cross_entropy_forward", &ops::cross_entropy_forward, nogil, py::arg("labels"), py::arg("logits"),
          py::arg("stats"), py::arg("acc"), py::arg("loss"), py::arg("mean"));
    m.def("cross_entropy_backward", &ops::cross_entropy_backward, nogil, py::arg("labels"), py::arg("logits"),
          py::arg("stats"), py::arg("acc"), py::arg("gout"), py::arg("dlogits"), py::arg("mean"));
    m.def("embedding_backward", &ops::embedding_backward, nogil, py::arg("ids"), py::arg("dy"), py::arg("dtable"),
          py::arg("accumulate") = false);
    m.def("convert", &ops::convert, nogil, py::arg("src"), py::arg("dst"));
    m.def("pointwise", &ops::pointwise, nogil, py::arg("op"), py::arg("dst"), py::arg("a") = nullptr,
          py::arg("b") = nullptr, py::arg("c") = nullptr, py::arg("s0") = 0.f, py::arg("s1") = 0.f);
    m.def("pointwise_reduce", &ops::pointwise_reduce, nogil, py::arg("op"), py::arg("x"), py::arg("dst"),
          py::arg("s0") = 0.f, py::arg("accumulate") = false);
    m.def("gather_scalars", &ops::gather_scalars, nogil, py::arg("srcs"), py::arg("dst"));
    m.def("adamw", &ops::adamw, nogil, py::arg("grad"), py::arg("param"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
          py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
          py::arg("init_state"), py::arg("seed") = 0, py::arg("copy") = nullptr);
    m.def("adamw_q8", &ops::adamw_q8, nogil, py::arg("grad"), py::arg("param"), py::arg("exp_avg"),
          py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
          py::arg("weight_decay"), py::arg("step"), py::arg("init_state"), py::arg("seed") = 0,
          py::arg("copy") = nullptr);
    // The 8-bit moments' layout (kernels/adamw_q8.h), for the optimizer and the tests.
    m.def("q8_blocks", [](int64_t n) { return kernels::q8_blocks(n); }, py::arg("n"));
    m.def("q8_words", [](int64_t n) { return kernels::q8_words(n); }, py::arg("n"));
    m.def(
        "quant_map8",
        [](bool is_signed) {
            auto out = torch::empty({256}, torch::kFloat32);
            kernels::quant_map8(is_signed, out.data_ptr<float>());
            return out;
        },
        py::arg("signed"));
    m.def(
        "q8_quantize",
        [](const torch::Tensor &x, bool is_signed) {
            NNTILE_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32,
                         "q8_quantize takes a float32 CPU tensor");
            auto xc = x.contiguous().reshape({-1});
            auto words = torch::empty({kernels::q8_words(xc.numel())}, torch::kFloat32);
            kernels::q8_quantize_cpu(xc.numel(), is_signed, xc.data_ptr<float>(), words.data_ptr<float>());
            return words;
        },
        py::arg("x"), py::arg("signed"));
    m.def(
        "q8_dequantize",
        [](const torch::Tensor &words, int64_t n, bool is_signed) {
            NNTILE_CHECK(words.device().is_cpu() && words.scalar_type() == torch::kFloat32 && words.is_contiguous() &&
                             words.numel() >= kernels::q8_words(n),
                         "q8_dequantize takes q8_words(n) = " << kernels::q8_words(n)
                                                              << " contiguous float32 CPU words (got "
                                                              << words.numel() << ")");
            auto x = torch::empty({n}, torch::kFloat32);
            kernels::q8_dequantize_cpu(n, is_signed, words.data_ptr<float>(), x.data_ptr<float>());
            return x;
        },
        py::arg("words"), py::arg("n"), py::arg("signed"));
}
