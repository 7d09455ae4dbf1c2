/* expect.h - the pass/fail counting of the single-process C tests (test_core.c,
 * test_half.c): EXPECT(cond) counts a pass or prints the failed condition with
 * its place; the program ends with printf("%d passed, %d failed\n", ...). */
#ifndef TNT_TEST_EXPECT_H
#define TNT_TEST_EXPECT_H

#include <stdio.h>

static int passed, failed;
#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (cond) passed++;                                                \
    else {                                                             \
      failed++;                                                        \
      fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                  \
  } while (0)

#endif
