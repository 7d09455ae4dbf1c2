/* child_case.h - one case of test_nccl.c or test_nccl_gpu.c in a process of
 * its own, and the tally of the cases: NCCL and the CUDA runtime load once per process, and CUDA must not
 * be started before a fork. */
#ifndef TNT_TEST_CHILD_CASE_H
#define TNT_TEST_CHILD_CASE_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Run fn in a child, killed after alarm_s (a case that hangs fails instead);
 * the child's wait status. */
static int in_child(void (*fn)(void), unsigned alarm_s) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(alarm_s);
    fn();
    fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

/* The cases' tally: report_case prints and counts each, finish_cases the
 * total line that test/common/test_c_core.py reads, and the exit status. */
static int cases_passed, cases_failed;

static void report_case(const char *name, int status) {
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%s: %s\n", name, ok ? "passed" : "FAILED");
  ok ? cases_passed++ : cases_failed++;
}

static int finish_cases(void) {
  printf("%d passed, %d failed\n", cases_passed, cases_failed);
  return cases_failed != 0;
}

#endif
