/* launcher_ended.c - ranks that the launcher saw end before they joined (launcher_ended.h). */
#include "launcher_ended.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tnt_launcher_rank_ended(int rank, char *how, size_t len) {
  const char *dir = getenv("TNT_LAUNCHER_DIR");
  if (!dir || !*dir || len == 0) return 0;
  char path[4096];
  if (snprintf(path, sizeof path, "%s/ended-rank%d", dir, rank) >= (int)sizeof path) return 0;
  FILE *f = fopen(path, "r"); /* written whole and renamed into place by tntrun: never half */
  if (!f) return 0;
  size_t n = fread(how, 1, len - 1, f);
  fclose(f);
  how[n] = '\0';
  how[strcspn(how, "\n")] = '\0';
  if (!*how) snprintf(how, len, "it ended");
  return 1;
}
