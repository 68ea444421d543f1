// Host-side check of the block formats' CUDA kernels, no GPU needed: every kernel body is a
// __host__ __device__ function (block_*.cuh), so this program runs each launch's threads one
// after another on the CPU (warp shuffles and shared memory emulated between the phases)
// and compares the bytes with the CPU kernels (ffi/cpu/block_kernels.cc, included below):
// codes (both packed along the quantized axis: FP4 2 per byte low nibble first, FP6 4 in 3
// bytes, FP8 1 per byte; random codes packed here from that definition), scales,
// fake_quantize's and dequantize's f32 bits, quantize_2x's four outputs, and the tensor
// amax (the CPU kernel's too, both against a loop here). Every element format x scale kind (E8M0 RCEIL / FLOOR, E4M3 with and without a
// tensor scale, FP32, FP32 pow2) x input dtype x stochastic rounding on / off x block
// (1x8 .. 1x16384, b x 1 along a strided axis, 8x8 .. 128x128 tiles, and odd blocks for the
// generic kernel), on odd shapes with zero, -0, subnormal, huge, Inf and NaN elements and
// extreme tensor scales (the exact paths); each kernel that takes a view runs it, and
// dequantize also runs on random codes and scales. What it cannot see: the shuffles
// themselves, the 16-byte vector paths, __syncthreads, launch configurations, the FFI
// plumbing (ffi/cuda/tests/gpu_check_block.py checks those on a GPU).
//
//   J=$(python -c "import jax; print(jax.ffi.include_dir())")
//   nvcc -std=c++17 -O1 -x c++ -DMXJAX_HD=inline -Iffi -Iffi/include -isystem $J \
//     ffi/cuda/tests/block_host_check.cu -o /tmp/block_host_check && /tmp/block_host_check
// (as tests/test_cuda_host_check.py: -x c++ compiles it with the host compiler alone, and
// MXJAX_HD=inline spares it the forced inlining; plain nvcc builds it too, slower)
#define MXJAX_ISA_NS scalar  // the CPU kernels below are then cpu::block_kernels_scalar()
#define MXJAX_HOST_CHECK 1   // the kernels' bodies only: no __global__ functions, no launches

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/amax_kernels.cc"
#include "cpu/block_kernels.cc"
#include "cpu/random_bits_kernels.cc"
#include "cpu/rht_kernels.cc"
#include "cuda/block_dequantize.cuh"
#include "cuda/block_launch.cuh"
#include "cuda/tensor_amax.cuh"

namespace mxjax::cuda {
namespace {

int failures = 0;
int64_t checks = 0, refused = 0;
std::string where;                       // the case being checked
std::map<std::string, int> failed_what;  // failures by what was compared

void expect_bytes(const void* got, const void* want, size_t n, const char* what) {
  ++checks;
  if (std::memcmp(got, want, n) == 0) return;
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  size_t i = 0;
  while (g[i] == w[i]) ++i;
  ++failed_what[what];
  if (++failures <= 30) {
    std::printf("FAIL %s %s: byte %zu of %zu: got %02x want %02x\n", where.c_str(), what, i, n,
                g[i], w[i]);
    if (std::getenv("VERBOSE") && n % 4 == 0) {
      uint32_t a, b;
      std::memcpy(&a, g + i / 4 * 4, 4), std::memcpy(&b, w + i / 4 * 4, 4);
      std::printf("  word %zu: got %08x want %08x\n", i / 4, a, b);
    }
  }
}

template <class V>
void expect_equal(const V& got, const V& want, const char* what) {
  if (got.size() != want.size()) {
    ++failures;
    std::printf("FAIL %s %s: sizes %zu / %zu\n", where.c_str(), what, got.size(), want.size());
    return;
  }
  expect_bytes(got.data(), want.data(), got.size() * sizeof(got[0]), what);
}

// ---------------------------------------------------------------------------------------
// Inputs

// f32 bit patterns in runs of 16 of one magnitude (2^-150 .. 2^128 now and then, else
// 2^-30 .. 2^30): zeros, -0, subnormals, random bits, FLT_MAX; an Inf / NaN with
// probability `special` per element. One run in 20 holds only zeros and values of one
// tiny magnitude (2^-149 .. 2^-120: the exact paths of scales far from 1).
std::vector<uint32_t> f32_inputs(int64_t count, double special, std::mt19937& rng) {
  std::vector<uint32_t> x(count);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> u01;
  std::uniform_int_distribution<int> kind(0, 99), mid(-30, 30), wide(-150, 127), tiny(-149, -120);
  std::uniform_int_distribution<uint32_t> any;
  int shift = 0;
  bool pure = false;
  for (int64_t i = 0; i < count; ++i) {
    if (i % 16 == 0) {
      const int r = kind(rng);
      pure = r < 5;
      shift = pure ? tiny(rng) : r < 20 ? wide(rng) : mid(rng);
    }
    const int k = pure ? 20 + kind(rng) % 80 : kind(rng);
    uint32_t b = as_bits(std::ldexp(normal(rng), shift));
    if (k < 5) b = 0;
    else if (k < 8) b = 0x80000000u;
    else if (k < 11) b = any(rng) & 0x807FFFFFu;  // f32 subnormal
    else if (k < 13) b = any(rng) & 0xFF7FFFFFu;  // random finite bits
    else if (k < 14) b = 0x7F7FFFFFu | (any(rng) & 0x80000000u);
    if (u01(rng) < special) b = (any(rng) & 1u ? kF32Inf : kF32QNaN) | (any(rng) & 0x80000000u);
    x[i] = b;
  }
  return x;
}

template <class In>
std::vector<typename In::T> narrowed(const std::vector<uint32_t>& bits) {
  std::vector<typename In::T> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = In::narrow(bits[i]);
  return x;
}

std::vector<uint32_t> random_bits(int64_t count, std::mt19937& rng) {
  std::vector<uint32_t> r(count);
  for (auto& v : r) v = rng();
  return r;
}

// ---------------------------------------------------------------------------------------
// Packing, written from the layout's definition: along a run of codes, code i sits at bit
// i * bits of the little-endian byte stream; a run of n codes takes ceil(n / group) * bytes
// bytes (the padding codes 0).

void put_code(uint8_t* bytes, int64_t stride, int64_t bit, uint32_t code, int bits) {
  for (int k = 0; k < bits; ++k) {
    if ((code >> k) & 1u) bytes[(bit + k) / 8 * stride] |= uint8_t(1u << ((bit + k) % 8));
  }
}

// Bytes of v's packed codes.
template <class F>
int64_t packed_bytes(const BlockView& v) {
  const int64_t n = v.pack_rows ? v.rows : v.cols;
  return v.batch * (v.rows * v.cols / n) * (cdiv(n, F::group_codes) * F::group_bytes);
}

// Codes one per byte [batch, rows, cols] -> packed along cols, or along rows (pack_rows).
template <class F>
std::vector<uint8_t> pack(const std::vector<uint8_t>& codes, const BlockView& v) {
  const int64_t n = v.pack_rows ? v.rows : v.cols;
  const int64_t s = cdiv(n, F::group_codes) * F::group_bytes;
  if (!v.pack_rows) {
    std::vector<uint8_t> out(v.batch * v.rows * s, 0);
    for (int64_t line = 0; line < v.batch * v.rows; ++line) {
      for (int64_t c = 0; c < v.cols; ++c) {
        put_code(&out[line * s], 1, c * F::bits, codes[line * v.cols + c], F::bits);
      }
    }
    return out;
  }
  std::vector<uint8_t> out(v.batch * s * v.cols, 0);
  for (int64_t b = 0; b < v.batch; ++b) {
    for (int64_t r = 0; r < v.rows; ++r) {
      for (int64_t c = 0; c < v.cols; ++c) {
        put_code(&out[b * s * v.cols + c], v.cols, r * F::bits,
                 codes[(b * v.rows + r) * v.cols + c], F::bits);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The launches, run on the host

template <class K>
void run_tiles(const typename K::Args& a) {
  std::vector<typename K::State> st(K::kThreads);
  std::vector<uint32_t> partial(K::kRegion), info(K::kRegion * K::Packed::kWords);
  for (int64_t it = 0; it < a.regions; ++it) {
    const typename K::Region g = K::region(a, it);
    for (int t = 0; t < K::kThreads; ++t) K::load(a, g, t, st[t]);
    const int w = a.width();  // group_max over aligned groups of w lanes
    for (int k = 0; k < K::kK; k += a.per()) {
      for (int g0 = 0; g0 < K::kThreads; g0 += w) {
        uint32_t m = 0;
        for (int l = 0; l < w; ++l) m = umax(m, st[g0 + l].red[k]);
        for (int l = 0; l < w; ++l) st[g0 + l].red[k] = m;
      }
    }
    for (int t = 0; t < K::kThreads; ++t) K::publish(a, t, st[t], partial.data());
    for (int t = 0; t < K::kThreads; ++t) K::scales(a, g, t, partial.data(), info.data());
    for (int t = 0; t < K::kThreads; ++t) K::encode(a, g, t, st[t], info.data());
  }
}

template <class K>
void run_panels(const typename K::Args& a) {
  std::vector<typename K::State> st(a.threads());
  std::vector<uint32_t> colpart(K::kMaxThreads * kSeg), colinfo(K::kColInfo);
  std::vector<uint32_t> rowseg(K::kRowSeg), rowinfo(K::kRowInfo);
  std::vector<int64_t> origins(K::kOrigins);
  for (int64_t it = 0; it < cdiv(a.panels, a.p); ++it) {
    for (int t = 0; t < a.threads(); ++t) {
      K::load(a, it, t, st[t], colpart.data(), rowseg.data(), origins.data());
    }
    for (int t = 0; t < a.threads(); ++t) {
      K::scales(a, t, colpart.data(), rowseg.data(), origins.data(), colinfo.data(),
                rowinfo.data());
    }
    for (int t = 0; t < a.threads(); ++t) K::encode(a, st[t], colinfo.data(), rowinfo.data());
  }
}

template <class K>
void run_regions(const typename K::Args& a) {  // the dequantize kernels
  for (int64_t it = 0; it < a.regions; ++it) {
    for (int t = 0; t < K::kThreads; ++t) K::run(a, it, t);
  }
}

// As launch_block_quantize, with the kernel `which` (one that takes v).
template <class F, class In, bool kFake>
void emulate_quantize(BlockKernel which, const BlockView& v, const typename In::T* x,
                      const uint32_t* rand, const uint32_t* ts, uint8_t* codes, void* scales,
                      uint32_t* out) {
  auto with_sr = [&](auto sr) {
    constexpr bool kSR = decltype(sr)::value;
    if constexpr (fast_block_kernels<F, In, kSR>()) {  // (as the library: only these)
      if (which == BlockKernel::kTiles) {
        using K = TileKernel<F, In, kSR, kFake>;
        run_tiles<K>(K::make(v, x, rand, ts, true, true, codes, scales, out));
      } else {
        using K = PanelKernel<F, In, kSR, kFake, false>;
        run_panels<K>(K::make(v.batch, v.rows, v.cols, int(v.tr), v.scale, v.mode, x, rand, ts,
                              true, true, codes, scales, out));
      }
    }
  };
  if (which == BlockKernel::kGeneric) {
    using K = GenericKernel<F, In, kFake>;
    const auto a = K::make(v, x, rand, ts, codes, scales, out);
    for (int64_t id = 0; id < v.tiles(); ++id) K::tile(a, id);
  } else if (rand) {
    with_sr(std::true_type{});
  } else {
    with_sr(std::false_type{});
  }
}

// The kernels that take v (quantize, or kFake fake_quantize; sr: stochastic rounding); the
// launch's choice first.
template <class F, class In, bool kFake>
std::vector<BlockKernel> kernels_for(const BlockView& v, bool sr) {
  std::vector<BlockKernel> ks;
  const BlockKernel first = block_kernel_for<F, In, kFake>(v, sr);
  if (first == BlockKernel::kNone) return ks;
  ks.push_back(first);
  if (first != BlockKernel::kGeneric && GenericKernel<F, In, kFake>::takes(v) &&
      v.tiles() <= 4096) {
    ks.push_back(BlockKernel::kGeneric);  // the slow kernel on the fast kernels' views too
  }
  return ks;
}

cpu::BlockProblem cpu_problem(const BlockView& v, int fmt) {
  cpu::BlockProblem p{};
  p.format = fmt, p.scale = v.scale, p.mode = v.mode;
  p.tile_rows = v.tr, p.tile_cols = v.tc, p.batch = v.batch, p.rows = v.rows, p.cols = v.cols;
  p.pack_rows = v.pack_rows;
  return p;
}

int scale_bytes(int32_t kind) { return kind >= kScaleFP32 ? 4 : 1; }

template <class In>
int32_t cpu_dtype() {
  if (sizeof(typename In::T) == 4) return cpu::kF32;
  return In::widen(0x3C00) == 0x3F800000u ? cpu::kF16 : cpu::kBF16;  // f16 1.0 or not
}

// The CPU block kernels' input for x: bf16 and f32 as they are, f16 widened to f32 bits
// (exact), as mxjax widens it: those kernels are compiled for bf16 and f32 inputs.
template <class In>
struct CpuInput {
  std::vector<uint32_t> widened;
  const void* x;
  int32_t dtype;

  explicit CpuInput(const std::vector<typename In::T>& in) {
    const bool f16 = cpu_dtype<In>() == cpu::kF16;
    if (f16) {
      for (auto v : in) widened.push_back(In::widen(v));
    }
    x = f16 ? static_cast<const void*>(widened.data()) : in.data();
    dtype = f16 ? cpu::kF32 : cpu_dtype<In>();
  }
  CpuInput(const CpuInput&) = delete;
};

// ---------------------------------------------------------------------------------------
// Cases

struct Layout {
  std::vector<int64_t> dims;
  int64_t block_rows, block_cols, axis;
};

std::string describe(const Layout& l, int fmt, int kind, int mode, int dtype, bool sr,
                     uint32_t ts) {
  std::string s = "fmt=" + std::to_string(fmt) + " scale=" + std::to_string(kind) +
                  " mode=" + std::to_string(mode) + " dtype=" + std::to_string(dtype) +
                  " sr=" + std::to_string(sr) + " ts=" + std::to_string(ts) + " dims=(";
  for (int64_t d : l.dims) s += std::to_string(d) + ",";
  return s + ") block=" + std::to_string(l.block_rows) + "x" + std::to_string(l.block_cols) +
         " axis=" + std::to_string(l.axis);
}

// quantize, fake_quantize and dequantize of x (f32 bits, narrowed to In) under one layout.
template <class F, class In>
void check_quantize(const Layout& l, int32_t kind, int32_t mode, const std::vector<uint32_t>& xb,
                    bool sr, uint32_t ts_bits, std::mt19937& rng) {
  BlockView v;
  int64_t packed_axis;
  if (!block_view(l.dims, F::id, kind, mode, l.block_rows, l.block_cols, l.axis, v, packed_axis)
           .success()) {
    ++failures;
    std::printf("FAIL %s: block_view refused it\n", where.c_str());
    return;
  }
  const auto x = narrowed<In>(xb);
  const int64_t n = int64_t(x.size());
  const auto rand = random_bits(sr ? n : 0, rng);
  const uint32_t* r = sr ? rand.data() : nullptr;
  const uint32_t ts[1] = {ts_bits};
  const int sb = scale_bytes(kind);

  // The CPU kernels.
  const CpuInput<In> cpu_x(x);
  cpu::BlockProblem p = cpu_problem(v, F::id);
  p.x = cpu_x.x, p.dtype = cpu_x.dtype;
  p.rand = r, p.tensor_scale = ts_bits;
  std::vector<uint8_t> packed(packed_bytes<F>(v)), scales(v.tiles() * sb);
  std::vector<uint32_t> fake(n), deq(n), deq_ts(n);
  p.codes = packed.data(), p.scales = scales.data();
  const cpu::BlockKernels& cpu_k = cpu::block_kernels_scalar();
  cpu_k.quantize(p, 0, cpu::units(p));
  p.out = reinterpret_cast<float*>(fake.data());
  cpu_k.fake_quantize(p, 0, cpu::units(p));
  p.in_codes = packed.data(), p.in_scales = scales.data();
  p.out = reinterpret_cast<float*>(deq.data());
  cpu_k.dequantize(p, 0, cpu::units(p));
  p.apply_tensor_scale = true, p.out = reinterpret_cast<float*>(deq_ts.data());
  cpu_k.dequantize(p, 0, cpu::units(p));

  // The CUDA kernels' bodies.
  const auto qs = kernels_for<F, In, false>(v, sr);
  if (qs.empty()) ++refused;
  for (BlockKernel k : qs) {
    std::vector<uint8_t> got(packed.size(), 0xAB), got_scales(scales.size(), 0xAB);
    emulate_quantize<F, In, false>(k, v, x.data(), r, ts, got.data(), got_scales.data(), nullptr);
    const std::string kind_name = k == BlockKernel::kTiles ? "tiles" : k == BlockKernel::kPanels
                                                                           ? "panels" : "generic";
    expect_equal(got_scales, scales, (kind_name + " scales").c_str());
    expect_equal(got, packed, (kind_name + " codes").c_str());
  }
  for (BlockKernel k : kernels_for<F, In, true>(v, sr)) {
    std::vector<uint32_t> got(n, 0xABABABABu);
    emulate_quantize<F, In, true>(k, v, x.data(), r, ts, nullptr, nullptr, got.data());
    expect_equal(got, fake, k == BlockKernel::kGeneric ? "generic fake" : "fake");
  }
  for (bool apply : {false, true}) {
    std::vector<uint32_t> got(n, 0xABABABABu);
    if (v.pack_rows) {
      run_regions<DequantizeCols<F>>(
          DequantizeCols<F>::make(v, packed.data(), scales.data(), ts, apply, got.data()));
    } else {
      run_regions<DequantizeRows<F>>(
          DequantizeRows<F>::make(v, packed.data(), scales.data(), ts, apply, got.data()));
    }
    expect_equal(got, apply ? deq_ts : deq, apply ? "dequantize (tensor scale)" : "dequantize");
  }
}

// dequantize of random codes and scales (NaN, Inf, subnormal and huge scales included).
template <class F>
void check_dequantize_random(const Layout& l, int32_t kind, uint32_t ts_bits, std::mt19937& rng) {
  BlockView v;
  int64_t packed_axis;
  if (!block_view(l.dims, F::id, kind, 0, l.block_rows, l.block_cols, l.axis, v, packed_axis)
           .success()) {
    ++failures;
    return;
  }
  const int64_t n = v.batch * v.rows * v.cols;
  std::vector<uint8_t> codes(n);
  for (auto& c : codes) c = uint8_t(rng() & ((1u << F::bits) - 1));
  const int sb = scale_bytes(kind);
  std::vector<uint8_t> scales(v.tiles() * sb);
  for (int64_t i = 0; i < v.tiles(); ++i) {
    uint32_t s = rng();
    if (sb == 4) {
      const uint32_t pick = rng() % 8;
      if (pick == 0) s &= 0x807FFFFFu;               // subnormal
      else if (pick == 1) s = kF32Inf;
      else if (pick == 2) s = 0x7F7FFFFFu;
      else if (pick == 3) s = 0;
      else if (pick < 6) s = (s & 0x807FFFFFu) | (uint32_t(rng() % 254 + 1) << 23);  // normal
      std::memcpy(&scales[i * 4], &s, 4);
    } else {
      scales[i] = uint8_t(kind == kScaleE4M3 ? s & 0x7F : s);
    }
  }
  const uint32_t ts[1] = {ts_bits};
  const std::vector<uint8_t> packed = pack<F>(codes, v);
  for (bool apply : {false, true}) {
    cpu::BlockProblem p = cpu_problem(v, F::id);
    std::vector<uint32_t> want(n), got(n, 0xABABABABu);
    p.in_codes = packed.data(), p.in_scales = scales.data(), p.tensor_scale = ts_bits;
    p.apply_tensor_scale = apply, p.out = reinterpret_cast<float*>(want.data());
    cpu::block_kernels_scalar().dequantize(p, 0, cpu::units(p));
    if (v.pack_rows) {
      run_regions<DequantizeCols<F>>(
          DequantizeCols<F>::make(v, packed.data(), scales.data(), ts, apply, got.data()));
    } else {
      run_regions<DequantizeRows<F>>(
          DequantizeRows<F>::make(v, packed.data(), scales.data(), ts, apply, got.data()));
    }
    expect_equal(got, want, apply ? "random dequantize (tensor scale)" : "random dequantize");
  }
}

// quantize_2x of x [..., m, k] in blocks of b, as the handler launches it.
template <class F, class In>
void check_quantize_2x(const std::vector<int64_t>& dims, int64_t b, int32_t kind, int32_t mode,
                       const std::vector<uint32_t>& xb, uint32_t ts_bits) {
  const int64_t rank = dims.size();
  BlockView row;
  int64_t packed_axis;
  if (!block_view(dims, F::id, kind, mode, 1, b, rank - 1, row, packed_axis).success()) {
    ++failures;
    return;
  }
  row.batch = 1;
  for (int64_t i = 0; i < rank - 2; ++i) row.batch *= dims[i];
  row.rows = dims[rank - 2];
  BlockView col = row;
  col.tr = b, col.tc = 1, col.pack_rows = true;
  const auto x = narrowed<In>(xb);
  const uint32_t ts[1] = {ts_bits};
  const int sb = scale_bytes(kind);
  const int64_t n = int64_t(x.size());

  cpu::BlockPair pair{cpu_problem(row, F::id), cpu_problem(col, F::id)};
  std::vector<uint8_t> rc(packed_bytes<F>(row)), rs(row.tiles() * sb);
  std::vector<uint8_t> cc(packed_bytes<F>(col)), cs(col.tiles() * sb);
  const CpuInput<In> cpu_x(x);
  for (cpu::BlockProblem* p : {&pair.row, &pair.col}) {
    p->x = cpu_x.x, p->tensor_scale = ts_bits, p->dtype = cpu_x.dtype;
  }
  pair.row.codes = rc.data(), pair.row.scales = rs.data();
  pair.col.codes = cc.data(), pair.col.scales = cs.data();
  cpu::block_kernels_scalar().quantize_2x(pair, 0, cpu::units(pair.col));

  const auto &want_rc = rc, &want_cc = cc;
  std::vector<uint8_t> got_rc(want_rc.size(), 0xAB), got_rs(rs.size(), 0xAB);
  std::vector<uint8_t> got_cc(want_cc.size(), 0xAB), got_cs(cs.size(), 0xAB);
  using K = PanelKernel<F, In, false, false, true>;
  if (fast_block_kernels<F, In, false>() && K::takes(b)) {
    auto a = K::make(col.batch, col.rows, col.cols, int(b), kind, mode, x.data(), nullptr, ts, true,
                     true, got_cc.data(), got_cs.data(), nullptr);
    a.row_codes = got_rc.data(), a.row_scales = got_rs.data();
    run_panels<K>(a);
  } else {
    const BlockKernel kr = block_kernel_for<F, In, false>(row);
    const BlockKernel kc = block_kernel_for<F, In, false>(col);
    if (kr == BlockKernel::kNone || kc == BlockKernel::kNone) {
      ++refused;
      return;
    }
    emulate_quantize<F, In, false>(kr, row, x.data(), nullptr, ts, got_rc.data(), got_rs.data(),
                                   nullptr);
    emulate_quantize<F, In, false>(kc, col, x.data(), nullptr, ts, got_cc.data(), got_cs.data(),
                                   nullptr);
  }
  expect_equal(got_rs, rs, "2x row scales");
  expect_equal(got_rc, want_rc, "2x row codes");
  expect_equal(got_cs, cs, "2x column scales");
  expect_equal(got_cc, want_cc, "2x column codes");
}

template <class In>
void check_amax(int64_t n, double special, bool zeros, std::mt19937& rng) {
  std::vector<uint32_t> bits = f32_inputs(n, special, rng);
  if (zeros) {
    for (auto& b : bits) b &= 0x80000000u;
  }
  const auto x = narrowed<In>(bits);
  uint32_t want = 0;
  for (auto e : x) {
    const uint32_t m = In::widen(e) & kF32Abs;
    if (m < kF32Inf && m > want) want = m;
  }
  const AmaxArgs<In> a{x.data(), n, true};
  const unsigned grid = amax_grid(n);
  uint32_t got = 0;
  for (unsigned b = 0; b < grid; ++b) {
    for (int t = 0; t < kThreads; ++t) {
      got = umax(got, amax_segments(a, b * int64_t(kThreads) + t, int64_t(grid) * kThreads));
    }
  }
  where = "tensor_amax n=" + std::to_string(n) + " width=" + std::to_string(sizeof(typename In::T));
  expect_bytes(&got, &want, 4, "amax");
  const uint32_t cpu_got = cpu::block_kernels_scalar().tensor_amax(x.data(), cpu_dtype<In>(), 0, n);
  expect_bytes(&cpu_got, &want, 4, "CPU amax");
}

template <class Fn>
void each_dtype(Fn&& fn) {
  fn(BF16{}, 0);
  fn(F16{}, 1);
  fn(F32{}, 2);
}

// (kind, mode) pairs: E8M0 RCEIL / FLOOR, E4M3, FP32, FP32 pow2.
constexpr int32_t kKinds[][2] = {{kScaleE8M0, kRceil}, {kScaleE8M0, kFloor}, {kScaleE4M3, 0},
                                 {kScaleFP32, 0}, {kScaleFP32Pow2, 0}};

}  // namespace
}  // namespace mxjax::cuda

int main() {
  using namespace mxjax;
  using namespace mxjax::cuda;
  std::mt19937 rng(1234);
  const std::vector<Layout> layouts = {
      // 1-D blocks along the last axis (tile kernel; 1x24, 1x3: generic)
      {{3, 100}, 1, 16, 1}, {{2, 64}, 1, 16, 1}, {{2, 300}, 1, 32, 1}, {{3, 40, 1}, 1, 16, 1},
      {{4, 256}, 1, 128, 1}, {{3, 130}, 1, 128, 1}, {{100}, 1, 16, 0}, {{2, 70}, 1, 8, 1},
      {{2, 50}, 1, 24, 1}, {{3, 37}, 1, 3, 1}, {{2, 2100}, 1, 2048, 1}, {{1, 9000}, 1, 4096, 1},
      {{1, 16400}, 1, 16384, 1},
      // 1-D blocks along a strided axis (panel kernel; 1x12, 1x3: generic)
      {{130, 9}, 1, 16, 0}, {{3, 33, 5}, 1, 32, 1}, {{2, 140, 40}, 1, 128, 1},
      {{40, 17}, 1, 8, 0}, {{50, 6}, 1, 12, 0}, {{20, 5}, 1, 3, 0}, {{600, 3}, 1, 256, 0},
      {{2, 34, 1030}, 1, 16, 1},
      // 2-D tiles (tile kernel; 12x12, 5x5: generic)
      {{40, 50}, 16, 16, 0}, {{2, 33, 70}, 16, 16, 0}, {{70, 100}, 32, 32, 0},
      {{130, 260}, 128, 128, 0}, {{20, 30}, 8, 8, 0}, {{70, 70}, 64, 64, 0},
      {{30, 40}, 12, 12, 0}, {{2, 11, 12}, 5, 5, 0},
  };
  for (const Layout& l : layouts) {
    int64_t n = 1;
    for (int64_t d : l.dims) n *= d;
    const double special = 0.1 / double(l.block_rows * l.block_cols);  // ~10% of blocks
    for (int fmt = 0; fmt < 5; ++fmt) {
      with_format(fmt, [&](auto f) {
        using F = decltype(f);
        const float elem_max = as_float(grid_value_bits<F>(F::max_code));
        for (const auto& km : kKinds) {
          each_dtype([&](auto in, int dtype) {
            using In = decltype(in);
            for (bool sr : {false, true}) {
              const auto xb = f32_inputs(n, special, rng);
              uint32_t amax = 0;
              for (uint32_t b : xb) {
                const uint32_t m = In::widen(In::narrow(b)) & kF32Abs;
                if (m < kF32Inf && m > amax) amax = m;
              }
              std::vector<uint32_t> tss = {0};
              if (km[0] == kScaleE4M3) {
                tss.push_back(amax ? as_bits(elem_max * 448.0f / as_float(amax)) : 0x3F800000u);
                tss.push_back(0x7B800000u);  // 2^120
                tss.push_back(0x03800000u);  // 2^-120
                tss.push_back(0x00000123u);  // subnormal
              }
              for (uint32_t ts : tss) {
                where = describe(l, fmt, km[0], km[1], dtype, sr, ts);
                check_quantize<F, In>(l, km[0], km[1], xb, sr, ts, rng);
              }
            }
          });
        }
        for (int32_t kind = 0; kind < 4; ++kind) {
          for (uint32_t ts : {0u, 0x3FC00000u, 0x7B800000u, 0x00000123u}) {
            where = describe(l, fmt, kind, 0, -1, false, ts) + " (random codes)";
            check_dequantize_random<F>(l, kind, ts, rng);
          }
        }
      });
    }
  }
  // Every bf16 pattern, [2048, 32], sequential (blocks of neighbouring values).
  {
    std::vector<uint32_t> xb(1 << 16);
    for (uint32_t i = 0; i < (1u << 16); ++i) xb[i] = i << 16;
    for (const Layout& l : std::vector<Layout>{{{2048, 32}, 1, 16, 1}, {{2048, 32}, 1, 32, 0},
                                               {{2048, 32}, 16, 16, 0}, {{2048, 32}, 32, 32, 0}}) {
      for (int fmt = 0; fmt < 5; ++fmt) {
        with_format(fmt, [&](auto f) {
          using F = decltype(f);
          for (const auto& km : kKinds) {
            where = describe(l, fmt, km[0], km[1], 0, false, 0) + " (every bf16)";
            check_quantize<F, mxjax::BF16>(l, km[0], km[1], xb, false, 0, rng);
          }
        });
      }
    }
  }
  // quantize_2x: fused (16 <= b <= 128) and as two launches (b = 8, 256, 2).
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> pairs = {
      {{2, 33, 70}, 16}, {{130, 260}, 128}, {{40, 96}, 32}, {{3, 70, 65}, 64}, {{17, 1030}, 16},
      {{20, 30}, 8}, {{300, 520}, 256}, {{9, 10}, 2}};
  for (const auto& pair : pairs) {
    const std::vector<int64_t>& dims = pair.first;
    const int64_t b = pair.second;
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    for (int fmt = 0; fmt < 5; ++fmt) {
      with_format(fmt, [&](auto f) {
        using F = decltype(f);
        for (const auto& km : kKinds) {
          each_dtype([&](auto in, int dtype) {
            using In = decltype(in);
            const auto xb = f32_inputs(n, 0.1 / double(b), rng);
            for (uint32_t ts : {0u, 0x4A000000u}) {
              where = "2x " + describe({dims, 1, b, -1}, fmt, km[0], km[1], dtype, false, ts);
              check_quantize_2x<F, In>(dims, b, km[0], km[1], xb, ts);
            }
          });
        }
      });
    }
  }
  for (int64_t n : {1, 7, 8, 100, 1000, 70001}) {
    for (bool zeros : {false, true}) {
      check_amax<mxjax::BF16>(n, 0.01, zeros, rng);
      check_amax<mxjax::F16>(n, 0.01, zeros, rng);
      check_amax<mxjax::F32>(n, 0.01, zeros, rng);
    }
  }
  check_amax<mxjax::F32>(1000, 1.0, false, rng);  // every element Inf / NaN: 0
  std::printf("block_host_check: %lld comparisons, %lld views refused (straddling packing "
              "groups)\n", (long long)checks, (long long)refused);
  for (const auto& [what, count] : failed_what) std::printf("  %6d failed: %s\n", count, what.c_str());
  std::printf(failures ? "block_host_check: %d FAILURES\n" : "block_host_check: all passed\n",
              failures);
  return failures != 0;
}
