/* svg_segments.c: the segment map at the peak, below a trace's chart.
 *
 * For each mode whose result carries a snapshot (taken at the allocated
 * peak), one row per reservation: the snapshot's mapped runs grouped by
 * stream and pool type (small/large), laid out by address. Within an
 * expandable row a gap between two runs is reserved address space that is
 * not mapped; a classic row's segments are separate reservations, so they
 * are drawn end to end, a white tick between them. Every row of the panel
 * (both modes) shares one scale, the widest row's, so lengths compare:
 *
 *   large, default  [####allocated####|pending|::free::|    unmapped   |##]
 *
 * Adjacent blocks of one state are drawn as one rect; each rect's class
 * names its state (seg-allocated, seg-pending, seg-inactive, seg-unmapped).
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { XM_X = 90, XM_W = 620, XM_HEAD_H = 52, XM_MODE_H = 20, XM_ROW_H = 16,
       XM_BAR_H = 11 };

typedef struct xm_class {
  const char *name, *fill, *label;
} xm_class;

/* Indexed by XB_BLOCK_*, then the unmapped gap. */
static const xm_class xm_classes[XB_BLOCK_STATES + 1] = {
    {"seg-allocated", "#4878b8", "allocated (active_allocated)"},
    {"seg-pending", "#f0a030", "pending free (active_pending_free)"},
    {"seg-inactive", "#a8d898", "free, mapped (inactive)"},
    {"seg-unmapped", "#ececec", "reserved, unmapped"},
};
enum { XM_UNMAPPED = XB_BLOCK_STATES };

/* A row: order[first, first + count) of one stream and pool type. */
typedef struct xm_row {
  size_t first, count;
  uint64_t span, mapped;            /* drawn length; bytes mapped */
  int stream_no;                    /* 0 = default stream, then 1, 2 ... */
} xm_row;

/* One mode's map: its snapshot, its runs in row order, and its rows. */
typedef struct xm_mode {
  const xb_result *r;
  xb_snapshot snap;
  const xb_snap_segment **order;
  xm_row *rows;
  size_t n_rows;
  bool ok;
  xb_error err;
} xm_mode;

static int segment_cmp(const void *a, const void *b) {
  const xb_snap_segment *x = *(const xb_snap_segment *const *)a;
  const xb_snap_segment *y = *(const xb_snap_segment *const *)b;
  if (x->stream != y->stream) return x->stream < y->stream ? -1 : 1;
  if (x->large != y->large) return x->large ? -1 : 1;
  return x->address < y->address ? -1 : x->address > y->address;
}

static bool same_row(const xb_snap_segment *a, const xb_snap_segment *b) {
  return a->stream == b->stream && a->large == b->large;
}

/* Where s starts in its row, given the row's first run and the bytes of
   the row's runs before s (classic rows pack their reservations). */
static uint64_t run_offset(const xb_snap_segment *first,
                           const xb_snap_segment *s, uint64_t before) {
  return s->expandable ? s->address - first->address : before;
}

static void row_measure(xm_mode *m, xm_row *row) {
  const xb_snap_segment *first = m->order[row->first];
  for (size_t i = 0; i < row->count; i++) {
    const xb_snap_segment *s = m->order[row->first + i];
    uint64_t end = run_offset(first, s, row->mapped) + s->total_size;
    row->mapped += s->total_size;
    if (end > row->span) row->span = end;
  }
}

static bool mode_rows(xm_mode *m) {
  size_t n = m->snap.n_segments;
  m->order = calloc(n ? n : 1, sizeof *m->order);
  m->rows = calloc(n ? n : 1, sizeof *m->rows);
  if (m->order == NULL || m->rows == NULL)
    return xb_fail(&m->err, "out of host memory");
  for (size_t i = 0; i < n; i++) m->order[i] = &m->snap.segments[i];
  qsort(m->order, n, sizeof *m->order, segment_cmp);
  int stream_no = 0;
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && same_row(m->order[i - 1], m->order[i])) {
      m->rows[m->n_rows - 1].count++;
      continue;
    }
    if (i > 0 && m->order[i - 1]->stream != m->order[i]->stream) stream_no++;
    m->rows[m->n_rows++] = (xm_row){.first = i, .count = 1,
                                    .stream_no = stream_no};
  }
  /* Stream 0 is the default stream; number the others from 1. */
  if (n > 0 && m->order[0]->stream != 0)
    for (size_t k = 0; k < m->n_rows; k++) m->rows[k].stream_no++;
  for (size_t k = 0; k < m->n_rows; k++) row_measure(m, &m->rows[k]);
  return true;
}

static void mode_open(xm_mode *m, const xb_result *r) {
  memset(m, 0, sizeof *m);
  m->r = r;
  m->ok = xb_snapshot_read(r->snapshot, &m->snap, &m->err) && mode_rows(m);
}

static void mode_close(xm_mode *m) {
  free(m->order);
  free(m->rows);
  xb_snapshot_release(&m->snap);
}

static double mode_height(const xm_mode *m) {
  return XM_MODE_H + (double)(m->ok ? m->n_rows : 1) * XM_ROW_H + 6;
}

/* The modes of r[0, n) that carry a snapshot, opened; returns how many. */
static size_t modes_open(xm_mode *m, const xb_result *r, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (r[i].snapshot != NULL) mode_open(&m[k++], &r[i]);
  return k;
}

double xb_segmap_height(const xb_result *r, size_t n) {
  xm_mode *m = calloc(n ? n : 1, sizeof *m);
  if (m == NULL) return 0;
  size_t k = modes_open(m, r, n);
  double h = k ? XM_HEAD_H : 0;
  for (size_t i = 0; i < k; i++) {
    h += mode_height(&m[i]);
    mode_close(&m[i]);
  }
  free(m);
  return h;
}

typedef struct xm_scale {
  uint64_t max, tick;
} xm_scale;

static double sx(const xm_scale *sc, uint64_t bytes) {
  return XM_X + (double)bytes / (double)sc->max * XM_W;
}

static void draw_rect(FILE *f, double x0, double x1, double y, int cls) {
  const xm_class *c = &xm_classes[cls];
  if (x1 - x0 < 0.4) x1 = x0 + 0.4;   /* a tiny block stays visible */
  fprintf(f, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
          "height=\"%d\" fill=\"%s\"%s/>\n", c->name, x0, y, x1 - x0,
          XM_BAR_H, c->fill,
          cls == XM_UNMAPPED ? " stroke=\"#bbb\" stroke-dasharray=\"3,2\""
                             : "");
}

/* One run's blocks from x = base bytes, merging neighbours of one state. */
static void draw_run(FILE *f, const xm_scale *sc, const xb_snap_segment *s,
                     uint64_t base, double y) {
  size_t i = 0;
  while (i < s->n_blocks) {
    size_t j = i;
    uint64_t len = 0;
    for (; j < s->n_blocks && s->blocks[j].state == s->blocks[i].state; j++)
      len += s->blocks[j].size;
    uint64_t at = base + (s->blocks[i].address - s->address);
    draw_rect(f, sx(sc, at), sx(sc, at + len), y, s->blocks[i].state);
    i = j;
  }
}

static void draw_row_label(FILE *f, const xm_row *row,
                           const xb_snap_segment *first, double y) {
  char mapped[32], span[32], stream[16];
  if (row->stream_no == 0) snprintf(stream, sizeof stream, "default");
  else snprintf(stream, sizeof stream, "stream %d", row->stream_no);
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\">%s, %s: %s "
          "mapped", XM_X + XM_W + 8, y + XM_BAR_H - 1,
          first->large ? "large" : "small", stream,
          xb_format_bytes(row->mapped, mapped, sizeof mapped));
  if (first->expandable && row->span > row->mapped)
    fprintf(f, " over %s", xb_format_bytes(row->span, span, sizeof span));
  else if (!first->expandable)
    fprintf(f, " in %zu segment%s", row->count, row->count == 1 ? "" : "s");
  fprintf(f, "</text>\n");
}

static void draw_row(FILE *f, const xm_scale *sc, const xm_mode *m,
                     const xm_row *row, double y) {
  const xb_snap_segment *first = m->order[row->first];
  if (first->expandable) draw_rect(f, sx(sc, 0), sx(sc, row->span), y,
                                   XM_UNMAPPED);
  uint64_t before = 0;
  for (size_t i = 0; i < row->count; i++) {
    const xb_snap_segment *s = m->order[row->first + i];
    uint64_t at = run_offset(first, s, before);
    draw_run(f, sc, s, at, y);
    /* The tick between reservations, where they are wide enough for one
       not to hide them. */
    if (!s->expandable && i > 0 && sx(sc, s->total_size) - sx(sc, 0) >= 4)
      fprintf(f, "<line x1=\"%.2f\" x2=\"%.2f\" y1=\"%.1f\" y2=\"%.1f\" "
              "stroke=\"white\"/>\n", sx(sc, at), sx(sc, at), y,
              y + XM_BAR_H);
    before += s->total_size;
  }
  draw_row_label(f, row, first, y);
}

static double draw_mode(FILE *f, const xm_scale *sc, const xm_mode *m,
                        double y) {
  char label[64];
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"12\" "
          "font-weight=\"bold\">%s</text>\n", XM_X, y + 14,
          xb_result_label(m->r, label, sizeof label));
  y += XM_MODE_H;
  if (!m->ok) {
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"#a00\">"
            "unreadable snapshot: ", XM_X, y + XM_BAR_H);
    xb_svg_text(f, m->err.text);
    fprintf(f, "</text>\n");
    return y + XM_ROW_H + 6;
  }
  for (size_t k = 0; k < m->n_rows; k++, y += XM_ROW_H)
    draw_row(f, sc, m, &m->rows[k], y);
  return y + 6;
}

static void draw_legend(FILE *f, double y) {
  double x = XM_X;
  for (int c = 0; c <= XM_UNMAPPED; c++) {
    fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"10\" "
            "fill=\"%s\" stroke=\"#888\"/>\n<text x=\"%.0f\" y=\"%.1f\" "
            "font-size=\"10\">%s</text>\n", x, y, xm_classes[c].fill,
            x + 16, y + 9, xm_classes[c].label);
    x += 20 + 5.6 * (double)strlen(xm_classes[c].label);
  }
}

static void draw_scale(FILE *f, const xm_scale *sc, double y) {
  for (uint64_t b = 0; b <= sc->max; b += sc->tick) {
    char label[32];
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#888\"/>\n<text x=\"%.1f\" y=\"%.1f\" "
            "text-anchor=\"middle\" font-size=\"9\" fill=\"#555\">%s</text>\n",
            sx(sc, b), sx(sc, b), y + 2, y + 6, sx(sc, b), y,
            xb_format_bytes(b, label, sizeof label));
  }
}

static xm_scale modes_scale(const xm_mode *m, size_t k) {
  uint64_t widest = 1;
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; m[i].ok && j < m[i].n_rows; j++)
      if (m[i].rows[j].span > widest) widest = m[i].rows[j].span;
  xm_scale sc = {.tick = xb_svg_tick_step(widest / 4)};
  sc.max = (widest + sc.tick - 1) / sc.tick * sc.tick;
  return sc;
}

void xb_segmap_write(FILE *f, const xb_result *r, size_t n, double y) {
  xm_mode *m = calloc(n ? n : 1, sizeof *m);
  if (m == NULL) return;
  size_t k = modes_open(m, r, n);
  if (k > 0) {
    xm_scale sc = modes_scale(m, k);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"13\" "
            "font-weight=\"bold\">segment map at the allocated peak</text>\n",
            XM_X, y + 14);
    draw_legend(f, y + 22);
    draw_scale(f, &sc, y + XM_HEAD_H - 4);
    y += XM_HEAD_H;
    for (size_t i = 0; i < k; i++) y = draw_mode(f, &sc, &m[i], y);
  }
  for (size_t i = 0; i < k; i++) mode_close(&m[i]);
  free(m);
}
