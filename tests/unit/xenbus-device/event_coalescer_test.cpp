// EventCoalescer: at most one queued handling per key, whatever the number of events; a change
// made once the handling has started is handled again.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "xpv/xenbus/event_coalescer.h"

namespace xpv::xenbus {
namespace {

using Key = std::pair<unsigned, unsigned>;

TEST(EventCoalescer, OnlyTheFirstEventOfABurstPostsAndEachKeyOnItsOwn) {
  EventCoalescer<Key> c;
  EXPECT_TRUE(c.claim({5, 768}));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(c.claim({5, 768}));
  EXPECT_TRUE(c.queued({5, 768}));
  EXPECT_TRUE(c.claim({5, 832})) << "another device of the same guest";
  EXPECT_TRUE(c.claim({6, 768})) << "another guest";
  c.release({5, 768});  // the queued handling starts
  EXPECT_FALSE(c.queued({5, 768}));
  EXPECT_TRUE(c.claim({5, 768})) << "an event during the handling posts it again";
  EXPECT_FALSE(c.claim({5, 768}));
}

TEST(EventCoalescer, PostOnceQueuesOneHandlerThatReleasesBeforeItRuns) {
  EventCoalescer<Key> c;
  std::vector<std::function<void()>> queue;
  int handled = 0;
  auto post = [&](auto h) { queue.emplace_back(std::move(h)); };
  for (int i = 0; i < 5; ++i) c.post_once({1, 2}, post, [&] { ++handled; });
  ASSERT_EQ(queue.size(), 1u);
  queue.front()();
  EXPECT_EQ(handled, 1);
  EXPECT_FALSE(c.queued({1, 2}));
  // A post that throws queues nothing and leaves the key free.
  EXPECT_THROW(c.post_once({3, 4}, [](auto) { throw std::bad_alloc(); }, [] {}), std::bad_alloc);
  EXPECT_FALSE(c.queued({3, 4}));
}

TEST(EventCoalescer, ConcurrentEventsPostOnce) {
  EventCoalescer<Key> c;
  std::atomic<int> posted{0};
  std::vector<std::thread> watchers;
  for (int t = 0; t < 4; ++t) {
    watchers.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        if (c.claim({1, 0})) posted.fetch_add(1);
      }
    });
  }
  for (auto& t : watchers) t.join();
  EXPECT_EQ(posted.load(), 1);
}

}  // namespace
}  // namespace xpv::xenbus
