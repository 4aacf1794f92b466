#include "bench/hvm_watch.h"

#include <cmath>

namespace xpv::bench::hvm {

namespace {
double seconds(ProgressWatch::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
std::string whole(double s) { return std::to_string(static_cast<long long>(std::floor(s))) + " s"; }
}  // namespace

ProgressWatch::ProgressWatch(Limits limits, Clock::time_point now)
    : limits_(limits), what_("starting"), since_(now), progress_(now), said_(now) {}

void ProgressWatch::step(const std::string& what, Clock::time_point now) {
  std::lock_guard lock(mu_);
  what_ = what;
  since_ = progress_ = now;
  in_child_ = false;
}

void ProgressWatch::progress(Clock::time_point now) {
  std::lock_guard lock(mu_);
  progress_ = now;
}

void ProgressWatch::child_begin(const std::string& what, Clock::time_point now) {
  std::lock_guard lock(mu_);
  what_ = what;
  since_ = progress_ = now;
  in_child_ = true;
}

void ProgressWatch::child_end(Clock::time_point now) {
  std::lock_guard lock(mu_);
  progress_ = now;
  in_child_ = false;
}

void ProgressWatch::said(Clock::time_point now) {
  std::lock_guard lock(mu_);
  said_ = now;
}

ProgressWatch::Verdict ProgressWatch::check(Clock::time_point now) {
  std::lock_guard lock(mu_);
  if (stuck_) return {};
  const double idle = seconds(now - progress_);
  if (idle >= (in_child_ ? limits_.child_stuck_s : limits_.stuck_s)) {
    stuck_ = true;
    return {Verdict::stuck, "no progress for " + whole(idle) + (in_child_ ? " in the command " : " at: ") + what_};
  }
  if (seconds(now - said_) >= limits_.heartbeat_s) {
    said_ = now;
    return {Verdict::heartbeat, "still at: " + what_ + " (" + whole(seconds(now - since_)) + ")"};
  }
  return {};
}

}  // namespace xpv::bench::hvm
