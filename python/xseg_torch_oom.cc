// xseg_torch_oom.cc: compiled by python/xseg_torch.py against the user's
// own torch (its headers, its libc10.so, its C++ ABI) on first install, so
// that an allocation xseg cannot serve throws c10::OutOfMemoryError, which
// PyTorch's Python bindings raise as torch.cuda.OutOfMemoryError.
// libxseg_torch.so calls it through xseg_torch_cxx_set_oom_thrower.
#include <c10/util/Exception.h>

extern "C" __attribute__((visibility("default"))) void xseg_torch_throw_oom(
    const char *message) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
}
