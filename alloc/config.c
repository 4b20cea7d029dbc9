/* config.c: PYTORCH_CUDA_ALLOC_CONF-style settings ("key:value,key:value").
 *
 * Follows PyTorch's parser: c10/core/AllocatorConfig.{h,cpp}
 * (ConfigTokenizer, AcceleratorAllocatorConfig::parseArgs and its parse*
 * helpers) and c10/cuda/CUDAAllocatorConfig.cpp (backend, release_lock_*,
 * pinned_*). Same key names, syntax and meaning, with these deliberate
 * differences, all of them stricter:
 *
 *  - numbers must be plain decimal digits. PyTorch's std::stoull/std::stod
 *    accept "-1" (wrapping to a huge value) and trailing junk ("20abc");
 *    here both are errors naming the key.
 *  - an MB value above 64 TiB is an error; PyTorch clamps one whose byte
 *    count overflows size_t to SIZE_MAX / 1 MiB.
 *  - PyTorch skips keys that another backend registered; xseg knows only the
 *    keys in the table below, and any other key is an error.
 *
 * Lexing is PyTorch's ConfigTokenizer: ',', ':', '[' and ']' are tokens of
 * their own, whitespace is dropped anywhere (even inside a word), everything
 * else forms words. So a value (an xseg_driver path included) cannot contain
 * whitespace or any of ",:[]". Words are copied into a bounded buffer on the
 * stack; nothing is allocated.
 */
#include "alloc/config.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/error.h"

#define XS_MB ((size_t)1 << 20)

/* PyTorch's kMinBlockSize: every size is rounded to at least 512 bytes. */
enum { XS_MIN_BLOCK_SIZE = 512 };
/* PyTorch's kLargeBuffer / kMB: the smallest max_split_size_mb and
   max_non_split_rounding_mb that parseMaxSplitSize accepts (>= 20). */
enum { XS_MIN_SPLIT_MB = 20 };
/* kMinLargeAlloc in MB: large_segment_size_mb must be above it
   (parseLargeSegmentSize), the requests its segments serve being under it. */
enum { XS_MIN_LARGE_ALLOC_MB = 10 };
/* The largest MB value of any size key: 64 TiB, more than any device
   holds. Sizes are rounded up to granules and added to requests (at most
   2^62 bytes) without overflow checks, so every size key must stay far
   below 2^64 bytes: a granule of 2^64 - 1 MiB wrapped to 0 and divided
   by it. */
#define XS_MAX_SIZE_MB ((uint64_t)1 << 26)
/* CUDAAllocatorConfig::pinned_max_register_threads(). */
enum { XS_PINNED_MAX_REGISTER_THREADS = 128 };
/* Longest word: sized so that any xseg_driver value that fits fits here. */
enum { XS_TOKEN_MAX = sizeof(((xs_config *)0)->driver) };

/* ---- lexer (PyTorch's ConfigTokenizer, one token at a time) ------------ */

typedef struct xs_token {
  char kind;                 /* 0 = end, 'w' = word, else one of ",:[]" */
  bool too_long;             /* the word did not fit in text */
  char text[XS_TOKEN_MAX];
} xs_token;

static bool is_sep(char ch) {
  return ch == ',' || ch == ':' || ch == '[' || ch == ']';
}

static void lex_word(const char **p, xs_token *t) {
  size_t n = 0;
  t->kind = 'w';
  for (; **p != '\0' && !is_sep(**p); (*p)++) {
    if (isspace((unsigned char)**p)) continue;   /* dropped, as PyTorch */
    if (n + 1 < sizeof t->text) t->text[n++] = **p;
    else t->too_long = true;
  }
  t->text[n] = '\0';
}

/* Reads the next token. Whitespace alone is no token: "a : b" lexes as
   "a" ":" "b", and a trailing run of blanks as the end. */
static void lex_next(const char **p, xs_token *t) {
  t->too_long = false;
  while (isspace((unsigned char)**p)) (*p)++;
  if (**p == '\0') {
    t->kind = 0;
    strcpy(t->text, "<end>");
  } else if (is_sep(**p)) {
    t->kind = t->text[0] = *(*p)++;
    t->text[1] = '\0';
  } else {
    lex_word(p, t);
  }
}

/* ---- values ------------------------------------------------------------ */

static xseg_status bad_value(const char *key, const char *value,
                             const char *expected) {
  return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "invalid value \"%s\" for %s: expected %s", value, key,
                  expected);
}

/* Plain decimal digits, no sign, no junk, no overflow. */
static bool to_u64(const char *s, uint64_t *out) {
  uint64_t v = 0;
  if (*s == '\0') return false;
  for (; *s != '\0'; s++) {
    if (*s < '0' || *s > '9') return false;
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

/* The whole token must be a number for strtod: "" and "0.5x" fail. "nan"
   parses, and the callers' range checks reject it (NaN fails every
   comparison). */
static bool to_double(const char *s, double *out) {
  char *end = NULL;
  if (*s == '\0') return false;
  *out = strtod(s, &end);
  return *end == '\0';
}

static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* v != 0 (__builtin_clzll(0) is undefined); every caller ensures it. */
static unsigned log2_floor(uint64_t v) {
  return 63u - (unsigned)__builtin_clzll(v);
}

/* ---- one parse function per kind of key -------------------------------- */

typedef struct xs_option xs_option;
/* `value` is the token after the ':' (a word, or "[" for a list); list
   parsers read the rest of the list from *p. */
typedef xseg_status (*xs_option_parse_fn)(const xs_option *o,
                                          const char *value, const char **p,
                                          xs_config *c);
struct xs_option {
  const char *key;
  xs_option_parse_fn parse;
  size_t offset;             /* field in xs_config (the generic parsers
                                write it), or XS_IGNORED */
  uint64_t min;              /* smallest accepted number (MB keys, ints) */
};
#define XS_IGNORED SIZE_MAX
#define XS_FIELD(f) offsetof(xs_config, f)

static void *field(xs_config *c, const xs_option *o) {
  return (char *)c + o->offset;
}

/* "<n>" in MB, n >= o->min, stored in bytes. */
static xseg_status parse_mb(const xs_option *o, const char *value,
                            const char **p, xs_config *c) {
  (void)p;
  uint64_t mb;
  if (!to_u64(value, &mb))
    return bad_value(o->key, value, o->min > 0
                     ? "a positive integer in MB" : "an integer >= 0 in MB");
  if (mb < o->min)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "invalid value \"%s\" for %s: too small, must be >= %llu",
                    value, o->key, (unsigned long long)o->min);
  if (mb > XS_MAX_SIZE_MB)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "invalid value \"%s\" for %s: too large, must be <= %llu "
                    "(64 TiB)", value, o->key,
                    (unsigned long long)XS_MAX_SIZE_MB);
  if (o->offset != XS_IGNORED) *(size_t *)field(c, o) = (size_t)mb * XS_MB;
  return XSEG_OK;
}

/* "True" or "False", case-sensitive (ConfigTokenizer::toBool). */
static xseg_status parse_bool(const xs_option *o, const char *value,
                              const char **p, xs_config *c) {
  (void)p;
  bool v = strcmp(value, "True") == 0;
  if (!v && strcmp(value, "False") != 0)
    return bad_value(o->key, value, "True or False");
  if (o->offset != XS_IGNORED) *(bool *)field(c, o) = v;
  return XSEG_OK;
}

/* parseGarbageCollectionThreshold: 0 < t < 1. */
static xseg_status parse_gc_threshold(const xs_option *o, const char *value,
                                      const char **p, xs_config *c) {
  (void)p;
  double v;
  if (!to_double(value, &v) || !(v > 0.0 && v < 1.0))
    return bad_value(o->key, value, "a number in (0.0, 1.0)");
  *(double *)field(c, o) = v;
  return XSEG_OK;
}

/* xseg_memory_fraction: 0 < f <= 1, as torch.cuda.set_per_process_memory_
   fraction accepts. */
static xseg_status parse_fraction(const xs_option *o, const char *value,
                                  const char **p, xs_config *c) {
  (void)p;
  double v;
  if (!to_double(value, &v) || !(v > 0.0 && v <= 1.0))
    return bad_value(o->key, value, "a number in (0.0, 1.0]");
  *(double *)field(c, o) = v;
  return XSEG_OK;
}

/* per_process_memory_fraction: 0 <= f <= 1 (CUDAAllocatorConfig::
   parsePerProcessMemoryFraction), the fraction set at start as
   torch.cuda.set_per_process_memory_fraction would; 0 lets nothing grow. */
static xseg_status parse_process_fraction(const xs_option *o,
                                          const char *value, const char **p,
                                          xs_config *c) {
  (void)p;
  double v;
  if (!to_double(value, &v) || !(v >= 0.0 && v <= 1.0))
    return bad_value(o->key, value, "a number in [0.0, 1.0]");
  *(double *)field(c, o) = v;
  return XSEG_OK;
}

/* xseg_driver: a path to a libcuda, or "sim". The lexer bounds the word to
   the field's size and flags anything longer. */
static xseg_status parse_driver(const xs_option *o, const char *value,
                                const char **p, xs_config *c) {
  (void)p;
  if (strcmp(value, "[") == 0)
    return bad_value(o->key, value, "a library path or sim");
  snprintf(c->driver, sizeof c->driver, "%s", value);
  return XSEG_OK;
}

/* CUDAAllocatorConfig::parseAllocatorConfig: native or cudaMallocAsync.
   xseg is itself the native (caching, VMM) allocator; the stream-ordered
   cudaMallocAsync pool is a different allocator that xseg does not wrap. */
static xseg_status parse_backend(const xs_option *o, const char *value,
                                 const char **p, xs_config *c) {
  (void)p;
  (void)c;
  if (strcmp(value, "native") == 0) return XSEG_OK;
  if (strcmp(value, "cudaMallocAsync") == 0)
    return xs_error(XSEG_ERR_UNSUPPORTED,
                    "backend:cudaMallocAsync is not supported: xseg is a "
                    "native (VMM) allocator; use backend:native");
  return bad_value(o->key, value, "native");
}

/* pinned_num_register_threads: a power of two <= 128
   (CUDAAllocatorConfig::parsePinnedNumRegisterThreads). Ignored. */
static xseg_status parse_pinned_threads(const xs_option *o, const char *value,
                                        const char **p, xs_config *c) {
  (void)p;
  (void)c;
  uint64_t v;
  if (!to_u64(value, &v) || !is_pow2(v) ||
      v > XS_PINNED_MAX_REGISTER_THREADS)
    return bad_value(o->key, value, "a power of two <= 128");
  return XSEG_OK;
}

/* xseg_handle_policy: granule, single or pow2 (config.h). */
static xseg_status parse_handle_policy(const xs_option *o, const char *value,
                                       const char **p, xs_config *c) {
  (void)p;
  static const char *const names[] = {"granule", "single", "pow2"};
  for (int i = 0; i < 3; i++)
    if (strcmp(value, names[i]) == 0) {
      c->handle_policy = (xs_handle_policy)i;
      return XSEG_OK;
    }
  return bad_value(o->key, value, "granule, single or pow2");
}

/* "<n>", an integer >= 0 (xseg_handle_max_part). */
static xseg_status parse_count(const xs_option *o, const char *value,
                               const char **p, xs_config *c) {
  (void)p;
  uint64_t v;
  if (!to_u64(value, &v) || v > SIZE_MAX)
    return bad_value(o->key, value, "an integer >= 0");
  *(size_t *)field(c, o) = (size_t)v;
  return XSEG_OK;
}

/* ---- roundup_power2_divisions ------------------------------------------ */

/* A divisions count: a power of two (0 too where zero_ok: the list form
   accepts 0 to disable an interval, the single number does not). Stored as
   unsigned, so at most 2^31. */
static xseg_status to_divisions(const char *key, const char *value,
                                bool zero_ok, unsigned *out) {
  uint64_t v;
  if (!to_u64(value, &v) || (!is_pow2(v) && !(zero_ok && v == 0)) ||
      v > (UINT_MAX >> 1) + 1u)
    return bad_value(key, value, zero_ok ? "0 or a power of two <= 2^31"
                                         : "a power of two <= 2^31");
  *out = (unsigned)v;
  return XSEG_OK;
}

/* One "<MB>:<divisions>" or ">:<divisions>" entry, applied as the newest
   AcceleratorAllocatorConfig::parseRoundUpPower2Divisions does: the first
   numbered entry also fills every interval below it; '>' fills every
   interval after the last numbered one (older releases started that fill
   at the last numbered interval itself, overwriting it). An interval of
   M MB is index log2(M), clamped to [0, 15], i.e. sizes in [M, 2M) MiB. */
typedef struct xs_div_list { bool first; unsigned last; } xs_div_list;

static xseg_status divisions_entry(const char *key, const char *bound,
                                   unsigned div, xs_div_list *l,
                                   xs_config *c) {
  unsigned *d = c->roundup_power2_divisions;
  if (strcmp(bound, ">") == 0) {
    for (unsigned i = l->last + 1; i < XS_ROUNDUP_INTERVALS; i++) d[i] = div;
    return XSEG_OK;
  }
  uint64_t mb;
  if (!to_u64(bound, &mb) || !is_pow2(mb))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "invalid interval \"%s\" for %s: expected a power of two "
                    "in MB or '>'", bound, key);
  unsigned idx = log2_floor(mb);
  if (idx > XS_ROUNDUP_INTERVALS - 1) idx = XS_ROUNDUP_INTERVALS - 1;
  for (unsigned i = 0; l->first && i < idx; i++) d[i] = div;
  l->first = false;
  d[idx] = div;
  l->last = idx;
  return XSEG_OK;
}

static xseg_status list_syntax(const char *key, const char *want,
                               const xs_token *got) {
  return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "bad list for %s: expected %s, got \"%s\"", key, want,
                  got->text);
}

/* Reads "<bound>:<divisions>" after `bound` has been lexed. */
static xseg_status divisions_item(const char *key, const xs_token *bound,
                                  const char **p, xs_div_list *l,
                                  xs_config *c) {
  xs_token t;
  unsigned div = 0;              /* set before every use; -O3 cannot tell */
  lex_next(p, &t);
  if (t.kind != ':') return list_syntax(key, "':' after an interval", &t);
  lex_next(p, &t);
  if (t.kind != 'w') return list_syntax(key, "a number of divisions", &t);
  if (t.too_long) return bad_value(key, t.text, "a shorter value");
  xseg_status s = to_divisions(key, t.text, true, &div);
  return s != XSEG_OK ? s : divisions_entry(key, bound->text, div, l, c);
}

/* "[" already read: entries separated by ',' up to ']'. A trailing comma
   ("[256:1,]") is accepted, as PyTorch's loop does. */
static xseg_status divisions_list(const char *key, const char **p,
                                  xs_config *c) {
  xs_div_list l = {true, 0};
  xs_token t;
  for (;;) {
    lex_next(p, &t);
    if (t.kind == ']') return XSEG_OK;
    if (t.kind != 'w') return list_syntax(key, "an interval or ']'", &t);
    if (t.too_long) return bad_value(key, t.text, "a shorter interval");
    xseg_status s = divisions_item(key, &t, p, &l, c);
    if (s != XSEG_OK) return s;
    lex_next(p, &t);
    if (t.kind == ']') return XSEG_OK;
    if (t.kind != ',') return list_syntax(key, "',' or ']'", &t);
  }
}

/* "4" (every interval, PyTorch's backwards-compatible form) or a list. */
static xseg_status parse_divisions(const xs_option *o, const char *value,
                                   const char **p, xs_config *c) {
  unsigned div = 0;              /* set before every use; -O3 cannot tell */
  if (strcmp(value, "[") == 0) return divisions_list(o->key, p, c);
  xseg_status s = to_divisions(o->key, value, false, &div);
  if (s != XSEG_OK) return s;
  for (unsigned i = 0; i < XS_ROUNDUP_INTERVALS; i++)
    c->roundup_power2_divisions[i] = div;
  return XSEG_OK;
}

/* ---- the table ----------------------------------------------------------- */

/* Keys that configure PyTorch's cudaMalloc lock and its pinned host
   allocator (release_lock_on_*, pinned_*) mean nothing to a device VMM
   allocator: they are accepted with the values PyTorch accepts, so that an
   existing PYTORCH_CUDA_ALLOC_CONF works unchanged, and then ignored. The
   hip spellings are PyTorch's ROCm aliases. graph_capture_record_stream_reuse
   is accepted and ignored too: it lets PyTorch reuse, within one capture, a
   block freed with record_stream once the graph shows the recorded work
   done; xseg keeps such a free waiting until the capture ends (docs/DESIGN.md,
   captures), which reuses later and never sooner, so the key changes no
   result, only how soon memory comes back. */
static const xs_option options[] = {
  {"expandable_segments", parse_bool, XS_FIELD(expandable_segments), 0},
  {"max_split_size_mb", parse_mb, XS_FIELD(max_split_size), XS_MIN_SPLIT_MB},
  {"max_non_split_rounding_mb", parse_mb, XS_FIELD(max_non_split_rounding),
   XS_MIN_SPLIT_MB},
  {"roundup_power2_divisions", parse_divisions,
   XS_FIELD(roundup_power2_divisions), 0},
  {"garbage_collection_threshold", parse_gc_threshold,
   XS_FIELD(garbage_collection_threshold), 0},
  {"large_segment_size_mb", parse_mb, XS_FIELD(large_segment_size),
   XS_MIN_LARGE_ALLOC_MB + 1},
  {"per_process_memory_fraction", parse_process_fraction,
   XS_FIELD(memory_fraction), 0},
  {"backend", parse_backend, XS_IGNORED, 0},
  {"graph_capture_record_stream_reuse", parse_bool, XS_IGNORED, 0},
  {"release_lock_on_cudamalloc", parse_bool, XS_IGNORED, 0},
  {"release_lock_on_hipmalloc", parse_bool, XS_IGNORED, 0},
  {"pinned_use_cuda_host_register", parse_bool, XS_IGNORED, 0},
  {"pinned_use_hip_host_register", parse_bool, XS_IGNORED, 0},
  {"pinned_use_background_threads", parse_bool, XS_IGNORED, 0},
  {"pinned_num_register_threads", parse_pinned_threads, XS_IGNORED, 0},
  {"pinned_reserve_segment_size_mb", parse_mb, XS_IGNORED, 1},
  {"xseg_driver", parse_driver, XS_FIELD(driver), 0},
  {"xseg_memory_fraction", parse_fraction, XS_FIELD(memory_fraction), 0},
  {"xseg_small_granule_mb", parse_mb, XS_FIELD(small_granule), 1},
  {"xseg_large_granule_mb", parse_mb, XS_FIELD(large_granule), 1},
  {"xseg_reserve_mb", parse_mb, XS_FIELD(reserve_size), 0},
  {"xseg_handle_policy", parse_handle_policy, XS_FIELD(handle_policy), 0},
  {"xseg_grow_min_mb", parse_mb, XS_FIELD(grow_min), 0},
  {"xseg_handle_max_mb", parse_mb, XS_FIELD(handle_max), 0},
  {"xseg_handle_max_part", parse_count, XS_FIELD(handle_max_part), 0},
};

static const xs_option *option_find(const char *key) {
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    if (strcmp(options[i].key, key) == 0) return &options[i];
  return NULL;
}

/* ---- the string ----------------------------------------------------------- */

/* ":value" after the key of option o. */
static xseg_status parse_value(const xs_option *o, const char **p,
                               xs_config *c) {
  xs_token t;
  lex_next(p, &t);
  if (t.kind != ':')
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "allocator config: expected ':' after %s, got \"%s\"",
                    o->key, t.text);
  lex_next(p, &t);
  if (t.kind != 'w' && t.kind != '[')
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "allocator config: missing value for %s (got \"%s\")",
                    o->key, t.text);
  if (t.too_long) return bad_value(o->key, t.text, "a shorter value");
  return o->parse(o, t.text, p, c);
}

/* One "key:value" whose key has been lexed, and the ',' after it; *more
   says whether one was there. */
static xseg_status parse_key_value(const xs_token *key, const char **p,
                                   xs_config *c, bool *more) {
  if (key->kind != 'w')
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "allocator config: expected a key, got \"%s\"", key->text);
  const xs_option *o = option_find(key->text);
  if (o == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "allocator config: unknown key \"%s\"", key->text);
  xseg_status s = parse_value(o, p, c);
  if (s != XSEG_OK) return s;
  xs_token t;
  lex_next(p, &t);
  *more = t.kind == ',';
  if (t.kind != 0 && t.kind != ',')
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "allocator config: expected ',' after the value of %s, "
                    "got \"%s\"", o->key, t.text);
  return XSEG_OK;
}

/* Key-value pairs separated by ','. A trailing ',' is accepted, as
   PyTorch's loop does (it consumes a ',' only when more tokens follow). */
static xseg_status parse_key_values(const char *conf, xs_config *c) {
  const char *p = conf;
  bool more = true;
  xs_token t;
  for (lex_next(&p, &t); more && t.kind != 0; lex_next(&p, &t)) {
    xseg_status s = parse_key_value(&t, &p, c, &more);
    if (s != XSEG_OK) return s;
  }
  return XSEG_OK;
}

void xs_config_defaults(xs_config *c) {
  memset(c, 0, sizeof *c);   /* no power-of-two rounding, gc off, driver "" */
  c->expandable_segments = true;
  c->max_split_size = SIZE_MAX;
  c->max_non_split_rounding = (size_t)XS_MIN_SPLIT_MB * XS_MB; /* kLargeBuffer */
  c->large_segment_size = (size_t)XS_MIN_SPLIT_MB * XS_MB;     /* kLargeBuffer */
  c->memory_fraction = 1.0;
  c->small_granule = 2 * XS_MB;
  c->large_granule = 2 * XS_MB;
  /* Growth's handles: see alloc/grow.c and bench/README.md for the
     numbers behind these. */
  c->handle_policy = XS_HANDLES_SINGLE;
  c->handle_max = 8 * XS_MB;
  c->handle_max_part = 32;
}

xseg_status xs_config_parse(const char *conf, xs_config *c) {
  xs_config_defaults(c);
  if (conf == NULL || conf[0] == '\0') conf = getenv("XSEG_ALLOC_CONF");
  if (conf == NULL) return XSEG_OK;
  return parse_key_values(conf, c);
}

/* ---- round_size ---------------------------------------------------------- */

/* AcceleratorAllocatorConfig::roundup_power2_divisions(size): intervals are
   indexed by floor(log2(size)) - 20, clamped to [0, 15]. */
static unsigned divisions_for(const xs_config *c, size_t size) {
  unsigned lg = log2_floor(size);
  unsigned idx = lg > 20 ? lg - 20 : 0;
  if (idx > XS_ROUNDUP_INTERVALS - 1) idx = XS_ROUNDUP_INTERVALS - 1;
  return c->roundup_power2_divisions[idx];
}

/* CUDACachingAllocator.cpp: roundup_power2_next_division. Splits
   [2^k, 2^(k+1)) into `div` equal steps and rounds up to the next step:
   1200 with 4 divisions of [1024, 2048) becomes 1280. */
static size_t next_division(size_t size, unsigned div) {
  if (is_pow2(size)) return size;
  size_t floor2 = (size_t)1 << log2_floor(size);
  size_t step = floor2 >> log2_floor(div);
  if (step == 0)   /* more divisions than bytes: PyTorch takes 2^(k+1) */
    return floor2 > SIZE_MAX / 2 ? 0 : floor2 << 1;
  size_t down = size & ~(step - 1);
  if (down == size) return size;
  return down > SIZE_MAX - step ? 0 : down + step;
}

size_t xs_config_round_size(const xs_config *c, size_t size) {
  if (size < XS_MIN_BLOCK_SIZE) return XS_MIN_BLOCK_SIZE;
  unsigned div = divisions_for(c, size);
  /* PyTorch's size > kMinBlockSize * divisions, written so that the
     product cannot overflow: x >= 512 * d  <=>  x / 512 >= d */
  if (div > 1 && (size - 1) / XS_MIN_BLOCK_SIZE >= div)
    return next_division(size, div);
  if (size > SIZE_MAX - (XS_MIN_BLOCK_SIZE - 1)) return 0;
  return (size + XS_MIN_BLOCK_SIZE - 1) / XS_MIN_BLOCK_SIZE * XS_MIN_BLOCK_SIZE;
}
