#include "bench/hvm_watch.h"

#include <algorithm>
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
  child_bound_s_ = -1;
}

void ProgressWatch::progress(Clock::time_point now) {
  std::lock_guard lock(mu_);
  progress_ = now;
}

void ProgressWatch::child_begin(const std::string& what, double bound_s, Clock::time_point now) {
  std::lock_guard lock(mu_);
  what_ = what;
  since_ = progress_ = now;
  child_bound_s_ = bound_s < 0 ? 0 : bound_s;
}

void ProgressWatch::child_end(Clock::time_point now) {
  std::lock_guard lock(mu_);
  if (child_bound_s_ >= 0) what_ = "after the command " + what_;
  since_ = progress_ = now;
  child_bound_s_ = -1;
}

void ProgressWatch::said(Clock::time_point now) {
  std::lock_guard lock(mu_);
  said_ = now;
}

ProgressWatch::Verdict ProgressWatch::check(Clock::time_point now) {
  std::lock_guard lock(mu_);
  if (stuck_) return {};
  const double idle = seconds(now - progress_);
  const bool in_child = child_bound_s_ >= 0;
  const double limit = in_child ? std::max(limits_.stuck_s, child_bound_s_ + limits_.child_margin_s) : limits_.stuck_s;
  if (idle >= limit) {
    stuck_ = true;
    return {Verdict::stuck, "no progress for " + whole(idle) + (in_child ? " in the command " : " at: ") + what_};
  }
  if (seconds(now - said_) >= limits_.heartbeat_s) {
    said_ = now;
    return {Verdict::heartbeat, "still at: " + what_ + " (" + whole(seconds(now - since_)) + ")"};
  }
  return {};
}

}  // namespace xpv::bench::hvm
