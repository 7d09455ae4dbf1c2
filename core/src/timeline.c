/* timeline.c - streams events as they happen (buffered stdio), in the JSON array
 * format, which Chrome's about:tracing and Perfetto read even when a crash left
 * the closing bracket out. Only the background thread writes, so no lock. */
#include "timeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "common.h"
#include "namemap.h"

struct tnt_timeline {
  pthread_mutex_t mu; /* events come from the engine and, on one rank, from every submitting thread */
  FILE *f;
  char file[1100]; /* its path, for the message of a failed write */
  int rank;
  int64_t t0;
  tnt_namemap_t rows; /* tensor name -> row (tid) */
  int nrows;
};

/* The trace this process wrote last, kept across tnt_finalize (under tnt_init's lock, as open and
 * close are): a context made again after tnt_finalize with the same TNT_TIMELINE truncated the file,
 * and the trace of the process's first context was lost. The new one is written on after it, in the
 * same array, on the same clock and with rows of its own. */
static struct {
  char file[1100];
  int64_t t0;
  int nrows;
} written;

/* `f` (opened "r+") positioned before the "\n]\n" that closed the trace, or NULL: not ours. */
static FILE *reopen_for_more(const char *file) {
  FILE *f = fopen(file, "r+");
  char end[4] = "";
  if (f && fseek(f, -3, SEEK_END) == 0 && fread(end, 1, 3, f) == 3 && !memcmp(end, "\n]\n", 3) &&
      fseek(f, -3, SEEK_END) == 0)
    return f;
  if (f) fclose(f);
  return NULL;
}

tnt_result_t tnt_timeline_open(tnt_timeline_t **out, const char *path, int rank, int size) {
  *out = NULL;
  if (!path || !*path) return TNT_SUCCESS;
  char file[1100];
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  if (size > 1) {
    if (dot && (!slash || dot > slash))
      snprintf(file, sizeof file, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
    else
      snprintf(file, sizeof file, "%s.rank%d", path, rank);
  } else {
    snprintf(file, sizeof file, "%s", path);
  }
  tnt_timeline_t *tl = calloc(1, sizeof *tl);
  if (!tl) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  tnt_namemap_init(&tl->rows);
  const int more = !strcmp(written.file, file) && (tl->f = reopen_for_more(file)) != NULL;
  if (!more) tl->f = fopen(file, "w");
  if (!tl->f) {
    const int err = errno;
    free(tl);
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "TNT_TIMELINE: cannot write %s (%s); give a path in a writable folder. "
                    "Received: TNT_TIMELINE=%s", file, strerror(err), path);
  }
  pthread_mutex_init(&tl->mu, NULL);
  snprintf(tl->file, sizeof tl->file, "%s", file);
  tl->rank = rank;
  if (more) {
    tl->t0 = written.t0;
    tl->nrows = written.nrows;
  } else {
    tl->t0 = tnt_now_us();
    fprintf(tl->f, "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}",
            rank, rank);
  }
  TNT_INFO("timeline: writing %s", file);
  *out = tl;
  return TNT_SUCCESS;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) continue;
    fputc(*s, f);
  }
  fputc('"', f);
}

static int row_of(tnt_timeline_t *tl, const char *tensor) {
  int tid = tnt_namemap_get(&tl->rows, tensor);
  if (tid >= 0) return tid;
  tid = ++tl->nrows;
  if (tnt_namemap_put(&tl->rows, tensor, tid)) return 0;
  fprintf(tl->f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": ", tl->rank,
          tid);
  json_string(tl->f, tensor);
  fputs("}}", tl->f);
  return tid;
}

void tnt_timeline_event(tnt_timeline_t *tl, const char *tensor, const char *phase, int64_t start_us, int64_t end_us,
                        const char *detail) {
  if (!tl) return;
  pthread_mutex_lock(&tl->mu);
  int tid = row_of(tl, tensor);
  fprintf(tl->f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %lld, \"dur\": %lld", phase,
          tl->rank, tid, (long long)(start_us - tl->t0), (long long)(end_us - start_us));
  if (detail) {
    fputs(", \"args\": {\"detail\": ", tl->f);
    json_string(tl->f, detail);
    fputc('}', tl->f);
  }
  fputc('}', tl->f);
  pthread_mutex_unlock(&tl->mu);
}

void tnt_timeline_close(tnt_timeline_t *tl) {
  if (!tl) return;
  fputs("\n]\n", tl->f);
  /* a full disk (or quota) cut the trace: say so, or it looks like a trace of less work */
  const int write_failed = ferror(tl->f);
  const int close_failed = fclose(tl->f) != 0;
  if (write_failed || close_failed)
    TNT_WARN("timeline: %s could not be written in full (%s): the trace is incomplete", tl->file,
             close_failed ? strerror(errno) : "a write failed");
  snprintf(written.file, sizeof written.file, "%s", write_failed || close_failed ? "" : tl->file);
  written.t0 = tl->t0;
  written.nrows = tl->nrows;
  tnt_namemap_free(&tl->rows);
  pthread_mutex_destroy(&tl->mu);
  free(tl);
}
