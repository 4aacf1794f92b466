// xpv block-attach / block-detach / network-attach / network-detach.
#include <fmt/core.h>
#include <unistd.h>

#include <ostream>
#include <set>

#include "domain_ops.h"
#include "xpv/config/device_specs.h"
#include "xpv/config/domain_config.h"
#include "xpv/config/error.h"
#include "xpv/config/vdev.h"
#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/devices.h"
#include "xpv/toolstack/disk_checks.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/host_cleanup.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/vif_checks.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/netback/bridge.h"
#include "xpv/netback/netns.h"

namespace xpv::toolstack {
namespace {

void require_backend(const Paths& p, DeviceKind k) {
  const std::string prog = backend_program(k);
  if (::access(p.binary(prog).c_str(), X_OK) != 0) {
    throw ToolstackError(fmt::format("{} is not built (no {})", prog, p.binary(prog)));
  }
  if (!backend_running(p, k)) throw ToolstackError(fmt::format("{} is not running; run `xpv up`", prog));
}

// Attach: write the nodes, wait (unless told not to), undo on failure — Ctrl-C during the wait
// included (process.h, InterruptGuard).
void attach(Context& ctx, Xenstore& xs, const DomainSummary& d, const DeviceRef& dev, const NodeList& nodes, bool wait) {
  InterruptGuard interrupts;
  add_device(xs, d.domid, dev, nodes);
  if (!wait) return;
  try {
    wait_connected(xs, d.domid, {dev}, ctx.device_timeout, [&] { return process_alive(d.pid); },
                   fmt::format("see {}", ctx.paths.log_file(backend_program(dev.kind))));
  } catch (...) {
    close_and_remove(xs, d.domid, {dev}, process_alive(d.pid), [&](DeviceKind k) { return backend_running(ctx.paths, k); },
                     ctx.close_timeout);
    throw;
  }
}

void detach(Context& ctx, Xenstore& xs, const DomainSummary& d, const DeviceRef& dev) {
  if (!xs.exists(backend_path(dev.kind, d.domid, dev.devid)) && !xs.exists(frontend_path(dev.kind, d.domid, dev.devid))) {
    throw ToolstackError(fmt::format("{} is not attached to {}", device_label(dev), domain_label(d)));
  }
  if (dev.kind == DeviceKind::vbd) {
    // A loop device on the PV disk file would otherwise hold it (and fail) once the device goes.
    for (const auto& line : detach_loops_under(fmt::format("{}/vbd/{}", ctx.paths.domain_dir(d.domid), dev.devid))) {
      ctx.err << "warning: " << line << "\n";
    }
  }
  auto warnings = close_and_remove(xs, d.domid, {dev}, process_alive(d.pid),
                                   [&](DeviceKind k) { return backend_running(ctx.paths, k); }, ctx.close_timeout);
  for (const auto& w : warnings) ctx.err << "warning: " << w << "\n";
  ctx.out << fmt::format("{} detached from {}\n", device_label(dev), domain_label(d));
}

}  // namespace

void cmd_block_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait) {
  config::DiskSpec disk;
  try {
    disk = config::parse_disk_spec(spec);
  } catch (const config::ConfigError& e) {
    throw ToolstackError(e.what());
  }
  if (auto why = config::disk_target_problem(disk.target); !why.empty()) {
    throw ToolstackError(fmt::format("disk {}: '{}' {}", disk.vdev.name, disk.target, why));
  }
  try {
    disk.target = config::absolute_path(disk.target);  // xpv-blkback opens it from "/"
  } catch (const config::ConfigError& e) {
    throw ToolstackError(fmt::format("disk {}: {}", disk.vdev.name, e.what()));
  }
  Xenstore xs(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  const DeviceRef dev{DeviceKind::vbd, disk.vdev.devid};
  if (xs.exists(backend_path(dev.kind, d.domid, dev.devid)) || xs.exists(frontend_path(dev.kind, d.domid, dev.devid))) {
    throw ToolstackError(fmt::format("{} is already attached to {}", disk.vdev.name, domain_label(d)));
  }
  check_new_disk("", disk, existing_disks(xs, gather_domains(ctx.paths, &xs)));
  require_backend(ctx.paths, DeviceKind::vbd);
  attach(ctx, xs, d, dev, vbd_nodes(d.domid, disk), wait);
  if (d.type == "process") {
    ctx.out << fmt::format("{}: {}\n", disk.vdev.name, ctx.paths.vbd_disk(d.domid, dev.devid));
  } else {
    ctx.out << fmt::format("{} attached to {}\n", disk.vdev.name, domain_label(d));
  }
}

void cmd_block_detach(Context& ctx, const std::string& which, const std::string& vdev) {
  auto v = config::parse_vdev(vdev);
  if (!v) throw ToolstackError(fmt::format("'{}' is not a virtual disk name (xvda, xvdb1, hda, sdc, d0p1)", vdev));
  Xenstore xs(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const auto doms = gather_domains(ctx.paths, &xs);
  const DomainSummary d = resolve_domain(doms, which);
  detach(ctx, xs, d, {DeviceKind::vbd, v->devid});
}

// `xpv block-list` / `xpv network-list`: one row per device of the kind, both ends' states (as
// `xl block-list` / `network-list`; xl shows the frontend's state only, and one ring-ref and
// event channel, which a multi-queue device does not have), and what the backend serves.
void list_devices(Context& ctx, const std::string& which, DeviceKind kind) {
  Xenstore xs(ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, &xs);
  const DomainSummary d = resolve_domain(doms, which);
  auto state = [](const std::optional<xenbus::XenbusState>& x) {
    return x ? fmt::format("{} ({})", static_cast<int>(*x), xenbus::to_string(*x)) : std::string("-");
  };
  auto node = [&](const std::string& path) {
    auto v = xs.read(path);
    return v && !v->empty() ? *v : std::string("-");
  };
  std::string out = kind == DeviceKind::vbd
                        ? fmt::format("{:<6} {:<6} {:<17} {:<17} {:<4} {}\n", "Vdev", "Devid", "Frontend", "Backend",
                                      "Mode", "Target")
                        : fmt::format("{:<4} {:<17} {:<17} {:<17} {:<10} {:<15} {}\n", "Idx", "Mac", "Frontend",
                                      "Backend", "Host side", "Bridge", "IP");
  for (const DeviceRef& dev : devices_of(xs, d.domid)) {
    if (dev.kind != kind) continue;
    const DeviceStates st = read_states(xs, d.domid, dev);
    const std::string be = backend_path(kind, d.domid, dev.devid);
    if (kind == DeviceKind::vbd) {
      const auto name = config::xvd_name(dev.devid);
      out += fmt::format("{:<6} {:<6} {:<17} {:<17} {:<4} {}\n", name ? *name : "-", dev.devid, state(st.frontend),
                         state(st.backend), node(be + "/mode"), node(be + "/params"));
    } else {
      const std::string bridge = netback::vif_bridge(xs.read(be + "/bridge"), xs.read(be + "/script"));
      out += fmt::format("{:<4} {:<17} {:<17} {:<17} {:<10} {:<15} {}\n", dev.devid, node(be + "/mac"),
                         state(st.frontend), state(st.backend), fmt::format("vif{}.{}", d.domid, dev.devid),
                         bridge.empty() ? "-" : bridge, node(be + "/ip"));
    }
  }
  ctx.out << out;
}

void cmd_block_list(Context& ctx, const std::string& which) { list_devices(ctx, which, DeviceKind::vbd); }
void cmd_network_list(Context& ctx, const std::string& which) { list_devices(ctx, which, DeviceKind::vif); }

void cmd_network_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait) {
  config::VifSpec vif;
  try {
    vif = config::parse_vif_spec(spec);
  } catch (const config::ConfigError& e) {
    throw ToolstackError(e.what());
  }
  if (!vif.vifname.empty()) {
    throw ToolstackError("vifname is not supported (the host side is always vif<domid>.<devid>)");
  }
  check_vif_bridge("vif", vif);
  adopt_bridge_mtu(vif);
  Xenstore xs(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const auto doms = gather_domains(ctx.paths, &xs);
  const DomainSummary& found = resolve_domain(doms, which);
  if (found.pid == 0) throw ToolstackError(fmt::format("domain {} is not running (state {})", domain_label(found), found.state));
  const DomainSummary d = found;

  // The namespace its NIC goes into (made by `xpv create`).
  const std::string ns = d.record && !d.record->netns.empty() ? d.record->netns : ctx.paths.netns(d.domid);
  if (d.type == "process" && !netback::netns_exists(ns)) {
    throw ToolstackError(fmt::format("the network namespace {} of {} is missing (`xpv create` makes it, destroy removes "
                                     "it); recreate the domain",
                                     ns, domain_label(d)));
  }
  // MAC and address clashes, over every vif on the host and the host's own interfaces.
  std::set<std::string> macs;
  std::set<std::uint32_t> own_devids;
  const auto vifs = existing_vifs(xs, doms);
  for (const auto& v : vifs) macs.insert(v.mac);
  for (const auto& dev : xs.list(backend_dir(DeviceKind::vif, d.domid))) {
    if (auto id = parse_devid(dev)) own_devids.insert(*id);
  }
  check_new_vif("vif", vif, vifs, host_addresses());
  require_backend(ctx.paths, DeviceKind::vif);
  for (const auto& dev : xs.list(frontend_dir(DeviceKind::vif, d.domid))) {
    if (auto id = parse_devid(dev)) own_devids.insert(*id);
  }
  const std::uint32_t devid = pick_vif_devid(own_devids);
  const config::Mac mac = vif.mac ? *vif.mac : generate_mac(macs, system_random_byte);
  attach(ctx, xs, d, {DeviceKind::vif, devid}, vif_nodes(d.domid, devid, vif, mac), wait);
  const auto a = vif_addresses_of(vif);
  ctx.out << fmt::format("vif {}: mac {}, {}, domain eth{}{} in {}\n", devid, mac.str(), vif_host_side(d.domid, devid, vif),
                         devid, a ? fmt::format(" {}/{}", netback::ipv4_string(a->domain), a->prefix) : "", ns);
}

void cmd_network_detach(Context& ctx, const std::string& which, const std::string& devid) {
  auto id = parse_devid(devid);
  if (!id) throw ToolstackError(fmt::format("'{}' is not a vif device id (0, 1, ...)", devid));
  Xenstore xs(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const auto doms = gather_domains(ctx.paths, &xs);
  const DomainSummary d = resolve_domain(doms, which);
  detach(ctx, xs, d, {DeviceKind::vif, *id});
}

}  // namespace xpv::toolstack
