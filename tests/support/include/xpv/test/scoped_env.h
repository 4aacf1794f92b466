// Sets (or unsets) an environment variable for one scope, and puts back what was there.
// Not thread-safe (setenv): for tests that read the variable on the test's own thread, or before
// starting the threads that do.
#pragma once

#include <stdlib.h>

#include <optional>
#include <string>

namespace xpv::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace xpv::test
