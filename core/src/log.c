/* log.c - logging (TNT_LOG_LEVEL, TNT_LOG_ON_ALL_DEVICES) and per-thread last error. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

static int log_level = TNT_LOG_WARNING;
static int log_rank = 0;
static int log_all = 0;

static _Thread_local char last_error[1024];
static _Thread_local int last_error_rank = -1;

void tnt_log_init(int rank) {
  const char *lvl = getenv("TNT_LOG_LEVEL");
  log_level = TNT_LOG_WARNING;
  if (lvl) {
    if (!strcasecmp(lvl, "DEBUG") || !strcasecmp(lvl, "TRACE")) log_level = TNT_LOG_DEBUG;
    else if (!strcasecmp(lvl, "INFO")) log_level = TNT_LOG_INFO;
    else if (!strcasecmp(lvl, "WARNING") || !strcasecmp(lvl, "WARN")) log_level = TNT_LOG_WARNING;
    else if (!strcasecmp(lvl, "ERROR") || !strcasecmp(lvl, "FATAL")) log_level = TNT_LOG_ERROR;
  }
  const char *all = getenv("TNT_LOG_ON_ALL_DEVICES");
  log_all = all && (!strcasecmp(all, "1") || !strcasecmp(all, "true") || !strcasecmp(all, "yes"));
  log_rank = rank;
}

int tnt_log_enabled(int level) {
  if (level < log_level) return 0;
  /* errors of every rank are shown; the rest on the master rank only unless asked */
  return level >= TNT_LOG_ERROR || log_all || log_rank == 0;
}

void tnt_log(int level, const char *file, int line, const char *fmt, ...) {
  static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  if (!tnt_log_enabled(level)) return;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  fprintf(stderr, "[TNT %s rank %d] %s:%d:%ld %s (%s:%d)\n", names[level], log_rank, host, (int)getpid(),
          (long)syscall(SYS_gettid), msg, base ? base + 1 : file, line);
}

/* A message cut at the end of its buffer may end inside a UTF-8 character (a user's value or
 * name in it): drop that partial character, so that bindings decoding the message as UTF-8
 * (Python's config.get) show it instead of failing with a UnicodeDecodeError. */
static void end_on_a_character(char *s, int full_len, size_t cap) {
  if (full_len < 0 || (size_t)full_len < cap) return; /* not cut */
  size_t n = strlen(s), lead = n;
  while (lead > 0 && ((unsigned char)s[lead - 1] & 0xC0) == 0x80) lead--; /* continuation bytes */
  if (!lead) return;
  const unsigned char c = (unsigned char)s[lead - 1];
  const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (n - (lead - 1) < need) s[lead - 1] = 0;
}

static tnt_result_t vfail(tnt_result_t code, int peer, const char *fmt, va_list ap) {
  end_on_a_character(last_error, vsnprintf(last_error, sizeof last_error, fmt, ap), sizeof last_error);
  last_error_rank = peer;
  TNT_DEBUG("error %d: %s", (int)code, last_error);
  return code;
}

tnt_result_t tnt_fail(tnt_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tnt_result_t r = vfail(code, -1, fmt, ap);
  va_end(ap);
  return r;
}

tnt_result_t tnt_fail_peer(int peer, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tnt_result_t r = vfail(TNT_ERR_PEER_LOST, peer, fmt, ap);
  va_end(ap);
  return r;
}

tnt_result_t tnt_fail_about(tnt_result_t code, int peer, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tnt_result_t r = vfail(code, peer, fmt, ap);
  va_end(ap);
  return r;
}

void tnt_set_last_error(const char *message, int peer) {
  end_on_a_character(last_error, snprintf(last_error, sizeof last_error, "%s", message ? message : ""),
                     sizeof last_error);
  last_error_rank = peer;
}

const char *tnt_last_error(void) { return last_error; }
int tnt_last_error_rank(void) { return last_error_rank; }

const char *tnt_strerror(tnt_result_t r) {
  switch (r) {
    case TNT_SUCCESS: return "success";
    case TNT_ERR_INVALID_ARGUMENT: return "invalid argument: fix the call as the message says";
    case TNT_ERR_INVALID_USAGE: return "invalid usage: see the message; set TNT_LOG_LEVEL=DEBUG for details";
    case TNT_ERR_MISMATCH: return "ranks disagree on a collective: every rank must submit the same name with the same dtype, size and op";
    case TNT_ERR_PEER_LOST: return "a peer process exited or aborted: see the output of the rank it names";
    case TNT_ERR_TIMEOUT: return "timed out waiting for other ranks: check that every rank makes the same collective calls, or raise TNT_TIMEOUT_S (TNT_BUSY_TIMEOUT_S where they were busy with work of their own)";
    case TNT_ERR_SYSTEM: return "an operating-system call failed: see the message";
    case TNT_ERR_INTERNAL: return "internal error: please report it with the TNT_LOG_LEVEL=DEBUG output";
    case TNT_IN_PROGRESS: return "in progress";
  }
  return "unknown result code";
}
