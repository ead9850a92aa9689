// Matrix products through oneDNN or OpenBLAS; see Note [CPU matrix products] in matmul.hpp.
#include "cpu/matmul.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "common/bf16.hpp"
#include "lockstep/error.hpp"

namespace lockstep::cpu {
namespace {

using dnnl::memory;

// oneDNN computes with as many OpenMP threads as the calling thread may start: one, here. The
// OpenMP runtime is oneDNN's own (Debian's libdnnl loads libgomp), looked up rather than linked,
// so that a build with another compiler's OpenMP cannot set the wrong runtime's threads; a
// oneDNN without OpenMP has no such function, and no team to start. It is looked up among
// oneDNN's own dependencies first: in a process that loaded lockstep with RTLD_LOCAL (Python
// imports extension modules so), the runtime is not in the global scope that RTLD_DEFAULT
// searches, and each product would start a team of every core's threads beside the workers.
void* find_omp_set_num_threads() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&dnnl_version), &info) != 0 && info.dli_fname != nullptr) {
    if (void* dnnl = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      void* found = dlsym(dnnl, "omp_set_num_threads");  // the library, then its dependencies
      dlclose(dnnl);  // oneDNN stays loaded: this process links it
      if (found != nullptr) return found;
    }
  }
  return dlsym(RTLD_DEFAULT, "omp_set_num_threads");
}

void one_onednn_thread() {
  using SetThreads = void (*)(int);
  static const auto set_threads = reinterpret_cast<SetThreads>(find_omp_set_num_threads());
  thread_local const bool set = [] {
    if (set_threads) set_threads(1);
    return true;
  }();
  (void)set;
}

// A (m, k), B (k, n), C (m, n) of one call, or (count, ...) of a batch, with strides from the
// leading dimensions: a transposed operand is stored (k, m), so its rows are columns here.
struct Descs {
  memory::desc a, b, c;
};

Descs descs_of(const GemmCall& c) {
  const auto inputs = c.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dims sa = c.at ? memory::dims{1, c.lda} : memory::dims{c.lda, 1};
  const memory::dims sb = c.bt ? memory::dims{1, c.ldb} : memory::dims{c.ldb, 1};
  const memory::dims sc{c.ldc, 1};
  const auto f32 = memory::data_type::f32;
  if (c.count == 1)
    return {memory::desc({c.m, c.k}, inputs, sa), memory::desc({c.k, c.n}, inputs, sb),
            memory::desc({c.m, c.n}, f32, sc)};
  const auto batched = [](memory::dim stride, const memory::dims& s) {
    return memory::dims{stride, s[0], s[1]};
  };
  return {memory::desc({c.count, c.m, c.k}, inputs, batched(c.stride_a, sa)),
          memory::desc({c.count, c.k, c.n}, inputs, batched(c.stride_b, sb)),
          memory::desc({c.count, c.m, c.n}, f32, batched(c.stride_c, sc))};
}

// alpha scales the product; beta adds beta C to it. The scratchpad is ours (run() passes a
// buffer of its thread), so that blocks on several threads can run one primitive at once.
dnnl::matmul::primitive_desc primitive_desc_of(const GemmCall& c, const dnnl::engine& engine) {
  one_onednn_thread();
  const Descs d = descs_of(c);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (c.alpha != 1.0f) attr.set_output_scales(0, {c.alpha});
  if (c.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(c.beta);
    attr.set_post_ops(ops);
  }
  return {dnnl::matmul::desc(d.a, d.b, d.c), attr, engine};
}

// Whether oneDNN may compute with the CPU's bf16 instructions (AVX512_BF16, AMX), as far as
// ONEDNN_MAX_CPU_ISA lets it. Without them it has no bf16 matmul at all below AVX-512 (oneDNN
// 2.6: creating one throws), and on AVX-512 only gemm:jit's emulation, at about a third of its
// fp32 rate (bench/RESULTS.md): bf16 products widen to fp32 there (Note [CPU matrix products]).
bool onednn_has_bf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

// The primitive oneDNN makes for `c`, or nothing for bf16 inputs it has no bf16 kernel for:
// none for the CPU, or a reference implementation.
std::optional<dnnl::matmul::primitive_desc> native_primitive_desc(const GemmCall& c,
                                                                  const dnnl::engine& engine) {
  if (c.bf16 && !onednn_has_bf16()) return std::nullopt;
  auto pd = primitive_desc_of(c, engine);
  if (c.bf16 && std::string_view(pd.impl_info_str()).starts_with("ref")) return std::nullopt;
  return pd;
}

// The kernel oneDNN picks for a product of the large MLP's size: "brg:avx512_core", ...
std::string onednn_kernel(bool bf16) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const GemmCall probe{.bf16 = bf16, .m = 256, .n = 1024, .k = 1024, .lda = 1024, .ldb = 1024,
                       .ldc = 1024};
  const auto pd = native_primitive_desc(probe, engine);
  return pd ? pd->impl_info_str() : "none, widened to fp32";
}

// The elements an operand spans: `count` matrices of `rows` rows `ld` apart.
std::size_t extent(const GemmCall& c, bool transposed, int rows, int cols, int ld,
                   std::int64_t stride) {
  if (transposed) std::swap(rows, cols);
  return static_cast<std::size_t>(c.count - 1) * static_cast<std::size_t>(stride) +
         static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) +
         static_cast<std::size_t>(cols);
}

// bf16 bits to floats (exact), into a buffer of the calling thread.
const float* widened(const void* bf16, std::size_t n, std::vector<float>& buffer) {
  const auto* h = static_cast<const std::uint16_t*>(bf16);
  buffer.resize(n);
  for (std::size_t i = 0; i < n; ++i) buffer[i] = detail::bf16_to_float(h[i]);
  return buffer.data();
}

bool has_avx2_or_avx512() {
  return __builtin_cpu_supports("avx2") || __builtin_cpu_supports("avx512f");
}

GemmPath choose_gemm_path() {
  const char* env = std::getenv("LOCKSTEP_CPU_GEMM");
  const std::string_view asked = env ? env : "";
  if (!asked.empty() && asked != "onednn" && asked != "openblas")
    throw InputError(
        fmt::format("LOCKSTEP_CPU_GEMM: expected onednn or openblas, got '{}'", asked));
  const std::string core = openblas_get_corename();
  const bool prescott_mismatch = core == "Prescott" && has_avx2_or_avx512();
  GemmPath path;
  if (prescott_mismatch)
    path.note = "OpenBLAS runs its generic Prescott kernels on this CPU, which has AVX2 or "
                "AVX-512; oneDNN computes instead";
  const std::string_view config = openblas_get_config();  // "OpenBLAS 0.3.21 NO_LAPACKE ..."
  const std::string openblas(config.substr(0, config.find(' ', config.find(' ') + 1)));
  if (asked == "openblas" && !prescott_mismatch) {
    path.library = GemmLibrary::openblas;
    path.description = fmt::format("{} {} (fp32)", openblas, core);
    path.note = "LOCKSTEP_CPU_GEMM=openblas";
    return path;
  }
  const dnnl::version_t* v = dnnl::version();
  path.description = fmt::format("oneDNN {}.{} {} (fp32), {} (bf16)", v->major, v->minor,
                                 onednn_kernel(false), onednn_kernel(true));
  if (!prescott_mismatch) {
    path.small_on_openblas = true;
    path.description += fmt::format("; {} {} for single products of at most 2^17 multiply-adds",
                                    openblas, core);
  }
  return path;
}

}  // namespace

const GemmPath& gemm_path() {
  static const GemmPath path = choose_gemm_path();
  return path;
}

GemmLibrary tile_library() {
  const GemmPath& path = gemm_path();
  return path.small_on_openblas ? GemmLibrary::openblas : path.library;
}

// ---- Matmul -------------------------------------------------------------------------------------

struct GemmCallHash {
  std::size_t operator()(const GemmCall& c) const noexcept {
    std::size_t h = 0;
    for (const std::int64_t x :
         {std::int64_t{c.at}, std::int64_t{c.bt}, std::int64_t{c.m}, std::int64_t{c.n},
          std::int64_t{c.k}, std::int64_t{c.lda}, std::int64_t{c.ldb}, std::int64_t{c.ldc},
          std::int64_t{c.count}, c.stride_a, c.stride_b, c.stride_c})
      h = h * 1000003u ^ std::hash<std::int64_t>{}(x);
    h ^= std::size_t{c.bf16} << 7;
    return h ^ std::hash<float>{}(c.alpha) ^ (std::hash<float>{}(c.beta) << 1);
  }
};

struct Matmul::Onednn {
  struct Prepared {
    dnnl::matmul primitive;
    Descs descs;
    memory::desc scratchpad;
    bool widen = false;  // bf16 inputs without a bf16 kernel: run() widens them to fp32
  };
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::unordered_map<GemmCall, Prepared, GemmCallHash> prepared;
};

Matmul::Matmul(GemmLibrary library) {
  if (library == GemmLibrary::onednn) onednn_ = std::make_unique<Onednn>();
  small_on_openblas_ = library == GemmLibrary::onednn && gemm_path().small_on_openblas;
}

bool Matmul::on_openblas(const GemmCall& c) const {
  if (!onednn_) return true;
  const auto work = std::uint64_t(c.m) * std::uint64_t(c.n) * std::uint64_t(c.k);
  return small_on_openblas_ && c.count == 1 && work <= kSmallProduct;
}

Matmul::~Matmul() = default;

void Matmul::prepare(const GemmCall& call) {
  if (on_openblas(call) || onednn_->prepared.contains(call)) return;
  try {
    const auto pd = native_primitive_desc(call, onednn_->engine);
    if (!pd) {
      onednn_->prepared.emplace(call, Onednn::Prepared{.primitive = {}, .descs = {},
                                                       .scratchpad = {}, .widen = true});
      return prepare(fp32_of(call));
    }
    onednn_->prepared.emplace(
        call, Onednn::Prepared{dnnl::matmul(*pd), descs_of(call), pd->scratchpad_desc()});
  } catch (const dnnl::error& e) {
    throw std::runtime_error(fmt::format(
        "oneDNN matmul for {}x{}x{} (transposes {}{}, ld {} {} {}, {} matrices, strides "
        "{} {} {}): {}",
        call.m, call.n, call.k, call.at ? 'T' : 'N', call.bt ? 'T' : 'N', call.lda, call.ldb,
        call.ldc, call.count, call.stride_a, call.stride_b, call.stride_c, e.what()));
  }
}

std::size_t Matmul::primitives() const noexcept {
  if (!onednn_) return 0;
  return static_cast<std::size_t>(std::ranges::count_if(
      onednn_->prepared, [](const auto& entry) { return !entry.second.widen; }));
}

GemmCall Matmul::fp32_of(GemmCall call) {
  call.bf16 = false;
  return call;
}

void Matmul::run(const GemmCall& c, const void* a, const void* b, float* out) const {
  if (c.bf16 && (on_openblas(c) || onednn_->prepared.at(c).widen)) {
    thread_local std::vector<float> wa, wb;
    const float* fa = widened(a, extent(c, c.at, c.m, c.k, c.lda, c.stride_a), wa);
    const float* fb = widened(b, extent(c, c.bt, c.k, c.n, c.ldb, c.stride_b), wb);
    return run(fp32_of(c), fa, fb, out);
  }
  if (on_openblas(c)) {
    const auto* fa = static_cast<const float*>(a);
    const auto* fb = static_cast<const float*>(b);
    for (int i = 0; i < c.count; ++i)
      cblas_sgemm(CblasRowMajor, c.at ? CblasTrans : CblasNoTrans, c.bt ? CblasTrans : CblasNoTrans,
                  c.m, c.n, c.k, c.alpha, fa + i * c.stride_a, c.lda, fb + i * c.stride_b, c.ldb,
                  c.beta, out + i * c.stride_c, c.ldc);
    return;
  }
  one_onednn_thread();
  const Onednn::Prepared& p = onednn_->prepared.at(c);
  thread_local std::vector<std::byte> scratchpad;
  if (scratchpad.size() < p.scratchpad.get_size()) scratchpad.resize(p.scratchpad.get_size());
  const dnnl::engine& engine = onednn_->engine;
  dnnl::stream stream(engine);
  p.primitive.execute(
      stream, {{DNNL_ARG_SRC, memory(p.descs.a, engine, const_cast<void*>(a))},
               {DNNL_ARG_WEIGHTS, memory(p.descs.b, engine, const_cast<void*>(b))},
               {DNNL_ARG_DST, memory(p.descs.c, engine, out)},
               {DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, engine, scratchpad.data())}});
  stream.wait();
}

}  // namespace lockstep::cpu
