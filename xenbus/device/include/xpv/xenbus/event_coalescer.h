// At most one queued handling per key for events that arrive faster than they are handled.
//
// A backend watches each frontend's `state` node, and a watch fires on every write to it or under
// it, which the guest controls. Each event used to post its own full reconcile (several
// xenstore round trips), so a guest rewriting its node in a loop grew the backend's queue without
// bound and delayed every other guest's devices (the shape of XSA-349, where Linux keeps at
// most one pending event per backend watch). The handler re-reads the state anyway, so events
// that arrive while one is queued add nothing: claim() on the watch's thread says whether to
// post, and the posted handler calls release() before it reads, so a change made while it runs
// is handled once more. post_once() does all three.
#pragma once

#include <mutex>
#include <set>

namespace xpv::xenbus {

template <class Key>
class EventCoalescer {
 public:
  // True if nothing is queued for `key` (the caller posts its handling); false if one is.
  bool claim(const Key& key) {
    std::lock_guard lk(mu_);
    return queued_.insert(key).second;
  }
  // The queued handling for `key` starts: the next event posts again.
  void release(const Key& key) {
    std::lock_guard lk(mu_);
    queued_.erase(key);
  }
  // The whole protocol: unless one is queued for `key`, hands `post` a handler that releases
  // the key and then runs `handle`. If `post` throws, nothing was queued: the key is released.
  template <class Post, class Handle>
  void post_once(const Key& key, Post&& post, Handle handle) {
    if (!claim(key)) return;
    try {
      post([this, key, handle = std::move(handle)]() mutable {
        release(key);
        handle();
      });
    } catch (...) {
      release(key);
      throw;
    }
  }
  bool queued(const Key& key) const {
    std::lock_guard lk(mu_);
    return queued_.count(key) != 0;
  }

 private:
  mutable std::mutex mu_;
  std::set<Key> queued_;
};

}  // namespace xpv::xenbus
