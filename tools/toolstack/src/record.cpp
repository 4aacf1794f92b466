#include "xpv/toolstack/record.h"

#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "xpv/toolstack/fs.h"

namespace xpv::toolstack {

std::string record_to_json(const DomainRecord& r) {
  nlohmann::json j = {{"domid", r.domid},   {"name", r.name},     {"type", r.type},
                      {"memory_mib", r.memory_mib}, {"vcpus", r.vcpus}, {"config", r.config},
                      {"pid", r.pid},       {"uuid", r.uuid},     {"program", r.program}};
  if (!r.netns.empty()) j["netns"] = r.netns;
  j["on_poweroff"] = r.on_poweroff;
  j["on_reboot"] = r.on_reboot;
  j["on_crash"] = r.on_crash;
  if (r.monitor_pid > 0) j["monitor_pid"] = r.monitor_pid;
  if (!r.cgroup.empty()) {
    j["cgroup"] = r.cgroup;
    j["cpu_weight"] = r.cpu_weight;
    j["cap"] = r.cap;
  }
  return j.dump(2) + "\n";
}

std::optional<DomainRecord> record_from_json(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    DomainRecord r;
    r.domid = j.at("domid").get<std::uint16_t>();
    r.name = j.at("name").get<std::string>();
    r.type = j.at("type").get<std::string>();
    r.memory_mib = j.at("memory_mib").get<std::uint64_t>();
    r.vcpus = j.at("vcpus").get<unsigned>();
    r.config = j.at("config").get<std::string>();
    r.pid = j.at("pid").get<pid_t>();
    r.uuid = j.at("uuid").get<std::string>();
    r.program = j.at("program").get<std::string>();
    r.netns = j.value("netns", std::string());
    r.on_poweroff = j.value("on_poweroff", r.on_poweroff);
    r.on_reboot = j.value("on_reboot", r.on_reboot);
    r.on_crash = j.value("on_crash", r.on_crash);
    r.monitor_pid = j.value("monitor_pid", pid_t{0});
    r.cgroup = j.value("cgroup", std::string());
    r.cpu_weight = j.value("cpu_weight", r.cpu_weight);
    r.cap = j.value("cap", r.cap);
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

void write_record(const std::string& domain_dir, const DomainRecord& r) {
  write_file_atomic(domain_dir + "/domain.json", record_to_json(r));
  write_file_atomic(domain_dir + "/pid", fmt::format("{}\n", r.pid));
}

std::optional<DomainRecord> read_record(const std::string& domain_dir) {
  auto text = read_file(domain_dir + "/domain.json");
  if (!text) return std::nullopt;
  return record_from_json(*text);
}

}  // namespace xpv::toolstack
