// set_thread_name — names the calling thread, as `top -H`, `ps -L`, perf and /proc/<pid>/task/<tid>/comm
// show it. Linux keeps 15 bytes; a longer name is cut there.
#pragma once

#include <pthread.h>

#include <string_view>

namespace xpv {

inline void set_thread_name(std::string_view name) noexcept {
  char buf[16]{};
  name.copy(buf, sizeof buf - 1);
  (void)pthread_setname_np(pthread_self(), buf);
}

}  // namespace xpv
