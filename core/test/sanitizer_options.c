/* sanitizer_options.c - the run-time options of the sanitizer builds (`make
 * asan`, `make tsan`), compiled into every test program so that a program run
 * by hand, by make or by pytest behaves alike. The sanitizers call these hooks
 * at start-up; a plain build never does. Options in ASAN_OPTIONS, UBSAN_OPTIONS
 * or TSAN_OPTIONS still override these.
 *
 * Every report must fail the run: the first one ends the process with a
 * status of its own (for UBSan also -fno-sanitize-recover=all at compile time):
 * 86 AddressSanitizer, 87 UndefinedBehaviorSanitizer, 66 ThreadSanitizer. */

/* detect_leaks: each rank process checks its own leaks at exit, like the
 * valgrind run of test_ranks. */
const char *__asan_default_options(void) { return "detect_leaks=1:halt_on_error=1:exitcode=86"; }

const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1:exitcode=87"; }

/* second_deadlock_stack: a lock-order report names both acquisitions. */
const char *__tsan_default_options(void) { return "halt_on_error=1:second_deadlock_stack=1:exitcode=66"; }
