/* sim_control.c: the emulator's control surface (xsim.h) and the entry hook
 * every cu* function runs first (XSIM_ENTER).
 *
 * Per-name state lives in a fixed open-addressing table of call slots keyed by
 * the unversioned function name. A slot is claimed once (under xs_ctl.lock)
 * and never freed, so the hot path, xsim_enter, finds it without a lock:
 * it publishes `name` with release order after filling `buf`, and readers
 * load it with acquire order. Counters and latencies are atomics; only an
 * armed fault (rare) takes the lock to draw its outcome.
 *
 * Knobs (device count, capacities, granularity) are read from the environment
 * once, at the first use (normally cuInit's XSIM_ENTER), and again by
 * xsim_reset. Malformed environment entries are reported on stderr and
 * skipped: a driver cannot return an error from its environment.
 */
#include "sim_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XS_SLOT_COUNT 256  /* power of two, well above the ~80 emulated names */
#define XS_NAME_MAX   64   /* longest cu* name emulated is under 40 chars */
#define XS_SPIN_NS    50000 /* below this a modeled latency spins, not sleeps */

#define XS_DEFAULT_DEVICES     1
#define XS_DEFAULT_MEMORY      (80ull << 30)
#define XS_DEFAULT_GRANULARITY (2ull << 20)
#define XS_MIN_GRANULARITY     4096ull      /* the host page size */

typedef enum xs_fault_mode {
  XS_FAULT_NONE = 0,
  XS_FAULT_COUNTDOWN,  /* fail calls nth .. nth+repeat-1 */
  XS_FAULT_RANDOM      /* fail each call with probability p */
} xs_fault_mode;

/* One armed fault. Invariant: mode == NONE <=> the slot's `armed` is false. */
typedef struct xs_fault {
  xs_fault_mode mode;
  uint64_t countdown;  /* COUNTDOWN: calls still to pass before failing */
  uint64_t repeat;     /* COUNTDOWN: failures left; UINT64_MAX never ends */
  double   p;          /* RANDOM: probability of failure */
  uint64_t rng;        /* RANDOM: splitmix64 state */
  CUresult err;
} xs_fault;

typedef struct xs_slot {
  _Atomic(const char *) name;  /* NULL: free; else points at buf, forever */
  char buf[XS_NAME_MAX];
  atomic_uint_fast64_t calls;
  atomic_uint_fast64_t latency_ns;
  atomic_bool armed;
  xs_fault fault;              /* guarded by xs_ctl.lock */
} xs_slot;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;        /* slot claims, faults, environment reloads */
  xs_slot slots[XS_SLOT_COUNT];
  atomic_int device_count;
  _Atomic uint64_t granularity;
  _Atomic uint64_t gpu_lag_ns;
  _Atomic uint64_t device_memory[XSIM_MAX_DEVICES];
} xs_ctl = {
  .once = PTHREAD_ONCE_INIT,
  .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- the slot table ---------------------------------------------------- */

static uint64_t xs_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a */
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
  return h;
}

/* The slot of `name`, or NULL when it has none and `claim` is false (or the
   table is full, or the name too long). */
static xs_slot *xs_slot_find(const char *name, bool claim) {
  if (name == NULL || strlen(name) >= XS_NAME_MAX) return NULL;
  uint64_t h = xs_name_hash(name);
  for (size_t i = 0; i < XS_SLOT_COUNT; i++) {
    xs_slot *s = &xs_ctl.slots[(h + i) & (XS_SLOT_COUNT - 1)];
    const char *n = atomic_load_explicit(&s->name, memory_order_acquire);
    if (n != NULL && strcmp(n, name) == 0) return s;
    if (n != NULL) continue;
    if (!claim) return NULL;
    pthread_mutex_lock(&xs_ctl.lock);
    if (atomic_load_explicit(&s->name, memory_order_relaxed) == NULL) {
      strcpy(s->buf, name);
      atomic_store_explicit(&s->name, s->buf, memory_order_release);
    }
    pthread_mutex_unlock(&xs_ctl.lock);
    /* Another thread may have claimed this slot for another name meanwhile. */
    if (strcmp(s->buf, name) == 0) return s;
  }
  assert(!"xsim: call slot table full");
  return NULL;
}

static void xs_fault_clear_locked(xs_slot *s) {
  memset(&s->fault, 0, sizeof s->fault);
  atomic_store_explicit(&s->armed, false, memory_order_release);
}

static void xs_fault_arm_locked(xs_slot *s, const xs_fault *f) {
  s->fault = *f;
  atomic_store_explicit(&s->armed, f->mode != XS_FAULT_NONE,
                        memory_order_release);
}

/* ---- setters (no init: the environment loader runs inside pthread_once) - */

static void xs_countdown_set(const char *name, uint64_t nth, uint64_t repeat,
                             CUresult err) {
  xs_slot *s = xs_slot_find(name, true);
  if (s == NULL) return;
  xs_fault f = {.mode = XS_FAULT_COUNTDOWN, .countdown = nth,
                .repeat = repeat, .err = err};
  pthread_mutex_lock(&xs_ctl.lock);
  if (nth == 0 || repeat == 0) xs_fault_clear_locked(s);
  else xs_fault_arm_locked(s, &f);
  pthread_mutex_unlock(&xs_ctl.lock);
}

static void xs_random_set(const char *name, double p, uint64_t seed,
                          CUresult err) {
  xs_slot *s = xs_slot_find(name, true);
  if (s == NULL) return;
  xs_fault f = {.mode = XS_FAULT_RANDOM, .p = p, .rng = seed, .err = err};
  pthread_mutex_lock(&xs_ctl.lock);
  if (!(p > 0.0)) xs_fault_clear_locked(s);
  else xs_fault_arm_locked(s, &f);
  pthread_mutex_unlock(&xs_ctl.lock);
}

static void xs_latency_set(const char *name, uint64_t ns) {
  xs_slot *s = xs_slot_find(name, true);
  if (s != NULL) atomic_store(&s->latency_ns, ns);
}

/* ---- environment ------------------------------------------------------- */

/* "80G", "2M", "4096": K M G T are binary multiples; an optional trailing
   "B" or "iB" is accepted. */
static bool xs_size_parse(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || errno != 0 || *s == '-') return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
  }
  if (shift && *end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || (shift && v > (UINT64_MAX >> shift))) return false;
  *out = (uint64_t)v << shift;
  return true;
}

static bool xs_u64_parse(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (end == s || *end != '\0' || errno != 0 || *s == '-') return false;
  *out = v;
  return true;
}

static void xs_env_warn(const char *var, const char *entry) {
  fprintf(stderr, "xsim: ignoring malformed %s entry '%s'\n", var, entry);
}

static void xs_knobs_load(void) {
  const char *v = getenv("XSIM_DEVICE_COUNT");
  uint64_t n = XS_DEFAULT_DEVICES;
  if (v && (!xs_u64_parse(v, &n) || n > XSIM_MAX_DEVICES)) {
    xs_env_warn("XSIM_DEVICE_COUNT", v);
    n = XS_DEFAULT_DEVICES;
  }
  atomic_store(&xs_ctl.device_count, (int)n);

  uint64_t mem = XS_DEFAULT_MEMORY;
  v = getenv("XSIM_DEVICE_MEMORY");
  if (v && !xs_size_parse(v, &mem)) {
    xs_env_warn("XSIM_DEVICE_MEMORY", v);
    mem = XS_DEFAULT_MEMORY;
  }
  for (int d = 0; d < XSIM_MAX_DEVICES; d++)
    atomic_store(&xs_ctl.device_memory[d], mem);

  uint64_t g = XS_DEFAULT_GRANULARITY;
  v = getenv("XSIM_GRANULARITY");
  if (v && (!xs_size_parse(v, &g) || g < XS_MIN_GRANULARITY || (g & (g - 1)))) {
    xs_env_warn("XSIM_GRANULARITY", v);
    g = XS_DEFAULT_GRANULARITY;
  }
  atomic_store(&xs_ctl.granularity, g);

  uint64_t lag_us = 0;
  v = getenv("XSIM_GPU_LAG");
  if (v && (!xs_u64_parse(v, &lag_us) || lag_us > UINT64_MAX / 1000)) {
    xs_env_warn("XSIM_GPU_LAG", v);
    lag_us = 0;
  }
  atomic_store(&xs_ctl.gpu_lag_ns, lag_us * 1000);
}

/* The error an injected fault returns when its entry names none. */
static CUresult xs_default_error(const char *name) {
  return strcmp(name, "cuMemCreate") == 0 ? CUDA_ERROR_OUT_OF_MEMORY
                                          : CUDA_ERROR_UNKNOWN;
}

/* Splits "a:b:c" in place into at most `max` fields; returns the count. */
static int xs_fields_split(char *entry, char **field, int max) {
  int n = 0;
  char *save = NULL;
  for (char *f = strtok_r(entry, ":", &save); f; f = strtok_r(NULL, ":", &save)) {
    if (n == max) return max + 1;
    field[n++] = f;
  }
  return n;
}

static bool xs_error_field(const char *name, int nfield, char **field, int at,
                           CUresult *err) {
  if (nfield <= at) {
    *err = xs_default_error(name);
    return true;
  }
  return xsim_error_parse(field[at], err);
}

/* XSIM_FAIL entry: name:nth[:CUDA_ERROR_NAME] */
static bool xs_fail_entry_apply(char *entry) {
  char *f[3];
  int n = xs_fields_split(entry, f, 3);
  uint64_t nth;
  CUresult err;
  if (n < 2 || n > 3 || !xs_u64_parse(f[1], &nth) || nth == 0) return false;
  if (!xs_error_field(f[0], n, f, 2, &err)) return false;
  xs_countdown_set(f[0], nth, 1, err);
  return true;
}

/* XSIM_FAIL_RATE entry: name:probability:seed[:CUDA_ERROR_NAME] */
static bool xs_rate_entry_apply(char *entry) {
  char *f[4], *end;
  int n = xs_fields_split(entry, f, 4);
  uint64_t seed;
  CUresult err;
  if (n < 3 || n > 4) return false;
  double p = strtod(f[1], &end);
  if (*end != '\0' || !(p >= 0.0 && p <= 1.0)) return false;
  if (!xs_u64_parse(f[2], &seed) || !xs_error_field(f[0], n, f, 3, &err))
    return false;
  xs_random_set(f[0], p, seed, err);
  return true;
}

/* XSIM_LATENCY entry: name:nanoseconds */
static bool xs_latency_entry_apply(char *entry) {
  char *f[2];
  uint64_t ns;
  if (xs_fields_split(entry, f, 2) != 2 || !xs_u64_parse(f[1], &ns))
    return false;
  xs_latency_set(f[0], ns);
  return true;
}

/* Applies each comma-separated entry of environment variable `var`. */
static void xs_env_list_apply(const char *var, bool (*apply)(char *)) {
  const char *v = getenv(var);
  if (v == NULL) return;
  char *copy = strdup(v), *save = NULL;
  if (copy == NULL) return;
  for (char *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
    char *shown = strdup(e);
    if (!apply(e)) xs_env_warn(var, shown ? shown : "?");
    free(shown);
  }
  free(copy);
}

static void xs_env_load(void) {
  xs_knobs_load();
  xs_env_list_apply("XSIM_FAIL", xs_fail_entry_apply);
  xs_env_list_apply("XSIM_FAIL_RATE", xs_rate_entry_apply);
  xs_env_list_apply("XSIM_LATENCY", xs_latency_entry_apply);
}

void xsim_control_init(void) { pthread_once(&xs_ctl.once, xs_env_load); }

int xsim_knob_device_count(void) {
  xsim_control_init();
  return atomic_load_explicit(&xs_ctl.device_count, memory_order_relaxed);
}

uint64_t xsim_knob_device_memory(int device) {
  xsim_control_init();
  assert(device >= 0 && device < XSIM_MAX_DEVICES && "device ordinal");
  return atomic_load_explicit(&xs_ctl.device_memory[device],
                              memory_order_relaxed);
}

uint64_t xsim_knob_granularity(void) {
  xsim_control_init();
  return atomic_load_explicit(&xs_ctl.granularity, memory_order_relaxed);
}

uint64_t xsim_knob_gpu_lag_ns(void) {
  xsim_control_init();
  return atomic_load_explicit(&xs_ctl.gpu_lag_ns, memory_order_relaxed);
}

/* ---- the entry hook ---------------------------------------------------- */

static uint64_t xs_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Short latencies spin: nanosleep's own overshoot (tens of microseconds)
   would otherwise dominate the modeled cost. */
static void xs_latency_apply(uint64_t ns) {
  if (ns < XS_SPIN_NS) {
    uint64_t until = xs_now_ns() + ns;
    while (xs_now_ns() < until) continue;
    return;
  }
  struct timespec ts = {(time_t)(ns / 1000000000ull),
                        (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

static uint64_t xs_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static CUresult xs_countdown_draw_locked(xs_slot *s) {
  xs_fault *f = &s->fault;
  if (f->countdown > 1) {
    f->countdown--;
    return CUDA_SUCCESS;
  }
  CUresult err = f->err;
  if (f->repeat != UINT64_MAX && --f->repeat == 0) xs_fault_clear_locked(s);
  return err;
}

static CUresult xs_random_draw_locked(xs_slot *s) {
  /* 53 random bits as a double in [0, 1). */
  double u = (double)(xs_splitmix64(&s->fault.rng) >> 11) * 0x1.0p-53;
  return u < s->fault.p ? s->fault.err : CUDA_SUCCESS;
}

static CUresult xs_fault_draw(xs_slot *s) {
  CUresult err = CUDA_SUCCESS;
  pthread_mutex_lock(&xs_ctl.lock);
  if (s->fault.mode == XS_FAULT_COUNTDOWN) err = xs_countdown_draw_locked(s);
  if (s->fault.mode == XS_FAULT_RANDOM) err = xs_random_draw_locked(s);
  pthread_mutex_unlock(&xs_ctl.lock);
  return err;
}

CUresult xsim_enter(const char *name, _Atomic(void *) *slot) {
  xs_slot *s = atomic_load_explicit(slot, memory_order_acquire);
  if (s == NULL) {
    xsim_control_init();
    s = xs_slot_find(name, true);
    if (s == NULL) return CUDA_SUCCESS;
    atomic_store_explicit(slot, s, memory_order_release);
  }
  atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
  uint64_t ns = atomic_load_explicit(&s->latency_ns, memory_order_relaxed);
  if (ns != 0) xs_latency_apply(ns);
  if (!atomic_load_explicit(&s->armed, memory_order_acquire))
    return CUDA_SUCCESS;
  return xs_fault_draw(s);
}

/* ---- xsim.h ------------------------------------------------------------ */

void xsim_set_device_memory(int device, uint64_t bytes) {
  xsim_control_init();
  if (device < 0 || device >= XSIM_MAX_DEVICES) return;
  atomic_store(&xs_ctl.device_memory[device], bytes);
}

void xsim_fail_calls(const char *name, uint64_t nth, uint64_t repeat,
                     CUresult err) {
  xsim_control_init();
  xs_countdown_set(name, nth, repeat, err);
}

void xsim_fail_call(const char *name, uint64_t nth, CUresult err) {
  xsim_control_init();
  xs_countdown_set(name, nth, 1, err);
}

void xsim_fail_random(const char *name, double p, uint64_t seed,
                      CUresult err) {
  xsim_control_init();
  xs_random_set(name, p, seed, err);
}

void xsim_set_latency(const char *name, uint64_t ns) {
  xsim_control_init();
  xs_latency_set(name, ns);
}

void xsim_set_gpu_lag(uint64_t us) {
  xsim_control_init();
  atomic_store(&xs_ctl.gpu_lag_ns, us > UINT64_MAX / 1000 ? UINT64_MAX
                                                         : us * 1000);
}

uint64_t xsim_call_count(const char *name) {
  xsim_control_init();
  xs_slot *s = xs_slot_find(name, false);
  return s ? atomic_load(&s->calls) : 0;
}

static void xs_counters_clear(void) {
  for (size_t i = 0; i < XS_SLOT_COUNT; i++)
    atomic_store(&xs_ctl.slots[i].calls, 0);
}

void xsim_reset_counters(void) { xs_counters_clear(); }

void xsim_reset(void) {
  xsim_control_init();
  xs_counters_clear();
  pthread_mutex_lock(&xs_ctl.lock);
  for (size_t i = 0; i < XS_SLOT_COUNT; i++) {
    atomic_store(&xs_ctl.slots[i].latency_ns, 0);
    xs_fault_clear_locked(&xs_ctl.slots[i]);
  }
  pthread_mutex_unlock(&xs_ctl.lock);
  xsim_stream_clock_reset();
  xs_env_load();
}

void xsim_get_live(xsim_live *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  xsim_vmm_live(out);
  xsim_stream_live(out);
}

uint64_t xsim_report_live(FILE *out) {
  if (out == NULL) return 0;
  uint64_t lines = xsim_vmm_report_live(out);
  xsim_live live = {0};
  xsim_stream_live(&live);
  if (live.streams) {
    fprintf(out, "xsim: %llu live stream(s)\n",
            (unsigned long long)live.streams);
    lines++;
  }
  if (live.events) {
    fprintf(out, "xsim: %llu live event(s)\n", (unsigned long long)live.events);
    lines++;
  }
  return lines;
}
