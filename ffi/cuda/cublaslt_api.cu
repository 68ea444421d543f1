// Run-time loading of cuBLASLt (see cublaslt_api.h). Host code only.
#include "cuda/cublaslt_api.h"

#ifdef MXJAX_HAVE_CUBLASLT
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

namespace mxjax::cuda {
namespace {

#define MXJAX_STR2(x) #x
#define MXJAX_STR(x) MXJAX_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." MXJAX_STR(CUBLAS_VER_MAJOR);

// Directory of the shared object holding this code (mxjax/ in site-packages).
std::string own_directory() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&own_directory), &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void* open_library(std::string* tried) {
  const std::string wheel = own_directory() + "/../nvidia/cu" MXJAX_STR(CUBLAS_VER_MAJOR) "/lib/";
  for (const std::string& name : {std::string(kSoname), wheel + kSoname}) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    *tried += "\n  " + name + ": " + dlerror();
  }
  return nullptr;
}

struct Loaded {
  CublasLt lt;
  std::string error;
};

Loaded load() {
  Loaded r;
  std::string tried;
  void* lib = open_library(&tried);
  if (!lib) {
    r.error = std::string("mxjax: could not load ") + kSoname + " (install nvidia-cublas):" + tried;
    return r;
  }
#define MXJAX_CUBLASLT_LOAD(name)                                                          \
  r.lt.name = reinterpret_cast<decltype(r.lt.name)>(dlsym(lib, "cublasLt" #name));         \
  if (!r.lt.name) r.error = "mxjax: " + std::string(kSoname) + " lacks cublasLt" #name;
  MXJAX_CUBLASLT_FUNCTIONS(MXJAX_CUBLASLT_LOAD)
#undef MXJAX_CUBLASLT_LOAD
  return r;
}

}  // namespace

const CublasLt* cublaslt(std::string* error) {
  static const Loaded loaded = load();  // thread-safe one-time initialization
  if (!loaded.error.empty()) {
    *error = loaded.error;
    return nullptr;
  }
  return &loaded.lt;
}

cublasLtHandle_t cublaslt_handle(const CublasLt& lt, int device, std::string* error) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  cublasStatus_t st = lt.Create(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    *error = std::string("mxjax: cublasLtCreate failed: ") + lt.GetStatusString(st);
    return nullptr;
  }
  handles[device] = h;
  return h;
}

}  // namespace mxjax::cuda

#endif  // MXJAX_HAVE_CUBLASLT
