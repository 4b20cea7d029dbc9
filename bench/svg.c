/* svg.c: allocated and reserved bytes over a replay, as plain SVG.
 *
 * One panel per trace (its results are adjacent in the array): the x axis
 * is the event index, the y axis bytes; each mode draws its reserved bytes
 * as a solid line and its allocated bytes dashed in the same colour (the
 * allocated lines coincide unless a mode ran out of memory). Every point is
 * the peak of its window of events (see replay.c), so spikes are not lost.
 * Below the chart, the segment map at the peak (svg_segments.c) for the
 * results that carry the allocator's snapshot; a panel whose results carry
 * none (exact mode alone) says so instead.
 */
#include <errno.h>
#include <string.h>

#include "bench.h"

enum { XB_W = 1000, XB_PANEL_H = 340, XB_PLOT_X = 90, XB_PLOT_Y = 40,
       XB_PLOT_W = 620, XB_PLOT_H = 240, XB_MAP_Y = 306 };

static const char *const xb_colors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                        "#9467bd", "#ff7f0e", "#8c564b",
                                        "#e377c2", "#17becf"};

void xb_svg_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
      case '&': fputs("&amp;", f); break;
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      default: fputc(*s, f);
    }
  }
}

typedef struct xb_panel {
  const xb_result *r;
  size_t n;
  double y0;                        /* top of the panel */
  uint64_t max_bytes, max_event, tick;
} xb_panel;

static double px(const xb_panel *p, uint64_t event) {
  return XB_PLOT_X + (double)event / (double)p->max_event * XB_PLOT_W;
}

static double py(const xb_panel *p, uint64_t bytes) {
  return p->y0 + XB_PLOT_Y + XB_PLOT_H -
         (double)bytes / (double)p->max_bytes * XB_PLOT_H;
}

/* Labels then read 250 MiB, 500 MiB ... (see bench.h). */
uint64_t xb_svg_tick_step(uint64_t raw) {
  uint64_t unit = raw >= (1u << 20) ? (1u << 20) : 1024;
  uint64_t want = raw / unit + 1, mag = 1;
  while (mag * 10 <= want) mag *= 10;
  uint64_t mult = want <= mag       ? 1
                  : want <= 2 * mag ? 2
                  : want <= 5 * mag ? 5
                                    : 10;
  return mult * mag * unit;
}

static void panel_bounds(xb_panel *p) {
  p->max_bytes = 1;
  p->max_event = 1;
  for (size_t i = 0; i < p->n; i++) {
    const xb_result *r = &p->r[i];
    if (r->peak_reserved > p->max_bytes) p->max_bytes = r->peak_reserved;
    if (r->peak_allocated > p->max_bytes) p->max_bytes = r->peak_allocated;
    if (r->events > p->max_event) p->max_event = r->events;
  }
  p->tick = xb_svg_tick_step(p->max_bytes / 4);
  p->max_bytes = (p->max_bytes / p->tick + 1) * p->tick;
}

static void panel_axes(FILE *f, const xb_panel *p) {
  double top = p->y0 + XB_PLOT_Y, bottom = top + XB_PLOT_H;
  fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" "
          "fill=\"none\" stroke=\"#888\"/>\n", XB_PLOT_X, top, XB_PLOT_W,
          XB_PLOT_H);
  for (uint64_t b = 0; b <= p->max_bytes; b += p->tick) {
    char label[32];
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" "
            "font-size=\"11\">%s</text>\n", XB_PLOT_X - 6, py(p, b) + 4,
            xb_format_bytes(b, label, sizeof label));
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#eee\"/>\n", XB_PLOT_X, XB_PLOT_X + XB_PLOT_W,
            py(p, b), py(p, b));
  }
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\" "
          "font-size=\"11\">event (0 .. %llu)</text>\n",
          XB_PLOT_X + XB_PLOT_W / 2, bottom + 18,
          (unsigned long long)p->max_event);
}

static void panel_line(FILE *f, const xb_panel *p, const xb_result *r,
                       bool reserved, const char *color) {
  fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s "
          "points=\"", color, reserved ? "1.6" : "1.2",
          reserved ? "" : " stroke-dasharray=\"5,3\"");
  for (size_t i = 0; i < r->n_points; i++) {
    const xb_point *pt = &r->timeline[i];
    fprintf(f, "%.1f,%.1f ", px(p, pt->event),
            py(p, reserved ? pt->reserved : pt->allocated));
  }
  fprintf(f, "\"/>\n");
}

static void panel_legend(FILE *f, const xb_panel *p, size_t i,
                         const char *color) {
  const xb_result *r = &p->r[i];
  double y = p->y0 + XB_PLOT_Y + 14 + 30 * (double)i;
  double x = XB_PLOT_X + XB_PLOT_W + 16;
  char a[32], b[32], label[64];
  fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" "
          "stroke=\"%s\" stroke-width=\"3\"/>\n", x, x + 18, y - 4, y - 4,
          color);
  fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\">%s: reserved "
          "%s</text>\n", x + 24, y, xb_result_label(r, label, sizeof label),
          xb_format_bytes(r->peak_reserved, b, sizeof b));
  fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\" fill=\"#555\">"
          "allocated %s, fragmentation %.3f</text>\n", x + 24, y + 15,
          xb_format_bytes(r->peak_allocated, a, sizeof a), r->fragmentation);
}

static void panel_write(FILE *f, xb_panel *p) {
  panel_bounds(p);
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"15\" "
          "font-weight=\"bold\">", XB_PLOT_X, p->y0 + 24);
  xb_svg_text(f, p->r[0].trace);
  fprintf(f, ": reserved (solid) and allocated (dashed) bytes</text>\n");
  panel_axes(f, p);
  bool any_snapshot = false;
  for (size_t i = 0; i < p->n; i++) {
    const char *color = xb_colors[i % (sizeof xb_colors / sizeof *xb_colors)];
    panel_line(f, p, &p->r[i], false, color);
    panel_line(f, p, &p->r[i], true, color);
    panel_legend(f, p, i, color);
    any_snapshot = any_snapshot || p->r[i].snapshot != NULL;
  }
  if (any_snapshot)
    xb_segmap_write(f, p->r, p->n, p->y0 + XB_MAP_Y);
  else
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"#555\">"
            "segment map at the peak: not drawn, no allocator snapshot for "
            "these modes</text>\n", XB_PLOT_X, p->y0 + XB_MAP_Y + 14);
}

/* A panel's chart and, below it, its segment map. */
static double panel_height(const xb_result *r, size_t n) {
  return XB_PANEL_H + xb_segmap_height(r, n);
}

/* Results [i, i+k) of the same trace form one panel. */
static size_t panel_size(const xb_result *r, size_t n, size_t i) {
  size_t k = 1;
  while (i + k < n && strcmp(r[i + k].trace, r[i].trace) == 0) k++;
  return k;
}

static double svg_height(const xb_result *r, size_t n) {
  double h = 0;
  for (size_t i = 0; i < n; i += panel_size(r, n, i))
    h += panel_height(&r[i], panel_size(r, n, i));
  return h;
}

bool xb_svg_write(const char *path, const xb_result *r, size_t n,
                  xb_error *err) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return xb_fail(err, "%s: %s", path, strerror(errno));
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%.0f\" font-family=\"sans-serif\">\n<rect width=\"100%%\" "
          "height=\"100%%\" fill=\"white\"/>\n", XB_W, svg_height(r, n));
  double y0 = 0;
  for (size_t i = 0; i < n; i += panel_size(r, n, i)) {
    xb_panel p = {.r = &r[i], .n = panel_size(r, n, i), .y0 = y0};
    panel_write(f, &p);
    y0 += panel_height(p.r, p.n);
  }
  fprintf(f, "</svg>\n");
  bool ok = !ferror(f);
  ok = fclose(f) == 0 && ok;
  return ok || xb_fail(err, "%s: write failed", path);
}
