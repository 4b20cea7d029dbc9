/* shared_lines.c: two threads, each on a stream of its own, whose cached
 * mallocs and frees tools/shared-lines.py traces (valgrind's lackey) to
 * find the cache lines both touch, at least one of them writing: what the
 * threads would pass back and forth between cores when they run at once.
 *
 * They take turns, so that each access belongs to one thread without a
 * thread id in the trace: thread 0 runs its turn, then thread 1. A turn
 * warms up first (the stats' thresholds of its pair settle after the other
 * pair's moves: a crossing, which reads and writes the other pair's shard
 * by design, segments/shards.h), then writes 1 to `turn_marker`, runs the
 * measured steps, and writes 2. A measured step is what the threads
 * benchmark does (`xseg-bench micro --only threads`: one 4 KiB malloc and
 * its free) and a model layer's batch (sizes in both pools, allocated, then
 * freed in reverse order). Both threads stay alive until the end, so that
 * their stacks and thread-local state never share memory.
 *
 *   shared_lines [STEPS] [--share-a-counter]
 *
 * prints "marker=ADDR" at the end. --share-a-counter adds a write that
 * both threads make at every step (a global count), for the tool's own
 * test: it must find that line.
 */
#include <cuda.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xseg.h"

/* On a line of its own: both threads write it, outside what is measured. */
static struct {
  alignas(64) volatile int value;
  char pad[60];
} turn_marker;

/* --share-a-counter's count, on a line of its own. */
static struct {
  alignas(64) volatile long value;
  char pad[56];
} shared_count;
static int share_a_counter;

/* Out of line, so that the tool names it. */
static __attribute__((noinline)) void shared_step(void) {
  shared_count.value = shared_count.value + 1;
}

enum { THREADS = 2, WARM_STEPS = 100 };
static const size_t layer_sizes[] = {3 << 10, 48 << 10, 192 << 10, 1 << 20,
                                     3 << 19, 4 << 20,  6 << 20,   12 << 20};
enum { LAYER = sizeof layer_sizes / sizeof *layer_sizes };

typedef struct turn_thread {
  xseg_allocator *a;
  CUstream stream;
  int steps;
  sem_t go, done;
  pthread_t tid;
} turn_thread;

static void fail(const char *what) {
  fprintf(stderr, "shared_lines: %s: %s\n", what, xseg_last_error());
  exit(1);
}

static void step(turn_thread *t) {
  void *p, *batch[LAYER];
  if (xseg_malloc(t->a, 4096, t->stream, &p) != XSEG_OK) fail("malloc");
  if (xseg_free(t->a, p) != XSEG_OK) fail("free");
  for (int i = 0; i < LAYER; i++)
    if (xseg_malloc(t->a, layer_sizes[i], t->stream, &batch[i]) != XSEG_OK)
      fail("layer malloc");
  for (int i = LAYER - 1; i >= 0; i--)
    if (xseg_free(t->a, batch[i]) != XSEG_OK) fail("layer free");
  if (share_a_counter) shared_step();
}

static void *turn_main(void *arg) {
  turn_thread *t = arg;
  sem_wait(&t->go);
  for (int i = 0; i < WARM_STEPS; i++) step(t);
  turn_marker.value = 1;
  for (int i = 0; i < t->steps; i++) step(t);
  turn_marker.value = 2;
  sem_post(&t->done);
  sem_wait(&t->go);                      /* alive until every turn ended */
  return NULL;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 200;
  share_a_counter = argc > 2 && strcmp(argv[2], "--share-a-counter") == 0;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "shared_lines: no CUDA device\n");
    return 1;
  }
  xseg_allocator *a;
  if (xseg_create(0, NULL, &a) != XSEG_OK) fail("create");
  turn_thread t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    t[i] = (turn_thread){.a = a, .steps = steps};
    if (cuStreamCreate(&t[i].stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
      fail("stream");
    sem_init(&t[i].go, 0, 0);
    sem_init(&t[i].done, 0, 0);
    /* Every pair made before any turn, as the threads benchmark does. */
    void *p;
    if (xseg_malloc(a, 4096, t[i].stream, &p) != XSEG_OK ||
        xseg_free(a, p) != XSEG_OK)
      fail("first malloc");
    if (pthread_create(&t[i].tid, NULL, turn_main, &t[i])) fail("thread");
  }
  for (int i = 0; i < THREADS; i++) {
    sem_post(&t[i].go);
    sem_wait(&t[i].done);
  }
  for (int i = 0; i < THREADS; i++) sem_post(&t[i].go);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i].tid, NULL);
  printf("marker=%p\n", (void *)&turn_marker.value);
  if (xseg_check(a) != XSEG_OK) fail("check");
  xseg_destroy(a);
  for (int i = 0; i < THREADS; i++) cuStreamDestroy(t[i].stream);
  return 0;
}
