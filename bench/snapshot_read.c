/* snapshot_read.c: reads the allocator's snapshot JSON back (docs/DESIGN.md
 * section 6, as alloc/snapshot.c writes it) for the segment map.
 *
 * A recursive-descent reader over the whole text, enough JSON for the
 * schema: objects, arrays, strings (escapes kept as the escaped character,
 * \uXXXX as '?'), unsigned integers where the schema has them, and any other
 * value skipped by shape. Only segments[].{address, total_size, stream,
 * segment_type, is_expandable, blocks[].{address, size, requested_size,
 * state}} are kept; device_traces and frames are skipped.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct jr {
  const char *p, *start;
  xb_error *err;
  bool ok;
} jr;

static bool jr_fail(jr *j, const char *what) {
  if (j->ok) xb_fail(j->err, "snapshot: %s at offset %zu", what,
                     (size_t)(j->p - j->start));
  j->ok = false;
  return false;
}

static void jr_ws(jr *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')
    j->p++;
}

static bool jr_eat(jr *j, char c) {
  jr_ws(j);
  if (*j->p != c) return false;
  j->p++;
  return true;
}

/* A string into buf (truncated to size - 1), or false. */
static bool jr_string(jr *j, char *buf, size_t size) {
  size_t n = 0;
  if (!jr_eat(j, '"')) return jr_fail(j, "expected a string");
  for (; *j->p != '"'; j->p++) {
    char c = *j->p;
    if (c == '\0') return jr_fail(j, "unterminated string");
    if (c == '\\') {
      c = *++j->p;
      if (c == '\0') return jr_fail(j, "unterminated string");
      if (c == 'u') {
        for (int i = 0; i < 4 && j->p[1] != '\0'; i++) j->p++;
        c = '?';
      }
    }
    if (n + 1 < size) buf[n++] = c;
  }
  j->p++;
  if (size > 0) buf[n] = '\0';
  return true;
}

static bool jr_u64(jr *j, uint64_t *out) {
  jr_ws(j);
  if (*j->p < '0' || *j->p > '9') return jr_fail(j, "expected an integer");
  uint64_t v = 0;
  for (; *j->p >= '0' && *j->p <= '9'; j->p++) {
    unsigned d = (unsigned)(*j->p - '0');
    if (v > (UINT64_MAX - d) / 10) return jr_fail(j, "integer overflow");
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

static bool jr_bool(jr *j, bool *out) {
  jr_ws(j);
  if (strncmp(j->p, "true", 4) == 0) return j->p += 4, *out = true, true;
  if (strncmp(j->p, "false", 5) == 0) return j->p += 5, *out = false, true;
  return jr_fail(j, "expected true or false");
}

typedef bool (*jr_member_fn)(jr *j, const char *key, void *ctx);
typedef bool (*jr_element_fn)(jr *j, void *ctx);

static bool jr_skip(jr *j, int depth);

static bool jr_skip_member(jr *j, const char *key, void *ctx) {
  (void)key;
  return jr_skip(j, *(int *)ctx);
}

static bool jr_skip_element(jr *j, void *ctx) {
  return jr_skip(j, *(int *)ctx);
}

/* An object: `member` reads each value after its key. */
static bool jr_object(jr *j, jr_member_fn member, void *ctx) {
  if (!jr_eat(j, '{')) return jr_fail(j, "expected an object");
  if (jr_eat(j, '}')) return true;
  do {
    char key[64];
    if (!jr_string(j, key, sizeof key)) return false;
    if (!jr_eat(j, ':')) return jr_fail(j, "expected ':'");
    if (!member(j, key, ctx)) return jr_fail(j, "bad member value");
  } while (jr_eat(j, ','));
  return jr_eat(j, '}') || jr_fail(j, "expected ',' or '}'");
}

static bool jr_array(jr *j, jr_element_fn element, void *ctx) {
  if (!jr_eat(j, '[')) return jr_fail(j, "expected an array");
  if (jr_eat(j, ']')) return true;
  do {
    if (!element(j, ctx)) return jr_fail(j, "bad array element");
  } while (jr_eat(j, ','));
  return jr_eat(j, ']') || jr_fail(j, "expected ',' or ']'");
}

/* Any value, by shape. Numbers may be signed or fractional here. */
static bool jr_skip(jr *j, int depth) {
  if (depth > 64) return jr_fail(j, "nested too deeply");
  int inner = depth + 1;
  char scratch[1];
  jr_ws(j);
  switch (*j->p) {
    case '{': return jr_object(j, jr_skip_member, &inner);
    case '[': return jr_array(j, jr_skip_element, &inner);
    case '"': return jr_string(j, scratch, sizeof scratch);
    default: break;
  }
  if (strncmp(j->p, "null", 4) == 0) return j->p += 4, true;
  bool b;
  if (*j->p == 't' || *j->p == 'f') return jr_bool(j, &b);
  size_t n = strspn(j->p, "+-0123456789.eE");
  if (n == 0) return jr_fail(j, "expected a value");
  j->p += n;
  return true;
}

/* A growing array of `elem`-byte items; returns the new (zeroed) item. */
static void *grow(void **items, size_t *n, size_t *cap, size_t elem) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 8;
    void *p = realloc(*items, c * elem);
    if (p == NULL) return NULL;
    *items = p;
    *cap = c;
  }
  void *it = (char *)*items + (*n)++ * elem;
  memset(it, 0, elem);
  return it;
}

static const char *const xb_state_names[XB_BLOCK_STATES] = {
    "active_allocated", "active_pending_free", "inactive"};

static bool block_member(jr *j, const char *key, void *ctx) {
  xb_snap_block *b = ctx;
  if (strcmp(key, "address") == 0) return jr_u64(j, &b->address);
  if (strcmp(key, "size") == 0) return jr_u64(j, &b->size);
  if (strcmp(key, "requested_size") == 0) return jr_u64(j, &b->requested);
  if (strcmp(key, "state") != 0) return jr_skip(j, 3);
  char s[32];
  if (!jr_string(j, s, sizeof s)) return false;
  for (b->state = 0; b->state < XB_BLOCK_STATES; b->state++)
    if (strcmp(s, xb_state_names[b->state]) == 0) return true;
  return jr_fail(j, "unknown block state");
}

static bool block_element(jr *j, void *ctx) {
  xb_snap_segment *s = ctx;
  xb_snap_block *b = grow((void **)&s->blocks, &s->n_blocks, &s->cap_blocks,
                          sizeof *b);
  if (b == NULL) return jr_fail(j, "out of host memory");
  b->state = XB_BLOCK_INACTIVE;
  return jr_object(j, block_member, b);
}

static bool segment_member(jr *j, const char *key, void *ctx) {
  xb_snap_segment *s = ctx;
  if (strcmp(key, "address") == 0) return jr_u64(j, &s->address);
  if (strcmp(key, "total_size") == 0) return jr_u64(j, &s->total_size);
  if (strcmp(key, "stream") == 0) return jr_u64(j, &s->stream);
  if (strcmp(key, "is_expandable") == 0) return jr_bool(j, &s->expandable);
  if (strcmp(key, "blocks") == 0) return jr_array(j, block_element, s);
  if (strcmp(key, "segment_type") != 0) return jr_skip(j, 2);
  char t[16];
  if (!jr_string(j, t, sizeof t)) return false;
  s->large = strcmp(t, "large") == 0;
  return true;
}

static bool segment_element(jr *j, void *ctx) {
  xb_snapshot *snap = ctx;
  xb_snap_segment *s = grow((void **)&snap->segments, &snap->n_segments,
                            &snap->cap_segments, sizeof *s);
  if (s == NULL) return jr_fail(j, "out of host memory");
  return jr_object(j, segment_member, s);
}

static bool top_member(jr *j, const char *key, void *ctx) {
  if (strcmp(key, "segments") == 0) return jr_array(j, segment_element, ctx);
  return jr_skip(j, 1);
}

bool xb_snapshot_read(const char *json, xb_snapshot *snap, xb_error *err) {
  memset(snap, 0, sizeof *snap);
  jr j = {.p = json, .start = json, .err = err, .ok = true};
  if (jr_object(&j, top_member, snap)) {
    jr_ws(&j);
    if (*j.p == '\0') return true;
    jr_fail(&j, "text after the snapshot");
  }
  xb_snapshot_release(snap);
  return false;
}

void xb_snapshot_release(xb_snapshot *snap) {
  for (size_t i = 0; i < snap->n_segments; i++) free(snap->segments[i].blocks);
  free(snap->segments);
  memset(snap, 0, sizeof *snap);
}
