// A data-plane object's run() (a backend queue's) on a thread of its own for as long as this
// lives: at the end stop() and join, also when an ASSERT returns from the test early (a joinable
// std::thread would terminate the binary instead of failing one test).
#pragma once

#include <thread>

namespace xpv::test {

template <class T>
class Running {
 public:
  explicit Running(T& object) : object_(object), thread_([&object] { object.run(); }) {}
  ~Running() {
    object_.stop();
    if (thread_.joinable()) thread_.join();
  }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

 private:
  T& object_;
  std::thread thread_;
};

}  // namespace xpv::test
