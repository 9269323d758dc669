// Figure: panels in a grid, each with two axes and series of points or
// lines, rendered as a standalone SVG document (to_svg) that a browser
// shows as is and write_figure (render.h) also turns into PNG.
//
//   plot::Figure fig{.title = "History"};
//   plot::Panel& p = fig.panels.emplace_back();
//   p.title = "loss";
//   p.x_title = "epoch";
//   p.series.push_back({.name = "train", .x = {1, 2, 3}, .y = {0.9, 0.5, 0.4}});
//   p.series.push_back({.name = "validation", .x = {1, 2, 3}, .y = {1.0, 0.7, 0.6}, .dashed = true});
//   std::string svg = plot::to_svg(fig);
//
// Axes are fitted to the data (linear, log or categories, see axis.h);
// points with a non-finite coordinate (or <= 0 on a log axis) are left out
// and break a line. The SVG is deliberately plain so that tests can parse it:
// one <g class="panel"> per panel holding <text class="xtick"/"ytick"> tick
// labels, one <g class="series"> per series with one <path class="line">
// per unbroken stretch of line and one element of class "marker" per point,
// and <text class="legend-label"> per named series. Every name is
// XML-escaped. Thread-safe (pure functions).
#pragma once

#include <string>
#include <vector>

#include "kiln/plot/axis.h"

namespace kiln::plot {

enum class Marker { kNone, kCircle, kRing, kCross };
enum class Line { kNone, kStraight, kStep };  // kStep: horizontal, then vertical (best so far)

struct Series {
  std::string name;  // legend entry; empty: none
  std::vector<double> x, y;
  // Hover text per point (a <title> in the SVG); empty or one per point.
  std::vector<std::string> point_labels;
  Line line = Line::kStraight;
  Marker marker = Marker::kNone;
  bool dashed = false;
  std::string color;  // "#rrggbb"; empty: the palette's color for the series' index
};

struct Panel {
  std::string title;
  std::string x_title, y_title;
  Scale x_scale = Scale::kLinear, y_scale = Scale::kLinear;
  // kCategory: the names, at x = 0, 1, ... in the series.
  std::vector<std::string> x_categories;
  bool integer_x = false;  // ticks on whole numbers only (epochs, trial numbers)
  // Values the x axis spans even without data there (a search space's bounds).
  std::vector<double> x_include;
  std::vector<Series> series;
};

struct Figure {
  std::string title;
  std::string subtitle;  // a note under the title (e.g. what was left out)
  int columns = 3;       // panels per row (fewer when there are fewer panels)
  int panel_width = 380, panel_height = 280;
  std::vector<Panel> panels;
};

// The figure's size in pixels (the SVG's width and height).
int figure_width(const Figure& fig);
int figure_height(const Figure& fig);

// A standalone SVG 1.1 document.
std::string to_svg(const Figure& fig);

// `s` with & < > " ' replaced by XML entities (text and attribute values).
std::string xml_escape(const std::string& s);

// The palette (Tableau 10): color i modulo its size.
const std::string& palette_color(size_t i);

}  // namespace kiln::plot
