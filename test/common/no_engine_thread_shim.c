/* LD_PRELOAD shim for test_hardening.py: the core (tarantella._core) cannot start its background
 * thread (pthread_create fails with EAGAIN, as at a thread limit), after the rank has joined the
 * job's shared memory: tnt_engine_start's last step fails. Threads of anything else start. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

typedef int (*create_t)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg) {
  static create_t real;
  if (!real) real = (create_t)dlsym(RTLD_NEXT, "pthread_create");
  Dl_info info;
  if (dladdr((void *)start, &info) && info.dli_fname && strstr(info.dli_fname, "tarantella/_core")) return EAGAIN;
  return real(thread, attr, start, arg);
}
