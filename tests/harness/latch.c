/* latch.c: hold a stream back until the test lets it go.
 *
 * Races are forced, not hoped for: xt_latch_hold() enqueues a host function
 * that blocks the stream's worker on the latch, so everything queued behind
 * it stays queued, deterministically, until xt_latch_open(). The host
 * function makes no driver call (a real driver forbids them there) and
 * waits on nothing but the test thread's xt_latch_open().
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "xseg_test.h"

struct xt_latch {
  pthread_mutex_t lock;
  pthread_cond_t opened_cv;
  bool opened;
  int waiting;       /* host functions blocked on it now */
};

xt_latch *xt_latch_new(void) {
  xt_latch *l = calloc(1, sizeof *l);
  if (l == NULL) return NULL;
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->opened_cv, NULL);
  return l;
}

void xt_latch_open(xt_latch *l) {
  pthread_mutex_lock(&l->lock);
  l->opened = true;
  pthread_cond_broadcast(&l->opened_cv);
  pthread_mutex_unlock(&l->lock);
}

int xt_latch_waiting(xt_latch *l) {
  pthread_mutex_lock(&l->lock);
  int n = l->waiting;
  pthread_mutex_unlock(&l->lock);
  return n;
}

bool xt_latch_wait_for_holders(xt_latch *l, int n) {
  const struct timespec ms = {0, 1000 * 1000};
  for (int i = 0; i < 10000; i++) {
    if (xt_latch_waiting(l) >= n) return true;
    nanosleep(&ms, NULL);
  }
  return false;
}

static void *latch_open_after_100ms(void *latch) {
  const struct timespec ms100 = {0, 100 * 1000 * 1000};
  nanosleep(&ms100, NULL);
  xt_latch_open(latch);
  return NULL;
}

bool xt_latch_open_later(xt_latch *l, pthread_t *opener) {
  return pthread_create(opener, NULL, latch_open_after_100ms, l) == 0;
}

void xt_latch_free(xt_latch *l) {
  pthread_cond_destroy(&l->opened_cv);
  pthread_mutex_destroy(&l->lock);
  free(l);
}

static void CUDA_CB latch_wait(void *arg) {
  xt_latch *l = arg;
  pthread_mutex_lock(&l->lock);
  l->waiting++;
  while (!l->opened) pthread_cond_wait(&l->opened_cv, &l->lock);
  l->waiting--;
  pthread_mutex_unlock(&l->lock);
}

CUresult xt_latch_hold(CUstream stream, xt_latch *l) {
  return cuLaunchHostFunc(stream, latch_wait, l);
}

CUresult xt_latch_hold_behind(CUstream stream, CUstream held, xt_latch *l) {
  CUevent e;
  CUresult r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return r;
  r = cuEventRecord(e, held);
  if (r == CUDA_SUCCESS) r = cuStreamWaitEvent(stream, e, 0);
  CUresult destroyed = cuEventDestroy(e);   /* the wait keeps its record */
  if (r == CUDA_SUCCESS) r = destroyed;
  return r == CUDA_SUCCESS ? xt_latch_hold(stream, l) : r;
}
