// ple_probe: native half of the PLE deferred-row pre-flight probe (pleharness.probe).
//
// What it tests: an engine that offloads per-layer-embedding (PLE) tables to host memory can defer
// a token's row inside a single-token FULL CUDA graph:
//
//     WAIT(flag == 1)  ->  WRITE(flag = 0)  ->  H2D copy(row -> staging)
//
// The graph waits on a host-visible flag until a host thread has gathered the row into pinned
// memory and set the flag. That needs the CUDA driver's stream memory operations
// (cuStreamWaitValue32 / cuStreamWriteValue32) on the device and inside graph capture.
//
// Sources (CUDA driver API reference):
//   * Stream memory operations: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html
//     (cuStreamWaitValue32, cuStreamWriteValue32, their 64-bit forms, the device attributes that
//     gate them, and the deadlock warning: ordering established through them is invisible to CUDA).
//   * V1 vs V2 memops (V1 needed NVreg_EnableStreamMemOPs=1; V2, CUDA >= 11.7, is on by default):
//     https://docs.nvidia.com/cuda/archive/11.8.0/cuda-driver-api/group__CUDA__MEMOP.html
//   * Graphs and stream capture (batch mem-op nodes, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP; captures
//     may not use the legacy NULL stream): https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
//     and https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html (cuStreamBeginCapture).
//   * Mapped pinned memory: cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP) + cuMemHostGetDevicePointer,
//     https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
//
// The driver is reached at run time (dlopen("libcuda.so.1") + cuGetProcAddress), not at link time:
// the build needs only cuda.h, no libcuda stub, and importing the module never fails for a missing
// driver; every entry point raises DriverUnavailable instead. The driver's primary context is the
// one PyTorch's runtime uses, so streams created by PyTorch (torch.cuda.Stream().cuda_stream) are
// valid CUstream handles here and torch tensors' data_ptr() are valid CUdeviceptrs.
//
// Safety: a captured WAIT that is never signalled blocks its stream forever. Every wait this module
// performs is guarded: after `timeout_s` the host writes the flag itself (releasing the WAIT),
// reports guard_fired, and waits for the stream to drain, so the device stays usable.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

struct DriverUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct BufferInUseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------------------------------------
// Driver entry points, resolved at run time
// ------------------------------------------------------------------------------------------------

// X(name): `decltype(&::name)` expands cuda.h's version macros (cuStreamWaitValue32 ->
// cuStreamWaitValue32_v2), `#name` does not, which is the base name cuGetProcAddress expects.
#define PLE_DRIVER_FUNCS(X)          \
  X(cuGetErrorName)                  \
  X(cuGetErrorString)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetCount)                \
  X(cuDeviceGetName)                 \
  X(cuDeviceGetAttribute)            \
  X(cuDeviceGetPCIBusId)             \
  X(cuDeviceTotalMem)                \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuMemHostAlloc)                  \
  X(cuMemFreeHost)                   \
  X(cuMemHostGetDevicePointer)       \
  X(cuMemcpyHtoDAsync)               \
  X(cuMemcpyDtoH)                    \
  X(cuMemsetD8Async)                 \
  X(cuStreamCreate)                  \
  X(cuStreamDestroy)                 \
  X(cuStreamQuery)                   \
  X(cuStreamSynchronize)             \
  X(cuStreamBeginCapture)            \
  X(cuStreamEndCapture)              \
  X(cuStreamIsCapturing)             \
  X(cuStreamWaitValue32)             \
  X(cuStreamWriteValue32)            \
  X(cuStreamWaitValue64)             \
  X(cuStreamWriteValue64)            \
  X(cuGraphInstantiateWithFlags)     \
  X(cuGraphLaunch)                   \
  X(cuGraphExecDestroy)              \
  X(cuGraphDestroy)                  \
  X(cuGraphGetNodes)                 \
  X(cuGraphNodeGetType)

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using DriverGetVersionFn = CUresult (*)(int*);
using InitFn = CUresult (*)(unsigned int);

struct Driver {
  bool ok = false;
  std::string error;  // why not ok, one line
  int version = 0;    // cuDriverGetVersion: 1000 * major + 10 * minor
  std::string library;
#define PLE_DECL(name) decltype(&::name) p_##name = nullptr;
  PLE_DRIVER_FUNCS(PLE_DECL)
#undef PLE_DECL
};

std::string err_name(const Driver& d, CUresult r) {
  const char* name = nullptr;
  if (d.p_cuGetErrorName && d.p_cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

Driver load_driver() {
  Driver d;
  const char* candidates[] = {"libcuda.so.1", "libcuda.so"};
  void* lib = nullptr;
  std::string dl_err;
  for (const char* c : candidates) {
    lib = dlopen(c, RTLD_NOW | RTLD_GLOBAL);
    if (lib) {
      d.library = c;
      break;
    }
    const char* e = dlerror();
    if (dl_err.empty() && e) dl_err = e;
  }
  if (!lib) {
    d.error = "CUDA driver library not found (dlopen libcuda.so.1: " + dl_err + ")";
    return d;
  }
  auto get_version = reinterpret_cast<DriverGetVersionFn>(dlsym(lib, "cuDriverGetVersion"));
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  d.p_cuGetErrorName = reinterpret_cast<decltype(d.p_cuGetErrorName)>(dlsym(lib, "cuGetErrorName"));
  if (!get_version || !init) {
    d.error = "libcuda.so.1 has no cuDriverGetVersion/cuInit";
    return d;
  }
  CUresult r = get_version(&d.version);
  if (r != CUDA_SUCCESS) {
    d.error = "cuDriverGetVersion failed: " + err_name(d, r);
    return d;
  }
  r = init(0);
  if (r != CUDA_SUCCESS) {
    d.error = "cuInit failed: " + err_name(d, r);
    return d;
  }
  // Ask for the CUDA 12.0 ABI of each entry point (the V2 stream memops, the flags form of
  // cuGraphInstantiate); an older driver gets its own version.
  int want = std::min(d.version, 12000);
  auto gp2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto gp1 = reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));
  if (!gp2 && !gp1) {
    d.error = "driver " + std::to_string(d.version) + " has no cuGetProcAddress (needs CUDA >= 11.3)";
    return d;
  }
  std::vector<std::string> missing;
  auto resolve = [&](const char* name, void** out) {
    CUresult rr;
    if (gp2) {
      CUdriverProcAddressQueryResult st;
      rr = gp2(name, out, want, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    } else {
      rr = gp1(name, out, want, CU_GET_PROC_ADDRESS_DEFAULT);
    }
    if (rr != CUDA_SUCCESS || *out == nullptr) {
      *out = nullptr;
      missing.push_back(name);
    }
  };
#define PLE_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&d.p_##name));
  PLE_DRIVER_FUNCS(PLE_RESOLVE)
#undef PLE_RESOLVE
  if (!missing.empty()) {
    std::string m;
    for (auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    d.error = "driver " + std::to_string(d.version) + " lacks entry points: " + m;
    return d;
  }
  d.ok = true;
  return d;
}

Driver& drv_raw() {
  static Driver d = load_driver();
  return d;
}

const Driver& drv() {
  Driver& d = drv_raw();
  if (!d.ok) throw DriverUnavailable(d.error);
  return d;
}

[[noreturn]] void throw_cu(CUresult r, const char* what) {
  const Driver& d = drv_raw();
  const char* desc = nullptr;
  if (d.p_cuGetErrorString) d.p_cuGetErrorString(r, &desc);
  std::string msg = std::string(what) + " failed: " + err_name(d, r) + " (" +
                    std::to_string(static_cast<int>(r)) + ")";
  if (desc) msg += ": " + std::string(desc);
  throw CudaError(msg);
}

#define CK(call)                                   \
  do {                                             \
    CUresult _r = (call);                          \
    if (_r != CUDA_SUCCESS) throw_cu(_r, #call);   \
  } while (0)

// Makes the device's primary context (the one PyTorch's runtime uses) current on this thread.
void bind_device(int ordinal) {
  const Driver& d = drv();
  static std::mutex mu;
  static std::vector<CUcontext> ctxs;
  std::lock_guard<std::mutex> lock(mu);
  if (ordinal < 0) throw std::invalid_argument("device ordinal must be >= 0");
  if (static_cast<size_t>(ordinal) >= ctxs.size()) ctxs.resize(ordinal + 1, nullptr);
  if (!ctxs[ordinal]) {
    CUdevice dev;
    CK(d.p_cuDeviceGet(&dev, ordinal));
    CK(d.p_cuDevicePrimaryCtxRetain(&ctxs[ordinal], dev));
  }
  CUcontext cur = nullptr;
  CK(d.p_cuCtxGetCurrent(&cur));
  if (cur != ctxs[ordinal]) CK(d.p_cuCtxSetCurrent(ctxs[ordinal]));
}

using Clock = std::chrono::steady_clock;
inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// ------------------------------------------------------------------------------------------------
// Byte patterns (same generator for signaller and verifier; exposed as pattern())
// ------------------------------------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

void fill_pattern(uint8_t* dst, size_t n, uint64_t seed, uint64_t index) {
  const uint64_t base = splitmix64(seed ^ splitmix64(index));
  const size_t words = n / 8;
  for (size_t k = 0; k < words; ++k) {
    uint64_t v = splitmix64(base + k);
    std::memcpy(dst + 8 * k, &v, 8);
  }
  if (n % 8) {
    uint64_t v = splitmix64(base + words);
    std::memcpy(dst + 8 * words, &v, n % 8);
  }
}

// ------------------------------------------------------------------------------------------------
// HostBuffer: pinned, device-mapped host memory with explicit lifetime
// ------------------------------------------------------------------------------------------------

class HostBuffer {
 public:
  HostBuffer(size_t nbytes, int device) : nbytes_(nbytes), device_(device) {
    if (nbytes == 0) throw std::invalid_argument("HostBuffer: nbytes must be > 0");
    bind_device(device);
    const Driver& d = drv();
    void* p = nullptr;
    CK(d.p_cuMemHostAlloc(&p, nbytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr dp = 0;
    CUresult r = d.p_cuMemHostGetDevicePointer(&dp, p, 0);
    if (r != CUDA_SUCCESS) {
      d.p_cuMemFreeHost(p);
      throw_cu(r, "cuMemHostGetDevicePointer");
    }
    std::memset(p, 0, nbytes);
    host_ = static_cast<uint8_t*>(p);
    dptr_ = dp;
  }
  ~HostBuffer() {
    // Graphs hold shared_ptrs, so refs are 0 here; a buffer still pinned by a (leaked) token is
    // leaked rather than freed under a live graph.
    if (host_ && graph_refs_.load() == 0) {
      const Driver& d = drv_raw();
      if (d.ok) {
        try {
          bind_device(device_);
        } catch (...) {
        }
        d.p_cuMemFreeHost(host_);
      }
    }
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // Frees now. Refused (BufferInUseError) while a captured graph references the buffer.
  bool free() {
    int refs = graph_refs_.load();
    if (refs > 0)
      throw BufferInUseError("HostBuffer.free: still referenced by " + std::to_string(refs) +
                             " captured graph(s); destroy the graph (or release its capture token) first");
    if (!host_) return false;
    bind_device(device_);
    CK(drv().p_cuMemFreeHost(host_));
    host_ = nullptr;
    dptr_ = 0;
    return true;
  }

  void check_live(const char* what) const {
    if (!host_) throw std::runtime_error(std::string(what) + ": HostBuffer was freed");
  }
  void check_range(size_t off, size_t n, const char* what) const {
    check_live(what);
    if (off > nbytes_ || n > nbytes_ - off)
      throw std::out_of_range(std::string(what) + ": range [" + std::to_string(off) + ", " +
                              std::to_string(off + n) + ") outside buffer of " +
                              std::to_string(nbytes_) + " bytes");
  }

  void write(py::bytes data, size_t offset) {
    std::string s = data;
    check_range(offset, s.size(), "HostBuffer.write");
    std::memcpy(host_ + offset, s.data(), s.size());
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  py::bytes read(size_t offset, py::object nbytes) const {
    size_t n = nbytes.is_none() ? (nbytes_ - std::min(offset, nbytes_)) : nbytes.cast<size_t>();
    check_range(offset, n, "HostBuffer.read");
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return py::bytes(reinterpret_cast<const char*>(host_ + offset), n);
  }
  void fill_pattern_at(uint64_t seed, uint64_t index, size_t offset, py::object nbytes) {
    size_t n = nbytes.is_none() ? (nbytes_ - std::min(offset, nbytes_)) : nbytes.cast<size_t>();
    check_range(offset, n, "HostBuffer.fill_pattern");
    fill_pattern(host_ + offset, n, seed, index);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  uint32_t load_u32(size_t offset) const {
    check_range(offset, 4, "HostBuffer.load_u32");
    if (offset % 4) throw std::invalid_argument("HostBuffer.load_u32: offset must be 4-byte aligned");
    return __atomic_load_n(reinterpret_cast<uint32_t*>(host_ + offset), __ATOMIC_SEQ_CST);
  }
  // Sequentially consistent store: every earlier host write (e.g. the row) is visible before it.
  void store_u32(size_t offset, uint32_t value) {
    check_range(offset, 4, "HostBuffer.store_u32");
    if (offset % 4) throw std::invalid_argument("HostBuffer.store_u32: offset must be 4-byte aligned");
    __atomic_store_n(reinterpret_cast<uint32_t*>(host_ + offset), value, __ATOMIC_SEQ_CST);
  }
  uint64_t load_u64(size_t offset) const {
    check_range(offset, 8, "HostBuffer.load_u64");
    if (offset % 8) throw std::invalid_argument("HostBuffer.load_u64: offset must be 8-byte aligned");
    return __atomic_load_n(reinterpret_cast<uint64_t*>(host_ + offset), __ATOMIC_SEQ_CST);
  }
  void store_u64(size_t offset, uint64_t value) {
    check_range(offset, 8, "HostBuffer.store_u64");
    if (offset % 8) throw std::invalid_argument("HostBuffer.store_u64: offset must be 8-byte aligned");
    __atomic_store_n(reinterpret_cast<uint64_t*>(host_ + offset), value, __ATOMIC_SEQ_CST);
  }

  uint8_t* host() const { return host_; }
  CUdeviceptr dptr() const { return dptr_; }
  size_t nbytes() const { return nbytes_; }
  int device() const { return device_; }
  bool freed() const { return host_ == nullptr; }
  int graph_refs() const { return graph_refs_.load(); }
  void add_ref() { graph_refs_.fetch_add(1); }
  void drop_ref() { graph_refs_.fetch_sub(1); }

 private:
  uint8_t* host_ = nullptr;
  CUdeviceptr dptr_ = 0;
  size_t nbytes_;
  int device_;
  std::atomic<int> graph_refs_{0};
};

using BufPtr = std::shared_ptr<HostBuffer>;

// ------------------------------------------------------------------------------------------------
// Guarded stream wait (the stranding guard)
// ------------------------------------------------------------------------------------------------

struct GuardResult {
  bool completed = false;    // the stream drained without help
  bool guard_fired = false;  // timeout reached: the host wrote the flag itself
  bool released = false;     // ... and the stream then drained
  int releases = 0;          // host writes of the release value
  double waited_us = 0;      // until completion, or until the guard fired
  double total_us = 0;       // including the release phase
  std::string error;         // a CUDA error from cuStreamQuery, if any
};

py::dict to_dict(const GuardResult& g) {
  py::dict d;
  d["completed"] = g.completed;
  d["guard_fired"] = g.guard_fired;
  d["released"] = g.released;
  d["releases"] = g.releases;
  d["waited_us"] = g.waited_us;
  d["total_us"] = g.total_us;
  d["error"] = g.error.empty() ? py::object(py::none()) : py::object(py::str(g.error));
  return d;
}

// Polls the stream until it drains or `timeout_s` passes. On timeout, if `flag` is given, writes
// `release_value` into the 32-bit word at flag[0] whenever it is not already that value (each
// captured WAIT consumes one release, the graph's WRITE resets the flag to 0), until the stream
// drains or `release_timeout_s` passes. After a released drain the flag is reset to 0, so a stale
// host release cannot satisfy the next WAIT. Call without the GIL.
GuardResult guarded_wait(CUstream s, HostBuffer* flag, double timeout_s, double release_timeout_s = 5.0,
                         uint32_t release_value = 1) {
  const Driver& d = drv();
  GuardResult g;
  auto t0 = Clock::now();
  const double limit_us = timeout_s * 1e6;
  while (true) {
    CUresult r = d.p_cuStreamQuery(s);
    if (r == CUDA_SUCCESS) {
      g.completed = true;
      break;
    }
    if (r != CUDA_ERROR_NOT_READY) {
      g.error = "cuStreamQuery: " + err_name(d, r);
      break;
    }
    if (us_since(t0) > limit_us) break;
    cpu_relax();
  }
  g.waited_us = us_since(t0);
  if (g.completed || !g.error.empty()) {
    g.total_us = g.waited_us;
    return g;
  }
  g.guard_fired = true;
  if (flag == nullptr || flag->freed()) {
    g.error = "stream did not drain and no flag was given to release it";
    g.total_us = us_since(t0);
    return g;
  }
  auto t1 = Clock::now();
  const double rel_us = release_timeout_s * 1e6;
  auto last_release = t1;
  while (us_since(t1) < rel_us) {
    // Release again only if the flag has been consumed and the stream is still blocked 2 ms after
    // the previous release (another WAIT queued behind the first), not while the released
    // replay is still finishing its WRITE and copy.
    if (flag->load_u32(0) != release_value && (g.releases == 0 || us_since(last_release) > 2000.0)) {
      flag->store_u32(0, release_value);
      g.releases++;
      last_release = Clock::now();
    }
    CUresult r = d.p_cuStreamQuery(s);
    if (r == CUDA_SUCCESS) {
      g.released = true;
      break;
    }
    if (r != CUDA_ERROR_NOT_READY) {
      g.error = "cuStreamQuery after release: " + err_name(d, r);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (g.released) flag->store_u32(0, 0);
  if (!g.released && g.error.empty())
    g.error = "stream still blocked " + std::to_string(release_timeout_s) + " s after the host released the flag";
  g.total_us = us_since(t0);
  return g;
}

// The three operations of the deferred-row path, enqueued in stream order (eagerly or under capture).
CUresult enqueue_deferred(CUstream s, CUdeviceptr flag, const void* row_host, CUdeviceptr staging, size_t n) {
  const Driver& d = drv();
  CUresult r = d.p_cuStreamWaitValue32(s, flag, 1, CU_STREAM_WAIT_VALUE_EQ);
  if (r != CUDA_SUCCESS) return r;
  r = d.p_cuStreamWriteValue32(s, flag, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) return r;
  return d.p_cuMemcpyHtoDAsync(staging, row_host, n, s);
}

const char* node_type_name(CUgraphNodeType t) {
  switch (static_cast<int>(t)) {
    case 0: return "KERNEL";
    case 1: return "MEMCPY";
    case 2: return "MEMSET";
    case 3: return "HOST";
    case 4: return "GRAPH";
    case 5: return "EMPTY";
    case 6: return "WAIT_EVENT";
    case 7: return "EVENT_RECORD";
    case 8: return "EXT_SEMAS_SIGNAL";
    case 9: return "EXT_SEMAS_WAIT";
    case 10: return "MEM_ALLOC";
    case 11: return "MEM_FREE";
    case 12: return "BATCH_MEM_OP";
    case 13: return "CONDITIONAL";
    default: return "UNKNOWN";
  }
}

void check_buffers(const BufPtr& flag, const BufPtr& row, size_t nbytes, const char* what) {
  if (!flag || !row) throw std::invalid_argument(std::string(what) + ": flag and row are required");
  flag->check_live(what);
  row->check_live(what);
  if (flag->nbytes() < 4) throw std::invalid_argument(std::string(what) + ": flag needs >= 4 bytes");
  if (nbytes == 0 || nbytes > row->nbytes())
    throw std::invalid_argument(std::string(what) + ": nbytes " + std::to_string(nbytes) +
                                " must be in 1.." + std::to_string(row->nbytes()) + " (the row buffer)");
  if (flag.get() == row.get()) throw std::invalid_argument(std::string(what) + ": flag and row must differ");
}

// ------------------------------------------------------------------------------------------------
// DeferredRowGraph: the captured WAIT -> WRITE -> H2D graph
// ------------------------------------------------------------------------------------------------

class DeferredRowGraph {
 public:
  DeferredRowGraph(BufPtr flag, BufPtr row, uint64_t staging_ptr, py::object staging_owner, size_t nbytes,
                   uint64_t stream)
      : flag_(std::move(flag)), row_(std::move(row)), staging_(staging_ptr), owner_(std::move(staging_owner)),
        nbytes_(nbytes), stream_(reinterpret_cast<CUstream>(stream)) {
    check_buffers(flag_, row_, nbytes_, "DeferredRowGraph");
    if (staging_ == 0) throw std::invalid_argument("DeferredRowGraph: staging pointer is null");
    if (stream == 0)
      throw std::invalid_argument(
          "DeferredRowGraph: a non-default stream is required (the legacy NULL stream cannot be captured)");
    device_ = flag_->device();
    bind_device(device_);
    const Driver& d = drv();
    CK(d.p_cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CUresult r = enqueue_deferred(stream_, flag_->dptr(), row_->host(), staging_, nbytes_);
    CUgraph g = nullptr;
    CUresult re = d.p_cuStreamEndCapture(stream_, &g);
    if (r != CUDA_SUCCESS) {
      if (g) d.p_cuGraphDestroy(g);
      throw_cu(r, "capture of WAIT/WRITE/H2D (cuStreamWaitValue32, cuStreamWriteValue32, cuMemcpyHtoDAsync)");
    }
    if (re != CUDA_SUCCESS) {
      if (g) d.p_cuGraphDestroy(g);
      throw_cu(re, "cuStreamEndCapture");
    }
    graph_ = g;
    try {
      size_t count = 0;
      CK(d.p_cuGraphGetNodes(graph_, nullptr, &count));
      std::vector<CUgraphNode> nodes(count);
      if (count) CK(d.p_cuGraphGetNodes(graph_, nodes.data(), &count));
      for (auto n : nodes) {
        CUgraphNodeType t;
        CK(d.p_cuGraphNodeGetType(n, &t));
        node_types_.push_back(node_type_name(t));
      }
    } catch (...) {
      d.p_cuGraphDestroy(graph_);
      graph_ = nullptr;
      throw;
    }
    CUresult ri = d.p_cuGraphInstantiateWithFlags(&exec_, graph_, 0);
    if (ri != CUDA_SUCCESS) {
      d.p_cuGraphDestroy(graph_);
      graph_ = nullptr;
      throw_cu(ri, "cuGraphInstantiateWithFlags");
    }
    flag_->add_ref();
    row_->add_ref();
  }

  ~DeferredRowGraph() {
    try {
      destroy();
    } catch (...) {
    }
  }

  void check_live(const char* what) const {
    if (!exec_) throw std::runtime_error(std::string(what) + ": graph was destroyed");
  }

  CUstream launch_stream(uint64_t stream) const {
    return stream ? reinterpret_cast<CUstream>(stream) : stream_;
  }

  // Launch without the GIL or checks (hot path).
  CUresult launch_raw(CUstream s) {
    CUresult r = drv().p_cuGraphLaunch(exec_, s);
    if (r == CUDA_SUCCESS) last_stream_ = s;
    return r;
  }

  void launch(uint64_t stream) {
    check_live("DeferredRowGraph.launch");
    bind_device(device_);
    CUresult r = launch_raw(launch_stream(stream));
    if (r != CUDA_SUCCESS) throw_cu(r, "cuGraphLaunch");
  }

  GuardResult wait_raw(double timeout_s, double release_timeout_s) {
    return guarded_wait(last_stream_, flag_.get(), timeout_s, release_timeout_s);
  }

  py::dict wait(double timeout_s, double release_timeout_s) {
    check_live("DeferredRowGraph.wait");
    bind_device(device_);
    GuardResult g;
    {
      py::gil_scoped_release nogil;
      g = wait_raw(timeout_s, release_timeout_s);
    }
    return to_dict(g);
  }

  // Releases the graph. If a replay may still be blocked in its WAIT, the stranding guard
  // releases it first (so destroying never strands the stream). Idempotent.
  void destroy() {
    if (!exec_ && !graph_) return;
    const Driver& d = drv_raw();
    if (d.ok) {
      try {
        bind_device(device_);
      } catch (...) {
      }
      if (last_stream_ && !flag_->freed()) {
        if (d.p_cuStreamQuery(last_stream_) == CUDA_ERROR_NOT_READY) guarded_wait(last_stream_, flag_.get(), 0.05);
      }
      if (exec_) d.p_cuGraphExecDestroy(exec_);
      if (graph_) d.p_cuGraphDestroy(graph_);
    }
    exec_ = nullptr;
    graph_ = nullptr;
    flag_->drop_ref();
    row_->drop_ref();
    if (!owner_.is_none()) {
      if (PyGILState_Check()) {
        owner_ = py::none();
      } else {
        py::gil_scoped_acquire gil;
        owner_ = py::none();
      }
    }
  }

  bool destroyed() const { return exec_ == nullptr; }
  const std::vector<std::string>& node_types() const { return node_types_; }
  size_t nbytes() const { return nbytes_; }
  uint64_t stream() const { return reinterpret_cast<uint64_t>(stream_); }
  uint64_t staging_ptr() const { return staging_; }
  BufPtr flag() const { return flag_; }
  BufPtr row() const { return row_; }
  int device() const { return device_; }

 private:
  BufPtr flag_, row_;
  CUdeviceptr staging_;
  py::object owner_;
  size_t nbytes_;
  CUstream stream_;
  CUstream last_stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  int device_ = 0;
  std::vector<std::string> node_types_;
};

// Pins flag and row while an externally captured graph (e.g. torch.cuda.CUDAGraph) references them.
class CaptureToken {
 public:
  CaptureToken(BufPtr flag, BufPtr row) : flag_(std::move(flag)), row_(std::move(row)) {
    flag_->add_ref();
    row_->add_ref();
  }
  ~CaptureToken() { release(); }
  bool release() {
    if (released_) return false;
    released_ = true;
    flag_->drop_ref();
    row_->drop_ref();
    return true;
  }
  bool released() const { return released_; }

 private:
  BufPtr flag_, row_;
  bool released_ = false;
};

// ------------------------------------------------------------------------------------------------
// Self-test: many replays, a host thread signalling fresh bytes, every replay verified
// ------------------------------------------------------------------------------------------------

py::dict selftest(DeferredRowGraph& g, int replays, double timeout_s, uint64_t seed, int poison) {
  g.check_live("selftest");
  if (replays < 1) throw std::invalid_argument("selftest: replays must be >= 1");
  bind_device(g.device());
  const Driver& d = drv();
  BufPtr flag = g.flag(), row = g.row();
  const size_t n = g.nbytes();
  const CUdeviceptr staging = g.staging_ptr();
  CUstream s = reinterpret_cast<CUstream>(g.stream());

  int done = 0, mismatches = 0, flag_not_reset = 0, early = 0, timeouts = 0, released = 0;
  long first_bad_replay = -1, first_bad_offset = -1;
  bool stranded = false;
  std::string error;
  std::vector<double> lat_us;
  lat_us.reserve(replays);
  {
    py::gil_scoped_release nogil;
    std::vector<uint8_t> expect(n), got(n);
    std::atomic<long> go{-1}, signalled{-1};
    std::atomic<bool> stop{false};
    std::thread signaller([&] {
      long next = 0;
      while (!stop.load(std::memory_order_acquire)) {
        long want = go.load(std::memory_order_acquire);
        if (want >= next) {
          fill_pattern(row->host(), n, seed, static_cast<uint64_t>(want));
          flag->store_u32(0, 1);  // seq_cst: the row bytes are visible first
          signalled.store(want, std::memory_order_release);
          next = want + 1;
        } else {
          cpu_relax();
        }
      }
    });
    try {
      flag->store_u32(0, 0);
      for (int i = 0; i < replays; ++i) {
        CK(d.p_cuMemsetD8Async(staging, static_cast<unsigned char>(poison), n, s));
        auto t0 = Clock::now();
        CUresult r = g.launch_raw(s);
        if (r != CUDA_SUCCESS) throw_cu(r, "cuGraphLaunch");
        // The WAIT has not been signalled: the stream must still be busy.
        if (d.p_cuStreamQuery(s) == CUDA_SUCCESS) early++;
        go.store(i, std::memory_order_release);
        GuardResult gr = guarded_wait(s, flag.get(), timeout_s);
        lat_us.push_back(us_since(t0));
        if (!gr.error.empty() && !gr.released) {
          stranded = gr.guard_fired;
          error = gr.error;
          break;
        }
        if (gr.guard_fired) {
          timeouts++;
          if (gr.released) released++;
          // Let the late signaller finish, then clear its stale flag.
          auto tw = Clock::now();
          while (signalled.load(std::memory_order_acquire) < i && us_since(tw) < 2e6) cpu_relax();
          flag->store_u32(0, 0);
          if (timeouts >= 3) {
            error = "aborted: the stranding guard had to release " + std::to_string(timeouts) + " replays";
            break;
          }
        }
        CK(d.p_cuMemcpyDtoH(got.data(), staging, n));
        fill_pattern(expect.data(), n, seed, static_cast<uint64_t>(i));
        if (std::memcmp(got.data(), expect.data(), n) != 0) {
          if (mismatches == 0) {
            first_bad_replay = i;
            for (size_t k = 0; k < n; ++k)
              if (got[k] != expect[k]) {
                first_bad_offset = static_cast<long>(k);
                break;
              }
          }
          mismatches++;
        }
        if (flag->load_u32(0) != 0) {
          flag_not_reset++;
          flag->store_u32(0, 0);
        }
        done++;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    stop.store(true, std::memory_order_release);
    signaller.join();
  }
  py::dict out;
  out["replays"] = done;
  out["requested"] = replays;
  out["row_bytes"] = n;
  out["mismatches"] = mismatches;
  out["flag_not_reset"] = flag_not_reset;
  out["early_completions"] = early;
  out["timeouts"] = timeouts;
  out["released_by_guard"] = released;
  out["stranded"] = stranded;
  out["first_bad_replay"] = first_bad_replay;
  out["first_bad_offset"] = first_bad_offset;
  out["latency_us"] = lat_us;
  out["error"] = error.empty() ? py::object(py::none()) : py::object(py::str(error));
  return out;
}

// ------------------------------------------------------------------------------------------------
// Timings: deferred (graph) path vs synchronous (gather + H2D copy) path, interleaved
// ------------------------------------------------------------------------------------------------

py::dict time_paths(BufPtr flag, BufPtr row, uint64_t staging_ptr, size_t n, uint64_t stream,
                    DeferredRowGraph* g, size_t table_rows, int iters, int warmup, uint64_t seed,
                    double timeout_s) {
  check_buffers(flag, row, n, "time_paths");
  if (stream == 0) throw std::invalid_argument("time_paths: a non-default stream is required");
  if (table_rows < 1 || iters < 1 || warmup < 0) throw std::invalid_argument("time_paths: bad sizes");
  if (g) {
    g->check_live("time_paths");
    if (g->nbytes() != n || g->flag().get() != flag.get() || g->row().get() != row.get() ||
        g->staging_ptr() != staging_ptr)
      throw std::invalid_argument("time_paths: graph was captured for other buffers/size");
  }
  bind_device(flag->device());
  const Driver& d = drv();
  CUstream s = reinterpret_cast<CUstream>(stream);
  std::vector<double> deferred, signal_to_done, sync;
  int mism_def = 0, mism_sync = 0, timeouts = 0;
  std::string error;
  {
    py::gil_scoped_release nogil;
    // The offloaded table: ordinary (pageable) host memory, gathered one random row at a time.
    std::vector<uint8_t> table(table_rows * n);
    for (size_t r = 0; r < table_rows; ++r) fill_pattern(table.data() + r * n, n, seed, r);
    std::vector<uint8_t> got(n);
    uint64_t rng = seed | 1;
    auto next_row = [&] {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      return static_cast<size_t>(rng % table_rows);
    };
    try {
      flag->store_u32(0, 0);
      for (int it = -warmup; it < iters; ++it) {
        if (g) {
          size_t idx = next_row();
          auto t0 = Clock::now();
          CUresult r = g->launch_raw(s);
          if (r != CUDA_SUCCESS) throw_cu(r, "cuGraphLaunch");
          std::memcpy(row->host(), table.data() + idx * n, n);  // host gather
          flag->store_u32(0, 1);                                // signal (seq_cst)
          auto ts = Clock::now();
          GuardResult gr = guarded_wait(s, flag.get(), timeout_s);
          auto t1 = Clock::now();
          if (!gr.completed) {
            timeouts++;
            if (!gr.released || timeouts >= 3) {
              error = gr.error.empty() ? "aborted: the stranding guard had to release " + std::to_string(timeouts) +
                                             " replays"
                                       : gr.error;
              break;
            }
          }
          if (it >= 0) {
            deferred.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            signal_to_done.push_back(std::chrono::duration<double, std::micro>(t1 - ts).count());
          }
          CK(d.p_cuMemcpyDtoH(got.data(), staging_ptr, n));
          if (std::memcmp(got.data(), table.data() + idx * n, n) != 0) mism_def++;
        }
        {
          size_t idx = next_row();
          auto t0 = Clock::now();
          std::memcpy(row->host(), table.data() + idx * n, n);  // host gather into pinned bounce
          CK(d.p_cuMemcpyHtoDAsync(staging_ptr, row->host(), n, s));
          GuardResult gr = guarded_wait(s, nullptr, timeout_s);
          auto t1 = Clock::now();
          if (!gr.completed) {
            error = gr.error.empty() ? "synchronous copy did not complete" : gr.error;
            break;
          }
          if (it >= 0) sync.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          CK(d.p_cuMemcpyDtoH(got.data(), staging_ptr, n));
          if (std::memcmp(got.data(), table.data() + idx * n, n) != 0) mism_sync++;
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  py::dict out;
  out["row_bytes"] = n;
  out["iters"] = iters;
  out["deferred_us"] = deferred;
  out["deferred_signal_to_done_us"] = signal_to_done;
  out["sync_us"] = sync;
  out["deferred_mismatches"] = mism_def;
  out["sync_mismatches"] = mism_sync;
  out["timeouts"] = timeouts;
  out["error"] = error.empty() ? py::object(py::none()) : py::object(py::str(error));
  return out;
}

// ------------------------------------------------------------------------------------------------
// Capability: attributes and an eager (uncaptured) functional trial of the memops
// ------------------------------------------------------------------------------------------------

py::dict device_info(int ordinal) {
  bind_device(ordinal);
  const Driver& d = drv();
  CUdevice dev;
  CK(d.p_cuDeviceGet(&dev, ordinal));
  char name[256] = {0};
  CK(d.p_cuDeviceGetName(name, sizeof(name) - 1, dev));
  char bus[64] = {0};
  if (d.p_cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev) != CUDA_SUCCESS) bus[0] = 0;
  size_t mem = 0;
  CK(d.p_cuDeviceTotalMem(&mem, dev));
  int major = 0, minor = 0;
  CK(d.p_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CK(d.p_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  py::dict out;
  out["index"] = ordinal;
  out["name"] = std::string(name);
  out["pci_bus_id"] = std::string(bus);
  out["total_memory_bytes"] = mem;
  out["compute_capability"] = std::to_string(major) + "." + std::to_string(minor);
  return out;
}

// Raw attribute values (null where the driver rejects the attribute, e.g. an ID newer than it).
py::dict memop_attributes(int ordinal) {
  bind_device(ordinal);
  const Driver& d = drv();
  CUdevice dev;
  CK(d.p_cuDeviceGet(&dev, ordinal));
  struct A {
    const char* name;
    int id;
  };
  // IDs from cuda.h (CUdevice_attribute); numeric so older headers build too.
  const A attrs[] = {
      {"CAN_MAP_HOST_MEMORY", 19},
      {"UNIFIED_ADDRESSING", 41},
      {"HOST_NATIVE_ATOMIC_SUPPORTED", 86},
      {"PAGEABLE_MEMORY_ACCESS", 88},
      {"CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM", 91},
      {"CAN_USE_STREAM_MEM_OPS_V1", 92},
      {"CAN_USE_64_BIT_STREAM_MEM_OPS_V1", 93},
      {"CAN_USE_STREAM_WAIT_VALUE_NOR_V1", 94},
      {"CAN_FLUSH_REMOTE_WRITES", 98},
      {"CAN_USE_64_BIT_STREAM_MEM_OPS", 122},
      {"CAN_USE_STREAM_WAIT_VALUE_NOR", 123},
  };
  py::dict out;
  for (const auto& a : attrs) {
    int v = 0;
    CUresult r = d.p_cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a.id), dev);
    if (r == CUDA_SUCCESS)
      out[a.name] = v;
    else
      out[a.name] = py::none();
  }
  return out;
}

// Eager trial on a private stream: WRITE32(w0 = 1); WAIT32(w0 == 1); WRITE32(w1 = 0xC0FFEE), then
// the same with 64-bit operations on w2/w3 when `try64`. Every wait's condition is satisfied by the
// write before it in stream order, and the stream is drained through the guard. Returns per
// operation: the enqueue result ("CUDA_SUCCESS" or an error name) and whether the bytes landed.
py::dict memop_trial(int ordinal, bool try64, double timeout_s) {
  bind_device(ordinal);
  const Driver& d = drv();
  auto buf = std::make_shared<HostBuffer>(64, ordinal);
  CUstream s = nullptr;
  CK(d.p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  py::dict out;
  auto res = [&](CUresult r) { return r == CUDA_SUCCESS ? std::string("CUDA_SUCCESS") : err_name(d, r); };
  GuardResult g32, g64;
  std::string w32, wt32, w32b, w64, wt64, w64b;
  bool landed32 = false, landed64 = false;
  {
    py::gil_scoped_release nogil;
    const CUdeviceptr p = buf->dptr();
    CUresult a = d.p_cuStreamWriteValue32(s, p, 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    CUresult b = a == CUDA_SUCCESS ? d.p_cuStreamWaitValue32(s, p, 1, CU_STREAM_WAIT_VALUE_EQ) : a;
    CUresult c = b == CUDA_SUCCESS ? d.p_cuStreamWriteValue32(s, p + 4, 0xC0FFEE, CU_STREAM_WRITE_VALUE_DEFAULT) : b;
    w32 = res(a);
    wt32 = res(b);
    w32b = res(c);
    g32 = guarded_wait(s, buf.get(), timeout_s);
    landed32 = a == CUDA_SUCCESS && c == CUDA_SUCCESS && g32.completed && buf->load_u32(4) == 0xC0FFEE;
    if (try64) {
      const uint64_t v = 0x0123456789ABCDEFULL;
      CUresult e = d.p_cuStreamWriteValue64(s, p + 16, v, CU_STREAM_WRITE_VALUE_DEFAULT);
      CUresult f = e == CUDA_SUCCESS ? d.p_cuStreamWaitValue64(s, p + 16, v, CU_STREAM_WAIT_VALUE_EQ) : e;
      CUresult h = f == CUDA_SUCCESS ? d.p_cuStreamWriteValue64(s, p + 24, ~v, CU_STREAM_WRITE_VALUE_DEFAULT) : f;
      w64 = res(e);
      wt64 = res(f);
      w64b = res(h);
      // A stuck 64-bit wait is released by writing its value from the host.
      auto t0 = Clock::now();
      while (true) {
        CUresult q = d.p_cuStreamQuery(s);
        if (q == CUDA_SUCCESS) {
          g64.completed = true;
          break;
        }
        if (q != CUDA_ERROR_NOT_READY) {
          g64.error = err_name(d, q);
          break;
        }
        if (us_since(t0) > timeout_s * 1e6) {
          g64.guard_fired = true;
          buf->store_u64(16, v);
          d.p_cuStreamSynchronize(s);
          g64.released = true;
          break;
        }
        cpu_relax();
      }
      landed64 = e == CUDA_SUCCESS && h == CUDA_SUCCESS && g64.completed && buf->load_u64(24) == ~v;
    }
  }
  d.p_cuStreamDestroy(s);
  buf->free();
  out["write_value_32"] = w32;
  out["wait_value_32"] = wt32;
  out["write_value_32_second"] = w32b;
  out["ok_32"] = landed32;
  out["guard_32"] = to_dict(g32);
  if (try64) {
    out["write_value_64"] = w64;
    out["wait_value_64"] = wt64;
    out["write_value_64_second"] = w64b;
    out["ok_64"] = landed64;
    out["guard_64"] = to_dict(g64);
  }
  return out;
}

py::dict driver_status() {
  Driver& d = drv_raw();
  py::dict out;
  out["ok"] = d.ok;
  out["error"] = d.ok ? py::object(py::none()) : py::object(py::str(d.error));
  out["version"] = d.version;
  out["library"] = d.library;
  if (d.ok) {
    int count = 0;
    if (d.p_cuDeviceGetCount(&count) == CUDA_SUCCESS) out["device_count"] = count;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Native half of pleharness.probe: CUDA stream memory operations (cuStreamWaitValue32 / "
            "cuStreamWriteValue32) on pinned device-mapped host memory, captured into a CUDA graph, "
            "with a stranding guard. See pleharness/probe/__init__.py.";

  py::register_exception<DriverUnavailable>(m, "DriverUnavailable", PyExc_RuntimeError);
  py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
  py::register_exception<BufferInUseError>(m, "BufferInUseError", PyExc_RuntimeError);

  m.def("driver_status", &driver_status,
        "{'ok': bool, 'error': str|None, 'version': int (1000*major+10*minor), 'library': str, "
        "'device_count': int}. Never raises.");
  m.def("device_info", &device_info, py::arg("device") = 0);
  m.def("memop_attributes", &memop_attributes, py::arg("device") = 0);
  m.def("memop_trial", &memop_trial, py::arg("device") = 0, py::arg("try64") = true,
        py::arg("timeout_s") = 2.0);
  m.def("stream_create",
        [](int device) {
          bind_device(device);
          CUstream s = nullptr;
          CK(drv().p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
          return reinterpret_cast<uint64_t>(s);
        },
        py::arg("device") = 0,
        "A new non-blocking CUstream handle (for callers without torch streams); free with stream_destroy.");
  m.def("stream_destroy",
        [](uint64_t stream, int device) {
          bind_device(device);
          CK(drv().p_cuStreamDestroy(reinterpret_cast<CUstream>(stream)));
        },
        py::arg("stream"), py::arg("device") = 0);
  m.def("pattern",
        [](uint64_t seed, uint64_t index, size_t nbytes) {
          std::string s(nbytes, '\0');
          fill_pattern(reinterpret_cast<uint8_t*>(&s[0]), nbytes, seed, index);
          return py::bytes(s);
        },
        py::arg("seed"), py::arg("index"), py::arg("nbytes"),
        "The byte pattern the self-test signaller writes for replay `index` (splitmix64 words).");

  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(
      m, "HostBuffer",
      "HostBuffer(nbytes, device=0): `nbytes` bytes of pinned, portable, device-mapped host memory "
      "(cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), zero-filled). "
      "device_ptr is its address for the GPU (cuMemHostGetDevicePointer). Lifetime is explicit: "
      "free() releases it now and raises BufferInUseError while a captured graph (DeferredRowGraph "
      "or a CaptureToken) references it; any access after free() raises RuntimeError. Raises "
      "DriverUnavailable without a driver, CudaError when the allocation fails.")
      .def(py::init<size_t, int>(), py::arg("nbytes"), py::arg("device") = 0)
      .def("free", &HostBuffer::free,
           "Free now; True if freed, False if already freed. BufferInUseError while a graph references it.")
      .def("write", &HostBuffer::write, py::arg("data"), py::arg("offset") = 0)
      .def("read", &HostBuffer::read, py::arg("offset") = 0, py::arg("nbytes") = py::none())
      .def("fill_pattern", &HostBuffer::fill_pattern_at, py::arg("seed"), py::arg("index"),
           py::arg("offset") = 0, py::arg("nbytes") = py::none())
      .def("load_u32", &HostBuffer::load_u32, py::arg("offset") = 0)
      .def("store_u32", &HostBuffer::store_u32, py::arg("offset"), py::arg("value"))
      .def("load_u64", &HostBuffer::load_u64, py::arg("offset") = 0)
      .def("store_u64", &HostBuffer::store_u64, py::arg("offset"), py::arg("value"))
      .def_property_readonly("nbytes", &HostBuffer::nbytes)
      .def_property_readonly("device", &HostBuffer::device)
      .def_property_readonly("freed", &HostBuffer::freed)
      .def_property_readonly("graph_refs", &HostBuffer::graph_refs)
      .def_property_readonly("host_ptr", [](const HostBuffer& b) { return reinterpret_cast<uint64_t>(b.host()); })
      .def_property_readonly("device_ptr", [](const HostBuffer& b) { return static_cast<uint64_t>(b.dptr()); });

  py::class_<DeferredRowGraph>(
      m, "DeferredRowGraph",
      "DeferredRowGraph(flag, row, staging_ptr, staging_owner, nbytes, stream): captures "
      "cuStreamWaitValue32(flag == 1, EQ) -> cuStreamWriteValue32(flag = 0) -> "
      "cuMemcpyHtoDAsync(staging <- row, nbytes) on `stream` (a non-default CUstream handle, e.g. "
      "torch.cuda.Stream().cuda_stream; capture mode THREAD_LOCAL) and instantiates it. `flag` "
      "(>= 4 bytes, 32-bit word at offset 0) and `row` (>= nbytes) are HostBuffers, pinned against "
      "free() until destroy(); `staging_owner` (e.g. the torch tensor behind staging_ptr) is kept "
      "alive. launch(stream=0 -> capture stream) enqueues a replay; wait(timeout_s, "
      "release_timeout_s) is the guarded wait (see guarded_wait); destroy() releases a blocked "
      "replay through the guard first. Raises CudaError (e.g. CUDA_ERROR_NOT_SUPPORTED, "
      "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED / _INVALIDATED) when the memops cannot be captured.")
      .def(py::init<BufPtr, BufPtr, uint64_t, py::object, size_t, uint64_t>(), py::arg("flag"), py::arg("row"),
           py::arg("staging_ptr"), py::arg("staging_owner"), py::arg("nbytes"), py::arg("stream"))
      .def("launch", &DeferredRowGraph::launch, py::arg("stream") = 0)
      .def("wait", &DeferredRowGraph::wait, py::arg("timeout_s") = 2.0, py::arg("release_timeout_s") = 5.0)
      .def("destroy", &DeferredRowGraph::destroy)
      .def_property_readonly("destroyed", &DeferredRowGraph::destroyed)
      .def_property_readonly("node_types", &DeferredRowGraph::node_types)
      .def_property_readonly("nbytes", &DeferredRowGraph::nbytes)
      .def_property_readonly("stream", &DeferredRowGraph::stream);

  py::class_<CaptureToken>(m, "CaptureToken")
      .def("release", &CaptureToken::release)
      .def_property_readonly("released", &CaptureToken::released);

  m.def("enqueue_deferred_row",
        [](BufPtr flag, BufPtr row, uint64_t staging_ptr, size_t nbytes, uint64_t stream) -> py::object {
          check_buffers(flag, row, nbytes, "enqueue_deferred_row");
          if (staging_ptr == 0) throw std::invalid_argument("enqueue_deferred_row: staging pointer is null");
          bind_device(flag->device());
          const Driver& d = drv();
          CUstream s = reinterpret_cast<CUstream>(stream);
          CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
          CK(d.p_cuStreamIsCapturing(s, &st));
          CUresult r = enqueue_deferred(s, flag->dptr(), row->host(), staging_ptr, nbytes);
          if (r != CUDA_SUCCESS) throw_cu(r, "enqueue_deferred_row");
          if (st == CU_STREAM_CAPTURE_STATUS_ACTIVE) return py::cast(new CaptureToken(flag, row), py::return_value_policy::take_ownership);
          return py::none();
        },
        py::arg("flag"), py::arg("row"), py::arg("staging_ptr"), py::arg("nbytes"), py::arg("stream"));

  m.def("guarded_wait",
        [](uint64_t stream, BufPtr flag, double timeout_s, double release_timeout_s) {
          if (flag) bind_device(flag->device());
          GuardResult g;
          {
            py::gil_scoped_release nogil;
            g = guarded_wait(reinterpret_cast<CUstream>(stream), flag.get(), timeout_s, release_timeout_s);
          }
          return to_dict(g);
        },
        py::arg("stream"), py::arg("flag") = nullptr, py::arg("timeout_s") = 2.0,
        py::arg("release_timeout_s") = 5.0,
        "The stranding guard. Spin on cuStreamQuery(stream) for up to timeout_s seconds; if the "
        "stream has not drained and `flag` is given, write 1 into its first 32-bit word from the "
        "host (again only if consumed and still blocked 2 ms later) until the stream drains or "
        "release_timeout_s passes, then reset the flag to 0. Returns {completed, guard_fired, "
        "released, releases, waited_us, total_us (microseconds), error (str|None)}. The GIL is "
        "released while waiting.");

  m.def("selftest", &selftest, py::arg("graph"), py::arg("replays") = 1000, py::arg("timeout_s") = 2.0,
        py::arg("seed") = 0x5EED, py::arg("poison") = 0xA5,
        "Replay `graph` `replays` times: memset staging to `poison`, launch, check the stream is "
        "still busy, let a host thread write pattern(seed, i) into the row and set the flag, wait "
        "(guarded, timeout_s), then compare staging with the pattern and check the flag is 0. "
        "Returns {replays, requested, row_bytes, mismatches, flag_not_reset, early_completions, "
        "timeouts, released_by_guard, stranded, first_bad_replay, first_bad_offset, latency_us "
        "(list, launch to drained, microseconds), error}. Stops after 3 guard releases.");
  m.def("time_paths", &time_paths, py::arg("flag"), py::arg("row"), py::arg("staging_ptr"), py::arg("nbytes"),
        py::arg("stream"), py::arg("graph"), py::arg("table_rows") = 1024, py::arg("iters") = 1000,
        py::arg("warmup") = 50, py::arg("seed") = 1234, py::arg("timeout_s") = 2.0,
        "Interleaved samples (host steady_clock, microseconds) of the deferred path (graph launch, "
        "host gather of a random row of a pageable table_rows x nbytes table into `row`, flag = 1, "
        "spin until drained; skipped when graph is None) and the synchronous path (gather, "
        "cuMemcpyHtoDAsync, spin until drained). Every sample is verified afterwards. Returns "
        "{row_bytes, iters, deferred_us, deferred_signal_to_done_us, sync_us (lists), "
        "deferred_mismatches, sync_mismatches, timeouts, error}.");
}
