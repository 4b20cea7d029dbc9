// harness.cc: runs the C test bodies of xseg_test.h under GoogleTest.
//
// Each XSEG_TEST registers (suite, name, body) from a constructor; main()
// hands every one to testing::RegisterTest with a fixture that resets the
// emulator before the body and checks for leaked driver objects after it.

#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "xseg.h"
#include "xseg_test.h"

// The emulator's conformance tests link no xseg code; their status checks
// (unused there) then print numbers instead of names.
#pragma weak xseg_status_name
#pragma weak xseg_last_error

namespace {

struct RegisteredTest {
  const char *suite, *name, *file;
  int line;
  xt_body_fn body;
};

std::vector<RegisteredTest> &Registry() {
  static std::vector<RegisteredTest> tests;
  return tests;
}

thread_local bool t_skipped = false;
thread_local std::string t_skip_reason;

class CTest : public testing::Test {
 public:
  explicit CTest(xt_body_fn body) : body_(body) {}

  void SetUp() override {
    t_skipped = false;
    if (!xt_have_sim()) return;
    xsim_reset();
    xsim_get_live(&before_);
  }

  void TestBody() override {
    body_();
    if (t_skipped) GTEST_SKIP() << t_skip_reason;
  }

  void TearDown() override {
    if (!xt_have_sim()) return;
    xsim_live now;
    xsim_get_live(&now);
    char msg[512];
    if (!xt_live_unchanged(&before_, &now, msg, sizeof msg)) {
      ADD_FAILURE() << "leak: " << msg;
      xsim_report_live(stderr);
    }
  }

 private:
  xt_body_fn body_;
  xsim_live before_{};
};

std::string Describe(long long v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld (0x%llx)", v,
                static_cast<unsigned long long>(v));
  return buf;
}

bool Report(const char *file, int line, bool fatal, const std::string &msg) {
  if (fatal) {
    GTEST_MESSAGE_AT_(file, line, msg.c_str(),
                      testing::TestPartResult::kFatalFailure);
  } else {
    ADD_FAILURE_AT(file, line) << msg;
  }
  return false;
}

const char *CuName(CUresult r) {
  const char *name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr)
    return "(unknown CUresult)";
  return name;
}

}  // namespace

extern "C" void xt_register(const char *suite, const char *name,
                            xt_body_fn body, const char *file, int line) {
  Registry().push_back({suite, name, file, line, body});
}

extern "C" bool xt_fail(const char *file, int line, bool fatal,
                        const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return Report(file, line, fatal, buf);
}

extern "C" bool xt_check_int(const char *file, int line, bool fatal,
                             const char *op, long long a, long long b,
                             const char *sa, const char *sb) {
  const std::string o = op;
  const bool ok = o == "==" ? a == b : o == "!=" ? a != b : o == "<" ? a < b
                : o == "<=" ? a <= b : o == ">" ? a > b : a >= b;
  if (ok) return true;
  return Report(file, line, fatal,
                std::string("expected ") + sa + " " + op + " " + sb +
                    "\n  " + sa + " = " + Describe(a) + "\n  " + sb + " = " +
                    Describe(b));
}

extern "C" bool xt_check_cu(const char *file, int line, bool fatal,
                            CUresult got, CUresult want, const char *expr) {
  if (got == want) return true;
  return Report(file, line, fatal,
                std::string(expr) + "\n  returned " + CuName(got) +
                    ", expected " + CuName(want));
}

extern "C" bool xt_check_status(const char *file, int line, bool fatal,
                                int got, int want, const char *expr) {
  if (got == want) return true;
  auto name = [](int s) {
    return xseg_status_name != nullptr
               ? std::string(xseg_status_name(static_cast<xseg_status>(s)))
               : "status " + std::to_string(s);
  };
  std::string msg = std::string(expr) + "\n  returned " + name(got) +
                    ", expected " + name(want);
  if (got != XSEG_OK && xseg_last_error != nullptr)
    msg += std::string("\n  message: ") + xseg_last_error();
  return Report(file, line, fatal, msg);
}

extern "C" bool xt_check_str(const char *file, int line, bool fatal,
                             const char *a, const char *b, const char *sa,
                             const char *sb) {
  if (a != nullptr && b != nullptr && std::string(a) == b) return true;
  return Report(file, line, fatal,
                std::string("expected ") + sa + " == " + sb + "\n  " + sa +
                    " = \"" + (a ? a : "(null)") + "\"\n  " + sb + " = \"" +
                    (b ? b : "(null)") + "\"");
}

extern "C" void xt_skip(const char *file, int line, const char *why) {
  t_skipped = true;
  t_skip_reason = std::string(why) + " (" + file + ":" + std::to_string(line) +
                  ")";
}

extern "C" bool xt_live_unchanged(const xsim_live *before,
                                  const xsim_live *now, char *msg,
                                  size_t msg_size) {
  struct Field {
    const char *name;
    uint64_t before, now;
  } fields[] = {
      {"handles", before->handles, now->handles},
      {"mappings", before->mappings, now->mappings},
      {"reservations", before->reservations, now->reservations},
      {"streams", before->streams, now->streams},
      {"events", before->events, now->events},
      {"physical_bytes", before->physical_bytes, now->physical_bytes},
  };
  std::string out;
  for (const Field &f : fields) {
    if (f.now <= f.before) continue;
    out += std::string(out.empty() ? "" : ", ") + f.name + " " +
           std::to_string(f.before) + " -> " + std::to_string(f.now);
  }
  std::snprintf(msg, msg_size, "%s", out.c_str());
  return out.empty();
}

extern "C" bool xt_devices_at_least(int n) {
  int count = 0;
  return cuInit(0) == CUDA_SUCCESS &&
         cuDeviceGetCount(&count) == CUDA_SUCCESS && count >= n;
}

extern "C" CUcontext xt_context(int dev) {
  static CUcontext contexts[64];
  static std::mutex lock;
  if (dev < 0 || dev >= 64 || cuInit(0) != CUDA_SUCCESS) return nullptr;
  std::lock_guard<std::mutex> guard(lock);
  if (contexts[dev] == nullptr) {
    CUdevice d;
    if (cuDeviceGet(&d, dev) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&contexts[dev], d) != CUDA_SUCCESS)
      return nullptr;
  }
  if (cuCtxSetCurrent(contexts[dev]) != CUDA_SUCCESS) return nullptr;
  return contexts[dev];
}

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  for (const RegisteredTest &t : Registry()) {
    xt_body_fn body = t.body;
    testing::RegisterTest(t.suite, t.name, nullptr, nullptr, t.file, t.line,
                          [body]() -> testing::Test * {
                            return new CTest(body);
                          });
  }
  return RUN_ALL_TESTS();
}
