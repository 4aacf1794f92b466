#include <gtest/gtest.h>

#include "xpv/toolstack/device_states.h"

namespace xpv::toolstack {
namespace {

using S = xenbus::XenbusState;
constexpr std::optional<S> kAbsent = std::nullopt;

TEST(DeviceStates, FromNode) {
  EXPECT_EQ(state_from_node(std::nullopt), kAbsent);
  EXPECT_EQ(state_from_node(std::string("4")), S::connected);
  EXPECT_EQ(state_from_node(std::string("44")), S::unknown);
  EXPECT_EQ(state_from_node(std::string("")), S::unknown);
}

TEST(DeviceStates, Connected) {
  EXPECT_TRUE(device_connected({S::connected, S::connected}));
  EXPECT_FALSE(device_connected({S::initialised, S::connected}));
  EXPECT_FALSE(device_connected({S::connected, S::init_wait}));
  EXPECT_FALSE(device_connected({kAbsent, S::connected}));
}

TEST(DeviceStates, Refused) {
  EXPECT_TRUE(device_refused({S::initialising, S::closed}));
  EXPECT_TRUE(device_refused({S::closing, S::init_wait}));
  EXPECT_FALSE(device_refused({S::initialised, S::init_wait}));
}

TEST(DeviceStates, ClosedWhenBothEndsClosed) {
  EXPECT_TRUE(device_closed({S::closed, S::closed}, true, true));
  EXPECT_FALSE(device_closed({S::closed, S::closing}, true, true));      // backend still unmapping
  EXPECT_FALSE(device_closed({S::connected, S::closing}, true, true));   // frontend has not noticed
  EXPECT_FALSE(device_closed({S::closing, S::closing}, true, true));
  EXPECT_TRUE(device_closed({S::closed, kAbsent}, true, true));          // backend forgot it
}

TEST(DeviceStates, NeverConnectedHasNothingToWaitFor) {
  EXPECT_TRUE(device_closed({S::initialising, S::closing}, true, true));  // what we wrote
  EXPECT_TRUE(device_closed({S::initialising, S::init_wait}, true, true));
  EXPECT_TRUE(device_closed({kAbsent, S::initialising}, true, true));
  EXPECT_FALSE(device_closed({S::initialised, S::init_wait}, true, true));  // rings granted
  EXPECT_FALSE(device_closed({S::initialising, S::connected}, true, true));
}

TEST(DeviceStates, NobodyToAnswer) {
  EXPECT_TRUE(device_closed({S::connected, S::connected}, false, true));  // domain process gone
  EXPECT_TRUE(device_closed({S::closed, S::closing}, true, false));       // backend daemon gone
  EXPECT_FALSE(device_closed({S::connected, S::closing}, true, false));   // the frontend can still close
}

TEST(DeviceStates, Describe) {
  EXPECT_EQ(describe({S::initialised, S::init_wait}), "frontend 3 (Initialised), backend 2 (InitWait)");
  EXPECT_EQ(describe({kAbsent, S::closed}), "frontend absent, backend 6 (Closed)");
}

}  // namespace
}  // namespace xpv::toolstack
