/* sim_control.c: the emulator's control surface (xsim.h) and the entry hook
 * every cu* function runs first (XSIM_ENTER).
 *
 * Per-name state lives in a fixed open-addressing table of call slots keyed by
 * the unversioned function name. A slot is claimed once (under xsim_ctl.lock)
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XSIM_SLOT_COUNT 256  /* power of two, above the ~80 emulated names */
#define XSIM_NAME_MAX   64   /* longest cu* name emulated is under 40 chars */
#define XSIM_SPIN_NS    50000 /* below this a modeled latency spins */

#define XSIM_DEFAULT_DEVICES     1
#define XSIM_DEFAULT_MEMORY      (80ull << 30)
#define XSIM_DEFAULT_GRANULARITY (2ull << 20)
#define XSIM_MIN_GRANULARITY     4096ull      /* the host page size */

typedef enum xsim_fault_mode {
  XSIM_FAULT_NONE = 0,
  XSIM_FAULT_COUNTDOWN,  /* fail calls nth .. nth+repeat-1 */
  XSIM_FAULT_RANDOM      /* fail each call with probability p */
} xsim_fault_mode;

/* One armed fault. Invariant: mode == NONE <=> the slot's `armed` is false. */
typedef struct xsim_fault {
  xsim_fault_mode mode;
  uint64_t countdown;  /* COUNTDOWN: calls still to pass before failing */
  uint64_t repeat;     /* COUNTDOWN: failures left; UINT64_MAX never ends */
  double   p;          /* RANDOM: probability of failure */
  uint64_t rng;        /* RANDOM: splitmix64 state */
  CUresult err;
} xsim_fault;

typedef struct xsim_slot {
  _Atomic(const char *) name;  /* NULL: free; else points at buf, forever */
  char buf[XSIM_NAME_MAX];
  atomic_uint_fast64_t calls;
  atomic_uint_fast64_t latency_ns;
  atomic_bool armed;
  xsim_fault fault;              /* guarded by xsim_ctl.lock */
} xsim_slot;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;        /* slot claims, faults, environment reloads */
  xsim_slot slots[XSIM_SLOT_COUNT];
  atomic_int device_count;
  _Atomic uint64_t granularity;
  _Atomic uint64_t gpu_lag_ns;
  _Atomic uint64_t device_memory[XSIM_MAX_DEVICES];
} xsim_ctl = {
  .once = PTHREAD_ONCE_INIT,
  .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- the slot table ---------------------------------------------------- */

static uint64_t xsim_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a */
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
  return h;
}

/* The slot of `name`, or NULL when it has none and `claim` is false (or the
   table is full, or the name too long). */
static xsim_slot *xsim_slot_find(const char *name, bool claim) {
  if (name == NULL || strlen(name) >= XSIM_NAME_MAX) return NULL;
  uint64_t h = xsim_name_hash(name);
  for (size_t i = 0; i < XSIM_SLOT_COUNT; i++) {
    xsim_slot *s = &xsim_ctl.slots[(h + i) & (XSIM_SLOT_COUNT - 1)];
    const char *n = atomic_load_explicit(&s->name, memory_order_acquire);
    if (n != NULL && strcmp(n, name) == 0) return s;
    if (n != NULL) continue;
    if (!claim) return NULL;
    pthread_mutex_lock(&xsim_ctl.lock);
    if (atomic_load_explicit(&s->name, memory_order_relaxed) == NULL) {
      strcpy(s->buf, name);
      atomic_store_explicit(&s->name, s->buf, memory_order_release);
    }
    pthread_mutex_unlock(&xsim_ctl.lock);
    /* Another thread may have claimed this slot for another name meanwhile. */
    if (strcmp(s->buf, name) == 0) return s;
  }
  assert(!"xsim: call slot table full");
  return NULL;
}

static void xsim_fault_clear_locked(xsim_slot *s) {
  memset(&s->fault, 0, sizeof s->fault);
  atomic_store_explicit(&s->armed, false, memory_order_release);
}

static void xsim_fault_arm_locked(xsim_slot *s, const xsim_fault *f) {
  s->fault = *f;
  atomic_store_explicit(&s->armed, f->mode != XSIM_FAULT_NONE,
                        memory_order_release);
}

/* ---- setters (no init: the environment loader runs inside pthread_once) - */

static void xsim_countdown_set(const char *name, uint64_t nth, uint64_t repeat,
                             CUresult err) {
  xsim_slot *s = xsim_slot_find(name, true);
  if (s == NULL) return;
  xsim_fault f = {.mode = XSIM_FAULT_COUNTDOWN, .countdown = nth,
                .repeat = repeat, .err = err};
  pthread_mutex_lock(&xsim_ctl.lock);
  if (nth == 0 || repeat == 0) xsim_fault_clear_locked(s);
  else xsim_fault_arm_locked(s, &f);
  pthread_mutex_unlock(&xsim_ctl.lock);
}

static void xsim_random_set(const char *name, double p, uint64_t seed,
                          CUresult err) {
  xsim_slot *s = xsim_slot_find(name, true);
  if (s == NULL) return;
  xsim_fault f = {.mode = XSIM_FAULT_RANDOM, .p = p, .rng = seed, .err = err};
  pthread_mutex_lock(&xsim_ctl.lock);
  if (!(p > 0.0)) xsim_fault_clear_locked(s);
  else xsim_fault_arm_locked(s, &f);
  pthread_mutex_unlock(&xsim_ctl.lock);
}

static void xsim_latency_set(const char *name, uint64_t ns) {
  xsim_slot *s = xsim_slot_find(name, true);
  if (s != NULL) atomic_store(&s->latency_ns, ns);
}

/* ---- environment ------------------------------------------------------- */

/* "80G", "2M", "4096": K M G T are binary multiples; an optional trailing
   "B" or "iB" is accepted. */
static bool xsim_size_parse(const char *s, uint64_t *out) {
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

static bool xsim_u64_parse(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (end == s || *end != '\0' || errno != 0 || *s == '-') return false;
  *out = v;
  return true;
}

static void xsim_env_warn(const char *var, const char *entry) {
  fprintf(stderr, "xsim: ignoring malformed %s entry '%s'\n", var, entry);
}

static void xsim_knobs_load(void) {
  const char *v = getenv("XSIM_DEVICE_COUNT");
  uint64_t n = XSIM_DEFAULT_DEVICES;
  if (v && (!xsim_u64_parse(v, &n) || n > XSIM_MAX_DEVICES)) {
    xsim_env_warn("XSIM_DEVICE_COUNT", v);
    n = XSIM_DEFAULT_DEVICES;
  }
  atomic_store(&xsim_ctl.device_count, (int)n);

  uint64_t mem = XSIM_DEFAULT_MEMORY;
  v = getenv("XSIM_DEVICE_MEMORY");
  if (v && !xsim_size_parse(v, &mem)) {
    xsim_env_warn("XSIM_DEVICE_MEMORY", v);
    mem = XSIM_DEFAULT_MEMORY;
  }
  for (int d = 0; d < XSIM_MAX_DEVICES; d++)
    atomic_store(&xsim_ctl.device_memory[d], mem);

  uint64_t g = XSIM_DEFAULT_GRANULARITY;
  v = getenv("XSIM_GRANULARITY");
  if (v &&
      (!xsim_size_parse(v, &g) || g < XSIM_MIN_GRANULARITY || (g & (g - 1)))) {
    xsim_env_warn("XSIM_GRANULARITY", v);
    g = XSIM_DEFAULT_GRANULARITY;
  }
  atomic_store(&xsim_ctl.granularity, g);

  uint64_t lag_us = 0;
  v = getenv("XSIM_GPU_LAG");
  if (v && (!xsim_u64_parse(v, &lag_us) || lag_us > UINT64_MAX / 1000)) {
    xsim_env_warn("XSIM_GPU_LAG", v);
    lag_us = 0;
  }
  atomic_store(&xsim_ctl.gpu_lag_ns, lag_us * 1000);
}

/* The error an injected fault returns when its entry names none. */
static CUresult xsim_default_error(const char *name) {
  return strcmp(name, "cuMemCreate") == 0 ? CUDA_ERROR_OUT_OF_MEMORY
                                          : CUDA_ERROR_UNKNOWN;
}

/* Splits "a:b:c" in place into at most `max` fields; returns the count. */
static int xsim_fields_split(char *entry, char **field, int max) {
  int n = 0;
  char *save = NULL;
  for (char *f = strtok_r(entry, ":", &save); f;
       f = strtok_r(NULL, ":", &save)) {
    if (n == max) return max + 1;
    field[n++] = f;
  }
  return n;
}

static bool xsim_error_field(const char *name, int nfield, char **field, int at,
                           CUresult *err) {
  if (nfield <= at) {
    *err = xsim_default_error(name);
    return true;
  }
  return xsim_error_parse(field[at], err);
}

/* XSIM_FAIL entry: name:nth[:CUDA_ERROR_NAME] */
static bool xsim_fail_entry_apply(char *entry) {
  char *f[3];
  int n = xsim_fields_split(entry, f, 3);
  uint64_t nth;
  CUresult err;
  if (n < 2 || n > 3 || !xsim_u64_parse(f[1], &nth) || nth == 0) return false;
  if (!xsim_error_field(f[0], n, f, 2, &err)) return false;
  xsim_countdown_set(f[0], nth, 1, err);
  return true;
}

/* XSIM_FAIL_RATE entry: name:probability:seed[:CUDA_ERROR_NAME] */
static bool xsim_rate_entry_apply(char *entry) {
  char *f[4], *end;
  int n = xsim_fields_split(entry, f, 4);
  uint64_t seed;
  CUresult err;
  if (n < 3 || n > 4) return false;
  double p = strtod(f[1], &end);
  if (*end != '\0' || !(p >= 0.0 && p <= 1.0)) return false;
  if (!xsim_u64_parse(f[2], &seed) || !xsim_error_field(f[0], n, f, 3, &err))
    return false;
  xsim_random_set(f[0], p, seed, err);
  return true;
}

/* XSIM_LATENCY entry: name:nanoseconds */
static bool xsim_latency_entry_apply(char *entry) {
  char *f[2];
  uint64_t ns;
  if (xsim_fields_split(entry, f, 2) != 2 || !xsim_u64_parse(f[1], &ns))
    return false;
  xsim_latency_set(f[0], ns);
  return true;
}

/* Applies each comma-separated entry of environment variable `var`. */
static void xsim_env_list_apply(const char *var, bool (*apply)(char *)) {
  const char *v = getenv(var);
  if (v == NULL) return;
  char *copy = strdup(v), *save = NULL;
  if (copy == NULL) return;
  for (char *e = strtok_r(copy, ",", &save); e;
       e = strtok_r(NULL, ",", &save)) {
    char *shown = strdup(e);
    if (!apply(e)) xsim_env_warn(var, shown ? shown : "?");
    free(shown);
  }
  free(copy);
}

static void xsim_env_load(void) {
  xsim_knobs_load();
  xsim_env_list_apply("XSIM_FAIL", xsim_fail_entry_apply);
  xsim_env_list_apply("XSIM_FAIL_RATE", xsim_rate_entry_apply);
  xsim_env_list_apply("XSIM_LATENCY", xsim_latency_entry_apply);
}

void xsim_control_init(void) { pthread_once(&xsim_ctl.once, xsim_env_load); }

int xsim_knob_device_count(void) {
  xsim_control_init();
  return atomic_load_explicit(&xsim_ctl.device_count, memory_order_relaxed);
}

uint64_t xsim_knob_device_memory(int device) {
  xsim_control_init();
  assert(device >= 0 && device < XSIM_MAX_DEVICES && "device ordinal");
  return atomic_load_explicit(&xsim_ctl.device_memory[device],
                              memory_order_relaxed);
}

uint64_t xsim_knob_granularity(void) {
  xsim_control_init();
  return atomic_load_explicit(&xsim_ctl.granularity, memory_order_relaxed);
}

uint64_t xsim_knob_gpu_lag_ns(void) {
  xsim_control_init();
  return atomic_load_explicit(&xsim_ctl.gpu_lag_ns, memory_order_relaxed);
}

/* ---- the entry hook ---------------------------------------------------- */

static uint64_t xsim_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Short latencies spin: nanosleep's own overshoot (tens of microseconds)
   would otherwise dominate the modeled cost. */
static void xsim_latency_apply(uint64_t ns) {
  if (ns < XSIM_SPIN_NS) {
    uint64_t until = xsim_now_ns() + ns;
    while (xsim_now_ns() < until) continue;
    return;
  }
  struct timespec ts = {(time_t)(ns / 1000000000ull),
                        (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

static uint64_t xsim_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static CUresult xsim_countdown_draw_locked(xsim_slot *s) {
  xsim_fault *f = &s->fault;
  if (f->countdown > 1) {
    f->countdown--;
    return CUDA_SUCCESS;
  }
  CUresult err = f->err;
  if (f->repeat != UINT64_MAX && --f->repeat == 0) xsim_fault_clear_locked(s);
  return err;
}

static CUresult xsim_random_draw_locked(xsim_slot *s) {
  /* 53 random bits as a double in [0, 1). */
  double u = (double)(xsim_splitmix64(&s->fault.rng) >> 11) * 0x1.0p-53;
  return u < s->fault.p ? s->fault.err : CUDA_SUCCESS;
}

static CUresult xsim_fault_draw(xsim_slot *s) {
  CUresult err = CUDA_SUCCESS;
  pthread_mutex_lock(&xsim_ctl.lock);
  if (s->fault.mode == XSIM_FAULT_COUNTDOWN)
    err = xsim_countdown_draw_locked(s);
  if (s->fault.mode == XSIM_FAULT_RANDOM) err = xsim_random_draw_locked(s);
  pthread_mutex_unlock(&xsim_ctl.lock);
  return err;
}

CUresult xsim_enter(const char *name, _Atomic(void *) *slot) {
  xsim_slot *s = atomic_load_explicit(slot, memory_order_acquire);
  if (s == NULL) {
    xsim_control_init();
    s = xsim_slot_find(name, true);
    if (s == NULL) return CUDA_SUCCESS;
    atomic_store_explicit(slot, s, memory_order_release);
  }
  atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
  uint64_t ns = atomic_load_explicit(&s->latency_ns, memory_order_relaxed);
  if (ns != 0) xsim_latency_apply(ns);
  if (!atomic_load_explicit(&s->armed, memory_order_acquire))
    return CUDA_SUCCESS;
  return xsim_fault_draw(s);
}

/* ---- xsim.h ------------------------------------------------------------ */

/* XSIM_STEERING=refuse: a call that steers the emulator aborts, naming
   itself. A dry run of a GPU run (tests built with -DXSEG_TEST_DRIVER=
   sim-as-system) sets it: a test that steers without asking for the
   emulator first (XT_REQUIRE_SIM_FOR) would misbehave on a real driver,
   where the call does nothing, and now fails on any machine instead. */
static void xsim_steering_check(const char *fn) {
  const char *v = getenv("XSIM_STEERING");
  if (v == NULL || strcmp(v, "refuse") != 0) return;
  fprintf(stderr, "xsim: %s called under XSIM_STEERING=refuse: this test "
          "steers the emulator, which a real driver does not have; it must "
          "skip there first (XT_REQUIRE_SIM_FOR)\n", fn);
  abort();
}

void xsim_set_device_memory(int device, uint64_t bytes) {
  xsim_steering_check("xsim_set_device_memory");
  xsim_control_init();
  if (device < 0 || device >= XSIM_MAX_DEVICES) return;
  atomic_store(&xsim_ctl.device_memory[device], bytes);
}

void xsim_fail_calls(const char *name, uint64_t nth, uint64_t repeat,
                     CUresult err) {
  xsim_steering_check("xsim_fail_calls");
  xsim_control_init();
  xsim_countdown_set(name, nth, repeat, err);
}

void xsim_fail_call(const char *name, uint64_t nth, CUresult err) {
  xsim_steering_check("xsim_fail_call");
  xsim_control_init();
  xsim_countdown_set(name, nth, 1, err);
}

void xsim_fail_random(const char *name, double p, uint64_t seed,
                      CUresult err) {
  xsim_steering_check("xsim_fail_random");
  xsim_control_init();
  xsim_random_set(name, p, seed, err);
}

void xsim_set_latency(const char *name, uint64_t ns) {
  xsim_steering_check("xsim_set_latency");
  xsim_control_init();
  xsim_latency_set(name, ns);
}

void xsim_set_gpu_lag(uint64_t us) {
  xsim_steering_check("xsim_set_gpu_lag");
  xsim_control_init();
  atomic_store(&xsim_ctl.gpu_lag_ns, us > UINT64_MAX / 1000 ? UINT64_MAX
                                                         : us * 1000);
}

uint64_t xsim_call_count(const char *name) {
  xsim_control_init();
  xsim_slot *s = xsim_slot_find(name, false);
  return s ? atomic_load(&s->calls) : 0;
}

static void xsim_counters_clear(void) {
  for (size_t i = 0; i < XSIM_SLOT_COUNT; i++)
    atomic_store(&xsim_ctl.slots[i].calls, 0);
}

void xsim_reset_counters(void) { xsim_counters_clear(); }

void xsim_reset(void) {
  xsim_control_init();
  xsim_counters_clear();
  pthread_mutex_lock(&xsim_ctl.lock);
  for (size_t i = 0; i < XSIM_SLOT_COUNT; i++) {
    atomic_store(&xsim_ctl.slots[i].latency_ns, 0);
    xsim_fault_clear_locked(&xsim_ctl.slots[i]);
  }
  pthread_mutex_unlock(&xsim_ctl.lock);
  xsim_stream_clock_reset();
  xsim_env_load();
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
