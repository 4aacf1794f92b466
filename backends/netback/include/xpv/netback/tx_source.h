// What a vif with an address lets its domain send: the source check (pure).
//
// Xen's vif-bridge and vif-route scripts turn a vif's `ip` into iptables rules: the domain's
// IPv4 packets must come from that address (a DHCP client's request from 0.0.0.0 excepted), so a
// guest cannot take another host's address. xpv-netback has no script; it makes the same check
// itself on every guest-tx frame of a vif whose `ip` node gives the domain an address, before the
// frame reaches the TAP — for a bridged vif too, where a bridge would otherwise carry a forged
// source to every port. It also checks what iptables never sees: an ARP packet must be Ethernet/
// IPv4 ARP announcing the domain's address (or 0.0.0.0, an RFC 5227 probe), and a frame that can
// carry IPv4 inside something the check does not parse is refused: 802.1Q / 802.1ad tags, an
// 802.3 length instead of an EtherType (LLC/SNAP), MPLS, PPPoE sessions. An IPv4 or ARP header
// cut short is refused too. Every other EtherType passes, IPv6 among them (the scripts' rules are
// IPv4 only, and xpv's `ip` is an IPv4 address). The MAC source is not checked (neither do Xen's
// scripts nor Linux netback).
//
// The caller checks a copy of the frame's first bytes and writes those same bytes to the TAP
// (queue.cpp): a guest that changes its page after the check cannot change what was checked.
#pragma once

#include <cstdint>
#include <span>

namespace xpv::netback {

enum class TxSource {
  pass,
  ipv4_spoofed,   // an IPv4 source other than the domain's (and not a DHCP request from 0.0.0.0)
  arp_spoofed,    // an ARP sender address other than the domain's or 0.0.0.0, or not IPv4-over-Ethernet ARP
  encapsulated,   // VLAN tags, 802.3 length (LLC/SNAP), MPLS, PPPoE session: the inside is not looked into
  truncated,      // an IPv4 or ARP frame too short (in `frame`) to hold the fields checked
};

// `frame`: the frame's first bytes (Ethernet header on), at least what the caller copied.
// `domain`: the domain's IPv4 address in host byte order; 0 checks nothing (pass).
TxSource check_tx_source(std::span<const std::uint8_t> frame, std::uint32_t domain) noexcept;

const char* to_string(TxSource s) noexcept;

}  // namespace xpv::netback
