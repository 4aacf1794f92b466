// `xpv sched-credit` (cpu_sched.h): a domain's CPU weight and cap, listed or set, as xl's.
#include <fmt/core.h>

#include <functional>

#include "domain_ops.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/cpu_sched.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/record.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {
namespace {

// Whether the files would hold the same for `a` as for `b` (v2 cannot tell every weight apart).
bool same_in_files(CgroupVersion v, const CpuSched& a, const CpuSched& b) {
  if (v == CgroupVersion::v1) return v1_shares(a.weight) == v1_shares(b.weight) && v1_quota(a.cap) == v1_quota(b.cap);
  return v2_weight(a.weight) == v2_weight(b.weight) && v2_max(a.cap) == v2_max(b.cap);
}

}  // namespace

CpuHierarchy cpu_hierarchy_or_throw(const std::string& what) {
  auto h = host_cpu_hierarchy();
  if (!h) {
    throw ToolstackError(fmt::format("{} needs the cpu cgroup controller, and this host has it mounted nowhere (no "
                                     "`cgroup` mount with the cpu option, no `cgroup2` mount listing cpu in "
                                     "cgroup.controllers; see /proc/self/mountinfo)",
                                     what));
  }
  return *h;
}

std::string place_in_cgroup(const CpuHierarchy& h, const std::string& uuid, pid_t pid, const CpuSched& s) {
  DomainCgroup cg(h, uuid);
  cg.create();
  try {
    cg.apply(s);
    cg.add_process(pid);
  } catch (...) {
    (void)cg.remove(1000, nullptr);
    throw;
  }
  return cg.path();
}

void remove_domain_cgroup(Context& ctx, const DomainRecord& r) {
  if (r.cgroup.empty()) return;
  const auto h = host_cpu_hierarchy();
  if (!h) {
    ctx.err << fmt::format("warning: dom{}'s cgroup {} is left: the host's cpu cgroup hierarchy is not mounted now\n",
                           r.domid, r.cgroup);
    return;
  }
  const auto cg = DomainCgroup::at(*h, r.cgroup);
  if (!cg) {
    ctx.err << fmt::format("warning: dom{}'s record names the cgroup {}, which is not one xpv makes under {}/xpv; left "
                           "alone\n",
                           r.domid, r.cgroup, h->mount);
    return;
  }
  std::string why;
  if (!cg->remove(2000, &why)) ctx.err << "warning: " << why << "\n";
}

void cmd_sched_credit(Context& ctx, const std::string& which, std::optional<std::int64_t> weight,
                      std::optional<std::int64_t> cap) {
  if (!weight && !cap) {
    auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
    const auto doms = gather_domains(ctx.paths, xs.get());
    std::vector<const DomainSummary*> chosen;
    if (which.empty()) {
      for (const auto& d : doms) {
        if (d.record && d.pid != 0) chosen.push_back(&d);
      }
    } else {
      chosen.push_back(&resolve_domain(doms, which));
    }
    const auto h = host_cpu_hierarchy();
    std::vector<SchedRow> rows;
    for (const DomainSummary* d : chosen) {
      SchedRow r{d->name, d->domid, {}, {}};
      if (d->record && !d->record->cgroup.empty()) {
        r.cgroup = d->record->cgroup;
        r.sched = {d->record->cpu_weight, d->record->cap};
        // What the files hold, if someone changed them since (the record's figures when they hold
        // what xpv wrote).
        const auto cg = h ? DomainCgroup::at(*h, r.cgroup) : std::nullopt;
        try {
          if (!cg) throw ToolstackError(fmt::format("{} is not under this host's cpu hierarchy", r.cgroup));
          const CpuSched now = cg->read();
          if (!same_in_files(cg->version(), now, r.sched)) {
            ctx.err << fmt::format("warning: {}'s cgroup holds weight {} cap {}, not the {} {} xpv set\n",
                                   domain_label(*d), now.weight, now.cap, r.sched.weight, r.sched.cap);
            r.sched = now;
          }
        } catch (const ToolstackError& e) {
          ctx.err << fmt::format("warning: {}: {}\n", domain_label(*d), e.what());
        }
      }
      rows.push_back(std::move(r));
    }
    ctx.out << format_sched_credit(rows);
    return;
  }
  if (which.empty()) throw ToolstackError("setting a weight or cap needs a domain: -d NAME (as xl sched-credit)");
  if (weight && (*weight < 1 || *weight > kMaxWeight)) {
    throw ToolstackError(fmt::format("weight {} is out of range 1..{}", *weight, kMaxWeight));
  }
  if (cap && (*cap < 0 || *cap > kMaxCap)) {
    throw ToolstackError(fmt::format("cap {} is out of range 0..{} (% of one CPU; 0: none)", *cap, kMaxCap));
  }
  Xenstore xs(ctx.paths.xenstore_socket);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  if (!d.record) throw ToolstackError(fmt::format("{} has no record in {}", domain_label(d), ctx.paths.domain_dir(d.domid)));
  DomainRecord rec = *d.record;
  CpuSched s;
  if (!rec.cgroup.empty()) s = {rec.cpu_weight, rec.cap};
  if (weight) s.weight = static_cast<std::uint32_t>(*weight);
  if (cap) s.cap = static_cast<std::uint32_t>(*cap);
  const CpuHierarchy h = cpu_hierarchy_or_throw("a CPU weight or cap");
  // If the record then cannot be written: `undo` puts the cgroup back as the record still has it,
  // `left` says what stays wrong when even that fails.
  std::function<void()> undo;
  std::string left;
  if (rec.cgroup.empty()) {
    // Where it runs now, to go back to.
    const auto text = read_file(fmt::format("/proc/{}/cgroup", rec.pid));
    const auto was = text ? cgroup_of(*text, h.version) : std::nullopt;
    const std::string placed = place_in_cgroup(h, rec.uuid, rec.pid, s);
    rec.cgroup = placed;
    undo = [&h, was, placed, pid = rec.pid] {
      if (!was) throw ToolstackError(fmt::format("cannot tell which cgroup process {} came from", pid));
      move_process(h.mount + *was, pid);
      std::string why;
      if (auto cg = DomainCgroup::at(h, placed); cg && !cg->remove(1000, &why)) throw ToolstackError(why);
    };
    left = fmt::format("{} is left in {}, which its record does not name", domain_label(d), placed);
  } else {
    const auto cg = DomainCgroup::at(h, rec.cgroup);
    if (!cg) {
      throw ToolstackError(fmt::format("{}'s record names the cgroup {}, which is not under this host's cpu hierarchy "
                                       "({}/xpv)",
                                       domain_label(d), rec.cgroup, h.mount));
    }
    const CpuSched before{rec.cpu_weight, rec.cap};
    cg->apply(s);
    undo = [cg = *cg, before] { cg.apply(before); };
    left = fmt::format("{}'s cgroup holds weight {} cap {}, its record {} {}", domain_label(d), s.weight, s.cap,
                       before.weight, before.cap);
  }
  rec.cpu_weight = s.weight;
  rec.cap = s.cap;
  try {
    write_record(ctx.paths.domain_dir(d.domid), rec);
  } catch (...) {
    try {
      undo();
    } catch (const ToolstackError& e) {
      ctx.err << fmt::format("warning: {}: {}\n", left, e.what());
    }
    throw;
  }
  ctx.out << fmt::format("{}: weight {}, cap {} ({})\n", domain_label(d), s.weight,
                         s.cap == 0 ? std::string("none") : fmt::format("{} % of a CPU", s.cap), rec.cgroup);
}

}  // namespace xpv::toolstack
