// The toolstack's commands, one function each; tools/xpv/main.cpp only parses the command line
// and calls these. Normal output goes to ctx.out, warnings to ctx.err ("warning: …"); a failure
// throws ToolstackError (one line) after undoing whatever the command had done.
#pragma once

#include <chrono>
#include <iosfwd>
#include <string>

#include "xpv/toolstack/paths.h"

namespace xpv::toolstack {

struct Context {
  Paths paths;
  std::ostream& out;
  std::ostream& err;
  std::chrono::milliseconds device_timeout{std::chrono::seconds(20)};  // attach: to Connected
  std::chrono::milliseconds close_timeout{std::chrono::seconds(10)};   // detach: to Closed
};

// Daemons (daemons.cpp).
void cmd_up(Context& ctx);
void cmd_down(Context& ctx, bool force);
// The supervisor loop (`xpv supervise`, started by `xpv up`); returns the exit status.
int cmd_supervise(Context& ctx);

// Domains (domains.cpp).
void cmd_create(Context& ctx, const std::string& config_path, bool wait);
void cmd_list(Context& ctx, bool json);
void cmd_destroy(Context& ctx, const std::string& which);
// `xpv console NAME` (console.cpp): the HVM domain's serial console, until Ctrl-] or its end.
// type: "serial" (COM1, the default) or "pv" (the Xen PV console, hvc0), as `xl console -t`.
void cmd_console(Context& ctx, const std::string& which, const std::string& type = "serial");
void cmd_shutdown(Context& ctx, const std::string& which, std::chrono::milliseconds timeout);

// Devices (device_commands.cpp).
void cmd_block_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait);
void cmd_block_detach(Context& ctx, const std::string& which, const std::string& vdev);
void cmd_network_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait);
void cmd_network_detach(Context& ctx, const std::string& which, const std::string& devid);

}  // namespace xpv::toolstack
