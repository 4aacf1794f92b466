#include <gtest/gtest.h>

extern "C" {
#include <xen/io/xenbus.h>
}

#include "xpv/xenbus/device_state.h"

namespace xpv::xenbus {
namespace {

using S = XenbusState;

TEST(XenbusStateAbi, ValuesMatchTheOfficialHeader) {
  EXPECT_EQ(static_cast<int>(S::unknown), XenbusStateUnknown);
  EXPECT_EQ(static_cast<int>(S::initialising), XenbusStateInitialising);
  EXPECT_EQ(static_cast<int>(S::init_wait), XenbusStateInitWait);
  EXPECT_EQ(static_cast<int>(S::initialised), XenbusStateInitialised);
  EXPECT_EQ(static_cast<int>(S::connected), XenbusStateConnected);
  EXPECT_EQ(static_cast<int>(S::closing), XenbusStateClosing);
  EXPECT_EQ(static_cast<int>(S::closed), XenbusStateClosed);
  EXPECT_EQ(static_cast<int>(S::reconfiguring), XenbusStateReconfiguring);
  EXPECT_EQ(static_cast<int>(S::reconfigured), XenbusStateReconfigured);
}

TEST(XenbusState, ParsesOnlySingleDigits) {
  EXPECT_EQ(parse_state("4"), S::connected);
  EXPECT_EQ(parse_state("0"), S::unknown);
  EXPECT_EQ(parse_state("8"), S::reconfigured);
  for (const char* bad : {"", "9", "04", "4 ", "-1", "x", "44"}) EXPECT_FALSE(parse_state(bad)) << bad;
  EXPECT_STREQ(to_string(S::init_wait), "InitWait");
}

// Walks both ends through the whole life of a device, each end acting only on what it sees.
TEST(XenbusState, FullLifecycleConverges) {
  S back = S::init_wait, front = S::initialising;
  auto f = frontend_step(front, back);
  EXPECT_EQ(f.action, FrontendAction::setup);
  front = f.next;
  EXPECT_EQ(front, S::initialised);
  auto b = backend_step(back, front, true);
  EXPECT_EQ(b.action, BackendAction::connect);
  back = b.next;
  EXPECT_EQ(back, S::connected);
  f = frontend_step(front, back);
  EXPECT_EQ(f.action, FrontendAction::connect);
  front = f.next;
  EXPECT_EQ(front, S::connected);
  // Steady state: nobody moves.
  EXPECT_EQ(backend_step(back, front, true).action, BackendAction::none);
  EXPECT_EQ(frontend_step(front, back).action, FrontendAction::none);
  // The guest closes (module unload).
  front = S::closing;
  b = backend_step(back, front, true);
  EXPECT_EQ(b.action, BackendAction::disconnect);
  back = b.next;
  EXPECT_EQ(back, S::closing);
  front = S::closed;
  b = backend_step(back, front, true);
  EXPECT_EQ(b.action, BackendAction::disconnect);
  EXPECT_EQ(b.next, S::closed);
  back = b.next;
  // It comes back (module reload): the backend offers the device again.
  front = S::initialising;
  b = backend_step(back, front, true);
  EXPECT_EQ(b.action, BackendAction::none);
  EXPECT_EQ(b.next, S::init_wait);
}

TEST(XenbusState, BackendConnectsWhenTheFrontendSkippedInitialised) {
  auto b = backend_step(S::init_wait, S::connected, true);
  EXPECT_EQ(b.action, BackendAction::connect);
  EXPECT_EQ(b.next, S::connected);
}

TEST(XenbusState, BackendDoesNotReconnectAfterCloseUntilTheFrontendStartsOver) {
  EXPECT_EQ(backend_step(S::closed, S::connected, true).action, BackendAction::none);
  EXPECT_EQ(backend_step(S::closing, S::initialised, true).action, BackendAction::none);
}

TEST(XenbusState, AClosedBackendAnswersAFrontendThatClosesWithClosing) {
  auto b = backend_step(S::closed, S::closing, true);
  EXPECT_EQ(b.action, BackendAction::none);
  EXPECT_EQ(b.next, S::closing);
  // The frontend then closes, and the backend with it.
  auto f = frontend_step(S::closing, b.next);
  EXPECT_EQ(f.next, S::closed);
  b = backend_step(b.next, f.next, true);
  EXPECT_EQ(b.next, S::closed);
  EXPECT_EQ(backend_step(S::closed, S::closed, true).action, BackendAction::none) << "and stays there";
}

// A frontend back at Initialising while the backend is still Closing (its Closed was missed,
// or it never wrote one): the backend finishes closing and then offers the device again, rather
// than both ends waiting for each other.
TEST(XenbusState, AFrontendThatStartsOverWhileTheBackendIsClosingGetsTheDeviceAgain) {
  auto b = backend_step(S::closing, S::initialising, true);
  EXPECT_EQ(b.action, BackendAction::disconnect);
  EXPECT_EQ(b.next, S::closed);
  b = backend_step(b.next, S::initialising, true);
  EXPECT_EQ(b.next, S::init_wait);
  EXPECT_EQ(frontend_step(S::initialising, b.next).action, FrontendAction::setup);
  // A device being removed is not offered again.
  EXPECT_EQ(backend_step(S::closing, S::initialising, false).next, S::closing);
}

// A frontend back at Initialising while the backend is Connected: it started over with new rings
// and nobody saw it close (a backend daemon that was down meanwhile). The backend lets go of
// whatever it holds and offers the device again straight away: a frontend at Initialising takes
// Closing or Closed as the end (Linux's netfront and blkfront switch to Closed and stay there).
TEST(XenbusState, AFrontendThatStartedOverUnseenIsOfferedTheDeviceAgainFromConnected) {
  auto b = backend_step(S::connected, S::initialising, true);
  EXPECT_EQ(b.action, BackendAction::disconnect);
  EXPECT_EQ(b.next, S::init_wait);
  auto f = frontend_step(S::initialising, b.next);
  EXPECT_EQ(f.action, FrontendAction::setup);
  b = backend_step(b.next, f.next, true);
  EXPECT_EQ(b.action, BackendAction::connect);
  EXPECT_EQ(b.next, S::connected);
  // A device the toolstack is taking away closes instead.
  b = backend_step(S::connected, S::initialising, false);
  EXPECT_EQ(b.action, BackendAction::disconnect);
  EXPECT_EQ(b.next, S::closed);
}

TEST(XenbusState, VanishedFrontendRemovesTheDevice) {
  auto b = backend_step(S::connected, S::unknown, true);
  EXPECT_EQ(b.action, BackendAction::disconnect_remove);
  EXPECT_EQ(b.next, S::closed);
}

TEST(XenbusState, OfflineDeviceIsRemovedOnceClosed) {
  EXPECT_EQ(backend_step(S::closing, S::closed, false).action, BackendAction::disconnect_remove);
  EXPECT_EQ(backend_step(S::closed, S::initialising, false).next, S::closed)
      << "a device the toolstack removed is not offered again";
}

TEST(XenbusState, BackendIgnoresStatesThatAreNotTheFrontends) {
  for (S s : {S::init_wait, S::reconfiguring, S::reconfigured}) {
    auto b = backend_step(S::connected, s, true);
    EXPECT_EQ(b.action, BackendAction::none);
    EXPECT_EQ(b.next, S::connected);
  }
}

TEST(XenbusState, FrontendFollowsABackendThatCloses) {
  auto f = frontend_step(S::connected, S::closing);
  EXPECT_EQ(f.action, FrontendAction::disconnect);
  EXPECT_EQ(f.next, S::closed) << "straight to Closed, as Linux's xenbus_frontend_closed";
  // The backend then sees Closed and finishes.
  auto b = backend_step(S::closing, f.next, false);
  EXPECT_EQ(b.action, BackendAction::disconnect_remove);
  EXPECT_EQ(b.next, S::closed);
  // A frontend that closed itself (Closing) follows the backend's Closing the same way.
  f = frontend_step(S::closing, S::closing);
  EXPECT_EQ(f.action, FrontendAction::disconnect);
  EXPECT_EQ(f.next, S::closed);
  f = frontend_step(S::closing, S::closed);
  EXPECT_EQ(f.action, FrontendAction::disconnect);
  EXPECT_EQ(f.next, S::closed);
  EXPECT_EQ(frontend_step(S::closed, S::closed).action, FrontendAction::none);
}

TEST(XenbusState, FrontendSetsUpFirstWhenTheBackendIsAlreadyConnected) {
  auto f = frontend_step(S::initialising, S::connected);
  EXPECT_EQ(f.action, FrontendAction::setup);
  EXPECT_EQ(f.next, S::initialised);
  EXPECT_EQ(frontend_step(f.next, S::connected).action, FrontendAction::connect);
}

// The toolstack removes a connected device: it sets the backend offline and Closing; both ends
// must reach Closed and the backend must drop the device (no end may wait for the other).
TEST(XenbusState, ToolstackRemovalConverges) {
  S back = S::closing, front = S::connected;
  for (int step = 0; step < 8 && !(back == S::closed && front == S::closed); ++step) {
    front = frontend_step(front, back).next;
    back = backend_step(back, front, /*online=*/false).next;
  }
  EXPECT_EQ(front, S::closed);
  EXPECT_EQ(back, S::closed);
  EXPECT_EQ(backend_step(S::closing, S::closed, false).action, BackendAction::disconnect_remove);
}

// After a close the frontend may start over; the backend offers the device again and a frontend
// in Initialising is not sent back to Closed by the backend's old Closed state.
TEST(XenbusState, ReconnectAfterCloseIsNotBouncedBack) {
  EXPECT_EQ(frontend_step(S::initialising, S::closed).action, FrontendAction::none);
  EXPECT_EQ(backend_step(S::closed, S::initialising, true).next, S::init_wait);
}

// A device held in error: nothing goes through but a frontend closing (answered Closing), closed,
// gone or a device going offline; a frontend that starts over counts only after it was Closing.
TEST(ErrorHold, OnlyAClosingOrClosedFrontendEndsIt) {
  ErrorHold h;
  EXPECT_TRUE(h.lets_through(S::initialising, true)) << "not held: everything goes through";
  h.hold();
  for (const S fe : {S::initialising, S::init_wait, S::initialised, S::connected, S::reconfiguring}) {
    EXPECT_FALSE(h.lets_through(fe, true)) << to_string(fe);
  }
  EXPECT_TRUE(h.held());
  EXPECT_TRUE(h.lets_through(S::closing, true)) << "answered, so that it goes on to Closed";
  EXPECT_TRUE(h.held()) << "still held: Closing is not the end";
  EXPECT_FALSE(h.lets_through(S::connected, true));
  EXPECT_TRUE(h.lets_through(S::initialising, true)) << "back at Initialising after Closing: it has closed";
  EXPECT_FALSE(h.held());
  EXPECT_EQ(backend_step(S::closing, S::initialising, true).action, BackendAction::disconnect);

  h.hold();
  EXPECT_TRUE(h.lets_through(S::closed, true));
  EXPECT_FALSE(h.held());
  h.hold();
  EXPECT_TRUE(h.lets_through(S::unknown, true)) << "the frontend's directory is gone";
  EXPECT_FALSE(h.held());
  h.hold();
  EXPECT_TRUE(h.lets_through(S::connected, false)) << "the toolstack removes the device";
  EXPECT_FALSE(h.held());
  h.hold();
  EXPECT_TRUE(h.lets_through(S::closing, true));
  h.hold();  // a new error: the old Closing does not count for it
  EXPECT_FALSE(h.lets_through(S::initialising, true));
}

}  // namespace
}  // namespace xpv::xenbus
