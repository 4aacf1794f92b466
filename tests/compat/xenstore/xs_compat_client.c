/* A small libxenstore program for the compat suite: each scenario prints one line per step and
 * exits non-zero on an unexpected result. Run with XENSTORED_PATH=<socket>.
 *   xs_compat_client txn-conflict | watch | perms | introduce | directory | errors | quota |
 *                    control | live-update BINARY SECOND_BINARY | live-update-gone COPY */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xenstore.h>

static void die(const char *what) {
  printf("FAIL %s: %s\n", what, strerror(errno));
  exit(1);
}

static struct xs_handle *open_or_die(void) {
  struct xs_handle *h = xs_open(0);
  if (!h) die("xs_open");
  return h;
}

static void print_read(struct xs_handle *h, xs_transaction_t t, const char *path) {
  unsigned int len = 0;
  char *v = xs_read(h, t, path, &len);
  if (!v) {
    printf("read %s: errno %s\n", path, errno == ENOENT ? "ENOENT" : errno == EACCES ? "EACCES"
                                          : errno == EINVAL ? "EINVAL" : "other");
    return;
  }
  printf("read %s: \"%s\" (%u bytes)\n", path, v, len);
  free(v);
}

/* Waits (bounded, 5 s) for one watch event and prints it. */
static void next_event(struct xs_handle *h) {
  struct pollfd p = {xs_fileno(h), POLLIN, 0};
  if (poll(&p, 1, 5000) != 1) {
    printf("no event within 5 s\n");
    exit(1);
  }
  unsigned int n = 0;
  char **ev = xs_read_watch(h, &n);
  if (!ev) die("xs_read_watch");
  printf("event %s %s\n", ev[XS_WATCH_PATH], ev[XS_WATCH_TOKEN]);
  free(ev);
}

static int txn_conflict(void) {
  struct xs_handle *a = open_or_die(), *b = open_or_die();
  if (!xs_write(a, XBT_NULL, "/c/x", "0", 1)) die("write");
  xs_transaction_t t = xs_transaction_start(a);
  if (t == XBT_NULL) die("transaction_start");
  print_read(a, t, "/c/x");
  if (!xs_write(b, XBT_NULL, "/c/x", "other", 5)) die("write b");
  if (!xs_write(a, t, "/c/y", "tx", 2)) die("write in tx");
  bool ok = xs_transaction_end(a, t, false);
  printf("first commit: %s\n", ok ? "ok" : (errno == EAGAIN ? "EAGAIN" : "other error"));
  print_read(a, XBT_NULL, "/c/y");
  int attempt;
  for (attempt = 1; attempt <= 5; attempt++) {
    t = xs_transaction_start(a);
    if (t == XBT_NULL) die("transaction_start");
    print_read(a, t, "/c/x");
    if (!xs_write(a, t, "/c/y", "tx", 2)) die("write in tx");
    if (xs_transaction_end(a, t, false)) break;
    if (errno != EAGAIN) die("transaction_end");
  }
  printf("retry committed after %d attempt(s)\n", attempt);
  print_read(b, XBT_NULL, "/c/y");
  /* An aborted transaction leaves nothing behind. */
  t = xs_transaction_start(a);
  if (!xs_write(a, t, "/c/z", "gone", 4)) die("write in tx");
  if (!xs_transaction_end(a, t, true)) die("abort");
  print_read(a, XBT_NULL, "/c/z");
  xs_close(a);
  xs_close(b);
  return 0;
}

static int watch(void) {
  struct xs_handle *h = open_or_die(), *w = open_or_die();
  if (!xs_watch(w, "/w", "tok")) die("xs_watch");
  next_event(w); /* fires once on registration */
  if (!xs_write(h, XBT_NULL, "/w/a/b", "1", 1)) die("write");
  next_event(w);
  if (!xs_rm(h, XBT_NULL, "/w")) die("rm");
  next_event(w);
  if (!xs_unwatch(w, "/w", "tok")) die("xs_unwatch");
  printf("unwatch twice: %s\n", xs_unwatch(w, "/w", "tok") ? "ok" : "failed");
  xs_close(h);
  xs_close(w);
  return 0;
}

static int perms(void) {
  struct xs_handle *h = open_or_die();
  if (!xs_write(h, XBT_NULL, "/p", "v", 1)) die("write");
  unsigned int n = 0;
  struct xs_permissions *got = xs_get_permissions(h, XBT_NULL, "/p", &n);
  if (!got) die("get_permissions");
  printf("default: %u entr%s, owner %u perms %d\n", n, n == 1 ? "y" : "ies", got[0].id,
         got[0].perms);
  free(got);
  struct xs_permissions set[3] = {{5, XS_PERM_NONE}, {7, XS_PERM_READ},
                                  {8, XS_PERM_READ | XS_PERM_WRITE}};
  if (!xs_set_permissions(h, XBT_NULL, "/p", set, 3)) die("set_permissions");
  got = xs_get_permissions(h, XBT_NULL, "/p", &n);
  if (!got) die("get_permissions");
  for (unsigned int i = 0; i < n; i++) printf("perm %u: dom %u perms %d\n", i, got[i].id,
                                              got[i].perms);
  free(got);
  bool ok = xs_set_permissions(h, XBT_NULL, "/nope", set, 1);
  printf("set on missing node: %s\n", ok ? "ok" : (errno == ENOENT ? "ENOENT" : "other"));
  xs_close(h);
  return 0;
}

static int introduce(void) {
  struct xs_handle *h = open_or_die();
  if (!xs_watch(h, "@introduceDomain", "intro")) die("watch intro");
  next_event(h);
  if (!xs_watch(h, "@releaseDomain", "rel")) die("watch rel");
  next_event(h);
  printf("introduced before: %s\n", xs_is_domain_introduced(h, 5) ? "yes" : "no");
  /* No domain 9 runs: xenstored cannot reach its ring. */
  bool missing = xs_introduce_domain(h, 9, 1, 1);
  printf("introduce missing: %s\n", missing ? "ok" : (errno == EINVAL ? "EINVAL" : "other"));
  /* Domain 5 is an xpv-front process: its ring at gfn 1, its first event channel port. */
  if (!xs_introduce_domain(h, 5, 1, 1)) die("introduce");
  next_event(h);
  printf("introduced after: %s\n", xs_is_domain_introduced(h, 5) ? "yes" : "no");
  char *path = xs_get_domain_path(h, 5);
  if (!path) die("get_domain_path");
  printf("domain path: %s\n", path);
  free(path);
  if (!xs_resume_domain(h, 5)) die("resume");
  if (!xs_release_domain(h, 5)) die("release");
  next_event(h);
  printf("introduced after release: %s\n", xs_is_domain_introduced(h, 5) ? "yes" : "no");
  bool ok = xs_release_domain(h, 5);
  printf("release again: %s\n", ok ? "ok" : (errno == ENOENT ? "ENOENT" : "other"));
  xs_close(h);
  return 0;
}

static int directory(void) {
  struct xs_handle *h = open_or_die();
  char path[64];
  for (int i = 0; i < 400; i++) {
    snprintf(path, sizeof path, "/d/entry-with-long-name-%03d", i);
    if (!xs_write(h, XBT_NULL, path, "", 0)) die("write");
  }
  unsigned int n = 0;
  char **names = xs_directory(h, XBT_NULL, "/d", &n); /* > 4096 bytes: DIRECTORY_PART */
  if (!names) die("directory");
  printf("%u children, first %s, last %s\n", n, names[0], names[n - 1]);
  free(names);
  xs_close(h);
  return 0;
}

static int errors(void) {
  struct xs_handle *h = open_or_die();
  print_read(h, XBT_NULL, "/missing");
  print_read(h, XBT_NULL, "/bad//path");
  print_read(h, XBT_NULL, "/bad path");
  bool ok = xs_write(h, XBT_NULL, "@releaseDomain", "x", 1);
  printf("write special: %s\n", ok ? "ok" : (errno == EINVAL ? "EINVAL" : "other"));
  ok = xs_rm(h, XBT_NULL, "/no/parent");
  printf("rm without parent: %s\n", ok ? "ok" : (errno == ENOENT ? "ENOENT" : "other"));
  xs_close(h);
  return 0;
}

/* Run against a daemon started with --quota transactions=1 --quota watches=2. */
static int quota(void) {
  struct xs_handle *h = open_or_die();
  xs_transaction_t t1 = xs_transaction_start(h);
  printf("first transaction: %s\n", t1 != XBT_NULL ? "ok" : "failed");
  xs_transaction_t t2 = xs_transaction_start(h);
  printf("second transaction: %s\n",
         t2 != XBT_NULL ? "ok" : (errno == ENOSPC ? "ENOSPC" : "other"));
  xs_transaction_end(h, t1, true);
  bool a = xs_watch(h, "/q/a", "a"), b = xs_watch(h, "/q/b", "b");
  bool c = xs_watch(h, "/q/c", "c");
  printf("watches: %s %s %s\n", a ? "ok" : "failed", b ? "ok" : "failed",
         c ? "ok" : (errno == E2BIG ? "E2BIG" : "other"));
  xs_close(h);
  return 0;
}

static void print_control(struct xs_handle *h, const char *cmd, const char *arg) {
  char *r = xs_control_command(h, cmd, (void *)arg, arg ? (unsigned int)strlen(arg) + 1 : 0);
  if (!r) {
    printf("control %s: %s\n", cmd, errno == EINVAL ? "EINVAL" : "other error");
    return;
  }
  char *nl = strchr(r, '\n');
  if (nl) *nl = '\0'; /* first line only */
  printf("control %s: %s\n", cmd, r);
  free(r);
}

static int control(void) {
  struct xs_handle *h = open_or_die();
  print_control(h, "print", "hello from the compat suite");
  print_control(h, "log-level", "warn");
  print_control(h, "log-level", "loud");
  print_control(h, "quota", NULL);
  print_control(h, "bogus", NULL);
  print_control(h, "log-level", "error");
  xs_close(h);
  return 0;
}

/* CONTROL live-update with its arguments NUL-separated, as xenstore-control sends them. */
static void live_update(struct xs_handle *h, const char *a0, const char *a1, const char *a2, const char *a3) {
  char buf[4096];
  unsigned int len = 0;
  const char *args[] = {a0, a1, a2, a3};
  for (int i = 0; i < 4 && args[i]; ++i) {
    size_t n = strlen(args[i]) + 1;
    memcpy(buf + len, args[i], n);
    len += (unsigned int)n;
  }
  char *r = xs_control_command(h, "live-update", buf, len);
  printf("live-update %s%s%s: %s\n", a0, a1 ? " " : "", a1 && a1[0] == '/' ? "FILE" : (a1 ? a1 : ""),
         r ? r : (errno == EINVAL ? "EINVAL" : "other error"));
  free(r);
}

/* The daemon replaces its binary under an open connection with a watch and a transaction. */
static int live_update_scenario(const char *binary, const char *second) {
  struct xs_handle *h = open_or_die(), *other = open_or_die();
  static const char value[] = {'b', 'i', 'n', '\xff', '\0', 'x'};
  if (!xs_write(h, XBT_NULL, "/lu/a", value, sizeof value)) die("write /lu/a");
  if (!xs_watch(h, "/lu", "tok")) die("watch");
  next_event(h);
  live_update(h, "-s", NULL, NULL, NULL);
  live_update(h, "-f", "/nonexistent/xpv-xenstored", NULL, NULL);
  live_update(h, "-f", "/bin/true", NULL, NULL);
  live_update(h, "-x", NULL, NULL, NULL);
  xs_transaction_t t = xs_transaction_start(h);
  if (t == XBT_NULL) die("transaction_start");
  if (!xs_write(h, t, "/lu/t", "tx", 2)) die("write in tx");
  live_update(h, "-f", binary, NULL, NULL);
  live_update(h, "-s", "-t", "60", NULL);
  live_update(h, "-s", "-t", "0", NULL);
  live_update(h, "-s", "-F", NULL, NULL);
  bool ok = xs_transaction_end(h, t, false);
  printf("commit after -F: %s\n", ok ? "ok" : (errno == EAGAIN ? "EAGAIN" : "other error"));
  unsigned int len = 0;
  char *v = xs_read(h, XBT_NULL, "/lu/a", &len);
  printf("/lu/a kept: %s\n", v && len == sizeof value && !memcmp(v, value, len) ? "yes" : "no");
  free(v);
  print_read(h, XBT_NULL, "/lu/t");
  if (!xs_write(other, XBT_NULL, "/lu/b", "after", 5)) die("write /lu/b");
  next_event(h);
  /* The new binary can be replaced in turn (by a file of another name). */
  live_update(h, "-f", second, NULL, NULL);
  live_update(h, "-s", NULL, NULL, NULL);
  print_read(other, XBT_NULL, "/lu/b");
  xs_close(other);
  xs_close(h);
  return 0;
}

/* The binary goes between -f and -s: the exec fails, this daemon answers and serves on. */
static int live_update_gone(const char *copy) {
  struct xs_handle *h = open_or_die();
  if (!xs_write(h, XBT_NULL, "/gone/a", "kept", 4)) die("write");
  live_update(h, "-f", copy, NULL, NULL);
  if (unlink(copy) != 0) die("unlink");
  char *r = xs_control_command(h, "live-update", "-s", 3);
  printf("live-update -s: %s\n", r && strstr(r, "cannot execute") && strstr(r, "No such file") ? "cannot execute, no such file" : (r ? r : "other error"));
  free(r);
  print_read(h, XBT_NULL, "/gone/a");
  xs_close(h);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && !strcmp(argv[1], "live-update")) return live_update_scenario(argv[2], argv[3]);
  if (argc == 3 && !strcmp(argv[1], "live-update-gone")) return live_update_gone(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: xs_compat_client SCENARIO\n");
    return 2;
  }
  if (!strcmp(argv[1], "txn-conflict")) return txn_conflict();
  if (!strcmp(argv[1], "watch")) return watch();
  if (!strcmp(argv[1], "perms")) return perms();
  if (!strcmp(argv[1], "introduce")) return introduce();
  if (!strcmp(argv[1], "directory")) return directory();
  if (!strcmp(argv[1], "errors")) return errors();
  if (!strcmp(argv[1], "quota")) return quota();
  if (!strcmp(argv[1], "control")) return control();
  fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
