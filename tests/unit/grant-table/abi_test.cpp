// The grant-table ABI against the official Xen public headers (libxen-dev).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include <xen/xen.h>
#include <xen/grant_table.h>

#include "xpv/gnttab/abi.h"

namespace xpv::gnttab {
namespace {

TEST(GnttabAbi, EntryV1MatchesXenHeaderSizeAndEveryOffset) {
  EXPECT_EQ(sizeof(GrantEntryV1), sizeof(grant_entry_v1_t));
  EXPECT_EQ(offsetof(GrantEntryV1, flags), offsetof(grant_entry_v1_t, flags));
  EXPECT_EQ(offsetof(GrantEntryV1, domid), offsetof(grant_entry_v1_t, domid));
  EXPECT_EQ(offsetof(GrantEntryV1, frame), offsetof(grant_entry_v1_t, frame));
  EXPECT_EQ(sizeof(GrantEntryV1::flags), sizeof(grant_entry_v1_t::flags));
  EXPECT_EQ(sizeof(GrantEntryV1::domid), sizeof(grant_entry_v1_t::domid));
  EXPECT_EQ(sizeof(GrantEntryV1::frame), sizeof(grant_entry_v1_t::frame));
  EXPECT_EQ(sizeof(GrantRef), sizeof(grant_ref_t));
  EXPECT_EQ(sizeof(DomId), sizeof(domid_t));
  EXPECT_EQ(sizeof(GrantHandle), sizeof(grant_handle_t));
}

TEST(GnttabAbi, FlagBitsMatchXenHeader) {
  EXPECT_EQ(gtf::invalid, (GTF_invalid));
  EXPECT_EQ(gtf::permit_access, (GTF_permit_access));
  EXPECT_EQ(gtf::accept_transfer, (GTF_accept_transfer));
  EXPECT_EQ(gtf::transitive, (GTF_transitive));
  EXPECT_EQ(gtf::type_mask, (GTF_type_mask));
  EXPECT_EQ(gtf::readonly, (GTF_readonly));
  EXPECT_EQ(gtf::reading, (GTF_reading));
  EXPECT_EQ(gtf::writing, (GTF_writing));
  EXPECT_EQ(gtf::pwt, (GTF_PWT));
  EXPECT_EQ(gtf::pcd, (GTF_PCD));
  EXPECT_EQ(gtf::pat, (GTF_PAT));
  EXPECT_EQ(gtf::sub_page, (GTF_sub_page));
  EXPECT_EQ(gtf::transfer_committed, (GTF_transfer_committed));
  EXPECT_EQ(gtf::transfer_completed, (GTF_transfer_completed));
}

TEST(GnttabAbi, StatusCodesMatchXenHeader) {
  EXPECT_EQ(to_gntst(Status::okay), GNTST_okay);
  EXPECT_EQ(to_gntst(Status::general_error), GNTST_general_error);
  EXPECT_EQ(to_gntst(Status::bad_domain), GNTST_bad_domain);
  EXPECT_EQ(to_gntst(Status::bad_gntref), GNTST_bad_gntref);
  EXPECT_EQ(to_gntst(Status::bad_handle), GNTST_bad_handle);
  EXPECT_EQ(to_gntst(Status::bad_virt_addr), GNTST_bad_virt_addr);
  EXPECT_EQ(to_gntst(Status::bad_dev_addr), GNTST_bad_dev_addr);
  EXPECT_EQ(to_gntst(Status::no_device_space), GNTST_no_device_space);
  EXPECT_EQ(to_gntst(Status::permission_denied), GNTST_permission_denied);
  EXPECT_EQ(to_gntst(Status::bad_page), GNTST_bad_page);
  EXPECT_EQ(to_gntst(Status::bad_copy_arg), GNTST_bad_copy_arg);
  EXPECT_EQ(to_gntst(Status::address_too_big), GNTST_address_too_big);
  EXPECT_EQ(to_gntst(Status::eagain), GNTST_eagain);
  EXPECT_EQ(to_gntst(Status::no_space), GNTST_no_space);
}

TEST(GnttabAbi, GeometryMatchesXenHeader) {
  EXPECT_EQ(kEntriesPerFrame, 4096 / sizeof(grant_entry_v1_t));
  EXPECT_EQ(kNrReservedEntries, GNTTAB_NR_RESERVED_ENTRIES);
  EXPECT_EQ(kReservedConsole, GNTTAB_RESERVED_CONSOLE);
  EXPECT_EQ(kReservedXenstore, GNTTAB_RESERVED_XENSTORE);
  EXPECT_EQ(kDefaultMaxFrames, 64u);
}

TEST(GnttabAbi, HeaderWordIsFlagsThenDomidAsXenLaysThemOut) {
  grant_entry_v1_t e{};
  e.flags = GTF_permit_access | GTF_readonly | GTF_reading;
  e.domid = 0x1234;
  e.frame = 0xdeadbeef;
  std::uint32_t word = 0;
  std::memcpy(&word, &e, sizeof(word));
  EXPECT_EQ(header_flags(word), e.flags);
  EXPECT_EQ(header_domid(word), 0x1234);
  EXPECT_EQ(header_word(e.flags, 0x1234), word);
}

TEST(GnttabAbi, EveryStatusHasItsOwnTextAndUnknownValuesAreNamed) {
  std::set<std::string> texts;
  for (int v = 0; v >= -13; --v) {
    const char* t = to_string(static_cast<Status>(v));
    ASSERT_NE(t, nullptr);
    EXPECT_NE(std::string(t), "unknown grant status") << v;
    texts.insert(t);
  }
  EXPECT_EQ(texts.size(), 14u);
  EXPECT_STREQ(to_string(static_cast<Status>(-14)), "unknown grant status");
  EXPECT_STREQ(to_string(static_cast<Status>(1)), "unknown grant status");
}

}  // namespace
}  // namespace xpv::gnttab
