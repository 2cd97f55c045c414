// A simulated CUDA driver (libcuda.so.1) for CPU-only tests of csrc/ple_probe.cpp.
//
// It implements only the entry points ple_probe resolves, with the semantics the probe relies on:
// every stream is a worker thread executing its queue in order; cuStreamWaitValue32/64 spin on
// host memory until the condition holds; cuStreamWriteValue32/64 store with seq_cst; H2D copies
// and memsets run on the worker; stream capture records the operations into a graph whose launch
// enqueues them again. "Device" memory is host memory (the device pointer of a mapped host
// allocation is its host pointer, as under UVA).
//
// Fault injection through $FAKE_CUDA_MODE (read at cuInit):
//   "no_memops"   cuStreamWaitValue32/WriteValue32/64 return CUDA_ERROR_NOT_SUPPORTED
//   "no_capture"  memops work eagerly, but return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED under capture
//   "skip_copy"   H2D copies recorded in a graph do nothing (the self-test must catch stale bytes)
//   "no_reset"    cuStreamWriteValue32 does nothing (the self-test must see the flag not reset)
//   "no_wait"     cuStreamWaitValue32 does not block (the stranding test must notice)
//
// Build: g++ -std=c++17 -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -I<cuda include> -o libcuda.so.1 fake_libcuda.cpp -lpthread
// Not a driver: never install it where a real libcuda.so.1 is expected.

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string g_mode;

using Op = std::function<void()>;

struct FakeStream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> q;
  std::atomic<int> pending{0};
  bool stop = false;
  bool capturing = false;
  std::vector<std::pair<Op, int>>* capture = nullptr;  // op, node type
  std::thread worker;

  FakeStream() {
    worker = std::thread([this] {
      for (;;) {
        Op op;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [this] { return stop || !q.empty(); });
          if (q.empty()) return;
          op = std::move(q.front());
          q.pop_front();
        }
        op();
        pending.fetch_sub(1);
      }
    });
  }
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(Op op) {
    pending.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu);
      q.push_back(std::move(op));
    }
    cv.notify_all();
  }
};

struct FakeGraph {
  std::vector<std::pair<Op, int>> ops;
};

FakeStream* legacy() {
  static FakeStream* s = new FakeStream();  // leaked on purpose: no join at exit
  return s;
}

FakeStream* S(CUstream h) { return h ? reinterpret_cast<FakeStream*>(h) : legacy(); }

// Enqueue now, or record when the stream is capturing.
CUresult submit(CUstream h, Op op, int node_type) {
  FakeStream* s = S(h);
  if (s->capturing) {
    s->capture->emplace_back(std::move(op), node_type);
    return CUDA_SUCCESS;
  }
  s->push(std::move(op));
  return CUDA_SUCCESS;
}

bool wait_cond32(uint32_t cur, uint32_t v, unsigned flags) {
  switch (flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<int32_t>(cur - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
    case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
    default: return ~(cur | v) != 0;
  }
}
bool wait_cond64(uint64_t cur, uint64_t v, unsigned flags) {
  switch (flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<int64_t>(cur - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
    case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
    default: return ~(cur | v) != 0;
  }
}

thread_local CUcontext t_ctx = nullptr;
int g_ctx_token = 0;

CUresult memop_gate(CUstream h) {
  if (g_mode == "no_memops") return CUDA_ERROR_NOT_SUPPORTED;
  if (g_mode == "no_capture" && S(h)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

// ---- entry points ----

CUresult f_cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "no error" : "simulated driver error";
  return CUDA_SUCCESS;
}
CUresult f_cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult f_cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult f_cuDeviceGetName(char* name, int len, CUdevice) {
  std::strncpy(name, "Simulated GPU (fake libcuda)", len);
  return CUDA_SUCCESS;
}
CUresult f_cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (static_cast<int>(a)) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return CUDA_SUCCESS;
    case 92: case 93: case 94: *v = 0; return CUDA_SUCCESS;  // V1 memops off, as on a stock driver
    case 98: *v = 0; return CUDA_SUCCESS;
    case 122: case 123: *v = g_mode == "no_memops" ? 0 : 1; return CUDA_SUCCESS;
    case 19: case 41: case 86: case 88: case 91: *v = 1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult f_cuDeviceGetPCIBusId(char* bus, int len, CUdevice) {
  std::strncpy(bus, "0000:00:00.0", len);
  return CUDA_SUCCESS;
}
CUresult f_cuDeviceTotalMem(size_t* b, CUdevice) {
  *b = size_t(1) << 30;
  return CUDA_SUCCESS;
}
CUresult f_cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = reinterpret_cast<CUcontext>(&g_ctx_token);
  return CUDA_SUCCESS;
}
CUresult f_cuCtxGetCurrent(CUcontext* c) {
  *c = t_ctx;
  return CUDA_SUCCESS;
}
CUresult f_cuCtxSetCurrent(CUcontext c) {
  t_ctx = c;
  return CUDA_SUCCESS;
}
CUresult f_cuMemHostAlloc(void** p, size_t n, unsigned) {
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult f_cuMemFreeHost(void* p) {
  std::free(p);
  return CUDA_SUCCESS;
}
CUresult f_cuMemHostGetDevicePointer(CUdeviceptr* d, void* p, unsigned) {
  *d = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
CUresult f_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
  bool skip = g_mode == "skip_copy" && S(h)->capturing;
  return submit(h, [=] { if (!skip) std::memcpy(reinterpret_cast<void*>(dst), src, n); }, CU_GRAPH_NODE_TYPE_MEMCPY);
}
CUresult f_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
CUresult f_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h) {
  return submit(h, [=] { std::memset(reinterpret_cast<void*>(dst), v, n); }, CU_GRAPH_NODE_TYPE_MEMSET);
}
CUresult f_cuStreamCreate(CUstream* h, unsigned) {
  *h = reinterpret_cast<CUstream>(new FakeStream());
  return CUDA_SUCCESS;
}
CUresult f_cuStreamDestroy(CUstream h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  FakeStream* s = S(h);
  while (s->pending.load() > 0) std::this_thread::yield();
  delete s;
  return CUDA_SUCCESS;
}
CUresult f_cuStreamQuery(CUstream h) { return S(h)->pending.load() == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
CUresult f_cuStreamSynchronize(CUstream h) {
  while (S(h)->pending.load() > 0) std::this_thread::yield();
  return CUDA_SUCCESS;
}
CUresult f_cuStreamBeginCapture(CUstream h, CUstreamCaptureMode) {
  if (!h) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  FakeStream* s = S(h);
  if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = true;
  s->capture = new std::vector<std::pair<Op, int>>();
  return CUDA_SUCCESS;
}
CUresult f_cuStreamEndCapture(CUstream h, CUgraph* g) {
  FakeStream* s = S(h);
  if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  auto* fg = new FakeGraph();
  fg->ops = std::move(*s->capture);
  delete s->capture;
  s->capture = nullptr;
  s->capturing = false;
  *g = reinterpret_cast<CUgraph>(fg);
  return CUDA_SUCCESS;
}
CUresult f_cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* st) {
  *st = S(h)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult f_cuStreamWaitValue32(CUstream h, CUdeviceptr addr, cuuint32_t v, unsigned flags) {
  CUresult g = memop_gate(h);
  if (g != CUDA_SUCCESS) return g;
  bool nowait = g_mode == "no_wait";
  return submit(h, [=] {
    if (nowait) return;
    auto* p = reinterpret_cast<uint32_t*>(addr);
    while (!wait_cond32(__atomic_load_n(p, __ATOMIC_SEQ_CST), v, flags)) std::this_thread::yield();
  }, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}
CUresult f_cuStreamWriteValue32(CUstream h, CUdeviceptr addr, cuuint32_t v, unsigned) {
  CUresult g = memop_gate(h);
  if (g != CUDA_SUCCESS) return g;
  bool noreset = g_mode == "no_reset";
  return submit(h, [=] { if (!noreset) __atomic_store_n(reinterpret_cast<uint32_t*>(addr), v, __ATOMIC_SEQ_CST); },
                CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}
CUresult f_cuStreamWaitValue64(CUstream h, CUdeviceptr addr, cuuint64_t v, unsigned flags) {
  CUresult g = memop_gate(h);
  if (g != CUDA_SUCCESS) return g;
  return submit(h, [=] {
    auto* p = reinterpret_cast<uint64_t*>(addr);
    while (!wait_cond64(__atomic_load_n(p, __ATOMIC_SEQ_CST), v, flags)) std::this_thread::yield();
  }, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}
CUresult f_cuStreamWriteValue64(CUstream h, CUdeviceptr addr, cuuint64_t v, unsigned) {
  CUresult g = memop_gate(h);
  if (g != CUDA_SUCCESS) return g;
  return submit(h, [=] { __atomic_store_n(reinterpret_cast<uint64_t*>(addr), v, __ATOMIC_SEQ_CST); },
                CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}
CUresult f_cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
  auto* copy = new FakeGraph(*reinterpret_cast<FakeGraph*>(g));
  *e = reinterpret_cast<CUgraphExec>(copy);
  return CUDA_SUCCESS;
}
CUresult f_cuGraphLaunch(CUgraphExec e, CUstream h) {
  auto* g = reinterpret_cast<FakeGraph*>(e);
  FakeStream* s = S(h);
  if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  for (auto& op : g->ops) s->push(op.first);
  return CUDA_SUCCESS;
}
CUresult f_cuGraphExecDestroy(CUgraphExec e) {
  delete reinterpret_cast<FakeGraph*>(e);
  return CUDA_SUCCESS;
}
CUresult f_cuGraphDestroy(CUgraph g) {
  delete reinterpret_cast<FakeGraph*>(g);
  return CUDA_SUCCESS;
}
// Node handles are (graph ops index + 1) tagged with the graph pointer in a side table.
std::mutex g_nodes_mu;
std::map<uintptr_t, int> g_node_types;
CUresult f_cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* n) {
  auto* fg = reinterpret_cast<FakeGraph*>(g);
  if (!nodes) {
    *n = fg->ops.size();
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(g_nodes_mu);
  for (size_t i = 0; i < *n && i < fg->ops.size(); ++i) {
    uintptr_t key = reinterpret_cast<uintptr_t>(&fg->ops[i]);
    g_node_types[key] = fg->ops[i].second;
    nodes[i] = reinterpret_cast<CUgraphNode>(key);
  }
  return CUDA_SUCCESS;
}
CUresult f_cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* t) {
  std::lock_guard<std::mutex> lock(g_nodes_mu);
  auto it = g_node_types.find(reinterpret_cast<uintptr_t>(node));
  if (it == g_node_types.end()) return CUDA_ERROR_INVALID_VALUE;
  *t = static_cast<CUgraphNodeType>(it->second);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned int) {
  const char* m = std::getenv("FAKE_CUDA_MODE");
  g_mode = m ? m : "";
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; break;
  }
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int, cuuint64_t,
                                                                     CUdriverProcAddressQueryResult* st) {
  static const std::map<std::string, void*> table = {
#define F(name) {#name, reinterpret_cast<void*>(&f_##name)},
      F(cuGetErrorString) F(cuDeviceGet) F(cuDeviceGetCount) F(cuDeviceGetName) F(cuDeviceGetAttribute)
      F(cuDeviceGetPCIBusId) F(cuDeviceTotalMem) F(cuDevicePrimaryCtxRetain) F(cuCtxGetCurrent)
      F(cuCtxSetCurrent) F(cuMemHostAlloc) F(cuMemFreeHost) F(cuMemHostGetDevicePointer)
      F(cuMemcpyHtoDAsync) F(cuMemcpyDtoH) F(cuMemsetD8Async) F(cuStreamCreate) F(cuStreamDestroy)
      F(cuStreamQuery) F(cuStreamSynchronize) F(cuStreamBeginCapture) F(cuStreamEndCapture)
      F(cuStreamIsCapturing) F(cuStreamWaitValue32) F(cuStreamWriteValue32) F(cuStreamWaitValue64)
      F(cuStreamWriteValue64) F(cuGraphInstantiateWithFlags) F(cuGraphLaunch) F(cuGraphExecDestroy)
      F(cuGraphDestroy) F(cuGraphGetNodes) F(cuGraphNodeGetType)
#undef F
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
  };
  auto it = table.find(symbol);
  if (it == table.end()) {
    *pfn = nullptr;
    if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = it->second;
  if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // extern "C"
