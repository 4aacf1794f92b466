#include "bench/bench.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace xpv::bench {

namespace {
std::vector<Suite>& registry() {
  static std::vector<Suite> all;
  return all;
}
}  // namespace

bool register_suite(Suite suite) {
  registry().push_back(std::move(suite));
  return true;
}

const std::vector<Suite>& suites() { return registry(); }

Captured shell_capture(const std::string& cmd) {
  Captured c;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  const int st = ::pclose(p);
  c.rc = st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  return c;
}

int run_streaming(const std::vector<std::string>& argv, double timeout_s,
                  const std::function<void(std::string_view, Clock::time_point)>& on_output) {
  if (argv.empty()) throw std::runtime_error("run_streaming: empty argv");
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {  // only async-signal-safe calls from here on
    const int null_fd = open("/dev/null", O_RDONLY);
    dup2(null_fd, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(p[1]);
  bool killed = false;
  for (;;) {
    if (seconds_since(t0) > timeout_s) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd pfd{p[0], POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    char tmp[4096];
    const ssize_t n = read(p[0], tmp, sizeof tmp);
    const auto at = Clock::now();
    if (n <= 0) break;  // EOF: it closed its output (normally: it exited)
    on_output(std::string_view(tmp, static_cast<std::size_t>(n)), at);
  }
  close(p[0]);
  // Bounded: after EOF the process gets what is left of its time, then SIGKILL.
  int st = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid || r < 0) break;
    if (!killed && seconds_since(t0) > timeout_s) {
      kill(pid, SIGKILL);
      killed = true;
    }
    usleep(10'000);
  }
  return st;
}

void print_table(const std::string& suite, const std::vector<Result>& rs) {
  fmt::print("{}\n", suite);
  fmt::print("  {:<40} {:>14} {:>14} {:>8}  {}\n", "metric", "xpv", "reference", "ratio", "unit");
  for (const Result& r : rs) {
    std::string ref = r.reference ? fmt::format("{:.4g}", *r.reference) : "-";
    std::string ratio =
        (r.reference && *r.reference != 0) ? fmt::format("{:.3f}", r.xpv / *r.reference) : "-";
    fmt::print("  {:<40} {:>14.4g} {:>14} {:>8}  {}{}\n", r.metric, r.xpv, ref, ratio, r.unit,
               r.note.empty() ? "" : "  (" + r.note + ")");
  }
}

std::string plot_path(const Options& opts, const std::string& suite, const std::string& what) {
  if (!opts.json_path.empty()) {
    std::filesystem::path p(opts.json_path);
    return (p.parent_path() / (p.stem().string() + "-" + what + ".png")).string();
  }
  return "bench-" + suite + "-" + what + ".png";
}

bool write_ratio_chart(const std::string& png, const std::string& suite, const std::vector<Result>& rs) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fmt::print(stderr, "xpv bench: gnuplot is not installed (scripts/setup installs gnuplot-nox); no chart\n");
    return false;
  }
  char tmpl[] = "/tmp/xpv-bench-chart-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return false;
  const std::filesystem::path dir = tmpl;
  std::size_t n = 0;
  double top = 1.1;  // the reference line at 1 is always in view
  {
    std::ofstream d(dir / "data");
    for (const Result& r : rs) {
      if (!r.reference || *r.reference == 0 || !std::isfinite(r.xpv)) continue;
      std::string label = r.metric;
      for (char& c : label) if (c == '"') c = '\'';
      d << n++ << " \"" << label << "\" " << r.xpv / *r.reference << '\n';
      top = std::max(top, 1.1 * r.xpv / *r.reference);
    }
    std::ofstream g(dir / "plot.gp");
    g << "set terminal png size 1000," << (200 + 28 * n) << "\nset output '" << png << "'\n"
      << "set title 'xpv bench " << suite << ": xpv / reference, same machine, same run'\n"
      << "set style fill solid 0.6\nset boxwidth 0.7\nset xrange [0:" << top << "]\nset grid x\n"
      << "set ytics nomirror\nset yrange [-1:" << n << "]\nset xlabel 'ratio (1 = as fast as the reference; "
         "for latency units lower is better)'\n"
      << "set arrow from 1, graph 0 to 1, graph 1 nohead dt 2\n"
      << "plot '" << (dir / "data").string() << "' using ($3*0.5):1:($3*0.5):(0.35):yticlabels(2) "
         "with boxxyerror notitle\n";
  }
  const bool ok = n > 0 && std::system(("gnuplot " + (dir / "plot.gp").string() + " 2>/dev/null").c_str()) == 0;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!ok) fmt::print(stderr, "xpv bench: no chart for {} (nothing with a reference, or gnuplot failed)\n", suite);
  return ok;
}

}  // namespace xpv::bench
